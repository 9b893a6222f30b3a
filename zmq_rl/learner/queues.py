"""The learner's per-slot FIFOs of experience fragments, cut into time-major rollouts.

A *slot* is one env instance of one actor, named by ``(actor_id, slot)``. A fragment
carries rows of one or more slots of its actor (``[T, B]``); each of its columns
queues under its slot in arrival (sequence) order. Two ways to take a rollout
(docs/design.md section 10):

* **every slot** (``batch_mode`` ``slots``): ``num_steps`` rows of every member slot,
  taken when every one of them holds that many (:meth:`SlotQueues.ready`);
* **a fixed batch** (``batch_mode`` ``rows``): the oldest rows by the arrival of their
  fragments, from whichever slots delivered, in columns of at most ``num_steps`` rows
  of one slot (:meth:`SlotQueues.oldest_rows`): no row waits behind one that arrived
  later, so no slot is starved or favoured; the last batch of a run ends at the env
  step its budget has left. Rows acted by weights more than ``max_policy_lag`` versions
  old are dropped before (:meth:`SlotQueues.drop_stale`).

Rows beyond what is taken stay queued for the next rollout, so nothing is dropped
unless counted. No sockets here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

import numpy as np

from ..rl.rollout import Rollout, SlotKey
from ..wire.protocol import Fragment, StepArrays
from ..wire.spaces import map_value

__all__ = ["SlotQueues"]


class _SlotQueue:
    """FIFO of ``(fragment, column, arrival)`` entries of one slot, with a read cursor
    into the first one; ``removed`` counts the rows taken or dropped since the queue
    began (the learner's grants are counted from it)."""

    __slots__ = ("entries", "cursor", "rows", "removed")

    def __init__(self) -> None:
        self.entries: deque[tuple[Fragment, int, int]] = deque()
        self.cursor = 0
        self.rows = 0
        self.removed = 0

    def push(self, fragment: Fragment, column: int, arrival: int) -> None:
        self.entries.append((fragment, column, arrival))
        self.rows += fragment.length

    def take(self, n: int) -> list[tuple[Fragment, int, int, int]]:
        """Pop ``n`` rows as ``(fragment, column, start, stop)`` pieces, oldest first."""
        pieces = []
        self.removed += n
        while n > 0:
            fragment, column, _ = self.entries[0]
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

    def drop_older_than(self, version: int) -> tuple[int, list[Fragment]]:
        """Drop the leading rows acted by a version below ``version`` (a slot's versions
        never decrease, so they lead the queue); return (rows, fragments) dropped."""
        rows, dropped = 0, []
        while self.entries and self.entries[0][0].version < version:
            fragment = self.entries.popleft()[0]
            rows += fragment.length - self.cursor
            self.cursor = 0
            dropped.append(fragment)
        self.rows -= rows
        self.removed += rows
        return rows, dropped

    def arrivals(self) -> Iterator[tuple[int, int, np.ndarray | None]]:
        """``(arrival, rows, valid)`` of each queued entry, oldest first (the first one's
        rows after the cursor; ``valid``: those rows' ``valid`` column, None when the
        fragment has none, i.e. every row is valid)."""
        cursor = self.cursor
        for fragment, column, arrival in self.entries:
            valid = None if fragment.valid is None else fragment.valid[cursor:, column]
            yield arrival, fragment.length - cursor, valid
            cursor = 0

    def valid_rows(self, n: int, skip: int = 0) -> int:
        """The valid rows (env steps) among the ``n`` queued rows after the first
        ``skip`` (fewer when fewer are queued)."""
        steps = 0
        for _, rows, valid in self.arrivals():
            if n <= 0:
                break
            lo = min(skip, rows)
            hi = min(rows, lo + n)
            steps += hi - lo if valid is None else int(np.count_nonzero(valid[lo:hi]))
            skip -= lo
            n -= hi - lo
        return steps


class SlotQueues:
    """The learner's per-slot FIFOs.

    Bounded by construction: each actor's staleness valve caps what it may send
    ahead of consumption (``max_lead_steps`` rows per slot), so no queue grows
    without bound while its actor follows the protocol.
    """

    def __init__(self) -> None:
        self._queues: dict[SlotKey, _SlotQueue] = {}
        self._arrivals = 0  # fragments pushed so far: each one's arrival index

    def push(self, fragment: Fragment) -> None:
        """Queue each column of a validated fragment behind the earlier rows of its slot."""
        arrival = self._arrivals
        self._arrivals += 1
        for column, slot in enumerate(fragment.slots.tolist()):
            key = (fragment.actor_id, slot)
            queue = self._queues.get(key)
            if queue is None:
                queue = self._queues[key] = _SlotQueue()
            queue.push(fragment, column, arrival)

    def rows(self, key: SlotKey) -> int:
        """Rows queued for ``key``."""
        queue = self._queues.get(key)
        return queue.rows if queue else 0

    def removed(self, key: SlotKey) -> int:
        """Rows of ``key`` taken or dropped since its queue began (its registration's
        first fragment): what the learner has used up of that slot."""
        queue = self._queues.get(key)
        return queue.removed if queue else 0

    def received(self, key: SlotKey) -> int:
        """Rows of ``key`` queued so far in its registration (queued + removed)."""
        queue = self._queues.get(key)
        return queue.rows + queue.removed if queue else 0

    def oldest_rows(
        self, slots: list[SlotKey], rows: int, length: int, steps: int | None = None
    ) -> list[tuple[SlotKey, int]] | None:
        """A fixed batch of ``rows`` rows of ``slots``, the oldest by the arrival of their
        fragments (ties, one fragment's slots: in slot order), as columns ``(slot, n)`` of
        at most ``length`` consecutive rows of one slot: each slot's rows in the batch,
        in stream order, cut into full columns and (last) one shorter one. Arrival order
        is the fairness rule: a row never waits behind one that arrived after it, so a
        slow slot is not starved (its rows go into the next batch as they come) and a
        fast one takes no more than it delivered.

        ``steps`` (None: no cap; at least 1) caps the batch's valid rows, its env steps
        (every row of a fragment without ``valid`` is one): taken in the same order, the
        batch ends at its ``steps``-th valid row when that comes before its ``rows``-th
        row (the last update of a run takes exactly the env steps its budget has left,
        whatever share of the rows is not valid). None while the rows queued reach
        neither cap."""
        queued = [(a, key, n, valid) for key in slots if key in self._queues
                  for a, n, valid in self._queues[key].arrivals()]  # fmt: skip
        taken: dict[SlotKey, int] = {}
        left = rows
        steps_left = rows if steps is None else max(1, min(rows, steps))
        for _, key, n, valid in sorted(queued, key=lambda entry: entry[:2]):
            n = min(n, left)
            found = n if valid is None else int(np.count_nonzero(valid[:n]))
            if found >= steps_left:  # the cap on env steps ends the batch in this entry
                n = steps_left if valid is None else int(np.flatnonzero(valid)[steps_left - 1]) + 1
                found = steps_left
            taken[key] = taken.get(key, 0) + n
            left -= n
            steps_left -= found
            if not left or not steps_left:
                break
        else:
            return None  # neither cap reached: the batch is not queued yet
        columns = []
        for key in sorted(taken, key=lambda k: (self._first_arrival(k), k)):
            full, rest = divmod(taken[key], length)
            columns += [(key, length)] * full + ([(key, rest)] if rest else [])
        return columns

    def valid_rows(self, key: SlotKey, n: int, skip: int = 0) -> int:
        """The valid rows (env steps) among the next ``n`` rows queued for ``key`` after
        its first ``skip`` (what a column of them would count)."""
        queue = self._queues.get(key)
        return queue.valid_rows(n, skip) if queue else 0

    def _first_arrival(self, key: SlotKey) -> int:
        return self._queues[key].entries[0][2]

    def drop_stale(self, version: int) -> tuple[int, int]:
        """Drop every queued row acted by a version below ``version`` (older than the
        lag bound); return (fragments, rows) dropped (a fragment counts once however
        many of its slots it held)."""
        rows, fragments = 0, set()
        for queue in self._queues.values():
            if queue.entries and queue.entries[0][0].version < version:
                dropped_rows, dropped = queue.drop_older_than(version)
                rows += dropped_rows
                fragments.update(id(f) for f in dropped)
        return len(fragments), rows

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
            fragments.update(id(fragment) for fragment, _, _ in queue.entries)
            rows += queue.rows
        return len(fragments), rows

    def total_rows(self) -> int:
        """Rows queued over all slots."""
        return sum(q.rows for q in self._queues.values())

    def total_fragments(self) -> int:
        """Fragments (whole or partly consumed) queued over all slots."""
        return len({id(f) for q in self._queues.values() for f, _, _ in q.entries})

    def take(
        self, slots: list[SlotKey], num_steps: int, lengths: list[int] | None = None
    ) -> Rollout:
        """Pop ``num_steps`` rows of every slot into a :class:`Rollout` (a slot named
        twice gives two columns, its next rows in stream order: each column is
        bootstrapped from the row after it, so targets stay exact). ``lengths``: the rows
        of each column (at most ``num_steps``), written at its last rows; the rows before
        them are padding, not valid (``Rollout.valid``): a copy of the column's first row
        with reward 0, which no target, loss or count reads.

        Neighbouring rollout columns whose rows come from neighbouring columns of the
        same fragments (an actor's lockstep flushes) are copied as one block: the cost
        is per fragment, not per slot. ``valid`` is assembled from the fragments'
        ``valid`` (a fragment without it: all rows valid) and stays None when every
        row taken is valid."""
        lengths = lengths or [num_steps] * len(slots)
        columns = [self._queues[key].take(n) for key, n in zip(slots, lengths, strict=True)]
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
            t = T - lengths[b]  # padding before a shorter column (equal in a block)
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
        short = [b for b in range(B) if lengths[b] < T]
        if short:
            valid = np.ones((T, B), bool) if valid is None else valid
            for b in short:
                _pad(steps, versions, valid, b, T - lengths[b])
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


def _pad(steps: StepArrays, versions: np.ndarray, valid: np.ndarray, b: int, pad: int) -> None:
    """Rows ``0 .. pad - 1`` of column ``b``: padding before its ``T - pad`` rows, copies
    of its first row that are not valid, with reward, value and log-prob 0 and no end."""
    rows = slice(0, pad)
    steps.write((rows, b), steps.select((slice(pad, pad + 1), b)))
    for name in ("rewards", "values", "log_probs"):
        getattr(steps, name)[rows, b] = 0
    steps.terminated[rows, b] = steps.truncated[rows, b] = False
    versions[rows, b] = versions[pad, b]
    valid[rows, b] = False


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
