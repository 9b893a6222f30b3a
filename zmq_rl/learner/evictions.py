"""Who leaves the learner's run without a bye: registrations that never joined and
went silent, members silent for ``actor_timeout`` (or waited on without a fragment),
and actors whose process a supervisor saw exit. Each is removed from the membership,
its queued rows discarded and counted, and its report line kept
(:meth:`Ingest.forget_actor <zmq_rl.learner.ingest.Ingest.forget_actor>`).
"""

from __future__ import annotations

import logging
import socket
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Protocol

from ..config import LearnerConfig
from ..rl.rollout import SlotKey
from ..wire.protocol import RunSettings
from .membership import ActorRecord, Membership
from .queues import SlotQueues
from .report import LearnerReport

__all__ = ["PENDING_SILENCE_INTERVALS", "Evictions"]

log = logging.getLogger("zmq_rl.ingest")

PENDING_SILENCE_INTERVALS = 5.0
"""Heartbeat intervals a registration that has not joined the rollout may stay
silent (no heartbeat, no fragment) before it is dropped; a live actor heartbeats
every interval."""


class EvictionHost(Protocol):
    """What :class:`Evictions` reads of its :class:`~zmq_rl.learner.ingest.Ingest`."""

    cfg: LearnerConfig
    settings: RunSettings
    members: Membership
    queues: SlotQueues
    report: LearnerReport
    counters: Counter[str]
    version: Callable[[], int]
    rank: int
    shutting_down: bool
    admit_at_once: bool

    def local_member_slots(self) -> list[SlotKey]:
        """The member slots whose rows this learner rank receives."""
        ...

    def forget_actor(self, rec: ActorRecord, reason: str) -> None:
        """Discard (and count) what a removed actor had queued; keep its report line."""
        ...


class Evictions:
    """The eviction rules of one :class:`~zmq_rl.learner.ingest.Ingest`, applied on its
    thread at every pump."""

    def __init__(self, ingest: EvictionHost) -> None:
        self.ingest = ingest
        # Processes a supervisor saw exit (any thread appends; pump reads). Bounded by
        # what one pump handles: the supervisor reports each exit once.
        self.exited: deque[int] = deque(maxlen=1024)

    def evict_silent(self) -> None:
        """Declare dead every actor silent for ``actor_timeout``: its slots leave the
        rollout being filled and what it had queued is discarded (counted). Drop
        every registration that has not joined and has sent nothing for
        :data:`PENDING_SILENCE_INTERVALS` heartbeat intervals (one line per pump)."""
        ingest = self.ingest
        if ingest.shutting_down:
            return
        now, timeout = time.monotonic(), ingest.cfg.actor_timeout
        silence = min(timeout, PENDING_SILENCE_INTERVALS * ingest.settings.heartbeat_interval)
        dropped = ingest.members.drop_silent_pending(now, silence) if ingest.rank == 0 else []
        if dropped:
            ingest.counters["actors/dropped_silent"] += len(dropped)
            ids = [rec.actor_id for rec in dropped]
            log.warning(
                "dropped %d registration(s) that sent nothing for %.1fs and had not joined "
                "the rollout: actor id(s) %s%s",
                *(len(ids), silence, ids[:10], " ..." if len(ids) > 10 else ""),
            )
            for rec in dropped:
                ingest.forget_actor(rec, "dropped_silent")
        waited_on = [] if ingest.admit_at_once else ingest.local_member_slots()
        short = ingest.queues.short_slots(waited_on, ingest.cfg.num_steps)
        short_ids = {a for a, _ in short}
        # A rank > 0 hears no heartbeats: only "no fragment while waited on" applies.
        for rec, why in ingest.members.evict_silent(now, timeout, short_ids, ingest.rank == 0):
            self._declare_dead(rec, f"{why} > actor_timeout={timeout:g}s", now)

    def declare_exited(self) -> None:
        """Declare dead every registration whose process a supervisor saw exit."""
        while self.exited:
            self._declare_exited(self.exited.popleft())

    def _declare_exited(self, pid: int) -> None:
        ingest = self.ingest
        host = socket.gethostname()[:200]
        for rec in ingest.members:
            if rec.pid == pid and rec.host == host and not rec.said_bye:
                ingest.members.remove(rec.actor_id)
                self._declare_dead(rec, "its process exited", time.monotonic())

    def _declare_dead(self, rec: ActorRecord, why: str, now: float) -> None:
        """Log, report and count a removed registration as dead; forget its rows."""
        ingest = self.ingest
        log.warning(
            "actor %d (%s pid %d): %s: declared dead", *(rec.actor_id, rec.host, rec.pid, why)
        )
        ingest.report.dead_actors.append(
            rec.death_line(now, ingest.report.updates_completed, ingest.version())
        )
        ingest.counters["actors/declared_dead"] += 1
        ingest.forget_actor(rec, "actor_dead")
