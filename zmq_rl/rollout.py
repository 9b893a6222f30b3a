"""Per-slot FIFOs of experience fragments, assembled into time-major rollouts.

A *slot* is one env instance of one actor, named by ``(actor_id, slot)``. Fragments
queue per slot in arrival (sequence) order; a rollout of ``num_steps`` rows is taken
when every member slot holds at least that many rows. Rows beyond the quota stay
queued for the next rollout, so nothing is dropped. No sockets here.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from .protocol import Fragment, StepArrays

SlotKey = tuple[int, int]
"""``(actor_id, slot)``."""


@dataclass
class Rollout(StepArrays):
    """One ``[T, B]`` batch of step arrays, time-major; column ``b`` is ``slots[b]``."""

    slots: list[SlotKey]
    versions: np.ndarray  # [T, B] int64 policy version that acted
    bootstrap_obs: np.ndarray  # [B, *obs_shape] observation after row T-1
    final_t: np.ndarray  # [K] rows of truncated steps with a final observation
    final_b: np.ndarray  # [K] columns of those steps
    final_obs: np.ndarray  # [K, *obs_shape]

    @property
    def num_steps(self) -> int:
        """T."""
        return int(self.rewards.shape[0])

    @property
    def num_slots(self) -> int:
        """B."""
        return int(self.rewards.shape[1])


class _SlotQueue:
    """FIFO of fragments of one slot, with a read cursor into the first one."""

    __slots__ = ("fragments", "cursor", "rows")

    def __init__(self) -> None:
        self.fragments: deque[Fragment] = deque()
        self.cursor = 0
        self.rows = 0

    def push(self, fragment: Fragment) -> None:
        self.fragments.append(fragment)
        self.rows += fragment.length

    def take(self, n: int) -> list[tuple[Fragment, int, int]]:
        """Pop ``n`` rows as ``(fragment, start, stop)`` pieces, oldest first."""
        pieces = []
        while n > 0:
            fragment = self.fragments[0]
            stop = min(fragment.length, self.cursor + n)
            pieces.append((fragment, self.cursor, stop))
            n -= stop - self.cursor
            self.rows -= stop - self.cursor
            if stop == fragment.length:
                self.fragments.popleft()
                self.cursor = 0
            else:
                self.cursor = stop
        return pieces

    def peek_next_obs(self, fragment: Fragment, stop: int) -> np.ndarray:
        """The observation after row ``stop - 1`` of ``fragment``."""
        return fragment.obs[stop] if stop < fragment.length else fragment.next_obs


class SlotQueues:
    """The learner's per-slot FIFOs.

    Bounded by construction: each actor's staleness valve caps what it may send
    ahead of consumption (``max_lead_steps`` rows per slot), so no queue grows
    without bound while its actor follows the protocol.
    """

    def __init__(self) -> None:
        self._queues: dict[SlotKey, _SlotQueue] = {}

    def push(self, fragment: Fragment) -> None:
        """Queue a validated fragment behind the earlier ones of its slot."""
        key = (fragment.actor_id, fragment.slot)
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = _SlotQueue()
        queue.push(fragment)

    def rows(self, key: SlotKey) -> int:
        """Rows queued for ``key``."""
        queue = self._queues.get(key)
        return queue.rows if queue else 0

    def ready(self, slots: list[SlotKey], num_steps: int) -> bool:
        """Whether every slot in ``slots`` holds ``num_steps`` rows."""
        return all(self.rows(key) >= num_steps for key in slots)

    def short_slots(self, slots: list[SlotKey], num_steps: int) -> list[SlotKey]:
        """The slots that hold fewer than ``num_steps`` rows."""
        return [key for key in slots if self.rows(key) < num_steps]

    def drop_actor(self, actor_id: int) -> tuple[int, int]:
        """Forget every queue of ``actor_id``; return (fragments, rows) dropped."""
        fragments = rows = 0
        for key in [k for k in self._queues if k[0] == actor_id]:
            queue = self._queues.pop(key)
            fragments += len(queue.fragments)
            rows += queue.rows
        return fragments, rows

    def total_rows(self) -> int:
        """Rows queued over all slots."""
        return sum(q.rows for q in self._queues.values())

    def total_fragments(self) -> int:
        """Fragments (whole or partly consumed) queued over all slots."""
        return sum(len(q.fragments) for q in self._queues.values())

    def take(self, slots: list[SlotKey], num_steps: int) -> Rollout:
        """Pop ``num_steps`` rows of every slot into a :class:`Rollout`."""
        columns = []
        for key in slots:
            queue = self._queues[key]
            pieces = queue.take(num_steps)
            columns.append((queue, pieces))
        first = columns[0][1][0][0]
        T, B = num_steps, len(slots)
        obs_shape = first.obs.shape[1:]
        steps = StepArrays.allocate(
            (T, B), obs_shape, first.obs.dtype, first.actions.shape[1:], first.actions.dtype
        )
        versions = np.empty((T, B), np.int64)
        bootstrap_obs = np.empty((B, *obs_shape), first.obs.dtype)
        final_t, final_b, final_obs = [], [], []
        for b, (queue, pieces) in enumerate(columns):
            t = 0
            for fragment, start, stop in pieces:
                n = stop - start
                steps.write((slice(t, t + n), b), fragment.select(slice(start, stop)))
                versions[t : t + n, b] = fragment.version
                for k, row in enumerate(fragment.final_obs_index):
                    if start <= row < stop:
                        final_t.append(t + int(row) - start)
                        final_b.append(b)
                        final_obs.append(fragment.final_obs[k])
                t += n
            fragment, _, stop = pieces[-1]
            bootstrap_obs[b] = queue.peek_next_obs(fragment, stop)
        return Rollout(
            **steps.step_arrays(),
            slots=list(slots),
            versions=versions,
            bootstrap_obs=bootstrap_obs,
            final_t=np.asarray(final_t, np.int64),
            final_b=np.asarray(final_b, np.int64),
            final_obs=(
                np.stack(final_obs) if final_obs else np.zeros((0, *obs_shape), first.obs.dtype)
            ),
        )
