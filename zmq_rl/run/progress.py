"""The live progress line of a training run, fed by the learner's ``on_update`` hook.

On a terminal it is one line, its facts in the order of their worth::

    update 120/390 ━━━━━━──────  eta 52.0s  eval 312.4  return 187.3  5,210 steps/s
    actors 2  lag 0.41  elapsed 6.0s  device cpu

(one line: wrapped here)
and, once the learner measured its actors' links, ``rtt 201 ms  paused 72%`` after the
lag (the worst round trip, the largest share of time a valve held an actor paused),
and last the learner's device (``cpu``, ``cuda:0``) once it is known. A narrow
terminal (an 80-column tmux pane) keeps the first ones and leaves out the rest,
whole: the update counter, the time left to spend the budget (``eta``, at this
session's speed), the last evaluation and the training return always show; the bar
shrinks, then goes.

Elsewhere (a pipe, a CI log) the same facts are printed as plain lines, at most
every tenth of the run or every 15 seconds, plus one line per evaluation.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.progress import Progress, ProgressColumn, Task
from rich.text import Text

from ..learner.metrics import policy_returns_text, updates_total
from .common import format_duration

__all__ = ["TrainingProgress", "format_row"]

PLAIN_INTERVAL_S = 15.0


def _get(row: Mapping[str, Any], key: str) -> float:
    value = row.get(key)
    return float(value) if isinstance(value, (int, float)) else math.nan


BAR_WIDTH = (8, 24)
"""The narrowest bar worth drawing, and the widest."""


def eta_seconds(row: Mapping[str, Any], total_env_steps: int, steps_at_start: int = 0) -> float:
    """Seconds left to spend ``total_env_steps`` at this session's speed (env steps
    since ``steps_at_start`` over ``wall_seconds``); nan when it cannot be told yet.
    A run that reaches its target return ends sooner."""
    steps, wall = _get(row, "env_steps"), _get(row, "wall_seconds")
    done = steps - steps_at_start
    if not total_env_steps or not done > 0 or not wall > 0:
        return math.nan
    return max(0.0, total_env_steps - steps) * wall / done


def fit_line(head: str, parts: list[str], width: int, fraction: float) -> str:
    """``head`` (the update counter), a bar of ``fraction`` when there is room, then the
    first of ``parts`` (in order of their worth) that fit in ``width`` columns, each
    whole or not at all; the first part always shows."""
    used = len(head)
    kept: list[str] = []
    for i, part in enumerate(parts):
        if i and used + 2 + len(part) > width:
            break
        kept.append(part)
        used += 2 + len(part)
    room = width - used - 1
    bar = ""
    if room >= BAR_WIDTH[0]:
        cells = min(room, BAR_WIDTH[1])
        filled = int(round(cells * min(max(fraction, 0.0), 1.0)))
        bar = " " + "━" * filled + "─" * (cells - filled)
    return head + bar + "".join("  " + part for part in kept)


def format_row(row: Mapping[str, Any], steps_at_start: int = 0) -> str:
    """One line of the facts a person watches: speed, return, actors, lag, evaluation,
    and, when the learner measured them, the worst actor's round trip and the largest
    share of time an actor's staleness valve held it paused.

    The return reads ``-`` until an episode has ended (``charts/episodes`` 0: the row's
    0.0 is no return). ``steps_at_start``: the env steps a resumed run had before this
    session; the speed is then this session's steps over this session's time
    (``wall_seconds``), not the run's total over it."""
    sps = _get(row, "charts/SPS")
    if steps_at_start and _get(row, "wall_seconds") > 0:
        sps = (_get(row, "env_steps") - steps_at_start) / _get(row, "wall_seconds")
    ended = _get(row, "charts/episodes") != 0  # nan (no count in the row): show the value
    mean_return = f"{_get(row, 'charts/mean_return'):.1f}" if ended else "-"
    text = (
        f"{sps:,.0f} steps/s  "
        f"return {mean_return}{policy_returns_text(row)}  "
        f"actors {int(_get(row, 'charts/actors')) if 'charts/actors' in row else '?'}  "
        f"lag {_get(row, 'charts/policy_lag_mean'):.2f}"
    )
    if "eval/mean_return" in row:
        text += f"  eval {_get(row, 'eval/mean_return'):.1f}"
    if "links/rtt_ms_max" in row:
        text += f"  rtt {_get(row, 'links/rtt_ms_max'):.0f} ms"
    if "links/valve_paused_share_max" in row:
        text += f"  paused {100 * _get(row, 'links/valve_paused_share_max'):.0f}%"
    return text


