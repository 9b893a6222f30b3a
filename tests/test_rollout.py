"""Tests for zmq_rl.learner.queues.SlotQueues: per-slot FIFO assembly of [T, B] rollouts."""

from __future__ import annotations

import numpy as np

from zmq_rl.learner.queues import SlotQueues
from zmq_rl.wire.protocol import Fragment


def fragment(
    actor_id: int,
    slot: int,
    start: int,
    length: int,
    version: int = 0,
    truncated_rows=(),
    terminated_rows=(),
) -> Fragment:
    """Rows ``start .. start+length-1`` of a slot: every per-row quantity encodes
    (actor, slot, global row) so the assembled rollout can be checked exactly."""
    steps = np.arange(start, start + length)
    tag = 1000 * actor_id + 100 * slot
    obs = np.stack([tag + steps, -(tag + steps)], axis=1).astype(np.float32)
    truncated = np.zeros(length, bool)
    terminated = np.zeros(length, bool)
    truncated[list(truncated_rows)] = True
    terminated[list(terminated_rows)] = True
    final_rows = np.flatnonzero(truncated & ~terminated)
    return Fragment.for_slot(
        slot,
        token=bytes(16),
        actor_id=actor_id,
        version=version,
        seq=0,
        run_id="r",
        obs=obs,
        actions=(steps % 2).astype(np.int64) + 10 * slot,
        rewards=(tag + steps).astype(np.float32) / 10,
        terminated=terminated,
        truncated=truncated,
        values=(tag + steps).astype(np.float32) + 0.5,
        log_probs=-(tag + steps).astype(np.float32),
        next_obs=np.array([tag + start + length, -(tag + start + length)], np.float32),
        final_obs_index=final_rows.astype(np.int32),
        final_obs=np.stack([np.full(2, 5000.0 + tag + start + r, np.float32) for r in final_rows])
        if len(final_rows)
        else np.zeros((0, 2), np.float32),
    )


def expected_obs(actor_id: int, slot: int, rows) -> np.ndarray:
    tag = 1000 * actor_id + 100 * slot
    rows = np.asarray(rows)
    return np.stack([tag + rows, -(tag + rows)], axis=1).astype(np.float32)


