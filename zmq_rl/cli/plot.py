"""Learning curves from run directories (``zmq-rl plot``, and the end of ``zmq-rl run``).

Reads ``metrics.jsonl`` (one row per update, written by the learner) for the
training return, and ``report.json``'s evaluations (mean ± std, including the
final one) for the evaluation points, falling back to the ``eval/mean_return``
column of the metrics when there is no report (an interrupted run). Draws with
matplotlib's Agg canvas directly: no pyplot, no display needed.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .common import CliFailure

__all__ = ["CURVE_NAME", "RunCurve", "plot_runs", "read_run"]

CURVE_NAME = "learning_curve.png"


class RunCurve:
    """The points of one run: training return and evaluations against env steps."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.label = run_dir.name or str(run_dir)
        self.train_steps: list[float] = []
        self.train_return: list[float] = []
        self.eval_steps: list[float] = []
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


def read_run(run_dir: str | Path) -> RunCurve:
    """Read one run directory's metrics (and report and config, when present)."""
    run_dir = Path(run_dir)
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        raise CliFailure(f"{run_dir}: no metrics.jsonl (is this a run directory?)")
    curve = RunCurve(run_dir)
    rows = _read_jsonl(metrics)
    for row in rows:
        if "env_steps" in row and "charts/mean_return" in row:
            curve.train_steps.append(float(row["env_steps"]))
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
            curve.eval_steps.append(float(ev["env_steps"]))
            curve.eval_mean.append(float(ev["mean_return"]))
            curve.eval_std.append(float(ev.get("std_return", 0.0)))
    else:
        for row in rows:
            if "eval/mean_return" in row:
                curve.eval_steps.append(float(row["env_steps"]))
                curve.eval_mean.append(float(row["eval/mean_return"]))
                curve.eval_std.append(0.0)
    config_path = run_dir / "config.toml"
    if config_path.is_file():
        try:
            learner = tomllib.loads(config_path.read_text()).get("learner", {})
            curve.env_id = str(learner.get("env_id", ""))
            curve.target_return = float(learner.get("target_return", math.inf))
        except (tomllib.TOMLDecodeError, TypeError, ValueError):
            pass
    return curve


def plot_runs(run_dirs: Sequence[str | Path], out: str | Path) -> Path:
    """Draw the learning curves of ``run_dirs`` into the PNG ``out``; return its path."""
    from matplotlib.figure import Figure

    curves = [read_run(d) for d in run_dirs]
    fig = Figure(figsize=(8, 4.5), dpi=120, layout="constrained")
    ax = fig.add_subplot()
    colors = [f"C{i % 10}" for i in range(len(curves))]
    several = len(curves) > 1
    for curve, color in zip(curves, colors, strict=True):
        prefix = f"{curve.label}: " if several else ""
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
    targets = {c.target_return for c in curves if math.isfinite(c.target_return)}
    for target in sorted(targets):
        ax.axhline(target, color="0.5", ls="--", lw=1, label=f"target return {target:g}")
    env_ids = sorted({c.env_id for c in curves if c.env_id})
    title = "learning curve" + (f": {', '.join(env_ids)}" if env_ids else "")
    if not several:
        title += f" ({curves[0].label})"
    ax.set_title(title)
    ax.set_xlabel("env steps")
    ax.set_ylabel("episode return")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize="small")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    return out
