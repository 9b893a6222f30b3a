"""A learner rank other than rank 0 (``num_learners > 1``): receive this rank's
actors' fragments, train in lockstep with the others, hold the identical policy.

It runs the rounds of :class:`zmq_rl.learner._Ranks` in the same order: plan
(broadcast from rank 0) → fill this rank's member slots → report (all-gather) →
the update with its gradient all-reduce, when every rank may. After the stop plan it
waits for the final plan (the actors' byes), reads what is still in flight from its
actors, and sends its totals. It binds only its experience port; rank 0 does control,
weights, evaluation, checkpoints and the report.
"""

from __future__ import annotations

import logging
import signal
import time
from collections import Counter
from typing import Any

import torch

from .config import LearnerConfig, PolicyConfig, PPOConfig, replace
from .distributed import Collective, RankSpec, is_collective_failure, parameter_digest
from .envs import make_env
from .ingest import POLL_MS, SHUTDOWN_GRACE_S, Ingest
from .learner import run_settings
from .report import LearnerReport
from .trainer import Trainer

__all__ = ["run_learner_rank"]

log = logging.getLogger(__name__)


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
            rows = sum(r["rows"] for r in reports)
            if any(r["stop"] for r in reports) or rows == 0:
                continue
            if plan["updates"] > 0 and plan["consumed"] + rows > cfg.total_env_steps:
                continue
            rollout = ingest.queues.take(slots, cfg.num_steps) if slots else None
            if rollout is not None:
                for actor_id, _ in rollout.slots:
                    ingest.members.get(actor_id).steps_consumed += rollout.num_steps
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
