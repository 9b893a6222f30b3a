"""Learning quality: train a shipped preset over several seeds and report the final return.

One command per row of the table in docs/learning-quality.md::

    python bench/learning_quality.py --env CartPole-v1 --seeds 0 1 2
    python bench/learning_quality.py --env LunarLander-v3 --seeds 0 1 2 --vtrace --broadcast-every 4
    python bench/learning_quality.py --env LunarLander-v3 --seeds 0 1 2 --broadcast-every 4

Each seed is one ``zmq-rl run --config preset:ENV --seed S --total-env-steps N
--eval-every E --target-return inf`` (no early stop), run as a subprocess, one
after the other (the machine's cores go to the run's learner and actors). The
final evaluation (deterministic, ``eval_episodes`` = 20 in every preset) is read from
the run's ``report.json``. Results go to ``bench/results/quality-<env>-<variant>.json``
(rewritten after every seed, so an interrupted row keeps what finished), a learning
curve over the seeds to ``docs/img/quality-<env>-<variant>.png`` (``--plot``), and a
markdown row is printed. ``--table`` prints the rows of every results file instead.

Variants: ``gae-bc1`` (GAE, weights broadcast after every update), ``vtrace-bc4``
(V-trace, broadcast every 4 updates), ``gae-bc4`` (no V-trace, broadcast every 4).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _util import add_common_flags, figure_path, free_port_block, runs_root  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from zmq_rl.config import LearnerConfig  # noqa: E402
from zmq_rl.presets import preset_path  # noqa: E402

RESULTS = ROOT / "bench" / "results"
RUNS = ROOT / "runs" / "quality"
IMAGES = ROOT / "docs" / "img"


@dataclass(frozen=True)
class Target:
    """What a row must reach, and the published reference it is compared with."""

    threshold: float
    steps: int
    reference: str
    reference_value: float


TARGETS: dict[str, Target] = {
    "CartPole-v1": Target(475.0, 100_000, "zoo 500 ± 0 @ 100k", 500.0),
    "Acrobot-v1": Target(-85.0, 500_000, "zoo −73.5 @ 1M", -73.5),
    "Pendulum-v1": Target(-200.0, 200_000, "zoo −172 @ 100k", -172.0),
    "LunarLander-v3": Target(200.0, 1_000_000, "zoo 242 @ 1M", 242.0),
    "LunarLanderContinuous-v3": Target(200.0, 1_000_000, "zoo 271 @ 1M", 271.0),
}
VARIANT_ORDER = ("gae-bc1", "vtrace-bc4", "gae-bc4", "vtrace-bc4-before")


def variant_name(vtrace: bool, broadcast_every: int) -> str:
    """``gae-bc1``, ``vtrace-bc4``, ..."""
    return f"{'vtrace' if vtrace else 'gae'}-bc{broadcast_every}"


def run_command(args: argparse.Namespace, seed: int, run_dir: Path, port: int) -> list[str]:
    """The ``zmq-rl run`` command line of one seed."""
    cmd = [
        sys.executable,
        "-m",
        "zmq_rl.cli.main",
        "run",
        "--config",
        f"preset:{args.env}",
        "--seed",
        str(seed),
        "--total-env-steps",
        str(args.total_env_steps),
        "--target-return",
        "inf",
        "--broadcast-every",
        str(args.broadcast_every),
        "--use-vtrace" if args.vtrace else "--no-use-vtrace",
        "--run-dir",
        str(run_dir),
        "--port",
        str(port),
        "--no-plot",
    ]
    if args.eval_every is not None:
        cmd += ["--eval-every", str(args.eval_every)]
    return cmd + list(args.extra)


def public_command(args: argparse.Namespace) -> str:
    """The row's command as a reader would type it."""
    parts = ["python bench/learning_quality.py", "--env", args.env, "--seeds"]
    parts += [str(s) for s in args.seeds]
    if args.vtrace:
        parts.append("--vtrace")
    if args.broadcast_every != 1:
        parts += ["--broadcast-every", str(args.broadcast_every)]
    if args.total_env_steps != TARGETS.get(args.env, Target(0, 0, "", 0)).steps:
        parts += ["--total-env-steps", str(args.total_env_steps)]
    if args.eval_every is not None:
        parts += ["--eval-every", str(args.eval_every)]
    if args.tag:
        parts += ["--tag", args.tag]
    if args.extra:
        parts += ["--", *args.extra]
    return parts[0] + " " + shlex.join(parts[1:])


