"""``zmq-rl plot`` (zmq_rl/cli/plot.py) on run directories written here: groups of
runs of different lengths, evaluations at different steps, a resumed run against
wall time (issue 29, item 10). The figure is inspected through
:func:`~zmq_rl.cli.plot.curve_figure`, the one ``plot_runs`` saves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from zmq_rl.cli import plot as plot_cli


def write_run(
    folder: Path, rows: list[dict[str, Any]], evaluations: list[dict[str, Any]] | None
) -> Path:
    """A run directory: ``rows`` as metrics.jsonl, ``evaluations`` as report.json's
    (no report.json when None)."""
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if evaluations is not None:
        (folder / "report.json").write_text(json.dumps({"evaluations": evaluations}))
    return folder


def update_rows(updates: range, wall=lambda u: float(u)) -> list[dict[str, Any]]:
    return [
        {"update": u, "env_steps": 100 * u, "wall_seconds": wall(u), "charts/mean_return": u}
        for u in updates
    ]


def evaluation(update: int, mean: float, wall: float | None = None) -> dict[str, Any]:
    return {
        "updates": update,
        "env_steps": 100 * update,
        "wall_seconds": float(update) if wall is None else wall,
        "mean_return": mean,
        "std_return": 1.0,
    }


def drawn(fig) -> list[tuple[list[float], list[float], str]]:
    """Every line of the figure's axes: (x, y, label)."""
    (ax,) = fig.axes
    return [
        (
            [float(v) for v in line.get_xdata()],
            [float(v) for v in line.get_ydata()],
            line.get_label(),
        )
        for line in ax.get_lines()
    ]


def assert_no_empty_legend_entry(fig) -> None:
    (ax,) = fig.axes
    handles, labels = ax.get_legend_handles_labels()
    for handle, label in zip(handles, labels, strict=True):
        if hasattr(handle, "get_xdata"):
            assert len(handle.get_xdata()) > 0, f"legend entry {label!r} draws nothing"


def test_a_group_draws_each_run_whole_and_its_mean_where_all_have_points(tmp_path):
    """A 10-update run and a 4-update run under one label: the long run is drawn to
    its end (on main the group stopped at the short run's last step), the mean only
    where both have points, and the legend says so."""
    long = write_run(tmp_path / "long", update_rows(range(1, 11)), [evaluation(10, 50.0)])
    short = write_run(tmp_path / "short", update_rows(range(1, 5)), [evaluation(4, 20.0)])
    fig = plot_cli.curve_figure([long, short], labels=["g", "g"])
    lines = drawn(fig)
    assert max(max(x) for x, _, _ in lines if x) == 1000.0  # the long run, whole
    (mean,) = [(x, y) for x, y, label in lines if "mean of 2 runs where all" in label]
    assert mean[0] == [100.0, 200.0, 300.0, 400.0]
    assert mean[1] == [1.0, 2.0, 3.0, 4.0]
    assert_no_empty_legend_entry(fig)


def test_evaluations_at_different_steps_are_all_drawn_with_no_empty_legend_entry(tmp_path):
    """One run evaluated at 400 steps only, the other at 500 and 1000: they do not
    overlap, so there is no mean, but every evaluation is drawn (on main: none, and a
    legend entry for an empty mean line); where they do overlap the mean is taken on
    the union of their steps, each run interpolated."""
    a = write_run(tmp_path / "a", update_rows(range(1, 5)), [evaluation(4, 10.0)])
    b = write_run(
        tmp_path / "b", update_rows(range(1, 11)), [evaluation(5, 20.0), evaluation(10, 40.0)]
    )
    fig = plot_cli.curve_figure([a, b], labels=["g", "g"])
    assert_no_empty_legend_entry(fig)
    points = {(x, y) for xs, ys, _ in drawn(fig) for x, y in zip(xs, ys, strict=True)}
    assert {(400.0, 10.0), (500.0, 20.0), (1000.0, 40.0)} <= points
    assert not [label for _, _, label in drawn(fig) if "evaluation (mean" in label]

    c = write_run(
        tmp_path / "c", update_rows(range(1, 11)), [evaluation(3, 0.0), evaluation(9, 60.0)]
    )
    x, mean, _, _ = plot_cli._aggregate(
        [(plot_cli.read_run(r).eval_steps, plot_cli.read_run(r).eval_mean) for r in (b, c)],
        "minmax",
    )
    assert list(x) == [500.0, 900.0]  # both runs' steps where both have points
    assert list(mean) == [(20.0 + 20.0) / 2, (36.0 + 60.0) / 2]


def resumed_run(folder: Path, with_report: bool) -> Path:
    """A run killed after update 6 (wall 2 s per update) and resumed from its
    checkpoint at update 4: the second learner redoes updates 5 and 6, its clock
    starting at 0 (1.5 s per update). Evaluations of updates 2 and 4 (first
    learner) and 5 (in the loop: its row just before update 5's) and 8 (second)."""
    first = update_rows(range(1, 7), wall=lambda u: 2.0 * u)
    second = update_rows(range(5, 11), wall=lambda u: 1.5 * (u - 4))
    evaluations = [
        evaluation(2, 5.0, wall=3.9),
        evaluation(4, 9.0, wall=7.9),
        evaluation(5, 11.0, wall=1.4),
        evaluation(8, 20.0, wall=5.9),
    ]
    rows = [
        *first[:2], row_of(evaluations[0]), *first[2:4], row_of(evaluations[1]), *first[4:],
        row_of(evaluations[2]), *second[:4], row_of(evaluations[3]), *second[4:],
    ]  # fmt: skip
    return write_run(folder, rows, evaluations if with_report else None)


def row_of(ev: dict[str, Any]) -> dict[str, Any]:
    """An evaluation's metrics.jsonl row (zmq_rl.learner.runlog.evaluation_row)."""
    from zmq_rl.learner.runlog import evaluation_row

    return evaluation_row(ev)


def test_wall_time_is_cumulative_over_a_resume_and_redone_updates_are_drawn_once(tmp_path):
    for with_report in (True, False):
        run = resumed_run(tmp_path / f"report-{with_report}", with_report)
        curve = plot_cli.read_run(run)
        assert curve.train_steps == [100.0 * u for u in range(1, 11)]  # 5, 6 once
        assert curve.train_wall == [2.0, 4.0, 6.0, 8.0] + [12.0 + 1.5 * k for k in range(1, 7)]
        assert curve.eval_steps == [200.0, 400.0, 500.0, 800.0]
        assert curve.eval_wall == [3.9, 7.9, 12.0 + 1.4, 12.0 + 5.9]
    fig = plot_cli.curve_figure([run], x="wall")
    for xs, _, _ in drawn(fig):
        assert xs == sorted(xs), "the curve goes back in time"
