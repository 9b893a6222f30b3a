"""The plain MLP actor-critic on an actor, in numpy alone: no torch in the process.

An actor of the built-in MLP (:class:`~zmq_rl.rl.policy.ActorCritic`, what
:func:`~zmq_rl.rl.policy.build_policy` builds for a flat float ``Box`` observation
and a ``Discrete`` or 1-D ``Box`` action) samples its actions in numpy already
(:mod:`zmq_rl.rl.numpy_act`); it imported torch only to build the network and hold
its parameters, and importing torch is a large share of an actor's start-up CPU and
memory (docs/benchmarks.md §23, "Actors and the evaluator without torch"). This
module knows the network from its config alone:

* :func:`mlp_dims` says whether ``build_policy`` builds the plain MLP for a run's
  spaces and config (``build_policy`` asks it too, so the two cannot disagree);
* :func:`mlp_layout` lists the ``state_dict`` that network has (names, shapes,
  dtypes, in order), so broadcast weights are checked against it exactly as
  against the module (:func:`~zmq_rl.rl.weights.check_arrays`);
* :class:`NumpyMLP` holds the weights as arrays and samples actions with
  :func:`sample_mlp`, the same computation :class:`~zmq_rl.rl.numpy_act.NumpySampler`
  runs on a torch module's memory: the same weights and seed give the same actions,
  log-probabilities and values, bit for bit (``tests/test_numpy_mlp.py``);
* :func:`mlp_forward` is the network's one numpy forward pass (:func:`trunk_forward`
  per trunk, then the heads): the actors sample from it, the learner's closed-form
  gradients (:mod:`zmq_rl.rl.analytic`) backpropagate through the activations it
  keeps, and evaluations take the mode from the actor trunk's output
  (:func:`mode_mlp`).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from zmq_rl.config import PolicyConfig
from zmq_rl.rl.weights import ArrayWeights, Layout

__all__ = [
    "OBS_CLIP",
    "OBS_NORM_EPS",
    "MLPArrays",
    "NumpyMLP",
    "mlp_dims",
    "mlp_forward",
    "mlp_layout",
    "mode_mlp",
    "sample_mlp",
    "trunk_forward",
]

OBS_NORM_EPS = 1e-8
OBS_CLIP = 10.0
"""Normalised observations are clipped to [-OBS_CLIP, OBS_CLIP] (as SB3's VecNormalize)."""

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_TINY = {np.dtype(t): np.finfo(t).tiny for t in (np.float32, np.float64)}
"""The smallest normal float of each parameter dtype (looked up once, not per step)."""

Layer = tuple[np.ndarray, np.ndarray]
"""A linear layer's ``(weight [out, in], bias [out])``."""


class MLPArrays(NamedTuple):
    """An :class:`ActorCritic`'s parameters (or their gradients) as numpy arrays in its
    layers' order: the actor's trunk (the one trunk when shared), the critic's trunk
    (empty when shared), the policy head, the value head, and ``log_std`` (None for a
    categorical head)."""

    actor: tuple[Layer, ...]
    critic: tuple[Layer, ...]
    head: Layer
    value: Layer
    log_std: np.ndarray | None


class MLPDims(NamedTuple):
    """The plain MLP's sizes: flattened observation length, number of actions
    (``Discrete``) or action dimensions (``Box``), and which of the two it is."""

    obs_dim: int
    action_dim: int
    discrete: bool


def mlp_dims(observation_space: Any, action_space: Any, cfg: PolicyConfig) -> MLPDims | None:
    """The plain MLP's sizes when :func:`~zmq_rl.rl.policy.build_policy` builds
    :class:`~zmq_rl.rl.policy.ActorCritic` for these spaces and ``cfg`` (no factory,
    ``policy_type`` mlp, a float ``Box`` observation, a ``Discrete`` action from 0 or
    a 1-D ``Box`` action); None when it builds another network."""
    from gymnasium import spaces

    if cfg.factory or cfg.policy_type != "mlp":
        return None
    if not (
        isinstance(observation_space, spaces.Box)
        and np.issubdtype(observation_space.dtype, np.floating)
    ):
        return None
    obs_dim = int(np.prod(observation_space.shape, dtype=np.int64))
    if isinstance(action_space, spaces.Discrete) and int(action_space.start) == 0:
        return MLPDims(obs_dim, int(action_space.n), True)
    if isinstance(action_space, spaces.Box) and len(action_space.shape) == 1:
        return MLPDims(obs_dim, int(action_space.shape[0]), False)
    return None


def mlp_layout(dims: MLPDims, cfg: PolicyConfig) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """The ``state_dict`` of the :class:`~zmq_rl.rl.policy.ActorCritic` built with
    ``dims`` and ``cfg``: each tensor's name, shape and dtype, in the module's order
    (its own ``log_std`` and observation-statistics buffers, then the trunks' linear
    layers at every other index of their ``Sequential``, then the heads)."""
    f32, f64 = np.dtype(np.float32), np.dtype(np.float64)
    layout: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    if not dims.discrete:
        layout["log_std"] = ((dims.action_dim,), f32)
    if cfg.normalize_obs:
        layout["obs_mean"] = ((dims.obs_dim,), f64)
        layout["obs_var"] = ((dims.obs_dim,), f64)
        layout["obs_count"] = ((), f64)
    trunks = ("trunk",) if cfg.shared_trunk else ("actor_trunk", "critic_trunk")
    for trunk in trunks:
        width = dims.obs_dim
        for i, hidden in enumerate(cfg.hidden_sizes):
            layout[f"{trunk}.{2 * i}.weight"] = ((hidden, width), f32)
            layout[f"{trunk}.{2 * i}.bias"] = ((hidden,), f32)
            width = hidden
    width = cfg.hidden_sizes[-1]
    layout["policy_head.weight"] = ((dims.action_dim, width), f32)
    layout["policy_head.bias"] = ((dims.action_dim,), f32)
    layout["value_head.weight"] = ((1, width), f32)
    layout["value_head.bias"] = ((1,), f32)
    return layout


def trunk_forward(layers: tuple[Layer, ...], x: np.ndarray, relu: bool) -> list[np.ndarray]:
    """The input ``x`` and every layer's output ``h_k = f(h_{k-1} W_k^T + b_k)`` of one
    trunk, ``f`` tanh or ReLU (:func:`~zmq_rl.rl.layers.trunk`'s ``Linear`` and
    activation pairs); its last entry is the trunk's output."""
    hs = [x]
    for weight, bias in layers:
        x = x @ weight.T
        x += bias
        x = np.maximum(x, 0.0, out=x) if relu else np.tanh(x, out=x)
        hs.append(x)
    return hs


def _policy_head(a: MLPArrays, h: np.ndarray) -> np.ndarray:
    weight, bias = a.head
    params = h @ weight.T
    params += bias
    return params


def mlp_forward(
    a: MLPArrays, x: np.ndarray, relu: bool
) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray, np.ndarray]:
    """:meth:`ActorCritic.forward` in numpy on the trunks' input ``x`` (:func:`flat_obs`
    or, on the learner, :meth:`ActorCritic.flat_obs`), keeping every activation: the
    actor trunk's :func:`trunk_forward` list, the critic trunk's (the same list when
    the trunk is shared), the policy head's output ``[B, n]`` (the logits, or the
    Gaussian's mean) and the values ``[B]``. A plain tuple, not a named one: every
    step of an actor builds one."""
    actor = trunk_forward(a.actor, x, relu)
    critic = trunk_forward(a.critic, x, relu) if a.critic else actor
    value = critic[-1] @ a.value[0][0]
    value += a.value[1][0]
    return actor, critic, _policy_head(a, actor[-1]), value


