"""The staleness valve an actor runs on itself (the client applies it; no sockets).

The learner states the valve's parameters in the welcome's
:class:`~zmq_rl.wire.protocol.RunSettings`; :meth:`ActorThrottle.from_settings` is the one
place that turns them into a throttle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .protocol import RunSettings


@dataclass(frozen=True)
class ActorThrottle:
    """The staleness valve of one actor.

    Policy version ``v`` proves that the learner consumed
    ``(v - base_version) * steps_per_broadcast`` steps from every slot of this actor,
    so the actor pauses once its steps per slot reach that mark plus
    ``max_lead_steps`` and waits for the next broadcast. The budget is cumulative:
    a per-version allowance would let production outpace consumption and grow the
    backlog (and the staleness) linearly over the run.

    ``base_version`` is the version from which the learner consumes this actor's
    slots: 0 for the actors present at the start, later for an actor that joins a
    running learner (its welcome says which). ``max_lead_steps == 0`` disables the
    valve (unbounded lead).

    ``grant`` (not None: the actor announced grants and the learner takes fixed-size
    batches from whichever slots delivered, docs/design.md section 5): the steps per
    slot the learner allows this registration to have recorded, which replaces the
    rule above. The learner raises it as it consumes this actor's rows (the largest
    grant heard counts); versions then prove nothing about this actor's slots.

    ``rows_batches``: the learner takes fixed-size batches from whichever slots
    delivered (its welcome's ``batch_rows``) but paces this actor with ``S`` and ``L``:
    the budget is as above, but a version proves nothing about this actor's slots, so
    it never means the registration is gone (:meth:`impossible_for_member`).
    """

    steps_per_broadcast: int
    max_lead_steps: int
    base_version: int = 0
    grant: int | None = None
    rows_batches: bool = False

    @classmethod
    def disabled(cls) -> ActorThrottle:
        """A throttle that never pauses (unbounded lead)."""
        return cls(steps_per_broadcast=0, max_lead_steps=0)

    def budget(self, version: int) -> int:
        """Steps per slot this actor may have sent while running ``version`` (its
        grant, when it has one)."""
        if self.grant is not None:
            return self.grant
        return self.proven(version) + self.max_lead_steps

    def proven(self, version: int) -> int:
        """Steps per slot that ``version`` proves the learner consumed from this actor
        (if the actor is still a member of the rollout; 0 under grants, where a version
        proves nothing about one actor's slots)."""
        if self.grant is not None:
            return 0
        return max(0, version - self.base_version) * self.steps_per_broadcast

    def regrant(self, grant: int) -> ActorThrottle:
        """This throttle with the learner's ``grant`` adopted when it is larger than the
        one held (a grant never shrinks: a heartbeat overtaken by a newer one changes
        nothing); unchanged for a throttle that follows the ``S``/``L`` rule."""
        if self.grant is None or grant <= self.grant:
            return self
        return replace(self, grant=grant)

    def impossible_for_member(self, version: int, steps_sent: int) -> bool:
        """Whether weights of ``version`` prove more consumption than an actor that sent
        ``steps_sent`` steps per slot (its least-advanced slot) can have supplied: the
        learner trained on without this actor, so its registration is gone. Never under
        grants or rows batches, where a version proves nothing about one actor's slots
        (docs/protocol.md section 5.5, rule (2) of the pause for the link)."""
        return not self.rows_batches and self.proven(version) > steps_sent

    def should_pause(self, steps_sent: int, version: int) -> bool:
        """Whether an actor that sent ``steps_sent`` steps per slot must wait."""
        if self.grant is not None:
            return steps_sent >= self.grant
        return self.max_lead_steps != 0 and steps_sent >= self.budget(version)

    @classmethod
    def from_settings(
        cls, settings: RunSettings, base_version: int, grant: int | None = None
    ) -> ActorThrottle:
        """The valve for an actor welcomed with ``settings`` whose slots are consumed
        from ``base_version`` on, or that follows the welcome's ``grant`` (not None)."""
        return cls(
            steps_per_broadcast=settings.steps_per_broadcast,
            max_lead_steps=settings.max_lead_steps,
            base_version=base_version,
            grant=grant,
            rows_batches=settings.batch_rows > 0,
        )


def slot_cap(settings: RunSettings) -> int:
    """The most rows an actor that obeys its valve can have queued per slot at the
    learner: its lead (``max_lead_steps``), the broadcast cycle the learner consumes
    before the version that proves it moves (``steps_per_broadcast``), and one fragment
    in flight (``fragment_length``). The learner refuses a fragment past it
    (``over_lead``): that actor ignores the valve."""
    return settings.max_lead_steps + settings.steps_per_broadcast + settings.fragment_length


def fitting_max_lead_steps(
    *,
    steps_per_broadcast: int,
    fragment_length: int,
    step_rate: float,
    round_trip: float,
    cycle_time: float,
) -> int:
    """The smallest ``max_lead_steps`` that keeps an actor stepping through a round trip.

    After the learner consumed the ``steps_per_broadcast`` (S) rows of a cycle from a
    slot, it trains for ``cycle_time`` (U, its update time per broadcast cycle), and
    the weights that prove it take half a round trip to the actor, whose rows took
    the other half to arrive: the proof of a row reaches the actor ``round_trip + U``
    after the row was made. An actor stepping ``r`` steps per second per slot must not
    reach its budget meanwhile, so

        max_lead_steps >= S + r * (round_trip + U)

    where ``r`` is ``step_rate`` (the actor's rate while not paused) but at most
    ``S / U``, the rate at which the learner can consume a slot (a faster actor is
    held by the learner, not by the link). Rounded up to a multiple of
    ``fragment_length``.
    """
    rate = step_rate
    if cycle_time > 0:
        rate = min(rate, steps_per_broadcast / cycle_time)
    need = steps_per_broadcast + max(0.0, rate) * max(0.0, round_trip + cycle_time)
    chunk = max(1, fragment_length)
    return int(math.ceil(need / chunk - 1e-9) * chunk)  # (not up for a rounding error)
