"""Time to solve CartPole-v1, launch included: zmq-rl run vs Stable-Baselines3 PPO.

For every seed, each side is one fresh subprocess (so interpreter start, imports
and, for zmq-rl, the actor processes' start are inside the figure), and the
figure is the wall time from ``Popen`` to the moment the first deterministic
evaluation with mean return >= the target is reported on its stdout (the parent
timestamps each line as it arrives; both run with ``PYTHONUNBUFFERED=1``):

* ``zmq-rl run --seed S --port P --run-dir TMP --no-plot``: the command's
  defaults (2 actors x 4 envs, T 32, PPO 20 epochs, minibatch 256, lr 1e-3
  annealed, evaluation of 20 deterministic episodes every 5 updates = 1280 env
  steps, stop at mean return 475, budget 100k steps). ``--port`` only avoids
  clashes with other runs; ``--no-plot`` only skips the plot drawn after the run.
  The solve is the progress line with ``eval >= 475``, cross-checked with the run
  dir's ``report.json`` ``evaluations``.
* ``bench/sb3_ppo.py solve --seed S``: SB3 PPO with the rl-baselines3-zoo
  hyperparameters (8 envs, n_steps 32, batch 256, 20 epochs, gae_lambda 0.8, gamma
  0.98, lr lin_1e-3, clip lin_0.2, ent 0, budget 1e5), SB3's ``EvalCallback`` (20
  deterministic episodes on 20 lockstep envs, every 1280 steps) with
  ``StopTrainingOnRewardThreshold(475)``; the solve is its ``SOLVED`` line.
  torch 1 thread on both sides (see ``bench/sb3_ppo.py --torch-threads``).

The seeds alternate which side goes first. Medians over seeds (a run that does not
solve within its budget counts as infinitely slow).

    python bench/time_to_solve.py                 # seeds 0-4
    python bench/time_to_solve.py --smoke         # seed 0, target 100, stop once solved
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import contextlib

import _util  # noqa: E402

EVAL = re.compile(r"\beval (-?[\d.]+|nan)")


SOLVED_GRACE_S = 60.0
"""Seconds a run stopped after its solve may take to stop gracefully (shut its actors
down, evaluate once more, write ``report.json``, whose evaluations give the steps at
the solve), even past the wall cap: on a loaded machine that can take tens of seconds,
and a solve just before the cap must not lose its report."""


def _timed_lines(
    cmd: list[str],
    timeout: float,
    cwd: str,
    solved: Any = None,
    stop_after_solve: bool = False,
    extra_env: dict[str, str] | None = None,
) -> tuple[list[tuple[float, str]], float, int]:
    """Run ``cmd``; return ([(seconds since launch, line)], seconds to exit, exit code).

    The process runs in its own session; on timeout its whole group is killed. With
    ``stop_after_solve`` the process gets SIGTERM as soon as a line satisfies
    ``solved(line)`` (``zmq-rl run`` then stops gracefully), so only the figure is
    waited for; its exit time is then not meaningful."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(extra_env or {})}
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=cwd,
        start_new_session=True,
        bufsize=1,
    )
    lines: list[tuple[float, str]] = []
    done = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.monotonic() - t0, line.rstrip("\n")))
            if solved is not None and solved(line):
                done.set()
        done.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = t0 + timeout
    grace = 1.0
    if stop_after_solve:
        done.wait(timeout)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            grace = SOLVED_GRACE_S  # let it write its report, however late the solve
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(max(grace, deadline - time.monotonic()))
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
            proc.wait(10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            continue
    exit_s = time.monotonic() - t0
    reader.join(10)
    return lines, exit_s, proc.returncode


def _zmq_solved(target: float) -> Any:
    def check(line: str) -> bool:
        m = EVAL.search(line)
        return bool(m) and line.startswith("update ") and float(m.group(1)) >= target

    return check


def zmq_rl_command() -> list[str]:
    script = Path(sys.executable).with_name("zmq-rl")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "zmq_rl.cli.main"]


