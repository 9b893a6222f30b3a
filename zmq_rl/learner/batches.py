"""Which rows each update takes, and the grants that pace the actors who deliver them.

Two ways (``batch_mode``, docs/design.md section 10), behind one small interface the
learner's loop uses (:class:`Batches`):

* :class:`SlotBatches`: ``num_steps`` rows of every member slot, once every one of them
  holds that many (the seed's rollout; the batch grows with the fleet);
* :class:`RowBatches`: a fixed number of rows in segments of ``num_steps``, the oldest
  complete segments of whichever slots delivered (IMPALA's and Sample Factory's
  learner batch): more actors mean more updates per second, never bigger ones. Rows
  acted by weights older than the lag bound are dropped first, and every actor that
  announced grants is told after each take how far it may run (its grant: the most the
  learner has used of any of its slots plus the lead; docs/design.md section 5.6).

No sockets of its own: it reads and answers through the learner's
:class:`~zmq_rl.learner.ingest.Ingest`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from ..rl.rollout import Rollout, SlotKey
from ..wire.protocol import FEATURE_GRANTS, Hello
from .membership import ActorRecord
from .settings import BatchPlan

if TYPE_CHECKING:
    from .ingest import Ingest

__all__ = ["Batches", "RowBatches", "SlotBatches", "make_batches"]

log = logging.getLogger("zmq_rl.learner")


class Batches(Protocol):
    """What the learner's loop asks of a way of batching."""

    def ready(self, rows_left: int) -> bool:
        """Whether the next update's rows are queued (``rows_left``: what the budget
        still allows; a rows batch may take fewer segments to spend it exactly)."""
        ...

    def take(self) -> Rollout:
        """The next update's rollout (after :meth:`ready` said yes); its rows are
        counted consumed for their actors."""
        ...

    def rows_next(self) -> int:
        """Rows the next update would take from the slots that delivered (the budget
        check before a fill: an update that would overrun does not start)."""
        ...

    def waited_on(self) -> list[SlotKey]:
        """The slots the fill waits on (named when the learner starves)."""
        ...


class SlotBatches:
    """``num_steps`` rows of every member slot, in key order (bit-for-bit repeatable
    for a fixed seed with ``max_lead_steps`` at one cycle)."""

    def __init__(self, ingest: Ingest, segment: int) -> None:
        self.ingest, self.segment = ingest, segment

    def ready(self, rows_left: int) -> bool:
        """Whether every member slot holds ``num_steps`` rows."""
        slots = self.ingest.members.member_slots()
        return bool(slots) and self.ingest.queues.ready(slots, self.segment)

    def take(self) -> Rollout:
        """``num_steps`` rows of every member slot."""
        return self.ingest.take_rollout(self.ingest.members.member_slots(), self.segment)

    def rows_next(self) -> int:
        """``num_steps`` times the member slots that have delivered experience: a
        registration alone (a hello with many slots) never ends the run; if such a member
        does deliver, the check after the fill counts it."""
        members = self.ingest.members
        delivering = [k for k in members.member_slots() if members.get(k[0]).steps_received]
        return self.segment * max(1, len(delivering))

    def waited_on(self) -> list[SlotKey]:
        """The member slots short of ``num_steps`` rows."""
        slots = self.ingest.members.member_slots()
        return self.ingest.queues.short_slots(slots, self.segment)


class RowBatches:
    """``plan.segments`` segments of ``plan.segment`` rows per update, the oldest
    complete ones of any live slot (:meth:`SlotQueues.oldest_segments
    <zmq_rl.learner.queues.SlotQueues.oldest_segments>`), and the grants of the actors
    that follow them. Every registration's rows count from its first fragment: there is
    no broadcast to wait for before an actor's rows are used."""

    def __init__(self, ingest: Ingest, plan: BatchPlan) -> None:
        self.ingest, self.plan = ingest, plan
        self._columns: list[SlotKey] | None = None
        ingest.admit_at_once = True
        ingest.grant_for = self.first_grant
        ingest.sent_cap = self.sent_cap

    def live_slots(self) -> list[SlotKey]:
        """Every slot of a registration that has not said bye, in key order."""
        return sorted(k for rec in self.ingest.members if not rec.said_bye for k in rec.slots())

    def first_grant(self, rec: ActorRecord, hello: Hello) -> int | None:
        """The welcome's grant for a new registration: the lead, for an actor that
        announced grants (None: its valve follows ``S`` and ``L``)."""
        if FEATURE_GRANTS not in hello.features:
            return None
        return self.plan.grant_lead(len(self.live_slots()) + rec.num_envs)

    def sent_cap(self, rec: ActorRecord) -> int:
        """The most rows per slot ``rec`` may have sent in its registration: its grant,
        or what the ``S``/``L`` valve allows at the learner's version (it cannot hold a
        newer one), plus one fragment of slack. Rows batches consume slots unevenly, so
        the learner bounds what an actor sent, not what it has queued."""
        if rec.grant is not None:
            return rec.grant
        settings = self.ingest.settings
        proven = max(0, self.ingest.version() - rec.base_version) * settings.steps_per_broadcast
        return proven + settings.max_lead_steps + settings.fragment_length

    def regrant(self) -> None:
        """Raise each grant actor's grant to the most the learner has used of any of its
        slots plus the lead (for the live slots now), and tell it in a heartbeat at once
        when it rose. Never lowers one: an actor keeps the largest it heard."""
        queues, lead = self.ingest.queues, self.plan.grant_lead(len(self.live_slots()))
        for rec in self.ingest.members:
            if rec.grant is None or rec.said_bye:
                continue
            grant = max(queues.removed(key) for key in rec.slots()) + lead
            if grant > rec.grant:
                rec.grant = grant
                self.ingest.send_heartbeat(rec)

    def ready(self, rows_left: int) -> bool:
        """Drop rows past the lag bound (counted ``discarded/*/stale``), then whether the
        oldest ``segments`` complete segments (fewer when ``rows_left`` allows fewer,
        at least one) are queued."""
        live = self.live_slots()
        bound = self.plan.lag_bound(len(live))
        fragments, rows = self.ingest.queues.drop_stale(self.ingest.version() - bound)
        if rows:
            counters = self.ingest.counters
            counters["discarded/steps/stale"] += rows
            counters["discarded/fragments/stale"] += fragments
            log.info("dropped %d rows acted more than %d versions ago", rows, bound)
        self.regrant()
        count = max(1, min(self.plan.segments, rows_left // self.plan.segment))
        self._columns = self.ingest.queues.oldest_segments(live, self.plan.segment, count)
        return self._columns is not None

    def take(self) -> Rollout:
        """The segments :meth:`ready` chose, as ``[num_steps, segments]`` columns (a slot
        with several in stream order); the grants rise at once, so the actors record the
        next batch while this one trains."""
        assert self._columns is not None, "take() before ready()"
        rollout = self.ingest.take_rollout(self._columns, self.plan.segment)
        self._columns = None
        self.regrant()
        return rollout

    def rows_next(self) -> int:
        """The fixed batch: ``segments * num_steps`` rows."""
        return self.plan.rows_per_update

    def waited_on(self) -> list[SlotKey]:
        """Every live slot short of one segment (none in particular holds the batch)."""
        return self.ingest.queues.short_slots(self.live_slots(), self.plan.segment)


def make_batches(ingest: Ingest, plan: BatchPlan) -> Batches:
    """The :class:`Batches` of ``plan``."""
    return RowBatches(ingest, plan) if plan.rows else SlotBatches(ingest, plan.segment)
