"""Tests for zmq_rl.policy: architecture, sampling math and weight (de)serialisation."""

from __future__ import annotations

import math

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium import spaces

from zmq_rl.config import PolicyConfig
from zmq_rl.rl.policy import (
    ActorCritic,
    WeightsMismatch,
    build_policy,
    check_weights,
    export_weights,
    import_weights,
)

torch.set_num_threads(1)

CARTPOLE = (spaces.Box(-np.inf, np.inf, (4,), np.float32), spaces.Discrete(2))
PENDULUM = (spaces.Box(-8.0, 8.0, (3,), np.float32), spaces.Box(-2.0, 2.0, (1,), np.float32))
MULTI_BOX = (spaces.Box(-1.0, 1.0, (2, 3), np.float32), spaces.Box(-1.0, 1.0, (3,), np.float32))


def make(space_pair, seed: int = 0, **cfg) -> ActorCritic:
    torch.manual_seed(seed)
    return build_policy(space_pair[0], space_pair[1], PolicyConfig(**cfg))


def random_obs(policy: ActorCritic, n: int = 16, seed: int = 123) -> torch.Tensor:
    return torch.randn(n, policy.obs_dim, generator=torch.Generator().manual_seed(seed))


# -- construction ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env_id", "discrete", "obs_dim", "action_dim"),
    [("CartPole-v1", True, 4, 2), ("Pendulum-v1", False, 3, 1)],
)
def test_builds_for_real_env_spaces(env_id, discrete, obs_dim, action_dim):
    env = gymnasium.make(env_id)
    try:
        policy = build_policy(env.observation_space, env.action_space, PolicyConfig())
        obs, _ = env.reset(seed=0)
    finally:
        env.close()
    assert (policy.discrete, policy.obs_dim, policy.action_dim) == (discrete, obs_dim, action_dim)
    batch = torch.as_tensor(np.stack([obs, obs]))
    with torch.inference_mode():
        action, log_prob, value = policy.act(batch, torch.Generator().manual_seed(0))
    if discrete:
        assert action.dtype == torch.int64 and action.shape == (2,)
    else:
        assert action.dtype == torch.float32 and action.shape == (2, 1)
    assert log_prob.dtype == value.dtype == torch.float32
    assert log_prob.shape == value.shape == (2,)


def test_observations_are_flattened_and_cast():
    policy = make(MULTI_BOX)
    assert (policy.obs_dim, policy.action_dim) == (6, 3)
    obs = torch.randn(5, 2, 3, dtype=torch.float64)
    action, log_prob, value = policy.act(obs)
    assert action.shape == (5, 3) and log_prob.shape == (5,) and value.dtype == torch.float32
    assert torch.equal(policy.value(obs), policy.value(obs.reshape(5, 6).float()))
    with pytest.raises(ValueError, match="flatten"):
        policy.value(torch.randn(5, 7))


@pytest.mark.parametrize(
    ("obs_space", "act_space", "named"),
    [
        (CARTPOLE[0], spaces.Dict({"a": spaces.Discrete(2)}), "action space Dict"),
        (CARTPOLE[0], spaces.Tuple((spaces.Discrete(2),)), "action space Tuple"),
        (spaces.Text(5), CARTPOLE[1], "Text"),
        (spaces.Dict({"t": spaces.Text(5)}), CARTPOLE[1], "Text"),
    ],
)
def test_rejects_unsupported_spaces(obs_space, act_space, named):
    with pytest.raises(ValueError, match=named):
        build_policy(obs_space, act_space, PolicyConfig())


def test_separate_and_shared_trunks():
    separate = make(CARTPOLE, hidden_sizes=(8, 5))
    shared = make(CARTPOLE, hidden_sizes=(8, 5), shared_trunk=True)
    sep_names = set(separate.state_dict())
    shared_names = set(shared.state_dict())
    assert {"actor_trunk.0.weight", "critic_trunk.2.weight"} <= sep_names
    assert not any(name.startswith("trunk.") for name in sep_names)
    assert "trunk.2.weight" in shared_names
    assert not any("actor_trunk" in name or "critic_trunk" in name for name in shared_names)
    assert separate.actor_trunk[2].weight.shape == (5, 8)
    assert shared.policy_head.weight.shape == (2, 5)


