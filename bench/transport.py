"""Experience transport (protocol v2): the project's path vs raw pyzmq + msgpack, and
the learner's ingest rate on one core.

**Transport** (two processes, tcp loopback PUSH -> PULL, one message per lockstep
flush of ``--envs`` slots, ``[T, B]`` arrays of CartPole steps: obs float32[4], action
int64, reward, terminated, truncated, value, log-prob, plus next_obs and the empty
final-obs arrays):

* ``project``: ``Fragment(...)`` -> ``protocol.encode`` -> PUSH (copy below 64 KiB, as
  the actor does) -> PULL ``recv(copy=False)`` -> ``protocol.decode`` (full
  validation) -> ``Membership.admit`` (token, seq, spaces, ranges, valve cap) ->
  ``SlotQueues.push``, and after every drained batch every complete
  ``[--rollout-steps, slots]`` rollout is taken (``SlotQueues.take``);
* ``raw``: the same arrays as one msgpack map of scalars and ``bytes`` (``packb``) ->
  PUSH -> PULL ``recv()`` -> ``unpackb``: no validation, no arrays, no batching, the
  ceiling of pyzmq + msgpack for this payload.

The figure is transitions per second at the receiver, first to last message. Variants
alternate within each round; the ratio is taken per round (load hits both alike).

**Ingest on one core** (one process, pre-encoded frames): decode + admit + push, and
the rollouts taken, for CartPole (``T`` x ``--envs``) and for Atari-sized observations
(84x84x4 uint8, one slot per fragment as the Python actor groups them): transitions
per second of the learner's receiving path. Targets (issue 13): project >= 50 % of
raw at T = 64 for 8 and 32 envs per message; ingest >= 2M CartPole and >= 20k Atari
transitions/s.

    python bench/transport.py            # T = 64 x 8 and 32 envs; 3 rounds of 3 s
    python bench/transport.py --smoke    # one short round
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _util  # noqa: E402

END = b"END"
RUN_ID = "bench0000000"
TOKEN = bytes(range(16))
POOL = 8
MAX_BYTES = 64 * 1024 * 1024
ATARI_SHAPE = (84, 84, 4)


def _arrays(T: int, B: int, seed: int, obs_shape=(4,), obs_dtype="float32") -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(seed)
    terminated = np.zeros((T, B), bool)
    terminated[rng.integers(0, T), rng.integers(0, B)] = True  # an episode end now and then
    if obs_dtype == "uint8":
        obs = rng.integers(0, 256, (T, B, *obs_shape), dtype=np.uint8)
        next_obs = rng.integers(0, 256, (B, *obs_shape), dtype=np.uint8)
    else:
        obs = rng.standard_normal((T, B, *obs_shape)).astype(np.float32)
        next_obs = rng.standard_normal((B, *obs_shape)).astype(np.float32)
    return {
        "obs": obs,
        "actions": rng.integers(0, 2, (T, B)).astype(np.int64),
        "rewards": np.ones((T, B), np.float32),
        "terminated": terminated,
        "truncated": np.zeros((T, B), bool),
        "values": rng.standard_normal((T, B)).astype(np.float32),
        "log_probs": np.full((T, B), -0.69, np.float32),
        "next_obs": next_obs,
        "final_obs_index": np.zeros(0, np.int32),
        "final_obs": np.zeros((0, *obs_shape), obs.dtype),
    }


def _fragment(arrays: dict[str, Any], seq: int) -> Any:
    import numpy as np

    from zmq_rl.wire.protocol import Fragment

    B = arrays["rewards"].shape[1]
    return Fragment(
        actor_id=0,
        version=0,
        seq=seq,
        run_id=RUN_ID,
        token=TOKEN,
        slots=np.arange(B, dtype=np.int32),
        sent_at=time.time(),
        **arrays,
    )


def _raw_map(arrays: dict[str, Any], seq: int) -> dict[str, Any]:
    body: dict[str, Any] = {"actor_id": 0, "version": 0, "seq": seq, "run_id": RUN_ID}
    body["sent_at"] = time.time()
    for name, array in arrays.items():
        body[name] = array.tobytes()
    return body


class Receiver:
    """The learner's receiving path without sockets: decode, admit, push, take."""

    def __init__(self, B: int, rollout_steps: int, obs_shape=(4,), obs_dtype="float32") -> None:
        import gymnasium as gym
        import numpy as np

        from zmq_rl.learner.membership import ActorRecord, Membership
        from zmq_rl.learner.queues import SlotQueues

        self.members = Membership()
        low = 0 if obs_dtype == "uint8" else -np.inf
        high = 255 if obs_dtype == "uint8" else np.inf
        self.spaces = (
            gym.spaces.Box(low, high, obs_shape, np.dtype(obs_dtype)),
            gym.spaces.Discrete(2),
        )
        rec = ActorRecord(0, b"r", B, "h", 1, 0, True, 0.0, 0.0, token=TOKEN)
        self.members.actors[0] = rec
        self.queues = SlotQueues()
        self.keys = [(0, s) for s in range(B)]
        self.rollout_steps = rollout_steps
        self.rows = self.consumed = 0

    def handle(self, frame: Any) -> None:
        from zmq_rl.wire.protocol import Fragment, decode

        fragment = decode(frame, (Fragment,), MAX_BYTES)
        self.members.admit(
            fragment,
            "",
            run_id=RUN_ID,
            version=0,
            spaces=self.spaces,
            queued_rows=self.queues.rows,
            slot_cap=1 << 40,
            now=0.0,
        )
        self.queues.push(fragment)
        self.rows += fragment.length * fragment.num_slots

    def take_ready(self) -> None:
        while self.queues.ready(self.keys, self.rollout_steps):
            rollout = self.queues.take(self.keys, self.rollout_steps)
            self.consumed += rollout.num_steps * rollout.num_slots


