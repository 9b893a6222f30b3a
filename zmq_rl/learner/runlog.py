"""The run's record: evaluations, the per-update metrics row, the progress line.

:class:`RunLog` writes what the learner reports as it goes: every update's row to
``metrics.jsonl`` and the ``on_update`` hook, the log line (which names the learner's
device), and deterministic evaluations into the :class:`~zmq_rl.learner.report.LearnerReport`.
Every evaluation also becomes an evaluation row (:func:`evaluation_row`), written to
``metrics.jsonl`` and the ``on_evaluation`` hook when its result is known, at the
update, env step and wall time it *measured* (a background evaluation's result
arrives updates later; the final one after the last update row). No sockets here.

Evaluation runs on the CPU whatever the learner's device: its envs step on the
CPU and it acts on one observation per unfinished episode, a batch of at most
``eval_episodes`` rows, for which a GPU's launch and transfer latency costs more
than the forward pass itself. The background evaluator gets CPU weights
(:func:`~zmq_rl.rl.policy.export_weights`); an in-process evaluation of a policy on
CUDA uses a CPU copy of it (:meth:`RunLog.evaluate`).
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..config import LearnerConfig, PolicyConfig
from ..rl.policy import Policy, export_weights
from .evaluation import BackgroundEvaluator, evaluate_policy
from .metrics import JsonlMetrics, policy_returns_text, updates_total
from .report import LearnerReport

__all__ = ["BestPolicy", "RunLog", "evaluation_row"]

log = logging.getLogger("zmq_rl.runlog")

EVAL_SEED_OFFSET = 10_000
"""Evaluation episodes are seeded from ``seed + EVAL_SEED_OFFSET``, away from the actors'."""
BACKGROUND_FINISH_S = 120.0
"""How long the end of a run waits for a background evaluation still running."""


