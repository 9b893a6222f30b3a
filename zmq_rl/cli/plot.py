"""Learning curves from run directories (``zmq-rl plot``, and the end of ``zmq-rl run``).

Reads ``metrics.jsonl`` (a row per update, written by the learner) for the
training return, and ``report.json``'s evaluations (mean ± std, including the
final one) for the evaluation points, falling back to the evaluation rows of the
metrics when there is no report (an interrupted run). Draws with matplotlib's Agg
canvas directly: no pyplot, no display needed.

A resumed run (``--resume``) is one curve: the updates a resumed learner redid
(after the checkpoint it resumed from) replace the first learner's rows of them,
and wall time (``--x wall``) is cumulative over the learner sessions (each
session's ``wall_seconds`` restarts at 0; the time of the first session is added
to the second's, and so on).

Several runs that share a label (``labels=``; on the command line ``--label`` or
``--group parent``) are drawn as one curve: the mean over the runs with a min-max
(or ± std) band, for the training return and for the evaluations, where every run
of the group has points (the runs' x values in that range, each run interpolated
linearly between its own points); each run is also drawn whole, thin (training)
or as small markers (evaluations), so a longer run is not cut to the shortest and
evaluations at different steps are all shown. A run alone under its label is
drawn as before: its training line and its evaluations with ± std error bars.
``reference=`` adds horizontal reference lines (a published score, a target).
A group with no points yet is named in a note on the axes (no empty legend entry).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..run.common import CliFailure

__all__ = [
    "BANDS",
    "CURVE_NAME",
    "RunCurve",
    "add_plot_flags",
    "curve_figure",
    "main",
    "parse_reference",
    "plot_from_args",
    "plot_runs",
    "read_run",
    "run_labels",
]

CURVE_NAME = "learning_curve.png"
X_AXES = {"steps": "env steps", "wall": "learner wall time (s)"}
"""``--x``: what the horizontal axis is, and its label."""


class RunCurve:
    """The points of one run: training return and evaluations against env steps."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.label = run_dir.name or str(run_dir)
        self.train_steps: list[float] = []
        self.train_wall: list[float] = []
        self.train_return: list[float] = []
        self.eval_steps: list[float] = []
        self.eval_wall: list[float] = []
        self.eval_mean: list[float] = []
        self.eval_std: list[float] = []
        self.env_id = ""
        self.target_return = math.inf


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut short by a killed run
    return rows


def _sessions(
    rows: list[dict[str, Any]],
) -> tuple[list[tuple[dict[str, Any], float]], list[tuple[int, float]]]:
    """The rows of ``metrics.jsonl`` that describe the run, each with its cumulative
    wall time, and the learner sessions as ``(first update, wall offset)``.

    A session starts where an update row's ``update`` does not grow or its
    ``wall_seconds`` falls (a ``--resume``: the resumed learner's clock starts at 0
    and it redoes the updates after its checkpoint). The earlier rows of updates a
    later session redid are dropped (update and evaluation rows alike); each
    session's wall times are shifted by the wall time of the sessions before it. An
    in-loop evaluation's row comes just before its update's row: one that a new
    session's first update row follows, of that update or later and not later in
    wall time, is the new session's.
    """
    kept: list[tuple[dict[str, Any], float]] = []
    sessions: list[tuple[int, float]] = []
    waiting: list[dict[str, Any]] = []  # evaluation rows since the last update row
    offset = session_wall = 0.0
    last_update: int | None = None
    last_wall = math.nan

    def update_of(row: dict[str, Any]) -> int:
        return int(row.get("update", 0))

    def wall_of(row: dict[str, Any]) -> float:
        return float(row.get("wall_seconds", math.nan))

    for row in rows:
        if "env_steps" not in row:
            continue
        if not _is_update_row(row):  # an evaluation row
            waiting.append(row)
            continue
        update, wall = update_of(row), wall_of(row)
        ahead: list[dict[str, Any]] = []
        if last_update is None or update <= last_update or wall < last_wall:
            if last_update is not None:
                ahead = [r for r in waiting if update_of(r) >= update and wall_of(r) <= wall]
                kept.extend((r, offset + wall_of(r)) for r in waiting if r not in ahead)
                waiting = []
                offset += session_wall
                kept = [(r, w) for r, w in kept if update_of(r) < update]  # redone
            sessions.append((update, offset))
            session_wall = 0.0
        for r in [*waiting, *ahead, row]:
            if math.isfinite(wall_of(r)):
                session_wall = max(session_wall, wall_of(r))
            kept.append((r, offset + wall_of(r)))
        waiting = []
        last_update, last_wall = update, wall
    kept.extend((r, offset + wall_of(r)) for r in waiting)
    return kept, sessions