# ------------------------------------------------------------------ processes


def sender(variant: str, endpoint: str, T: int, B: int, seconds: float, out: Any) -> None:
    import msgpack
    import zmq

    from zmq_rl.wire.protocol import encode
    from zmq_rl.wire.transport import (
        ACTOR_PUSH_LINGER_MS,
        EXPERIENCE_HWM,
        SocketOptions,
        make_socket,
    )

    ctx = zmq.Context()
    sock = make_socket(
        ctx, zmq.PUSH, SocketOptions(linger_ms=ACTOR_PUSH_LINGER_MS, sndhwm=EXPERIENCE_HWM)
    )
    sock.connect(endpoint)
    pool = [_arrays(T, B, seed) for seed in range(POOL)]
    raw = variant == "raw"
    sent = nbytes = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        if sent % 16 == 0 and time.perf_counter() >= deadline:
            break
        arrays = pool[sent % POOL]
        if raw:
            frame = msgpack.packb(_raw_map(arrays, sent), use_bin_type=True)
            sock.send(frame)
        else:
            frame = encode(_fragment(arrays, sent))
            sock.send(frame, copy=len(frame) < 65536)
        sent += 1
        nbytes += len(frame)
    elapsed = time.perf_counter() - start
    sock.send(END)
    sock.close()
    ctx.term()  # lingers until every message is delivered
    out.put({"role": "sender", "sent": sent, "seconds": elapsed, "frame_bytes": nbytes / sent})


