"""What a fleet buys: launch -> first evaluation at the score, for 1, 2, 4, ... actors, on
an env as it is or a simulator that waits a fixed time per step, on loopback or with
every actor on a host of its own behind a slow link.

Every row is one fresh ``zmq-rl run --env ENV --actors N --seed S`` (the env's preset;
``bench/scaling.py``'s :func:`run_one` times it, from ``Popen`` to the progress line
whose evaluation reaches the score). ``--wait-ms W`` wraps every env of the run
(actors and evaluator) in ``zmq_rl.envs:StepDelay(seconds=W/1000)``: a simulator at a
fixed tick, which costs wall time and no CPU, so 2 cores can host 16-32 such actors.
The table gives, per actor count (medians over the seeds): env steps to the score and
launch -> score, each as a ratio to the 1-actor row, env steps/s, the learner's busy
share, the actors' paused share (the staleness valve), the mean policy lag, and launch
-> the first update.

``--base-tree DIR`` (or ``--base REV``) runs an earlier tree's ``zmq-rl`` in the same
run, alternating with this one per (actors, seed): before/after in one run. A tree
without ``zmq_rl.envs.StepDelay`` gets the same wait from ``bench/_fleet_wait.py``.
``--hosts`` puts each actor in a network namespace of its own behind a link of
``--rtt-ms`` and ``--rate-mbit`` with CURVE on (bench/_fleet_hosts.py; needs root).
Flags after ``--`` go to every run.

    python bench/fleet.py --wait-ms 10 --actors 1 2 4 8 16 --seeds 0 1 2
    python bench/fleet.py --env LunarLander-v3 --actors 2 14 --cap 900
    python bench/fleet.py --wait-ms 10 --actors 1 16 --base-tree /tmp/before
    python bench/fleet.py --smoke
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _util  # noqa: E402
from scaling import BUDGET, TARGETS, run_one  # noqa: E402

BENCH = Path(__file__).resolve().parent


def wait_flags(wait_ms: float, tree: Path) -> list[str]:
    """The ``--wrapper`` of a ``wait_ms`` wait per step for ``tree``'s ``zmq-rl run``."""
    if not wait_ms:
        return []
    has_it = (tree / "zmq_rl" / "envs" / "waiting.py").is_file()
    module = "zmq_rl.envs" if has_it else "_fleet_wait"
    return ["--wrapper", f"{module}:StepDelay(seconds={wait_ms / 1000:g})"]


def median_of(rows: list[dict[str, Any]], key: str) -> float:
    """The median of ``key`` over ``rows`` (NaN where a row has none)."""
    values = [r[key] for r in rows if r.get(key) is not None]
    return _util.median([float(v) for v in values]) if values else math.nan


def table(rows: list[dict[str, Any]], counts: list[int]) -> list[list[Any]]:
    """One line per (tree, actors): medians, and ratios to that tree's 1-actor line
    (its fewest actors)."""
    out = []
    for code in dict.fromkeys(r["code"] for r in rows):
        base = [r for r in rows if r["code"] == code and r["actors"] == counts[0]]
        base_steps = median_of(base, "steps_at_score")
        base_time = median_of(base, "time_to_score_s")
        for actors in counts:
            mine = [r for r in rows if r["code"] == code and r["actors"] == actors]
            steps, seconds = median_of(mine, "steps_at_score"), median_of(mine, "time_to_score_s")
            out.append([
                code, actors, f"{sum(r['solved'] for r in mine)}/{len(mine)}",
                f"{steps:,.0f}", f"{steps / base_steps:.2f}", f"{seconds:.1f}",
                f"{seconds / base_time:.2f}",
                _util.fmt_rate(median_of(mine, "env_steps_per_s")),
                f"{100 * median_of(mine, 'learner_busy_share'):.0f}%",
                f"{100 * median_of(mine, 'actors_paused_share'):.0f}%",
                f"{median_of(mine, 'policy_lag_mean'):.1f}",
                f"{median_of(mine, 'first_update_s'):.1f}",
            ])  # fmt: skip
    return out


HEADERS = [
    "code", "actors", "solved", "env steps to score", "x fewest", "launch -> score s",
    "x fewest", "env steps/s", "learner busy", "paused", "lag", "first update s",
]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _util.add_common_flags(parser)
    _util.add_base_flags(parser)
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--target", type=float, default=None, help="default: the env's score")
    parser.add_argument("--wait-ms", type=float, default=0.0, help="wait per env step")
    parser.add_argument("--actors", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--cap", type=float, default=600.0, help="wall seconds per run")
    parser.add_argument("--hosts", action="store_true", help="actors on hosts of their own")
    parser.add_argument("--rtt-ms", type=float, default=20.0, help="--hosts: round trip")
    parser.add_argument("--rate-mbit", type=float, default=100.0, help="--hosts: link rate")
    parser.add_argument("flags", nargs="*", help="after --: extra zmq-rl run flags")
    args = parser.parse_args(argv)
    if args.smoke:
        args.env, args.target, args.actors, args.seeds, args.cap = (
            "CartPole-v1",
            60.0,
            [1, 2],
            [0],
            120.0,
        )
        args.wait_ms = args.wait_ms or 2.0
    target = args.target if args.target is not None else TARGETS[args.env]
    counts = sorted(args.actors)
    if args.hosts:
        from _fleet_hosts import run_on_hosts  # noqa: PLC0415 (root and namespaces only)

        runner = run_on_hosts
    else:
        runner = run_one
    rows: list[dict[str, Any]] = []
    with _util.revision_trees(args.base, args.base_tree) as trees:
        turn = 0
        for actors in counts:
            for seed in args.seeds:
                for code in _util.round_order(list(trees), turn):
                    tree = trees[code]
                    flags = [*wait_flags(args.wait_ms, tree), *args.flags]
                    if args.hosts:
                        row = runner(tree, args.env, actors, seed, target, args.cap, flags,
                                     rtt_ms=args.rtt_ms, rate_mbit=args.rate_mbit)  # fmt: skip
                    else:
                        row = runner(tree, args.env, actors, seed, target, args.cap, flags,
                                     [], extra_paths=(str(BENCH),))  # fmt: skip
                    row["code"] = code
                    rows.append(row)
                    print(
                        f"{code}: {actors} actor(s) seed {seed}: {row['time_to_score_s']:.1f} s "
                        f"to {target:g}, {row['steps_at_score']} steps "
                        f"(lag {row.get('policy_lag_mean', math.nan):.1f})",
                        flush=True,
                    )
                turn += 1
    where = f"{args.wait_ms:g} ms wait per step" if args.wait_ms else "no wait"
    link = (
        f", hosts behind {args.rtt_ms:g} ms / {args.rate_mbit:g} Mbit/s + CURVE"
        if args.hosts
        else ""
    )
    print(f"\n{args.env} -> {target:g}, {where}{link}, budget cap {BUDGET:,} steps")
    _util.print_table(HEADERS, table(rows, counts))
    _util.write_result("fleet", args, {
        "env": args.env, "target": target, "wait_ms": args.wait_ms, "hosts": args.hosts,
        "rtt_ms": args.rtt_ms, "rate_mbit": args.rate_mbit, "flags": args.flags,
        "rows": rows, "machine": _util.machine_info(),
    })  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
