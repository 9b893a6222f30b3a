"""docs/protocol.md section 6.4 (issue 45 N1): the structured network, computed in numpy
from the tensors a learner broadcasts exactly as the page describes it (the encoder's
leaves in spec order, one-hots, normalisation, the mask as a leaf and on the logits,
the heads), equals zmq_rl's network: logits, values and the log-probabilities of
given actions, for a masked dict observation (the vector ``fragment-masked``'s run)
and for multi-discrete, multi-binary and box actions.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from zmq_rl.config import PolicyConfig
from zmq_rl.conformance.vectors import masked_spaces
from zmq_rl.rl.policy import build_policy

F32_MIN = np.finfo(np.float32).min


def leaves(space: gym.Space, value: Any) -> list[tuple[gym.Space, np.ndarray]]:
    """(leaf space, its rows) in spec order: depth first, a dict's entries in its order."""
    if isinstance(space, gym.spaces.Dict):
        return [leaf for key, sub in space.spaces.items() for leaf in leaves(sub, value[key])]
    if isinstance(space, gym.spaces.Tuple):
        return [leaf for i, sub in enumerate(space.spaces) for leaf in leaves(sub, value[i])]
    return [(space, np.asarray(value))]


def one_hot(x: np.ndarray, n: int) -> np.ndarray:
    return np.eye(n, dtype=np.float32)[np.clip(x, 0, n - 1)]


def encode(space: gym.Space, obs: Any, w: dict[str, np.ndarray], cfg: PolicyConfig) -> np.ndarray:
    """The encoder table of section 6.4."""
    parts = []
    for i, (leaf, x) in enumerate(leaves(space, obs)):
        rows = x.shape[0]
        if isinstance(leaf, gym.spaces.Box):
            flat = x.reshape(rows, -1).astype(np.float32)
            if cfg.normalize_obs and np.issubdtype(leaf.dtype, np.floating):
                mean, var = w[f"encoder.parts.{i}.obs_mean"], w[f"encoder.parts.{i}.obs_var"]
                std = np.sqrt(var + 1e-8).astype(np.float32)
                flat = np.clip((flat - mean.astype(np.float32)) / std, -10, 10)
            parts.append(flat)
        elif isinstance(leaf, gym.spaces.Discrete):
            parts.append(one_hot(x.astype(np.int64) - int(leaf.start), int(leaf.n)))
        elif isinstance(leaf, gym.spaces.MultiDiscrete):
            comps = (x.reshape(rows, -1) - leaf.start.reshape(-1)).astype(np.int64)
            parts += [one_hot(comps[:, k], int(n)) for k, n in enumerate(leaf.nvec.reshape(-1))]
        else:  # MultiBinary
            parts.append(x.reshape(rows, -1).astype(np.float32))
    return np.concatenate(parts, axis=1)


def trunk(x: np.ndarray, prefix: str, w: dict[str, np.ndarray], cfg: PolicyConfig) -> np.ndarray:
    act = np.tanh if cfg.activation == "tanh" else (lambda v: np.maximum(v, 0.0))
    for i in range(len(cfg.hidden_sizes)):
        x = act(x @ w[f"{prefix}.{2 * i}.weight"].T + w[f"{prefix}.{2 * i}.bias"])
    return x