def receiver(variant: str, port: int, T: int, B: int, rollout_steps: int, out: Any, ready) -> None:
    import msgpack
    import zmq

    from zmq_rl.wire.transport import SocketOptions, make_socket

    ctx = zmq.Context()
    sock = make_socket(ctx, zmq.PULL, SocketOptions(max_message_bytes=MAX_BYTES))
    sock.bind(f"tcp://127.0.0.1:{port}")
    ready.put(True)
    raw = variant == "raw"
    path = Receiver(B, rollout_steps)
    received = rows = 0
    first = last = 0.0
    done = False
    give_up = time.monotonic() + 120
    while not done and time.monotonic() < give_up:
        if not sock.poll(1000):
            continue
        for _ in range(10000):
            try:
                if raw:
                    frame = sock.recv(zmq.NOBLOCK)
                    if frame == END:
                        done = True
                        break
                    first = first or time.perf_counter()
                    body = msgpack.unpackb(frame, raw=False)
                    rows += len(body["rewards"]) // 4
                else:
                    msg = sock.recv(zmq.NOBLOCK, copy=False)
                    buf = msg.buffer
                    if len(buf) == len(END) and bytes(buf) == END:
                        done = True
                        break
                    first = first or time.perf_counter()
                    path.handle(buf)
            except zmq.Again:
                break
            received += 1
        if not raw:
            path.take_ready()
            rows = path.rows
        last = time.perf_counter()
    sock.close(linger=0)
    ctx.term()
    seconds = max(last - first, 1e-9)
    out.put(
        {
            "role": "receiver",
            "received": received,
            "rows": rows,
            "consumed_rows": path.consumed,
            "seconds": seconds,
            "completed": done,
            "transitions_per_s": rows / seconds,
            "messages_per_s": received / seconds,
        }
    )


def measure(variant: str, T: int, B: int, seconds: float, rollout_steps: int) -> dict:
    ctx = mp.get_context("spawn")
    port = _util.free_port_block(1)
    out, ready = ctx.Queue(), ctx.Queue()
    recv_proc = ctx.Process(target=receiver, args=(variant, port, T, B, rollout_steps, out, ready))
    recv_proc.start()
    ready.get(timeout=60)
    send_proc = ctx.Process(
        target=sender, args=(variant, f"tcp://127.0.0.1:{port}", T, B, seconds, out)
    )
    send_proc.start()
    results = {}
    for _ in range(2):
        item = out.get(timeout=seconds + 150)
        results[item.pop("role")] = item
    for proc in (send_proc, recv_proc):
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    rx, tx = results["receiver"], results["sender"]
    if not rx["completed"] or rx["received"] != tx["sent"]:
        raise RuntimeError(f"{variant} T={T} B={B}: sent {tx['sent']}, received {rx['received']}")
    return {"variant": variant, "T": T, "envs": B, **rx, "frame_bytes": tx["frame_bytes"]}


# ------------------------------------------------------------------ ingest on one core


