"""An actor that speaks wire protocol v2 directly: pyzmq + msgpack + numpy, no zmq_rl.

A template for an actor in another language (C++, Rust, C#, ...): every step below
is a ZeroMQ socket call or a msgpack map, and the policy's forward pass is a few
matrix products. It drives the thermostat building of
:mod:`examples.thermostat_physics` (pure numpy) against a learner running
``examples.thermostat_env:Thermostat-v0``::

    python -m examples.raw_protocol_actor --learner 127.0.0.1:5555 --rooms 4

Without ``--learner`` it reads the address from ``ZMQ_RL_LEARNER`` (how the
conformance tool hands it over: ``zmq-rl conformance actor --env
examples.thermostat_env:Thermostat-v0 -- python -m examples.raw_protocol_actor``).

The sequence (docs/protocol.md, the normative page; section numbers in brackets):

1. DEALER → learner control port: ``hello``; wait for ``welcome`` (or ``refuse``),
   and stop on a reply of another protocol version [5.1, 4.5].
2. PUSH → ``welcome.experience_port``, SUB (subscribe to everything) →
   ``welcome.weights_port``; load ``welcome.weights`` by tensor name [2.1, 4.2].
3. Every tick: read control (``shutdown``, ``heartbeat`` with ``base_version``, ``refuse
   reregister``); send a ``heartbeat`` every ``config.heartbeat_interval`` s; drain SUB
   and load the newest ``weights`` of this run [5.2, 5.5]; respect the staleness valve,
   flushing before a pause [5.4]; act on every room; every ``fragment_length`` steps
   send one ``fragment`` of all rooms, ``[T, B]`` arrays, ``seq`` 0, 1, 2, ... [4.1].
4. On a new run id or ``refuse reregister``: register again, ``seq`` from 0 [5.6].
5. On ``shutdown``: send the partial rows, then ``bye`` with ``last_seq`` [5.7].
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
import time
from typing import Any

import msgpack
import numpy as np
import zmq

from examples.thermostat_physics import OBS_LIMIT, POWER_LEVELS_KW, Building

PROTOCOL_VERSION = 2
ENV_ID = "examples.thermostat_env:Thermostat-v0"
OBS_DIM = 2
PAUSE_WAIT_MS = 50


class VersionMismatch(RuntimeError):
    """The learner answered in another protocol version."""


class Reregister(Exception):
    """The learner restarted or forgot this actor: say hello again."""


# ---------------------------------------------------------------- encoding


def pack_array(array: np.ndarray) -> dict[str, Any]:
    """``{"dtype", "shape", "data"}``: raw little-endian C-order bytes [3.3]."""
    array = np.ascontiguousarray(array)
    little = array.astype(array.dtype.newbyteorder("<"), copy=False)
    return {"dtype": array.dtype.name, "shape": list(array.shape), "data": little.tobytes()}


def unpack_array(value: dict[str, Any]) -> np.ndarray:
    dtype = np.dtype(value["dtype"]).newbyteorder("<")
    return np.frombuffer(value["data"], dtype).reshape(value["shape"])


def frame(kind: str, **fields: Any) -> bytes:
    """One frame: a msgpack map with the ``proto``/``type`` envelope [3.2]."""
    return msgpack.packb({"proto": PROTOCOL_VERSION, "type": kind, **fields}, use_bin_type=True)


def send(sock: zmq.Socket, kind: str, **fields: Any) -> None:
    """A control message: hello blocking, the others dropped if the queue is full [2.4]."""
    with contextlib.suppress(zmq.Again):
        sock.send(frame(kind, **fields), 0 if kind == "hello" else zmq.NOBLOCK)


def receive(sock: zmq.Socket) -> dict[str, Any]:
    body = msgpack.unpackb(sock.recv(), raw=False)
    if body.get("proto") != PROTOCOL_VERSION:
        raise VersionMismatch(
            f"the learner speaks protocol {body.get('proto')!r}, this actor {PROTOCOL_VERSION}"
        )
    return body


# ---------------------------------------------------------------- the policy


class NumpyPolicy:
    """The forward pass of zmq_rl's MLP actor-critic for Discrete actions [6].

    Tensors are named as in the learner's ``state_dict``: ``actor_trunk.{i}.weight``
    / ``.bias`` and ``critic_trunk.{i}.*`` (or ``trunk.{i}.*`` with a shared
    trunk), ``policy_head.*``, ``value_head.*``, and ``obs_mean`` / ``obs_var`` with
    observation normalisation; each hidden layer is ``act(x @ W.T + b)``.
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
        x = obs.astype(np.float32)
        if "obs_mean" in self.w:
            x = (x - self.w["obs_mean"]) / np.sqrt(self.w["obs_var"] + 1e-8)
            x = np.clip(x, -10.0, 10.0).astype(np.float32)
        actor = self._trunk("trunk" if self.shared else "actor_trunk", x)
        critic = actor if self.shared else self._trunk("critic_trunk", x)
        logits = actor @ self.w["policy_head.weight"].T + self.w["policy_head.bias"]
        values = (critic @ self.w["value_head.weight"].T + self.w["value_head.bias"])[:, 0]
        z = logits - logits.max(axis=1, keepdims=True)
        log_p = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        actions = np.array([rng.choice(len(p), p=np.exp(p) / np.exp(p).sum()) for p in log_p])
        chosen = log_p[np.arange(len(actions)), actions]
        return actions.astype(np.int64), chosen.astype(np.float32), values.astype(np.float32)


