"""The time-major rollout one update trains on (:class:`Rollout`), and the name of a
slot (:data:`SlotKey`). No sockets here: the learner's per-slot FIFOs of fragments that
rollouts are cut from live in :mod:`zmq_rl.learner.queues`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._moved import moved_attribute
from ..wire.protocol import StepArrays
from ..wire.spaces import Value, map_value

SlotKey = tuple[int, int]
"""``(actor_id, slot)``."""


@dataclass
class Rollout(StepArrays):
    """One ``[T, B]`` batch of step arrays, time-major; column ``b`` is ``slots[b]``.

    ``states`` / ``state_starts`` (recurrent runs only): the policy state each column
    acted from at every row where one of its fragments begins (``state_starts`` True
    there); rows that continue a fragment carry no state.

    ``valid`` (multi-agent runs only; None: every row is valid) is False at the rows
    whose slot held no live agent (``Fragment.valid``, docs/protocol.md section
    4.1.4): they are no env step, their contents are placeholders, and training,
    targets and accounting skip them (:meth:`valid_mask`, :attr:`env_steps`)."""

    slots: list[SlotKey]
    versions: np.ndarray  # [T, B] int64 policy version that acted
    bootstrap_obs: Value  # [B, *obs_shape] observation after row T-1
    final_t: np.ndarray  # [K] rows of truncated steps with a final observation
    final_b: np.ndarray  # [K] columns of those steps
    final_obs: Value  # [K, *obs_shape]
    states: np.ndarray | None = None  # [T, B, S] float32
    state_starts: np.ndarray | None = None  # [T, B] bool
    valid: np.ndarray | None = None  # [T, B] bool; None: every row valid

    @property
    def num_steps(self) -> int:
        """T."""
        return int(self.rewards.shape[0])

    @property
    def num_slots(self) -> int:
        """B."""
        return int(self.rewards.shape[1])

    def valid_mask(self) -> np.ndarray:
        """``[T, B]`` bool: which rows are real env steps (all True without ``valid``)."""
        if self.valid is None:
            return np.ones(self.rewards.shape[:2], bool)
        return self.valid

    @property
    def env_steps(self) -> int:
        """The env steps in this rollout: its valid rows (``T * B`` without ``valid``).
        What the learner counts towards ``total_env_steps`` and its steps/s: a row of a
        slot without a live agent stepped no agent."""
        if self.valid is None:
            return self.num_steps * self.num_slots
        return int(np.count_nonzero(self.valid))

    def composition(self) -> dict[str, float]:
        """What this rollout is made of, for the update's metrics row: ``batch/rows``
        (its env steps), ``batch/columns`` (segments), ``batch/slots`` and
        ``batch/actors`` (distinct ones: a rows batch may take several segments of one
        slot, and none of another)."""
        return {
            "batch/rows": float(self.env_steps),
            "batch/columns": float(self.num_slots),
            "batch/slots": float(len(set(self.slots))),
            "batch/actors": float(len({actor for actor, _ in self.slots})),
        }

    def columns(self, index: np.ndarray) -> Rollout:
        """The rollout of the columns ``index`` (ascending column numbers) only: what
        one policy of a several-policy run trains on (its agents' slots). Final
        observations follow their columns, renumbered."""
        index = np.asarray(index, np.int64)
        renumber = np.full(self.num_slots, -1, np.int64)
        renumber[index] = np.arange(len(index))
        kept = np.flatnonzero(renumber[self.final_b] >= 0)
        valid = None if self.valid is None else self.valid[:, index]
        return Rollout(
            **self.select((slice(None), index)).step_arrays(),
            slots=[self.slots[int(b)] for b in index],
            versions=self.versions[:, index],
            bootstrap_obs=map_value(lambda a: a[index], self.bootstrap_obs),
            final_t=self.final_t[kept],
            final_b=renumber[self.final_b[kept]],
            final_obs=map_value(lambda a: a[kept], self.final_obs),
            states=None if self.states is None else self.states[:, index],
            state_starts=None if self.state_starts is None else self.state_starts[:, index],
            valid=None if valid is None or valid.all() else valid,
        )

    def slot_env_steps(self) -> np.ndarray:
        """``[B]`` int64: the valid rows of each column (``slots[b]``'s env steps)."""
        if self.valid is None:
            return np.full(self.num_slots, self.num_steps, np.int64)
        return np.count_nonzero(self.valid, axis=0).astype(np.int64)


def __getattr__(name: str) -> object:
    """``SlotQueues`` moved to :mod:`zmq_rl.learner.queues` (the rl wing holds no wire
    messages); the old name still imports, with a DeprecationWarning
    (:func:`zmq_rl._moved.moved_attribute`, docs/api.md)."""
    return moved_attribute(__name__, name)
