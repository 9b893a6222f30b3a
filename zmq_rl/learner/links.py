"""The learner's measurement of its links to the actors, and its lead advice.

:class:`Links` keeps the learner's busy time per broadcast cycle (its updates and
whatever else it did outside its receive loop), each actor's round trip (from the
echo of its heartbeats) and the share of time its staleness valve holds it paused,
and says once per actor which ``max_lead_steps`` would fit its round trip when the
valve holds it too often (docs/multi-host.md, 'Long links').
:class:`~zmq_rl.learner.ingest.Ingest` feeds it: when a receive loop starts and ends,
when work ran while a thread served the sockets, at each broadcast, and each heartbeat.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterable

from ..wire.protocol import Heartbeat, RunSettings
from ..wire.valve import fitting_max_lead_steps
from .membership import ActorRecord

__all__ = ["Links"]

# The advice is part of what the receiving side logs: same logger name as before.
log = logging.getLogger("zmq_rl.ingest")

BUSY_GAP_S = 0.005
"""A pause between two pumps longer than this is busy time (an update, an evaluation);
a round trip read in the pump right after one is not measured (its answer may have
waited in the socket). So round trips are measured while the learner waits for rows,
with an error of at most about this much; a learner that never waits measures none."""
PAUSED_ADVICE_SHARE = 0.30
"""An actor held paused by its valve more than this share of the time gets the
``max_lead_steps`` advice (logged once per actor)."""
ADVICE_MIN_SAMPLES = 5
"""Heartbeats (with ``paused``, after training started) before the advice is given."""
ADVICE_WARNINGS = 5
"""Actors whose ``max_lead_steps`` advice is a WARNING; the rest is logged at INFO (256
actors on one slow learner would otherwise print 256 near-identical warnings)."""
CYCLE_WINDOW = 16
"""Broadcast cycles over which the learner's busy time per cycle is the median."""
REPUBLISH_AFTER_INTERVALS = 2.0
"""Heartbeat intervals after a broadcast during which an actor may report an older
version before the learner publishes the current weights again; it does so again at
twice as many intervals after the broadcast each time (2, 4, 8, 16, ...) while the actor
stays behind, so weights still in flight on a slow link are sent again only a few
times, and an actor that made its subscription again (after 5 intervals,
``zmq_rl.actor.client.STALE_WEIGHTS_INTERVALS``) gets them at 8, before the default
``actor_timeout``."""


