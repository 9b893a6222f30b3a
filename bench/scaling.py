"""More hardware, less time to score: ``zmq-rl run`` with 1, 2, 4, ... actors up to the
cores the machine has, each row measured as launch -> first deterministic evaluation
at the score, next to the env-only time of the same steps on the same cores.

For every (actors, seed) one fresh ``zmq-rl run --env ENV --actors N --seed S
--target-return T`` process tree is started (its own session, killed as a group at
the end); the figure is the wall time from ``Popen`` to the first progress line
whose evaluation is >= T (``bench/time_to_solve.py``'s timing). Beside it, per row:
the env steps consumed at that evaluation, env steps/s, the learner's busy share
(time in PPO updates over wall time, ``time/update_seconds`` in ``metrics.jsonl``),
the actors' paused share (the staleness valve's, ``links/valve_paused_share_mean``),
launch -> the first update, the evaluations' lag (updates from a snapshot to the
update its result came with; the table shows the median) and the **env-only
time**: the same number of env steps taken with random actions by one process per
core of this machine (measured once per run, ``--env-seconds``), so
``ratio = time to score / env-only time`` says how far the run is from the physical
limit of the hardware (1.0: the learner, inference and transport cost nothing).

``--base REV`` (or ``--base-tree DIR``) runs an earlier revision's ``zmq-rl`` in the
same run, alternating with this tree per (actors, seed). Flags after ``--`` go to
every ``zmq-rl run``. The cores are the process's CPU affinity: ``taskset -c 0,1
python bench/scaling.py`` measures a 2-core machine on a larger one.

    python bench/scaling.py                                    # LunarLander-v3, seeds 0-2
    python bench/scaling.py --env CartPole-v1 --actors 1 2
    python bench/scaling.py --actors 2 14 --seeds 0 -- --device cuda
    python bench/scaling.py --smoke                            # CartPole, 1 actor, low target
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os
import queue
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _util  # noqa: E402
from learner_ceiling import env_only_rate  # noqa: E402
from time_to_solve import _timed_lines, _zmq_solved  # noqa: E402

from zmq_rl.learner.metrics import is_evaluation_row  # noqa: E402

BUDGET = 20_000_000
"""Env steps each run may take: far more than any row needs, so the wall cap
(``--cap``) ends an unsolved run, never the preset's budget."""
TARGETS = {"LunarLander-v3": 200.0, "CartPole-v1": 475.0, "Acrobot-v1": -100.0}


def default_actor_counts(cores: int) -> list[int]:
    """1, 2, 4, ... below ``cores``, then ``cores - 2`` (two cores left for the learner
    and the evaluator) when that is larger: 1 2 on 2 cores, 1 2 4 8 14 on 16."""
    counts = [1]
    while counts[-1] * 2 < cores - 1:
        counts.append(counts[-1] * 2)
    if cores - 2 > counts[-1]:
        counts.append(cores - 2)
    elif cores == 2:
        counts.append(2)
    return counts


def evaluation_lags(rows: list[dict[str, Any]]) -> list[int]:
    """Updates from each evaluated snapshot to the update its result came with
    (``reported_at_update`` of ``metrics.jsonl``'s evaluation rows)."""
    return [
        int(r["reported_at_update"]) - int(r["update"])
        for r in rows
        if is_evaluation_row(r) and "reported_at_update" in r
    ]


def arrival_s(hit: dict[str, Any], metrics: list[dict[str, Any]], first_update: float) -> float:
    """Seconds from launch to the update with which the evaluation ``hit`` (a report
    evaluation at the score) came in, when no output line showed it: a result that
    arrived between progress lines stops the run before the next one, and the learner
    says "stopping" at INFO, below the benchmark's ``--log-level warning``. The
    learner's clock (``wall_seconds``) is put on the launch's by the first update,
    whose progress line's time is known. Infinite without what that needs."""
    by_update = {int(m["update"]): m["wall_seconds"] for m in metrics}
    update = hit.get("reported_at_update", hit.get("updates"))
    if update is None or int(update) not in by_update or 1 not in by_update:
        return math.inf
    if not math.isfinite(first_update):
        return math.inf
    return first_update - by_update[1] + by_update[int(update)]


