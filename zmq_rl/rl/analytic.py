"""Closed-form gradients of the PPO loss for the MLP actor-critic, in numpy (issue 28:
gradient steps that cost math, not overhead).

On a CPU, one 64-row minibatch step of the 64 x 64 :class:`~zmq_rl.rl.policy.ActorCritic`
costs about 1 ms through autograd, and most of it is not arithmetic: the autograd
engine walks ~40 graph nodes, and every one of ~150 small torch ops pays the
dispatcher (3-8 us each, for matrices of 64 x 64). The loss of
:func:`zmq_rl.rl.ppo.ppo_loss` on an MLP has short derivatives, so
:func:`mlp_gradients` computes the loss terms and every parameter's gradient directly,
in about sixty numpy operations on the parameters' own memory (numpy views of the
CPU tensors: no copy), each of which costs about a microsecond at these sizes:

* trunk ``h_k = f(W_k h_{k-1} + b_k)``: ``dW_k = da_k^T h_{k-1}``, ``db_k = sum da_k``,
  ``dh_{k-1} = da_k W_k`` with ``da_k = dh_k * f'``, ``tanh' = 1 - h^2``,
  ``relu' = [h > 0]`` (backpropagation, Rumelhart et al. 1986);
* categorical head: ``d log pi(a) / dz = onehot(a) - p`` and
  ``dH / dz = -p (log p + H)`` for the entropy ``H = -sum p log p``;
* Gaussian head (``z = (a - mu) / sigma``): ``d log pi / d mu = z / sigma``,
  ``d log pi / d log sigma = z^2 - 1``, ``dH / d log sigma = 1``;
* the clipped surrogate (PPO eq. 7) and the (clipped) value loss, with the
  sub-gradients autograd uses at the kinks: ``clamp`` passes the gradient on its
  closed interval, and an elementwise ``min``/``max`` tie splits it in halves.

The result equals autograd's to float rounding (``tests/test_analytic.py`` compares
every parameter's gradient and every loss term across heads, trunks, activations and
value clipping, and ``tests/test_ppo.py`` the whole update against its golden
figures). :func:`analytic_support` says which policies and objectives qualify; the
trainer falls back to autograd for everything else (recurrent and structured
networks, the decoupled and IMPACT objectives, parameters on a GPU, where the steps
are CUDA graphs). :mod:`zmq_rl.rl.closed_form` runs the trainer's steps with it.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from zmq_rl.config import PPOConfig
from zmq_rl.rl.loss_terms import PPOLoss
from zmq_rl.rl.numpy_mlp import Layer, MLPArrays
from zmq_rl.rl.policy import ActorCritic

__all__ = [
    "AnalyticBatch",
    "MLPArrays",
    "analytic_support",
    "batch_arrays",
    "loss_of_sums",
    "mlp_arrays",
    "mlp_support",
    "mlp_gradients",
    "normalised_obs",
    "ppo_gradients",
]

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


class AnalyticBatch(NamedTuple):
    """One minibatch as :func:`ppo_gradients` takes it: observations ``[N, ...]``,
    actions (``[N]`` or ``[N, act_dim]``) and the batch's constants, ``[N]`` each
    (advantages already normalised when the config says so); tensors or, for
    :func:`mlp_gradients`, numpy arrays (observations then already flat and
    normalised, :func:`normalised_obs`)."""

    obs: torch.Tensor
    actions: torch.Tensor
    old_log_prob: torch.Tensor
    old_value: torch.Tensor
    returns: torch.Tensor
    advantages: torch.Tensor


def mlp_support(policy: nn.Module) -> str | None:
    """``None`` when ``policy`` is the plain :class:`ActorCritic` MLP (not a subclass,
    whose forward may differ) with its parameters on the CPU in one float32 or float64
    dtype, the network numpy computes directly; else the reason it is not."""
    if type(policy) is not ActorCritic:
        return f"{type(policy).__name__} is not the MLP ActorCritic"
    kinds = {(p.dtype, p.device.type) for p in policy.parameters()}
    if len(kinds) != 1:
        return f"its parameters have {len(kinds)} dtypes/devices, not one"
    dtype, device = kinds.pop()
    if device != "cpu":
        return f"its parameters are on {device}, not the CPU (numpy computes it)"
    if dtype not in (torch.float32, torch.float64):
        return f"its parameters are {dtype}, not float32 or float64"
    return None


def analytic_support(policy: nn.Module, cfg: PPOConfig) -> str | None:
    """``None`` when :func:`mlp_gradients` computes this policy's PPO gradients, else
    the reason it does not (the trainer then uses autograd): the plain MLP of
    :func:`mlp_support`, with every parameter trainable, under the ``ppo`` objective."""
    if (reason := mlp_support(policy)) is not None:
        return reason
    if cfg.objective != "ppo":
        return f"objective {cfg.objective!r} is not 'ppo'"
    if not all(p.requires_grad for p in policy.parameters()):
        return "some of its parameters are frozen (requires_grad False)"
    return None


def _linears(trunk: nn.Sequential) -> list[nn.Linear]:
    return [layer for layer in trunk if isinstance(layer, nn.Linear)]


def mlp_arrays(
    policy: ActorCritic, of: dict[nn.Parameter, torch.Tensor] | None = None
) -> MLPArrays:
    """Numpy views (no copies) of ``policy``'s parameters, or, with ``of``, of the
    tensors ``of`` holds for them (e.g. their gradients), as :class:`MLPArrays`."""

    def view(param: nn.Parameter) -> np.ndarray:
        return (param if of is None else of[param]).detach().numpy()

    def layers(trunk: nn.Sequential) -> tuple[Layer, ...]:
        return tuple((view(lin.weight), view(lin.bias)) for lin in _linears(trunk))

    head, value = policy.policy_head, policy.value_head
    return MLPArrays(
        layers(policy.trunk if policy.shared_trunk else policy.actor_trunk),
        () if policy.shared_trunk else layers(policy.critic_trunk),
        (view(head.weight), view(head.bias)),
        (view(value.weight), view(value.bias)),
        None if policy.discrete else view(policy.log_std),
    )


def normalised_obs(policy: ActorCritic, obs: torch.Tensor) -> np.ndarray:
    """The trunks' input as a numpy array ``[N, obs_dim]`` in the parameters' dtype:
    :meth:`ActorCritic.flat_obs` (normalised and clipped with ``normalize_obs``)."""
    with torch.no_grad():
        return np.ascontiguousarray(policy.flat_obs(obs).numpy())


def _trunk_forward(layers: tuple[Layer, ...], x: np.ndarray, relu: bool) -> list[np.ndarray]:
    """The input and every layer's activation output of one trunk."""
    hs = [x]
    for weight, bias in layers:
        a = hs[-1] @ weight.T
        a += bias
        hs.append(np.maximum(a, 0.0, out=a) if relu else np.tanh(a, out=a))
    return hs