@pytest.mark.parametrize("activation", ["tanh", "relu"])
@pytest.mark.parametrize("shared", [False, True])
def test_forward_matches_module_composition(activation, shared):
    """The fast forward (F.linear per layer) computes exactly what the modules do."""
    policy = make(PENDULUM, activation=activation, shared_trunk=shared, hidden_sizes=(7, 6, 5))
    obs = random_obs(policy)
    mean, value = policy(obs)
    if shared:
        h = policy.trunk(obs)
        ref_mean, ref_value = policy.policy_head(h), policy.value_head(h)
    else:
        ref_mean = policy.policy_head(policy.actor_trunk(obs))
        ref_value = policy.value_head(policy.critic_trunk(obs))
    torch.testing.assert_close(mean, ref_mean, rtol=0, atol=1e-6)
    torch.testing.assert_close(value, ref_value.squeeze(-1), rtol=0, atol=1e-6)
    torch.testing.assert_close(policy.value(obs), value, rtol=0, atol=0)


def test_orthogonal_init_gains_and_zero_biases():
    policy = make(PENDULUM, hidden_sizes=(64, 64), log_std_init=-0.5)
    w0 = policy.actor_trunk[0].weight  # [64, 3]: orthonormal columns times sqrt(2)
    torch.testing.assert_close(w0.T @ w0, 2.0 * torch.eye(3), atol=1e-5, rtol=0)
    w1 = policy.critic_trunk[2].weight  # square: W W^T = 2 I
    torch.testing.assert_close(w1 @ w1.T, 2.0 * torch.eye(64), atol=1e-4, rtol=0)
    head = policy.policy_head.weight  # [1, 64]: a row of norm 0.01
    torch.testing.assert_close(head @ head.T, torch.tensor([[1e-4]]), atol=1e-8, rtol=0)
    value_head = policy.value_head.weight
    torch.testing.assert_close(value_head @ value_head.T, torch.ones(1, 1), atol=1e-5, rtol=0)
    for name, tensor in policy.state_dict().items():
        if name.endswith("bias"):
            assert torch.count_nonzero(tensor) == 0, name
    assert torch.equal(policy.log_std.data, torch.full((1,), -0.5))
    plain = make(PENDULUM, ortho_init=False)
    assert torch.count_nonzero(plain.policy_head.bias) > 0  # torch default init kept


# -- sampling math -----------------------------------------------------------------


@pytest.mark.parametrize("shared", [False, True])
def test_discrete_log_prob_matches_evaluate_and_torch_distributions(shared):
    policy = make(CARTPOLE, shared_trunk=shared)
    obs = random_obs(policy, n=64)
    with torch.inference_mode():
        action, log_prob, value = policy.act(obs, torch.Generator().manual_seed(1))
    action, log_prob, value = action.clone(), log_prob.clone(), value.clone()
    eval_log_prob, entropy, eval_value = policy.evaluate_actions(obs, action)
    assert eval_log_prob.requires_grad and entropy.requires_grad
    torch.testing.assert_close(log_prob, eval_log_prob.detach(), atol=1e-6, rtol=0)
    torch.testing.assert_close(value, eval_value.detach(), atol=1e-6, rtol=0)
    logits, _ = policy(obs)
    reference = torch.distributions.Categorical(logits=logits.detach())
    torch.testing.assert_close(log_prob, reference.log_prob(action), atol=1e-6, rtol=0)
    torch.testing.assert_close(entropy.detach(), reference.entropy(), atol=1e-6, rtol=0)
    # Also for actions act did not pick, and for actions given as floats.
    other = 1 - action
    torch.testing.assert_close(
        policy.evaluate_actions(obs, other.float())[0].detach(),
        reference.log_prob(other),
        atol=1e-6,
        rtol=0,
    )