def _is_update_row(row: dict[str, Any]) -> bool:
    """Whether a metrics.jsonl row is an update's (not an evaluation's): it counts the
    episodes (``charts/mean_return`` comes only once one has ended)."""
    return "charts/episodes" in row or "charts/mean_return" in row


def _session_offset(sessions: list[tuple[int, float]], update: Any) -> float:
    """The wall offset of the session that ran ``update`` (the last one that started
    at or before it; 0 when unknown)."""
    if update is None:
        return 0.0
    return max((o for first, o in sessions if first <= int(update)), default=0.0)


def read_run(run_dir: str | Path) -> RunCurve:
    """Read one run directory's metrics (and report and config, when present); a
    resumed run's redone updates and wall times are merged (:func:`_sessions`)."""
    run_dir = Path(run_dir)
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        raise CliFailure(f"{run_dir}: no metrics.jsonl (is this a run directory?)")
    curve = RunCurve(run_dir)
    rows, sessions = _sessions(_read_jsonl(metrics))
    for row, wall in rows:
        if "charts/mean_return" in row:
            curve.train_steps.append(float(row["env_steps"]))
            curve.train_wall.append(wall)
            curve.train_return.append(float(row["charts/mean_return"]))
    report_path = run_dir / "report.json"
    evaluations: list[dict[str, Any]] = []
    if report_path.is_file():
        try:
            evaluations = json.loads(report_path.read_text()).get("evaluations", [])
        except (json.JSONDecodeError, AttributeError):
            evaluations = []
    if evaluations:
        for ev in evaluations:
            offset = _session_offset(sessions, ev.get("updates"))
            curve.eval_steps.append(float(ev["env_steps"]))
            curve.eval_wall.append(offset + float(ev.get("wall_seconds", math.nan)))
            curve.eval_mean.append(float(ev["mean_return"]))
            curve.eval_std.append(float(ev.get("std_return", 0.0)))
    else:
        for row, wall in rows:
            if "eval/mean_return" in row:
                curve.eval_steps.append(float(row["env_steps"]))
                curve.eval_wall.append(wall)
                curve.eval_mean.append(float(row["eval/mean_return"]))
                curve.eval_std.append(float(row.get("eval/std_return", 0.0)))
    config_path = run_dir / "config.toml"
    if config_path.is_file():
        try:
            learner = tomllib.loads(config_path.read_text()).get("learner", {})
            curve.env_id = str(learner.get("env_id", ""))
            curve.target_return = float(learner.get("target_return", math.inf))
        except (tomllib.TOMLDecodeError, TypeError, ValueError):
            pass
    return curve


def parse_reference(text: str) -> tuple[float, str]:
    """``"242"`` or ``"242=zoo PPO @ 1M"`` -> (value, label)."""
    value, _, label = text.partition("=")
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"reference {text!r}: expected VALUE or VALUE=LABEL") from None
    if not math.isfinite(number):
        raise ValueError(f"reference {text!r}: the value must be finite")
    return number, label.strip() or f"reference {number:g}"


def parse_ylim(text: str) -> tuple[float | None, float | None]:
    """``"-400,300"``, ``"-400,"`` or ``",300"`` -> (bottom, top); an empty side stays
    automatic."""
    low, sep, high = text.partition(",")
    if not sep:
        raise ValueError(f"ylim {text!r}: expected LOW,HIGH (either may be empty)")
    try:
        bounds = tuple(float(part) if part.strip() else None for part in (low, high))
    except ValueError:
        raise ValueError(f"ylim {text!r}: LOW and HIGH must be numbers") from None
    bottom, top = bounds
    if any(b is not None and not math.isfinite(b) for b in bounds):
        raise ValueError(f"ylim {text!r}: the bounds must be finite")
    if bottom is not None and top is not None and bottom >= top:
        raise ValueError(f"ylim {text!r}: LOW must be below HIGH")
    return bottom, top