def run_one(
    tree: Path,
    env: str,
    actors: int,
    seed: int,
    target: float,
    cap: float,
    flags: list[str],
    cpus: list[int],
    extra_paths: tuple[str, ...] = (),
) -> dict[str, Any]:
    """One ``zmq-rl run`` of ``tree`` to the target (pinned to ``cpus`` when given;
    ``extra_paths`` on its ``PYTHONPATH`` after the tree): its timing and run figures."""
    work = tempfile.mkdtemp(prefix="scaling-")
    run_dir = Path(work) / "run"
    pin = ["taskset", "-c", ",".join(map(str, cpus))] if cpus else []
    cmd = [
        *pin,
        sys.executable, "-m", "zmq_rl.cli.main", "run", "--env", env, "--actors", str(actors),
        "--seed", str(seed), "--port", str(_util.free_port_block(4)), "--run-dir", str(run_dir),
        "--no-plot", "--no-tensorboard", "--log-level", "warning", "--target-return",
        str(target), "--total-env-steps", str(BUDGET), *flags,
    ]  # fmt: skip
    solved = _zmq_solved(target)
    lines, _, code = _timed_lines(
        cmd,
        cap,
        work,
        solved,
        stop_after_solve=True,
        extra_env={"PYTHONPATH": os.pathsep.join([_util.python_path(tree), *extra_paths])},
    )
    return run_figures(run_dir, lines, solved, target, actors, seed, code)


def run_figures(
    run_dir: Path,
    lines: list[tuple[float, str]],
    solved: Any,
    target: float,
    actors: int,
    seed: int,
    code: int,
) -> dict[str, Any]:
    """The figures of one run to the score: its learner's output ``lines`` (seconds since
    launch, line), ``solved(line)`` for the line at the score, and its run dir's
    ``report.json`` and ``metrics.jsonl``."""
    # the progress line with the evaluation at the score, else the learner's "stopping:
    # evaluation reached target_return" (a result that came in between progress lines)
    solve_s = next(
        (at for at, line in lines if solved(line) or "stopping: evaluation reached" in line),
        math.inf,
    )
    report = (
        json.loads((run_dir / "report.json").read_text())
        if (run_dir / "report.json").is_file()
        else {}
    )
    metrics, rows = [], []
    if (run_dir / "metrics.jsonl").is_file():
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
        metrics = [m for m in rows if not is_evaluation_row(m)]  # update rows
    hit = next((e for e in report.get("evaluations", []) if e["mean_return"] >= target), None)
    first_update = next((at for at, line in lines if line.startswith("update 1/")), math.nan)
    if not math.isfinite(solve_s) and hit is not None:
        solve_s = arrival_s(hit, metrics, first_update)
    wall = metrics[-1]["wall_seconds"] if metrics else math.nan
    steps = metrics[-1]["env_steps"] if metrics else 0
    busy = sum(m.get("time/update_seconds", math.nan) for m in metrics)
    paused = [
        m["links/valve_paused_share_mean"] for m in metrics if "links/valve_paused_share_mean" in m
    ]
    lags = [m["charts/policy_lag_mean"] for m in metrics if "charts/policy_lag_mean" in m]
    return {
        "actors": actors,
        "seed": seed,
        "policy_lag_mean": statistics.mean(lags) if lags else math.nan,
        "updates_at_score": hit["updates"] if hit and "updates" in hit else None,
        "solved": math.isfinite(solve_s),
        "time_to_score_s": solve_s,
        "steps_at_score": hit["env_steps"] if hit else None,
        "env_steps_per_s": steps / wall if wall else math.nan,
        "learner_busy_share": busy / wall if wall else math.nan,
        "actors_paused_share": statistics.mean(paused) if paused else math.nan,
        "first_update_s": first_update,
        "eval_lag_updates": evaluation_lags(rows),
        "exit_code": code,
        "evaluations": [(e["env_steps"], e["mean_return"]) for e in report.get("evaluations", [])],
        "last_lines": [line for _, line in lines[-3:]],
    }


