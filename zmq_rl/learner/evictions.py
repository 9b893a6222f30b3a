"""Who leaves the learner's run without a bye: registrations that never joined and
went silent, members silent for their silence limit (or waited on without a
fragment for it), and actors whose process a supervisor saw exit. Each is removed
from the membership, its queued rows discarded and counted, and its report line kept
(:meth:`Ingest.forget_actor <zmq_rl.learner.ingest.Ingest.forget_actor>`).

A silence limit is ``actor_timeout``, or more for a link that showed longer gaps
(:mod:`zmq_rl.learner.silence`). A registration removed here is told at once to
register again (``refuse reregister``): a live actor that was only slow rejoins
without first sending rows the learner would refuse; what it still sends under the
old registration is counted as before but logged at DEBUG, once the learner knows
whose it is (:meth:`Evictions.forgotten`).
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
from ..wire.protocol import Refuse, RunSettings
from .membership import FRAGMENTS, ActorRecord, Membership
from .queues import SlotQueues
from .report import LearnerReport
from .silence import silence_limit

__all__ = ["FORGOTTEN_KEPT", "PENDING_SILENCE_INTERVALS", "Evictions"]

log = logging.getLogger("zmq_rl.ingest")

PENDING_SILENCE_INTERVALS = 5.0
"""Heartbeat intervals a registration that has not joined the rollout may stay
silent (no heartbeat, no fragment) before it is dropped; a live actor heartbeats
every interval."""
FORGOTTEN_KEPT = 1024
"""Session tokens of removed registrations the learner remembers, so that what those
actors still send is known for what it is (bounded: the newest this many)."""


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

    def send_control(self, routing_id: bytes, message: object) -> bool:
        """Send one peer a control message now (False: it cannot go)."""
        ...


class Evictions:
    """The eviction rules of one :class:`~zmq_rl.learner.ingest.Ingest`, applied on its
    thread at every pump."""

    def __init__(self, ingest: EvictionHost) -> None:
        self.ingest = ingest
        # Processes a supervisor saw exit (any thread appends; pump reads). Bounded by
        # what one pump handles: the supervisor reports each exit once.
        self.exited: deque[int] = deque(maxlen=1024)
        # Tokens of registrations removed here -> their actor ids (the newest kept).
        self._forgotten: dict[bytes, int] = {}
        self._judged = 0.0  # when evict_silent last judged who is silent

    def forgotten(self, token: bytes | None) -> int | None:
        """The actor id of the registration removed here that ``token`` was the
        session token of (None: not one of those): its late messages are expected."""
        return None if token is None else self._forgotten.get(bytes(token))

    def silence_limit(self, rec: ActorRecord, kind: str) -> float:
        """Seconds of silence (no message at all, or for ``kind`` FRAGMENTS no fragment
        while the rollout waits on it) after which ``rec`` is declared dead
        (:func:`~zmq_rl.learner.silence.silence_limit`).

        A registration that heartbeated since its welcome but has sent no fragment yet
        is building its envs and policy (a thread heartbeats for it meanwhile, but
        importing torch beside a busy host's other processes held it off for 3-4 s:
        the import holds the interpreter lock): it is given half the starvation
        timeout for either kind, so that it is dropped before the learner would
        starve. A bare hello (no heartbeat since) has shown nothing: ``actor_timeout``."""
        cfg = self.ingest.cfg
        floor, cap = cfg.actor_timeout, max(cfg.actor_timeout, cfg.starvation_timeout)
        if not rec.fragments_received and (kind == FRAGMENTS or rec.beats.last is not None):
            return max(floor, cap / 2)
        gaps = rec.fragment_gaps if kind == FRAGMENTS else rec.beats
        return silence_limit(gaps, floor, cap)

    def evict_silent(self, read_all: bool = True) -> None:
        """Declare dead every actor silent for its silence limit (:meth:`silence_limit`):
        its slots leave the rollout being filled and what it had queued is discarded
        (counted). Drop every registration that has not joined and has sent nothing
        for :data:`PENDING_SILENCE_INTERVALS` heartbeat intervals after its hello alone,
        or its silence limit once it heartbeated (one line per pump).

        ``read_all``: the pump read every message that had arrived. When it did not (a
        backlog after a long update), nobody is judged until it did, or a heartbeat
        interval passed since the last judgement (a flood that never drains)."""
        ingest = self.ingest
        now, timeout = time.monotonic(), ingest.cfg.actor_timeout
        if ingest.shutting_down or (
            not read_all and now - self._judged < ingest.settings.heartbeat_interval
        ):
            return
        self._judged = now
        silence = min(timeout, PENDING_SILENCE_INTERVALS * ingest.settings.heartbeat_interval)

        def pending_limit(rec: ActorRecord, kind: str) -> float:  # a hello alone: silence
            return silence if rec.beats.last is None else self.silence_limit(rec, kind)

        members = ingest.members
        dropped = (
            members.drop_silent_pending(now, silence, pending_limit, ingest.admit_at_once)
            if ingest.rank == 0
            else []
        )
        if dropped:
            ingest.counters["actors/dropped_silent"] += len(dropped)
            ids = [rec.actor_id for rec in dropped]
            log.warning(
                "dropped %d registration(s) that had fed no rollout and went silent "
                "(%.1fs after a hello alone): actor id(s) %s%s",
                *(len(ids), silence, ids[:10], " ..." if len(ids) > 10 else ""),
            )
            for rec in dropped:
                self._remove(rec, "dropped_silent")
        waited_on = [] if ingest.admit_at_once else ingest.local_member_slots()
        short = ingest.queues.short_slots(waited_on, ingest.cfg.num_steps)
        short_ids = {a for a, _ in short}
        # A rank > 0 hears no heartbeats: only "no fragment while waited on" applies.
        heard = ingest.rank == 0
        for rec, why in members.evict_silent(now, timeout, short_ids, heard, self.silence_limit):
            self._declare_dead(rec, why, now)

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
        self._remove(rec, "actor_dead")

    def _remove(self, rec: ActorRecord, reason: str) -> None:
        """Forget a removed registration's rows (:meth:`Ingest.forget_actor`), remember
        its token, and tell it to register again (a live actor rejoins at once)."""
        ingest = self.ingest
        ingest.forget_actor(rec, reason)
        self._forgotten[bytes(rec.token)] = rec.actor_id
        while len(self._forgotten) > FORGOTTEN_KEPT:
            del self._forgotten[next(iter(self._forgotten))]
        if ingest.rank == 0 and rec.routing_id:
            why = f"actor {rec.actor_id} was removed from the run ({reason}); say hello again"
            ingest.send_control(rec.routing_id, Refuse("reregister", why))