def _common_grid(series: list[tuple[list[float], list[float]]]) -> list[float]:
    """Every x point of every series in the range all of them cover (from the
    latest first point to the earliest last one), sorted, once each; empty when
    the series do not overlap."""
    usable = [sorted(xs) for xs, _ in series if xs]
    if not usable:
        return []
    end = min(xs[-1] for xs in usable)
    start = max(xs[0] for xs in usable)
    return sorted({x for xs in usable for x in xs if start <= x <= end})


def _sorted(xs: list[float], values: list[float]) -> tuple[list[float], list[float]]:
    """The points ordered by x (``np.interp`` needs that)."""
    pairs = sorted(zip(xs, values, strict=True), key=lambda p: p[0])
    return [x for x, _ in pairs], [v for _, v in pairs]


def _aggregate(
    series: list[tuple[list[float], list[float]]], band: str
) -> tuple[Any, Any, Any, Any]:
    """(x, mean, low, high) over ``series`` interpolated onto their common grid
    (:func:`_common_grid`; empty arrays when they do not overlap)."""
    import numpy as np

    series = [_sorted(xs, values) for xs, values in series if xs]
    grid = np.asarray(_common_grid(series), dtype=np.float64)
    if not len(grid):
        return grid, grid, grid, grid
    ys = np.stack([np.interp(grid, xs, values) for xs, values in series])
    mean = ys.mean(axis=0)
    if band == "std":
        std = ys.std(axis=0)
        return grid, mean, mean - std, mean + std
    return grid, mean, ys.min(axis=0), ys.max(axis=0)


def _group(curves: list[RunCurve], labels: Sequence[str] | None) -> dict[str, list[RunCurve]]:
    """Runs by label, in order of first appearance (each run its own group without labels)."""
    if labels is None:
        return {f"{i}:{c.label}": [c] for i, c in enumerate(curves)}
    if len(labels) != len(curves):
        raise CliFailure(f"{len(labels)} labels for {len(curves)} runs: give one per run")
    groups: dict[str, list[RunCurve]] = {}
    for label, curve in zip(labels, curves, strict=True):
        groups.setdefault(label, []).append(curve)
    return groups


BANDS = ("minmax", "std")


def plot_runs(
    run_dirs: Sequence[str | Path],
    out: str | Path,
    *,
    labels: Sequence[str] | None = None,
    band: str = "minmax",
    reference: float | Sequence[float | tuple[float, str]] | None = None,
    reference_label: str = "",
    title: str | None = None,
    x: str = "steps",
    ylim: tuple[float | None, float | None] | None = None,
) -> Path:
    """Draw the learning curves of ``run_dirs`` into the PNG ``out``; return its path.
    The options are those of :func:`curve_figure`."""
    fig = curve_figure(
        run_dirs,
        labels=labels,
        band=band,
        reference=reference,
        reference_label=reference_label,
        title=title,
        x=x,
        ylim=ylim,
    )
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    return out


