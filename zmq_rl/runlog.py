"""The run's record: evaluations, the per-update metrics row, the progress line.

:class:`RunLog` writes what the learner reports as it goes: every update's row to
``metrics.jsonl`` and the ``on_update`` hook, the log line, and deterministic
evaluations into the :class:`~zmq_rl.report.LearnerReport`. No sockets here.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

from .config import LearnerConfig
from .evaluation import evaluate_policy
from .metrics import JsonlMetrics
from .policy import Policy
from .report import LearnerReport

__all__ = ["RunLog"]

log = logging.getLogger(__name__)

EVAL_SEED_OFFSET = 10_000
"""Evaluation episodes are seeded from ``seed + EVAL_SEED_OFFSET``, away from the actors'."""


class RunLog:
    """Records one run's progress into ``report`` (and ``run_dir/metrics.jsonl``)."""

    def __init__(
        self,
        cfg: LearnerConfig,
        report: LearnerReport,
        on_update: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.report = report
        self.on_update = on_update
        self.start = time.monotonic()
        self._metrics = JsonlMetrics(cfg.run_dir) if cfg.run_dir else None

    def elapsed(self) -> float:
        """Seconds since the run started (see :meth:`restart_clock`)."""
        return time.monotonic() - self.start

    def restart_clock(self) -> None:
        """Count wall time from now (when the run loop starts)."""
        self.start = time.monotonic()

    def evaluate(self, policy: Policy) -> dict[str, float]:
        """Run ``eval_episodes`` deterministic episodes and add the result to the report."""
        cfg = self.cfg
        seed = cfg.seed + EVAL_SEED_OFFSET
        mean, std = evaluate_policy(policy, cfg.env_id, cfg.eval_episodes, seed=seed)
        result = {
            "updates": self.report.updates_completed,
            "env_steps": self.report.env_steps_consumed,
            "wall_seconds": self.elapsed(),
            "mean_return": mean,
            "std_return": std,
        }
        self.report.evaluations.append(result)
        log.info(
            "evaluation after %d steps: %.1f ± %.1f over %d episodes",
            result["env_steps"],
            mean,
            std,
            cfg.eval_episodes,
        )
        return result

    def maybe_evaluate(self, policy: Policy, metrics: dict[str, float]) -> bool:
        """Evaluate every ``eval_every`` updates (adding ``eval/mean_return`` to
        ``metrics``); return whether the evaluation reached ``target_return``."""
        every = self.cfg.eval_every
        if every and self.report.updates_completed % every == 0:
            result = self.evaluate(policy)
            metrics["eval/mean_return"] = result["mean_return"]
            return result["mean_return"] >= self.cfg.target_return
        return False

    def evaluated_last_update(self) -> bool:
        """Whether the newest evaluation is of the newest update."""
        evaluations = self.report.evaluations
        return bool(evaluations) and evaluations[-1]["updates"] == self.report.updates_completed

    def record(self, metrics: dict[str, float], version: int, actors: int) -> None:
        """Write the update's row (metrics.jsonl, ``on_update``) and the progress line."""
        elapsed = self.elapsed()
        report = self.report
        row = {
            "update": report.updates_completed,
            "env_steps": report.env_steps_consumed,
            "wall_seconds": elapsed,
            "version": version,
            "charts/SPS": report.env_steps_consumed / max(elapsed, 1e-9),
            "charts/mean_return": report.mean_recent_episode_reward(100),
            "charts/episodes": report.episodes_completed,
            "charts/actors": actors,
            **metrics,
        }
        if self._metrics is not None:
            self._metrics.write(row)
        if self.on_update is not None:
            self.on_update(row)
        log.info(
            "update %d/%d  steps %d  %.0f steps/s  return %.1f  actors %d  lag %.2f  "
            "loss %.3f  entropy %.3f",
            report.updates_completed,
            self.cfg.num_updates(),
            report.env_steps_consumed,
            row["charts/SPS"],
            row["charts/mean_return"],
            actors,
            metrics["charts/policy_lag_mean"],
            metrics.get("losses/policy_loss", math.nan),
            metrics.get("losses/entropy", math.nan),
        )

    def close(self) -> None:
        """Close metrics.jsonl."""
        if self._metrics is not None:
            self._metrics.close()
