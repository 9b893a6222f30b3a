"""Data-parallel learner ranks (``num_learners > 1``): rank 0's coordinator
(:class:`LeaderRanks`, held by :class:`~zmq_rl.learner.loop.Learner`) and the loop of every
other rank (:func:`run_learner_rank`). docs/design.md §4.2 explains the design;
:mod:`zmq_rl.rl.distributed` has the collectives and the gradient all-reduce.

Every update is one *round*, the same collectives in the same order on every rank:
plan (broadcast from rank 0) → each rank fills its own member slots → report
(all-gather) → :func:`round_outcome` (the same decision on every rank, from the same
data) → the update with its gradient all-reduce. A rank other than 0 binds only its
experience port; rank 0 does control, weights, evaluation, checkpoints and the report.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

from ..config import LearnerConfig, PolicyConfig, PPOConfig, replace
from ..envs import make_env
from ..report import LearnerReport
from ..rl.distributed import (
    Collective,
    LearnerRankLost,
    RankSpec,
    is_collective_failure,
    parameter_digest,
)
from ..rl.trainer import Trainer
from .ingest import POLL_MS, SHUTDOWN_GRACE_S, Ingest
from .loop import Learner, LearnerStarved, StopRequested, run_settings

__all__ = ["LeaderRanks", "round_outcome", "run_learner_rank"]

log = logging.getLogger("zmq_rl.learner_ranks")


def round_outcome(
    reports: list[dict[str, Any]], updates: int, consumed: int, total_env_steps: int
) -> tuple[int, str]:
    """(rows of all ranks, what the round does): ``"stop"`` (a rank asked: the next
    plan says so), ``"idle"`` (no rank had a member slot), ``"budget"`` (the update
    would overrun ``total_env_steps``: the next plan stops), or ``"update"``. Every rank
    calls it with the same arguments, so every rank decides the same."""
    rows = sum(r["rows"] for r in reports)
    if any(r["stop"] for r in reports):
        return rows, "stop"
    if rows == 0:
        return rows, "idle"
    if updates > 0 and consumed + rows > total_env_steps:
        return rows, "budget"
    return rows, "update"


class LeaderRanks:
    """Rank 0's side: starts the other ranks, and runs each update's plan, report
    and gradient collectives in the same order as :func:`run_learner_rank`.
    Every collective runs inside :meth:`Ingest.serve_during`, so control, heartbeats
    and rank 0's fragments are served while the ranks wait for each other."""

    def __init__(self, learner: Learner) -> None:
        self.learner = learner
        self.spec = learner.spec
        self.collective: Collective | None = None
        self.procs: list[Any] = []
        self.digest = 0
        self.broken = False  # a collective failed: no rank is left to talk to
        self.stop_sent = ""
        self.budget_spent = False
        self.idle_since: float | None = None

    def start(self) -> None:
        """Start ranks 1..N-1 (unless torchrun did), join the process group, and make
        every rank's training state this one's."""
        learner, spec = self.learner, self.spec
        assert spec is not None
        if spec.init_method != "env://":
            ctx = multiprocessing.get_context("spawn")
            for rank in range(1, spec.world_size):
                proc = ctx.Process(
                    target=run_learner_rank,
                    args=(
                        RankSpec(rank, spec.world_size, spec.init_method),
                        learner.cfg,
                        learner.ppo_cfg,
                        learner.policy_cfg,
                        logging.getLogger().getEffectiveLevel(),
                    ),
                    name=f"zmq-rl-learner-rank-{rank}",
                    daemon=True,
                )
                proc.start()
                self.procs.append(proc)
        self.collective = learner.ingest.serve_during(lambda: Collective(spec))
        self._call(lambda c: c.broadcast({"run_id": learner.run_id}))
        learner.trainer.attach(self.collective)
        self._call(lambda c: learner.trainer.share_state())
        self.digest = parameter_digest(learner.policy)
        log.info("%d learner ranks train one policy", spec.world_size)

    def _call(self, work: Callable[[Collective], Any]) -> Any:
        """``work(collective)`` while the ingest serves the sockets; a broken
        collective becomes :class:`LearnerRankLost` naming the rank when it can."""
        assert self.collective is not None
        collective = self.collective
        try:
            return self.learner.ingest.serve_during(lambda: work(collective))
        except RuntimeError as exc:
            dead = [p for p in self.procs if not p.is_alive()]
            if not dead and not is_collective_failure(exc):
                raise
            self.broken = True
            for proc in dead:
                proc.join(timeout=1)
            who = (
                ", ".join(f"{p.name} (pid {p.pid}) exited with code {p.exitcode}" for p in dead)
                or str(exc).splitlines()[0][:300]
            )
            raise LearnerRankLost(
                f"a learner rank was lost: {who}; the run stops here (resume it with "
                "--resume RUN_DIR)"
            ) from exc

    def _plan(self, stop: str) -> dict[str, Any]:
        learner = self.learner
        return {
            "stop": stop,
            "version": learner.version,
            "updates": learner.report.updates_completed,
            "consumed": learner.report.env_steps_consumed,
            "actors": learner.ingest.plan_actors(),
        }

    def update(self) -> dict[str, float] | None:
        """One update of every rank (None: the ranks were told to stop)."""
        while True:
            done, metrics = self._round()
            if done:
                return metrics

    def _round(self) -> tuple[bool, dict[str, float] | None]:
        """Plan, fill, report and (when every rank may) update; (False, None) when
        the round ended without an update (no rows anywhere, a stop or the budget
        coming: the next plan says so)."""
        learner = self.learner
        cfg, report, ingest = learner.cfg, learner.report, learner.ingest
        stop = learner._stop_reason or ("budget spent" if self.budget_spent else "")
        if not stop and learner._budget_spent():
            stop = "budget spent"
        plan = self._plan(stop)
        self._call(lambda c: c.broadcast(plan))
        if stop:
            self.stop_sent = stop
            if learner._stop_reason:
                raise StopRequested(stop)
            return True, None
        slots = self._fill()
        mine = {"rows": cfg.num_steps * len(slots), "stop": bool(learner._stop_reason)}
        mine["digest"] = self.digest
        reports = self._call(lambda c: c.all_gather(mine))
        for rank, other in enumerate(reports[1:], start=1):
            if other["digest"] != self.digest:
                raise RuntimeError(
                    f"learner rank {rank} holds other parameters than rank 0 after update "
                    f"{report.updates_completed} (digest {other['digest']:#x} != "
                    f"{self.digest:#x}): the ranks diverged"
                )
            ingest.apply_rank_report(other)
            report.add_episodes(other["returns"])
        rows, outcome = round_outcome(
            reports, report.updates_completed, report.env_steps_consumed, cfg.total_env_steps
        )
        if outcome == "idle":
            self._idle()
        else:
            self.idle_since = None
        self.budget_spent = self.budget_spent or outcome == "budget"
        if outcome != "update":
            return False, None
        rollout = ingest.take_rollout(slots, cfg.num_steps) if slots else None
        progress = min(1.0, report.env_steps_consumed / cfg.total_env_steps)
        result = self._call(lambda c: learner.trainer.update(rollout, progress))
        self.digest = parameter_digest(learner.policy)
        report.add_episodes(result.episode_returns)
        report.env_steps_consumed += rows
        report.updates_completed += 1
        if report.updates_completed % cfg.broadcast_every == 0:
            learner._broadcast()
        report.final_stats = result.metrics
        result.metrics["learner/ranks"] = float(len(reports))
        result.metrics["learner/ranks_without_rows"] = float(sum(not r["rows"] for r in reports))
        return True, result.metrics

    def _fill(self) -> list[Any]:
        """Receive until rank 0's own member slots hold ``num_steps`` rows, or a stop
        is requested; return those slots (none when the stop came first)."""
        learner = self.learner
        cfg = learner.cfg
        deadline = time.monotonic() + cfg.starvation_timeout
        learner.pump(0)
        while True:
            slots = learner.ingest.local_member_slots()
            if not slots or learner.queues.ready(slots, cfg.num_steps):
                return slots
            if learner._stop_reason:
                return []
            if time.monotonic() > deadline:
                raise learner.starved(slots)
            learner.pump(POLL_MS)

    def _idle(self) -> None:
        """No rank had a member slot: let waiting actors join (a fresh version), or
        wait a poll; LearnerStarved after ``starvation_timeout`` of this."""
        learner = self.learner
        now = time.monotonic()
        self.idle_since = self.idle_since or now
        if learner.ingest.can_admit():
            learner._broadcast()
        elif now - self.idle_since > learner.cfg.starvation_timeout:
            waiting = learner.members.describe_waiting([], learner.report.dead_actors)
            raise LearnerStarved(
                f"learner starved: no rank had an actor for starvation_timeout="
                f"{learner.cfg.starvation_timeout}s; {waiting}"
            )
        else:
            learner.pump(POLL_MS)

    def stop(self, reason: str) -> str:
        """Tell the other ranks that the run ends (unless the last plan did); return
        the run's stop reason."""
        if not self.stop_sent and self.collective is not None and not self.broken:
            plan = self._plan(reason)
            self._call(lambda c: c.broadcast(plan))
            self.stop_sent = reason
        return self.stop_sent or reason

    def collect(self) -> None:
        """After the actors' byes: the final plan (who said bye with which last seq),
        then every rank's totals (per-actor counts, counters, the last episodes)."""
        learner = self.learner
        if self.collective is None or self.broken:
            self.close()
            return
        final = {"actors": learner.ingest.plan_actors(), "version": learner.version}
        self._call(lambda c: c.broadcast(final))
        reports = self._call(lambda c: c.all_gather({"rows": 0}))
        for other in reports[1:]:
            learner.ingest.apply_rank_report(other)
            learner.report.add_episodes(other["returns"])
            for key, value in other["counters"].items():
                learner.counters[key] += value
        self.close()

    def close(self) -> None:
        """Leave the process group; wait (bounded) for the ranks this learner
        started, then kill any left."""
        if self.collective is not None:
            self.collective.close()
            self.collective = None
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():
                log.warning("learner rank process %d did not exit; killing it", proc.pid)
                proc.kill()
                proc.join(timeout=5)
        self.procs = []