def test_fragments_of_three_into_rollouts_of_four_continue_exactly():
    queues = SlotQueues()
    slots = [(0, 0), (1, 0)]
    for k in range(4):  # 12 rows per slot in fragments of 3
        for actor in (0, 1):
            queues.push(fragment(actor, 0, 3 * k, 3, version=k))
    assert queues.rows((0, 0)) == queues.rows((1, 0)) == 12
    assert queues.total_rows() == 24
    for r in range(3):  # three rollouts of 4 consume everything, nothing dropped
        assert queues.ready(slots, 4)
        rollout = queues.take(slots, 4)
        rows = np.arange(4 * r, 4 * r + 4)
        assert rollout.slots == slots
        assert rollout.obs.shape == (4, 2, 2) and rollout.obs.dtype == np.float32
        assert (rollout.num_steps, rollout.num_slots) == (4, 2)
        for b, (actor, slot) in enumerate(slots):
            tag = 1000 * actor + 100 * slot
            np.testing.assert_array_equal(rollout.obs[:, b], expected_obs(actor, slot, rows))
            np.testing.assert_array_equal(rollout.actions[:, b], rows % 2 + 10 * slot)
            np.testing.assert_array_equal(
                rollout.rewards[:, b], (tag + rows).astype(np.float32) / 10
            )
            np.testing.assert_array_equal(rollout.values[:, b], tag + rows + 0.5)
            np.testing.assert_array_equal(rollout.log_probs[:, b], -(tag + rows))
            # Fragment k held rows 3k .. 3k+2 at version k.
            np.testing.assert_array_equal(rollout.versions[:, b], rows // 3)
            # The observation after row 4r+3 is the obs of row 4r+4.
            np.testing.assert_array_equal(
                rollout.bootstrap_obs[b], expected_obs(actor, slot, [4 * r + 4])[0]
            )
        assert queues.rows((0, 0)) == 12 - 4 * (r + 1)
    assert not queues.ready(slots, 1)
    assert queues.total_rows() == 0


def test_remainder_stays_queued_and_bootstrap_at_fragment_boundary():
    queues = SlotQueues()
    queues.push(fragment(0, 0, 0, 3, version=1))
    queues.push(fragment(0, 0, 3, 3, version=2))
    queues.push(fragment(0, 0, 6, 3, version=3))
    assert not queues.ready([(0, 0)], 10)
    assert queues.short_slots([(0, 0), (4, 1)], 9) == [(4, 1)]
    # A take that ends exactly at a fragment boundary bootstraps from next_obs.
    rollout = queues.take([(0, 0)], 6)
    np.testing.assert_array_equal(rollout.bootstrap_obs[0], expected_obs(0, 0, [6])[0])
    np.testing.assert_array_equal(rollout.versions[:, 0], [1, 1, 1, 2, 2, 2])
    assert queues.rows((0, 0)) == 3
    rollout = queues.take([(0, 0)], 2)  # splits the last fragment
    np.testing.assert_array_equal(rollout.obs[:, 0], expected_obs(0, 0, [6, 7]))
    np.testing.assert_array_equal(rollout.bootstrap_obs[0], expected_obs(0, 0, [8])[0])
    rollout = queues.take([(0, 0)], 1)  # the last row; next_obs of the fragment
    np.testing.assert_array_equal(rollout.obs[:, 0], expected_obs(0, 0, [8]))
    np.testing.assert_array_equal(rollout.bootstrap_obs[0], expected_obs(0, 0, [9])[0])
    assert queues.rows((0, 0)) == 0


def test_slots_are_independent_fifos_in_column_order():
    queues = SlotQueues()
    # Interleaved arrival of three slots of two actors; one slot far ahead.
    queues.push(fragment(2, 1, 0, 2))
    queues.push(fragment(0, 0, 0, 5))
    queues.push(fragment(2, 0, 0, 2))
    queues.push(fragment(2, 1, 2, 2))
    queues.push(fragment(2, 0, 2, 3))
    slots = [(2, 0), (0, 0), (2, 1)]
    assert queues.ready(slots, 4)
    rollout = queues.take(slots, 4)
    for b, (actor, slot) in enumerate(slots):
        np.testing.assert_array_equal(rollout.obs[:, b], expected_obs(actor, slot, range(4)))
    assert queues.rows((2, 0)) == 1 and queues.rows((0, 0)) == 1 and queues.rows((2, 1)) == 0


def test_truncated_rows_map_final_obs_to_their_t_and_b():
    queues = SlotQueues()
    # Slot (0, 0): truncation at global rows 1 and 4 (row 1 of the second fragment).
    queues.push(fragment(0, 0, 0, 3, truncated_rows=[1]))
    queues.push(fragment(0, 0, 3, 3, truncated_rows=[1]))
    # Slot (1, 0): truncated+terminated at row 2 (no final obs), truncated at row 5.
    queues.push(fragment(1, 0, 0, 6, truncated_rows=[2, 5], terminated_rows=[2]))
    slots = [(0, 0), (1, 0)]
    rollout = queues.take(slots, 5)
    pairs = sorted(zip(rollout.final_t.tolist(), rollout.final_b.tolist(), strict=True))
    assert pairs == [(1, 0), (4, 0)]
    for t, b, obs in zip(rollout.final_t, rollout.final_b, rollout.final_obs, strict=True):
        assert b == 0
        np.testing.assert_array_equal(obs, np.full(2, 5000.0 + t, np.float32))
    assert rollout.truncated[:, 1].tolist() == [False, False, True, False, False]
    assert rollout.terminated[:, 1].tolist() == [False, False, True, False, False]
    # Slot (1, 0)'s truncation at row 5 lies in the next rollout, at t = 0.
    queues.push(fragment(0, 0, 6, 4))
    rollout = queues.take(slots, 1)
    assert rollout.final_t.tolist() == [0] and rollout.final_b.tolist() == [1]
    np.testing.assert_array_equal(rollout.final_obs[0], np.full(2, 5000.0 + 1000 + 5))


def test_no_truncation_gives_empty_final_arrays():
    queues = SlotQueues()
    queues.push(fragment(0, 0, 0, 4))
    rollout = queues.take([(0, 0)], 4)
    assert rollout.final_t.shape == rollout.final_b.shape == (0,)
    assert rollout.final_obs.shape == (0, 2)


def test_drop_actor_counts_fragments_and_rows():
    queues = SlotQueues()
    queues.push(fragment(0, 0, 0, 3))
    queues.push(fragment(0, 0, 3, 3))
    queues.push(fragment(0, 1, 0, 4))
    queues.push(fragment(1, 0, 0, 5))
    queues.take([(0, 0)], 2)  # the first fragment is half consumed
    assert queues.drop_actor(0) == (3, 4 + 4)
    assert queues.rows((0, 0)) == queues.rows((0, 1)) == 0
    assert queues.rows((1, 0)) == 5
    assert queues.total_rows() == 5
    assert queues.drop_actor(0) == (0, 0)
    assert queues.drop_actor(7) == (0, 0)
    # A dropped slot starts afresh when its actor comes back.
    queues.push(fragment(0, 0, 50, 2))
    rollout = queues.take([(0, 0)], 2)
    np.testing.assert_array_equal(rollout.obs[:, 0], expected_obs(0, 0, [50, 51]))


def test_a_multi_slot_fragment_feeds_each_slot_queue_its_column():
    """A [T, B] fragment of slots 3 and 5: each column queues under its slot, final
    observations go to the column of their flat index t * B + b, and the bootstrap
    observation is the column's next_obs."""
    a, b = fragment(0, 3, 0, 4, truncated_rows=(1,)), fragment(0, 5, 0, 4, truncated_rows=(2,))
    both = Fragment(
        **{
            name: np.concatenate([getattr(a, name), getattr(b, name)], axis=1)
            for name in Fragment.STEP_FIELDS
        },
        actor_id=0,
        version=2,
        seq=0,
        run_id="r",
        token=bytes(16),
        slots=np.array([3, 5], np.int32),
        next_obs=np.concatenate([a.next_obs, b.next_obs]),
        final_obs_index=np.array([1 * 2 + 0, 2 * 2 + 1], np.int32),
        final_obs=np.concatenate([a.final_obs, b.final_obs]),
    )
    queues = SlotQueues()
    queues.push(both)
    assert (queues.rows((0, 3)), queues.rows((0, 5)), queues.total_fragments()) == (4, 4, 1)
    rollout = queues.take([(0, 5), (0, 3)], 4)
    np.testing.assert_array_equal(rollout.obs[:, 0], expected_obs(0, 5, range(4)))
    np.testing.assert_array_equal(rollout.obs[:, 1], expected_obs(0, 3, range(4)))
    assert sorted(zip(rollout.final_t.tolist(), rollout.final_b.tolist(), strict=True)) == [
        (1, 1),
        (2, 0),
    ]
    got = {
        (int(t), int(c)): rollout.final_obs[k]
        for k, (t, c) in enumerate(zip(rollout.final_t, rollout.final_b, strict=True))
    }
    np.testing.assert_array_equal(got[(2, 0)], b.final_obs[0])
    np.testing.assert_array_equal(got[(1, 1)], a.final_obs[0])
    np.testing.assert_array_equal(rollout.bootstrap_obs, np.stack([b.next_obs[0], a.next_obs[0]]))
    assert (rollout.versions == 2).all() and queues.total_rows() == 0