class TrainingProgress:
    """Shows ``update/total``, env steps/s, mean return, actors and policy lag.

    Use as a context manager and pass :meth:`update` as (part of) the learner's
    ``on_update`` hook. ``live`` forces the rich bar on or off (default: on when
    the console is a terminal). ``total_updates`` is the first estimate; with
    ``total_env_steps`` (the run's step budget) the total is estimated again at every
    update from the env steps the updates of this session consumed, since a turn-based
    game's moves, agents that come and go or a fleet other than the nominal one make
    the first estimate wrong (a connect-four run showed ``update 444/366``).
    """

    def __init__(
        self,
        total_updates: int,
        console: Console,
        waiting: str = "",
        live: bool | None = None,
        total_env_steps: int = 0,
    ) -> None:
        self.total = total_updates
        self.total_env_steps = total_env_steps
        self._update_at_start: int | None = None
        self.console = console
        self.live = console.is_terminal if live is None else live
        self.last_row: Mapping[str, Any] = {}
        self.last_eval = math.nan
        self._evaluated = False
        self._progress: Progress | None = None
        self._task: Any = None
        self._waiting = waiting
        self._last_print = 0.0
        self._every = max(1, total_updates // 10)
        self.device = ""
        """The learner's device (``LearnerReport.device``), shown on every line once set."""
        self.steps_at_start = 0
        """Env steps before this session (a resumed run's): the speed counts only the rest."""

    def __enter__(self) -> TrainingProgress:
        if self._waiting:
            self.console.print(self._waiting, markup=False)
        if self.live:
            self._progress = Progress(_LineColumn(self), console=self.console)
            self._progress.start()
            self._task = self._progress.add_task(
                "train", total=self.total, stats="waiting for actors" if self._waiting else ""
            )
        return self

    def parts(self, row: Mapping[str, Any], elapsed: float | None = None) -> list[str]:
        """The facts of ``row`` in the order of their worth (the live line keeps as many
        as fit): the time left, the last evaluation, the training return and per-policy
        returns, the speed, actors, lag, the links, the elapsed time, the device."""
        eta = eta_seconds(row, self.total_env_steps, self.steps_at_start)
        parts = [f"eta {format_duration(eta)}" if math.isfinite(eta) else "eta -"]
        if not math.isnan(self.last_eval):
            parts.append(f"eval {self.last_eval:.1f}")
        pieces = format_row(row, self.steps_at_start).split("  ")  # speed, return, ...
        speed, rest = pieces[0], pieces[1:]
        actors = next((i for i, p in enumerate(rest) if p.startswith("actors ")), len(rest))
        parts += rest[:actors] + [speed] + rest[actors:]  # the returns before the speed
        if elapsed is not None:
            parts.append(f"elapsed {format_duration(elapsed)}")
        if self.device:
            parts.append(f"device {self.device}")
        return parts

    def line(self, elapsed: float | None, width: int) -> str:
        """The live line for a console ``width`` columns wide (:func:`fit_line`)."""
        row = self.last_row
        update = int(row.get("update", 0))
        head = f"update {update}/{self.total}"
        if not row:
            return fit_line(head, ["waiting for actors" if self._waiting else ""], width, 0.0)
        fraction = update / self.total if self.total else 0.0
        return fit_line(head, self.parts(row, elapsed), width, fraction)

    def update(self, row: Mapping[str, Any]) -> None:
        """Take one metrics row (as the learner's ``on_update`` passes it)."""
        self.last_row = row
        update = int(row.get("update", 0))
        self._estimate_total(update, int(_get(row, "env_steps")))
        evaluated = "eval/mean_return" in row or self._evaluated
        self._evaluated = False
        if "eval/mean_return" in row:
            self.last_eval = _get(row, "eval/mean_return")
        stats = format_row(row, self.steps_at_start)
        if "eval/mean_return" not in row and not math.isnan(self.last_eval):
            stats += f"  eval {self.last_eval:.1f}"
        if self.device:
            stats += f"  device {self.device}"
        if self._progress is not None:
            self._progress.update(self._task, total=self.total, completed=min(update, self.total))
            return
        eta = eta_seconds(row, self.total_env_steps, self.steps_at_start)
        if math.isfinite(eta):
            stats = f"eta {format_duration(eta)}  {stats}"
        now = time.monotonic()
        if (
            update == 1
            or evaluated
            or update % self._every == 0
            or now - self._last_print >= PLAIN_INTERVAL_S
        ):
            self._last_print = now
            self.console.print(
                f"update {update}/{self.total}  steps {int(_get(row, 'env_steps'))}  {stats}",
                highlight=False,
            )

    def _estimate_total(self, update: int, env_steps: int) -> None:
        """Set :attr:`total` to ``update`` plus the updates the rest of the step budget
        buys at this session's mean steps per update (the learner starts no update
        that would overrun the budget, hence the floor)."""
        if self._update_at_start is None:
            self._update_at_start = update - 1
        total = updates_total(
            update,
            env_steps,
            self.total_env_steps,
            update - self._update_at_start,
            env_steps - self.steps_at_start,
        )
        if total is not None:
            self.total = total

    def evaluation(self, row: Mapping[str, Any]) -> None:
        """Take one evaluation's row (the learner's ``on_evaluation``): its mean return
        is shown on the next update's line (a plain console prints that line)."""
        self.last_eval = _get(row, "eval/mean_return")
        self._evaluated = True

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


class _LineColumn(ProgressColumn):
    """The whole live line as one column, fitted to the console's width at each
    refresh (:meth:`TrainingProgress.line`; the elapsed time ticks between updates)."""

    def __init__(self, progress: TrainingProgress) -> None:
        super().__init__()
        self.progress = progress

    def render(self, task: Task) -> Text:
        width = self.progress.console.width - 1
        return Text(self.progress.line(task.elapsed, width), no_wrap=True, overflow="crop")
