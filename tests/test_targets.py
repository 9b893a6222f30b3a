"""Tests for zmq_rl.rl.targets.rollout_to_batch: GAE / V-trace targets on assembled rollouts."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from gymnasium import spaces

from zmq_rl.config import LearnerConfig, PolicyConfig, PPOConfig
from zmq_rl.rl.advantages import gae, vtrace
from zmq_rl.rl.policy import build_policy
from zmq_rl.rl.rollout import Rollout
from zmq_rl.rl.targets import TargetSettings, rollout_to_batch
from zmq_rl.rl.trainer import Trainer

torch.set_num_threads(1)

OBS_SPACE = spaces.Box(-np.inf, np.inf, (2,), np.float32)
ACT_SPACE = spaces.Discrete(3)
GAMMA, LAM = 0.9, 0.8


def make_policy(seed: int, ortho_init: bool = True):
    torch.manual_seed(seed)
    cfg = PolicyConfig(hidden_sizes=(8,), ortho_init=ortho_init)
    return build_policy(OBS_SPACE, ACT_SPACE, cfg)


def make_rollout(
    T: int = 5, B: int = 2, seed: int = 0, truncated=(), terminated=(), log_probs=None
) -> Rollout:
    """A rollout with truncations at the (t, b) in ``truncated`` (each with a distinct
    final observation) and terminations at ``terminated``."""
    rng = np.random.default_rng(seed)
    trunc = np.zeros((T, B), bool)
    term = np.zeros((T, B), bool)
    for t, b in truncated:
        trunc[t, b] = True
    for t, b in terminated:
        term[t, b] = True
    final = [(t, b) for t, b in truncated if not term[t, b]]
    return Rollout(
        slots=[(b, 0) for b in range(B)],
        obs=rng.standard_normal((T, B, 2)).astype(np.float32),
        actions=rng.integers(0, 3, (T, B)).astype(np.int64),
        rewards=rng.standard_normal((T, B)).astype(np.float32),
        terminated=term,
        truncated=trunc,
        values=rng.standard_normal((T, B)).astype(np.float32),
        log_probs=(log_probs if log_probs is not None else -rng.random((T, B)).astype(np.float32)),
        versions=np.zeros((T, B), np.int64),
        bootstrap_obs=rng.standard_normal((B, 2)).astype(np.float32),
        final_t=np.array([t for t, _ in final], np.int64),
        final_b=np.array([b for _, b in final], np.int64),
        final_obs=(
            rng.standard_normal((len(final), 2)).astype(np.float32) * 3
            if final
            else np.zeros((0, 2), np.float32)
        ),
    )


def V(policy, obs: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return policy.value(torch.from_numpy(np.asarray(obs, np.float32))).double().numpy()


def hand_gae(rewards, values, bootstrap, done, gamma, lam):
    """Schulman et al. eq. 16 as a plain double loop; ``done`` stops bootstrapping."""
    T, B = rewards.shape
    adv = np.zeros((T, B))
    for b in range(B):
        last = 0.0
        for t in reversed(range(T)):
            next_value = bootstrap[b] if t == T - 1 else values[t + 1, b]
            nonterminal = 0.0 if done[t, b] else 1.0
            delta = rewards[t, b] + gamma * nonterminal * next_value - values[t, b]
            last = delta + gamma * lam * nonterminal * last
            adv[t, b] = last
    return adv, adv + values


def flat(array: np.ndarray) -> np.ndarray:
    """Time-major flattening: index t * B + b."""
    return array.reshape(array.shape[0] * array.shape[1], *array.shape[2:])


def test_gae_batch_matches_hand_computed_gae():
    policy = make_policy(0)
    rollout = make_rollout(truncated=[(1, 0), (3, 1)], terminated=[(2, 1), (4, 0)])
    batch, diagnostics = rollout_to_batch(rollout, policy, TargetSettings(GAMMA, LAM))
    assert diagnostics == {}
    rewards = rollout.rewards.astype(np.float64)
    finals = V(policy, rollout.final_obs)
    for k, (t, b) in enumerate(zip(rollout.final_t, rollout.final_b, strict=True)):
        rewards[t, b] += GAMMA * finals[k]
    done = rollout.terminated | rollout.truncated
    bootstrap = V(policy, rollout.bootstrap_obs)
    values = rollout.values.astype(np.float64)
    adv, ret = hand_gae(rewards, values, bootstrap, done, GAMMA, LAM)
    np.testing.assert_allclose(batch.advantages.numpy(), flat(adv), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(batch.returns.numpy(), flat(ret), rtol=1e-5, atol=1e-5)
    # Same numbers from the library's estimator on the same arrays.
    ref = gae(rewards, values, bootstrap, GAMMA * (1.0 - done), LAM)
    np.testing.assert_allclose(batch.advantages.numpy(), flat(ref.advantages), atol=1e-6)
    # The rest of the batch is the rollout flattened time-major, unchanged.
    np.testing.assert_array_equal(batch.obs.numpy(), flat(rollout.obs))
    np.testing.assert_array_equal(batch.actions.numpy(), flat(rollout.actions))
    np.testing.assert_array_equal(batch.old_log_probs.numpy(), flat(rollout.log_probs))
    np.testing.assert_array_equal(batch.old_values.numpy(), flat(rollout.values))
    assert batch.obs.dtype == batch.advantages.dtype == batch.returns.dtype == torch.float32
    batch.validate()


def test_uint8_observations_stay_uint8_and_give_the_same_targets():
    """Image frames are kept as uint8 in the batch (as the actors pass them to act());
    the policy casts them, so the targets equal those of the same obs as float32."""
    policy = make_policy(0)
    rollout = make_rollout(truncated=[(1, 0)], terminated=[(3, 1)])
    pixels = np.random.default_rng(1).integers(0, 256, rollout.obs.shape, dtype=np.uint8)
    as_uint8 = dataclasses.replace(
        rollout,
        obs=pixels,
        bootstrap_obs=pixels[0].copy(),
        final_obs=pixels[0, :1].copy(),
    )
    as_float = dataclasses.replace(
        as_uint8,
        obs=pixels.astype(np.float32),
        bootstrap_obs=pixels[0].astype(np.float32),
        final_obs=pixels[0, :1].astype(np.float32),
    )
    for use_vtrace in (False, True):
        settings = TargetSettings(GAMMA, LAM, use_vtrace=use_vtrace)
        small, _ = rollout_to_batch(as_uint8, policy, settings)
        big, _ = rollout_to_batch(as_float, policy, settings)
        assert small.obs.dtype == torch.uint8
        np.testing.assert_array_equal(small.obs.numpy(), flat(pixels))
        np.testing.assert_array_equal(small.advantages.numpy(), big.advantages.numpy())
        np.testing.assert_array_equal(small.returns.numpy(), big.returns.numpy())


def test_truncated_row_bootstraps_final_obs_and_nothing_crosses_the_boundary():
    policy = make_policy(1)
    rollout = make_rollout(T=3, B=1, truncated=[(1, 0)])
    lam = 0.7
    batch, _ = rollout_to_batch(rollout, policy, TargetSettings(GAMMA, lam))
    adv = batch.advantages.numpy().astype(np.float64)
    r, v = rollout.rewards[:, 0].astype(np.float64), rollout.values[:, 0].astype(np.float64)
    v_final = V(policy, rollout.final_obs)[0]
    v_boot = V(policy, rollout.bootstrap_obs)[0]
    # Row 2 starts a new episode: bootstraps from the rollout's next observation.
    a2 = r[2] + GAMMA * v_boot - v[2]
    # Row 1 was cut by a time limit: r + gamma V(final obs), not V(obs of row 2),
    # and the advantage of row 2 (another episode) does not flow back.
    a1 = r[1] + GAMMA * v_final - v[1]
    a0 = r[0] + GAMMA * v[1] - v[0] + GAMMA * lam * a1
    np.testing.assert_allclose(adv, [a0, a1, a2], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(batch.returns.numpy(), adv + v, rtol=1e-5, atol=1e-5)
    assert abs(v_final - V(policy, rollout.obs[2])[0]) > 1e-3  # the check discriminates


def test_terminated_row_gets_no_bootstrap():
    policy = make_policy(2)
    rollout = make_rollout(T=3, B=1, terminated=[(1, 0)])
    batch, _ = rollout_to_batch(rollout, policy, TargetSettings(GAMMA, 1.0))
    r, v = rollout.rewards[:, 0].astype(np.float64), rollout.values[:, 0].astype(np.float64)
    a2 = r[2] + GAMMA * V(policy, rollout.bootstrap_obs)[0] - v[2]
    a1 = r[1] - v[1]
    a0 = r[0] + GAMMA * v[1] - v[0] + GAMMA * a1
    np.testing.assert_allclose(batch.advantages.numpy(), [a0, a1, a2], rtol=1e-5, atol=1e-5)


def test_terminated_and_truncated_row_is_treated_as_terminal():
    policy = make_policy(3)
    rollout = make_rollout(T=2, B=1, truncated=[(0, 0)], terminated=[(0, 0)])
    assert len(rollout.final_t) == 0
    batch, _ = rollout_to_batch(rollout, policy, TargetSettings(GAMMA, LAM))
    expected = rollout.rewards[0, 0] - rollout.values[0, 0]
    assert batch.advantages[0].item() == pytest.approx(float(expected), abs=1e-6)


def policy_log_probs_and_values(policy, rollout):
    T, B = rollout.rewards.shape
    with torch.no_grad():
        lp, _, values = policy.evaluate_actions(
            torch.from_numpy(flat(rollout.obs)), torch.from_numpy(flat(rollout.actions))
        )
    return lp.numpy().reshape(T, B), values.double().numpy().reshape(T, B)


def test_vtrace_on_policy_equals_gae_with_vtrace_lambda_and_current_values():
    policy = make_policy(4)
    probe = make_rollout(T=6, B=2, seed=5, truncated=[(2, 0)], terminated=[(4, 1)])
    behaviour_lp, current_values = policy_log_probs_and_values(policy, probe)
    rollout = make_rollout(
        T=6, B=2, seed=5, truncated=[(2, 0)], terminated=[(4, 1)], log_probs=behaviour_lp
    )
    settings = TargetSettings(GAMMA, gae_lambda=0.9, use_vtrace=True, vtrace_lambda=0.3)
    batch, diagnostics = rollout_to_batch(rollout, policy, settings)
    rewards = rollout.rewards.astype(np.float64)
    rewards[rollout.final_t, rollout.final_b] += GAMMA * V(policy, rollout.final_obs)
    done = rollout.terminated | rollout.truncated
    adv, ret = hand_gae(rewards, current_values, V(policy, rollout.bootstrap_obs), done, GAMMA, 0.3)
    np.testing.assert_allclose(batch.advantages.numpy(), flat(adv), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(batch.returns.numpy(), flat(ret), rtol=1e-4, atol=1e-5)
    assert diagnostics["charts/importance_ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    # The behaviour values in the rollout are not what V-trace uses ...
    assert np.abs(rollout.values - current_values).max() > 0.1
    # ... while the PPO batch keeps the behaviour values as old_values.
    np.testing.assert_array_equal(batch.old_values.numpy(), flat(rollout.values))


def test_vtrace_with_another_behaviour_policy_corrects_with_clipped_ratios():
    # Default (not orthogonal, 0.01-gain) init: policies far from uniform and apart.
    current = make_policy(6, ortho_init=False)
    behaviour = make_policy(7, ortho_init=False)
    probe = make_rollout(T=6, B=2, seed=8)
    behaviour_lp, _ = policy_log_probs_and_values(behaviour, probe)
    target_lp, current_values = policy_log_probs_and_values(current, probe)
    assert np.abs(behaviour_lp - target_lp).max() > 0.05
    rollout = make_rollout(T=6, B=2, seed=8, log_probs=behaviour_lp)
    settings = TargetSettings(
        GAMMA, LAM, use_vtrace=True, vtrace_rho_bar=1.0, vtrace_c_bar=0.9, vtrace_lambda=LAM
    )
    batch, diagnostics = rollout_to_batch(rollout, current, settings)
    rhos = np.exp(target_lp.astype(np.float64) - behaviour_lp)
    assert diagnostics["charts/importance_ratio_mean"] == pytest.approx(rhos.mean(), rel=1e-4)
    assert diagnostics["charts/importance_ratio_mean"] != pytest.approx(1.0, abs=1e-3)
    assert diagnostics["charts/importance_ratio_clipped"] == pytest.approx((rhos > 1.0).mean())
    done = rollout.terminated | rollout.truncated
    ref = vtrace(
        target_lp.astype(np.float64) - behaviour_lp,
        GAMMA * (1.0 - done),
        rollout.rewards.astype(np.float64),
        current_values,
        V(current, rollout.bootstrap_obs),
        rho_bar=1.0,
        c_bar=0.9,
        lam=LAM,
    )
    # The advantages are IMPALA's, weighted by the clipped rho ...
    np.testing.assert_allclose(batch.advantages.numpy(), flat(ref.pg_advantages), atol=1e-5)
    np.testing.assert_allclose(batch.returns.numpy(), flat(ref.vs), atol=1e-5)
    # ... unless only PPO's ratio is to weight them.
    unweighted = dataclasses.replace(settings, vtrace_weight_advantages=False)
    unweighted_batch, _ = rollout_to_batch(rollout, current, unweighted)
    np.testing.assert_allclose(unweighted_batch.advantages.numpy(), flat(ref.advantages), atol=1e-5)
    assert np.abs(flat(ref.pg_advantages) - flat(ref.advantages)).max() > 1e-3
    # The correction is not a no-op: on-policy targets would differ.
    on_policy, _ = hand_gae(
        rollout.rewards.astype(np.float64),
        current_values,
        V(current, rollout.bootstrap_obs),
        done,
        GAMMA,
        LAM,
    )
    assert np.abs(batch.advantages.numpy() - flat(on_policy)).max() > 1e-3
    # PPO's trust region is around the behaviour policy: old_log_probs are the actor's.
    np.testing.assert_array_equal(batch.old_log_probs.numpy(), flat(rollout.log_probs))


def test_recompute_values_runs_gae_on_the_current_critic():
    """``recompute_values``: GAE's baseline is the learner's current critic, not the
    behaviour values the actors sent (stale by the policy lag); the PPO batch still
    keeps the behaviour values as ``old_values`` and its ratio against ``mu``."""
    policy = make_policy(2)
    rollout = make_rollout(T=6, B=2, seed=9, truncated=[(2, 0)], terminated=[(4, 1)])
    settings = TargetSettings(GAMMA, LAM, recompute_values=True)
    batch, diagnostics = rollout_to_batch(rollout, policy, settings)
    assert diagnostics == {}
    _, current_values = policy_log_probs_and_values(policy, rollout)
    assert np.abs(rollout.values - current_values).max() > 0.1
    rewards = rollout.rewards.astype(np.float64)
    rewards[rollout.final_t, rollout.final_b] += GAMMA * V(policy, rollout.final_obs)
    done = rollout.terminated | rollout.truncated
    adv, ret = hand_gae(rewards, current_values, V(policy, rollout.bootstrap_obs), done, GAMMA, LAM)
    np.testing.assert_allclose(batch.advantages.numpy(), flat(adv), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(batch.returns.numpy(), flat(ret), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(batch.old_values.numpy(), flat(rollout.values))
    np.testing.assert_array_equal(batch.old_log_probs.numpy(), flat(rollout.log_probs))
    # Without it the same rollout gives the behaviour-value targets.
    plain, _ = rollout_to_batch(rollout, policy, TargetSettings(GAMMA, LAM))
    assert np.abs(plain.advantages.numpy() - flat(adv)).max() > 1e-2


def test_vtrace_weight_applies_to_standardised_advantages_when_ppo_normalises():
    """With ``standardize_before_weight`` (the trainer's setting when PPO normalises
    advantages) the batch's advantages are ``min(rho_bar, rho) * standardise(A)``.
    Weighting first and letting PPO normalise afterwards turns an advantage of nearly
    constant sign into the weight itself: the normalised advantages then track
    ``rho`` (the learner reinforcing its own last step), which collapsed V-trace at
    broadcast_every 1. Here every reward is about 10, so every one-step advantage
    (trace lambda 0) is about +10: standardised first, the result does not follow rho."""
    current = make_policy(6, ortho_init=False)
    behaviour = make_policy(7, ortho_init=False)
    probe = make_rollout(T=8, B=4, seed=3)
    behaviour_lp, _ = policy_log_probs_and_values(behaviour, probe)
    target_lp, _ = policy_log_probs_and_values(current, probe)
    rollout = make_rollout(T=8, B=4, seed=3, log_probs=behaviour_lp)
    rewards = np.full_like(rollout.rewards, 10.0)  # every one-step advantage ~ +10
    rewards += 0.01 * np.random.default_rng(0).standard_normal(rewards.shape)
    rollout = dataclasses.replace(rollout, rewards=rewards.astype(np.float32))
    base = TargetSettings(GAMMA, LAM, use_vtrace=True, vtrace_lambda=0.0)
    weighted_first, _ = rollout_to_batch(rollout, current, base)
    fixed, _ = rollout_to_batch(
        rollout, current, dataclasses.replace(base, standardize_before_weight=True)
    )
    unweighted, _ = rollout_to_batch(
        rollout, current, dataclasses.replace(base, vtrace_weight_advantages=False)
    )
    w = np.minimum(1.0, np.exp(flat(target_lp).astype(np.float64) - flat(behaviour_lp)))
    a = unweighted.advantages.numpy().astype(np.float64)
    expected = w * (a - a.mean()) / (a.std() + 1e-8)
    np.testing.assert_allclose(fixed.advantages.numpy(), expected, rtol=1e-4, atol=1e-5)

    def normalised(x: np.ndarray) -> np.ndarray:  # what PPO does to a minibatch
        return (x - x.mean()) / (x.std() + 1e-8)

    assert w.std() > 0.05
    follows_rho = np.corrcoef(normalised(weighted_first.advantages.numpy()), w)[0, 1]
    assert follows_rho > 0.95  # the defect: the weight became the advantage
    assert abs(np.corrcoef(normalised(fixed.advantages.numpy()), w)[0, 1]) < 0.5
    # The trainer standardises first exactly when PPO normalises advantages.
    for normalise in (True, False):
        trainer = Trainer(
            LearnerConfig(use_vtrace=True),
            PPOConfig(normalize_advantages=normalise),
            PolicyConfig(hidden_sizes=(8,)),
            OBS_SPACE,
            ACT_SPACE,
        )
        assert trainer.targets.standardize_before_weight is normalise
