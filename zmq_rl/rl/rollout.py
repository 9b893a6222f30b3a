"""Per-slot FIFOs of experience fragments, assembled into time-major rollouts.

A *slot* is one env instance of one actor, named by ``(actor_id, slot)``. A fragment
carries rows of one or more slots of its actor (``[T, B]``); each of its columns
queues under its slot in arrival (sequence) order; a rollout of ``num_steps`` rows is taken
when every member slot holds at least that many rows. Rows beyond the quota stay
queued for the next rollout, so nothing is dropped. No sockets here.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from ..wire.protocol import Fragment, StepArrays
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


class _SlotQueue:
    """FIFO of ``(fragment, column)`` entries of one slot, with a read cursor into the
    first one."""

    __slots__ = ("entries", "cursor", "rows")

    def __init__(self) -> None:
        self.entries: deque[tuple[Fragment, int]] = deque()
        self.cursor = 0
        self.rows = 0

    def push(self, fragment: Fragment, column: int) -> None:
        self.entries.append((fragment, column))
        self.rows += fragment.length

    def take(self, n: int) -> list[tuple[Fragment, int, int, int]]:
        """Pop ``n`` rows as ``(fragment, column, start, stop)`` pieces, oldest first."""
        pieces = []
        while n > 0:
            fragment, column = self.entries[0]
            stop = min(fragment.length, self.cursor + n)
            pieces.append((fragment, column, self.cursor, stop))
            n -= stop - self.cursor
            self.rows -= stop - self.cursor
            if stop == fragment.length:
                self.entries.popleft()
                self.cursor = 0
            else:
                self.cursor = stop
        return pieces


class SlotQueues:
    """The learner's per-slot FIFOs.

    Bounded by construction: each actor's staleness valve caps what it may send
    ahead of consumption (``max_lead_steps`` rows per slot), so no queue grows
    without bound while its actor follows the protocol.
    """

    def __init__(self) -> None:
        self._queues: dict[SlotKey, _SlotQueue] = {}

    def push(self, fragment: Fragment) -> None:
        """Queue each column of a validated fragment behind the earlier rows of its slot."""
        for column, slot in enumerate(fragment.slots.tolist()):
            key = (fragment.actor_id, slot)
            queue = self._queues.get(key)
            if queue is None:
                queue = self._queues[key] = _SlotQueue()
            queue.push(fragment, column)

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
        """Forget every queue of ``actor_id``; return (fragments, rows) dropped (a
        fragment counts once however many of its slots were queued)."""
        fragments: set[int] = set()
        rows = 0
        for key in [k for k in self._queues if k[0] == actor_id]:
            queue = self._queues.pop(key)
            fragments.update(id(fragment) for fragment, _ in queue.entries)
            rows += queue.rows
        return len(fragments), rows

    def total_rows(self) -> int:
        """Rows queued over all slots."""
        return sum(q.rows for q in self._queues.values())

    def total_fragments(self) -> int:
        """Fragments (whole or partly consumed) queued over all slots."""
        return len({id(f) for q in self._queues.values() for f, _ in q.entries})

    def take(self, slots: list[SlotKey], num_steps: int) -> Rollout:
        """Pop ``num_steps`` rows of every slot into a :class:`Rollout`.

        Neighbouring rollout columns whose rows come from neighbouring columns of the
        same fragments (an actor's lockstep flushes) are copied as one block: the cost
        is per fragment, not per slot. ``valid`` is assembled from the fragments'
        ``valid`` (a fragment without it: all rows valid) and stays None when every
        row taken is valid."""
        columns = [self._queues[key].take(num_steps) for key in slots]
        first = columns[0][0][0]
        T, B = num_steps, len(slots)
        steps = StepArrays.allocate((T, B), first.obs, first.actions, 2)
        versions = np.empty((T, B), np.int64)
        bootstrap_obs = map_value(lambda a: np.empty((B, *a.shape[1:]), a.dtype), first.next_obs)
        recurrent = first.state is not None
        states = np.zeros((T, B, first.state.shape[1]), np.float32) if recurrent else None
        starts = np.zeros((T, B), bool) if recurrent else None
        valid: np.ndarray | None = None  # allocated at the first fragment that has one
        final_t, final_b, final_obs = [], [], []
        b = 0
        while b < B:
            pieces = columns[b]
            e = b + 1
            while e < B and _continues(pieces, columns[e], e - b):
                e += 1
            t = 0
            for fragment, column, start, stop in pieces:
                n, cols = stop - start, slice(column, column + e - b)
                steps.write(
                    (slice(t, t + n), slice(b, e)), fragment.select((slice(start, stop), cols))
                )
                versions[t : t + n, b:e] = fragment.version
                if fragment.valid is not None:
                    if valid is None:
                        valid = np.ones((T, B), bool)
                    valid[t : t + n, b:e] = fragment.valid[start:stop, cols]
                if recurrent and start == 0 and fragment.state is not None:
                    states[t, b:e] = fragment.state[cols]
                    starts[t, b:e] = True
                if fragment.final_obs_index.size:
                    rows, cells = np.divmod(
                        fragment.final_obs_index.astype(np.int64), fragment.num_slots
                    )
                    mine = (
                        (cells >= cols.start)
                        & (cells < cols.stop)
                        & (rows >= start)
                        & (rows < stop)
                    )
                    for k in np.flatnonzero(mine):
                        final_t.append(t + int(rows[k]) - start)
                        final_b.append(b + int(cells[k]) - column)
                        final_obs.append(map_value(lambda a, k=k: a[k], fragment.final_obs))
                t += n
            fragment, column, _, stop = pieces[-1]
            cols = slice(column, column + e - b)
            after = (
                map_value(lambda a, s=stop, c=cols: a[s, c], fragment.obs)
                if stop < fragment.length
                else map_value(lambda a, c=cols: a[c], fragment.next_obs)
            )
            map_value(
                lambda mine, theirs, r=slice(b, e): mine.__setitem__(r, theirs),
                bootstrap_obs,
                after,
            )
            b = e
        return Rollout(
            **steps.step_arrays(),
            slots=list(slots),
            versions=versions,
            bootstrap_obs=bootstrap_obs,
            final_t=np.asarray(final_t, np.int64),
            final_b=np.asarray(final_b, np.int64),
            final_obs=(
                map_value(lambda *rows: np.stack(rows), *final_obs)
                if final_obs
                else map_value(lambda a: np.zeros((0, *a.shape[1:]), a.dtype), first.next_obs)
            ),
            states=states,
            state_starts=starts,
            valid=None if valid is None or valid.all() else valid,
        )


def _continues(
    pieces: list[tuple[Fragment, int, int, int]],
    other: list[tuple[Fragment, int, int, int]],
    offset: int,
) -> bool:
    """Whether ``other``'s rows are ``pieces``' rows ``offset`` columns to the right in
    the same fragments (so both columns can be copied as one block)."""
    return len(other) == len(pieces) and all(
        f is g and c + offset == d and s == u and e == v
        for (f, c, s, e), (g, d, u, v) in zip(pieces, other, strict=True)
    )