@pytest.mark.parametrize("space_pair", [PENDULUM, MULTI_BOX])
def test_gaussian_log_prob_matches_evaluate_and_torch_distributions(space_pair):
    policy = make(space_pair, log_std_init=0.0)
    with torch.no_grad():
        policy.log_std.copy_(torch.linspace(-1.0, 0.7, policy.action_dim))
    obs = torch.randn(64, *space_pair[0].shape)
    with torch.inference_mode():
        action, log_prob, _ = policy.act(obs, torch.Generator().manual_seed(2))
    action, log_prob = action.clone(), log_prob.clone()
    eval_log_prob, entropy, _ = policy.evaluate_actions(obs, action)
    torch.testing.assert_close(log_prob, eval_log_prob.detach(), atol=1e-6, rtol=0)
    mean, _ = policy(obs)
    reference = torch.distributions.Normal(mean.detach(), policy.log_std.detach().exp())
    torch.testing.assert_close(log_prob, reference.log_prob(action).sum(-1), atol=1e-6, rtol=0)
    torch.testing.assert_close(entropy.detach(), reference.entropy().sum(-1), atol=1e-6, rtol=0)
    # The entropy gradient reaches log_std (d/dlog_std of sum(log_std) = 1 per dim).
    entropy.mean().backward()
    torch.testing.assert_close(policy.log_std.grad, torch.ones(policy.action_dim))


def test_deterministic_act_is_mode():
    discrete = make(CARTPOLE)
    with torch.no_grad():
        discrete.policy_head.bias.copy_(torch.tensor([0.0, 0.05]))
    obs = random_obs(discrete, n=32)
    action, log_prob, _ = discrete.act(obs, deterministic=True)
    logits, _ = discrete(obs)
    assert torch.equal(action, logits.argmax(-1))
    torch.testing.assert_close(log_prob, discrete.evaluate_actions(obs, action)[0].detach())

    box = make(PENDULUM, log_std_init=-0.3)
    obs = random_obs(box, n=32)
    action, log_prob, _ = box.act(obs, deterministic=True)
    mean, _ = box(obs)
    assert torch.equal(action, mean.detach())
    torch.testing.assert_close(log_prob, box.evaluate_actions(obs, action)[0].detach())
    torch.testing.assert_close(log_prob, torch.full((32,), 0.3 - 0.5 * math.log(2 * math.pi)))


@pytest.mark.parametrize("space_pair", [CARTPOLE, PENDULUM])
def test_seeded_generators_reproduce_and_differ(space_pair):
    policy = make(space_pair)
    obs = random_obs(policy, n=64)

    def sample(seed: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed)
        with torch.inference_mode():
            return torch.cat([policy.act(obs, gen)[0].reshape(64, -1) for _ in range(3)], 1)

    torch.manual_seed(0)
    first = sample(7)
    torch.manual_seed(99)  # the global RNG must not matter
    assert torch.equal(first, sample(7))
    assert not torch.equal(first, sample(8))


def test_categorical_sampling_frequencies_match_softmax():
    """Gumbel-max sampling draws from softmax(logits), not from a distorted law."""
    policy = make((CARTPOLE[0], spaces.Discrete(3)))
    logits = torch.tensor([0.0, 1.0, -1.0])
    with torch.no_grad():
        policy.policy_head.weight.zero_()
        policy.policy_head.bias.copy_(logits)
    n = 40_000
    with torch.inference_mode():
        action, log_prob, _ = policy.act(torch.zeros(n, 4), torch.Generator().manual_seed(3))
    freq = torch.bincount(action, minlength=3).double() / n
    probs = torch.softmax(logits.double(), 0)
    # 4.5 standard errors: sqrt(p (1 - p) / n) <= 0.0025.
    torch.testing.assert_close(freq, probs, atol=0.012, rtol=0)
    torch.testing.assert_close(log_prob, torch.log_softmax(logits, 0)[action], atol=1e-6, rtol=0)


