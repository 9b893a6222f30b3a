"""Stepping ``--envs`` envs at once: one after another, in threads
(``zmq_rl.envs.EnvStepper``), or in processes (gymnasium's ``AsyncVectorEnv``), for an
env whose steps wait (``StepDelay``: a simulator's tick) and for the env as it is.

Per combination: wall time per step of all the envs (median over ``--steps`` steps after
a warm-up) and CPU time of this process per step (threads and the sequential loop run
here; AsyncVectorEnv's workers run in their own processes, whose CPU is not counted).
The built-in actor picks threads for envs that wait and keeps the sequential loop for
the others (``--step-envs auto``, docs/design.md section 10).

    python bench/env_stepping.py                       # CartPole, 8 envs, 0 / 2 / 10 ms
    python bench/env_stepping.py --env LunarLander-v3 --envs 4 8 16
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _util  # noqa: E402
import gymnasium as gym  # noqa: E402

from zmq_rl.envs import EnvStepper, make_env  # noqa: E402

MODES = ("sequential", "threads", "async")


def _wrappers(wait_ms: float) -> list[str]:
    return [f"zmq_rl.envs:StepDelay(seconds={wait_ms / 1000:g})"] if wait_ms else []


def measure(env_id: str, envs: int, wait_ms: float, mode: str, steps: int) -> dict[str, Any]:
    """Wall and CPU milliseconds per step of ``envs`` envs stepped in ``mode``."""
    wrappers = _wrappers(wait_ms)
    if mode == "async":
        vec = gym.vector.AsyncVectorEnv(
            [lambda: make_env(env_id, {}, wrappers) for _ in range(envs)],
            autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        )
        vec.reset(seed=0)
        space = vec.single_action_space

        def step() -> None:
            vec.step([space.sample() for _ in range(envs)])

        close = vec.close
    else:
        singles = [make_env(env_id, {}, wrappers) for _ in range(envs)]
        for i, env in enumerate(singles):
            env.reset(seed=i)
        stepper = EnvStepper(singles, mode)
        space = singles[0].action_space

        def step() -> None:
            stepper.step([space.sample() for _ in range(envs)])

        def close() -> None:
            stepper.close()
            for env in singles:
                env.close()

    try:
        for _ in range(5):
            step()
        walls, cpu0 = [], time.process_time()
        for _ in range(steps):
            start = time.perf_counter()
            step()
            walls.append(time.perf_counter() - start)
        cpu = time.process_time() - cpu0
    finally:
        close()
    return {
        "env": env_id, "envs": envs, "wait_ms": wait_ms, "mode": mode,
        "wall_ms": 1e3 * statistics.median(walls), "cpu_ms": 1e3 * cpu / steps,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _util.add_common_flags(parser)
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--envs", type=int, nargs="+", default=[8])
    parser.add_argument("--wait-ms", type=float, nargs="+", default=[0.0, 2.0, 10.0])
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args(argv)
    if args.smoke:
        args.envs, args.wait_ms, args.steps = [4], [0.0, 2.0], 20
    rows = [
        measure(args.env, envs, wait, mode, args.steps)
        for envs in args.envs
        for wait in args.wait_ms
        for mode in MODES
    ]
    _util.print_table(
        ["env", "envs", "wait ms", "mode", "wall ms / step", "CPU ms / step (this process)"],
        [
            [
                r["env"],
                r["envs"],
                f"{r['wait_ms']:g}",
                r["mode"],
                f"{r['wall_ms']:.3f}",
                f"{r['cpu_ms']:.3f}",
            ]
            for r in rows
        ],  # fmt: skip
    )
    _util.write_result("env_stepping", args, {"rows": rows, "machine": _util.machine_info()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