def run_zmq(seed: int, target: float, timeout: float, stop: bool) -> dict[str, Any]:
    work = tempfile.mkdtemp(prefix="tts-zmq-")
    run_dir = os.path.join(work, "run")
    port = _util.free_port_block(3)
    cmd = [
        *zmq_rl_command(),
        "run",
        "--seed",
        str(seed),
        "--port",
        str(port),
        "--run-dir",
        run_dir,
        "--no-plot",
        "--log-level",
        "warning",
        # The measured setup: zmq-rl run's plain defaults (evaluation every 5 updates),
        # not CartPole's preset, which zmq-rl run now applies by itself.
        "--no-preset",
        "--eval-every",
        "5",
        "--target-return",
        str(target),
    ]
    try:
        solved = _zmq_solved(target)
        lines, exit_s, code = _timed_lines(cmd, timeout, work, solved, stop)
        solve_s = math.inf
        first_update_s = learner_ready_s = math.nan
        for at, line in lines:
            if line.startswith("waiting for") and math.isnan(learner_ready_s):
                learner_ready_s = at
            if line.startswith("update ") and math.isnan(first_update_s):
                first_update_s = at
            if solved(line):
                solve_s = at
                break
        report: dict[str, Any] = {}
        path = Path(run_dir) / "report.json"
        if path.is_file():
            report = json.loads(path.read_text())
        evaluations = report.get("evaluations", [])
        solved_evals = [e for e in evaluations if e["mean_return"] >= target]
        return {
            "seed": seed,
            "solved": math.isfinite(solve_s),
            "solve_s": solve_s,
            "learner_ready_s": learner_ready_s,
            "first_update_s": first_update_s,
            "exit_s": exit_s,
            "exit_code": code,
            "env_steps_at_solve": solved_evals[0]["env_steps"] if solved_evals else None,
            "learner_wall_at_solve_s": solved_evals[0]["wall_seconds"] if solved_evals else None,
            "evaluations": len(evaluations),
            "stop_reason": report.get("stop_reason"),
            "command": "zmq-rl " + " ".join(cmd[len(zmq_rl_command()) :]),
            "tail": [line for _, line in lines[-6:]] if not math.isfinite(solve_s) else [],
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_sb3(python: str, seed: int, target: float, timeout: float, stop: bool) -> dict[str, Any]:
    work = tempfile.mkdtemp(prefix="tts-sb3-")
    cmd = [
        python,
        str(Path(__file__).with_name("sb3_ppo.py")),
        "solve",
        "--seed",
        str(seed),
        "--target",
        str(target),
    ]
    try:
        lines, exit_s, code = _timed_lines(
            cmd, timeout, work, lambda line: line.startswith("SOLVED"), stop
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    solve_s = next((at for at, line in lines if line.startswith("SOLVED")), math.inf)
    start_s = next((at for at, line in lines if line.startswith("START")), math.nan)
    result = next((json.loads(line[7:]) for _, line in lines if line.startswith("RESULT ")), {})
    return {
        "seed": seed,
        "solved": math.isfinite(solve_s),
        "solve_s": solve_s,
        "learn_start_s": start_s,
        "exit_s": exit_s,
        "exit_code": code,
        "env_steps_at_solve": result.get("env_steps_at_solve"),
        "eval_seconds": result.get("eval_seconds"),
        "learn_seconds": result.get("learn_seconds"),
        "torch_threads": result.get("torch_threads"),
        "tail": [line for _, line in lines[-6:]] if not math.isfinite(solve_s) else [],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _util.add_common_flags(parser)
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--target", type=float, default=475.0)
    parser.add_argument("--timeout", type=float, default=300.0, help="per run")
    parser.add_argument("--no-sb3", action="store_true")
    args = parser.parse_args(argv)
    if args.smoke:
        args.seeds, args.target, args.timeout = "0", 100.0, 120.0
    seeds = [int(s) for s in args.seeds.split(",")]
    sb3_python = None if args.no_sb3 else _util.bench_python("stable_baselines3")

    zmq_runs, sb3_runs = [], []
    for i, seed in enumerate(seeds):
        order = ["zmq", "sb3"] if i % 2 == 0 else ["sb3", "zmq"]
        for side in order:
            if side == "zmq":
                res = run_zmq(seed, args.target, args.timeout, args.smoke)
                zmq_runs.append(res)
                print(
                    f"seed {seed} zmq-rl run: solved {res['solved']} at {res['solve_s']:.1f}s "
                    f"(learner bound {res['learner_ready_s']:.1f}s, first update "
                    f"{res['first_update_s']:.1f}s, exit {res['exit_s']:.1f}s, "
                    f"{res['env_steps_at_solve']} steps)",
                    flush=True,
                )
            elif sb3_python:
                res = run_sb3(sb3_python, seed, args.target, args.timeout, args.smoke)
                sb3_runs.append(res)
                print(
                    f"seed {seed} SB3 PPO: solved {res['solved']} at {res['solve_s']:.1f}s "
                    f"(learning from {res['learn_start_s']:.1f}s, exit {res['exit_s']:.1f}s, "
                    f"{res['env_steps_at_solve']} steps)",
                    flush=True,
                )

    zmq_median = _util.median([r["solve_s"] for r in zmq_runs])
    sb3_median = _util.median([r["solve_s"] for r in sb3_runs]) if sb3_runs else math.nan
    ratio = zmq_median / sb3_median if sb3_runs else math.nan
    summary = {
        "target_return": args.target,
        "zmq_rl_median_solve_s": zmq_median,
        "zmq_rl_solved": sum(r["solved"] for r in zmq_runs),
        "zmq_rl_median_first_update_s": _util.median([r["first_update_s"] for r in zmq_runs]),
        "zmq_rl_median_learner_ready_s": _util.median([r["learner_ready_s"] for r in zmq_runs]),
        "zmq_rl_median_exit_s": _util.median([r["exit_s"] for r in zmq_runs]),
        "zmq_rl_median_steps": _util.median(
            [r["env_steps_at_solve"] for r in zmq_runs if r["env_steps_at_solve"]]
        ),
        "sb3_median_solve_s": sb3_median,
        "sb3_solved": sum(r["solved"] for r in sb3_runs),
        "sb3_median_learn_start_s": (
            _util.median([r["learn_start_s"] for r in sb3_runs]) if sb3_runs else math.nan
        ),
        "sb3_median_steps": (
            _util.median([r["env_steps_at_solve"] for r in sb3_runs if r["env_steps_at_solve"]])
            if sb3_runs
            else math.nan
        ),
        "zmq_rl_vs_sb3": ratio,
        "seeds": seeds,
    }
    print()
    rows = [
        [
            "zmq-rl run",
            f"{summary['zmq_rl_median_solve_s']:.1f}",
            f"{summary['zmq_rl_solved']}/{len(zmq_runs)}",
            f"{summary['zmq_rl_median_steps']:.0f}",
            f"{summary['zmq_rl_median_first_update_s']:.1f} (first update)",
        ]
    ]
    if sb3_runs:
        rows.append(
            [
                "SB3 PPO zoo",
                f"{sb3_median:.1f}",
                f"{summary['sb3_solved']}/{len(sb3_runs)}",
                f"{summary['sb3_median_steps']:.0f}",
                f"{summary['sb3_median_learn_start_s']:.1f} (learn starts)",
            ]
        )
    _util.print_table(["", "median s to solve", "solved", "median steps", "start-up s"], rows)
    if sb3_runs:
        ok = ratio <= 1.0
        print(f"target: zmq-rl <= 1.0 x SB3: {ratio:.2f}x -> {'MET' if ok else 'MISSED'}")
    else:
        print("stable_baselines3 not importable here or in .venv-bench: SB3 side skipped")
    _util.write_result(
        "time_to_solve",
        args,
        {
            "config": {
                "seeds": seeds,
                "target": args.target,
                "timeout": args.timeout,
                "sb3_python": sb3_python,
            },
            "zmq_rl": zmq_runs,
            "sb3": sb3_runs,
            "summary": summary,
            "target": {"zmq_rl_vs_sb3_max": 1.0, "met": (ratio <= 1.0) if sb3_runs else None},
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
