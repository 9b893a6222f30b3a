"""The learner's loop: fill, train, broadcast, evaluate, checkpoint, shut down.

One loop on the main thread (the sockets are served by a thread of the ingest while
an update or an evaluation runs, :meth:`~zmq_rl.learner.ingest.Ingest.serve_during`):

1. **Fill**: poll PULL (fragments) and ROUTER (hello, heartbeat, bye) until every
   member slot holds ``num_steps`` rows. Rows beyond the quota stay queued.
2. **Train**: take the ``[num_steps, slots]`` rollout and hand it to the
   :class:`~zmq_rl.rl.trainer.Trainer` (targets, PPO update).
3. **Broadcast**: every ``broadcast_every`` updates, version += 1 and PUBlish the
   weights; actors that registered during the last cycle become members now.

The run ends when the env-step budget is spent (or an evaluation reaches
``target_return``); then every actor is told to shut down and its ``bye`` (with its
stats) is collected for the report. RL lives in the trainer; the sockets, the
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

from ..config import ConfigError, LearnerConfig, PolicyConfig, PPOConfig
from ..envs import env_shape
from ..rl.distributed import LearnerRankLost, RankSpec, rank_spec
from ..rl.policy import Policy
from ..rl.policy_set import PolicyTrainers
from ..rl.rollout import SlotQueues
from ..rl.trainer import Trainer
from ..wire.protocol import Weights, encode
from .checkpoint import (
    WriteFailed,
    atomic_write_bytes,
    checkpoint_configs,
    newest_readable_checkpoint,
    restore_run_state,
    save_learner_checkpoint,
    save_policy,
)
from .evaluation import opponent_player
from .ingest import POLL_MS, Ingest
from .report import LearnerReport
from .runlog import RunLog
from .self_play import self_play_table, write_self_play_csv
from .settings import LearnerStarved, StopRequested, policy_plan, run_settings

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

BEST_POLICY_FILE = "policy-best.pt"
"""The best evaluated policy of a run (``report.json``'s ``best_evaluation``), beside
``policy.pt`` (the final one)."""


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
        if cfg.opponent_pool and not shape.turn_based:
            raise ConfigError(
                "opponent_pool",
                cfg.opponent_pool,
                f"{cfg.env_id} is not a turn-based game: snapshot opponents play turn-based "
                "games only (0 turns the pool off)",
            )
        if cfg.opening_moves and not shape.turn_based:
            raise ConfigError(
                "opening_moves",
                cfg.opening_moves,
                f"{cfg.env_id} is not a turn-based game: random openings are for turn-based "
                "games only (0 turns them off)",
            )
        if cfg.eval_opponent != "random":
            if not shape.turn_based:
                raise ConfigError(
                    "eval_opponent",
                    cfg.eval_opponent,
                    f"{cfg.env_id} is not a turn-based game: only those have other seats",
                )
            opponent_player(cfg.eval_opponent, *spaces)  # fails here, naming the field
        if shape.agents_per_env > 1 and cfg.num_learners > 1:
            raise ConfigError(
                "num_learners",
                cfg.num_learners,
                f"{cfg.env_id} is a multi-agent env: it trains on one learner rank for now "
                "(the ranks' reports count every row as an env step)",
            )
        self.plan = policy_plan(cfg, self.policy_cfg, shape)
        self.plan_agents = list(shape.agents)
        self.trainer: Trainer | PolicyTrainers
        if self.plan.several:
            self.trainer = PolicyTrainers(
                cfg, self.ppo_cfg, self.plan.configs, *spaces, self.plan.agent_policies
            )
        else:
            self.trainer = Trainer(cfg, self.ppo_cfg, self.policy_cfg, *spaces)
        self.run_id = uuid.uuid4().hex[:12]
        self.settings = run_settings(
            cfg,
            *spaces,
            self.policy_cfg,
            weights_bytes=max(len(encode(w)) for w in self._weights()),
            state_size=int(getattr(self.trainer.policy, "state_size", 0)),
            agents_per_env=shape.agents_per_env,
            plan=self.plan,
        )
        self.report = LearnerReport(run_id=self.run_id, device=str(self.trainer.device))
        self.counters: Counter[str] = Counter()
        self._stop_reason = ""
        if self.plan.several and cfg.eval_in_background:
            # The background evaluator runs one network; several evaluate in the loop.
            log.info("several policies: evaluations run in the learner's loop")
            cfg = replace(cfg, eval_in_background=False)
        self.runlog = RunLog(cfg, self.report, on_update, self.policy_cfg, on_evaluation)
        self.runlog.updates_budget = cfg.num_updates(shape.agents_per_env)
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
        self.on_checkpoint: Callable[[Path], None] | None = None
        """Called with the path of every checkpoint written (the Python API's callbacks)."""
        self.publish_weights(publish=False)

    @property
    def policy(self) -> Policy:
        """The trainer's policy (what is broadcast)."""
        return self.trainer.policy

    @property
    def eval_policy(self) -> Policy | list[Policy]:
        """What evaluations act with: the policy, or (several policies) the policy of
        each agent index."""
        if isinstance(self.trainer, PolicyTrainers):
            trainers = self.trainer.trainers
            return [trainers[pid].policy for pid in self.plan.agent_policies]
        return self.trainer.policy

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
        down; write the final checkpoint and report; return the report."""
        cfg, runlog = self.cfg, self.runlog
        runlog.restart_clock()
        stop_reason = "budget spent"
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
                solved = self.ingest.serve_during(lambda: runlog.maybe_evaluate(self.eval_policy))
                metrics.update(self.ingest.links.stats(self.members))  # round trips, valve shares
                runlog.record(metrics, self.version, sum(1 for r in self.members if r.member))
                if (
                    cfg.checkpoint_every
                    and self.report.updates_completed % cfg.checkpoint_every == 0
                ):
                    self._periodic_checkpoint()
                if solved:
                    stop_reason = f"evaluation reached target_return {cfg.target_return:g}"
                    break
                if self._stop_reason:
                    raise StopRequested(self._stop_reason)
            # The actors are still connected: their heartbeats are served meanwhile.
            self.ingest.serve_during(runlog.finish_background)
            if not runlog.evaluated_last_update():
                self.ingest.serve_during(lambda: runlog.evaluate(self.eval_policy))
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
        update runs). Only members that have delivered experience count: a
        registration alone (a hello with many slots) never ends the run; if such a
        member does deliver, the check after the fill counts it."""
        delivering = [
            k for k in self.members.member_slots() if self.members.get(k[0]).steps_received
        ]
        return self._overruns(len(delivering))

    def _overruns(self, slots: int) -> bool:
        rows = self.cfg.num_steps * max(1, slots)
        return self.report.updates_completed > 0 and (
            self.report.env_steps_consumed + rows > self.cfg.total_env_steps
        )

    def _one_update(self) -> dict[str, float] | None:
        """Fill, take the rollout, train on it, maybe broadcast; None (no update) when
        the filled rollout would overrun the budget."""
        cfg, report = self.cfg, self.report
        self._fill()
        if self._overruns(len(self.members.member_slots())):
            return None  # members that delivered during the fill made it too big
        rollout = self.ingest.take_rollout(self.members.member_slots(), cfg.num_steps)
        progress = min(1.0, report.env_steps_consumed / cfg.total_env_steps)
        started = time.monotonic()
        result = self.ingest.serve_during(lambda: self.trainer.update(rollout, progress))
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
        """Receive until every member slot holds ``num_steps`` rows."""
        cfg = self.cfg
        deadline = time.monotonic() + cfg.starvation_timeout
        self.pump(0)  # control and heartbeats are served even when data is backlogged
        while True:
            slots = self.members.member_slots()
            if slots and self.queues.ready(slots, cfg.num_steps):
                return
            if not slots and self.ingest.can_admit():
                # No member left: the waiting actors join now. A fresh version
                # (same weights) starts their accounting from here, so their
                # valve, which counts from base_version = version + 1, stays exact.
                self._broadcast()
            self._check_stop()
            if time.monotonic() > deadline:
                raise self.starved(slots)
            self.pump(POLL_MS)

    def starved(self, slots: list[Any]) -> LearnerStarved:
        """The error of a fill of ``slots`` that made no progress for
        ``starvation_timeout``: it names the actors it waited on."""
        short = self.queues.short_slots(slots, self.cfg.num_steps)
        waiting = self.members.describe_waiting(short, self.report.dead_actors)
        return LearnerStarved(
            f"learner starved: no rollout completed within "
            f"starvation_timeout={self.cfg.starvation_timeout}s; waiting on {waiting}"
        )

    # ------------------------------------------------------------------ weights

    def publish_weights(self, publish: bool = True) -> None:
        """Snapshot the trainer's weights as the current version (what welcomes
        carry) and, with ``publish``, send them on PUB."""
        self.ingest.publish(self._weights(), send=publish)

    def _weights(self) -> list[Weights]:
        """The current version's weights: one, or one per policy (each with its id)."""
        if isinstance(self.trainer, PolicyTrainers):
            return [
                Weights(version=self.version, run_id=self.run_id, tensors=t, policy=pid)
                for pid, t in self.trainer.policy_weights().items()
            ]
        return [Weights(version=self.version, run_id=self.run_id, tensors=self.trainer.weights())]

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
        for rec in self.members:
            self.report.actor_stats[str(rec.actor_id)] = rec.summary()
        if isinstance(self.trainer, PolicyTrainers):
            self.report.policies = self.trainer.summary()
            for pid, summary in self.report.policies.items():
                summary["agents"] = [
                    agent
                    for agent, p in zip(self.plan_agents, self.plan.agent_policies, strict=True)
                    if p == pid
                ]
        self.report.self_play = self_play_table(self.report.actor_stats)
        self.counters["consumed/steps"] = self.report.env_steps_consumed
        self.runlog.abandon_unreported()  # evaluations still pending: never reported
        self.ingest.discard_queued("run_ended")  # counted; the final checkpoint holds none
        self.report.counters = dict(self.counters)
        best = self.runlog.best
        if best is not None:
            self.report.best_evaluation = {
                **best.result,
                "version": best.version,
                "file": BEST_POLICY_FILE if self.cfg.run_dir else "",
            }
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
        if isinstance(self.trainer, PolicyTrainers):
            for pid, trainer in self.trainer.trainers.items():
                writes.append(
                    lambda pid=pid, trainer=trainer: self.save_policy(
                        run_dir / f"policy-{pid}.pt",
                        trainer.policy.state_dict(),
                        policy_cfg=self.plan.configs[pid],
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
            try:  # each output is tried: a failed checkpoint must not cost the policy
                write()
            except WriteFailed as exc:
                log.error("%s", exc)
                failed.append(str(exc))
        if failed:
            raise WriteFailed(f"the run ended but {len(failed)} output(s) failed: {failed[0]}")

    def _periodic_checkpoint(self) -> None:
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
            self.policy if tensors is None else tensors,
            policy_cfg or self.policy_cfg,
            self.cfg.env_id,
            self.version if version is None else version,
            env_kwargs=self.cfg.env_kwargs_map(),
            wrappers=self.cfg.wrappers,
            agent_policies=self.plan.agent_policies if joint else None,
        )

    # ------------------------------------------------------------------ checkpoints

    def checkpoint(self) -> Path | None:
        """Write a checkpoint into ``run_dir/checkpoints`` atomically (temp + rename);
        return its path (None without run_dir)."""
        if not self.cfg.run_dir:
            return None
        path = save_learner_checkpoint(
            self.cfg.run_dir,
            self.trainer.state_dict(),
            (self.cfg, self.ppo_cfg, self.policy_cfg),
            self.report,
            dict(self.counters),
            (self.queues.total_rows(), self.queues.total_fragments()),
        )
        log.info("checkpoint %s (version %d)", path, self.version)
        if self.on_checkpoint is not None:
            self.on_checkpoint(path)
        return path

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