def run_seed(args: argparse.Namespace, seed: int, run_dir: Path) -> dict[str, Any]:
    """Train one seed to the end of its budget; its final evaluation and wall time."""
    report_path = run_dir / "report.json"
    if args.skip_done and report_path.is_file():
        print(f"seed {seed}: reusing {report_path}", flush=True)
        return seed_result(seed, run_dir, wall=None, cmd=None)
    if run_dir.exists():
        shutil.rmtree(run_dir)  # metrics.jsonl is appended to: never mix two runs
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    log_path = run_dir.parent / f"{run_dir.name}.log"
    for attempt in range(3):
        port = free_port_block()
        cmd = run_command(args, seed, run_dir, port)
        print(f"seed {seed}: {shlex.join(cmd[1:])}", flush=True)
        start = time.monotonic()
        with open(log_path, "w") as log:
            try:
                proc = subprocess.run(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=args.code,  # -m imports zmq_rl from here (and so do the actors)
                    env={**os.environ, "COLUMNS": "120"},
                    timeout=args.timeout,
                    check=False,
                )
                code = proc.returncode
            except subprocess.TimeoutExpired:
                code = -1
        wall = time.monotonic() - start
        text = log_path.read_text(errors="replace")
        if code == 0:
            return seed_result(seed, run_dir, wall, shlex.join(cmd[1:]))
        if "cannot bind" in text and attempt < 2:  # another process took the ports
            shutil.rmtree(run_dir, ignore_errors=True)
            continue
        tail = "\n".join(text.splitlines()[-12:])
        print(f"seed {seed} FAILED (exit {code}) after {wall:.0f}s:\n{tail}", flush=True)
        return failed_seed(seed, run_dir, wall, shlex.join(cmd[1:]), code, text)
    raise AssertionError("unreachable")


def failed_seed(
    seed: int, run_dir: Path, wall: float, cmd: str, code: int, log: str
) -> dict[str, Any]:
    """A seed whose run did not finish (e.g. diverged to NaN and starved): it counts
    as a miss, with the last evaluation it logged."""
    last_eval = math.nan
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            last_eval = row.get("eval/mean_return", last_eval)
    errors = [line for line in log.splitlines() if line.startswith("error:")]
    return {
        "seed": seed,
        "run_dir": str(run_dir.relative_to(ROOT) if run_dir.is_relative_to(ROOT) else run_dir),
        "failed": errors[-1] if errors else f"exit {code}",
        "final_mean": math.nan,
        "final_std": math.nan,
        "last_logged_eval": last_eval,
        "wall_seconds": wall,
        "command": cmd,
    }