def curve_figure(
    run_dirs: Sequence[str | Path],
    *,
    labels: Sequence[str] | None = None,
    band: str = "minmax",
    reference: float | Sequence[float | tuple[float, str]] | None = None,
    reference_label: str = "",
    title: str | None = None,
    x: str = "steps",
    ylim: tuple[float | None, float | None] | None = None,
) -> Any:
    """The matplotlib ``Figure`` of the learning curves of ``run_dirs``.

    ``labels`` (one per run) groups runs: those sharing a label become one mean
    curve with a ``band`` (``"minmax"`` or ``"std"``) for the training return and
    the evaluations where all of them have points, and each run of the group is
    drawn whole beside it (see the module docstring). ``reference`` draws
    horizontal lines: a value (labelled
    ``reference_label``), or a list of values or ``(value, label)`` pairs. ``x`` is
    the horizontal axis: ``"steps"`` (env steps) or ``"wall"`` (the learner's wall
    seconds, ``wall_seconds`` of the metrics rows and evaluations, cumulative over
    a resumed run's sessions). ``ylim`` fixes
    the vertical range (``None`` on a side keeps it automatic), for curves whose
    early evaluations would squash the rest.
    """
    from matplotlib.figure import Figure

    if band not in BANDS:
        raise ValueError(f"band must be one of {BANDS}, got {band!r}")
    if x not in X_AXES:
        raise ValueError(f"x must be one of {tuple(X_AXES)}, got {x!r}")
    x_label = X_AXES[x]
    curves = [read_run(d) for d in run_dirs]
    if x == "wall":
        for c in curves:
            c.train_steps, c.eval_steps = c.train_wall, c.eval_wall
    groups = _group(curves, labels)
    fig = Figure(figsize=(8, 4.5), dpi=120, layout="constrained")
    ax = fig.add_subplot()
    several = len(groups) > 1
    band_name = "min-max" if band == "minmax" else "± std"
    means: list[float] = []  # the groups' mean curves: a band may not stretch the y axis
    notes: list[str] = []  # groups with nothing to draw: said on the axes, not in the legend
    for i, (key, members) in enumerate(groups.items()):
        color = f"C{i % 10}"
        name = key if labels is not None else members[0].label
        prefix = f"{name}: " if several else ""
        if len(members) == 1:
            _draw_single(ax, members[0], color, prefix)
            continue
        n = len(members)
        train = [(c.train_steps, c.train_return) for c in members if c.train_steps]
        for k, (xs, ys) in enumerate(train):  # each run whole, however long
            each = {"label": f"{prefix}training return, each run"} if k == 0 else {}
            ax.plot(xs, ys, color=color, lw=0.6, alpha=0.35, **each)
        x, mean, low, high = _aggregate(train, band)
        if len(x):
            means.extend(mean)
            ax.plot(
                x,
                mean,
                color=color,
                lw=1.2,
                alpha=0.8,
                label=f"{prefix}training return (mean of {len(train)} runs where all have points)",
            )
            ax.fill_between(x, low, high, color=color, alpha=0.12, lw=0)
        evals = [(c.eval_steps, c.eval_mean) for c in members if c.eval_steps]
        for k, (xs, ys) in enumerate(evals):  # every evaluation, at its own step
            each = {"label": f"{prefix}evaluations, each run"} if k == 0 else {}
            ax.plot(xs, ys, color=color, ls="none", marker=".", ms=5, alpha=0.5, **each)
        x, mean, low, high = _aggregate(evals, band)
        if len(x):
            means.extend(mean)
            ax.plot(
                x,
                mean,
                color=color,
                lw=2,
                marker="o",
                ms=3,
                label=f"{prefix}evaluation (mean of {len(evals)} runs, interpolated, {band_name})",
            )
            ax.fill_between(x, low, high, color=color, alpha=0.25, lw=0)
        if not train and not evals:
            notes.append(f"{prefix}{n} runs, no points yet")
    lines: list[tuple[float, str]] = []
    if reference is not None:
        items = [reference] if isinstance(reference, (int, float)) else list(reference)
        for item in items:
            if isinstance(item, tuple):
                lines.append((float(item[0]), item[1]))
            else:
                lines.append((float(item), reference_label or f"reference {float(item):g}"))
    for k, (value, label) in enumerate(lines):
        ax.axhline(value, color="k", ls=(":", "--", "-.")[k % 3], lw=1.2, label=label)
    targets = {c.target_return for c in curves if math.isfinite(c.target_return)}
    for target in sorted(targets - {v for v, _ in lines}):
        ax.axhline(target, color="0.5", ls="--", lw=1, label=f"target return {target:g}")
    env_ids = sorted({c.env_id for c in curves if c.env_id})
    if title is None:
        title = "learning curve" + (f": {', '.join(env_ids)}" if env_ids else "")
        if not several:
            first = next(iter(groups.values()))
            title += f" ({first[0].label})" if len(first) == 1 else f" ({len(first)} runs)"
    if means:
        # One seed's early outlier (a -2000 first evaluation) would squash every curve
        # into a line: clip the axis a little below the lowest *mean* point.
        low_mean, top = min(means), ax.get_ylim()[1]
        floor = low_mean - 0.15 * (max(top, max(means)) - low_mean)
        if ax.get_ylim()[0] < floor:
            ax.set_ylim(bottom=floor)
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.set_title(title)
    ax.set_xlabel(x_label)
    ax.set_ylabel("episode return")
    ax.grid(True, alpha=0.3)
    if notes:
        ax.text(0.01, 0.01, "\n".join(notes), transform=ax.transAxes, fontsize="small")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize="small")
    return fig


