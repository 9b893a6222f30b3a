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
from collections import Counter, deque
from collections.abc import Callable
from typing import Any, Protocol

import torch

from ..config import LearnerConfig, PolicyConfig, PPOConfig, replace
from ..envs import env_shape
from ..rl.distributed import (
    Collective,
    LearnerRankLost,
    RankSpec,
    is_collective_failure,
    parameter_digest,
)
from ..rl.policy import Policy
from ..rl.trainer import Trainer
from ..wire.protocol import Fragment
from .ingest import POLL_MS, SHUTDOWN_GRACE_S, Ingest
from .membership import ActorRecord, Membership
from .queues import SlotQueues
from .report import BUDGET_SPENT, LearnerReport
from .settings import LearnerStarved, StopRequested, run_settings

__all__ = ["LeaderRanks", "RankRouting", "RankZero", "round_outcome", "run_learner_rank"]

log = logging.getLogger("zmq_rl.learner_ranks")
# What the ingest's part of the protocol logs keeps the ingest's logger name.
ingest_log = logging.getLogger("zmq_rl.ingest")

HOLD_MAX_BYTES = 64 * 1024 * 1024
"""Learner ranks > 0: fragments of actors that rank 0 registered after the last plan
are held (decoded, not yet checked) until the next plan names them, up to this many
bytes (what new actors send in one update, bounded by their staleness valves); beyond
it they are rejected as ``unknown_actor``."""

PLAN_FIELDS = (
    "actor_id", "token", "num_envs", "base_version", "member", "said_bye",
    "bye_last_seq", "key", "host", "pid", "rank",
)  # fmt: skip
"""What the plan of learner ranks carries of each registration (:meth:`RankRouting.plan_actors`)."""
PLAN_UPDATED = ("base_version", "member", "said_bye", "bye_last_seq")
"""The fields a rank > 0 takes from every plan for a registration it already has."""


