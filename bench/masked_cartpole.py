"""Partially observed CartPole: MLP vs LSTM (the learning check of recurrent policies).

``zmq_rl.envs:MaskedCartPole-v1`` is CartPole-v1 with the velocities masked (the
observation is ``[x, theta]``): a memoryless policy cannot tell which way the pole is
moving; a recurrent one can infer it from the history. Each (policy, seed) is one
``zmq-rl run`` subprocess (a learner and 2 actors x 4 envs, T 32, fragments of 32,
PPO 20 epochs, minibatch 256, lr 1e-3 annealed, gamma 0.98, GAE lambda 0.8: the
command's defaults, which are rl-baselines3-zoo's CartPole settings) plus
``--normalize-obs``, evaluated (20 deterministic episodes) every ``--eval-every``
updates and stopped at the first evaluation with mean return >= 475 or when the
budget is spent. The table gives, per run, the env steps of the first evaluation
>= 475 (``-`` if none), the best and the last evaluation, and the wall time.

    nice -n 10 python bench/masked_cartpole.py                    # 3 seeds x {mlp, lstm}, 500k
    python bench/masked_cartpole.py --policies lstm --seeds 0 --budget 100000
    python bench/masked_cartpole.py --smoke                       # seconds: it runs
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _util  # noqa: E402

ENV = "zmq_rl.envs:MaskedCartPole-v1"
TARGET = 475.0


def command(policy: str, seed: int, budget: int, eval_every: int, run_dir: Path) -> list[str]:
    """The ``zmq-rl run`` command of one (policy, seed)."""
    return [
        sys.executable,
        "-m",
        "zmq_rl",
        "run",
        "--env",
        ENV,
        "--policy-type",
        policy,
        "--normalize-obs",
        "--seed",
        str(seed),
        "--total-env-steps",
        str(budget),
        "--eval-every",
        str(eval_every),
        "--target-return",
        str(TARGET),
        "--port",
        str(_util.free_port_block(3)),
        "--run-dir",
        str(run_dir),
        "--no-plot",
    ]


PROGRESS = re.compile(r"^update \d+/\d+\s+steps (\d+)\s+.*")
EVAL = re.compile(r"\beval (-?[\d.]+)")


def summarize(policy: str, seed: int, budget: int, run_dir: Path, wall: float) -> dict:
    """The figures of one run from its run dir: ``report.json`` when it finished, else
    the progress lines of its ``stdout.log`` (a run still going or cut short)."""
    report_path = run_dir / "report.json"
    if report_path.exists():
        report = json.loads(report_path.read_text())
        evaluations = [(e["env_steps"], e["mean_return"]) for e in report["evaluations"]]
        steps, finished = report["env_steps_consumed"], report["stop_reason"]
    else:
        evaluations, steps, finished = [], 0, "running"
        last = None
        log = run_dir.parent / f"{run_dir.name}.log"
        for line in log.read_text().splitlines() if log.exists() else []:
            match = PROGRESS.match(line)
            if match:
                steps = int(match.group(1))
                found = EVAL.search(line)
                if found and found.group(1) != last:
                    last = found.group(1)
                    evaluations.append((steps, float(last)))
    solved = next((s for s, r in evaluations if r >= TARGET), None)
    return {
        "policy": policy,
        "seed": seed,
        "budget": budget,
        "env_steps": steps,
        "stop_reason": finished,
        "solved_at": solved,
        "best_eval": max((r for _, r in evaluations), default=float("nan")),
        "last_eval": evaluations[-1][1] if evaluations else float("nan"),
        "wall_s": wall,
        "evaluations": evaluations,
    }


def table(rows: list[dict]) -> str:
    """The figures as a markdown table."""
    lines = [
        "| policy | seed | steps to eval >= 475 | best eval | last eval | env steps | wall |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        solved = f"{r['solved_at']:,}" if r["solved_at"] is not None else "-"
        lines.append(
            f"| {r['policy']} | {r['seed']} | {solved} | {r['best_eval']:.1f} | "
            f"{r['last_eval']:.1f} | {r['env_steps']:,} | {r['wall_s'] / 60:.1f} min |"
        )
    return "\n".join(lines)


def main() -> None:
    """Run the grid (``--parallel`` runs at a time), print the table, write
    bench/results/masked_cartpole.json."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="lstm,mlp", help="comma-separated policy types")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    parser.add_argument("--budget", type=int, default=500_000, help="env steps per run")
    parser.add_argument("--eval-every", type=int, default=40, help="updates between evaluations")
    parser.add_argument("--parallel", type=int, default=1, help="runs at a time")
    parser.add_argument("--runs-dir", default="", help="keep the run dirs here (default: temp)")
    parser.add_argument(
        "--summarize", action="store_true", help="only print the table of --runs-dir's runs"
    )
    _util.add_common_flags(parser)
    args = parser.parse_args()
    if args.smoke:
        args.policies, args.seeds, args.budget, args.eval_every = "lstm", "0", 2048, 4
    grid = [
        (policy, int(seed)) for seed in args.seeds.split(",") for policy in args.policies.split(",")
    ]
    runs_dir = Path(args.runs_dir or tempfile.mkdtemp(prefix="masked-cartpole-"))
    runs_dir.mkdir(parents=True, exist_ok=True)
    started: dict[tuple[str, int], float] = {}
    walls: dict[tuple[str, int], float] = {}
    if not args.summarize:
        waiting = list(grid)
        running: dict[tuple[str, int], subprocess.Popen] = {}
        while waiting or running:
            while waiting and len(running) < args.parallel:
                key = waiting.pop(0)
                run_dir = runs_dir / f"{key[0]}-seed{key[1]}"
                log = open(runs_dir / f"{run_dir.name}.log", "w")  # noqa: SIM115
                cmd = command(*key, args.budget, args.eval_every, run_dir)
                print("$", " ".join(["zmq-rl", *cmd[3:]]), flush=True)
                running[key] = subprocess.Popen(
                    cmd,
                    cwd=_util.ROOT,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"},
                )
                started[key] = time.monotonic()
            for key, proc in list(running.items()):
                if proc.poll() is not None:
                    walls[key] = time.monotonic() - started[key]
                    del running[key]
                    row = summarize(*key, args.budget, runs_dir / f"{key[0]}-seed{key[1]}", 0)
                    print(
                        f"{key[0]} seed {key[1]}: exit {proc.returncode}, solved at "
                        f"{row['solved_at']}, best {row['best_eval']:.1f}, last "
                        f"{row['last_eval']:.1f}, {row['env_steps']} steps, "
                        f"{walls[key]:.0f} s",
                        flush=True,
                    )
            time.sleep(1.0)
    rows = [
        summarize(
            policy,
            seed,
            args.budget,
            runs_dir / f"{policy}-seed{seed}",
            walls.get((policy, seed), _log_age(runs_dir / f"{policy}-seed{seed}.log")),
        )
        for policy, seed in grid
    ]
    print(table(rows))
    _util.write_result("masked_cartpole", args, {"target": TARGET, "runs": rows})


def _log_age(log: Path) -> float:
    """A run's wall time so far: the ``wall_seconds`` of its last metrics row."""
    metrics = log.parent / log.name.removesuffix(".log") / "metrics.jsonl"
    if not metrics.exists():
        return float("nan")
    lines = metrics.read_text().splitlines()
    return float(json.loads(lines[-1])["wall_seconds"]) if lines else float("nan")


if __name__ == "__main__":
    main()
