"""Per-update metrics: ``metrics.jsonl``, ``metrics.csv`` and, when installed, TensorBoard.

The learner appends every update's row to ``metrics.jsonl`` in its run directory
(:class:`JsonlMetrics`); :class:`MetricsWriter` is the sink for the learner's
``on_update`` hook that adds a spreadsheet-friendly CSV and TensorBoard event files::

    with MetricsWriter(run_dir) as metrics:
        Learner(cfg, on_update=metrics.write, on_evaluation=metrics.write).run()

CSV columns are the keys of the first row, in order; a key that first appears in
a later row (``eval/mean_return`` appears only in evaluation rows) is appended
as a new column and the file is rewritten once with that header, so the CSV
always holds every key seen, with empty cells where a row had no value. A CSV
already in the run directory is appended to (as the learner does with its JSONL).

TensorBoard scalars go to event files in the run directory itself (so
``tensorboard --logdir runs`` shows every run), with the env-step count as the
step, when the ``tensorboard`` package is importable (``pip install
zmq_rl[tensorboard]``).

Rows are of two kinds. An update row (``charts/...``, ``losses/...``) is one PPO
update at its env step. An evaluation row (:func:`is_evaluation_row`: it holds
``eval/mean_return``; :func:`zmq_rl.learner.runlog.evaluation_row`) is one evaluation at
the update, env step and wall time of the policy it *measured*, written when the
result is known: a background evaluation's row follows the update rows trained
meanwhile, and the final evaluation's row follows the last update row. Its
``eval/`` scalars go to TensorBoard and W&B at its own env step (W&B, whose step
only moves forward, draws ``eval/*`` against ``eval/env_steps``).

Weights & Biases (``--wandb-project NAME``, ``pip install 'zmq_rl[wandb]'``): the
same scalars against env steps, the run's configs as the W&B config, files under
``run_dir/wandb``. ``WANDB_MODE=offline`` works with no network (``wandb sync``
uploads later); ``WANDB_MODE=disabled`` turns it off.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger("zmq_rl.metrics")

__all__ = [
    "JsonlMetrics",
    "MetricsWriter",
    "WandbUnavailable",
    "is_evaluation_row",
    "policy_returns_text",
    "updates_total",
    "tensorboard_available",
]


def updates_total(
    update: int, env_steps: int, total_env_steps: int, updates_done: int, steps_done: int
) -> int | None:
    """The updates a run's budget buys, for a progress line at ``update`` and
    ``env_steps``: ``update`` plus the updates the rest of ``total_env_steps`` buys at
    this session's mean env steps per update (``steps_done`` over ``updates_done``; a
    multi-agent batch holds rows that are no env steps, so the batch's rows do not
    tell). The floor: the learner starts no update that would overrun the budget. None
    when it cannot be told yet (no budget, nothing done this session)."""
    if not total_env_steps or updates_done <= 0 or steps_done <= 0:
        return None
    remaining = max(0, total_env_steps - env_steps)
    return update + remaining * updates_done // steps_done


def policy_returns_text(row: Mapping[str, Any]) -> str:
    """``"  first 0.52  second -0.48"``: each policy's mean return in a metrics row of
    a several-policy run (``policy/<id>/charts/mean_return``); ``""`` otherwise."""
    return "".join(
        f"  {name.split('/')[1]} {float(value):.2f}"
        for name, value in row.items()
        if name.startswith("policy/") and name.endswith("/charts/mean_return")
    )


class WandbUnavailable(ImportError):
    """``--wandb-project`` was given but the ``wandb`` package is not installed."""


CSV_NAME = "metrics.csv"
JSONL_NAME = "metrics.jsonl"
STEP_KEY = "env_steps"
"""The x axis of TensorBoard scalars."""
_NOT_SCALARS = frozenset({"update", STEP_KEY})
EVAL_PREFIX = "eval/"
EVAL_STEP_KEY = "eval/env_steps"
"""The x axis of the ``eval/*`` charts in W&B (the env step each evaluation measured)."""


def is_evaluation_row(row: Mapping[str, Any]) -> bool:
    """Whether ``row`` is an evaluation's row (not an update's): it has
    ``eval/mean_return``."""
    return "eval/mean_return" in row


class JsonlMetrics:
    """``run_dir/metrics.jsonl``: one JSON object per update, flushed at once (the
    learner's own record; ``zmq-rl plot`` reads it)."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        self._file: Any = open(Path(run_dir) / JSONL_NAME, "a")  # noqa: SIM115 (closed in close())

    def write(self, row: Mapping[str, Any]) -> None:
        """Append one row."""
        if self._file is not None:
            self._file.write(json.dumps(row) + "\n")
            self._file.flush()

    def close(self) -> None:
        """Close the file (later writes are ignored)."""
        if self._file is not None:
            self._file.close()
            self._file = None


def tensorboard_available() -> bool:
    """Whether the ``tensorboard`` package (needed by torch's SummaryWriter) is installed."""
    return importlib.util.find_spec("tensorboard") is not None


class MetricsWriter:
    """Write metric rows to ``run_dir/metrics.csv`` and optionally TensorBoard.

    ``tensorboard``: True requires the package (ImportError otherwise), False
    never writes events, None (default) writes them when the package is installed.
    ``wandb_project``: also log every row to that Weights & Biases project
    (:class:`WandbUnavailable` without the package), named after the run dir, with
    ``wandb_config`` (config dataclasses or plain values) as its config.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        tensorboard: bool | None = None,
        wandb_project: str | None = None,
        wandb_config: Mapping[str, Any] | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.csv_path = self.run_dir / CSV_NAME
        self.fieldnames: list[str] = []
        self.rows_written = 0
        self._csv_file: Any = None
        self._csv: csv.DictWriter | None = None
        self._tb: Any = None
        self._closed = False
        if self.csv_path.exists():  # a reused run directory: keep its rows, as metrics.jsonl does
            with open(self.csv_path, newline="") as f:
                self.fieldnames = next(csv.reader(f), [])
            if self.fieldnames:
                self._open_for_append()
        if tensorboard is None:
            tensorboard = tensorboard_available()
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

            self._tb = SummaryWriter(log_dir=str(self.run_dir))
            log.info("writing TensorBoard events to %s", self.run_dir)
        self._wandb: Any = None
        self._wandb_step = 0
        if wandb_project:
            self._wandb = _start_wandb(self.run_dir, wandb_project, wandb_config or {})

    @property
    def tensorboard_enabled(self) -> bool:
        """Whether TensorBoard events are being written."""
        return self._tb is not None

    def write(self, row: Mapping[str, Any]) -> None:
        """Append one row (one update's metrics, or one evaluation's) to the CSV,
        TensorBoard and W&B; an evaluation row's ``eval/`` scalars only, at the env
        step it measured."""
        if self._closed:
            raise ValueError("MetricsWriter is closed")
        new_keys = [k for k in row if k not in self.fieldnames]
        if new_keys:
            self._extend_header(new_keys)
        assert self._csv is not None
        self._csv.writerow(row)
        self._csv_file.flush()
        self.rows_written += 1
        evaluation = is_evaluation_row(row)
        step = int(row.get(STEP_KEY, self.rows_written))
        scalars = {
            k: v
            for k, v in row.items()
            if k != STEP_KEY
            and isinstance(v, (int, float))
            and not isinstance(v, bool)
            and (not evaluation or k.startswith(EVAL_PREFIX))
        }
        if self._tb is not None:
            for key, value in scalars.items():
                if key not in _NOT_SCALARS:
                    self._tb.add_scalar(key, value, global_step=step)
            self._tb.flush()
        if self._wandb is not None:
            if evaluation:
                # W&B drops a step below its newest: log at the newest, x = eval/env_steps.
                self._wandb.log({**scalars, EVAL_STEP_KEY: step}, step=self._wandb_step)
            else:
                self._wandb_step = max(self._wandb_step, step)
                self._wandb.log(scalars, step=step)

    def _extend_header(self, new_keys: list[str]) -> None:
        """Add columns; rewrite the rows written so far under the wider header."""
        old_rows: list[dict[str, str]] = []
        if self._csv_file is not None:
            self._csv_file.close()
            with open(self.csv_path, newline="") as f:
                old_rows = list(csv.DictReader(f))
        self.fieldnames = [*self.fieldnames, *new_keys]
        tmp = self.csv_path.with_suffix(".csv.tmp")
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.fieldnames, restval="")
            writer.writeheader()
            writer.writerows(old_rows)
        os.replace(tmp, self.csv_path)
        self._open_for_append()

    def _open_for_append(self) -> None:
        self._csv_file = open(self.csv_path, "a", newline="")  # noqa: SIM115 (closed in close())
        self._csv = csv.DictWriter(self._csv_file, fieldnames=self.fieldnames, restval="")

    def close(self) -> None:
        """Flush and close the CSV file and the TensorBoard writer."""
        self._closed = True
        if self._csv_file is not None:
            self._csv_file.close()
            self._csv_file = None
            self._csv = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _start_wandb(run_dir: Path, project: str, config: Mapping[str, Any]) -> Any:
    """``wandb.init`` for a run dir (mode from ``WANDB_MODE``: online by default,
    ``offline`` needs no network)."""
    try:
        import wandb
    except ImportError as exc:
        raise WandbUnavailable(
            f"--wandb-project needs the wandb package: pip install 'zmq_rl[wandb]' ({exc})"
        ) from None
    import dataclasses

    plain = {
        key: dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
        for key, value in config.items()
    }
    run = wandb.init(
        project=project,
        name=run_dir.name,
        dir=str(run_dir),
        config=plain,
        reinit="finish_previous",
    )
    run.define_metric(EVAL_STEP_KEY)
    run.define_metric(EVAL_PREFIX + "*", step_metric=EVAL_STEP_KEY)
    log.info("logging to Weights & Biases project %s in %s", project, run_dir / "wandb")
    return run