def _variants(specs: list[str], flags: list[str]) -> dict[str, list[str]]:
    """``NAME=FLAGS`` specs (flags split on spaces) added to the common flags; one
    variant named after the common flags when none is given."""
    if not specs:
        return {" ".join(flags) or "(preset)": list(flags)}
    out = {}
    for spec in specs:
        name, _, extra = spec.partition("=")
        out[name] = [*flags, *extra.split()]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _util.add_common_flags(parser)
    _util.add_base_flags(parser)
    parser.add_argument("--env", default="LunarLander-v3")
    parser.add_argument("--target", type=float, default=None, help="default: the env's score")
    parser.add_argument("--actors", type=int, nargs="+", default=None)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--cap", type=float, default=300.0, help="wall seconds per run")
    parser.add_argument("--env-seconds", type=float, default=3.0)
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=FLAGS",
        help="a named set of extra zmq-rl run flags (repeatable): each row runs every variant",
    )
    parser.add_argument(
        "--pin",
        type=int,
        default=0,
        metavar="CORES",
        help="run each zmq-rl run pinned to this many cores of its own (taskset), as many "
        "at once as fit in the cores this process may use; the env-only rate is then "
        "that of CORES cores. 0 (default): one run at a time on every core",
    )
    parser.add_argument("flags", nargs="*", help="after --: extra zmq-rl run flags")
    args = parser.parse_args(argv)
    allowed = sorted(os.sched_getaffinity(0))
    if args.smoke:
        args.env, args.target, args.actors, args.seeds, args.cap = (
            "CartPole-v1",
            100.0,
            [1],
            [0],
            120.0,
        )
        args.env_seconds = 0.5
    cores = args.pin or len(allowed)
    target = args.target if args.target is not None else TARGETS[args.env]
    counts = args.actors or default_actor_counts(cores)
    variants = _variants(args.variant, args.flags)
    slots = (
        [allowed[i : i + args.pin] for i in range(0, len(allowed) - args.pin + 1, args.pin)]
        if args.pin
        else [[]]
    )
    env_rate = env_only_rate(args.env, args.env_seconds, cores, slots[0])
    print(
        f"env-only: {_util.fmt_rate(env_rate)} steps/s ({args.env}, random actions, {cores} cores)"
    )
    rows: list[dict[str, Any]] = []
    with _util.revision_trees(args.base, args.base_tree) as trees:
        jobs = []
        for turn, (actors, seed) in enumerate((a, s) for a in counts for s in args.seeds):
            order = [(t, v) for t in trees for v in variants]
            for tree_name, variant in order if turn % 2 == 0 else reversed(order):
                jobs.append((tree_name, variant, actors, seed))
        free: queue.Queue[list[int]] = queue.Queue()
        for cpus in slots:
            free.put(cpus)

        def work(job: tuple[str, str, int, int]) -> dict[str, Any]:
            tree_name, variant, actors, seed = job
            cpus = free.get()
            try:
                row = run_one(trees[tree_name], args.env, actors, seed, target, args.cap,
                              variants[variant], cpus)  # fmt: skip
            finally:
                free.put(cpus)
            row["code"] = tree_name if len(variants) == 1 else f"{tree_name}: {variant}"
            row["env_only_s"] = (row["steps_at_score"] or math.nan) / env_rate
            row["ratio"] = row["time_to_score_s"] / row["env_only_s"]
            print(
                f"{row['code']}: {actors} actor(s) seed {seed}: {row['time_to_score_s']:.1f} s "
                f"to {target:g} ({row['steps_at_score']} steps, ratio {row['ratio']:.2f})",
                flush=True,
            )
            return row

        with concurrent.futures.ThreadPoolExecutor(len(slots)) as pool:
            rows = list(pool.map(work, jobs))
    table = []
    for code in dict.fromkeys(r["code"] for r in rows):
        for actors in counts:
            mine = [r for r in rows if r["code"] == code and r["actors"] == actors]
            times = [r["time_to_score_s"] for r in mine]
            table.append([
                code, actors, f"{sum(r['solved'] for r in mine)}/{len(mine)}",
                f"{_util.median(times):.1f}", f"{_util.median([r['ratio'] for r in mine]):.2f}",
                _util.fmt_rate(_util.median([r["env_steps_per_s"] for r in mine])),
                f"{100 * _util.median([r['learner_busy_share'] for r in mine]):.0f}%",
                f"{100 * _util.median([r['actors_paused_share'] for r in mine]):.0f}%",
                f"{_util.median([r['first_update_s'] for r in mine]):.1f}",
                f"{_util.median([x for r in mine for x in r['eval_lag_updates']]):.0f}",
            ])  # fmt: skip
    where = f"{cores} cores" + (f" per run, {len(slots)} runs at once" if args.pin else "")
    print(f"\n{args.env} -> {target:g}, {where}, flags {args.flags or '(preset)'}")
    _util.print_table(
        ["code", "actors", "solved", "time to score s (median)", "x env-only", "env steps/s",
         "learner busy", "paused", "first update s", "eval lag (updates)"],
        table,
    )  # fmt: skip
    _util.write_result("scaling", args, {
        "env": args.env, "target": target, "cores": cores, "pinned": args.pin,
        "variants": variants, "env_only_steps_per_s": env_rate, "rows": rows,
        "machine": _util.machine_info(),
    })  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