def seed_result(seed: int, run_dir: Path, wall: float | None, cmd: str | None) -> dict[str, Any]:
    """One seed's entry of the results file, from its report.json."""
    report = json.loads((run_dir / "report.json").read_text())
    final = report["evaluations"][-1]
    lags = []
    with open(run_dir / "metrics.jsonl") as rows:
        for line in rows:
            row = json.loads(line)
            if "charts/policy_lag_mean" in row:
                lags.append(row["charts/policy_lag_mean"])
    return {
        "seed": seed,
        "run_dir": str(run_dir.relative_to(ROOT) if run_dir.is_relative_to(ROOT) else run_dir),
        "final_mean": final["mean_return"],
        "final_std": final["std_return"],
        "final_env_steps": final["env_steps"],
        "best_eval_mean": max(e["mean_return"] for e in report["evaluations"]),
        "learner_wall_seconds": report["wall_seconds"],
        "wall_seconds": wall if wall is not None else report["wall_seconds"],
        "updates": report["updates_completed"],
        "policy_lag_mean": statistics.fmean(lags) if lags else math.nan,
        "dead_actors": len(report.get("dead_actors", [])),
        "command": cmd,
    }


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Mean and std over seeds of the final evaluation means; pass/fail on the target."""
    means = [s["final_mean"] for s in result["seeds"] if not s.get("failed")]
    walls = [s["wall_seconds"] for s in result["seeds"]]
    failed = len(result["seeds"]) - len(means)
    target = TARGETS.get(result["env"])
    summary: dict[str, Any] = {
        "seeds_done": len(means),
        "seeds_failed": failed,
        "mean": statistics.fmean(means) if means else math.nan,
        "std": statistics.pstdev(means) if len(means) > 1 else 0.0,
        "min": min(means) if means else math.nan,
        "wall_mean_seconds": statistics.fmean(walls) if walls else math.nan,
    }
    if target is not None and means:
        summary["target"] = target.threshold
        summary["passes"] = summary["mean"] >= target.threshold and not failed
        summary["gap"] = summary["mean"] - target.threshold
    return summary


def fmt_wall(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "–"
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def markdown_row(result: dict[str, Any]) -> str:
    """``| env | variant | steps | final eval | per seed | wall | target | reference |``."""
    s = result["summary"]
    target = TARGETS.get(result["env"])
    per_seed = ", ".join(
        "failed" if x.get("failed") else f"{x['final_mean']:.1f}" for x in result["seeds"]
    )
    failed = s.get("seeds_failed", 0)
    count = f"n={s['seeds_done']}" + (f", {failed} failed" if failed else "")
    verdict = ""
    if "passes" in s:
        verdict = "✅" if s["passes"] else f"❌ ({s['gap']:+.1f})"
    steps = f"{result['total_env_steps'] / 1000:g}k"
    return (
        f"| {result['env']} | {result['variant']} | {steps} | "
        f"{s['mean']:.1f} ± {s['std']:.1f} ({count}) | {per_seed} | "
        f"{fmt_wall(s['wall_mean_seconds'])} | "
        f"{'≥ ' + format(target.threshold, 'g') if target else '–'} {verdict} | "
        f"{target.reference if target else '–'} |"
    )


TABLE_HEADER = (
    "| env | variant | steps | final eval mean ± std over seeds | per-seed means | "
    "wall / run | target | reference |\n|---|---|---|---|---|---|---|---|"
)


def print_table() -> int:
    files = sorted(RESULTS.glob("quality-*.json"))
    results = [json.loads(p.read_text()) for p in files]
    env_order = list(TARGETS)
    results.sort(
        key=lambda r: (
            env_order.index(r["env"]) if r["env"] in env_order else 99,
            VARIANT_ORDER.index(r["variant"]) if r["variant"] in VARIANT_ORDER else 99,
        )
    )
    print(TABLE_HEADER)
    for result in results:
        print(markdown_row(result))
    print()
    by_key = {(r["env"], r["variant"]): r["summary"] for r in results}
    for (env, variant), summary in by_key.items():
        gae = by_key.get((env, "gae-bc1"))
        if variant == "gae-bc1" or gae is None or variant.endswith("quick"):
            continue
        # (row - gae) / |gae|: negative means worse than GAE, also for negative returns.
        gap = (summary["mean"] - gae["mean"]) / abs(gae["mean"])
        print(
            f"- {env} {variant} vs gae-bc1: {summary['mean']:.1f} vs {gae['mean']:.1f} "
            f"({gap:+.1%}; {'within' if abs(gap) <= 0.10 else 'outside'} 10%)"
        )
    print()
    for result in results:
        print(f"- {result['env']} {result['variant']}: `{result['public_command']}`")
    return 0


def stored_runs(result: dict[str, Any]) -> list[Path]:
    """The run directories of a row's seeds that still hold their metrics."""
    dirs = (ROOT / seed["run_dir"] for seed in result["seeds"])
    return [d for d in dirs if (d / "metrics.jsonl").is_file()]


def draw(
    dirs: list[Path],
    labels: list[str],
    references: list[tuple[float, str]],
    out: Path,
    title: str,
    ylim: tuple[float, float] | None = None,
) -> None:
    """Draw ``dirs`` grouped by ``labels`` into ``out`` with ``zmq-rl plot``'s
    :func:`plot_runs` and print the equivalent ``zmq-rl plot`` command."""
    from zmq_rl.cli.plot import plot_runs

    plot_runs(dirs, out, labels=labels, reference=references, title=title, ylim=ylim)
    words = [str(d.relative_to(ROOT)) for d in dirs]
    words += [f"--label={label}" for label in labels]
    words += [f"--reference={value:g}={text}" for value, text in references]
    if ylim is not None:
        words.append(f"--ylim={ylim[0]:g},{ylim[1]:g}")
    print(f"{out.relative_to(ROOT)}: zmq-rl plot {shlex.join(words)} --out {out.name}")


