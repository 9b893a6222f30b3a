"""Every space kind round-trips through its spec (and through msgpack), and the
structured policy computes on every kind: one head per action component, log-probs
and entropies summed over the components."""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import msgpack
import numpy as np
import pytest
import torch
from gymnasium import spaces

from zmq_rl.config import PolicyConfig
from zmq_rl.rl.networks import ActionHeads, StructuredActorCritic, batch_obs, obs_tensor
from zmq_rl.rl.policy import ActorCritic, build_policy, export_weights, import_weights
from zmq_rl.wire.protocol import space_from_spec, space_spec
from zmq_rl.wire.spaces import env_actions, value_problem

BOX = spaces.Box(-1.0, 1.0, (3,), np.float32)
SPACES = {
    "box": BOX,
    "box-int-2d": spaces.Box(0, 9, (2, 2), np.int64),
    "box-inf": spaces.Box(-np.inf, np.inf, (4,), np.float64),
    "image": spaces.Box(0, 255, (4, 36, 36), np.uint8),
    "discrete": spaces.Discrete(4),
    "discrete-start": spaces.Discrete(3, start=-1),
    "multi-binary": spaces.MultiBinary(5),
    "multi-binary-2d": spaces.MultiBinary([2, 3]),
    "multi-discrete": spaces.MultiDiscrete([2, 3, 4]),
    "multi-discrete-start": spaces.MultiDiscrete([3, 2], start=[1, -1]),
    "multi-discrete-2d": spaces.MultiDiscrete([[2, 3], [4, 5]]),
    "dict": spaces.Dict({"a": BOX, "b": spaces.Discrete(4)}),
    "tuple": spaces.Tuple((spaces.MultiBinary(2), spaces.Discrete(3))),
    "nested": spaces.Dict(
        {
            "pos": BOX,
            "sensors": spaces.Tuple((spaces.MultiDiscrete([2, 2]), spaces.Discrete(5))),
            "flags": spaces.Dict({"on": spaces.MultiBinary(1)}),
        }
    ),
}


@pytest.mark.parametrize("name", sorted(SPACES))
def test_every_space_kind_round_trips_through_its_spec_and_msgpack(name):
    space = SPACES[name]
    spec = space_spec(space)
    wire = msgpack.unpackb(msgpack.packb(spec, use_bin_type=True), raw=False)
    back = space_from_spec(wire)
    assert back == space
    assert type(back) is type(space)
    if isinstance(space, spaces.Dict):
        assert list(back.spaces) == list(space.spaces)  # order kept