def flat_obs(
    obs: Any,
    obs_dim: int,
    dtype: np.dtype,
    norm: tuple[np.ndarray, np.ndarray] | None,
) -> np.ndarray:
    """:meth:`ActorCritic.flat_obs` in numpy: ``[B, *obs_shape]`` -> ``[B, obs_dim]`` in
    ``dtype``, normalised by ``norm`` = ``(mean, var)`` and clipped to ``OBS_CLIP``."""
    flat = np.asarray(obs).reshape(len(obs), -1)
    if flat.shape[1] != obs_dim:
        raise ValueError(
            f"observation batch of shape {np.shape(obs)} does not flatten to [B, {obs_dim}]"
        )
    flat = flat.astype(dtype, copy=False)
    if norm is not None:
        mean, var = norm
        std = np.sqrt(var + OBS_NORM_EPS).astype(dtype)
        flat = np.maximum((flat - mean.astype(dtype)) / std, -OBS_CLIP)
        flat = np.minimum(flat, OBS_CLIP, out=flat)  # np.clip's math, without its wrapper
    return flat


def sample_mlp(
    a: MLPArrays, x: np.ndarray, relu: bool, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:meth:`ActorCritic.act` (sampling, not the mode) in numpy on the trunks' input
    ``x`` (:func:`flat_obs`): actions (int64 ``[B]`` or the unclipped Gaussian sample
    ``[B, d]``), their log-probabilities and the values, ``[B]`` each.

    * categorical head: Gumbel-max, ``argmax(z - log E)`` with ``E ~ Exp(1)`` is an
      exact sample of ``softmax(z)`` (Gumbel 1954; Maddison et al. 2014), and
      ``log pi(a) = z_a - logsumexp(z)``;
    * Gaussian head: ``a = mu + sigma * eps``, ``log pi(a) = -|eps|^2 / 2 - sum log
      sigma - d log sqrt(2 pi)``.
    """
    dtype = a.head[0].dtype
    _, _, params, value = mlp_forward(a, x, relu)
    if a.log_std is None:
        z = np.subtract(params, np.maximum.reduce(params, axis=1, keepdims=True), out=params)
        # Gumbel-max: argmax(z - log E), E ~ Exp(1). A float32 draw of exactly 0
        # (about one in 2^24) is raised to the smallest normal float, so its action
        # still wins and numpy warns of no log(0) in the actor's log.
        gumbel = rng.standard_exponential(z.shape, dtype=dtype)
        np.maximum(gumbel, _TINY[dtype], out=gumbel)
        np.log(gumbel, out=gumbel)
        action = np.subtract(z, gumbel, out=gumbel).argmax(axis=1)
        rows = np.arange(len(action))
        log_prob = z[rows, action] - np.log(np.add.reduce(np.exp(z), axis=1))
        return action.astype(np.int64, copy=False), log_prob, value
    noise = rng.standard_normal(params.shape, dtype=dtype)
    action = params + np.exp(a.log_std) * noise
    log_norm = np.add.reduce(a.log_std) + _LOG_SQRT_2PI * params.shape[1]
    log_prob = (-0.5 * np.add.reduce(np.square(noise), axis=1) - log_norm).astype(dtype)
    return action, log_prob, value


def mode_mlp(a: MLPArrays, x: np.ndarray, relu: bool) -> np.ndarray:
    """:meth:`ActorCritic.act` with ``deterministic`` in numpy on the trunks' input
    ``x``: the mode of the policy, the argmax of the logits (int64 ``[B]``) or the
    Gaussian mean (``[B, d]``). What deterministic evaluations play."""
    params = _policy_head(a, trunk_forward(a.actor, x, relu)[-1])
    return params.argmax(axis=1).astype(np.int64) if a.log_std is None else params


def rng_of(seed: int) -> np.random.Generator:
    """The sampling stream of an actor seeded ``seed`` (numpy's, not torch's)."""
    return np.random.default_rng(int(seed) & 0xFFFF_FFFF_FFFF_FFFF)


class NumpyMLP(ArrayWeights):
    """The plain MLP of ``dims`` and ``cfg`` (:func:`mlp_layout`) as numpy arrays, acting
    as :meth:`ActorCritic.act` samples, with its own random stream ``rng``.

    :meth:`load` takes broadcast weights (``(name, array)`` pairs) after checking them
    against the layout, all or nothing; :meth:`named_arrays` gives them back in
    ``state_dict`` order (to build the torch module from them when a caller wants
    one: :attr:`zmq_rl.actor.agent.PolicyRunner.policy`), and :meth:`bind` adopts a
    torch module's tensors as numpy views, so that the module holds the weights. The
    interface is :class:`~zmq_rl.rl.numpy_nets.NumpyNetwork`'s (feed-forward, no mask)."""

    state_size = 0
    mask_key = None

    def __init__(self, dims: MLPDims, cfg: PolicyConfig, rng: np.random.Generator) -> None:
        self.dims, self.cfg, self.rng = dims, cfg, rng
        self.layout: Layout = mlp_layout(dims, cfg)
        self.relu = cfg.activation == "relu"
        self._zeros()

    def initial_state(self, batch: int) -> np.ndarray:
        """``[batch, 0]``: the plain MLP carries no state."""
        return np.zeros((batch, 0), np.float32)

    def _held(self) -> None:
        """The arrays as :class:`MLPArrays` and the normalisation statistics."""
        w = self.w
        depth = len(self.cfg.hidden_sizes)

        def layers(trunk: str) -> tuple[Layer, ...]:
            return tuple(
                (w[f"{trunk}.{2 * i}.weight"], w[f"{trunk}.{2 * i}.bias"]) for i in range(depth)
            )

        shared = self.cfg.shared_trunk
        self.arrays = MLPArrays(
            layers("trunk" if shared else "actor_trunk"),
            () if shared else layers("critic_trunk"),
            (w["policy_head.weight"], w["policy_head.bias"]),
            (w["value_head.weight"], w["value_head.bias"]),
            None if self.dims.discrete else w["log_std"],
        )
        self.norm = (w["obs_mean"], w["obs_var"]) if self.cfg.normalize_obs else None

    def act(self, obs: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sampled actions, log-probabilities and values for a batch of observations
        (:func:`sample_mlp`)."""
        return sample_mlp(self.arrays, self._flat(obs), self.relu, self.rng)

    def mode(self, obs: Any) -> np.ndarray:
        """The policy's mode for a batch of observations (:func:`mode_mlp`)."""
        return mode_mlp(self.arrays, self._flat(obs), self.relu)

    def forward(self, obs: Any) -> tuple[np.ndarray, np.ndarray]:
        """(the policy head's output ``[B, n]``, values ``[B]``) (:func:`mlp_forward`)."""
        _, _, params, value = mlp_forward(self.arrays, self._flat(obs), self.relu)
        return params, value

    def _flat(self, obs: Any) -> np.ndarray:
        return flat_obs(obs, self.dims.obs_dim, self.arrays.head[0].dtype, self.norm)