def test_gaussian_sample_is_unclipped_with_the_right_moments():
    policy = make(PENDULUM, log_std_init=math.log(5.0))
    with torch.no_grad():
        policy.policy_head.weight.zero_()
        policy.policy_head.bias.fill_(1.0)
    n = 20_000
    with torch.inference_mode():
        action, log_prob, _ = policy.act(torch.zeros(n, 3), torch.Generator().manual_seed(4))
    high = float(PENDULUM[1].high[0])
    assert (action.abs() > high).float().mean() > 0.5  # far outside [-2, 2]: not clipped
    assert abs(action.mean().item() - 1.0) < 0.15  # 4 standard errors of 5 / sqrt(n)
    assert abs(action.std().item() - 5.0) < 0.15
    reference = torch.distributions.Normal(torch.ones(n, 1), torch.full((n, 1), 5.0))
    torch.testing.assert_close(log_prob, reference.log_prob(action).sum(-1), atol=1e-5, rtol=0)


def test_act_builds_no_graph_but_evaluate_does():
    policy = make(PENDULUM)
    obs = random_obs(policy)
    action, log_prob, value = policy.act(obs)
    assert not (action.requires_grad or log_prob.requires_grad or value.requires_grad)
    log_prob, entropy, value = policy.evaluate_actions(obs, action)
    (log_prob.sum() + entropy.sum() + value.sum()).backward()
    assert all(p.grad is not None for p in policy.parameters())


# -- weights -----------------------------------------------------------------------


@pytest.mark.parametrize("space_pair", [CARTPOLE, PENDULUM])
@pytest.mark.parametrize("shared", [False, True])
def test_export_import_reproduces_outputs_bit_for_bit(space_pair, shared):
    source = make(space_pair, seed=1, shared_trunk=shared)
    if not source.discrete:
        with torch.no_grad():
            source.log_std.fill_(-0.77)
    target = make(space_pair, seed=2, shared_trunk=shared)
    obs = random_obs(source, n=32)
    src_params, src_value = source(obs)
    assert not torch.equal(src_params, target(obs)[0])

    weights = export_weights(source)
    assert [name for name, _ in weights] == list(source.state_dict())
    for name, array in weights:
        assert isinstance(array, np.ndarray) and array.dtype == np.float32, name
        assert array.flags.c_contiguous

    import_weights(target, weights)
    params, value = target(obs)
    assert torch.equal(params, src_params) and torch.equal(value, src_value)
    for (name, expected), (_, actual) in zip(
        source.state_dict().items(), target.state_dict().items(), strict=True
    ):
        assert torch.equal(expected, actual), name
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    for x, y in zip(source.act(obs, g1), target.act(obs, g2), strict=True):
        assert torch.equal(x, y)


def test_export_is_a_snapshot_and_import_keeps_parameter_identity():
    source = make(PENDULUM, seed=1)
    weights = export_weights(source)
    before = {name: array.copy() for name, array in weights}
    with torch.no_grad():
        for p in source.parameters():
            p.add_(1.0)
    for name, array in weights:
        assert np.array_equal(array, before[name]), name  # not aliasing the live tensors

    target = make(PENDULUM, seed=2)
    params_before = [id(p) for p in target.parameters()]
    optimizer = torch.optim.Adam(target.parameters())
    import_weights(target, weights)
    assert [id(p) for p in target.parameters()] == params_before
    assert optimizer.param_groups[0]["params"][0] is next(target.parameters())
    assert torch.equal(target.log_std.data, torch.from_numpy(before["log_std"]))


def test_import_accepts_read_only_frames():
    """Arrays decoded from message frames (np.frombuffer) are read-only."""
    source, target = make(CARTPOLE, seed=1), make(CARTPOLE, seed=2)
    frames = [
        (name, np.frombuffer(array.tobytes(), dtype=array.dtype).reshape(array.shape))
        for name, array in export_weights(source)
    ]
    assert not frames[0][1].flags.writeable
    import_weights(target, frames)
    obs = random_obs(source)
    assert torch.equal(source(obs)[0], target(obs)[0])