@dataclass
class BestPolicy:
    """The evaluated policy with the highest mean return so far: its evaluation row,
    the policy version it was, and its tensors (CPU, as broadcast)."""

    result: dict[str, Any]
    version: int
    weights: list[tuple[str, np.ndarray]]

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The tensors as a ``state_dict`` (what :func:`~zmq_rl.learner.checkpoint.save_policy`
        writes)."""
        return {name: torch.from_numpy(array) for name, array in self.weights}


def evaluation_row(result: dict[str, Any]) -> dict[str, Any]:
    """The metrics row of one evaluation (a ``report.evaluations`` entry): ``update``,
    ``env_steps`` and ``wall_seconds`` of the snapshot it measured, ``eval/mean_return``
    and ``eval/std_return`` (and ``reported_at_update`` for a background one). The
    sinks draw its ``eval/`` scalars at its ``env_steps``
    (:meth:`~zmq_rl.learner.metrics.MetricsWriter.write`)."""
    row = {
        "update": result["updates"],
        "env_steps": result["env_steps"],
        "wall_seconds": result["wall_seconds"],
        "eval/mean_return": result["mean_return"],
        "eval/std_return": result["std_return"],
    }
    if "reported_at_update" in result:
        row["reported_at_update"] = result["reported_at_update"]
    for pid, value in result.get("policies", {}).items():
        row[f"eval/policy/{pid}/mean_return"] = value
    return row


class RunLog:
    """Records one run's progress into ``report`` (and ``run_dir/metrics.jsonl``).

    It also keeps the best evaluated policy (:attr:`best`): with ``target_return`` the
    run stops on an evaluation that reached it, but the policy trained on while that
    evaluation ran in the background may be worse, so the one that was measured is
    kept apart (the learner writes it as ``policy-best.pt``). What it holds is
    bounded: the best snapshot, plus the weights of the snapshots submitted to the
    background evaluator and not yet reported (at most the running one and the one
    waiting).

    ``on_update(row)`` gets every update's row; ``on_evaluation(row)`` every
    evaluation's row (:func:`evaluation_row`), both as ``metrics.jsonl`` gets them."""

    def __init__(
        self,
        cfg: LearnerConfig,
        report: LearnerReport,
        on_update: Callable[[dict[str, Any]], None] | None = None,
        policy_cfg: PolicyConfig | None = None,
        on_evaluation: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.report = report
        self.updates_budget = cfg.num_updates()
        """The updates the budget buys (the learner sets it for a multi-agent env)."""
        self.agent_policies: list[str] = []
        """Several policies: each agent index's policy id (the learner sets it), by
        which evaluations are also reported per policy."""
        self.on_update = on_update
        self.on_evaluation = on_evaluation
        self.start = time.monotonic()
        self.steps_at_start = report.env_steps_consumed
        self.updates_at_start = report.updates_completed
        self._metrics = JsonlMetrics(cfg.run_dir) if cfg.run_dir else None
        self.evaluator = None
        self._cpu_policies: dict[int, Policy] = {}
        self.best: BestPolicy | None = None
        # Snapshots in the background evaluator, by tag: (version, weights).
        self._submitted: dict[tuple[int, int, float], tuple[int, Any]] = {}
        self.counters: Counter[str] = Counter()
        """Counts ``evaluation/skipped`` (the learner shares its counters here)."""
        if cfg.eval_every and cfg.eval_in_background:
            seed = cfg.seed + EVAL_SEED_OFFSET
            self.evaluator = BackgroundEvaluator(
                cfg.env_id,
                cfg.eval_episodes,
                seed,
                policy_cfg or PolicyConfig(),
                cfg.env_kwargs_map(),
                cfg.wrappers,
                cfg.eval_deterministic,
                cfg.eval_opponent,
            )

    def start_evaluator(self) -> None:
        """Start the background evaluator's process (when there is one) ahead of the
        first evaluation (:meth:`BackgroundEvaluator.start`)."""
        if self.evaluator is not None:
            self.evaluator.start()

    def elapsed(self) -> float:
        """Seconds since the run started (see :meth:`restart_clock`)."""
        return time.monotonic() - self.start

    def restart_clock(self) -> None:
        """Count wall time from now (when the run loop starts), and this session's
        steps from the report's count now (a resumed run's earlier steps are not
        this session's throughput)."""
        self.start = time.monotonic()
        self.steps_at_start = self.report.env_steps_consumed
        self.updates_at_start = self.report.updates_completed

    def evaluate(self, policy: Policy | list[Policy]) -> dict[str, float]:
        """Run ``eval_episodes`` deterministic episodes now, in this process, on the
        CPU (a copy of ``policy`` when it is on a GPU, see the module docstring), and
        add the result to the report. ``policy`` may be a list of one policy per agent
        index (several policies; no best policy is kept of those)."""
        cfg = self.cfg
        seed = cfg.seed + EVAL_SEED_OFFSET
        tag = self._snapshot_tag()  # the wall time of the weights, not of the result
        by_agent: dict[int, float] = {}
        mean, std = evaluate_policy(
            [self._on_cpu(p) for p in policy] if isinstance(policy, list) else self._on_cpu(policy),
            cfg.env_id,
            cfg.eval_episodes,
            seed,
            cfg.env_kwargs_map(),
            cfg.wrappers,
            cfg.eval_deterministic,
            cfg.eval_opponent,
            by_agent,
        )
        per_policy: dict[str, list[float]] = {}
        for index, value in by_agent.items():
            if index < len(self.agent_policies):
                per_policy.setdefault(self.agent_policies[index], []).append(value)
        result = self._add_result(
            tag, mean, std, {pid: float(np.mean(v)) for pid, v in per_policy.items()}
        )
        if not isinstance(policy, list) and self._is_best(result):
            self.best = BestPolicy(result, self.report.last_policy_version, export_weights(policy))
        return result

    def _is_best(self, result: dict[str, Any]) -> bool:
        mean = result["mean_return"]
        return math.isfinite(mean) and (self.best is None or mean > self.best.result["mean_return"])

    def _add_background_result(self, tag: Any, mean: float, std: float) -> dict[str, float]:
        """A result of the background evaluator; the best one's weights are kept."""
        tag = tuple(tag)
        result = self._add_result(tag, mean, std)
        version, weights = self._submitted.pop(tag, (None, None))
        for older in [t for t in self._submitted if t <= tag]:  # replaced while waiting
            del self._submitted[older]
            self.counters["evaluation/skipped"] += 1
        if weights is not None and self._is_best(result):
            self.best = BestPolicy(result, version, weights)
        return result

    def _on_cpu(self, policy: Policy) -> Policy:
        """``policy`` itself when it is on the CPU; else a CPU copy kept between
        evaluations and loaded with its current tensors (bit-exact, as an actor's)."""
        parameter = next(iter(policy.parameters()), None)
        if parameter is None or parameter.device.type == "cpu":
            return policy
        copy_ = self._cpu_policies.get(id(policy))
        if copy_ is None:  # one copy per policy (several policies: one each)
            copy_ = self._cpu_policies[id(policy)] = copy.deepcopy(policy).cpu()
        else:
            copy_.load_state_dict(policy.state_dict())
        return copy_

    def _snapshot_tag(self) -> tuple[int, int, float]:
        report = self.report
        return report.updates_completed, report.env_steps_consumed, self.elapsed()

    def _add_result(
        self,
        tag: tuple[int, int, float],
        mean: float,
        std: float,
        policies: dict[str, float] | None = None,
    ) -> dict[str, Any]:
        updates, env_steps, wall = tag
        result: dict[str, Any] = {
            "updates": updates,
            "env_steps": env_steps,
            "wall_seconds": wall,
            "mean_return": mean,
            "std_return": std,
        }
        if policies:  # several policies: each one's agents' mean return
            result["policies"] = policies
        if self.evaluator is not None:
            result["reported_at_update"] = self.report.updates_completed
        self.report.evaluations.append(result)
        opponent = self.cfg.eval_opponent
        log.info(
            "evaluation after %d steps: %.1f ± %.1f over %d episodes%s%s%s",
            *(env_steps, mean, std, self.cfg.eval_episodes),
            "" if self.cfg.eval_deterministic else " (sampled actions)",
            "" if opponent == "random" else f" against {opponent}",
            "".join(f"; {pid} {v:.2f}" for pid, v in (policies or {}).items()),
        )
        row = evaluation_row(result)
        if self._metrics is not None:
            self._metrics.write(row)
        if self.on_evaluation is not None:
            self.on_evaluation(row)
        return result

    def maybe_evaluate(self, policy: Policy | list[Policy]) -> bool:
        """Evaluate every ``eval_every`` updates (in the background process when
        ``eval_in_background``: a snapshot is submitted and finished evaluations are
        collected); each result is recorded as it comes (report, evaluation row);
        return whether one reached ``target_return``. The update's row gets no
        evaluation keys: an evaluation has its own row, at the step it measured."""
        every = self.cfg.eval_every
        due = bool(every) and self.report.updates_completed % every == 0
        if self.evaluator is None:
            finished = [self.evaluate(policy)] if due else []
        else:
            if due:
                tag, weights = self._snapshot_tag(), export_weights(policy)
                self.evaluator.submit(tag, weights)
                self._submitted[tag] = (self.report.last_policy_version, weights)
            finished = [self._add_background_result(*done) for done in self.evaluator.results()]
        return any(r["mean_return"] >= self.cfg.target_return for r in finished)

    def evaluates_here(self) -> bool:
        """Whether :meth:`maybe_evaluate` runs an evaluation in this process now (no
        background evaluator, and one is due): the learner then serves its actors on a
        thread meanwhile, however long the evaluation takes."""
        every = self.cfg.eval_every
        return self.evaluator is None and bool(every) and self.report.updates_completed % every == 0

    def final_evaluation(self, policy: Policy | list[Policy]) -> None:
        """At the end of a run that spent its budget (or reached its target), after the
        actors were told to shut down: collect the background evaluation still running
        (:meth:`finish_background`) and evaluate the final policy unless the newest
        evaluation is of it. Nobody waits on the learner meanwhile: before, its actors
        waited for both (minutes on a busy host) and gave up (``learner_timeout``)."""
        self.finish_background()
        if not self.evaluated_last_update():
            self.evaluate(policy)

    def finish_background(self, timeout: float = BACKGROUND_FINISH_S) -> None:
        """At the end of the run: collect the evaluation still running (up to
        ``timeout`` seconds; a snapshot still waiting for its turn is dropped, the
        final policy is evaluated anyway) and stop the evaluator process."""
        if self.evaluator is None:
            return
        self.evaluator.drop_waiting()
        deadline = time.monotonic() + timeout
        while self.evaluator.busy() and time.monotonic() < deadline:
            for done in self.evaluator.results(timeout=min(1.0, deadline - time.monotonic())):
                self._add_background_result(*done)
        self.evaluator.close()
        self.evaluator = None

    def abandon_unreported(self) -> None:
        """At the end of the run: count the snapshots submitted and never reported as
        ``evaluation/skipped`` (the run ended while one waited or ran) and forget them."""
        if self._submitted:
            self.counters["evaluation/skipped"] += len(self._submitted)
            self._submitted.clear()

    def evaluated_last_update(self) -> bool:
        """Whether the newest evaluation is of the newest update."""
        evaluations = self.report.evaluations
        return bool(evaluations) and evaluations[-1]["updates"] == self.report.updates_completed

    def updates_total(self) -> int:
        """The updates the budget buys, for the progress line: :attr:`updates_budget`
        until an update is done, then the updates done plus those the rest of the budget
        buys at this session's mean env steps per update
        (:func:`~zmq_rl.learner.metrics.updates_total`, as the progress bar's)."""
        report = self.report
        total = updates_total(
            report.updates_completed,
            report.env_steps_consumed,
            self.cfg.total_env_steps,
            report.updates_completed - self.updates_at_start,
            report.env_steps_consumed - self.steps_at_start,
        )
        return self.updates_budget if total is None else total

    def record(self, metrics: dict[str, float], version: int, actors: int) -> None:
        """Write the update's row (metrics.jsonl, ``on_update``) and the progress line."""
        elapsed = self.elapsed()
        report = self.report
        row = {
            "update": report.updates_completed,
            "env_steps": report.env_steps_consumed,
            "wall_seconds": elapsed,
            "version": version,
            "charts/SPS": (report.env_steps_consumed - self.steps_at_start) / max(elapsed, 1e-9),
            "charts/episodes": report.episodes_completed,
            "charts/actors": actors,
            **metrics,
        }
        if report.episodes_completed:  # before any episode ended there is no return: no key
            row["charts/mean_return"] = report.mean_recent_episode_reward(100)
        if self._metrics is not None:
            self._metrics.write(row)
        if self.on_update is not None:
            self.on_update(row)
        log.info(
            "update %d/%d  steps %d  %.0f steps/s  return %s%s  actors %d  lag %.2f  "
            "loss %.3f  entropy %.3f  device %s",
            report.updates_completed,
            self.updates_total(),
            report.env_steps_consumed,
            row["charts/SPS"],
            f"{row['charts/mean_return']:.1f}" if report.episodes_completed else "-",
            policy_returns_text(metrics),
            actors,
            metrics["charts/policy_lag_mean"],
            metrics.get("losses/policy_loss", math.nan),
            metrics.get("losses/entropy", math.nan),
            report.device or "cpu",
        )

    def close(self) -> None:
        """Close metrics.jsonl and stop the evaluator process."""
        if self._metrics is not None:
            self._metrics.close()
        if self.evaluator is not None:
            self.evaluator.close()
            self.evaluator = None