def plot(result: dict[str, Any], out: Path) -> None:
    from zmq_rl.cli.plot import plot_runs

    target = TARGETS.get(result["env"])
    dirs = stored_runs(result)
    if not dirs:
        return
    plot_runs(
        dirs,
        out,
        labels=[f"{result['env']} {result['variant']}"] * len(dirs),
        reference=target.threshold if target else None,
        reference_label=f"target {target.threshold:g}" if target else "",
        title=f"{result['env']} {result['variant']}: "
        + (f"{len(dirs)} seeds (mean, min-max band)" if len(dirs) > 1 else "1 seed"),
    )


def overlay(envs: list[str]) -> int:
    """One PNG per env with its three variants overlaid (mean over seeds with a
    min-max band) and the target and the zoo's score as reference lines; prints the
    equivalent ``zmq-rl plot`` command of each."""
    for env in envs:
        target = TARGETS[env]
        dirs: list[Path] = []
        labels: list[str] = []
        for variant in VARIANT_ORDER[:3]:
            path = RESULTS / f"quality-{env}-{variant}.json"
            if not path.is_file():
                continue
            found = stored_runs(json.loads(path.read_text()))
            dirs += found
            labels += [variant] * len(found)
        if not dirs:
            print(f"{env}: no stored runs")
            continue
        references = [
            (target.threshold, f"target {target.threshold:g}"),
            (target.reference_value, target.reference),
        ]
        draw(dirs, labels, references, IMAGES / f"quality-{env}.png", f"{env}: mean over seeds")
    return 0


LAG_ENVS = ("LunarLander-v3", "LunarLanderContinuous-v3")
SHIPPED_LABELS = ("GAE (no correction)", "GAE on current values", "V-trace + ppo")
PRE_FIX = "c4c7381"  # the commit that standardises V-trace's advantages before the weight
LAG_YLIM = (-400.0, 320.0)  # LunarLander's returns; early evaluations reach -3000
LAG_VARIANT = re.compile(r"^(?:gae|vtrace)-bc\d+(?:-lag-.+|-ns\d+)?$")


@functools.cache
def preset_num_steps(env: str) -> int:
    """The rollout length of ``env``'s shipped preset as the tree has it now (read
    once per env: every row's label and comparison asks)."""
    learner = tomllib.loads(preset_path(env).read_text())["learner"]
    return int(learner.get("num_steps", LearnerConfig().num_steps))


def rollout_steps(result: dict[str, Any]) -> int:
    """The rollout length a stored row ran with: its ``--num-steps`` flag, else its
    ``num_steps`` field (rows measured before the preset changed), else the preset's."""
    extra = list(result.get("extra", []))
    if "--num-steps" in extra:
        return int(extra[extra.index("--num-steps") + 1])
    return int(result.get("num_steps") or preset_num_steps(result["env"]))


def unlabelled_flags(extra: list[str]) -> list[str]:
    """A row's extra ``zmq-rl run`` flags (with their values) that :func:`lag_label`
    does not already name: ``--objective``, ``--recompute-values``, ``--num-steps``
    and ``--eval-every`` are named or irrelevant, the rest is shown as given."""
    out: list[str] = []
    skip = False
    for flag in extra:
        if skip:
            skip = False
        elif flag in ("--objective", "--num-steps", "--eval-every"):
            skip = True
        elif flag != "--recompute-values":
            out.append(flag)
    return out


def lag_label(result: dict[str, Any]) -> str:
    """What corrects the lag in a row: ``GAE (no correction)``, ``GAE on current
    values`` (``--recompute-values``) or ``V-trace + OBJ`` (the ``--objective`` among
    the row's extra flags; ``ppo`` when none), the rollout length where it is not the
    preset's (:func:`rollout_steps`), its other extra flags, the row's ``experiment``
    (code that ran on a copy of the tree and is not in it), and ``(before PRE_FIX)``
    for V-trace rows measured before V-trace's advantages were standardised ahead of
    their weight (the row's ``note`` says so)."""
    extra = list(result.get("extra", []))
    if not result["use_vtrace"]:
        label = "GAE on current values" if "--recompute-values" in extra else "GAE (no correction)"
    else:
        objective = extra[extra.index("--objective") + 1] if "--objective" in extra else "ppo"
        label = f"V-trace + {objective}"
    steps = rollout_steps(result)
    if steps != preset_num_steps(result["env"]):
        label += f", {steps}-step rollouts"
    other = unlabelled_flags(extra)
    if other:
        label += ", " + " ".join(other)
    if result.get("experiment"):
        label += f" ({result['experiment']})"
    if PRE_FIX in result.get("note", ""):
        label += f" (before {PRE_FIX})"
    return label


