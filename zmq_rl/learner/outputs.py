"""What a learner run writes: checkpoints during the run, and at its end the report,
the final policy, each policy of several, the best evaluated policy and the
self-play table. Every write is atomic (temp + rename, :mod:`zmq_rl.learner.checkpoint`).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import LearnerConfig, PolicyConfig, PPOConfig
from ..rl.trainer import PolicyTraining
from .checkpoint import WriteFailed, atomic_write_bytes, save_learner_checkpoint, save_policy
from .queues import SlotQueues
from .report import LearnerReport
from .self_play import write_self_play_csv
from .settings import PolicyPlan

__all__ = ["BEST_POLICY_FILE", "RunFiles"]

log = logging.getLogger("zmq_rl.learner")

BEST_POLICY_FILE = "policy-best.pt"
"""The best evaluated policy of a run (``report.json``'s ``best_evaluation``), beside
``policy.pt`` (the final one)."""


class RunFiles:
    """The files of one learner run in ``cfg.run_dir`` (nothing without one).

    ``queues()`` and ``version()`` read the learner's state when a checkpoint is written;
    ``saved(path)`` is told of every checkpoint written (the Python API's callbacks)."""

    def __init__(
        self,
        configs: tuple[LearnerConfig, PPOConfig, PolicyConfig],
        plan: PolicyPlan,
        trainer: PolicyTraining,
        report: LearnerReport,
        counters: Counter[str],
        *,
        queues: Callable[[], SlotQueues],
        saved: Callable[[Path], None],
    ) -> None:
        self.configs, self.cfg = configs, configs[0]
        self.plan, self.trainer, self.report, self.counters = plan, trainer, report, counters
        self.queues, self.saved = queues, saved

    def checkpoint(self) -> Path | None:
        """Write a checkpoint into ``run_dir/checkpoints`` atomically (temp + rename);
        return its path (None without run_dir)."""
        if not self.cfg.run_dir:
            return None
        queues = self.queues()
        path = save_learner_checkpoint(
            self.cfg.run_dir,
            self.trainer.state_dict(),
            self.configs,
            self.report,
            dict(self.counters),
            (queues.total_rows(), queues.total_fragments()),
        )
        log.info("checkpoint %s (version %d)", path, self.trainer.version)
        self.saved(path)
        return path

    def periodic_checkpoint(self) -> None:
        """A checkpoint during the run; one that cannot be written is a warning (the
        previous checkpoint is kept) and is tried again at the next interval."""
        try:
            self.checkpoint()
        except WriteFailed as exc:
            self.counters["checkpoint/failed"] += 1
            log.warning("%s; training goes on and tries again at the next checkpoint", exc)

    def save_policy(
        self,
        path: Path,
        tensors: dict[str, Any] | None = None,
        version: int | None = None,
        policy_cfg: PolicyConfig | None = None,
    ) -> None:
        """Save the policy (tensors + the config needed to rebuild it), atomically:
        the current one, or ``tensors`` (a ``state_dict`` of it) of ``version``
        (``policy_cfg``: its network, when it is one policy of several)."""
        joint = policy_cfg is None  # policy.pt of several policies names them all
        if joint and self.plan.several:
            policy_cfg = next(iter(self.plan.configs.values()))  # its tensors: the first's
        save_policy(
            path,
            self.trainer.policy if tensors is None else tensors,
            policy_cfg or self.configs[2],
            self.cfg.env_id,
            self.trainer.version if version is None else version,
            env_kwargs=self.cfg.env_kwargs_map(),
            wrappers=self.cfg.wrappers,
            agent_policies=self.plan.agent_policies if joint else None,
        )

    def write_final(self, best: Any | None) -> None:
        """The run's end: the final checkpoint, ``report.json``, ``policy.pt``, each
        policy's ``policy-<id>.pt``, ``self_play.csv`` and the ``best`` evaluated policy
        (a :class:`~zmq_rl.learner.runlog.RunLog` snapshot, or None). Each output is
        tried, so a failed checkpoint does not cost the policy; :class:`WriteFailed`
        afterwards names the first failure."""
        if not self.cfg.run_dir:
            return
        run_dir = Path(self.cfg.run_dir)
        writes = [
            self.checkpoint,
            lambda: atomic_write_bytes(run_dir / "report.json", self.report.to_json().encode()),
            lambda: self.save_policy(run_dir / "policy.pt"),
        ]
        if self.report.self_play:
            writes.append(
                lambda: write_self_play_csv(run_dir / "self_play.csv", self.report.self_play)
            )
        for pid, (tensors, policy_cfg) in self.trainer.policy_files().items():
            writes.append(
                lambda pid=pid, t=tensors, p=policy_cfg: self.save_policy(
                    run_dir / f"policy-{pid}.pt", t, policy_cfg=p
                )
            )
        if best is not None:
            writes.append(
                lambda: self.save_policy(
                    run_dir / BEST_POLICY_FILE, best.state_dict(), best.version
                )
            )
        failed = []
        for write in writes:
            try:
                write()
            except WriteFailed as exc:
                log.error("%s", exc)
                failed.append(str(exc))
        if failed:
            raise WriteFailed(f"the run ended but {len(failed)} output(s) failed: {failed[0]}")
