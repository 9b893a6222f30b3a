"""The actor's watch on its link to the learner (docs/protocol.md sections 4.6 and 5.5).

Toward a learner whose heartbeats carry ``sent_at``, the client answers every learner
heartbeat on its next :meth:`~zmq_rl.actor.client.LearnerConnection.poll`, echoing its
``sent_at``, and reports the share of time the valve held it paused (:class:`ValveShare`).
:class:`LinkHealth` *pauses for the link* (:meth:`~zmq_rl.actor.client.ActorClient.should_pause`
says True, nothing new is sent) when the actor has heard no control message from the
learner for :data:`LINK_SILENCE_INTERVALS` heartbeat intervals, or when weights arrive
whose version proves that the learner consumed more of its slots than it sent (the
learner trained on without it). It resumes when a learner heartbeat echoes a heartbeat
sent after pausing (the learner still knows it); a ``refuse reregister`` or a heartbeat
or weights of another run make the client register again first, which ends the pause.
No sockets here: the client feeds it what it hears and sends what it says.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from ..sparse_log import log_sparsely

if TYPE_CHECKING:
    from ..wire.protocol import Heartbeat
    from .sender import ExperienceSender

__all__ = ["LINK_SILENCE_INTERVALS", "LinkHealth", "ValveShare"]

# The link is part of what the client logs: same logger name as before.
log = logging.getLogger("zmq_rl.client")

LINK_SILENCE_INTERVALS = 3.0
"""Heartbeat intervals without a control message from the learner after which the
actor pauses for the link. The learner heartbeats every interval while it is in its
receive loop; three intervals is the least ``actor_timeout`` docs/failure-model.md
recommends, so an actor cut off pauses about when the learner may evict it."""


class ValveShare:
    """The share of wall time the staleness valve held the actor, for the ``paused``
    field of its heartbeats (the learner's lead advice reads it)."""

    def __init__(self, now: float) -> None:
        self.since: float | None = None  # the valve holds the actor since then
        self.total = 0.0  # seconds the valve held it since share_since
        self.share_since = now

    def note(self, paused: bool, now: float) -> None:
        """Track when the valve holds the actor (``paused``: what it says at ``now``)."""
        if paused and self.since is None:
            self.since = now
        elif not paused and self.since is not None:
            self.total += now - self.since
            self.since = None

    def take(self, now: float) -> float:
        """The share of wall time the valve held the actor since the previous call."""
        total = self.total
        if self.since is not None:
            total += now - self.since
            self.since = now
        window = now - self.share_since
        self.total, self.share_since = 0.0, now
        return min(1.0, max(0.0, total / window)) if window > 0 else 0.0


class LinkHealth:
    """Whether the learner still hears this actor: pauses for the link and their end,
    when a heartbeat is due, and the link fields it carries.

    ``stats`` are the client's counters (``link_pauses`` and ``steps_sent_in_link_pause``
    are kept here); ``sender`` says what this registration sent. Armed per registration
    by the first learner heartbeat with ``sent_at`` (a learner that will answer with
    ``echo``); :meth:`restart` at each welcome.
    """

    def __init__(self, stats: dict[str, float], sender: ExperienceSender, now: float) -> None:
        self.stats = stats
        self.sender = sender
        self.armed = False  # the learner's heartbeats carry sent_at
        self.last_control = now  # newest control message of the learner
        self.paused_since: float | None = None
        """Monotonic time the actor paused for the link; None while it is not paused."""
        self.pause_sent = 0.0  # steps_sent when the pause began
        self.peer_sent_at: float | None = None  # sent_at of the newest learner heartbeat
        self.peer_heard_at = 0.0
        self.answer_due = False
        self.last_heartbeat = 0.0
        self.valve = ValveShare(now)

    def restart(self, now: float) -> None:
        """A welcome: a pause ends, the checks wait to be armed again, the valve's
        share counts from ``now``."""
        self.end_pause(now, "registered again")
        self.armed = False
        self.last_control = now
        self.peer_sent_at, self.answer_due = None, False
        self.valve = ValveShare(now)

    def heard(self, now: float) -> None:
        """A control message of the learner for this actor arrived at ``now``."""
        self.last_control = now

    def on_heartbeat(self, beat: Heartbeat, now: float) -> None:
        """A learner heartbeat of this run: one with ``sent_at`` arms the checks and is
        answered at once; one echoing a heartbeat sent since the pause began ends it."""
        self.heard(now)
        if beat.sent_at is not None:
            self.armed = True
            self.peer_sent_at, self.peer_heard_at = beat.sent_at, now
            self.answer_due = True
        since = self.paused_since
        if since is not None and beat.echo is not None and beat.echo >= since:
            self.end_pause(now, "the learner answered")

    def check_silence(self, now: float, heartbeat_interval: float) -> None:
        """Pause for the link once the learner has been silent on the control channel
        for :data:`LINK_SILENCE_INTERVALS` heartbeat intervals."""
        if not self.armed or self.paused_since is not None:
            return
        silent = now - self.last_control
        if silent > LINK_SILENCE_INTERVALS * heartbeat_interval:
            self.pause(f"heard nothing from the learner for {silent:.1f}s")

    def check_weights(self, version: int) -> None:
        """Pause for the link when weights of ``version`` prove that the learner
        consumed more of some slot than this actor sent on it since its welcome."""
        if self.armed and self.paused_since is None and self.sender.impossible_version(version):
            sent = int(self.sender.sent_steps.min())
            self.pause(
                f"weights version {version} prove more consumption than the "
                f"{sent} steps per slot this actor sent since its welcome (base version "
                f"{self.sender.throttle.base_version}): the learner may have dropped it"
            )

    def pause(self, why: str) -> None:
        """Stop stepping until the learner shows that it still knows this actor (a
        heartbeat echoing one sent from now on) or tells it to register again."""
        now = time.monotonic()
        self.paused_since = now
        self.pause_sent = self.stats["steps_sent"]
        count = int(self.stats.get("link_pauses", 0)) + 1
        self.stats["link_pauses"] = count
        log_sparsely(
            log,
            count,
            logging.INFO,
            "%s; paused until the learner answers (link pause %d)",
            why,
            count,
            quiet=logging.DEBUG,
        )
        self.answer_due = True  # a heartbeat sent after the pause began, at once

    def end_pause(self, now: float, how: str) -> None:
        """Leave a pause for the link (``how``: why), counting what was sent during it."""
        since = self.paused_since
        if since is None:
            return
        self.paused_since = None
        self.last_control = now
        sent = self.stats["steps_sent"] - self.pause_sent
        if sent:
            self.stats["steps_sent_in_link_pause"] = (
                self.stats.get("steps_sent_in_link_pause", 0) + sent
            )
        count = int(self.stats.get("link_pauses", 0))
        log_sparsely(
            log,
            count,
            logging.INFO,
            "link pause %d ended after %.1fs: %s",
            count,
            now - since,
            how,
            quiet=logging.DEBUG,
        )

    def log_reregister(self) -> None:
        """Say why the client registers again: what it sent, and since when it is paused."""
        sent = self.sender.sent_steps
        paused = self.paused_since
        detail = f"{int(sent.min()) if sent.size else 0} steps per slot sent since the welcome"
        if paused is not None:
            detail += (
                f"; {int(self.stats['steps_sent'] - self.pause_sent)} steps sent "
                f"since the link pause {time.monotonic() - paused:.1f}s ago"
            )
        log.warning("learner restarted or forgot this actor; registering again (%s)", detail)

    def heartbeat_due(self, now: float, heartbeat_interval: float) -> bool:
        """Whether to send a heartbeat at ``now`` (then it counts as sent): every
        ``heartbeat_interval``, and at once after a learner heartbeat (so that the
        learner's round trip is not a second late) or a pause for the link."""
        if not self.answer_due and now - self.last_heartbeat < heartbeat_interval:
            return False
        self.last_heartbeat = now
        self.answer_due = False
        return True

    def heartbeat_fields(self, now: float) -> dict[str, float | None]:
        """The link fields (``Heartbeat.LINK_FIELDS``) of a heartbeat sent at ``now``:
        the echo of the newest learner heartbeat, how long it was held, the valve's
        share since the previous heartbeat."""
        echo = self.peer_sent_at
        return {
            "sent_at": now,
            "echo": echo,
            "held": None if echo is None else max(0.0, now - self.peer_heard_at),
            "paused": self.valve.take(now),
        }
