"""Before/after: ``bench/throughput.py`` of an earlier revision against this tree, in
one run, alternating, so that a refactor's cost is a ratio measured under the same
load.

The earlier revision is checked out with ``git worktree`` into a temporary folder
and run with this interpreter and ``PYTHONPATH`` pointing at it (its actor processes
inherit both, so they import its code too). Each round runs the base, then this
tree (then the other order in the next round), each with its own
``bench/throughput.py`` and the same grid flags; the ratio is taken per round and
configuration, and the median is printed.

    python bench/compare_revisions.py --base 39e57a6
    python bench/compare_revisions.py --base 39e57a6 --smoke
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _util  # noqa: E402


def throughput(tree: Path, grid: list[str], out: Path, extra: list[str]) -> dict[str, float]:
    """Run ``tree``'s bench/throughput.py; steps/s by ``AxE`` configuration."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, "bench/throughput.py", *grid, *extra, "--out", str(out)]
    subprocess.run(command, cwd=tree, env=env, check=True, timeout=1800)
    data = json.loads(out.read_text())
    # Before the rename the key was envs_per_actor.
    return {
        f"{r['actors']}x{r.get('num_envs', r.get('envs_per_actor'))}": r["steps_per_s"]
        for r in data["grid"]
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _util.add_common_flags(parser)
    parser.add_argument("--base", required=True, help="the earlier revision (commit, tag)")
    parser.add_argument("--actors", default="2")
    parser.add_argument("--envs", default="8,32")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--base-extra",
        default="--ab-rounds 0",
        help="flags only the base's throughput.py takes (default: skip its fastproto A/B)",
    )
    args = parser.parse_args(argv)
    grid = ["--actors", args.actors, "--envs", args.envs, "--no-baselines", "--rounds", "0"]
    if args.smoke:
        grid += ["--warmup", "0.5", "--window", "1.5"]
        args.rounds = 1
    head = _util.ROOT
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(base), args.base],
            cwd=head,
            check=True,
            capture_output=True,
            timeout=120,
        )
        try:
            rounds: list[dict[str, Any]] = []
            for r in range(args.rounds):
                order = [("base", base), ("head", head)]
                if r % 2:
                    order.reverse()
                results = {
                    name: throughput(
                        tree,
                        grid,
                        Path(tmp) / f"{name}-{r}.json",
                        args.base_extra.split() if name == "base" else [],
                    )
                    for name, tree in order
                }
                rounds.append(results)
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(base)],
                cwd=head,
                check=False,
                capture_output=True,
                timeout=120,
            )
    configs = list(rounds[0]["head"])
    ratios = {c: statistics.median(r["head"][c] / r["base"][c] for r in rounds) for c in configs}
    _util.print_table(
        [
            "config",
            *(f"base r{i}" for i in range(len(rounds))),
            *(f"head r{i}" for i in range(len(rounds))),
            "head/base",
        ],
        [
            [
                c,
                *(_util.fmt_rate(r["base"][c]) for r in rounds),
                *(_util.fmt_rate(r["head"][c]) for r in rounds),
                f"{ratios[c]:.3f}",
            ]
            for c in configs
        ],
    )
    _util.write_result(
        "compare_revisions",
        args,
        {"base": args.base, "grid": grid, "rounds": rounds, "median_ratio": ratios},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