def ingest_rate(
    T: int, B: int, rollout_steps: int, seconds: float, obs_shape=(4,), obs_dtype="float32"
) -> dict[str, float]:
    """Transitions per second through decode + admit + push (+ take) in this process."""
    from zmq_rl.wire.protocol import encode

    frames = [
        encode(_fragment(_arrays(T, B, seed, obs_shape, obs_dtype), 0)) for seed in range(POOL)
    ]
    path = Receiver(B, rollout_steps, obs_shape, obs_dtype)
    messages = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for frame in frames:
            member = path.members.actors[0]
            member.next_seq = 0  # the pool's frames all carry seq 0
            path.handle(frame)
            messages += 1
        path.take_ready()
    elapsed = time.perf_counter() - start
    return {
        "T": T,
        "envs": B,
        "obs_bytes": len(frames[0]),
        "transitions_per_s": path.rows / elapsed,
        "consumed_per_s": path.consumed / elapsed,
        "us_per_message": elapsed / messages * 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _util.add_common_flags(parser)
    parser.add_argument("--length", type=int, default=64, help="fragment length T")
    parser.add_argument("--envs", default="8,32", help="env slots per message")
    parser.add_argument("--seconds", type=float, default=3.0, help="sending time per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rollout-steps", type=int, default=128, help="rows per slot per rollout")
    args = parser.parse_args(argv)
    if args.smoke:
        args.seconds, args.rounds = 0.4, 1
    T = args.length
    envs = [int(x) for x in args.envs.split(",")]
    variants = ["raw", "project"]

    runs = []
    for B in envs:
        for r in range(args.rounds):
            for variant in _util.round_order(variants, r):
                res = measure(variant, T, B, args.seconds, args.rollout_steps)
                res["round"] = r
                runs.append(res)
                print(
                    f"T={T} envs={B:<3} round {r} {variant:<8} "
                    f"{_util.fmt_rate(res['transitions_per_s'])} transitions/s "
                    f"({_util.fmt_rate(res['messages_per_s'])} msg/s)",
                    flush=True,
                )
    summary = []
    for B in envs:
        mine = [x for x in runs if x["envs"] == B]
        ratios = []
        for r in range(args.rounds):
            by = {x["variant"]: x["transitions_per_s"] for x in mine if x["round"] == r}
            ratios.append(by["project"] / by["raw"])
        summary.append(
            {
                "T": T,
                "envs": B,
                "frame_bytes": next(x["frame_bytes"] for x in mine if x["variant"] == "project"),
                **{
                    f"{v}_transitions_per_s": _util.median(
                        [x["transitions_per_s"] for x in mine if x["variant"] == v]
                    )
                    for v in variants
                },
                "project_vs_raw": _util.median(ratios),
            }
        )
    ingest_seconds = 0.5 if args.smoke else 3.0
    ingest = [
        {"payload": "CartPole", **ingest_rate(T, B, args.rollout_steps, ingest_seconds)}
        for B in envs
    ]
    atari_t = 16 if args.smoke else 64
    ingest.append(
        {
            "payload": "Atari 84x84x4 uint8",
            **ingest_rate(atari_t, 1, atari_t, ingest_seconds, ATARI_SHAPE, "uint8"),
        }
    )

    print()
    _util.print_table(
        ["T", "envs/msg", "frame B", "raw tr/s", "project tr/s", "project/raw"],
        [
            [
                row["T"],
                row["envs"],
                int(row["frame_bytes"]),
                _util.fmt_rate(row["raw_transitions_per_s"]),
                _util.fmt_rate(row["project_transitions_per_s"]),
                f"{row['project_vs_raw']:.1%}",
            ]
            for row in summary
        ],
    )
    print("\nlearner ingest on one core (decode + admit + push + take):")
    _util.print_table(
        ["payload", "T", "envs/msg", "message B", "us/message", "transitions/s"],
        [
            [
                row["payload"],
                row["T"],
                row["envs"],
                row["obs_bytes"],
                f"{row['us_per_message']:.1f}",
                _util.fmt_rate(row["transitions_per_s"]),
            ]
            for row in ingest
        ],
    )
    ratio_ok = all(row["project_vs_raw"] >= 0.5 for row in summary)
    cartpole_ok = all(r["transitions_per_s"] >= 2e6 for r in ingest if r["payload"] == "CartPole")
    atari_ok = ingest[-1]["transitions_per_s"] >= 2e4
    print(f"\ntarget: project >= 50% of raw at every envs/msg: {'MET' if ratio_ok else 'MISSED'}")
    print(f"target: ingest >= 2M CartPole transitions/s: {'MET' if cartpole_ok else 'MISSED'}")
    print(f"target: ingest >= 20k Atari transitions/s: {'MET' if atari_ok else 'MISSED'}")
    _util.write_result(
        "transport",
        args,
        {
            "config": {
                "length": T,
                "envs": envs,
                "seconds": args.seconds,
                "rounds": args.rounds,
                "rollout_steps": args.rollout_steps,
            },
            "summary": summary,
            "ingest": ingest,
            "runs": runs,
            "target": {"ratio": ratio_ok, "cartpole_ingest": cartpole_ok, "atari_ingest": atari_ok},
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