def _corrupt(kind: str, weights: list[tuple[str, np.ndarray]]) -> list[tuple[str, np.ndarray]]:
    weights = list(weights)
    if kind == "missing":
        del weights[3]
    elif kind == "extra":
        weights.append(("critic_trunk.9.weight", np.zeros((2, 2), np.float32)))
    elif kind == "shape":
        name, array = weights[3]
        weights[3] = (name, np.zeros((array.shape[0] + 1,), np.float32))
    elif kind == "dtype":
        name, array = weights[3]
        weights[3] = (name, array.astype(np.float64))
    elif kind == "duplicate":
        weights.append(weights[3])
    return weights


@pytest.mark.parametrize(
    ("kind", "pattern"),
    [
        ("missing", r"missing \['actor_trunk\.2\.bias'\]"),
        ("extra", r"unexpected \['critic_trunk\.9\.weight'\]"),
        ("shape", r"'actor_trunk\.2\.bias'.*\(64,\).*\(65,\)"),
        ("dtype", r"'actor_trunk\.2\.bias'.*float32.*float64"),
        ("duplicate", r"duplicate.*'actor_trunk\.2\.bias'"),
    ],
)
def test_import_rejects_mismatches_and_leaves_module_unchanged(kind, pattern):
    source, target = make(CARTPOLE, seed=1), make(CARTPOLE, seed=2)
    assert list(target.state_dict())[3] == "actor_trunk.2.bias"
    before = {name: t.clone() for name, t in target.state_dict().items()}
    with pytest.raises(WeightsMismatch, match=pattern) as info:
        import_weights(target, _corrupt(kind, export_weights(source)))
    assert isinstance(info.value, ValueError)
    for name, tensor in target.state_dict().items():
        assert torch.equal(tensor, before[name]), name  # atomic: nothing was copied


def test_scalar_and_one_element_tensors_never_stand_for_each_other():
    """A ``[]`` array for a ``[1]`` tensor (value_head.bias) and the reverse are
    refused by check_weights and import_weights (no broadcasting, no reshaping:
    docs/protocol.md section 4.2), naming the tensor and both shapes."""
    source = export_weights(make(CARTPOLE, seed=1))
    target = make(CARTPOLE, seed=2)
    assert dict(source)["value_head.bias"].shape == (1,)
    scalar = [(n, a.reshape(()) if n == "value_head.bias" else a) for n, a in source]
    with pytest.raises(WeightsMismatch, match=r"'value_head\.bias'.*\(1,\).*shape \(\)"):
        check_weights(target, scalar)
    with pytest.raises(WeightsMismatch, match=r"'value_head\.bias'"):
        import_weights(target, scalar)
    flat = torch.nn.Linear(2, 1)
    flat.bias = torch.nn.Parameter(torch.zeros(()))  # a scalar parameter, sent as [1]
    with pytest.raises(WeightsMismatch, match=r"'bias'.*shape \(\).*\(1,\)"):
        check_weights(
            flat, [("weight", np.zeros((1, 2), np.float32)), ("bias", np.zeros(1, np.float32))]
        )
    assert check_weights(target, source).keys() == target.state_dict().keys()


def test_import_rejects_weights_of_another_architecture():
    with pytest.raises(WeightsMismatch, match="log_std"):
        import_weights(make(PENDULUM), export_weights(make((PENDULUM[0], spaces.Discrete(1)))))
    with pytest.raises(WeightsMismatch, match=r"'actor_trunk\.0\.weight'.*\(32, 4\).*\(64, 4\)"):
        import_weights(make(CARTPOLE, hidden_sizes=(32, 64)), export_weights(make(CARTPOLE)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_export_import_across_devices():
    source = make(PENDULUM, seed=1).cuda()
    target = make(PENDULUM, seed=2)
    import_weights(target, export_weights(source))
    obs = random_obs(target)
    assert torch.equal(target(obs)[0], source(obs.cuda())[0].cpu())
    back = make(PENDULUM, seed=3).cuda()
    import_weights(back, export_weights(target))
    assert next(back.parameters()).is_cuda
    assert torch.equal(back(obs.cuda())[1], source(obs.cuda())[1])