def _draw_single(ax: Any, curve: RunCurve, color: str, prefix: str) -> None:
    """One run: its training line and its evaluations with ± std error bars."""
    if curve.train_steps:
        ax.plot(
            curve.train_steps,
            curve.train_return,
            color=color,
            lw=1.5,
            label=f"{prefix}training (mean return, last 100 episodes)",
        )
    if curve.eval_steps:
        ax.errorbar(
            curve.eval_steps,
            curve.eval_mean,
            yerr=curve.eval_std,
            color=color,
            fmt="o",
            ms=4,
            capsize=3,
            alpha=0.9,
            label=f"{prefix}evaluation (mean ± std)",
        )


def run_labels(
    run_dirs: Sequence[Path], labels: Sequence[str] | None, group: str
) -> list[str] | None:
    """Labels for ``zmq-rl plot``: ``--label`` once (one group of every run) or once per
    run; ``--group parent`` labels each run by its parent folder's name; else None."""
    if labels:
        if group != "none":
            raise CliFailure("give --label or --group, not both")
        if len(labels) == 1:
            return [labels[0]] * len(run_dirs)
        if len(labels) != len(run_dirs):
            raise CliFailure(
                f"{len(labels)} --label values for {len(run_dirs)} runs: give one label "
                "(all runs in one group) or one per run"
            )
        return list(labels)
    if group == "parent":
        return [Path(d).resolve().parent.name or str(d) for d in run_dirs]
    return None


# -- command line ---------------------------------------------------------------------


def add_plot_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of ``zmq-rl plot`` (run dirs, --out, --label, --group, --band, --x,
    --reference, --ylim)."""
    parser.add_argument("runs", metavar="RUN_DIR", nargs="+", type=Path, help="run directories")
    parser.add_argument(
        "--out",
        metavar="PNG",
        type=Path,
        default=None,
        help="output image (default: RUN_DIR/learning_curve.png for one run, "
        "./learning_curve.png for several)",
    )
    parser.add_argument(
        "--label",
        metavar="NAME",
        action="append",
        default=None,
        help="group runs under a label, drawn as one mean curve with a band where all "
        "of them have points, beside each run drawn whole and faint: once for all runs, "
        "or once per run in order (runs sharing a label form a group)",
    )
    parser.add_argument(
        "--group",
        choices=("none", "parent"),
        default="none",
        help="'parent': group runs by their parent folder (runs/lunar/seed0, seed1 -> lunar)",
    )
    parser.add_argument(
        "--band",
        choices=BANDS,
        default="minmax",
        help="the band around a group's mean: min-max over its runs, or ± one std",
    )
    parser.add_argument(
        "--x",
        choices=tuple(X_AXES),
        default="steps",
        help="horizontal axis: env steps, or the learner's wall time in seconds "
        "(cumulative over the sessions of a resumed run)",
    )
    parser.add_argument(
        "--reference",
        metavar="VALUE[=LABEL]",
        action="append",
        default=None,
        type=_reference_arg,
        help="draw a horizontal reference line, e.g. --reference '242=zoo PPO @ 1M' (repeatable)",
    )
    parser.add_argument(
        "--ylim",
        metavar="LOW,HIGH",
        type=_ylim_arg,
        default=None,
        help="vertical range, e.g. --ylim=-400,300 (a side left empty stays automatic; "
        "default: automatic, cut a little below the lowest mean point)",
    )


def _ylim_arg(text: str) -> tuple[float | None, float | None]:
    try:
        return parse_ylim(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _reference_arg(text: str) -> tuple[float, str]:
    try:
        return parse_reference(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def plot_from_args(args: argparse.Namespace) -> int:
    """The body of ``zmq-rl plot``: draw, print the image path, return 0."""
    out = args.out
    if out is None:
        out = args.runs[0] / CURVE_NAME if len(args.runs) == 1 else Path(CURVE_NAME)
    labels = run_labels(args.runs, args.label, args.group)
    print(
        plot_runs(
            args.runs,
            out,
            labels=labels,
            band=args.band,
            reference=args.reference,
            x=args.x,
            ylim=args.ylim,
        )
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m zmq_rl.cli.plot``: the same as ``zmq-rl plot``."""
    from .exits import guard
    from .flags import CliParser, HelpFormatter

    parser = CliParser(
        prog="python -m zmq_rl.cli.plot",
        description="Draw learning curves (return vs env steps) of one or more runs; runs "
        "sharing a label are drawn as a mean with a band.",
        formatter_class=HelpFormatter,
    )
    add_plot_flags(parser)
    return guard(lambda: plot_from_args(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
