"""Remote inference latency: one ``infer`` request to ``zmq-rl serve`` until its action.

Three processes on loopback: a real learner (CartPole-v1, the built-in 64x64 MLP,
training on what the simulators produce: PPO 1 epoch, one minibatch per 32-step
rollout; ``max_lead_steps`` large, so that the staleness valve never holds a
request and what is measured is inference), ``zmq-rl serve`` (the CLI, one torch
thread), and this driver. The driver plays ``N`` simulators of one CartPole slot
each: ``N`` DEALER sockets, each attached, each with one request in flight. A
request carries a random observation plus the previous step's reward/terminated/
truncated, as a real simulator's does (so the server records the experience and
pushes fragments as it would). Each reply is timed from just before its request was
sent to just after the reply was received (``time.perf_counter``); the driver first
takes every reply that is ready and only then sends the next requests, so that its
own work is not counted for the sockets it has not read yet.

Per simulator count: a warm-up of ``--warmup`` requests per simulator, then
``--requests`` timed requests in all (spread over the simulators); p50, p99, max,
requests per second, and the server process's CPU time per timed request (psutil:
what the server itself costs, which a busy machine's scheduling delays do not
inflate the way they inflate the latencies). The simulators detach before the next
count.

    python bench/inference_latency.py                 # 1, 8, 64 simulators
    python bench/inference_latency.py --smoke         # 1, 8; a few hundred requests
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _util  # noqa: E402
import msgpack  # noqa: E402
import numpy as np  # noqa: E402
import zmq  # noqa: E402

LEARNER = textwrap.dedent(
    """
    import signal, sys
    from zmq_rl.config import LearnerConfig, PolicyConfig, PPOConfig
    from zmq_rl.learner.loop import Learner

    cfg = LearnerConfig(
        env_id="CartPole-v1", port=int(sys.argv[1]), num_actors=1, num_envs=1, num_steps=32,
        fragment_length=32, total_env_steps=10**9, max_lead_steps=10**7, eval_episodes=1,
        starvation_timeout=600.0, actor_timeout=60.0, checkpoint_every=0, max_actors=256,
    )
    learner = Learner(cfg, PPOConfig(num_epochs=1, minibatch_size=1 << 20), PolicyConfig())
    signal.signal(signal.SIGTERM, lambda *_: learner.request_stop("benchmark done"))
    try:
        learner.run()
    finally:
        learner.close()
    """
)


def pack(kind: str, **fields: Any) -> bytes:
    return msgpack.packb({"proto": 2, "type": kind, **fields})


def array(a: np.ndarray) -> dict[str, Any]:
    return {"dtype": a.dtype.name, "shape": list(a.shape), "data": a.tobytes()}


def call(sock: zmq.Socket, frame: bytes, timeout_s: float = 60.0) -> dict[str, Any]:
    sock.send(frame)
    if not sock.poll(int(timeout_s * 1000)):
        raise TimeoutError("no answer from the server")
    reply = msgpack.unpackb(sock.recv())
    if reply["type"] == "error":
        raise RuntimeError(f"server refused: {reply['code']}: {reply['reason']}")
    return reply


def measure(
    ctx: zmq.Context, endpoint: str, sims: int, warmup: int, total: int, cpu: Any = None
) -> dict:
    """Attach ``sims`` simulators, run the warm-up and the timed requests, detach.
    ``cpu()``: the server process's CPU seconds so far (sampled around the timed part)."""
    socks = []
    for _ in range(sims):
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 100)
        sock.setsockopt(zmq.RCVHWM, 100)
        sock.connect(endpoint)
        # The first attach waits for the server and the learner to start (torch imports).
        call(sock, pack("attach", num_envs=1, env_id="CartPole-v1"), 300.0 if not socks else 60.0)
        socks.append(sock)
    rng = np.random.default_rng(sims)
    outcome = {
        "reward": array(np.ones(1, np.float32)),
        "terminated": array(np.zeros(1, bool)),
        "truncated": array(np.zeros(1, bool)),
    }
    frames = [
        pack("infer", obs=array(rng.normal(size=(1, 4)).astype(np.float32)), **outcome)
        for _ in range(64)
    ]
    first = pack("infer", obs=array(np.zeros((1, 4), np.float32)))
    poller = zmq.Poller()
    for sock in socks:
        poller.register(sock, zmq.POLLIN)
    sent_at = [0.0] * sims
    latencies: list[float] = []
    done = 0
    target = warmup * sims + total
    for i, sock in enumerate(socks):
        sent_at[i] = time.perf_counter()
        sock.send(first)
    index = {sock: i for i, sock in enumerate(socks)}
    start, cpu_start = None, math.nan
    while done < target:
        events = dict(poller.poll(60_000))
        if not events:
            raise TimeoutError("no reply within 60 s")
        ready = []
        for sock in events:
            reply = sock.recv()
            now = time.perf_counter()
            i = index[sock]
            if done >= warmup * sims:
                if start is None:
                    start, cpu_start = now, cpu() if cpu else math.nan
                latencies.append(now - sent_at[i])
            done += 1
            body = msgpack.unpackb(reply)
            if body["type"] != "action":
                raise RuntimeError(f"unexpected reply {body}")
            ready.append(i)
        for i in ready:
            sent_at[i] = time.perf_counter()
            socks[i].send(frames[done % len(frames)])
    elapsed = time.perf_counter() - (start or time.perf_counter())
    cpu_used = (cpu() if cpu else math.nan) - cpu_start
    for sock in socks:  # the request in flight, then detach
        if sock.poll(60_000):
            sock.recv()
        call(sock, pack("detach"))
        sock.close()
    ms = [x * 1000.0 for x in latencies]
    return {
        "simulators": sims,
        "requests": len(ms),
        "p50_ms": _util.percentile(ms, 50),
        "p99_ms": _util.percentile(ms, 99),
        "max_ms": max(ms),
        "requests_per_s": len(ms) / elapsed if elapsed > 0 else float("nan"),
        "server_cpu_ms_per_request": cpu_used * 1000.0 / len(ms),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sims", default="1,8,64", help="simulator counts, comma-separated")
    parser.add_argument("--requests", type=int, default=6400, help="timed requests per count")
    parser.add_argument("--warmup", type=int, default=50, help="warm-up requests per simulator")
    _util.add_common_flags(parser)
    args = parser.parse_args()
    counts = [int(x) for x in args.sims.split(",")]
    if args.smoke:
        counts, args.requests, args.warmup = [c for c in counts if c <= 8], 400, 10
    port, serve_port = _util.free_port_block(3), _util.free_port_block(1)
    env = {**os.environ, "PYTHONPATH": str(_util.ROOT)}
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "cwd": _util.ROOT}
    learner = subprocess.Popen([sys.executable, "-c", LEARNER, str(port)], env=env, **quiet)
    endpoint = f"tcp://127.0.0.1:{serve_port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "zmq_rl.cli.main", "serve", "--learner", f"127.0.0.1:{port}",
         "--bind", endpoint, "--register-timeout", "300", "--log-level", "warning"],
        env=env,
        **quiet,
    )  # fmt: skip
    ctx = zmq.Context()
    rows = []
    try:
        import psutil

        process = psutil.Process(server.pid)

        def server_cpu() -> float:
            times = process.cpu_times()
            return times.user + times.system

    except ImportError:  # psutil is in the test extras
        server_cpu = None  # type: ignore[assignment]
    try:
        for sims in counts:
            row = measure(ctx, endpoint, sims, args.warmup, args.requests, server_cpu)
            rows.append(row)
            print(
                f"{sims:3d} simulators: p50 {row['p50_ms']:.3f} ms  p99 {row['p99_ms']:.3f} ms  "
                f"max {row['max_ms']:.1f} ms  {row['requests_per_s']:.0f} requests/s  "
                f"server CPU {row['server_cpu_ms_per_request']:.3f} ms/request",
                flush=True,
            )
    finally:
        ctx.destroy(linger=0)
        for proc in (server, learner):
            proc.send_signal(signal.SIGTERM)
        for proc in (server, learner):
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    _util.print_table(
        ["simulators", "requests", "p50 ms", "p99 ms", "max ms", "requests/s", "server CPU ms"],
        [
            [r["simulators"], r["requests"], f"{r['p50_ms']:.3f}", f"{r['p99_ms']:.3f}",
             f"{r['max_ms']:.1f}", f"{r['requests_per_s']:.0f}",
             f"{r['server_cpu_ms_per_request']:.3f}"]
            for r in rows
        ],
    )  # fmt: skip
    _util.write_result(
        "inference_latency",
        args,
        {
            "config": {
                "counts": counts,
                "requests": args.requests,
                "warmup_per_simulator": args.warmup,
                "slots_per_simulator": 1,
                "policy": "CartPole-v1, MLP 64x64 tanh, 1 torch thread",
            },
            "rows": rows,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
