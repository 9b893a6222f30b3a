"""Rows batches (issue 43, docs/design.md sections 5.6 and 10): each update takes a fixed
number of rows, in segments of ``num_steps``, the oldest complete ones of whichever slots
delivered; grants pace the actors; rows past the lag bound are dropped and counted.

Each test here fails on the every-slot rollout: there the batch grows with the fleet,
a slow actor holds every update, and a stale row is trained on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from tests.helpers import STUB_POLICY, gym_actor, stub_client, stub_learner_config, wait_until
from tests.stub_env import StubEnv
from zmq_rl.config import LearnerConfig, PPOConfig
from zmq_rl.learner.queues import SlotQueues
from zmq_rl.learner.settings import BatchPlan, batch_plan, formula_valve
from zmq_rl.wire.protocol import Fragment, Heartbeat, ProtocolError, decode, encode
from zmq_rl.wire.valve import ActorThrottle

REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 60.0


class SlowStubEnv(StubEnv):
    """The stub env whose every step also waits (a simulator at a fixed tick)."""

    def step(self, action):
        time.sleep(0.01)
        return super().step(action)


if "FleetSlowStub-v0" not in gym.registry:
    gym.register("FleetSlowStub-v0", entry_point=SlowStubEnv, disable_env_checker=True)


def rows(actor_id: int, slots: list[int], start: int, length: int, version: int = 0) -> Fragment:
    """``length`` rows of ``slots`` of one actor from row ``start``; obs encode the row."""
    t = np.arange(start, start + length, dtype=np.float32)
    B = len(slots)
    obs = np.repeat(np.stack([t, t], 1)[:, None, :], B, axis=1)
    zeros = np.zeros((length, B), np.float32)
    return Fragment(
        actor_id=actor_id,
        version=version,
        seq=0,
        run_id="r",
        token=bytes(16),
        slots=np.asarray(slots, np.int32),
        obs=obs,
        actions=np.zeros((length, B), np.int64),
        rewards=zeros + 1,
        terminated=np.zeros((length, B), bool),
        truncated=np.zeros((length, B), bool),
        values=zeros,
        log_probs=zeros,
        next_obs=np.full((B, 2), start + length, np.float32),
        final_obs_index=np.zeros(0, np.int32),
        final_obs=np.zeros((0, 2), np.float32),
    )


# ------------------------------------------------------------------ the queues


def test_the_oldest_rows_come_first_whatever_slot_they_are_of():
    queues = SlotQueues()
    queues.push(rows(0, [0, 1], 0, 4))  # arrival 0: 4 rows of each of actor 0's slots
    queues.push(rows(1, [0], 0, 8))  # arrival 1: 8 rows of actor 1
    queues.push(rows(0, [0, 1], 4, 4))  # arrival 2
    queues.push(rows(1, [0], 8, 16))  # arrival 3
    keys = [(0, 0), (0, 1), (1, 0)]
    # 12 rows: actor 0's first fragment (8 rows), then 4 of actor 1's: a row never waits
    # behind one that arrived after it, whichever slot it is of.
    assert queues.oldest_rows(keys, 12, 8) == [((0, 0), 4), ((0, 1), 4), ((1, 0), 4)]
    # A slot's rows in one batch are cut into columns of at most 8, in stream order.
    assert queues.oldest_rows(keys, 30, 8) == [
        ((0, 0), 8), ((0, 1), 8), ((1, 0), 8), ((1, 0), 6),
    ]  # fmt: skip
    assert queues.oldest_rows(keys, 41, 8) is None  # 40 rows queued
    rollout = queues.take([(1, 0), (1, 0)], 8, [8, 6])
    assert rollout.obs[:, 0, 0].tolist() == list(range(8))
    # The shorter column's rows come last; the rows before them are not valid.
    assert rollout.obs[2:, 1, 0].tolist() == list(range(8, 14))
    assert rollout.valid[:, 0].all() and rollout.valid[:, 1].tolist() == [False] * 2 + [True] * 6
    assert rollout.env_steps == 14 and rollout.rewards[:2, 1].tolist() == [0.0, 0.0]
    # Each column is bootstrapped from the row after it.
    assert rollout.bootstrap_obs[:, 0].tolist() == [8.0, 14.0]
    assert queues.removed((1, 0)) == 14 and queues.rows((1, 0)) == 10
    assert queues.received((1, 0)) == 24


def test_the_last_batch_ends_at_the_env_step_its_budget_has_left():
    """A cap on env steps (the budget's last update) ends the batch at its last valid
    row, in arrival order, whatever share of the rows is not valid (a multi-agent
    env's empty slots): the run spends its budget exactly. Without the cap, or with
    one the rows do not reach, the batch is ``rows`` rows as before."""
    queues = SlotQueues()
    first = rows(0, [0, 1], 0, 4)  # slot 0: all valid; slot 1: valid, valid, empty, empty
    first.valid = np.array([[1, 1], [1, 1], [1, 0], [1, 0]], bool)
    first.terminated[1, 1] = True  # the agent's last row before the empty ones
    queues.push(first)
    second = rows(1, [0], 0, 8)  # arrival 1: valid at rows 0, 3 and 6 only
    second.valid = np.zeros((8, 1), bool)
    second.valid[[0, 3, 6], 0] = True
    second.terminated[[0, 3, 6], 0] = True
    queues.push(second)
    keys = [(0, 0), (0, 1), (1, 0)]
    # Rows of arrival 0 hold 6 env steps: a cap of 5 ends inside slot 0's column ...
    assert queues.oldest_rows(keys, 16, 8, steps=5) == [((0, 0), 4), ((0, 1), 1)]
    # ... a cap of 6 at slot 1's second row (its empty rows after it are left) ...
    assert queues.oldest_rows(keys, 16, 8, steps=6) == [((0, 0), 4), ((0, 1), 2)]
    # ... a cap of 8 at actor 1's row 3, the second of its valid ones.
    assert queues.oldest_rows(keys, 16, 8, steps=8) == [((0, 0), 4), ((0, 1), 4), ((1, 0), 4)]
    assert queues.valid_rows((1, 0), 4) == 2 and queues.valid_rows((1, 0), 8, skip=4) == 1
    # The rows cap comes first: 16 rows hold 9 env steps, fewer than the cap of 10.
    assert queues.oldest_rows(keys, 16, 8, steps=10) == [((0, 0), 4), ((0, 1), 4), ((1, 0), 8)]
    assert queues.oldest_rows(keys, 16, 8) == queues.oldest_rows(keys, 16, 8, steps=10)
    # Neither cap reached (16 rows queued, 9 env steps): not ready.
    assert queues.oldest_rows(keys, 17, 8, steps=10) is None
    rollout = queues.take([(0, 0), (0, 1), (1, 0)], 8, [4, 4, 4])
    assert rollout.env_steps == 8


@pytest.mark.parametrize("use_vtrace", [False, True])
def test_a_shorter_column_gets_the_targets_its_rows_get_in_a_full_one(use_vtrace):
    """Padding before a column's rows changes none of its targets: GAE and V-trace run
    backwards from the bootstrap, and the padding rows are episode ends of reward 0."""
    import torch

    from zmq_rl.config import PolicyConfig
    from zmq_rl.rl.policy import build_policy
    from zmq_rl.rl.targets import TargetSettings, rollout_to_batch

    torch.manual_seed(0)
    policy = build_policy(StubEnv.observation_space, StubEnv.action_space, PolicyConfig())
    settings = TargetSettings(gamma=0.9, gae_lambda=0.8, use_vtrace=use_vtrace)
    full, short = SlotQueues(), SlotQueues()
    for queues in (full, short):
        queues.push(rows(0, [0], 0, 8))
    short.take([(0, 0)], 2)  # its first 2 rows went into an earlier batch
    whole, _ = rollout_to_batch(full.take([(0, 0)], 8), policy, settings)
    padded, _ = rollout_to_batch(short.take([(0, 0)], 8, [6]), policy, settings)
    assert padded.advantages.shape == (6,)
    torch.testing.assert_close(padded.advantages, whole.advantages[2:])
    torch.testing.assert_close(padded.returns, whole.returns[2:])


def test_rows_older_than_the_bound_are_dropped_from_the_front_and_counted_as_used():
    queues = SlotQueues()
    queues.push(rows(0, [0, 1], 0, 4, version=0))
    queues.push(rows(0, [0, 1], 4, 4, version=1))
    queues.push(rows(0, [0, 1], 8, 4, version=3))
    assert queues.drop_stale(2) == (2, 16)  # two fragments, 8 rows of each slot
    assert queues.rows((0, 0)) == 4 and queues.removed((0, 0)) == 8
    assert queues.take([(0, 1)], 4).obs[:, 0, 0].tolist() == [8, 9, 10, 11]


# ------------------------------------------------------------------ the plan and the valve


def test_the_grant_lead_lets_the_fleet_deliver_a_cycle_and_a_batch_more():
    plan = BatchPlan(rows=True, segment=32, segments=8)  # 256 rows an update
    assert plan.grant_lead(4) == 128  # 4 slots can deliver two batches: 512 rows
    assert plan.grant_lead(64) == 8  # 64 slots too, 8 rows each
    assert plan.grant_lead(1000) == 1
    assert BatchPlan(rows=True, segment=32, segments=8, lead=200).grant_lead(4) == 200
    # A smaller max_lead_steps could leave the learner short of a cycle: never taken.
    assert BatchPlan(rows=True, segment=32, segments=8, lead=16).grant_lead(4) == 128
    assert BatchPlan(rows=True, segment=32, segments=8, broadcast_every=3).grant_lead(4) == 256
    # The default lag bound: twice the updates the grants let the fleet queue (a lead
    # and a column per slot), in versions, plus 2.
    assert plan.lag_bound(64) == 2 * -(-64 * (8 + 32) // 256) + 2
    assert BatchPlan(rows=True, segment=32, segments=8, max_policy_lag=3).lag_bound(64) == 3


def test_batch_plan_resolves_auto_and_refuses_rows_for_a_recurrent_policy():
    cfg = LearnerConfig(num_actors=2, num_envs=4, num_steps=32)
    assert batch_plan(cfg, 1, recurrent=False).rows_per_update == 256
    assert batch_plan(LearnerConfig(batch_rows=512), 1, recurrent=False).segments == 16
    assert not batch_plan(cfg, 1, recurrent=True).rows
    from zmq_rl.config import ConfigError

    with pytest.raises(ConfigError, match="batch_mode"):
        batch_plan(LearnerConfig(batch_mode="rows"), 1, recurrent=True)
    # Actors without grants may deliver a whole cycle from one slot: never a stall.
    assert formula_valve(cfg, batch_plan(cfg, 1, recurrent=False)) == (256, 512)
    assert formula_valve(cfg, None) == (32, 64)


def test_a_grant_replaces_the_version_rule_and_never_shrinks():
    valve = ActorThrottle(steps_per_broadcast=32, max_lead_steps=64, grant=96)
    assert not valve.should_pause(95, version=0) and valve.should_pause(96, version=50)
    assert valve.regrant(80).grant == 96 and valve.regrant(160).grant == 160
    assert not valve.impossible_for_member(version=10**6, steps_sent=0)
    formula = ActorThrottle(steps_per_broadcast=32, max_lead_steps=64)
    assert formula.regrant(10**6) == formula and formula.should_pause(64, version=0)


def test_grants_travel_in_the_welcome_and_learner_heartbeats_only():
    beat = Heartbeat(actor_id=-1, run_id="r", version=3, grant=640)
    assert decode(encode(beat)).grant == 640
    forged = Heartbeat(actor_id=2, run_id="r", token=bytes(16), grant=640)
    with pytest.raises(ProtocolError, match="heartbeat.grant"):
        decode(encode(forged))


# ------------------------------------------------------------------ a real learner


def _slow_and_fast(start_learner, ctx, learner_port, batch_mode: str) -> dict:
    cfg = stub_learner_config(
        learner_port,
        num_actors=2,
        num_envs=2,
        fragment_length=4,
        batch_mode=batch_mode,
        total_env_steps=8 * 4 * 40,
        actor_timeout=30.0,
    )
    learner, run = start_learner(cfg, PPOConfig(num_epochs=1), STUB_POLICY)
    rows_seen: list[dict] = []
    learner.runlog.on_update = rows_seen.append
    fast = gym_actor(ctx, learner_port, actor_id=0)
    slow_env = "tests.test_fleet_batches:FleetSlowStub-v0"
    slow = gym_actor(ctx, learner_port, actor_id=1, env_id=slow_env)
    report = run.join(TIMEOUT)
    fast.join(TIMEOUT)
    slow.join(TIMEOUT)
    return {"report": report, "rows": rows_seen, "bound": learner.batch_plan}


def test_a_slow_actor_among_fast_ones_is_neither_waited_on_nor_starved(
    start_learner, ctx, learner_port
):
    """One actor steps at full speed, the other waits 10 ms a step. Every update takes
    exactly 2 segments of 8 rows (the configured rollout, 32 rows: 2 actors x 2 slots x 8);
    the fast actor fills most of them, the slow one's segments are still trained on as they
    complete (a few may lag past the bound on a busy box: dropped and counted). (Every
    slot's rollout takes 8 rows of each slot per update: both actors then give the same
    rows, at the slow one's pace.)"""
    out = _slow_and_fast(start_learner, ctx, learner_port, "rows")
    report = out["report"]
    assert report.stop_reason == "budget spent"
    assert {row["batch/rows"] for row in out["rows"]} == {32.0}
    consumed = {a: s["steps_consumed"] for a, s in report.actor_stats.items()}
    assert consumed["1"] > 0, consumed  # not starved
    assert consumed["0"] > 3 * consumed["1"], consumed  # not waited on
    assert report.counters.get("rejected/experience/over_lead", 0) == 0
    # What the slow actor delivered was trained on, apart from the last queued segments
    # and, on a busy box (where its 10 ms waits stretch while the fast one's updates go
    # on), a segment now and then past the lag bound: dropped, counted, a small share
    # (one segment at most when it delivered only a few: 8 of 24 rows were seen at load).
    slow = report.actor_stats["1"]
    stale = report.counters.get("discarded/steps/stale", 0)
    assert stale <= max(8, slow["steps_received"] // 4), (stale, slow)
    unused = slow["steps_received"] - slow["steps_consumed"] - stale
    assert unused <= 2 * (out["bound"].grant_lead(4) + 8), (unused, slow)


def test_a_row_past_the_lag_bound_is_dropped_counted_and_never_trained_on(
    start_learner, ctx, learner_port
):
    """An actor that never loads new weights sends rows of version 0 once the learner is
    at version >= 3 with ``max_policy_lag`` 1: they are dropped (``discarded/steps/stale``)
    and no update trains on a row more than one version old."""
    cfg = stub_learner_config(
        learner_port,
        num_actors=1,
        batch_rows=8,
        max_policy_lag=1,
        total_env_steps=8 * 30,
        actor_timeout=60.0,
    )
    learner, run = start_learner(cfg, PPOConfig(num_epochs=1), STUB_POLICY)
    lags: list[float] = []
    learner.runlog.on_update = lambda row: lags.append(row["charts/policy_lag_max"])
    stale = stub_client(ctx, learner_port, register_timeout=TIMEOUT)
    stale.register()
    fresh = gym_actor(ctx, learner_port)
    try:
        wait_until(lambda: learner.version >= 3, TIMEOUT, "the learner at version 3")
        t = np.arange(8, dtype=np.float32)
        stale.send_fragment(
            0,
            obs=np.stack([t, t], 1),
            actions=np.zeros(8, np.int64),
            rewards=np.ones(8, np.float32),
            terminated=np.zeros(8, bool),
            truncated=np.zeros(8, bool),
            values=np.zeros(8, np.float32),
            log_probs=np.zeros(8, np.float32),
            next_obs=np.full(2, 8, np.float32),
        )
        report = run.join(TIMEOUT)
    finally:
        stale.close()
        fresh.join(TIMEOUT)
    stale_id = str(stale.actor_id)
    assert report.counters["discarded/steps/stale"] >= 8, report.counters
    assert report.actor_stats[stale_id]["steps_consumed"] == 0
    assert lags and max(lags) <= 1


def test_sixteen_actor_processes_train_on_a_batch_that_does_not_grow(tmp_path, learner_port):
    """``zmq-rl run`` with 16 actor processes of one slot and ``--batch-rows 32``: every
    update takes 32 rows (an every-slot rollout would be 16 x 8 = 128), every actor's
    rows are trained on, and the budget is spent in 60 updates."""
    run_dir = tmp_path / "run"
    argv = [
        sys.executable, "-m", "zmq_rl", "run",
        "--env", "tests.stub_env:Stub-v0",
        "--actors", "16", "--num-envs", "1", "--num-steps", "8", "--fragment-length", "8",
        "--batch-rows", "32", "--total-env-steps", str(32 * 60),
        "--num-epochs", "1", "--hidden-sizes", "8",
        "--port", str(learner_port), "--run-dir", str(run_dir), "--no-plot",
        "--log-level", "warning",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((run_dir / "report.json").read_text())
    assert report["updates_completed"] == 60 and report["env_steps_consumed"] == 32 * 60
    updates = [
        json.loads(line)
        for line in (run_dir / "metrics.jsonl").open()
        if "batch/rows" in line
    ]
    assert len(updates) == 60
    assert {u["batch/rows"] for u in updates} == {32.0}
    # In columns of at most 8 rows (4 when whole fragments fill it; a grant of 4 rows a
    # slot makes the actors flush shorter ones).
    assert all(4 <= u["batch/columns"] <= 32 for u in updates), updates
    consumed = [s["steps_consumed"] for s in report["actor_stats"].values()]
    assert len(consumed) == 16 and min(consumed) > 0, consumed


def test_a_checkpoint_from_before_batch_mode_resumes_with_every_slots_rollout(tmp_path):
    """A run checkpointed before rows batches existed goes on the way it trained."""
    from zmq_rl.config import PolicyConfig, config_dict
    from zmq_rl.learner.checkpoint import checkpoint_configs

    old = config_dict(LearnerConfig())
    for name in ("batch_mode", "batch_rows", "max_policy_lag"):
        del old[name]
    state = {
        "learner_config": json.dumps(old),
        "ppo_config": json.dumps(config_dict(PPOConfig())),
        "policy_config": json.dumps(config_dict(PolicyConfig())),
    }
    cfg, _, _ = checkpoint_configs(state, tmp_path / "ckpt.pt", tmp_path)
    assert cfg.batch_mode == "slots"
    state["learner_config"] = json.dumps(config_dict(LearnerConfig()))
    assert checkpoint_configs(state, tmp_path / "ckpt.pt", tmp_path)[0].batch_mode == "auto"
