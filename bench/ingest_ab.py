"""Ingest thread A/B (issue 12, item 2): consumed env steps/s and updates/s of one
learner with ``ingest_thread`` on and off, alternating in one run.

The learner runs in this process (bench/throughput.py's ``run_project``), CartPole-v1,
at a learner-bound setting by default: 2 actor processes x 8 envs, rollouts of 128
steps (2,048 rows), PPO 10 epochs of 256-row minibatches (80 gradient steps per
update), ``broadcast_every`` 1 and the default staleness valve. Each round measures
"on" then "off" (then the order flips), and the ratio on/off is taken per round (the
machine may be shared); the verdict is the median ratio.

    python bench/ingest_ab.py
    python bench/ingest_ab.py --smoke
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

LEARNER_BOUND = {"num_steps": 128, "fragment_length": 32}
PPO_SETTINGS = {"num_epochs": 10, "minibatch_size": 256}


def one(on: bool, args: argparse.Namespace) -> dict[str, Any]:
    """One measurement with the ingest thread ``on`` or off."""
    changes = {**LEARNER_BOUND, "ingest_thread": on, "num_steps": args.num_steps}
    ppo = {**PPO_SETTINGS, "num_epochs": args.epochs}
    result = run_project(args.actors, args.envs, args.warmup, args.window, changes, ppo)
    result["ingest_thread"] = on
    print(
        f"ingest_thread={'on ' if on else 'off'}  {result['steps_per_s']:9,.0f} steps/s  "
        f"{result['updates_per_s']:6.2f} updates/s  cores busy {result['cpu_cores_busy']:.2f}",
        flush=True,
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--num-steps", type=int, default=LEARNER_BOUND["num_steps"])
    parser.add_argument("--epochs", type=int, default=PPO_SETTINGS["num_epochs"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--window", type=float, default=10.0)
    _util.add_common_flags(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds, args.warmup, args.window, args.epochs = 1, 1.0, 2.0, 2
    on_off = (True, False)
    rows, ratios = _util.ab_rounds(args.rounds, on_off, lambda on: one(on, args), on_off, "on/off")
    summary = {
        "setting": {
            "actors": args.actors,
            "envs": args.envs,
            "num_steps": args.num_steps,
            "num_epochs": args.epochs,
            "minibatch_size": PPO_SETTINGS["minibatch_size"],
        },
        "ratios_on_over_off": ratios,
        "median_ratio": statistics.median(ratios),
        "rows": rows,
    }
    print(f"median on/off ratio: {summary['median_ratio']:.3f} over {len(ratios)} round(s)")
    _util.write_result("ingest_ab", args, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
