"""Which rows each update takes, and the grants that pace the actors who deliver them.

Two ways (``batch_mode``, docs/design.md section 10), behind one small interface the
learner's loop uses (:class:`Batches`):

* :class:`SlotBatches`: ``num_steps`` rows of every member slot, once every one of them
  holds that many (the seed's rollout; the batch grows with the fleet);
* :class:`RowBatches`: a fixed number of rows, the oldest queued (by the arrival of
  their fragments) of whichever slots delivered, in columns of at most ``num_steps``
  consecutive rows of one slot (IMPALA's and Sample Factory's learner batch): more
  actors mean more updates per second, never bigger ones. Rows acted by weights older
  than the lag bound are dropped first, and every actor that announced grants is told
  after each take how far it may run (its grant: the most the learner has used of any
  of its slots plus the lead; docs/design.md section 5.6).

No sockets of its own: it reads and answers through the learner's
:class:`~zmq_rl.learner.ingest.Ingest`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from ..rl.rollout import Rollout, SlotKey
from ..wire.protocol import FEATURE_GRANTS, Hello
from .membership import ActorRecord
from .settings import BatchPlan

if TYPE_CHECKING:
    from .ingest import Ingest
    from .report import LearnerReport

__all__ = ["Batches", "RowBatches", "SlotBatches", "make_batches", "overruns"]

log = logging.getLogger("zmq_rl.learner")


class Batches(Protocol):
    """What the learner's loop asks of a way of batching."""

    def ready(self, steps_left: int) -> bool:
        """Whether the next update's rows are queued (``steps_left``: the env steps the
        budget still allows; a rows batch ends at the last of them to spend it exactly)."""
        ...

    def take(self) -> Rollout:
        """The next update's rollout (after :meth:`ready` said yes); its rows are
        counted consumed for their actors."""
        ...

    def least_steps_next(self) -> int:
        """The fewest env steps the next update may take (the budget check before a
        fill: an update that would overrun whatever it takes does not start)."""
        ...

    def steps_next(self) -> int:
        """The env steps (valid rows) of the update :meth:`ready` found queued (the
        budget check after the fill: an update that would overrun does not run)."""
        ...

    def waited_on(self) -> list[SlotKey]:
        """The slots the fill waits on (named when the learner starves)."""
        ...


class SlotBatches:
    """``num_steps`` rows of every member slot, in key order (bit-for-bit repeatable
    for a fixed seed with ``max_lead_steps`` at one cycle)."""

    def __init__(
        self, ingest: Ingest, segment: int, broadcast: Callable[[], None], agents: bool = False
    ) -> None:
        self.ingest, self.segment, self.broadcast = ingest, segment, broadcast
        self.agents = agents  # a multi-agent env: some rows may not be env steps

    def ready(self, steps_left: int) -> bool:
        """Whether every member slot holds ``num_steps`` rows (whole rollouts, whatever
        ``steps_left``: the check after the fill ends the run before one that overruns).
        With no member left, the registrations that delivered join now, at a fresh
        version (``broadcast()``, the same weights): their valve counts from
        ``base_version = version + 1``, so their accounting starts exactly there
        (docs/design.md section 5.3)."""
        slots = self.ingest.members.member_slots()
        if not slots and self.ingest.can_admit():
            self.broadcast()
            slots = self.ingest.members.member_slots()
        return bool(slots) and self.ingest.queues.ready(slots, self.segment)

    def take(self) -> Rollout:
        """``num_steps`` rows of every member slot."""
        return self.ingest.take_rollout(self.ingest.members.member_slots(), self.segment)

    def least_steps_next(self) -> int:
        """``num_steps`` times the member slots that have delivered experience: a
        registration alone (a hello with many slots) never ends the run; if such a member
        does deliver, the check after the fill counts it. A multi-agent env's: 1, since
        which of the rows are env steps is known only once they are queued (the check
        after the fill counts them)."""
        if self.agents:
            return 1
        members = self.ingest.members
        delivering = [k for k in members.member_slots() if members.get(k[0]).steps_received]
        return self.segment * max(1, len(delivering))

    def steps_next(self) -> int:
        """The valid rows among the first ``num_steps`` queued of every member slot."""
        queues = self.ingest.queues
        return sum(queues.valid_rows(k, self.segment) for k in self.ingest.members.member_slots())

    def waited_on(self) -> list[SlotKey]:
        """The member slots short of ``num_steps`` rows."""
        slots = self.ingest.members.member_slots()
        return self.ingest.queues.short_slots(slots, self.segment)


