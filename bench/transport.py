"""Experience transport: the project's path vs raw pyzmq + msgpack, same payload.

Both paths move the same CartPole fragments (T rows of obs float32[4], action
int64, reward, terminated, truncated, value, log-prob, plus next_obs and the empty
final-obs arrays) from a sender process to a receiver process over tcp loopback
PUSH -> PULL, one message per fragment, round-robin over ``--slots`` slots:

* ``project``: ``Fragment(...)`` -> ``protocol.encode`` -> PUSH (send as
  ``ActorClient`` does: copy below 64 KiB) -> PULL ``recv(copy=False)`` (as the
  learner's ``pump``) -> ``protocol.decode(frame, (Fragment,))`` (full
  validation) -> ``SlotQueues.push``, and after every drained batch the receiver
  takes every complete ``[--rollout-steps, slots]`` rollout (``SlotQueues.take``).
* ``raw``: the same arrays as one msgpack map of scalars and ``bytes`` values
  (``packb``) -> PUSH -> PULL ``recv()`` -> ``unpackb``. No validation, no arrays
  rebuilt, no batching: the ceiling of pyzmq + msgpack for this payload.

The figure is transitions per second at the receiver, from its first to its last
message (so a backlog that drains after the sender stopped is counted). Variants
alternate within each round and the ratio is taken per round, so machine load
from other work hits both sides alike. The script also times each stage in one
process (us per fragment) to show where the time goes.

    python bench/transport.py            # T = 8, 64, 256; 3 rounds of 3 s each
    python bench/transport.py --smoke    # T = 64, one short round
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
import timeit
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _util  # noqa: E402

END = b"END"
RUN_ID = "bench0000000"
POOL = 16
MAX_BYTES = 16 * 1024 * 1024


def _arrays(T: int, seed: int) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(seed)
    terminated = np.zeros(T, bool)
    terminated[rng.integers(0, T)] = rng.random() < 0.5  # an episode end now and then
    return {
        "obs": rng.standard_normal((T, 4)).astype(np.float32),
        "actions": rng.integers(0, 2, T).astype(np.int64),
        "rewards": np.ones(T, np.float32),
        "terminated": terminated,
        "truncated": np.zeros(T, bool),
        "values": rng.standard_normal(T).astype(np.float32),
        "log_probs": np.full(T, -0.69, np.float32),
        "next_obs": rng.standard_normal(4).astype(np.float32),
        "final_obs_index": np.zeros(0, np.int32),
        "final_obs": np.zeros((0, 4), np.float32),
    }


def _fragment(arrays: dict[str, Any], slot: int, seq: int) -> Any:
    from zmq_rl.protocol import Fragment

    return Fragment(
        actor_id=0, slot=slot, version=0, seq=seq, run_id=RUN_ID, sent_at=time.time(), **arrays
    )


def _raw_map(arrays: dict[str, Any], slot: int, seq: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "actor_id": 0,
        "slot": slot,
        "version": 0,
        "seq": seq,
        "run_id": RUN_ID,
        "sent_at": time.time(),
    }
    for name, array in arrays.items():
        body[name] = array.tobytes()
    return body


# ------------------------------------------------------------------ processes


def sender(variant: str, endpoint: str, T: int, slots: int, seconds: float, out: Any) -> None:
    import msgpack
    import zmq

    from zmq_rl.protocol import encode
    from zmq_rl.transport import ACTOR_PUSH_LINGER_MS, EXPERIENCE_HWM, SocketOptions, make_socket

    ctx = zmq.Context()
    sock = make_socket(
        ctx, zmq.PUSH, SocketOptions(linger_ms=ACTOR_PUSH_LINGER_MS, sndhwm=EXPERIENCE_HWM)
    )
    sock.connect(endpoint)
    pool = [_arrays(T, seed) for seed in range(POOL)]
    raw = variant == "raw"
    sent = 0
    nbytes = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        if sent % 32 == 0 and time.perf_counter() >= deadline:
            break
        slot = sent % slots
        arrays = pool[sent % POOL]
        if raw:
            frame = msgpack.packb(_raw_map(arrays, slot, sent // slots), use_bin_type=True)
            sock.send(frame)
        else:
            frame = encode(_fragment(arrays, slot, sent // slots))
            sock.send(frame, copy=len(frame) < 65536)
        sent += 1
        nbytes += len(frame)
    elapsed = time.perf_counter() - start
    sock.send(END)
    sock.close()
    ctx.term()  # lingers until every message is delivered
    out.put(
        {
            "role": "sender",
            "sent": sent,
            "bytes": nbytes,
            "seconds": elapsed,
            "frame_bytes": nbytes / max(sent, 1),
        }
    )


def receiver(
    variant: str, port: int, T: int, slots: int, rollout_steps: int, out: Any, ready: Any
) -> None:
    import msgpack
    import zmq

    from zmq_rl.protocol import Fragment, decode
    from zmq_rl.rollout import SlotQueues
    from zmq_rl.transport import SocketOptions, make_socket

    ctx = zmq.Context()
    sock = make_socket(ctx, zmq.PULL, SocketOptions(max_message_bytes=MAX_BYTES))
    sock.bind(f"tcp://127.0.0.1:{port}")
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    ready.put(True)
    raw = variant == "raw"
    queues = SlotQueues()
    keys = [(0, s) for s in range(slots)]
    received = rows = consumed = rollouts = 0
    first = last = 0.0
    done = False
    give_up = time.monotonic() + 120
    while not done and time.monotonic() < give_up:
        if not poller.poll(1000):
            continue
        for _ in range(10000):
            try:
                if raw:
                    frame = sock.recv(zmq.NOBLOCK)
                    if frame == END:
                        done = True
                        break
                    if not received:
                        first = time.perf_counter()
                    body = msgpack.unpackb(frame, raw=False)
                    rows += len(body["rewards"]) // 4
                else:
                    msg = sock.recv(zmq.NOBLOCK, copy=False)
                    buf = msg.buffer
                    if len(buf) == len(END) and bytes(buf) == END:
                        done = True
                        break
                    if not received:
                        first = time.perf_counter()
                    fragment = decode(buf, (Fragment,), MAX_BYTES)
                    queues.push(fragment)
                    rows += fragment.length
            except zmq.Again:
                break
            received += 1
        if not raw:
            while queues.ready(keys, rollout_steps):
                rollout = queues.take(keys, rollout_steps)
                consumed += rollout.num_steps * rollout.num_slots
                rollouts += 1
        last = time.perf_counter()
    sock.close(linger=0)
    ctx.term()
    seconds = max(last - first, 1e-9)
    out.put(
        {
            "role": "receiver",
            "received": received,
            "rows": rows,
            "seconds": seconds,
            "rollouts": rollouts,
            "consumed_rows": consumed,
            "completed": done,
            "transitions_per_s": rows / seconds,
            "messages_per_s": received / seconds,
        }
    )


def measure(variant: str, T: int, slots: int, seconds: float, rollout_steps: int) -> dict:
    ctx = mp.get_context("spawn")
    port = _util.free_port_block(1)
    out, ready = ctx.Queue(), ctx.Queue()
    recv_proc = ctx.Process(
        target=receiver, args=(variant, port, T, slots, rollout_steps, out, ready)
    )
    recv_proc.start()
    ready.get(timeout=60)
    send_proc = ctx.Process(
        target=sender, args=(variant, f"tcp://127.0.0.1:{port}", T, slots, seconds, out)
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
        raise RuntimeError(f"{variant} T={T}: sent {tx['sent']}, received {rx['received']}")
    return {
        "variant": variant,
        "T": T,
        **rx,
        "sender_messages_per_s": tx["sent"] / tx["seconds"],
        "frame_bytes": tx["frame_bytes"],
    }


# ------------------------------------------------------------------ single-process stage costs


def stage_costs(T: int, slots: int, rollout_steps: int, number: int) -> dict[str, float]:
    """Microseconds per fragment of each stage, in this process."""
    import msgpack

    from zmq_rl.protocol import Fragment, decode, encode
    from zmq_rl.rollout import SlotQueues

    arrays = _arrays(T, 0)
    fragment = _fragment(arrays, 0, 0)
    frame = encode(fragment)
    raw = msgpack.packb(_raw_map(arrays, 0, 0), use_bin_type=True)
    decoded = decode(frame, (Fragment,))

    def us(fn, n=number) -> float:
        return min(timeit.repeat(fn, number=n, repeat=3)) / n * 1e6

    def push_take() -> None:
        queues = SlotQueues()
        keys = [(0, s) for s in range(slots)]
        per_slot = max(1, -(-rollout_steps // T))
        for s in range(slots):
            for _ in range(per_slot):
                decoded.slot = s
                queues.push(decoded)
        while queues.ready(keys, rollout_steps):
            queues.take(keys, rollout_steps)

    per_round = slots * max(1, -(-rollout_steps // T))
    return {
        "fragment_build_us": us(lambda: _fragment(arrays, 0, 0)),
        "encode_us": us(lambda: encode(fragment)),
        "decode_us": us(lambda: decode(frame, (Fragment,), MAX_BYTES)),
        "push_and_take_us": us(push_take, max(1, number // per_round)) / per_round,
        "raw_pack_us": us(lambda: msgpack.packb(_raw_map(arrays, 0, 0), use_bin_type=True)),
        "raw_unpack_us": us(lambda: msgpack.unpackb(raw, raw=False)),
        "frame_bytes": len(frame),
        "raw_frame_bytes": len(raw),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _util.add_common_flags(parser)
    parser.add_argument("--lengths", default="8,64,256", help="fragment lengths T")
    parser.add_argument("--seconds", type=float, default=3.0, help="sending time per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--slots", type=int, default=32, help="slots the sender round-robins")
    parser.add_argument(
        "--rollout-steps",
        type=int,
        default=64,
        help="rows per slot in the rollouts the receiver takes",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.lengths, args.seconds, args.rounds = "64", 0.4, 1
    lengths = [int(x) for x in args.lengths.split(",")]
    variants = ["raw", "project"]

    runs = []
    for T in lengths:
        for r in range(args.rounds):
            order = variants if r % 2 == 0 else variants[::-1]
            for variant in order:
                res = measure(variant, T, args.slots, args.seconds, args.rollout_steps)
                res["round"] = r
                runs.append(res)
                print(
                    f"T={T:<4} round {r} {variant:<18} "
                    f"{_util.fmt_rate(res['transitions_per_s'])} transitions/s "
                    f"({_util.fmt_rate(res['messages_per_s'])} msg/s; sender "
                    f"{_util.fmt_rate(res['sender_messages_per_s'])} msg/s)",
                    flush=True,
                )

    summary = []
    for T in lengths:
        row: dict[str, Any] = {"T": T}
        for variant in variants:
            rates = [
                x["transitions_per_s"] for x in runs if x["T"] == T and x["variant"] == variant
            ]
            row[f"{variant}_transitions_per_s"] = _util.median(rates)
        for variant in variants[1:]:
            ratios = []
            for r in range(args.rounds):
                by = {
                    x["variant"]: x["transitions_per_s"]
                    for x in runs
                    if x["T"] == T and x["round"] == r
                }
                ratios.append(by[variant] / by["raw"])
            row[f"{variant}_vs_raw"] = _util.median(ratios)
        row["frame_bytes"] = next(
            x["frame_bytes"] for x in runs if x["T"] == T and x["variant"] == "project"
        )
        summary.append(row)

    number = 200 if args.smoke else 3000
    stages: dict[str, Any] = {}
    for T in lengths:
        stages[str(T)] = {"current": stage_costs(T, args.slots, args.rollout_steps, number)}

    print()
    headers = ["T", "frame B", "raw tr/s", "project tr/s", "project/raw"]
    rows = [
        [
            row["T"],
            int(row["frame_bytes"]),
            _util.fmt_rate(row["raw_transitions_per_s"]),
            _util.fmt_rate(row["project_transitions_per_s"]),
            f"{row['project_vs_raw']:.1%}",
        ]
        for row in summary
    ]
    _util.print_table(headers, rows)
    print("\nper-fragment stage costs in one process (us):")
    stage_rows = []
    for T, by in stages.items():
        for codec, s in by.items():
            stage_rows.append(
                [
                    T,
                    codec,
                    f"{s['fragment_build_us']:.1f}",
                    f"{s['encode_us']:.1f}",
                    f"{s['decode_us']:.1f}",
                    f"{s['push_and_take_us']:.1f}",
                    f"{s['raw_pack_us']:.1f}",
                    f"{s['raw_unpack_us']:.1f}",
                ]
            )
    _util.print_table(
        ["T", "codec", "build", "encode", "decode", "push+take", "raw pack", "raw unpack"],
        stage_rows,
    )
    target_ok = all(row["project_vs_raw"] >= 0.5 for row in summary)
    print(f"\ntarget: project >= 50% of raw for every T: {'MET' if target_ok else 'MISSED'}")
    _util.write_result(
        "transport",
        args,
        {
            "config": {
                "lengths": lengths,
                "seconds": args.seconds,
                "rounds": args.rounds,
                "slots": args.slots,
                "rollout_steps": args.rollout_steps,
                "variants": variants,
            },
            "summary": summary,
            "stages_us": stages,
            "runs": runs,
            "target": {"project_vs_raw_min": 0.5, "met": target_ok},
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