class Links:
    """Busy time per broadcast cycle, round trips and valve shares; the lead advice."""

    def __init__(self, settings: RunSettings, started: Callable[[], bool]) -> None:
        """``settings``: the run's (lead, fragment length, steps per broadcast);
        ``started()``: whether training started (valve shares count from then on)."""
        self.settings = settings
        self.started = started
        self.pump_end = 0.0  # when the previous receive loop returned
        self.after_busy = True  # this receive loop follows busy time
        self.busy = 0.0  # seconds outside the receive loop since the last broadcast
        self.cycle_busy: deque[float] = deque(maxlen=CYCLE_WINDOW)
        self.advised: set[int] = set()  # actor ids told which max_lead_steps fits
        self.informed: set[int] = set()  # ... told at INFO that the learner holds them
        self.advice_warnings = 0  # advice given at WARNING (ADVICE_WARNINGS at most)
        self.published_at = 0.0  # when the last broadcast went out
        self.republished = 0  # times it went out again since
        self.grant_valve: tuple[int, Callable[[], int]] | None = None
        """Rows batches: the rows per slot one take uses (a segment) and the grants'
        lead now, which the advice is about instead of ``S`` and ``L``."""

    def valve(self) -> tuple[int, int]:
        """``(rows per slot a cycle proves, the lead)`` of the valve the advice is
        about: the welcome's ``S`` and ``L``, or under grants a segment and their lead."""
        if self.grant_valve is not None:
            segment, lead = self.grant_valve
            return segment, lead()
        return self.settings.steps_per_broadcast, self.settings.max_lead_steps

    def pump_started(self, now: float) -> None:
        """A receive loop starts: the time since the previous one was busy time."""
        if self.pump_end:
            self.busy += now - self.pump_end
        self.after_busy = now - self.pump_end > BUSY_GAP_S

    def pump_ended(self, now: float) -> None:
        """A receive loop returned."""
        self.pump_end = now

    def worked(self, busy_before: float, start: float, end: float) -> None:
        """Work ran from ``start`` to ``end`` while a thread served the sockets: it is
        busy time all the same (``busy_before``: the busy time when it started)."""
        self.busy = busy_before + (end - start)
        self.pump_end = end

    def cycle_ended(self) -> None:
        """A broadcast: the busy time of the cycle it ends joins the window."""
        self.cycle_busy.append(self.busy)
        self.busy = 0.0
        self.published_at, self.republished = time.monotonic(), 0

    def weights_overdue(self, beat: Heartbeat, version: int, now: float) -> bool:
        """Whether to publish the current weights (``version``) again: ``beat`` reports
        an older version :data:`REPUBLISH_AFTER_INTERVALS` heartbeat intervals after
        the broadcast (then 2x, 4x, ... as many). Its SUB missed them (it subscribed
        after they were published, a slow joiner under load, or its connection was
        dropped and made again), and while the valve holds it no new publication
        comes: the rollout waits on its rows, which it sends only once it has the
        weights, so it would be declared dead at ``actor_timeout``."""
        if beat.version >= version or self.published_at == 0.0:
            return False
        wait = REPUBLISH_AFTER_INTERVALS * self.settings.heartbeat_interval
        if now - self.published_at < wait * 2**self.republished:
            return False
        self.republished += 1
        return True

    def on_heartbeat(self, rec: ActorRecord, beat: Heartbeat, now: float) -> None:
        """An actor's heartbeat: measure the round trip (``now - echo - held``, unless
        busy time came in between) and the valve share; maybe advise."""
        if beat.echo is not None and beat.held is not None and not self.after_busy:
            rec.link.add_rtt(now - beat.echo - beat.held)
        if beat.paused is not None and self.started():
            rec.link.add_paused(now, beat.paused, rec.steps_received, rec.num_envs)
            rec.link.suggested_max_lead_steps = self.fitting_lead(rec)
            self.maybe_advise(rec)

    def cycle_time(self) -> float | None:
        """The learner's busy time per broadcast cycle (its updates, and whatever else
        it did outside its receive loop), median over the last cycles; None before the
        first broadcast."""
        return statistics.median(self.cycle_busy) if self.cycle_busy else None

    def fitting_lead(self, rec: ActorRecord) -> int | None:
        """The ``max_lead_steps`` that covers ``rec``'s round trip, when measured."""
        link, cycle = rec.link, self.cycle_time()
        if link.rtt is None or link.step_rate is None or cycle is None:
            return None
        return fitting_max_lead_steps(
            steps_per_broadcast=self.valve()[0],
            fragment_length=self.settings.fragment_length,
            step_rate=link.step_rate,
            round_trip=link.rtt,
            cycle_time=cycle,
        )

    def link_bound(self, rec: ActorRecord) -> bool:
        """Whether the link, not the learner, holds ``rec``: its round-trip floor
        (:attr:`~zmq_rl.learner.membership.LinkEstimate.rtt_floor`) needs more than one
        fragment of lead of its own. A local run's actors wait for a busy learner's
        updates (MinAtar: seconds), and one transient link cut lifts the smoothed round
        trip for a while; neither is a link that a larger ``--max-lead-steps`` would
        serve, and both drew the WARNING before (issue 29)."""
        link, cycle = rec.link, self.cycle_time()
        floor = link.rtt_floor
        if floor is None or link.step_rate is None or cycle is None:
            return False
        need = fitting_max_lead_steps(
            steps_per_broadcast=self.valve()[0],
            fragment_length=1,
            step_rate=link.step_rate,
            round_trip=floor,
            cycle_time=cycle,
        ) - fitting_max_lead_steps(
            steps_per_broadcast=self.valve()[0],
            fragment_length=1,
            step_rate=link.step_rate,
            round_trip=0.0,
            cycle_time=cycle,
        )
        return need > self.settings.fragment_length

    def maybe_advise(self, rec: ActorRecord) -> None:
        """When an actor's valve holds it more than PAUSED_ADVICE_SHARE of the time:
        once, at WARNING (the first ADVICE_WARNINGS actors), which ``max_lead_steps``
        would fit its round trip, if the link holds it (:meth:`link_bound`);
        otherwise once at INFO that the learner (or a passing stall) does."""
        link, suggested = rec.link, rec.link.suggested_max_lead_steps
        if (
            rec.actor_id in self.advised
            or rec.actor_id in self.informed  # one verdict per actor: never a contradiction
            or suggested is None
            or link.paused_samples < ADVICE_MIN_SAMPLES
            or (link.paused_share or 0.0) <= PAUSED_ADVICE_SHARE
        ):
            return
        current = self.valve()[1]
        warn = self.link_bound(rec) and suggested > current + self.settings.fragment_length
        facts = (
            f"actor {rec.actor_id} ({rec.host} pid {rec.pid}) is held paused by the staleness "
            f"valve {100 * (link.paused_share or 0.0):.0f}% of the time; round trip "
            f"{1e3 * (link.rtt or 0.0):.0f} ms (at least {1e3 * (link.rtt_floor or 0.0):.0f} "
            f"ms), {link.step_rate or 0.0:,.0f} steps/s per slot while running, learner busy "
            f"{1e3 * (self.cycle_time() or 0.0):.0f} ms per broadcast cycle"
        )
        if warn:
            self.advised.add(rec.actor_id)
            self.advice_warnings += 1
            loud = self.advice_warnings <= ADVICE_WARNINGS
            last = self.advice_warnings == ADVICE_WARNINGS
            (log.warning if loud else log.info)(
                "%s: --max-lead-steps %d would cover its round trip (now %d; "
                "steps_per_broadcast + rate * (round trip + learner busy time), "
                "see docs/multi-host.md 'Long links')%s",
                facts,
                suggested,
                current,
                " [further actors' advice is logged at INFO; the metrics row's "
                "links/suggested_max_lead_steps has the largest]"
                if last
                else "",
            )
        else:
            self.informed.add(rec.actor_id)
            log.info(
                "%s: the learner's updates (or a passing stall), not the link, hold it; "
                "--max-lead-steps %d (now %d) would only train on staler rows",
                facts,
                suggested,
                current,
            )

    @staticmethod
    def stats(members: Iterable[ActorRecord]) -> dict[str, float]:
        """Aggregate link figures over the registered actors, for the metrics row (only
        the measured ones): ``links/rtt_ms_max``, ``links/rtt_ms_mean``,
        ``links/valve_paused_share_max``, ``links/valve_paused_share_mean`` and
        ``links/suggested_max_lead_steps`` (the largest suggestion)."""
        links = [rec.link for rec in members if not rec.said_bye]
        rtts = [1e3 * link.rtt for link in links if link.rtt is not None]
        shares = [link.paused_share for link in links if link.paused_share is not None]
        leads = [
            link.suggested_max_lead_steps
            for link in links
            if link.suggested_max_lead_steps is not None
        ]
        out: dict[str, float] = {}
        if rtts:
            out["links/rtt_ms_max"] = max(rtts)
            out["links/rtt_ms_mean"] = sum(rtts) / len(rtts)
        if shares:
            out["links/valve_paused_share_max"] = max(shares)
            out["links/valve_paused_share_mean"] = sum(shares) / len(shares)
        if leads:
            out["links/suggested_max_lead_steps"] = float(max(leads))
        return out