def _trunk_backward(
    layers: tuple[Layer, ...],
    grads: tuple[Layer, ...],
    hs: list[np.ndarray],
    dh: np.ndarray,
    relu: bool,
) -> None:
    """Backpropagate ``dh`` (the loss's gradient at the trunk's output) through the
    trunk whose forward gave ``hs``, writing each weight's and bias's gradient."""
    for k in range(len(layers) - 1, -1, -1):
        h = hs[k + 1]
        da = dh * (h > 0.0) if relu else dh * (1.0 - h * h)
        np.matmul(da.T, hs[k], out=grads[k][0])
        np.add.reduce(da, axis=0, out=grads[k][1])
        if k > 0:
            dh = da @ layers[k][0]


def _min_weight(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The share of ``min(a, b)``'s gradient that goes to ``a``: 1 where ``a < b``,
    1/2 on a tie, 0 where ``a > b`` (autograd's rule for ``torch.min(a, b)``)."""
    weight = (a < b).astype(a.dtype)
    weight += 0.5 * (a == b)
    return weight


def mlp_gradients(
    net: MLPArrays,
    grads: MLPArrays,
    batch: AnalyticBatch,
    cfg: PPOConfig,
    clip_range: float,
    relu: bool,
) -> np.ndarray:
    """The gradient of the PPO loss's total (eq. 9 negated: ``policy_loss - ent_coef *
    H + vf_coef * value_loss``, as :func:`zmq_rl.rl.ppo.ppo_loss`) on ``batch``, with
    respect to every parameter of ``net``, written into ``grads`` (arrays of the same
    shapes); the head is categorical when ``net.log_std`` is None, else Gaussian.
    ``batch`` holds numpy arrays, its observations flat and normalised
    (:func:`normalised_obs`). Returns the sums over the rows of ``[-min(surrogates),
    squared error / 2, entropy, k3, clipped]`` (float64; the loss terms are these over
    ``N``): a pure function of its arguments but for the writes into ``grads``."""
    x = batch.obs
    n = x.shape[0]
    dtype = x.dtype.type
    pi_hs = _trunk_forward(net.actor, x, relu)
    v_hs = _trunk_forward(net.critic, x, relu) if net.critic else pi_hs
    head_w, head_b = net.head
    value_w, value_b = net.value
    params = pi_hs[-1] @ head_w.T
    params += head_b
    value = (v_hs[-1] @ value_w[0]) + value_b[0]

    # Log-probability and entropy of the head's distribution.
    rows = np.arange(n)
    if net.log_std is None:
        shifted = params - params.max(axis=1, keepdims=True)
        exp = np.exp(shifted)
        total_exp = exp.sum(axis=1, keepdims=True)
        log_p = shifted - np.log(total_exp)
        p = exp / total_exp
        index = batch.actions.reshape(-1).astype(np.intp, copy=False)
        log_prob = log_p[rows, index]
        entropy = -(p * log_p).sum(axis=1)
    else:
        log_std = net.log_std
        inv_std = np.exp(-log_std)
        z = (batch.actions.reshape(params.shape) - params) * inv_std
        log_prob = (-0.5 * z * z - log_std - dtype(_LOG_SQRT_2PI)).sum(axis=1)
        entropy = np.full(n, (0.5 + _LOG_SQRT_2PI + log_std).sum(), dtype=x.dtype)

    # The clipped surrogate (PPO eq. 7) and d(policy_loss)/d(log_prob).
    log_ratio = log_prob - batch.old_log_prob
    ratio = np.exp(log_ratio)
    adv = batch.advantages
    low, high = dtype(1.0 - clip_range), dtype(1.0 + clip_range)
    surrogate = ratio * adv
    clipped = np.clip(ratio, low, high) * adv
    smaller = np.minimum(surrogate, clipped)
    to_surrogate = _min_weight(surrogate, clipped)
    in_range = (ratio >= low) & (ratio <= high)
    g_log_prob = adv * (to_surrogate + (1.0 - to_surrogate) * in_range)
    g_log_prob *= ratio
    g_log_prob *= dtype(-1.0 / n)

    # The head's gradient: the surrogate through log_prob, the entropy bonus directly.
    if net.log_std is None:
        g_params = p * -g_log_prob[:, None]
        g_params[rows, index] += g_log_prob
        if cfg.ent_coef:
            g_params += dtype(cfg.ent_coef / n) * p * (log_p + entropy[:, None])
    else:
        g_params = g_log_prob[:, None] * z * inv_std
        g_log_std = (g_log_prob[:, None] * (z * z - 1.0)).sum(axis=0) - dtype(cfg.ent_coef)
        assert grads.log_std is not None
        grads.log_std[...] = g_log_std

    # The value loss and d(total)/d(value) (the max of OpenAI baselines' clipped variant).
    error = value - batch.returns
    squared = error * error
    g_value = error
    if cfg.clip_value_loss:
        clip = dtype(clip_range)
        delta = value - batch.old_value
        error_clipped = batch.old_value + np.clip(delta, -clip, clip) - batch.returns
        squared_clipped = error_clipped * error_clipped
        to_plain = _min_weight(squared_clipped, squared)  # max(a, b)'s share of a
        in_value_range = (delta >= -clip) & (delta <= clip)
        g_value = to_plain * error + (1.0 - to_plain) * error_clipped * in_value_range
        squared = np.maximum(squared, squared_clipped)
    g_value = g_value * dtype(cfg.vf_coef / n)

    # Heads, then trunks.
    np.matmul(g_params.T, pi_hs[-1], out=grads.head[0])
    np.add.reduce(g_params, axis=0, out=grads.head[1])
    np.matmul(g_value, v_hs[-1], out=grads.value[0][0])
    grads.value[1][0] = g_value.sum()
    dh_pi = g_params @ head_w
    dh_v = g_value[:, None] * value_w[0]
    if net.critic:
        _trunk_backward(net.actor, grads.actor, pi_hs, dh_pi, relu)
        _trunk_backward(net.critic, grads.critic, v_hs, dh_v, relu)
    else:
        _trunk_backward(net.actor, grads.actor, pi_hs, dh_pi + dh_v, relu)

    ratio_m1 = ratio - 1.0
    return np.array(
        [
            -smaller.sum(dtype=np.float64),
            0.5 * squared.sum(dtype=np.float64),
            entropy.sum(dtype=np.float64),
            (ratio_m1 - log_ratio).sum(dtype=np.float64),
            np.count_nonzero(np.abs(ratio_m1) > clip_range),
        ]
    )


def loss_of_sums(sums: np.ndarray, n: int, cfg: PPOConfig, dtype: torch.dtype) -> PPOLoss:
    """The minibatch's :class:`PPOLoss` (scalar tensors of ``dtype``) from
    :func:`mlp_gradients`' row sums over its ``n`` rows."""
    policy_loss, value_loss, entropy, approx_kl, clip_fraction = (float(s) / n for s in sums)
    total = policy_loss - cfg.ent_coef * entropy + cfg.vf_coef * value_loss
    terms = (total, policy_loss, value_loss, entropy, approx_kl, clip_fraction)
    return PPOLoss(*(torch.tensor(t, dtype=dtype) for t in terms))


def batch_arrays(policy: ActorCritic, batch: AnalyticBatch) -> AnalyticBatch:
    """``batch`` (CPU tensors) as :func:`mlp_gradients` takes it: numpy arrays in the
    parameters' dtype (a categorical head's actions stay integers), the observations
    flat and normalised (:func:`normalised_obs`)."""
    dtype = policy.value_head.weight.dtype

    def array(t: torch.Tensor) -> np.ndarray:
        return t.detach().to(dtype).numpy()

    actions = batch.actions.detach().numpy() if policy.discrete else array(batch.actions)
    return AnalyticBatch(
        normalised_obs(policy, batch.obs), actions, array(batch.old_log_prob),
        array(batch.old_value), array(batch.returns), array(batch.advantages),
    )  # fmt: skip


def ppo_gradients(
    policy: ActorCritic,
    batch: AnalyticBatch,
    cfg: PPOConfig,
    clip_range: float,
    out: dict[nn.Parameter, torch.Tensor] | None = None,
) -> tuple[PPOLoss, dict[nn.Parameter, torch.Tensor]]:
    """The PPO loss of :func:`zmq_rl.rl.ppo.ppo_loss` on ``batch`` (tensors) and the
    gradient of its total with respect to every parameter of ``policy``, computed in
    closed form by :func:`mlp_gradients`; ``clip_range`` clips the ratio and, with
    ``clip_value_loss``, the value. Returns the loss terms and a gradient per
    parameter, written into ``out``'s tensor of that parameter when ``out`` is given
    (contiguous CPU tensors, e.g. the trainer's flat gradient buffer)."""
    if out is None:
        out = {p: torch.zeros_like(p) for p in policy.parameters()}
    dtype = policy.value_head.weight.dtype
    arrays = batch_arrays(policy, batch)
    relu = policy.activation_name == "relu"
    with np.errstate(all="ignore"):  # overflow makes the norm non-finite: the step is skipped
        sums = mlp_gradients(
            mlp_arrays(policy), mlp_arrays(policy, out), arrays, cfg, clip_range, relu
        )
    return loss_of_sums(sums, len(arrays.obs), cfg, dtype), dict(out)
