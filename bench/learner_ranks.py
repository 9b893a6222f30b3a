"""1 vs 2 data-parallel learner ranks (issue 12, item 6): consumed env steps/s and
updates/s of one CartPole-v1 run with ``num_learners`` 1 and 2, alternating in one
run.

The learner runs in this process (bench/throughput.py's ``run_project``; rank 1 is
its spawned child), at a learner-bound setting by default: 4 light actor processes x
8 envs, rollouts of 256 steps (8,192 rows per update), PPO 20 epochs of 512-row
minibatches (320 gradient steps per update), ``broadcast_every`` 1. With two ranks
each rank computes the gradients of its own actors' half of every minibatch and the
two halves are averaged by an all-reduce per minibatch (the same steps as one
learner). Each round measures 1 then 2 ranks (then the order flips); the ratio is
taken per round (the machine may be shared); the verdict is the median ratio.

    python bench/learner_ranks.py
    python bench/learner_ranks.py --smoke
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _util  # noqa: E402
from throughput import run_project  # noqa: E402


def one(ranks: int, args: argparse.Namespace) -> dict[str, Any]:
    """One measurement with ``ranks`` learner ranks."""
    changes = {
        "num_learners": ranks,
        "num_steps": args.num_steps,
        "fragment_length": 32,
        "broadcast_every": 1,
    }
    ppo = {"num_epochs": args.epochs, "minibatch_size": args.minibatch}
    policy = {"hidden_sizes": (args.hidden, args.hidden)}
    result = run_project(
        args.actors, args.envs, args.warmup, args.window, changes, ppo, policy_changes=policy
    )
    result["num_learners"] = ranks
    print(
        f"ranks={ranks}  {result['steps_per_s']:9,.0f} steps/s  "
        f"{result['updates_per_s']:6.3f} updates/s",
        flush=True,
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--actors", type=int, default=4)
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--num-steps", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--minibatch", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=64, help="width of the two hidden layers")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--window", type=float, default=30.0)
    _util.add_common_flags(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds, args.warmup, args.window, args.epochs = 1, 2.0, 4.0, 2
        args.actors, args.num_steps = 2, 64
    rows, ratios = _util.ab_rounds(
        args.rounds, (1, 2), lambda n: one(n, args), (2, 1), "2-rank / 1-rank"
    )
    summary = {
        "setting": {
            "actors": args.actors,
            "envs": args.envs,
            "num_steps": args.num_steps,
            "num_epochs": args.epochs,
            "minibatch_size": args.minibatch,
            "hidden_sizes": [args.hidden, args.hidden],
        },
        "ratios_2_over_1": ratios,
        "median_ratio": statistics.median(ratios),
        "rows": rows,
    }
    print(
        f"median 2-rank / 1-rank ratio: {summary['median_ratio']:.3f} over {len(ratios)} round(s)"
    )
    _util.write_result("learner_ranks", args, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