class RankRouting:
    """One ingest's part of the learner-ranks protocol
    (:class:`~zmq_rl.learner.ingest.RankPart`): which rank a registration's experience
    goes to, the plan of registrations rank 0 broadcasts and the other ranks apply, the
    rank reports they send back, and (rank > 0) the fragments held for actors not
    planned yet."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        # Rank 0: the registrations (tokens) of other ranks' actors that delivered every
        # slot in their rank's last report: a registration, not an actor id, so a
        # restart that reuses the id has delivered nothing until its rank says so.
        self.remote_delivered: set[bytes] = set()
        # Rank > 0: fragments of actors not planned yet, (fragment, CURVE key, bytes,
        # held through a plan already); bounded by HOLD_MAX_BYTES.
        self.held: deque[tuple[Fragment, str, int, bool]] = deque()
        self.held_bytes = 0
        self.reported_dead = 0  # rank > 0: dead_actors already in a rank report
        # Rank 0: actor id -> token of each registration in the last plan; the rank
        # reports of a round speak of these registrations, not of a later one that
        # reuses the id (a restarted actor registering while the ranks filled).
        self.planned: dict[int, bytes] = {}

    def assign_rank(self, members: Membership, new: ActorRecord) -> int:
        """The learner rank with the fewest live slots (the lowest on a tie): where a
        new registration's experience goes, so slots stay spread over the ranks as
        actors join and die."""
        slots = [0] * self.world_size
        for rec in members:
            if rec is not new and not rec.said_bye:
                slots[rec.rank] += rec.num_envs
        return min(range(self.world_size), key=lambda r: (slots[r], r))

    def delivered_elsewhere(self, rec: ActorRecord) -> bool:
        """Rank 0: whether another rank's actor delivered every slot (its last report)."""
        return rec.token in self.remote_delivered

    def hold(self, fragment: Fragment, key: str, size: int, held_before: bool) -> bool:
        """Rank > 0: hold a fragment of an actor not planned yet (within
        :data:`HOLD_MAX_BYTES`); False: it is rejected instead."""
        if self.rank == 0 or self.held_bytes + size > HOLD_MAX_BYTES:
            return False
        self.held.append((fragment, key, size, held_before))
        self.held_bytes += size
        return True

    def plan_actors(self, ingest: Ingest) -> list[list[Any]]:
        """Rank 0: every registration as the plan tells the other ranks: the
        :data:`PLAN_FIELDS` of each record (see :meth:`apply_plan`)."""
        self.planned = {rec.actor_id: rec.token for rec in ingest.members}
        return [[getattr(rec, name) for name in PLAN_FIELDS] for rec in ingest.members]

    def _planned_record(self, ingest: Ingest, actor_id: int) -> ActorRecord | None:
        """Rank 0: the registration a rank report's ``actor_id`` means: the one of the
        last plan, if rank 0 still has it (None when it left or its id now belongs to
        a newer registration, whose counts and life the report does not describe)."""
        rec = ingest.members.get(actor_id)
        if rec is None or self.planned.get(actor_id) != rec.token:
            return None
        return rec

    def apply_plan(self, ingest: Ingest, actors: list[list[Any]]) -> None:
        """Rank > 0: make this rank's registrations rank 0's (:meth:`plan_actors`):
        forget those rank 0 no longer has (their queued rows are counted as
        discarded), add the new ones, take membership and base versions; then check
        the fragments held for actors that were not planned yet. A fragment held
        through a whole plan without its actor appearing is rejected (``unknown_actor``)."""
        now = time.monotonic()
        entries = (dict(zip(PLAN_FIELDS, values, strict=True)) for values in actors)
        planned = {e["actor_id"]: e for e in entries if e["rank"] == self.rank}
        for rec in ingest.members:
            entry = planned.get(rec.actor_id)
            if entry is None or entry["token"] != rec.token:
                ingest.forget_actor(ingest.members.remove(rec.actor_id), "actor_left_rank")
        for actor_id, entry in planned.items():
            rec = ingest.members.get(actor_id)
            if rec is None:
                rec = ActorRecord(
                    **entry, routing_id=b"", last_seen=now, last_fragment=now, registered_at=now
                )
                ingest.members.actors[actor_id] = rec
            for name in PLAN_UPDATED:
                setattr(rec, name, entry[name])
        held, self.held, self.held_bytes = list(self.held), deque(), 0
        for fragment, key, size, retried in held:
            ingest.admit_fragment(fragment, key, size, held_before=None if retried else True)

    def rank_report(self, ingest: Ingest) -> dict[str, Any]:
        """Rank > 0: what rank 0 needs of this rank's actors after a fill: per actor
        [steps received, fragments received, steps consumed, delivered every slot],
        and the actors this rank declared dead since the last report."""
        dead = ingest.report.dead_actors[self.reported_dead :]
        self.reported_dead = len(ingest.report.dead_actors)
        return {
            "actors": {
                r.actor_id: [
                    r.steps_received,
                    r.fragments_received,
                    r.steps_consumed,
                    ingest.delivered(r),
                ]
                for r in ingest.members
            },  # fmt: skip
            "dead": dead,
        }

    def apply_rank_report(self, ingest: Ingest, report: dict[str, Any]) -> None:
        """Rank 0: take another rank's :meth:`rank_report`: its actors' counts, which
        waiting ones delivered, and its declared deaths (removed here, so the next plan
        and the heartbeats agree). Entries about a registration that rank 0 no longer
        has are skipped: a death declared while a replacement took the same actor id
        must not remove the replacement."""
        for actor_id, (received, fragments, consumed, delivered) in report["actors"].items():
            rec = self._planned_record(ingest, actor_id)
            if rec is None:
                continue
            rec.steps_received, rec.fragments_received = received, fragments
            rec.steps_consumed = consumed
            (self.remote_delivered.add if delivered else self.remote_delivered.discard)(rec.token)
        for line in report["dead"]:
            rec = self._planned_record(ingest, line["actor_id"])
            if rec is None:
                continue
            ingest_log.warning("actor %d (%s pid %d) declared dead by its learner rank %d",
                               rec.actor_id, rec.host, rec.pid, rec.rank)  # fmt: skip
            ingest.report.dead_actors.append(line)
            ingest.counters["actors/declared_dead"] += 1
            ingest.forget_actor(ingest.members.remove(rec.actor_id), "actor_dead")


