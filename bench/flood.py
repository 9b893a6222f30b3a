"""Flood a learner's experience (PULL) port with junk, as fast as one PUSH socket can.

Used by ``tests/test_hostile_experience.py`` (run as a separate process, so that the flood does
not share a GIL with what it measures) and by hand against a running learner::

    python bench/flood.py tcp://127.0.0.1:5556 --seconds 10 --kind junk
    python bench/flood.py tcp://127.0.0.1:5556 --seconds 10 --kind junk --rows 65536

Kinds (every frame is one the learner must reject, never one it may accept):

* ``junk``: well-formed protocol-v1 fragments (they decode) from an actor id no
  learner registered, under a run id no learner has: rejected as ``unknown_actor`` /
  ``other_run`` only after a full decode, the costliest reject there is.
* ``garbage``: random bytes (``not_msgpack`` / ``not_a_map`` / ``version_mismatch``).

``--rows`` sets the fragment length T of ``junk`` (CartPole rows: 38 bytes each with
the action, reward, flags, value and log-prob), so ``--rows 32`` sends 1.7 KB frames and
``--rows 65536`` 2.5 MB ones. Sending never drops a
frame: PUSH blocks at its high-water mark, and the script waits (bounded by
``--seconds``) for room; on exit what is still queued is delivered for up to
``--linger-ms``. At the end it prints one line ``FLOOD {json}`` with the
frames and bytes sent and the flood's start and end on the ``time.monotonic()`` clock
(system-wide on Linux, so another process can line them up with its own), and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import zmq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from zmq_rl.wire.protocol import Fragment, encode  # noqa: E402

JUNK_VARIANTS = 16
"""Distinct pre-encoded frames the flood cycles through (building frames is not flooding)."""


def junk_frames(rows: int, seed: int) -> list[bytes]:
    """Valid-looking CartPole fragments that no learner accepts."""
    rng = np.random.default_rng(seed)
    frames = []
    for i in range(JUNK_VARIANTS):
        fragment = Fragment.for_slot(
            i % 4,
            actor_id=1_000_000 + i,
            token=rng.bytes(16),
            version=0,
            seq=i,
            run_id=f"flood-{seed}-{i}",
            obs=rng.standard_normal((rows, 4)).astype(np.float32),
            actions=rng.integers(0, 2, rows).astype(np.int64),
            rewards=np.ones(rows, np.float32),
            terminated=np.zeros(rows, bool),
            truncated=np.zeros(rows, bool),
            values=rng.standard_normal(rows).astype(np.float32),
            log_probs=np.full(rows, -0.69, np.float32),
            next_obs=rng.standard_normal(4).astype(np.float32),
        )
        frames.append(encode(fragment))
    return frames


def garbage_frames(seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [rng.bytes(int(rng.integers(1, 2048))) for _ in range(JUNK_VARIANTS)]


def flood(endpoint: str, seconds: float, frames: list[bytes], linger_ms: int = 10_000) -> dict:
    """Send ``frames`` round-robin to ``endpoint`` for ``seconds``; return the tallies.

    On close, what is still queued is delivered for up to ``linger_ms`` (so that every
    frame counted as sent reaches a live learner); 0 drops it at once."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    sent = nbytes = blocked_polls = 0
    start = time.monotonic()
    deadline = start + seconds
    try:
        while time.monotonic() < deadline:
            frame = frames[sent % len(frames)]
            try:
                sock.send(frame, zmq.NOBLOCK, copy=False)
            except zmq.Again:  # at the HWM: wait for room, bounded by the deadline
                blocked_polls += 1
                sock.poll(max(1, int((deadline - time.monotonic()) * 1000)), zmq.POLLOUT)
                continue
            sent += 1
            nbytes += len(frame)
    finally:
        elapsed = time.monotonic() - start
        sock.close(linger=linger_ms)
        ctx.term()
    return {
        "started_at": start,  # time.monotonic(): comparable with other processes' clocks
        "ended_at": start + elapsed,
        "sent": sent,
        "bytes": nbytes,
        "frame_bytes": [min(map(len, frames)), max(map(len, frames))],
        "seconds": round(elapsed, 3),
        "per_second": round(sent / max(elapsed, 1e-9)),
        "blocked_polls": blocked_polls,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "endpoint",
        nargs="?",
        default="",
        help="the learner's experience endpoint, tcp://HOST:PORT+1 (or --port)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=0,
        metavar="N",
        help="a learner on this host with control port N: floods tcp://127.0.0.1:N+1",
    )
    parser.add_argument("--out", default="", help="also write the tallies here as JSON")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long to flood")
    parser.add_argument("--kind", choices=("junk", "garbage"), default="junk")
    parser.add_argument("--rows", type=int, default=32, help="fragment length T of junk frames")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--linger-ms",
        type=int,
        default=10_000,
        help="how long to keep delivering queued frames at the end",
    )
    args = parser.parse_args(argv)
    if bool(args.endpoint) == bool(args.port):
        parser.error("give the learner's experience endpoint or --port, one of them")
    endpoint = args.endpoint or f"tcp://127.0.0.1:{args.port + 1}"
    frames = junk_frames(args.rows, args.seed) if args.kind == "junk" else garbage_frames(args.seed)
    tallies = flood(endpoint, args.seconds, frames, args.linger_ms)
    print("FLOOD " + json.dumps(tallies), flush=True)
    if args.out:
        with open(args.out, "w") as out:
            out.write(json.dumps(tallies) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