def lag_rows(env: str) -> list[dict[str, Any]]:
    """The stored rows of ``env`` that belong to the lag table: the plain variants
    (``gae-bcN``, ``vtrace-bcN``) and those tagged ``lag-*``, ordered by broadcast
    interval, then GAE before V-trace, then by name."""
    rows = []
    for path in RESULTS.glob(f"quality-{env}-*.json"):
        result = json.loads(path.read_text())
        if (
            LAG_VARIANT.match(result["variant"])
            and result.get("total_env_steps") == TARGETS[env].steps
        ):
            rows.append(result)
    rows.sort(key=lambda r: (r["broadcast_every"], r["use_vtrace"], lag_label(r), r["variant"]))
    return rows


def no_lag_rows(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """GAE at broadcast every 1 per rollout length among ``rows``: the row of that
    length with the most seeds (a lagged row is compared with the no-lag run of its
    own rollout length)."""
    best: dict[int, dict[str, Any]] = {}
    for r in rows:
        extra = r.get("extra", [])
        if (
            r["use_vtrace"]
            or r["broadcast_every"] != 1
            or "--recompute-values" in extra
            or unlabelled_flags(extra)
        ):
            continue
        n = rollout_steps(r)
        if n not in best or r["summary"]["seeds_done"] > best[n]["summary"]["seeds_done"]:
            best[n] = r
    return best


def lag_table(envs: list[str], plot: bool) -> int:
    """Print issue 14's lag table for ``envs`` (final return mean ± std, worst seed,
    seeds below the target, distance to GAE at broadcast every update) and, with
    ``plot``, draw ``docs/img/lag-<env>-bc<N>.png`` for N in 4 and 8 via ``zmq-rl
    plot``: the stored runs at 1 and N without a correction and with V-trace + ppo as
    the tree now has it (the table keeps the other rows), and the final return of
    GAE without lag as a reference line."""
    for env in envs:
        target = TARGETS[env]
        rows = lag_rows(env)
        bases = no_lag_rows(rows)
        base = bases.get(preset_num_steps(env))
        if base is None:
            print(f"{env}: no gae-bc1 row to compare with")
            continue
        base_mean = base["summary"]["mean"]
        against = ", ".join(
            f"{n}-step rollouts {r['summary']['mean']:.1f}" for n, r in sorted(bases.items())
        )
        print(
            f"\n{env}, {target.steps:,} steps; vs no lag: against GAE at broadcast every 1 "
            f"with the same rollout length ({against})\n"
        )
        print(
            "| broadcast every | correction | final, mean ± std | worst seed "
            f"| seeds < {target.threshold:g} | vs no lag | per-seed finals | variant |"
        )
        print("|---|---|---|---:|---:|---:|---|---|")
        for r in rows:
            finals = [s["final_mean"] for s in r["seeds"] if not s.get("failed")]
            if not finals:
                continue
            s = r["summary"]
            below = sum(v < target.threshold for v in finals)
            own = bases.get(rollout_steps(r), base)["summary"]["mean"]
            gap = (s["mean"] - own) / abs(own)
            print(
                f"| {r['broadcast_every']} | {lag_label(r)} | {s['mean']:.1f} ± {s['std']:.1f} "
                f"(n={len(finals)}) | {min(finals):.1f} | {below} | {gap:+.1%} | "
                + ", ".join(f"{v:.1f}" for v in finals)
                + f" | `{r['variant']}` |"
            )
        print()
        for r in rows:
            print(f"- `{r['variant']}`: `{r['public_command']}`")
        if not plot:
            continue
        for every in (4, 8):
            dirs: list[Path] = []
            labels: list[str] = []
            for r in rows:
                # The curves show the correction as shipped: no rows of other
                # objectives or from before the V-trace fix (the table has them).
                label = lag_label(r)
                if r["broadcast_every"] not in (1, every) or label not in SHIPPED_LABELS:
                    continue
                found = stored_runs(r)
                dirs += found
                labels += [f"bc{r['broadcast_every']} {label}"] * len(found)
            if not any(label.startswith(f"bc{every}") for label in labels):
                continue
            references = [
                (target.threshold, f"target {target.threshold:g}"),
                (base_mean, f"GAE without lag: final {base_mean:.1f} (n={len(base['seeds'])})"),
            ]
            print()
            draw(
                dirs,
                labels,
                references,
                IMAGES / f"lag-{env}-bc{every}.png",
                f"{env}: broadcast every {every} vs every update (mean over seeds)",
                ylim=LAG_YLIM,
            )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", help="a shipped preset name, e.g. LunarLander-v3")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--vtrace", action="store_true", help="V-trace targets instead of GAE")
    parser.add_argument("--broadcast-every", type=int, default=1)
    parser.add_argument(
        "--total-env-steps", type=int, default=None, help="default: the target's step budget"
    )
    parser.add_argument("--eval-every", type=int, default=None, help="default: the preset's")
    parser.add_argument("--timeout", type=float, default=4 * 3600, help="seconds per seed")
    parser.add_argument("--skip-done", action="store_true", help="reuse seeds with a report")
    parser.add_argument(
        "--add-seeds",
        action="store_true",
        help="add these seeds to the stored row (replacing any with the same number) "
        "instead of starting the row afresh",
    )
    parser.add_argument(
        "--plot",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="draw the seeds' curves into docs/img/quality-<env>-<variant>.png",
    )
    parser.add_argument("--tag", default="", help="suffix for the variant name (tuning runs)")
    parser.add_argument(
        "--code",
        type=Path,
        default=ROOT,
        help="folder whose zmq_rl package the runs import (default: this checkout); a "
        "copy keeps hour-long rows immune to edits of the working tree",
    )
    parser.add_argument("--table", action="store_true", help="print every stored row; run nothing")
    parser.add_argument(
        "--overlay",
        action="store_true",
        help="draw docs/img/quality-<env>.png, the variants of --env (default: every env) "
        "overlaid with the target and the zoo's score; run nothing",
    )
    parser.add_argument(
        "--lag-table",
        action="store_true",
        help="print the lag table (issue 14) of --env (default: both LunarLanders) and, "
        "unless --no-plot, draw docs/img/lag-<env>-bc<N>.png; run nothing",
    )
    add_common_flags(parser, smoke=False)
    parser.add_argument("extra", nargs="*", help="after --: more zmq-rl run flags")
    args = parser.parse_args(argv)
    if args.table:
        return print_table()
    if args.overlay:
        return overlay([args.env] if args.env else list(TARGETS))
    if args.lag_table:
        return lag_table([args.env] if args.env else list(LAG_ENVS), args.plot)
    if not args.env:
        parser.error("--env is required (or --table)")
    target = TARGETS.get(args.env)
    if args.total_env_steps is None:
        if target is None:
            parser.error(f"--total-env-steps is required for {args.env} (no target known)")
        args.total_env_steps = target.steps
    variant = variant_name(args.vtrace, args.broadcast_every) + (f"-{args.tag}" if args.tag else "")
    out = Path(args.out) if args.out else RESULTS / f"quality-{args.env}-{variant}.json"
    result: dict[str, Any] = {
        "env": args.env,
        "variant": variant,
        "use_vtrace": args.vtrace,
        "broadcast_every": args.broadcast_every,
        "total_env_steps": args.total_env_steps,
        "public_command": public_command(args),
        "extra": list(args.extra),
        "seeds": [],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.add_seeds and out.is_file():
        stored = json.loads(out.read_text())
        result["seeds"] = [s for s in stored["seeds"] if s["seed"] not in args.seeds]
        args.seeds = sorted({s["seed"] for s in result["seeds"]} | set(args.seeds))
        result["public_command"] = public_command(args)
        if stored.get("note"):
            result["note"] = stored["note"]
        args.seeds = [s for s in args.seeds if s not in {e["seed"] for e in result["seeds"]}]
    for seed in args.seeds:
        run_dir = runs_root("quality", args) / f"{args.env}-{variant}" / f"seed{seed}"
        entry = run_seed(args, seed, run_dir)
        result["seeds"].append(entry)
        result["seeds"].sort(key=lambda e: e["seed"])
        result["summary"] = summarize(result)
        out.write_text(json.dumps(result, indent=2) + "\n")
        if entry.get("failed"):
            continue
        print(
            f"seed {seed}: final eval {entry['final_mean']:.1f} ± {entry['final_std']:.1f} "
            f"after {entry['final_env_steps']:,} steps, wall {fmt_wall(entry['wall_seconds'])}",
            flush=True,
        )
    if args.plot:
        png = figure_path(f"quality-{args.env}-{variant}", args)
        plot(result, png)
        result["plot"] = str(png.relative_to(ROOT) if png.is_relative_to(ROOT) else png)
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"curve: {png}")
    print(f"results: {out}")
    print(TABLE_HEADER)
    print(markdown_row(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