class RankZero(Protocol):
    """What rank 0's :class:`LeaderRanks` reads of its learner
    (:class:`~zmq_rl.learner.loop.Learner`), beside the three callables it is given."""

    spec: RankSpec | None
    cfg: LearnerConfig
    ppo_cfg: PPOConfig
    policy_cfg: PolicyConfig
    run_id: str
    trainer: Trainer
    ingest: Ingest
    report: LearnerReport
    counters: Counter[str]
    members: Membership

    @property
    def policy(self) -> Policy: ...

    @property
    def version(self) -> int: ...

    @property
    def queues(self) -> SlotQueues: ...

    def pump(self, timeout_ms: int) -> None: ...

    def starved(self, slots: list[Any]) -> LearnerStarved: ...


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

    def __init__(
        self,
        learner: RankZero,
        *,
        stop_reason: Callable[[], str],
        budget_spent: Callable[[], bool],
        broadcast: Callable[[], None],
    ) -> None:
        """``stop_reason()``: why the learner was asked to stop ("" while it was not);
        ``budget_spent()``: whether the env-step budget is spent; ``broadcast()``:
        publish the next version (waiting actors join)."""
        self.learner = learner
        self.stop_reason, self.budget_spent, self.broadcast = stop_reason, budget_spent, broadcast
        self.routing = RankRouting(0, learner.cfg.num_learners)
        self.spec = learner.spec
        self.collective: Collective | None = None
        self.procs: list[Any] = []
        self.digest = 0
        self.broken = False  # a collective failed: no rank is left to talk to
        self.stop_sent = ""
        self.out_of_budget = False  # a round found the budget spent: the next plan stops
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
            "actors": self.routing.plan_actors(learner.ingest),
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
        stop = self.stop_reason() or (BUDGET_SPENT if self.out_of_budget else "")
        if not stop and self.budget_spent():
            stop = BUDGET_SPENT
        plan = self._plan(stop)
        self._call(lambda c: c.broadcast(plan))
        if stop:
            self.stop_sent = stop
            if self.stop_reason():
                raise StopRequested(stop)
            return True, None
        slots = self._fill()
        mine = {"rows": cfg.num_steps * len(slots), "stop": bool(self.stop_reason())}
        mine["digest"] = self.digest
        reports = self._call(lambda c: c.all_gather(mine))
        for rank, other in enumerate(reports[1:], start=1):
            if other["digest"] != self.digest:
                raise RuntimeError(
                    f"learner rank {rank} holds other parameters than rank 0 after update "
                    f"{report.updates_completed} (digest {other['digest']:#x} != "
                    f"{self.digest:#x}): the ranks diverged"
                )
            self.routing.apply_rank_report(ingest, other)
            report.add_episodes(other["returns"])
        rows, outcome = round_outcome(
            reports, report.updates_completed, report.env_steps_consumed, cfg.total_env_steps
        )
        if outcome == "idle":
            self._idle()
        else:
            self.idle_since = None
        self.out_of_budget = self.out_of_budget or outcome == "budget"
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
            self.broadcast()
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
            if self.stop_reason():
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
            self.broadcast()
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
        final = {"actors": self.routing.plan_actors(learner.ingest), "version": learner.version}
        self._call(lambda c: c.broadcast(final))
        reports = self._call(lambda c: c.all_gather({"rows": 0}))
        for other in reports[1:]:
            self.routing.apply_rank_report(learner.ingest, other)
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
    shape = env_shape(cfg.env_id, cfg.env_kwargs_map(), cfg.wrappers)
    spaces = (shape.observation_space, shape.action_space)
    trainer = Trainer(cfg, ppo, policy_cfg, *spaces)
    collective = Collective(spec)
    try:
        start = collective.broadcast()
        report = LearnerReport(run_id=start["run_id"], device=str(trainer.device))
        counters: Counter[str] = Counter()
        ingest = Ingest(
            cfg,
            run_settings(cfg, *spaces, policy_cfg, agents_per_env=shape.agents_per_env),
            run_id=start["run_id"],
            report=report,
            counters=counters,
            version=lambda: trainer.version,
            forget_slots=trainer.forget_slots,
            rank=spec.rank,
            world_size=spec.world_size,
            ranks=(routing := RankRouting(spec.rank, spec.world_size)),
        )
        try:
            _Rounds(cfg, trainer, collective, ingest, routing).run()
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
        self,
        cfg: LearnerConfig,
        trainer: Trainer,
        collective: Collective,
        ingest: Ingest,
        routing: RankRouting,
    ) -> None:
        self.cfg, self.trainer, self.collective, self.ingest = cfg, trainer, collective, ingest
        self.routing = routing
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
            self.routing.apply_plan(ingest, plan["actors"])
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
        return {"returns": returns, **self.routing.rank_report(self.ingest)}

    def _fill(self) -> list[Any]:
        """Receive until this rank's member slots hold ``num_steps`` rows each; a
        member that sends nothing while waited on for ``actor_timeout`` is declared
        dead (and leaves the slots), so this ends. It receives at least once even
        without a member slot, so a registration waiting to join on this rank
        delivers its first rows and rank 0 can admit it."""
        ingest, need = self.ingest, self.cfg.num_steps
        ingest.pump(0)
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
        self.routing.apply_plan(ingest, final["actors"])
        deadline = time.monotonic() + SHUTDOWN_GRACE_S
        while time.monotonic() < deadline and not all(r.caught_up() for r in ingest.members):
            ingest.pump(POLL_MS)
        ingest.discard_queued("run_ended")
        self.collective.all_gather({**self._report(), "counters": dict(ingest.counters)})
