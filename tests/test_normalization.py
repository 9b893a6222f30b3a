"""Observation and reward normalisation: the statistics, and that both sides share them.

* :func:`merge_moments` against numpy over the concatenation; the policy's running
  statistics likewise, however the data is chunked;
* :class:`RewardScaler` against a hand computation (discounted returns per slot,
  reset at episode ends, carried across calls);
* the learner's statistics reach an actor bit for bit: after ``update_obs_stats``,
  ``export_weights`` -> ``import_weights`` into a freshly built policy gives
  ``torch.equal`` outputs (the actor normalises exactly as the learner);
* the statistics survive a checkpoint and resume;
* end to end: a real learner with ``normalize_obs`` and an actor on the client API,
  whose welcome holds empty statistics and whose broadcasts carry the growing ones.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
import zmq

from tests.conftest import STUB_ENV_ID, free_port_block
from tests.helpers import stub_learner_config
from tests.stub_env import StubEnv
from zmq_rl.actor.client import ActorClient
from zmq_rl.config import LearnerConfig, PolicyConfig, PPOConfig
from zmq_rl.learner.loop import Learner
from zmq_rl.rl.normalization import RewardScaler, merge_moments
from zmq_rl.rl.policy import (
    OBS_CLIP,
    build_policy,
    export_weights,
    import_weights,
    policy_from_welcome,
)
from zmq_rl.rl.trainer import Trainer

TIMEOUT = 30.0
NORM = PolicyConfig(hidden_sizes=(16, 16), normalize_obs=True)
OBS_SPACE = gym.spaces.Box(-np.inf, np.inf, (5,), np.float32)
DISCRETE = gym.spaces.Discrete(3)
CONTINUOUS = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)


# -- the statistics ---------------------------------------------------------------------


def test_merge_moments_equals_numpy_over_the_concatenation() -> None:
    rng = np.random.default_rng(0)
    chunks = [rng.normal(3.0, 2.0, size=(n, 4)) * [1, 10, 100, 1e-3] for n in (1, 7, 64, 3, 250)]
    mean, var, count = np.zeros(4), np.ones(4), 0.0
    for chunk in chunks:
        mean, var, count = merge_moments(
            mean, var, count, chunk.mean(axis=0), chunk.var(axis=0), chunk.shape[0]
        )
    everything = np.concatenate(chunks)
    assert count == everything.shape[0]
    np.testing.assert_allclose(mean, everything.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(var, everything.var(axis=0), rtol=1e-10)
    # Merging with an empty summary changes nothing; merging two empties stays empty.
    same = merge_moments(mean, var, count, np.zeros(4), np.zeros(4), 0)
    np.testing.assert_array_equal(same[0], mean)
    np.testing.assert_array_equal(same[1], var)
    assert merge_moments(np.zeros(1), np.ones(1), 0.0, np.zeros(1), np.ones(1), 0)[2] == 0.0


def test_policy_obs_stats_match_numpy_and_normalise_and_clip() -> None:
    policy = build_policy(OBS_SPACE, DISCRETE, NORM)
    rng = np.random.default_rng(1)
    chunks = [rng.normal(5.0, 3.0, size=(t, 2, 5)).astype(np.float32) for t in (8, 8, 16)]
    for chunk in chunks:  # [T, slots, obs] as the learner's rollouts
        policy.update_obs_stats(chunk)
    flat = np.concatenate([c.reshape(-1, 5) for c in chunks]).astype(np.float64)
    np.testing.assert_allclose(policy.obs_mean.numpy(), flat.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(policy.obs_var.numpy(), flat.var(axis=0), rtol=1e-10)
    assert float(policy.obs_count) == flat.shape[0]
    obs = torch.from_numpy(flat[:4].astype(np.float32))
    want = (obs.double() - torch.from_numpy(flat.mean(axis=0))) / torch.from_numpy(
        np.sqrt(flat.var(axis=0) + 1e-8)
    )
    torch.testing.assert_close(policy.flat_obs(obs), want.float(), rtol=1e-5, atol=1e-6)
    far = torch.full((1, 5), 1e6)
    assert torch.equal(policy.flat_obs(far), torch.full((1, 5), OBS_CLIP))
    # Without normalize_obs there are no statistics, and updating them is a no-op.
    plain = build_policy(OBS_SPACE, DISCRETE, PolicyConfig(hidden_sizes=(16, 16)))
    plain.update_obs_stats(chunks[0])
    assert "obs_mean" not in plain.state_dict()


def hand_scaled(rewards: np.ndarray, dones: np.ndarray, gamma: float, carry: list[float]):
    """The discounted returns of each slot, updated in place in ``carry``."""
    T, B = rewards.shape
    returns = np.zeros((T, B))
    for b in range(B):
        running = carry[b]
        for t in range(T):
            running = gamma * running + rewards[t, b]
            returns[t, b] = running
            if dones[t, b]:
                running = 0.0
        carry[b] = running
    return returns


def test_reward_scaler_against_a_hand_computation() -> None:
    gamma = 0.9
    scaler = RewardScaler(gamma)
    r1 = np.array([[1.0, 2.0], [0.0, -1.0], [3.0, 0.5]], np.float32)
    d1 = np.array([[False, False], [True, False], [False, False]])
    carry = [0.0, 0.0]
    ret1 = hand_scaled(r1.astype(np.float64), d1, gamma, carry)
    # Slot 0: 1, 0.9 (ends), 3 ; slot 1: 2, 0.8, 1.22.
    np.testing.assert_allclose(ret1[:, 0], [1.0, 0.9, 3.0])
    np.testing.assert_allclose(ret1[:, 1], [2.0, 0.8, 1.22])
    out1 = scaler.scale(r1, d1, ["a", "b"])
    assert out1.dtype == np.float32
    np.testing.assert_allclose(out1, r1 / np.sqrt(ret1.var() + 1e-8), rtol=1e-6)
    # The second call carries each slot's running return and pools the variance.
    r2 = np.array([[1.0, 1.0], [1.0, 1.0]], np.float32)
    d2 = np.zeros((2, 2), bool)
    ret2 = hand_scaled(r2.astype(np.float64), d2, gamma, carry)
    np.testing.assert_allclose(ret2[:, 1], [gamma * 1.22 + 1, gamma * (gamma * 1.22 + 1) + 1])
    out2 = scaler.scale(r2, d2, ["a", "b"])
    pooled = np.concatenate([ret1.ravel(), ret2.ravel()])
    np.testing.assert_allclose(out2, r2 / np.sqrt(pooled.var() + 1e-8), rtol=1e-6)
    assert scaler.count == pooled.size
    # Rewards far beyond the running scale are clipped to +-clip (gamma 0: returns are
    # the rewards; 10000 zeros then +-100 give std sqrt(2 * 100^2 / 10002) ~ 1.41).
    spiky = RewardScaler(0.0)
    spiky.scale(np.zeros((5000, 2), np.float32), np.zeros((5000, 2), bool), ["a", "b"])
    out = spiky.scale(np.array([[100.0, -100.0]], np.float32), np.zeros((1, 2), bool), ["a", "b"])
    np.testing.assert_array_equal(out, [[10.0, -10.0]])
    # state() / load() round-trips the statistics through JSON-able values; the slots'
    # running returns start over (after a resume every slot is a new stream).
    other = RewardScaler(gamma)
    other.load(scaler.state())
    assert other.count == scaler.count and scaler.returns and other.returns == {}
    np.testing.assert_array_equal(other.var, scaler.var)


def test_a_slot_forgotten_starts_its_next_stream_from_a_zero_return() -> None:
    """Issue 45 E7: a slot whose actor left (or registered again) starts a new stream;
    its reward-scaling return, which scales the training rows, is dropped with its
    unfinished episode (it ran on into the next registration's rows before)."""
    cfg = LearnerConfig(num_actors=1, num_envs=1, num_steps=4, normalize_reward=True)
    trainer = Trainer(cfg, PPOConfig(), PolicyConfig(hidden_sizes=(8,)), OBS_SPACE, DISCRETE)
    trainer.reward_scaler.observe(np.ones((4, 1)), np.zeros((4, 1), bool), [(0, 0)])
    trainer.running_return[(0, 0)] = 4.0
    trainer.forget_slots([(0, 0)])
    assert (0, 0) not in trainer.reward_scaler.returns and (0, 0) not in trainer.running_return


# -- the same transform on both sides -----------------------------------------------------


@pytest.mark.parametrize("action_space", [DISCRETE, CONTINUOUS], ids=["discrete", "gaussian"])
def test_shipped_statistics_give_bit_identical_outputs(action_space) -> None:
    torch.manual_seed(0)
    learner_side = build_policy(OBS_SPACE, action_space, NORM)
    rng = np.random.default_rng(2)
    for _ in range(3):
        learner_side.update_obs_stats(rng.normal(-2.0, 7.0, size=(32, 4, 5)).astype(np.float32))
    weights = export_weights(learner_side)
    names = [name for name, _ in weights]
    assert {"obs_mean", "obs_var", "obs_count"} <= set(names)
    assert dict(weights)["obs_mean"].dtype == np.float64  # shipped at full precision

    torch.manual_seed(123)  # a different init: only the import can make them agree
    actor_side = build_policy(OBS_SPACE, action_space, NORM)
    obs = torch.from_numpy(rng.normal(-2.0, 7.0, size=(64, 5)).astype(np.float32))
    assert not torch.equal(actor_side(obs)[0], learner_side(obs)[0])
    import_weights(actor_side, weights)
    for name, tensor in learner_side.state_dict().items():
        assert torch.equal(actor_side.state_dict()[name], tensor), name
    with torch.no_grad():
        for a, b in zip(actor_side(obs), learner_side(obs), strict=True):
            assert torch.equal(a, b)
        assert torch.equal(actor_side.value(obs), learner_side.value(obs))
    sampled = [p.act(obs, torch.Generator().manual_seed(5)) for p in (actor_side, learner_side)]
    for a, b in zip(*sampled, strict=True):
        assert torch.equal(a, b)
    # The learner's gradient path sees the same normalised inputs.
    actions = sampled[0][0]
    for a, b in zip(
        actor_side.evaluate_actions(obs, actions),
        learner_side.evaluate_actions(obs, actions),
        strict=True,
    ):
        assert torch.equal(a, b)


def learner_config(port: int, **changes: Any) -> LearnerConfig:
    base = dict(
        num_envs=2,
        fragment_length=4,
        total_env_steps=8 * 2 * 4,
        actor_timeout=TIMEOUT,
        checkpoint_every=LearnerConfig.checkpoint_every,
    )
    return stub_learner_config(port, **{**base, **changes})


def test_statistics_survive_checkpoint_and_resume(tmp_path) -> None:
    ctx = zmq.Context()
    try:
        cfg = learner_config(free_port_block(), run_dir=str(tmp_path), normalize_reward=True)
        learner = Learner(cfg, PPOConfig(), NORM, context=ctx)
        try:
            rng = np.random.default_rng(3)
            learner.policy.update_obs_stats(rng.normal(4.0, 2.0, (8, 2, 2)).astype(np.float32))
            learner.trainer.reward_scaler.scale(
                rng.normal(size=(8, 2)).astype(np.float32), np.zeros((8, 2), bool), [(0, 0), (0, 1)]
            )
            learner.checkpoint()
            before = {k: v.clone() for k, v in learner.policy.state_dict().items()}
            scaler_before = learner.trainer.reward_scaler.state()
        finally:
            learner.close()
        resumed = Learner.resume(tmp_path, context=ctx, port=free_port_block())
        try:
            after = resumed.policy.state_dict()
            for name in ("obs_mean", "obs_var", "obs_count"):
                assert torch.equal(after[name], before[name]), name
            assert float(after["obs_count"]) == 16.0
            assert resumed.trainer.reward_scaler.state() == scaler_before
            # What a (re)joining actor is welcomed with carries the restored statistics.
            shipped = dict(resumed.current_weights.tensors)
            np.testing.assert_array_equal(shipped["obs_mean"], before["obs_mean"].numpy())
            np.testing.assert_array_equal(shipped["obs_var"], before["obs_var"].numpy())
        finally:
            resumed.close()
    finally:
        ctx.destroy(linger=0)


def test_actor_receives_the_statistics_in_welcome_and_broadcasts(learner_port) -> None:
    """A real learner with normalize_obs; the actor is this thread, on ActorClient."""
    ctx = zmq.Context()
    cfg = learner_config(learner_port, max_lead_steps=16)
    learner = Learner(cfg, PPOConfig(num_epochs=1, minibatch_size=16), NORM, context=ctx)
    outcome: dict[str, Any] = {}

    def train() -> None:
        try:
            outcome["report"] = learner.run()
        except BaseException as exc:  # noqa: BLE001 - asserted below
            outcome["error"] = exc

    thread = threading.Thread(target=train, name="learner", daemon=True)
    thread.start()
    client = ActorClient(
        f"127.0.0.1:{cfg.port}",
        env_id=STUB_ENV_ID,
        observation_space=StubEnv.observation_space,
        action_space=StubEnv.action_space,
        num_envs=2,
        context=ctx,
        register_timeout=TIMEOUT,
        learner_timeout=TIMEOUT,
    )
    received: list[tuple[int, dict[str, np.ndarray]]] = []
    try:
        welcome = client.register()
        policy = policy_from_welcome(welcome)
        assert float(policy.obs_count) == 0.0  # nothing consumed yet
        received.append((welcome.weights.version, dict(welcome.weights.tensors)))
        envs = [gym.make(STUB_ENV_ID) for _ in range(2)]
        obs = np.stack([env.reset(seed=i)[0] for i, env in enumerate(envs)])
        generator = torch.Generator().manual_seed(0)
        deadline = time.monotonic() + TIMEOUT
        while not client.shutdown_requested and time.monotonic() < deadline:
            weights = client.poll()
            if weights is None and client.should_pause():
                weights = client.wait_for_weights(0.05)
            if weights is not None:
                import_weights(policy, weights.tensors)
                received.append((weights.version, dict(weights.tensors)))
                continue
            if client.should_pause():
                continue
            with torch.no_grad():
                action, log_prob, value = policy.act(torch.from_numpy(obs), generator)
            steps = [env.step(int(a)) for env, a in zip(envs, action, strict=True)]
            rewards = np.array([s[1] for s in steps], np.float32)
            terminated = np.array([s[2] for s in steps])
            truncated = np.array([s[3] for s in steps])
            next_obs = np.stack(
                [env.reset()[0] if s[2] else s[0] for env, s in zip(envs, steps, strict=True)]
            )
            client.step(
                obs,
                action.numpy(),
                rewards,
                terminated,
                truncated,
                value.numpy(),
                log_prob.numpy(),
                next_obs,
            )
            obs = next_obs
        assert client.shutdown_requested, "the learner did not finish within the timeout"
    finally:
        client.close()
        thread.join(TIMEOUT)
        learner.close()
        ctx.destroy(linger=0)
    assert not thread.is_alive()
    assert "error" not in outcome, repr(outcome.get("error"))
    assert outcome["report"].updates_completed == 4
    later = [(v, t) for v, t in received if v >= 1]
    assert later, f"no broadcast received (versions {[v for v, _ in received]})"
    for version, tensors in later:
        # Each update folds one [num_steps, slots] rollout into the statistics
        # before its PPO step, and broadcast_every is 1: version v has seen 16 v rows.
        assert float(tensors["obs_count"]) == 16.0 * version
        assert (tensors["obs_mean"] > 0).all() and (tensors["obs_var"] > 0).all()
    assert float(policy.obs_count) == 16.0 * received[-1][0]
    last_version, last = received[-1]
    if last_version == learner.version:
        final = learner.policy.state_dict()
        for name in ("obs_mean", "obs_var", "obs_count"):
            np.testing.assert_array_equal(last[name], final[name].numpy())
