"""How long each actor may be silent before the learner declares it dead.

``actor_timeout`` is the floor, as TCP's minimum retransmission timeout is: an actor
whose link never showed a long gap is declared dead after it. A link that did show
long gaps (a busy host stalls an actor's process for seconds; a long link delays
its messages) gets more: :data:`SILENCE_MULTIPLE` times the larger of its smoothed
gap plus four mean deviations (TCP's ``SRTT + 4 RTTVAR``, RFC 6298) and the longest
of its last :data:`GAP_WINDOW` gaps, capped at the run's patience for no progress
at all (``max(actor_timeout, starvation_timeout)``). So a slow but heartbeating
actor is never declared dead for being as slow as it was a minute ago, and a dead
one is still declared dead in about ``actor_timeout`` when its link was steady.

Gaps are measured per kind of message: between two heartbeats (on the actor's own
clock, their ``sent_at``, so the learner's own long updates do not count as the
actor's silence; the arrival time when a heartbeat carries none), and between two
fragments (their arrival: the every-slot rollout's "no fragment while it waited"
rule, ``batch_mode slots``).

:class:`Patience` is the same idea for the learner's own wait: it starves only when
nothing arrives for ``starvation_timeout``, not when a rollout takes that long.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = [
    "DEV_GAIN",
    "GAP_GAIN",
    "GAP_WINDOW",
    "SILENCE_MULTIPLE",
    "GapEstimate",
    "Patience",
    "silence_limit",
]

GAP_GAIN = 0.125
"""Weight of a new gap in the smoothed gap (TCP's SRTT gain, RFC 6298's alpha)."""
DEV_GAIN = 0.25
"""Weight of a new gap's deviation in the mean deviation (RFC 6298's beta)."""
SILENCE_MULTIPLE = 2.0
"""How many times what the link showed (its smoothed gap plus four deviations, or its
longest recent gap) an actor may be silent before it is declared dead."""
GAP_WINDOW = 64
"""Gaps whose longest counts (about a minute of heartbeats): a stall is remembered for
that long, not only until the smoothed estimate decays (a few heartbeats)."""


@dataclass
class GapEstimate:
    """The intervals between one actor's messages of one kind: smoothed, their mean
    deviation, and the most recent ones (seconds)."""

    mean: float | None = None
    """Smoothed gap (None before the first gap, i.e. before the second message)."""
    dev: float = 0.0
    """Smoothed mean deviation of the gaps from :attr:`mean`."""
    last: float | None = None
    """When the newest message was sent (or arrived)."""
    longest: float = 0.0
    """The longest gap seen (for the actor's report line)."""
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=GAP_WINDOW))

    def add(self, at: float) -> None:
        """A message sent (or read) at ``at``; a time before the previous one is ignored
        (a peer's clock is not ours)."""
        if self.last is not None:
            if at < self.last:
                return
            gap = at - self.last
            if self.mean is None:
                self.mean = gap
            else:
                self.dev += DEV_GAIN * (abs(gap - self.mean) - self.dev)
                self.mean += GAP_GAIN * (gap - self.mean)
            self.recent.append(gap)
            self.longest = max(self.longest, gap)
        self.last = at

    def shown(self) -> float | None:
        """What the link has shown: the larger of ``mean + 4 dev`` and its longest
        recent gap (None before its first gap)."""
        if self.mean is None:
            return None
        return max(self.mean + 4.0 * self.dev, max(self.recent, default=0.0))


def silence_limit(gaps: GapEstimate, floor: float, cap: float) -> float:
    """Seconds of silence after which an actor whose link showed ``gaps`` is declared
    dead: :data:`SILENCE_MULTIPLE` times what it showed, at least ``floor``
    (``actor_timeout``) and at most ``max(floor, cap)``."""
    shown = gaps.shown()
    if shown is None:
        return floor
    return max(floor, min(max(floor, cap), SILENCE_MULTIPLE * shown))


class Patience:
    """The learner's patience while it fills a rollout: spent once ``progress()`` (a
    count that grows with what arrives, e.g. the rows received) has not moved for
    ``seconds``. A fill on a slow (busy) host that keeps receiving rows never runs out
    of it, however long the rollout takes; one that receives nothing does."""

    def __init__(self, seconds: float, progress: Callable[[], int]) -> None:
        self.seconds = seconds
        self.progress = progress
        self.seen = progress()
        self.since = time.monotonic()

    def spent(self) -> bool:
        """Whether ``seconds`` passed since ``progress()`` last moved."""
        now, seen = time.monotonic(), self.progress()
        if seen != self.seen:
            self.seen, self.since = seen, now
        return now - self.since > self.seconds