# ---------------------------------------------------------------- the actor


class RawActor:
    """One actor process: a registration at a time, one fragment of all rooms per
    ``fragment_length`` steps. The methods marked *rule* are where the page's rules of
    conduct live (the broken actors of tests/fixtures override one each)."""

    FEATURES: tuple[str, ...] = ()
    """The hello's ``features`` [4.3]: none, so the valve follows S and L [5.4] (an actor
    that announces ``"grants"`` follows a learner's grants instead [5.4.1])."""

    def __init__(self, learner: str, num_rooms: int, seed: int, register_timeout: float):
        self.host, _, port = learner.rpartition(":")
        self.num_rooms, self.seed, self.register_timeout = num_rooms, seed, register_timeout
        self.ctx = zmq.Context()
        self.control = self.ctx.socket(zmq.DEALER)
        self.control.linger = 500
        self.control.connect(f"tcp://{self.host}:{port}")
        self.stopping = False
        self.push: zmq.Socket | None = None
        self.sub: zmq.Socket | None = None
        self.run_id = ""
        self.actor_id = -1
        self.stats = {"steps_sent": 0.0, "fragments_sent": 0.0, "episodes_completed": 0.0}
        self.stats["policy_updates_received"] = 0.0
        self.building = Building(num_rooms, max(seed, 0))
        self.rng = np.random.default_rng(seed if seed >= 0 else None)

    # -- registration [5.1, 5.6]

    def register(self) -> None:
        box = {
            "kind": "box",
            "shape": [OBS_DIM],
            "dtype": "float32",
            "low": pack_array(np.full(OBS_DIM, -OBS_LIMIT, np.float32)),
            "high": pack_array(np.full(OBS_DIM, OBS_LIMIT, np.float32)),
        }
        send(
            self.control,
            "hello",
            actor_id=self.actor_id,
            env_id=ENV_ID,
            observation_space=box,
            action_space={"kind": "discrete", "n": len(POWER_LEVELS_KW), "start": 0},
            num_envs=self.num_rooms,
            host=socket.gethostname(),
            pid=os.getpid(),
            rejoin_run_id=self.run_id,
            **({"features": list(self.FEATURES)} if self.FEATURES else {}),
        )
        deadline = time.monotonic() + self.register_timeout
        while True:
            if not self.control.poll(max(1, int((deadline - time.monotonic()) * 1000))):
                raise TimeoutError(f"no welcome within {self.register_timeout}s")
            message = receive(self.control)
            if message["type"] == "refuse" and message["code"] != "reregister":
                raise RuntimeError(f"refused ({message['code']}): {message['reason']}")
            if message["type"] == "welcome":
                break
        config = message["config"]
        self.actor_id, self.run_id, self.token = (
            message["actor_id"],
            message["run_id"],
            message["token"],
        )
        for sock in (self.push, self.sub):
            if sock is not None:
                sock.close(linger=0)  # the old registration's queue is not ours any more
        self.push = self.ctx.socket(zmq.PUSH)
        self.push.linger = 2000  # deliver what was sent before exiting
        self.push.connect(f"tcp://{self.host}:{message['experience_port']}")
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.linger = 0
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(f"tcp://{self.host}:{message['weights_port']}")
        self.policy = NumpyPolicy(config["policy"])
        self.policy.load(message["weights"])
        self.version, self.base_version = message["weights"]["version"], message["base_version"]
        self.fragment_length = config["fragment_length"]
        self.steps_per_broadcast = config["steps_per_broadcast"]
        self.max_lead = config["max_lead_steps"]
        self.heartbeat_interval = config["heartbeat_interval"]
        self.seq = 0  # per registration
        self.last_seq = -1  # the seq of the last fragment sent (bye)
        self.steps = 0  # per slot, since the welcome
        self.rows: list[tuple] = []  # unsent steps of every room
        self.last_heartbeat = 0.0
        self.obs = self.building.observe()
        self.first_obs = self.obs
        if self.seed < 0:
            self.rng = np.random.default_rng(config["seed"] + 1 + self.actor_id)

    # -- rules of conduct

    def heartbeat_due(self, now: float) -> bool:
        """*rule* [5.5]: at least one heartbeat per interval, also while paused."""
        return now - self.last_heartbeat >= self.heartbeat_interval

    def next_seq(self) -> int:
        """*rule* [4.1.2]: 0, 1, 2, ... in this registration."""
        return self.seq

    def valve_closed(self) -> bool:
        """*rule* [5.4]: pause at the budget of the least-advanced slot."""
        budget = max(0, self.version - self.base_version) * self.steps_per_broadcast
        return bool(self.max_lead) and self.steps >= budget + self.max_lead

    def wait_for_weights(self) -> bool:
        """*rule* [5.2]: never wait for weights outside a pause (a hook: True = wait)."""
        return False

    def say_bye(self) -> None:
        """*rule* [5.7]: bye with the seq of the last fragment sent."""
        send(
            self.control,
            "bye",
            actor_id=self.actor_id,
            token=self.token,
            stats=dict(self.stats),
            last_seq=self.last_seq,
        )

    # -- the loop [5.2]

    def serve_control(self) -> bool:
        """Handle every queued control message; True on shutdown."""
        stop = self.stopping
        while self.control.poll(0):
            message = receive(self.control)
            kind = message["type"]
            if kind == "shutdown" and message.get("run_id", "") in ("", self.run_id):
                stop = True
            elif kind == "heartbeat" and message["run_id"] != self.run_id:
                raise Reregister
            elif kind == "heartbeat" and message.get("base_version", 0) > self.base_version:
                self.base_version = message["base_version"]  # [4.6]
            elif kind == "refuse" and message["code"] == "reregister":
                raise Reregister
        self.stopping = stop
        now = time.monotonic()
        if self.heartbeat_due(now):
            send(
                self.control,
                "heartbeat",
                actor_id=self.actor_id,
                token=self.token,
                run_id=self.run_id,
                version=self.version,
            )
            self.last_heartbeat = now
        return stop

    def load_newest_weights(self) -> bool:
        """Drain SUB; load the newest weights of this run if newer. True if loaded."""
        frames = []
        while self.sub.poll(0):
            frames.append(self.sub.recv())
        for frame in reversed(frames):
            weights = msgpack.unpackb(frame, raw=False)
            if weights.get("proto") != PROTOCOL_VERSION:
                continue
            if weights["run_id"] != self.run_id:
                raise Reregister
            if weights["version"] > self.version:
                self.send_fragment()  # rows acted with the old version leave tagged with it
                self.policy.load(weights)
                self.version = weights["version"]
                self.stats["policy_updates_received"] += 1
                return True
            break  # the newest frame is not newer: nothing older can be [5.2]
        return False

    def send_fragment(self) -> None:
        """One fragment of every room's unsent rows, ``[T, B]`` [4.1]."""
        if not self.rows:
            return
        obs, actions, rewards, truncated, values, log_probs, finals = zip(*self.rows, strict=True)
        width = self.num_rooms
        index = [t * width + b for t, row in enumerate(finals) for b in sorted(row)]
        final = [finals[i // width][i % width] for i in index]
        data = frame(
            "fragment",
            run_id=self.run_id,
            actor_id=self.actor_id,
            token=self.token,
            seq=(seq := self.next_seq()),
            version=self.rows_version,
            sent_at=time.time(),
            slots=pack_array(np.arange(width, dtype=np.int32)),
            obs=pack_array(np.stack(obs)),
            actions=pack_array(np.stack(actions)),
            rewards=pack_array(np.stack(rewards)),
            terminated=pack_array(np.zeros((len(rewards), width), bool)),  # rooms never end
            truncated=pack_array(np.stack(truncated)),
            values=pack_array(np.stack(values)),
            log_probs=pack_array(np.stack(log_probs)),
            next_obs=pack_array(self.obs),
            final_obs_index=pack_array(np.array(index, np.int32)),
            final_obs=pack_array(np.array(final, np.float32).reshape(len(index), OBS_DIM)),
        )
        self.rows = []
        while True:  # never drop a fragment on a full PUSH: wait, serving control [2.4]
            try:
                self.push.send(data, zmq.NOBLOCK)
                break
            except zmq.Again:
                if self.serve_control():
                    return  # shutdown: this fragment is given up, not counted [5.7]
                self.push.poll(100, zmq.POLLOUT)
        self.seq += 1
        self.last_seq = seq
        self.stats["steps_sent"] += len(rewards) * width
        self.stats["fragments_sent"] += 1

    def step(self) -> None:
        """Act on every room, tick the building, record one row."""
        if not self.rows:
            self.rows_version = self.version
        actions, log_probs, values = self.policy.act(self.obs, self.rng)
        rewards = self.building.tick(np.asarray(POWER_LEVELS_KW)[actions])
        finals: dict[int, np.ndarray] = {}
        for j, room in enumerate(self.building.rooms):
            if room.hour_over:  # a time limit: truncated, keep the true last observation
                finals[j] = room.observe()
                room.reset()
                self.stats["episodes_completed"] += 1
        truncated = np.array([j in finals for j in range(self.num_rooms)])
        self.rows.append((self.obs, actions, rewards, truncated, values, log_probs, finals))
        self.obs = self.building.observe()
        self.steps += 1
        if len(self.rows) == self.fragment_length:
            self.send_fragment()

    def run(self) -> dict[str, float]:
        self.register()
        while True:
            try:
                if self.serve_control():
                    break
                loaded = self.load_newest_weights()
                if self.stopping:
                    break
                if self.valve_closed() or (self.wait_for_weights() and not loaded):
                    self.send_fragment()  # the learner may need these rows [5.4]
                    self.sub.poll(PAUSE_WAIT_MS)
                    continue
                self.step()
            except Reregister:
                self.rows = []  # rows of the old registration are not sent [5.6]
                self.register()
        self.send_fragment()  # MAY: the partial rows, before the bye [5.7]
        self.say_bye()
        for sock in (self.sub, self.push, self.control):
            sock.close()
        self.ctx.term()
        return self.stats


def main(argv: list[str] | None = None, actor_class: type[RawActor] = RawActor) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--learner",
        default=os.environ.get("ZMQ_RL_LEARNER", "127.0.0.1:5555"),
        help="learner HOST:PORT (default: $ZMQ_RL_LEARNER, else 127.0.0.1:5555)",
    )
    parser.add_argument("--rooms", type=int, default=2, help="rooms (env slots) to simulate")
    parser.add_argument("--seed", type=int, default=-1, help="-1 = the run's seed + 1 + actor id")
    parser.add_argument("--register-timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    try:
        stats = actor_class(args.learner, args.rooms, args.seed, args.register_timeout).run()
    except (TimeoutError, RuntimeError) as exc:
        print(f"raw_protocol_actor: {exc}", file=sys.stderr)
        return 1
    print(" ".join(f"{k}={v:g}" for k, v in stats.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
