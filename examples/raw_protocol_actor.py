"""An actor that speaks the wire protocol directly: pyzmq + msgpack + numpy, no zmq_rl.

A template for an actor in another language (C++, Rust, C#, ...): every step below
is a ZeroMQ socket call or a msgpack map, and the policy's forward pass is a few
matrix products. It drives the thermostat building of
:mod:`examples.thermostat_physics` (pure numpy) against a learner running
``examples.thermostat_env:Thermostat-v0``::

    python -m examples.raw_protocol_actor --learner 127.0.0.1:5555 --rooms 4

The sequence (docs/embedding.md, "An actor in another language"; the field
tables are in docs/protocol.md):

1. DEALER → learner control port: ``hello``; wait for ``welcome`` (or ``refuse``).
2. PUSH → ``welcome.experience_port``, SUB (subscribe to everything) →
   ``welcome.weights_port``; load ``welcome.weights``.
3. Every tick: read control (``shutdown``, ``heartbeat``), send a ``heartbeat``
   every ``config.heartbeat_interval`` s, drain SUB and load the newest
   ``weights`` of this run; respect the staleness valve; act; send a
   ``fragment`` per slot every ``config.fragment_length`` steps.
4. On ``shutdown``: send the partial fragments, then ``bye`` with ``last_seq``.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from typing import Any

import msgpack
import numpy as np
import zmq

from examples.thermostat_physics import OBS_LIMIT, POWER_LEVELS_KW, Building

PROTOCOL_VERSION = 1
ENV_ID = "examples.thermostat_env:Thermostat-v0"
OBS_DIM = 2
PAUSE_WAIT_MS = 50


# ---------------------------------------------------------------- encoding


def pack_array(array: np.ndarray) -> dict[str, Any]:
    """``{"dtype", "shape", "data"}``: raw little-endian C-order bytes."""
    array = np.ascontiguousarray(array)
    little = array.astype(array.dtype.newbyteorder("<"), copy=False)
    return {"dtype": array.dtype.name, "shape": list(array.shape), "data": little.tobytes()}


def unpack_array(value: dict[str, Any]) -> np.ndarray:
    dtype = np.dtype(value["dtype"]).newbyteorder("<")
    return np.frombuffer(value["data"], dtype).reshape(value["shape"])


def send(sock: zmq.Socket, kind: str, **fields: Any) -> None:
    """One frame: a msgpack map with the ``proto``/``type`` envelope."""
    sock.send(msgpack.packb({"proto": PROTOCOL_VERSION, "type": kind, **fields}, use_bin_type=True))


def receive(sock: zmq.Socket) -> dict[str, Any]:
    body = msgpack.unpackb(sock.recv(), raw=False)
    if body.get("proto") != PROTOCOL_VERSION:
        raise RuntimeError(f"learner speaks protocol {body.get('proto')!r}")
    return body


# ---------------------------------------------------------------- the policy


class NumpyPolicy:
    """The forward pass of zmq_rl's MLP actor-critic for Discrete actions.

    Tensors are named as in the learner's ``state_dict``: ``actor_trunk.{i}.weight``
    / ``.bias`` and ``critic_trunk.{i}.*`` (or ``trunk.{i}.*`` with a shared
    trunk), ``policy_head.*``, ``value_head.*``; ``i`` counts the hidden layers in
    order (0, 2, 4, ...). Each hidden layer is ``act(x @ W.T + b)``.
    """

    def __init__(self, policy_config: dict[str, Any]) -> None:
        self.activation = (
            np.tanh if policy_config["activation"] == "tanh" else (lambda x: np.maximum(x, 0.0))
        )
        self.shared = bool(policy_config["shared_trunk"])
        self.w: dict[str, np.ndarray] = {}

    def load(self, weights: dict[str, Any]) -> None:
        self.w = {name: unpack_array(array) for name, array in weights["tensors"]}

    def _trunk(self, prefix: str, x: np.ndarray) -> np.ndarray:
        layers = sorted(
            int(name.split(".")[1])
            for name in self.w
            if name.startswith(prefix + ".") and name.endswith(".weight")
        )
        for i in layers:
            x = self.activation(x @ self.w[f"{prefix}.{i}.weight"].T + self.w[f"{prefix}.{i}.bias"])
        return x

    def act(self, obs: np.ndarray, rng: np.random.Generator):
        """Sampled actions, their log-probabilities and the values, for ``[B, obs_dim]``."""
        actor = self._trunk("trunk" if self.shared else "actor_trunk", obs)
        critic = actor if self.shared else self._trunk("critic_trunk", obs)
        logits = actor @ self.w["policy_head.weight"].T + self.w["policy_head.bias"]
        values = (critic @ self.w["value_head.weight"].T + self.w["value_head.bias"])[:, 0]
        z = logits - logits.max(axis=1, keepdims=True)
        log_p = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        actions = np.array([rng.choice(len(p), p=np.exp(p) / np.exp(p).sum()) for p in log_p])
        chosen = log_p[np.arange(len(actions)), actions]
        return actions.astype(np.int64), chosen.astype(np.float32), values.astype(np.float32)


# ---------------------------------------------------------------- the actor


def run(learner: str, num_rooms: int, seed: int, register_timeout: float) -> dict[str, float]:
    host, _, port = learner.rpartition(":")
    ctx = zmq.Context()
    control = ctx.socket(zmq.DEALER)
    control.linger = 500
    control.connect(f"tcp://{host}:{port}")
    box = {
        "kind": "box",
        "shape": [OBS_DIM],
        "dtype": "float32",
        "low": pack_array(np.full(OBS_DIM, -OBS_LIMIT, np.float32)),
        "high": pack_array(np.full(OBS_DIM, OBS_LIMIT, np.float32)),
    }
    # 1. hello -> welcome
    send(
        control,
        "hello",
        actor_id=-1,
        env_id=ENV_ID,
        observation_space=box,
        action_space={"kind": "discrete", "n": len(POWER_LEVELS_KW), "start": 0},
        num_envs=num_rooms,
        host=socket.gethostname(),
        pid=os.getpid(),
        rejoin_run_id="",
    )
    deadline = time.monotonic() + register_timeout
    while True:
        if not control.poll(max(1, int((deadline - time.monotonic()) * 1000))):
            raise TimeoutError(f"no welcome from {learner} within {register_timeout}s")
        message = receive(control)
        if message["type"] == "refuse":
            raise RuntimeError(f"refused ({message['code']}): {message['reason']}")
        if message["type"] == "welcome":
            break
    actor_id, run_id, config = message["actor_id"], message["run_id"], message["config"]
    # 2. data sockets, the welcome's weights
    push = ctx.socket(zmq.PUSH)
    push.linger = 2000  # deliver what was sent before exiting
    push.connect(f"tcp://{host}:{message['experience_port']}")
    sub = ctx.socket(zmq.SUB)
    sub.linger = 0
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://{host}:{message['weights_port']}")
    policy = NumpyPolicy(config["policy"])
    policy.load(message["weights"])
    version, base_version = message["weights"]["version"], message["base_version"]
    fragment_length = config["fragment_length"]
    steps_per_broadcast, max_lead = config["steps_per_broadcast"], config["max_lead_steps"]
    heartbeat_interval = config["heartbeat_interval"]
    if seed < 0:
        seed = config["seed"] + 1 + actor_id
    rng = np.random.default_rng(seed)
    building = Building(num_rooms, seed)

    rows: list[list[tuple]] = [[] for _ in range(num_rooms)]  # per slot, unsent steps
    seq = [0] * num_rooms
    stats = {
        "steps_sent": 0,
        "fragments_sent": 0,
        "episodes_completed": 0,
        "policy_updates_received": 0,
    }
    steps = 0  # per slot, since the welcome
    last_heartbeat = 0.0
    obs = building.observe()

    def send_fragments() -> None:
        for slot, slot_rows in enumerate(rows):
            if not slot_rows:
                continue
            o, a, r, trunc, v, lp, final, first_version = zip(*slot_rows, strict=True)
            index = [t for t, last in enumerate(final) if last is not None]
            send(
                push,
                "fragment",
                actor_id=actor_id,
                slot=slot,
                version=first_version[0],
                seq=seq[slot],
                run_id=run_id,
                sent_at=time.time(),
                obs=pack_array(np.stack(o)),
                actions=pack_array(np.array(a, np.int64)),
                rewards=pack_array(np.array(r, np.float32)),
                terminated=pack_array(np.zeros(len(r), bool)),  # rooms never terminate
                truncated=pack_array(np.array(trunc, bool)),
                values=pack_array(np.array(v, np.float32)),
                log_probs=pack_array(np.array(lp, np.float32)),
                next_obs=pack_array(obs[slot]),
                final_obs_index=pack_array(np.array(index, np.int32)),
                final_obs=pack_array(
                    np.array([final[t] for t in index], np.float32).reshape(len(index), OBS_DIM)
                ),
            )
            seq[slot] += 1
            stats["steps_sent"] += len(r)
            stats["fragments_sent"] += 1
            slot_rows.clear()

    stop = False
    while not stop:
        # 3a. control: shutdown or heartbeats from the learner
        while control.poll(0):
            message = receive(control)
            if message["type"] == "shutdown" and message.get("run_id", "") in ("", run_id):
                stop = True
        now = time.monotonic()
        if now - last_heartbeat >= heartbeat_interval:
            send(control, "heartbeat", actor_id=actor_id, run_id=run_id, version=version)
            last_heartbeat = now
        # 3b. weights: only the newest of this run matters
        frames = []
        while sub.poll(0):
            frames.append(sub.recv())
        for frame in reversed(frames):
            weights = msgpack.unpackb(frame, raw=False)
            if weights["run_id"] == run_id and weights["version"] > version:
                policy.load(weights)
                version = weights["version"]
                stats["policy_updates_received"] += 1
                break
        if stop:
            break
        # 3c. the staleness valve
        if max_lead and steps >= max(0, version - base_version) * steps_per_broadcast + max_lead:
            send_fragments()  # the learner may need these rows to publish the next version
            sub.poll(PAUSE_WAIT_MS)
            continue
        # 3d. act, tick, record
        actions, log_probs, values = policy.act(obs, rng)
        rewards = building.tick(np.asarray(POWER_LEVELS_KW)[actions])
        steps += 1
        for j, room in enumerate(building.rooms):
            final = None
            if room.hour_over:  # a time limit: truncated, keep the true last observation
                final = room.observe()
                room.reset()
                stats["episodes_completed"] += 1
            rows[j].append(
                (
                    obs[j],
                    actions[j],
                    rewards[j],
                    final is not None,
                    values[j],
                    log_probs[j],
                    final,
                    version,
                )
            )
        obs = building.observe()
        if len(rows[0]) == fragment_length:
            send_fragments()
    # 4. flush, bye, close
    send_fragments()
    send(
        control,
        "bye",
        actor_id=actor_id,
        stats={k: float(v) for k, v in stats.items()},
        last_seq=[s - 1 for s in seq],
    )
    for sock in (sub, push, control):
        sock.close()
    ctx.term()
    return stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--learner", default="127.0.0.1:5555", help="learner HOST:PORT")
    parser.add_argument("--rooms", type=int, default=4, help="rooms (env slots) to simulate")
    parser.add_argument("--seed", type=int, default=-1, help="-1 = the run's seed + 1 + actor id")
    parser.add_argument("--register-timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    try:
        stats = run(args.learner, args.rooms, args.seed, args.register_timeout)
    except (TimeoutError, RuntimeError) as exc:
        print(f"raw_protocol_actor: {exc}", file=sys.stderr)
        return 1
    print(" ".join(f"{k}={v:g}" for k, v in stats.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
