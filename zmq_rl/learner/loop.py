"""The learner's loop: fill, train, broadcast, evaluate, checkpoint, shut down.

One loop on the main thread (the sockets are served by a thread of the ingest while
an update or an evaluation runs, :meth:`~zmq_rl.learner.ingest.Ingest.serve_during`):

1. **Fill**: poll PULL (fragments) and ROUTER (hello, heartbeat, bye) until the next
   update's rows are queued (:mod:`zmq_rl.learner.batches`): a fixed batch of the
   oldest complete segments of whichever slots delivered (``batch_mode`` ``rows``), or
   ``num_steps`` rows of every member slot (``slots``). Rows beyond stay queued.
2. **Train**: take the ``[num_steps, columns]`` rollout and hand it to the trainer
   (:class:`~zmq_rl.rl.trainer.PolicyTraining`: targets, PPO update).
3. **Broadcast**: every ``broadcast_every`` updates, version += 1 and PUBlish the
   weights; actors that registered during the last cycle become members now.

The run ends when the env-step budget is spent (or an evaluation reaches
``target_return``); then every actor is told to shut down and its ``bye`` (with its
stats) is collected for the report, and only then does the final evaluation run
(no actor waits on the learner meanwhile). RL lives in the trainer; the sockets, the
membership and the slot queues live in the :class:`~zmq_rl.learner.ingest.Ingest`.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import zmq

from ..config import LearnerConfig, PolicyConfig, PPOConfig
from ..envs import env_shape
from ..rl.distributed import LearnerRankLost, RankSpec, rank_spec
from ..rl.policy import Policy
from ..rl.policy_set import build_trainer
from ..rl.trainer import PolicyTraining
from ..wire.protocol import Weights, encode
from .batches import make_batches, overruns
from .checkpoint import (
    checkpoint_configs,
    newest_readable_checkpoint,
    restore_run_state,
)
from .ingest import POLL_MS, Ingest
from .outputs import BEST_POLICY_FILE, RunFiles
from .queues import SlotQueues
from .report import BUDGET_SPENT, TARGET_REACHED, LearnerReport
from .runlog import RunLog
from .self_play import self_play_table
from .settings import (
    LearnerStarved,
    StopRequested,
    batch_plan,
    check_env_settings,
    policy_plan,
    run_settings,
)
from .silence import Patience

if TYPE_CHECKING:
    from ..wire.transport import LearnerSockets
    from .ranks import LeaderRanks

__all__ = [
    "Learner",
    "LearnerRankLost",
    "LearnerReport",
    "LearnerStarved",
    "StopRequested",
    "run_settings",
]

log = logging.getLogger("zmq_rl.learner")


class Learner:
    """Runs the loop: receives through its :attr:`ingest` (which holds the sockets, the
    membership and the slot queues) and trains through its :attr:`trainer`, the only
    RL object it holds."""

    learner_restarts: list[dict[str, Any]] | None = None
    """None: a learner is not resumed after a crash by itself (a run's ResumingLearner
    lists its restarts; :class:`~zmq_rl.run.fleet.FleetLearner`)."""

    def __init__(
        self,
        cfg: LearnerConfig,
        ppo: PPOConfig | None = None,
        policy_cfg: PolicyConfig | None = None,
        context: zmq.Context | None = None,
        on_update: Callable[[dict[str, Any]], None] | None = None,
        on_evaluation: Callable[[dict[str, Any]], None] | None = None,
        *,
        sockets: LearnerSockets | None = None,
    ) -> None:
        """Bind the sockets and build the trainer; ``on_update(row)`` is called after
        every update with the metrics row (for progress displays), and
        ``on_evaluation(row)`` with every evaluation's row when its result is known
        (:func:`~zmq_rl.learner.runlog.evaluation_row`: at the env step it measured).
        ``sockets``: bound already by :func:`~zmq_rl.learner.ingest.bind_ingest_sockets`
        for this config (``zmq-rl run`` binds before importing torch); the learner owns
        them from here on (ValueError when their message limits are another run's)."""
        self.cfg = cfg.validate()
        self.ppo_cfg = (ppo or PPOConfig()).validate()
        self.policy_cfg = (policy_cfg or PolicyConfig()).validate()
        shape = env_shape(cfg.env_id, cfg.env_kwargs_map(), cfg.wrappers)
        spaces = (shape.observation_space, shape.action_space)
        check_env_settings(cfg, shape, *spaces)  # zmq-rl run checked before binding too
        self.plan = policy_plan(cfg, self.policy_cfg, shape)
        self.plan_agents = list(shape.agents)
        self.trainer: PolicyTraining = build_trainer(
            cfg, self.ppo_cfg, self.policy_cfg, spaces, self.plan.configs, self.plan.agent_policies
        )
        state_size = int(getattr(self.trainer.policy, "state_size", 0))
        self.batch_plan = batch_plan(cfg, shape.agents_per_env, recurrent=state_size > 0)
        self.run_id = uuid.uuid4().hex[:12]
        self.settings = run_settings(
            cfg,
            *spaces,
            self.policy_cfg,
            weights_bytes=max(len(encode(w)) for w in self._weights()),
            state_size=state_size,
            agents_per_env=shape.agents_per_env,
            plan=self.plan,
            batch=self.batch_plan,
        )
        self.report = LearnerReport(run_id=self.run_id, device=str(self.trainer.device))
        self.counters: Counter[str] = Counter()
        self._stop_reason = ""
        if self.plan.several and cfg.eval_in_background:
            # The background evaluator runs one network; several evaluate in the loop.
            log.info("several policies: evaluations run in the learner's loop")
            cfg = replace(cfg, eval_in_background=False)
        self.runlog = RunLog(cfg, self.report, on_update, self.policy_cfg, on_evaluation)
        self.runlog.updates_budget = self.batch_plan.updates(cfg, shape.agents_per_env)
        self.runlog.agent_policies = list(self.plan.agent_policies)
        self.runlog.counters = self.counters
        # Data-parallel learner ranks (num_learners > 1): this is rank 0; the others
        # are started (or joined, under torchrun) when the run starts.
        self.spec: RankSpec | None = rank_spec(cfg.num_learners, cfg.host, cfg.rendezvous_port())
        self.ranks: LeaderRanks | None = None
        if self.spec is not None:
            from .ranks import LeaderRanks

            self.ranks = LeaderRanks(
                self,
                stop_reason=lambda: self._stop_reason,
                budget_spent=self._budget_spent,
                broadcast=self._broadcast,
            )
        self.ingest = Ingest(
            cfg,
            self.settings,
            run_id=self.run_id,
            report=self.report,
            counters=self.counters,
            version=lambda: self.trainer.version,
            forget_slots=self.trainer.forget_slots,
            context=context,
            world_size=cfg.num_learners,
            ranks=None if self.ranks is None else self.ranks.routing,
            sockets=sockets,
        )
        self.members = self.ingest.members
        self.batches = make_batches(
            self.ingest, self.batch_plan, self._broadcast, agents=bool(self.plan_agents)
        )
        self.on_checkpoint: Callable[[Path], None] | None = None
        """Called with the path of every checkpoint written (the Python API's callbacks)."""
        self.files = RunFiles(
            (self.cfg, self.ppo_cfg, self.policy_cfg),
            self.plan,
            self.trainer,
            self.report,
            self.counters,
            queues=lambda: self.queues,
            saved=lambda path: self.on_checkpoint and self.on_checkpoint(path),
        )
        self.publish_weights(publish=False)

    @property
    def policy(self) -> Policy:
        """The trainer's policy (what is broadcast)."""
        return self.trainer.policy

    @property
    def eval_policy(self) -> Policy | list[Policy]:
        """What evaluations act with: the policy, or (several policies) the policy of
        each agent index."""
        return self.trainer.eval_policy()

    @property
    def version(self) -> int:
        """The newest policy version (the number of broadcasts so far)."""
        return self.trainer.version

    @version.setter
    def version(self, value: int) -> None:
        self.trainer.version = value

    @property
    def on_update(self) -> Callable[[dict[str, Any]], None] | None:
        """The hook called with every update's metrics row (:attr:`RunLog.on_update`)."""
        return self.runlog.on_update

    @property
    def on_evaluation(self) -> Callable[[dict[str, Any]], None] | None:
        """The hook called with every evaluation's row (:attr:`RunLog.on_evaluation`)."""
        return self.runlog.on_evaluation

    @property
    def queues(self) -> SlotQueues:
        """The per-slot queues of received rows (:attr:`Ingest.queues`)."""
        return self.ingest.queues

    def close(self) -> None:
        """Close every socket (linger 0) and the metrics file; stop the other learner
        ranks this learner started."""
        if getattr(self, "ranks", None) is not None:
            self.ranks.close()
        if getattr(self, "ingest", None) is not None:
            self.ingest.close()
        if getattr(self, "runlog", None) is not None:
            self.runlog.close()

    def __enter__(self) -> Learner:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ the run

    def run(self) -> LearnerReport:
        """Train until the budget is spent (or a stop is requested); shut the actors
        down; then (a run that ended by its budget or target) the final evaluation;
        write the final checkpoint and report; return the report."""
        cfg, runlog = self.cfg, self.runlog
        runlog.restart_clock()
        stop_reason, final = BUDGET_SPENT, False
        lost: LearnerRankLost | None = None
        try:
            if self.ranks is not None:
                self.ranks.start()
            # Now, not at the first evaluation: its imports are then done by the first
            # evaluation instead of delaying it (docs/benchmarks.md §23).
            runlog.start_evaluator()
            self.wait_for_actors(runlog.start)
            while self.ranks is not None or not self._budget_spent():
                metrics = self._one_update() if self.ranks is None else self.ranks.update()
                if metrics is None:
                    break
                solved = self.ingest.serve_during(  # an evaluation here: actors are answered
                    lambda: runlog.maybe_evaluate(self.eval_policy), runlog.evaluates_here() or None
                )
                metrics.update(self.ingest.links.stats(self.members))  # round trips, valve shares
                runlog.record(metrics, self.version, sum(1 for r in self.members if r.member))
                if (
                    cfg.checkpoint_every
                    and self.report.updates_completed % cfg.checkpoint_every == 0
                ):
                    self.files.periodic_checkpoint()
                if solved:
                    stop_reason = f"{TARGET_REACHED} {cfg.target_return:g}"
                    log.info("stopping: %s (at update %d)", stop_reason, self.version)
                    break
                if self._stop_reason:
                    raise StopRequested(self._stop_reason)
            final = True  # the final evaluation, after the actors were let go
        except StopRequested as stop:  # asked for (Ctrl-C, a callback): not a warning,
            stop_reason = str(stop)  # which Python prints even with logging unconfigured
            log.info("stopping: %s", stop_reason)
        except LearnerRankLost as exc:
            lost, stop_reason = exc, str(exc)
            log.error("stopping: %s", stop_reason)
        if self.ranks is not None:
            stop_reason = self.ranks.stop(stop_reason)
        self.report.stop_reason = stop_reason
        self.shutdown_actors(stop_reason)
        if self.ranks is not None:
            self.ranks.collect()
        if final:  # no actor waits on the learner now, however long it takes
            runlog.final_evaluation(self.eval_policy)
        self.report.wall_seconds = runlog.elapsed()
        self._finish()
        if lost is not None:
            raise lost
        return self.report

    def request_stop(self, reason: str) -> None:
        """Ask the run to end soon (safe from a signal handler): the current wait or
        update finishes, actors are shut down, a checkpoint and report are written."""
        self._stop_reason = reason

    def _check_stop(self) -> None:
        if self._stop_reason:
            raise StopRequested(self._stop_reason)

    def _budget_spent(self) -> bool:
        """No update that would overrun ``total_env_steps`` starts (but at least one
        update runs). A rows batch ends at the budget's last env step (valid row), so
        a run of rows batches spends it exactly, multi-agent or not; every slot's
        rollout is whole, so such a run ends before the first one that would overrun
        (known after its fill when some rows may not be env steps)."""
        return self._overruns(self.batches.least_steps_next())

    def _overruns(self, steps: int) -> bool:
        """:func:`~zmq_rl.learner.batches.overruns` of this run's budget."""
        return overruns(self.report, self.cfg.total_env_steps, steps)

    def _one_update(self) -> dict[str, float] | None:
        """Fill, take the rollout, train on it, maybe broadcast; None (no update) when
        the filled rollout would overrun the budget."""
        cfg, report = self.cfg, self.report
        self._fill()
        if self._overruns(self.batches.steps_next()):
            return None  # too big: members that delivered during the fill, or env steps
        rollout = self.batches.take()
        progress = min(1.0, report.env_steps_consumed / cfg.total_env_steps)
        started = time.monotonic()
        result = self.ingest.serve_during(lambda: self.trainer.update(rollout, progress))
        result.metrics.update(rollout.composition())
        result.metrics["time/update_seconds"] = time.monotonic() - started
        report.add_episodes(result.episode_returns)
        report.env_steps_consumed += rollout.env_steps  # rows of live agents only
        report.updates_completed += 1
        if report.updates_completed % cfg.broadcast_every == 0:
            self._broadcast()
        report.final_stats = result.metrics
        return result.metrics

    def _broadcast(self) -> None:
        """Publish the next version; actors waiting to join become members."""
        self.trainer.next_version()
        self.publish_weights()
        for rec in self.ingest.admit_pending():
            log.info("actor %d joins the rollout at version %d", rec.actor_id, self.version)

    def wait_for_actors(self, start: float) -> None:
        """Serve control until ``num_actors`` actors registered (LearnerStarved after
        ``starvation_timeout`` seconds from ``start``)."""
        cfg = self.cfg
        log.info("waiting for %d actor(s) to register", cfg.num_actors)
        while self.members.live_count() < cfg.num_actors:
            self._check_stop()
            if time.monotonic() - start > cfg.starvation_timeout:
                raise LearnerStarved(
                    f"only {self.members.live_count()} of num_actors={cfg.num_actors} actors "
                    f"registered within starvation_timeout={cfg.starvation_timeout}s"
                )
            self.pump(POLL_MS)
        self.ingest.started = True
        log.info("%d actor(s) registered; training starts", len(self.members))

    def _fill(self) -> None:
        """Receive until the next update's rows are queued (:meth:`Batches.ready
        <zmq_rl.learner.batches.Batches.ready>`)."""
        cfg = self.cfg  # patience: starved when no rows arrive, however slow the fill
        patience = Patience(cfg.starvation_timeout, lambda: self.counters["received/steps"])
        self.pump(0)  # control and heartbeats are served even when data is backlogged
        while True:
            if self.batches.ready(cfg.total_env_steps - self.report.env_steps_consumed):
                return
            self._check_stop()
            if patience.spent():
                raise self.starved(self.batches.waited_on())
            self.pump(POLL_MS)

    def starved(self, short: list[Any]) -> LearnerStarved:
        """The error of a fill that made no progress for ``starvation_timeout``: it
        names the actors owning the ``short`` slots it waited on."""
        waiting = self.members.describe_waiting(short, self.report.dead_actors)
        return LearnerStarved(
            f"learner starved: no rollout completed, no rows arrived for "
            f"starvation_timeout={self.cfg.starvation_timeout}s; waiting on {waiting}"
        )

    # ------------------------------------------------------------------ weights

    def publish_weights(self, publish: bool = True) -> None:
        """Snapshot the trainer's weights as the current version (what welcomes
        carry) and, with ``publish``, send them on PUB."""
        self.ingest.publish(self._weights(), send=publish)

    def _weights(self) -> list[Weights]:
        """The current version's weights: one, or one per policy (each with its id)."""
        return [
            Weights(version=self.version, run_id=self.run_id, tensors=t, policy=pid)
            for pid, t in self.trainer.policy_weights().items()
        ]

    @property
    def current_weights(self) -> Weights:
        """The weights of the current version, as broadcast and sent in welcomes."""
        assert self.ingest.current_weights is not None
        return self.ingest.current_weights

    def pump(self, timeout_ms: int) -> None:
        """Serve both receiving sockets for up to ``timeout_ms`` (:meth:`Ingest.pump`)."""
        self.ingest.pump(timeout_ms)

    def actor_exited(self, pid: int) -> None:
        """Tell the learner that the actor process ``pid`` on this host exited (a
        supervisor saw it): it is declared dead at once (:meth:`Ingest.actor_exited`)."""
        self.ingest.actor_exited(pid)

    def shutdown_actors(self, reason: str) -> None:
        """Tell every actor to stop and collect their byes (:meth:`Ingest.shutdown_actors`)."""
        self.ingest.shutdown_actors(reason)

    # ------------------------------------------------------------------ evaluation & output

    def _finish(self) -> None:
        report = self.report
        for rec in self.members:
            report.actor_stats[str(rec.actor_id)] = rec.summary()
        report.policies = self.trainer.summary(self.plan_agents)
        report.self_play = self_play_table(report.actor_stats)
        self.counters["consumed/steps"] = report.env_steps_consumed
        self.runlog.abandon_unreported()  # evaluations still pending: never reported
        self.ingest.discard_queued("run_ended")  # counted; the final checkpoint holds none
        report.counters = dict(self.counters)
        best = self.runlog.best
        if best is not None:
            file = BEST_POLICY_FILE if self.cfg.run_dir else ""
            report.best_evaluation = {**best.result, "version": best.version, "file": file}
        self.files.write_final(best)

    def checkpoint(self) -> Path | None:
        """Write a checkpoint into ``run_dir/checkpoints`` atomically (temp + rename);
        return its path (None without run_dir)."""
        return self.files.checkpoint()

    @classmethod
    def resume(
        cls,
        run_dir: str | Path,
        context: zmq.Context | None = None,
        on_update: Callable[[dict[str, Any]], None] | None = None,
        on_evaluation: Callable[[dict[str, Any]], None] | None = None,
        **learner_overrides: Any,
    ) -> Learner:
        """A learner continuing the newest checkpoint in ``run_dir``: same configs
        (``learner_overrides`` may change e.g. host, port or the budget), same
        policy, optimiser, counters and report; version numbering continues. A new
        run id tells the actors that the learner restarted, so they re-register."""
        path, state = newest_readable_checkpoint(run_dir)
        cfg, ppo, policy_cfg = checkpoint_configs(state, path, run_dir, **learner_overrides)
        learner = cls(
            cfg, ppo, policy_cfg, context=context, on_update=on_update, on_evaluation=on_evaluation
        )
        learner.trainer.load_state_dict(state)
        restore_run_state(state, learner.report, learner.counters)
        learner.report.resumed_from = str(path)
        learner.report.stop_reason = ""  # a final checkpoint's reason is not this run's
        learner.publish_weights(publish=False)
        log.info(
            "resumed %s at update %d, version %d, %d env steps consumed",
            path,
            learner.report.updates_completed,
            learner.version,
            learner.report.env_steps_consumed,
        )
        return learner
