"""The GPU checks of issue 12 in one short, prepared run, for a machine with a CUDA GPU.

1. ``pytest tests/test_device.py``: there the CUDA tests run instead of skipping (a
   PPO update on CUDA equals the CPU update, CUDA weights come out as CPU arrays,
   checkpoints cross devices, evaluation of a CUDA policy on a CPU copy, a CUDA
   learner with CPU actors trains CartPole). A CUDA test that still skips fails
   this step.
2. One PPO update, timed (:class:`zmq_rl.rl.trainer.Trainer`, targets included): a
   synthetic CartPole-shaped rollout of ``[T=64, B=64]`` (4,096 rows), 4 epochs of
   1,024-row minibatches, MLP 64x64 and 256x256, on ``cpu`` (1 torch thread, the
   learner's default, and every core) and on ``cuda``; the median of
   ``--updates`` updates after 3 warm-up ones.
3. End-to-end throughput, ``bench/throughput.py``'s configuration (2 actors x 32
   envs, CartPole-v1, env steps/s consumed over ``--window`` s after ``--warmup``
   s), with the learner on ``cpu`` and on ``cuda``; the actors are on the CPU.

Everything goes to one JSON (``--out``, default ``bench/results/gpu_check.json``)
and a table on stdout. It takes about 4-6 minutes; it needs a CUDA build of torch
and the project's test dependencies in the Python that runs it::

    python bench/gpu_check.py --out "$OUT/gpu_check.json"

Exit 0 when every step passed, 1 when one failed, 2 without a usable GPU.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _util  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PYTEST_TIMEOUT_S = 420


def run_tests(timeout: float) -> dict[str, Any]:
    """Step 1: the device tests, where the CUDA ones must run."""
    command = [sys.executable, "-m", "pytest", "-q", "-rs", "tests/test_device.py"]
    started = time.monotonic()
    try:
        done = subprocess.run(
            command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
        )
        output, code = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as exc:
        output = (exc.stdout or b"").decode(errors="replace") if exc.stdout else ""
        output, code = output + f"\nTIMEOUT after {timeout:.0f} s", -1
    skipped_cuda = [line for line in output.splitlines() if "needs a CUDA GPU" in line]
    return {
        "command": " ".join(command[1:]),
        "returncode": code,
        "seconds": time.monotonic() - started,
        "cuda_tests_skipped": skipped_cuda,
        "ok": code == 0 and not skipped_cuda,
        "tail": output[-4000:],
    }


def time_updates(
    device: str,
    hidden: tuple[int, ...],
    updates: int,
    threads: int,
    minibatch: int = 1024,
    cuda_graphs: bool = True,
) -> float:
    """Step 2: median seconds of one ``Trainer.update`` on ``device`` (4 epochs of
    ``minibatch``-row minibatches; ``cuda_graphs`` as ``PPOConfig.cuda_graphs``)."""
    import numpy as np
    import torch
    from gymnasium import spaces

    from zmq_rl.config import LearnerConfig, PolicyConfig, PPOConfig
    from zmq_rl.rl.rollout import Rollout
    from zmq_rl.rl.trainer import Trainer

    T, B = 64, 64
    cfg = LearnerConfig(
        device=device, num_actors=1, num_envs=B, num_steps=T, torch_threads=threads, seed=0
    )
    trainer = Trainer(
        cfg,
        PPOConfig(num_epochs=4, minibatch_size=minibatch, cuda_graphs=cuda_graphs),
        PolicyConfig(hidden_sizes=hidden),
        spaces.Box(-np.inf, np.inf, (4,), np.float32),
        spaces.Discrete(2),
    )
    rng = np.random.default_rng(0)

    def rollout() -> Rollout:
        return Rollout(
            slots=[(b, 0) for b in range(B)],
            obs=rng.standard_normal((T, B, 4)).astype(np.float32),
            actions=rng.integers(0, 2, (T, B)).astype(np.int64),
            rewards=np.ones((T, B), np.float32),
            terminated=rng.random((T, B)) < 0.02,
            truncated=np.zeros((T, B), bool),
            values=rng.standard_normal((T, B)).astype(np.float32),
            log_probs=np.full((T, B), np.log(0.5), np.float32),
            versions=np.zeros((T, B), np.int64),
            bootstrap_obs=rng.standard_normal((B, 4)).astype(np.float32),
            final_t=np.zeros(0, np.int64),
            final_b=np.zeros(0, np.int64),
            final_obs=np.zeros((0, 4), np.float32),
        )

    times = []
    for i in range(3 + updates):
        batch = rollout()
        if trainer.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        trainer.update(batch, 0.0)  # ends in a host sync (the metrics)
        if trainer.device.type == "cuda":
            torch.cuda.synchronize()
        if i >= 3:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def per_minibatch_costs(updates: int) -> list[dict[str, Any]]:
    """Milliseconds per minibatch step of a 4,096-row update (4 epochs), by network,
    minibatch size and device (CUDA graphs on and off): the update's overhead per
    gradient step, which issue 28 bounds at 0.5 ms on a GPU."""
    rows = []
    for hidden in ((64, 64), (256, 256)):
        for minibatch in (1024, 64):
            steps = 4 * (4096 // minibatch)
            cells = [("cpu", 1, True), ("cuda", 1, False), ("cuda", 1, True)]
            for device, threads, graphs in cells:
                seconds = time_updates(device, hidden, updates, threads, minibatch, graphs)
                row = {
                    "hidden": list(hidden), "minibatch": minibatch, "device": device,
                    "cuda_graphs": graphs and device == "cuda", "update_ms": 1e3 * seconds,
                    "per_minibatch_ms": 1e3 * seconds / steps,
                }  # fmt: skip
                rows.append(row)
                label = device + (" graphs" if row["cuda_graphs"] else "")
                print(
                    f"MLP {hidden} minibatch {minibatch} on {label}: update "
                    f"{row['update_ms']:.1f} ms, {row['per_minibatch_ms']:.3f} ms per minibatch",
                    flush=True,
                )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _util.add_common_flags(parser)
    parser.add_argument("--updates", type=int, default=15, help="timed updates per cell")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--window", type=float, default=6.0)
    parser.add_argument("--skip-tests", action="store_true", help="only the figures")
    parser.add_argument(
        "--only-update",
        action="store_true",
        help="only step 2, per minibatch: 1,024- and 64-row minibatches on cuda with and "
        "without CUDA graphs and on one CPU thread (the update's per-minibatch overhead)",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.updates, args.warmup, args.window = 3, 0.5, 1.5
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    import torch

    if not torch.cuda.is_available():
        print(
            f"no usable CUDA GPU: torch {torch.__version__} (CUDA build: "
            f"{torch.version.cuda or 'none'}); nothing to check",
            file=sys.stderr,
        )
        return 2
    gpu = torch.cuda.get_device_name(0)
    print(f"GPU: {gpu}; torch {torch.__version__}, CUDA {torch.version.cuda}", flush=True)
    result: dict[str, Any] = {
        "gpu": gpu,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }

    if args.only_update:
        result["per_minibatch"] = per_minibatch_costs(args.updates)
        _util.write_result("gpu_check", args, result)
        return 0

    if not args.skip_tests:
        tests = run_tests(PYTEST_TIMEOUT_S)
        result["tests"] = tests
        print(
            f"tests/test_device.py: exit {tests['returncode']} in {tests['seconds']:.0f} s; "
            f"CUDA tests skipped: {len(tests['cuda_tests_skipped'])} -> "
            f"{'OK' if tests['ok'] else 'FAILED'}",
            flush=True,
        )
        if not tests["ok"]:
            print(tests["tail"], flush=True)

    cores = os.cpu_count() or 1
    update_rows = []
    for hidden in ((64, 64), (256, 256)):
        for device, threads in (("cpu", 1), ("cpu", cores), ("cuda", 1)):
            seconds = time_updates(device, hidden, args.updates, threads)
            update_rows.append(
                {"hidden": list(hidden), "device": device, "threads": threads, "seconds": seconds}
            )
            print(
                f"update 4096 rows, MLP {hidden}, {device} ({threads} threads): "
                f"{1000 * seconds:.1f} ms",
                flush=True,
            )
    result["update"] = update_rows

    import throughput

    end_to_end = []
    for device in ("cpu", "cuda"):
        cell = throughput.run_project(2, 32, args.warmup, args.window, device=device)
        end_to_end.append(cell)
        print(
            f"throughput 2 actors x 32 envs, learner on {cell['device']}: "
            f"{_util.fmt_rate(cell['steps_per_s'])} env steps/s",
            flush=True,
        )
    result["throughput"] = end_to_end

    _util.write_result("gpu_check", args, result)
    ok = result.get("tests", {"ok": True})["ok"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
