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
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _util  # noqa: E402

ENV = "zmq_rl.envs:MaskedCartPole-v1"
TARGET = 475.0


def run_one(policy: str, seed: int, budget: int, eval_every: int, timeout: float) -> dict:
    """One ``zmq-rl run``; its evaluations and wall time."""
    with tempfile.TemporaryDirectory(prefix="masked-cartpole-") as tmp:
        run_dir = Path(tmp) / "run"
        port = _util.free_port_block(3)
        cmd = [
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
            str(port),
            "--run-dir",
            str(run_dir),
            "--no-plot",
        ]
        start = time.monotonic()
        done = subprocess.run(
            cmd, cwd=_util.ROOT, capture_output=True, text=True, timeout=timeout, check=False
        )
        wall = time.monotonic() - start
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-3000:]}")
        report = json.loads((run_dir / "report.json").read_text())
    evaluations = report["evaluations"]
    solved = next((e["env_steps"] for e in evaluations if e["mean_return"] >= TARGET), None)
    return {
        "policy": policy,
        "seed": seed,
        "budget": budget,
        "env_steps": report["env_steps_consumed"],
        "solved_at": solved,
        "best_eval": max((e["mean_return"] for e in evaluations), default=float("nan")),
        "last_eval": evaluations[-1]["mean_return"] if evaluations else float("nan"),
        "wall_s": wall,
        "evaluations": [(e["env_steps"], e["mean_return"]) for e in evaluations],
        "command": " ".join(["zmq-rl", *cmd[3:]]),
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
    """Run the grid, print the table, write bench/results/masked_cartpole.json."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="lstm,mlp", help="comma-separated policy types")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    parser.add_argument("--budget", type=int, default=500_000, help="env steps per run")
    parser.add_argument("--eval-every", type=int, default=40, help="updates between evaluations")
    parser.add_argument("--timeout", type=float, default=4 * 3600.0, help="seconds per run")
    _util.add_common_flags(parser)
    args = parser.parse_args()
    if args.smoke:
        args.policies, args.seeds, args.budget, args.eval_every = "lstm", "0", 2048, 4
    rows = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        for policy in args.policies.split(","):
            row = run_one(policy, seed, args.budget, args.eval_every, args.timeout)
            rows.append(row)
            print(
                f"{policy} seed {seed}: solved at {row['solved_at']}, best {row['best_eval']:.1f}, "
                f"last {row['last_eval']:.1f}, {row['env_steps']} steps, {row['wall_s']:.0f} s",
                flush=True,
            )
    print(table(rows))
    _util.write_result("masked_cartpole", args, {"target": TARGET, "runs": rows})


if __name__ == "__main__":
    main()