def run_learner_rank(
    spec: RankSpec,
    cfg: LearnerConfig,
    ppo: PPOConfig,
    policy_cfg: PolicyConfig,
    log_level: int = logging.INFO,
) -> int:
    """Run learner rank ``spec.rank`` until rank 0 ends the run; return 0 (1 when
    rank 0 went away mid-run).

    SIGINT is ignored: a Ctrl-C reaches the whole process group, and rank 0 ends the
    run for every rank (the stop plan); a rank that left early would fail the others'
    collectives instead."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=log_level,
            format=f"%(asctime)s %(levelname)s learner rank {spec.rank}: %(message)s",
        )
    if cfg.device in ("auto", "cuda") and torch.cuda.is_available():
        # One GPU per rank where there are several (rank 0 keeps its own setting).
        cfg = replace(cfg, device=f"cuda:{spec.rank % torch.cuda.device_count()}")
    probe = make_env(cfg.env_id, cfg.env_kwargs_map(), cfg.wrappers)
    spaces = (probe.observation_space, probe.action_space)
    probe.close()
    trainer = Trainer(cfg, ppo, policy_cfg, *spaces)
    collective = Collective(spec)
    try:
        start = collective.broadcast()
        report = LearnerReport(run_id=start["run_id"], device=str(trainer.device))
        counters: Counter[str] = Counter()
        ingest = Ingest(
            cfg,
            run_settings(cfg, *spaces, policy_cfg),
            run_id=start["run_id"],
            report=report,
            counters=counters,
            version=lambda: trainer.version,
            forget_slots=trainer.forget_slots,
            rank=spec.rank,
            world_size=spec.world_size,
        )
        try:
            _Rounds(cfg, trainer, collective, ingest).run()
        finally:
            ingest.close()
    except RuntimeError as exc:
        if not is_collective_failure(exc):
            raise
        log.error("rank 0 is gone (it ended on an error or was killed): %s", str(exc)[:300])
        return 1
    finally:
        collective.close()
    return 0


class _Rounds:
    def __init__(
        self, cfg: LearnerConfig, trainer: Trainer, collective: Collective, ingest: Ingest
    ) -> None:
        self.cfg, self.trainer, self.collective, self.ingest = cfg, trainer, collective, ingest
        self.returns: list[float] = []  # of the last update, sent with the next report

    def run(self) -> None:
        trainer, collective, ingest, cfg = self.trainer, self.collective, self.ingest, self.cfg
        trainer.attach(collective)
        trainer.share_state()
        digest = parameter_digest(trainer.policy)
        while True:
            plan = collective.broadcast()
            trainer.version = plan["version"]
            if plan["stop"]:
                log.info("rank 0 ends the run: %s", plan["stop"])
                break
            ingest.apply_plan(plan["actors"])
            slots = self._fill()
            mine = {"rows": cfg.num_steps * len(slots), "stop": False, "digest": digest}
            reports = collective.all_gather({**mine, **self._report()})
            _, outcome = round_outcome(
                reports, plan["updates"], plan["consumed"], cfg.total_env_steps
            )
            if outcome != "update":
                continue
            rollout = ingest.take_rollout(slots, cfg.num_steps) if slots else None
            progress = min(1.0, plan["consumed"] / cfg.total_env_steps)
            self.returns = trainer.update(rollout, progress).episode_returns
            digest = parameter_digest(trainer.policy)
        self._finish()

    def _report(self) -> dict[str, Any]:
        returns, self.returns = self.returns, []
        return {"returns": returns, **self.ingest.rank_report()}

    def _fill(self) -> list[Any]:
        """Receive until this rank's member slots hold ``num_steps`` rows each; a
        member that sends nothing while waited on for ``actor_timeout`` is declared
        dead (and leaves the slots), so this ends."""
        ingest, need = self.ingest, self.cfg.num_steps
        while True:
            slots = ingest.local_member_slots()
            if not slots or ingest.queues.ready(slots, need):
                return slots
            ingest.pump(POLL_MS)

    def _finish(self) -> None:
        """The final plan (byes with last seqs), the fragments still in flight
        (bounded by :data:`SHUTDOWN_GRACE_S`), then this rank's totals."""
        ingest = self.ingest
        final = self.collective.broadcast()
        self.trainer.version = final["version"]  # rank 0 may have broadcast once more
        ingest.shutting_down = True
        ingest.apply_plan(final["actors"])
        deadline = time.monotonic() + SHUTDOWN_GRACE_S
        while time.monotonic() < deadline and not all(r.caught_up() for r in ingest.members):
            ingest.pump(POLL_MS)
        ingest.discard_queued("run_ended")
        self.collective.all_gather({**self._report(), "counters": dict(ingest.counters)})
