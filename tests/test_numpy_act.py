"""The actor's numpy sampler (rl/numpy_act.py) against ActorCritic.act in torch."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from gymnasium import spaces

from tests.test_analytic import OBS, SPACES
from tests.test_analytic import _policy as analytic_policy
from zmq_rl.config import PolicyConfig
from zmq_rl.rl.numpy_act import NumpySampler, numpy_act_support
from zmq_rl.rl.policy import build_policy, export_weights, import_weights

CASES = {
    "discrete": dict(action="discrete"),
    "discrete-relu-shared": dict(action="discrete", activation="relu", shared_trunk=True),
    "discrete-normalized-obs": dict(action="discrete", normalize_obs=True),
    "box": dict(action="box"),
    "box-normalized-obs-float64": dict(action="box", normalize_obs=True, dtype=torch.float64),
}


def _policy(action: str, dtype: torch.dtype = torch.float32, **policy_kw):
    """test_analytic's policy (heads away from their near-zero init), float32 unless
    asked: the actors' dtype."""
    return analytic_policy(action, dtype, **policy_kw)


def _obs(n: int = 64, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((n, 5)) * 3.0).astype(np.float32)


@pytest.mark.parametrize("case", sorted(CASES))
def test_log_probs_and_values_are_torchs(case):
    """Every sampled action's log-prob is the density torch's evaluate_actions gives
    it, and every value is torch's: the learner's ratios start at 1."""
    kw = dict(CASES[case])
    policy = _policy(kw.pop("action"), **kw)
    sampler = NumpySampler(policy, seed=7)
    obs = _obs()
    actions, log_probs, values = sampler.act(obs)
    assert len(actions) == len(log_probs) == len(values) == len(obs)
    dtype = np.float64 if kw.get("dtype") is torch.float64 else np.float32
    assert log_probs.dtype == dtype and values.dtype == dtype
    with torch.no_grad():
        want_lp, _, want_v = policy.evaluate_actions(
            torch.from_numpy(obs), torch.from_numpy(np.asarray(actions))
        )
    np.testing.assert_allclose(log_probs, want_lp.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(values, want_v.numpy(), rtol=1e-5, atol=1e-5)
    if SPACES[CASES[case]["action"]].__class__ is spaces.Discrete:
        assert actions.dtype == np.int64 and set(np.unique(actions)) <= set(range(4))
    else:
        assert actions.shape == (len(obs), 3)


def _draws(action: str, seed: int):
    """40,000 samples for one observation: the policy, the actions and its head's
    output (logits or mean) for that observation."""
    policy = _policy(action)
    obs = np.repeat(_obs(1, seed=seed + 4), 40_000, axis=0)
    actions, _, _ = NumpySampler(policy, seed=seed).act(obs)
    with torch.no_grad():
        params, _ = policy(torch.from_numpy(obs[:1]))
    return policy, actions, params[0]


def test_categorical_samples_follow_the_softmax():
    """A Gumbel-max bug (a sign, log of the wrong thing, argmin) skews the frequencies
    far beyond the sampling error of 40,000 draws (~0.0025)."""
    _, actions, logits = _draws("discrete", seed=1)
    want = torch.softmax(logits, -1).numpy()
    assert want.max() - want.min() > 0.2  # a skewed distribution, so a uniform bug shows
    got = np.bincount(actions, minlength=4) / len(actions)
    np.testing.assert_allclose(got, want, atol=0.012)


def test_gaussian_samples_have_the_policys_mean_and_spread():
    policy, actions, mean = _draws("box", seed=2)
    np.testing.assert_allclose(actions.mean(axis=0), mean.numpy(), atol=0.03)
    np.testing.assert_allclose(
        actions.std(axis=0), policy.log_std.detach().exp().numpy(), rtol=0.03
    )


def test_seeded_streams_repeat_and_differ():
    policy = _policy("discrete")
    obs = _obs(256)
    a = NumpySampler(policy, seed=11).act(obs)[0]
    assert np.array_equal(a, NumpySampler(policy, seed=11).act(obs)[0])
    assert not np.array_equal(a, NumpySampler(policy, seed=12).act(obs)[0])


def test_weights_loaded_in_place_are_the_ones_sampled_from():
    """The sampler reads the parameters through views: weights loaded the way actors
    load broadcasts (import_weights) change its values with no refresh."""
    policy = _policy("discrete", normalize_obs=True)
    other = copy.deepcopy(policy)
    sampler = NumpySampler(policy, seed=0)
    obs = _obs()
    before = sampler.act(obs)[2]
    with torch.no_grad():
        for param in other.parameters():
            param.add_(0.1)
        other.obs_mean.fill_(0.5)  # the buffers travel with the weights too
    import_weights(policy, export_weights(other))
    after = sampler.act(obs)[2]
    assert not np.allclose(before, after)
    with torch.no_grad():
        np.testing.assert_allclose(after, policy.value(torch.from_numpy(obs)).numpy(), rtol=1e-5)
    # A tensor given new memory needs refresh(): afterwards the new values count.
    with torch.no_grad():
        policy.value_head.bias.data = torch.full_like(policy.value_head.bias, 5.0)
    sampler.refresh()
    with torch.no_grad():
        want = policy.value(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(sampler.act(obs)[2], want, rtol=1e-5)


def test_support_is_the_plain_mlp_on_the_cpu():
    mlp = _policy("discrete")
    assert numpy_act_support(mlp) is None
    lstm = build_policy(OBS, SPACES["discrete"], PolicyConfig(policy_type="lstm"))
    assert "RecurrentActorCritic" in numpy_act_support(lstm)
    assert "not the CPU" in numpy_act_support(copy.deepcopy(mlp).to("meta"))
    assert "float32" in numpy_act_support(copy.deepcopy(mlp).half())
    with pytest.raises(ValueError, match="RecurrentActorCritic"):
        NumpySampler(lstm, seed=0)


def test_a_wrong_observation_width_is_named():
    sampler = NumpySampler(_policy("discrete"), seed=0)
    with pytest.raises(ValueError, match=r"does not flatten to \[B, 5\]"):
        sampler.act(np.zeros((3, 4), np.float32))


def test_an_exponential_draw_of_zero_picks_its_action_without_a_warning():
    """Gumbel-max draws E ~ Exp(1) and takes argmax(z - log E); float32 draws are
    exactly 0 about once in 2^24 (a run of 400k steps met one, and numpy printed
    "divide by zero encountered in log" into the actor's log). Such a draw is the
    Gumbel tail: its action wins, silently."""

    class ZeroAt:
        """An rng whose exponential draws are 1 except 0 at (row, column)."""

        def __init__(self, row: int, column: int) -> None:
            self.row, self.column = row, column

        def standard_exponential(self, shape, dtype):
            draws = np.ones(shape, dtype)
            draws[self.row, self.column] = 0.0
            return draws

    sampler = NumpySampler(_policy("discrete"), seed=0)
    obs = _obs(8)
    for column in range(4):
        sampler.rng = ZeroAt(5, column)
        with np.errstate(all="raise"):
            actions, log_probs, _ = sampler.act(obs)
        assert actions[5] == column and np.isfinite(log_probs).all()