def test_the_issue_one_liner_passes():
    code = (
        "import gymnasium as gym; from zmq_rl.wire.protocol import space_spec, space_from_spec; "
        "s = gym.spaces.Dict({'a': gym.spaces.Box(-1, 1, (3,)), 'b': gym.spaces.Discrete(4)}); "
        "assert space_from_spec(space_spec(s)) == s"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


OBSERVATIONS = ["box", "box-int-2d", "image", "discrete-start", "multi-binary-2d"]
OBSERVATIONS += ["multi-discrete-start", "dict", "tuple", "nested"]
ACTIONS = ["discrete", "discrete-start", "multi-discrete-start", "multi-discrete-2d"]
ACTIONS += ["multi-binary", "multi-binary-2d", "box", "box-int-2d"]


@pytest.mark.parametrize("obs_name", OBSERVATIONS)
@pytest.mark.parametrize("policy_type", ["mlp", "gru"])
def test_policies_act_on_every_observation_kind(obs_name, policy_type):
    obs_space = SPACES[obs_name]
    obs_space.seed(0)
    policy = build_policy(
        obs_space,
        spaces.Discrete(2),
        PolicyConfig(hidden_sizes=(8,), normalize_obs=True, policy_type=policy_type),
    )
    batch = batch_obs(obs_space, [obs_space.sample() for _ in range(4)])
    assert value_problem(obs_space, batch, "obs", 1) is None  # it is what the wire carries
    policy.update_obs_stats(batch)
    obs = obs_tensor(batch)
    if policy_type == "mlp":
        action, log_prob, value = policy.act(obs)
    else:
        action, log_prob, value, _ = policy.act_recurrent(obs, policy.initial_state(4))
    assert action.shape == log_prob.shape == value.shape == (4,)
    assert torch.isfinite(log_prob).all() and torch.isfinite(value).all()
    # The weights travel: a second process's network takes them.
    twin = build_policy(
        obs_space,
        spaces.Discrete(2),
        PolicyConfig(hidden_sizes=(8,), normalize_obs=True, policy_type=policy_type),
    )
    import_weights(twin, export_weights(policy))


@pytest.mark.parametrize("act_name", ACTIONS)
def test_actions_of_every_kind_are_valid_env_actions(act_name):
    space = SPACES[act_name]
    policy = build_policy(BOX, space, PolicyConfig(hidden_sizes=(8,)))
    obs = torch.rand(64, 3) * 2 - 1
    for deterministic in (False, True):
        action, log_prob, _ = policy.act(obs, torch.Generator().manual_seed(1), deterministic)
        assert tuple(action.shape) == (64, *space.shape)
        # What act samples is what evaluate_actions scores.
        again, _, _ = policy.evaluate_actions(obs, action)
        torch.testing.assert_close(again, log_prob, atol=1e-5, rtol=1e-5)
        for a in env_actions(space, action.numpy()):
            env_action = a.item() if isinstance(space, spaces.Discrete) else a
            if isinstance(space, spaces.Box):
                env_action = np.asarray(a, space.dtype)
            assert space.contains(env_action), (act_name, a)


def test_flat_box_discrete_keeps_the_mlp_actor_critic():
    policy = build_policy(BOX, spaces.Discrete(2), PolicyConfig())
    assert type(policy) is ActorCritic
    assert type(build_policy(BOX, spaces.Discrete(2, start=1), PolicyConfig())) is (
        StructuredActorCritic
    )


def test_multi_head_log_prob_and_entropy_are_sums_over_components():
    """Against torch.distributions, component by component."""
    torch.manual_seed(0)
    cfg = PolicyConfig()
    md = ActionHeads(spaces.MultiDiscrete([3, 2, 4]), cfg)
    params = torch.randn(5, md.num_params)
    actions = torch.stack([torch.randint(0, n, (5,)) for n in (3, 2, 4)], dim=1)
    log_prob, entropy = md.evaluate(params, actions)
    dists = [
        torch.distributions.Categorical(logits=chunk)
        for chunk in torch.split(params, [3, 2, 4], dim=1)
    ]
    expected_lp = sum(d.log_prob(actions[:, k]) for k, d in enumerate(dists))
    expected_ent = sum(d.entropy() for d in dists)
    torch.testing.assert_close(log_prob, expected_lp)
    torch.testing.assert_close(entropy, expected_ent)

    mb = ActionHeads(spaces.MultiBinary(3), cfg)
    logits = torch.randn(5, 3)
    bits = torch.randint(0, 2, (5, 3)).to(torch.int8)
    log_prob, entropy = mb.evaluate(logits, bits)
    bern = torch.distributions.Bernoulli(logits=logits)
    torch.testing.assert_close(log_prob, bern.log_prob(bits.float()).sum(-1))
    torch.testing.assert_close(entropy, bern.entropy().sum(-1))

    box = ActionHeads(spaces.Box(-1, 1, (2, 2)), cfg)
    with torch.no_grad():
        box.log_std.copy_(torch.tensor([0.1, -0.2, 0.3, 0.0]))
    mean = torch.randn(5, 4)
    a = torch.randn(5, 2, 2)
    log_prob, entropy = box.evaluate(mean, a)
    normal = torch.distributions.Normal(mean, box.log_std.exp())
    torch.testing.assert_close(log_prob, normal.log_prob(a.reshape(5, 4)).sum(-1))
    torch.testing.assert_close(entropy, normal.entropy().sum(-1))


def test_sampling_follows_each_component_distribution():
    """Empirical frequencies of Gumbel-max samples per MultiDiscrete component and of
    Bernoulli bits match their probabilities (a head mixing up components fails)."""
    heads = ActionHeads(spaces.MultiDiscrete([2, 3]), PolicyConfig())
    params = torch.tensor([[0.0, 1.0, 2.0, 0.0, -1.0]]).expand(20000, 5)
    action, _ = heads.sample(params, torch.Generator().manual_seed(0))
    p0 = torch.softmax(torch.tensor([0.0, 1.0]), 0)[1]
    p1 = torch.softmax(torch.tensor([2.0, 0.0, -1.0]), 0)
    assert abs(action[:, 0].float().mean() - p0) < 0.02
    freq = torch.bincount(action[:, 1], minlength=3).float() / 20000
    torch.testing.assert_close(freq, p1, atol=0.02, rtol=0)
    bits = ActionHeads(spaces.MultiBinary(2), PolicyConfig())
    drawn, _ = bits.sample(
        torch.tensor([[2.0, -1.0]]).expand(20000, 2), torch.Generator().manual_seed(0)
    )
    torch.testing.assert_close(
        drawn.float().mean(0), torch.sigmoid(torch.tensor([2.0, -1.0])), atol=0.02, rtol=0
    )


def test_normalisation_applies_to_float_box_parts_only():
    space = spaces.Dict(
        {"f": spaces.Box(-5, 5, (2,), np.float32), "i": spaces.Box(0, 9, (2,), np.int64)}
    )
    policy = build_policy(space, spaces.Discrete(2), PolicyConfig(normalize_obs=True))
    names = set(policy.state_dict())
    assert "encoder.parts.0.obs_mean" in names
    assert not any(name.startswith("encoder.parts.1.obs") for name in names)
    batch = {"f": np.full((10, 2), 3.0, np.float32), "i": np.full((10, 2), 7, np.int64)}
    policy.update_obs_stats(batch)
    torch.testing.assert_close(
        policy.encoder.parts[0].obs_mean, torch.full((2,), 3.0, dtype=torch.float64)
    )
    features = policy.encoder(obs_tensor(batch))
    assert features[:, :2].abs().max() < 1e-3  # standardised
    assert torch.equal(features[:, 2:], torch.full((10, 2), 7.0))  # untouched


def test_discrete_observations_are_one_hot_from_their_start():
    space = spaces.Dict({"d": spaces.Discrete(3, start=5), "m": spaces.MultiDiscrete([2, 2])})
    policy = build_policy(space, spaces.Discrete(2), PolicyConfig())
    batch = {"d": np.array([5, 7]), "m": np.array([[0, 1], [1, 1]])}
    features = policy.encoder(obs_tensor(batch))
    expected = torch.tensor([[1, 0, 0, 1, 0, 0, 1], [0, 0, 1, 0, 1, 0, 1]], dtype=torch.float32)
    assert torch.equal(features, expected)


def test_real_env_dict_observations_batch():
    import tests.space_envs  # noqa: F401  (registers the envs)

    env = gym.make("DictObs-v0")
    obs, _ = env.reset(seed=0)
    batch = batch_obs(env.observation_space, [obs, obs])
    assert value_problem(env.observation_space, batch, "obs", 1) is None
    assert list(batch) == ["bits", "mode", "pos"]
    assert batch["mode"].dtype == np.int64 and batch["bits"].dtype == np.int8