def page_forward(obs_space, obs, w, cfg) -> tuple[np.ndarray, np.ndarray]:
    """(policy head parameters, values) by the page."""
    x = encode(obs_space, obs, w, cfg)
    actor = trunk(x, "trunk" if cfg.shared_trunk else "actor_trunk", w, cfg)
    critic = trunk(x, "trunk" if cfg.shared_trunk else "critic_trunk", w, cfg)
    params = actor @ w["policy_head.weight"].T + w["policy_head.bias"]
    value = (critic @ w["value_head.weight"].T + w["value_head.bias"])[:, 0]
    return params, value


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def page_log_prob(act_space, params, actions, mask=None) -> np.ndarray:
    """The heads table and the masks paragraph of section 6.4."""
    if isinstance(act_space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
        if mask is not None:
            params = np.where(mask.reshape(params.shape) != 0, params, F32_MIN)
        nvec = (
            [int(act_space.n)]
            if isinstance(act_space, gym.spaces.Discrete)
            else list(act_space.nvec.reshape(-1))
        )
        a = actions.reshape(len(params), -1)
        bounds = np.concatenate([[0], np.cumsum(nvec)])
        return sum(
            log_softmax(params[:, bounds[k] : bounds[k + 1]])[np.arange(len(a)), a[:, k]]
            for k in range(len(nvec))
        )
    if isinstance(act_space, gym.spaces.MultiBinary):
        a = actions.reshape(len(params), -1)
        log_sig = lambda v: -np.logaddexp(0.0, -v)  # noqa: E731
        return (a * log_sig(params) + (1 - a) * log_sig(-params)).sum(axis=1)
    raise AssertionError(act_space)


CASES = {
    "masked-dict": (*masked_spaces(), PolicyConfig(hidden_sizes=(2,), normalize_obs=True)),
    "multi-discrete-masked": (
        gym.spaces.Dict(
            [
                ("action_mask", gym.spaces.MultiBinary(5)),
                ("gear", gym.spaces.Discrete(3, start=1)),
                ("pos", gym.spaces.Box(-1.0, 1.0, (2, 2), np.float32)),
            ]
        ),
        gym.spaces.MultiDiscrete([2, 3]),
        PolicyConfig(hidden_sizes=(8, 4), activation="relu", normalize_obs=True),
    ),
    "tuple-multi-binary": (
        gym.spaces.Tuple(
            (gym.spaces.MultiDiscrete([3, 2], start=[1, 0]), gym.spaces.Box(0, 9, (2,), np.int16))
        ),
        gym.spaces.MultiBinary(3),
        PolicyConfig(hidden_sizes=(4,), shared_trunk=True),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_page_computes_what_the_network_computes(case):
    obs_space, act_space, cfg = CASES[case]
    cfg = cfg.validate()
    torch.manual_seed(0)
    policy = build_policy(obs_space, act_space, cfg)
    rng = np.random.default_rng(3)
    obs_space.seed(1)
    batch = [obs_space.sample() for _ in range(16)]

    def stack(values: list[Any], space: gym.Space) -> Any:
        if isinstance(space, gym.spaces.Dict):
            return {k: stack([v[k] for v in values], s) for k, s in space.spaces.items()}
        if isinstance(space, gym.spaces.Tuple):
            return tuple(stack([v[i] for v in values], s) for i, s in enumerate(space.spaces))
        return np.stack(values)

    obs = stack(batch, obs_space)
    masked = isinstance(obs_space, gym.spaces.Dict) and "action_mask" in obs_space.spaces
    if masked:
        obs["action_mask"][:, 0] = 1  # every component keeps an allowed action
        if isinstance(act_space, gym.spaces.MultiDiscrete):
            obs["action_mask"][:, 2] = 1
    with torch.no_grad():  # statistics that are not the identity
        for name, buffer in policy.named_buffers():
            if name.endswith("obs_mean"):
                buffer.copy_(torch.from_numpy(rng.normal(0, 0.5, buffer.shape)))
            elif name.endswith("obs_var"):
                buffer.copy_(torch.from_numpy(rng.uniform(0.5, 2.0, buffer.shape)))
    weights = {k: v.numpy() for k, v in policy.state_dict().items()}
    tensors = {
        "dict": lambda o: {k: torch.from_numpy(np.asarray(v)) for k, v in o.items()},
        "tuple": lambda o: tuple(torch.from_numpy(np.asarray(v)) for v in o),
    }
    as_torch = tensors["dict" if isinstance(obs, dict) else "tuple"](obs)
    with torch.no_grad():
        params, value = policy(as_torch)
        actions, log_prob, _ = policy.act(as_torch, torch.Generator().manual_seed(2))
    want_params, want_value = page_forward(obs_space, obs, weights, cfg)
    np.testing.assert_allclose(params.numpy(), want_params, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(value.numpy(), want_value, rtol=1e-5, atol=1e-5)
    mask = obs["action_mask"] if masked else None
    want = page_log_prob(act_space, want_params, actions.numpy(), mask)
    np.testing.assert_allclose(log_prob.numpy(), want, rtol=1e-5, atol=1e-5)
    if masked:  # sampled actions are allowed ones
        nvec = np.atleast_1d(getattr(act_space, "nvec", getattr(act_space, "n", None)))
        offsets = np.concatenate([[0], np.cumsum(nvec)[:-1]])
        chosen = actions.numpy().reshape(16, -1) + offsets
        assert (np.take_along_axis(mask, chosen, axis=1) != 0).all()


def test_the_pages_example_names_the_tensors_of_the_network():
    """Section 6.4's example: the vector fragment-masked's run, hidden_sizes [2] and
    normalize_obs, has exactly the tensors the page lists, with those shapes."""
    policy = build_policy(*masked_spaces(), PolicyConfig(hidden_sizes=(2,), normalize_obs=True))
    shapes = {k: list(v.shape) for k, v in policy.state_dict().items()}
    assert shapes == {
        "encoder.parts.1.obs_mean": [3],
        "encoder.parts.1.obs_var": [3],
        "encoder.parts.1.obs_count": [],
        "actor_trunk.0.weight": [2, 6],
        "actor_trunk.0.bias": [2],
        "critic_trunk.0.weight": [2, 6],
        "critic_trunk.0.bias": [2],
        "policy_head.weight": [3, 2],
        "policy_head.bias": [3],
        "value_head.weight": [1, 2],
        "value_head.bias": [1],
    }