class RowBatches:
    """``plan.rows_per_update`` rows per update, the oldest of any live slot in columns
    of at most ``plan.segment`` rows (:meth:`SlotQueues.oldest_rows
    <zmq_rl.learner.queues.SlotQueues.oldest_rows>`), and the grants of the actors that
    deliver them. Every registration's rows count from its first fragment: there is no
    broadcast to wait for before an actor's rows are used."""

    def __init__(self, ingest: Ingest, plan: BatchPlan) -> None:
        self.ingest, self.plan = ingest, plan
        self._columns: list[tuple[SlotKey, int]] | None = None
        self._version = -1  # the version the grants were last raised at
        self._used: dict[SlotKey, int] = {}  # rows used of each slot at that version
        ingest.admit_at_once = True
        ingest.grant_for = self.first_grant
        ingest.sent_cap = self.sent_cap
        ingest.on_publish = self.regrant  # grants rise with the weights that prove them
        ingest.links.grant_valve = (plan.segment, lambda: plan.grant_lead(len(self.live_slots())))

    def live_slots(self) -> list[SlotKey]:
        """Every slot of a registration that has not said bye, in key order."""
        return sorted(k for rec in self.ingest.members if not rec.said_bye for k in rec.slots())

    def first_grant(self, rec: ActorRecord, hello: Hello) -> int | None:
        """The welcome's grant for a new registration: the lead, for an actor that
        announced grants (None: its valve follows ``S`` and ``L``)."""
        if FEATURE_GRANTS not in hello.features:
            return None
        return self.plan.grant_lead(len(self.live_slots()))  # its slots are registered

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

    def regrant(self, dropped: bool = False) -> None:
        """Raise each grant actor's grant to the most the learner had used of any of its
        slots when it published its current version (or just now, when ``dropped``
        rows past the lag bound), plus the lead for the live slots now, and tell it in a
        heartbeat at once when it rose. Never lowers one: an actor keeps the largest it
        heard. Grants rise with versions, as the ``S``/``L`` valve's budget does: rows
        the learner took are proven used only once it trained on them, so an actor
        records no further ahead of the weights than under that valve."""
        queues, lead = self.ingest.queues, self.plan.grant_lead(len(self.live_slots()))
        version = self.ingest.version()
        if version != self._version or dropped:
            self._version = version
            self._used = {k: queues.removed(k) for rec in self.ingest.members for k in rec.slots()}
        for rec in self.ingest.members:
            if rec.grant is None or rec.said_bye:
                continue
            # (the snapshot may name an earlier registration of the same slot: never more
            # than this one has used)
            used = (min(self._used.get(key, 0), queues.removed(key)) for key in rec.slots())
            grant = max(used) + lead
            if grant > rec.grant:
                rec.grant = grant
                self.ingest.send_heartbeat(rec)

    def ready(self, steps_left: int) -> bool:
        """Drop rows past the lag bound (counted ``discarded/*/stale``), then whether the
        batch's rows are queued: ``batch_rows`` rows, or fewer that end at the
        ``steps_left``-th valid row when they hold that many env steps (the budget's last
        update takes exactly what it has left, however many of its rows are not valid:
        :meth:`SlotQueues.oldest_rows <zmq_rl.learner.queues.SlotQueues.oldest_rows>`)."""
        live = self.live_slots()
        bound = self.plan.lag_bound(len(live))
        fragments, rows = self.ingest.queues.drop_stale(self.ingest.version() - bound)
        if rows:
            counters = self.ingest.counters
            counters["discarded/steps/stale"] += rows
            counters["discarded/fragments/stale"] += fragments
            log.info("dropped %d rows acted more than %d versions ago", rows, bound)
        self.regrant(dropped=rows > 0)
        queues, plan = self.ingest.queues, self.plan
        self._columns = queues.oldest_rows(
            live, plan.rows_per_update, plan.segment, max(1, steps_left)
        )
        return self._columns is not None

    def take(self) -> Rollout:
        """The rows :meth:`ready` chose, as ``[num_steps, columns]`` (a slot with several
        columns in stream order; a shorter column padded before its rows)."""
        assert self._columns is not None, "take() before ready()"
        keys, lengths = zip(*self._columns, strict=True)
        rollout = self.ingest.take_rollout(list(keys), self.plan.segment, list(lengths))
        self._columns = None
        return rollout

    def least_steps_next(self) -> int:
        """1: the last batch ends at the budget's last env step, however few are left."""
        return 1

    def steps_next(self) -> int:
        """The valid rows of the columns :meth:`ready` chose (never more than it allowed),
        counted from those columns when asked: once an update, after its fill."""
        assert self._columns is not None, "steps_next() before ready()"
        queues, steps, skip = self.ingest.queues, 0, {}
        for key, n in self._columns:  # a slot's columns: its next rows, in stream order
            steps += queues.valid_rows(key, n, skip.get(key, 0))
            skip[key] = skip.get(key, 0) + n
        return steps

    def waited_on(self) -> list[SlotKey]:
        """Every live slot without a row queued (none in particular holds the batch)."""
        return self.ingest.queues.short_slots(self.live_slots(), 1)


def make_batches(
    ingest: Ingest, plan: BatchPlan, broadcast: Callable[[], None], agents: bool = False
) -> Batches:
    """The :class:`Batches` of ``plan`` (``broadcast()`` publishes the next version: every
    slot's rollout admits waiting registrations with it when no member is left;
    ``agents``: the env is multi-agent, some rows may not be env steps)."""
    if plan.rows:
        return RowBatches(ingest, plan)
    return SlotBatches(ingest, plan.segment, broadcast, agents)


def overruns(report: LearnerReport, total_env_steps: int, steps: int) -> bool:
    """Whether an update of ``steps`` env steps would overrun the budget
    ``total_env_steps`` (never before the first update); logs why the run ends when a
    whole rollout (``batch_mode`` slots) would not fit in what is left."""
    consumed = report.env_steps_consumed
    if report.updates_completed == 0 or consumed + steps <= total_env_steps:
        return False
    if consumed < total_env_steps:
        log.info(
            "the budget ends the run at %d of total_env_steps=%d: the next update's %d "
            "env steps would overrun it (every update takes num_steps rows of every "
            "member slot)",
            *(consumed, total_env_steps, steps),
        )
    return True
