"""Closed-form gradients of the PPO loss for the MLP actor-critic (issue 28: gradient
steps that cost math, not overhead).

On a CPU, one 64-row minibatch step of the 64 x 64 :class:`~zmq_rl.rl.policy.ActorCritic`
costs about 1 ms through autograd, and most of it is not arithmetic: the autograd
engine walks ~40 graph nodes (a third of the step), and every one of ~150 small ops
pays the dispatcher. The loss of :func:`zmq_rl.rl.ppo.ppo_loss` on an MLP has short
derivatives, so :func:`ppo_gradients` computes the loss terms and every parameter's
gradient directly, in about sixty tensor ops and no graph:

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
networks, the decoupled and IMPACT objectives).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import nn

from zmq_rl.config import PPOConfig
from zmq_rl.rl.loss_terms import PPOLoss
from zmq_rl.rl.policy import ActorCritic

__all__ = ["AnalyticBatch", "analytic_support", "ppo_gradients"]

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_TANH_BACKWARD = torch.ops.aten.tanh_backward.default
_RELU_BACKWARD = torch.ops.aten.threshold_backward.default


class AnalyticBatch(NamedTuple):
    """One minibatch as :func:`ppo_gradients` takes it: observations ``[N, ...]``,
    actions (``[N]`` or ``[N, act_dim]``) and the batch's constants, ``[N]`` each
    (advantages already normalised when the config says so)."""

    obs: torch.Tensor
    actions: torch.Tensor
    old_log_prob: torch.Tensor
    old_value: torch.Tensor
    returns: torch.Tensor
    advantages: torch.Tensor


def analytic_support(policy: nn.Module, cfg: PPOConfig) -> str | None:
    """``None`` when :func:`ppo_gradients` computes this policy's PPO gradients, else
    the reason it does not (the trainer then uses autograd): only the plain
    :class:`ActorCritic` MLP (not a subclass, whose forward may differ), with every
    parameter trainable and of one dtype on one device, under the ``ppo`` objective
    qualifies."""
    if type(policy) is not ActorCritic:
        return f"{type(policy).__name__} is not the MLP ActorCritic"
    if cfg.objective != "ppo":
        return f"objective {cfg.objective!r} is not 'ppo'"
    kinds = {(p.dtype, p.device) for p in policy.parameters()}
    if len(kinds) != 1:
        return f"its parameters have {len(kinds)} dtypes/devices, not one"
    if not all(p.requires_grad for p in policy.parameters()):
        return "some of its parameters are frozen (requires_grad False)"
    return None


def _trunk_forward(trunk: nn.Sequential, x: torch.Tensor, relu: bool) -> list[torch.Tensor]:
    """The input and every layer's activation output of one trunk."""
    hs = [x]
    for layer in trunk:
        if isinstance(layer, nn.Linear):
            a = torch.addmm(layer.bias, hs[-1], layer.weight.t())
            hs.append(a.relu_() if relu else a.tanh_())
    return hs


class _Grads:
    """The gradients being set: into the caller's tensors (``out``, one per
    parameter: no allocation) or into new ones."""

    def __init__(self, out: dict[nn.Parameter, torch.Tensor] | None) -> None:
        self.out = out
        self.grads: dict[nn.Parameter, torch.Tensor] = {}

    def mm(self, param: nn.Parameter, a: torch.Tensor, b: torch.Tensor) -> None:
        """``param``'s gradient is ``a @ b``."""
        if self.out is None:
            self.grads[param] = a.mm(b)
        else:
            self.grads[param] = torch.mm(a, b, out=self.out[param])

    def sum(self, param: nn.Parameter, rows: torch.Tensor) -> None:
        """``param``'s gradient is the sum of ``rows`` over dim 0."""
        if self.out is None:
            self.grads[param] = rows.sum(0)
        else:
            self.grads[param] = torch.sum(rows, 0, out=self.out[param])

    def set(self, param: nn.Parameter, value: torch.Tensor) -> None:
        """``param``'s gradient is ``value``."""
        self.grads[param] = value if self.out is None else self.out[param].copy_(value)


def _trunk_backward(
    trunk: nn.Sequential, hs: list[torch.Tensor], dh: torch.Tensor, relu: bool, grads: _Grads
) -> None:
    """Backpropagate ``dh`` (the loss's gradient at the trunk's output) through the
    trunk whose forward gave ``hs``, setting each weight's and bias's gradient."""
    linears = [layer for layer in trunk if isinstance(layer, nn.Linear)]
    for k in range(len(linears) - 1, -1, -1):
        h = hs[k + 1]  # autograd's own kernels for dh * f'(a), one op each
        da = _RELU_BACKWARD(dh, h, 0) if relu else _TANH_BACKWARD(dh, h)
        grads.mm(linears[k].weight, da.t(), hs[k])
        grads.sum(linears[k].bias, da)
        if k > 0:
            dh = da.mm(linears[k].weight)


def _min_weight(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The share of ``min(a, b)``'s gradient that goes to ``a``: 1 where ``a < b``,
    1/2 on a tie, 0 where ``a > b`` (autograd's rule for ``torch.min(a, b)``)."""
    return (a < b).to(a.dtype) + 0.5 * (a == b).to(a.dtype)


def ppo_gradients(
    policy: ActorCritic,
    batch: AnalyticBatch,
    cfg: PPOConfig,
    clip_range: float,
    out: dict[nn.Parameter, torch.Tensor] | None = None,
) -> tuple[PPOLoss, dict[nn.Parameter, torch.Tensor]]:
    """The PPO loss of :func:`zmq_rl.rl.ppo.ppo_loss` on ``batch`` and the gradient of
    its total (eq. 9 negated: ``policy_loss - ent_coef * H + vf_coef * value_loss``)
    with respect to every parameter of ``policy``, computed in closed form (see the
    module docstring); ``clip_range`` clips the ratio and, with ``clip_value_loss``,
    the value. Returns the detached loss terms and a gradient per parameter, written
    into ``out``'s tensor of that parameter when ``out`` is given (the trainer's flat
    gradient buffer)."""
    with torch.no_grad():
        grads = _Grads(out)
        return _ppo_gradients(policy, batch, cfg, clip_range, grads), grads.grads


def _ppo_gradients(
    policy: ActorCritic, batch: AnalyticBatch, cfg: PPOConfig, clip_range: float, grads: _Grads
) -> PPOLoss:
    relu = policy.activation_name == "relu"
    x = policy.flat_obs(batch.obs)
    n = x.shape[0]
    if policy.shared_trunk:
        pi_hs = v_hs = _trunk_forward(policy.trunk, x, relu)
    else:
        pi_hs = _trunk_forward(policy.actor_trunk, x, relu)
        v_hs = _trunk_forward(policy.critic_trunk, x, relu)
    head, v_head = policy.policy_head, policy.value_head
    params = torch.addmm(head.bias, pi_hs[-1], head.weight.t())
    value = torch.addmm(v_head.bias, v_hs[-1], v_head.weight.t()).squeeze(-1)

    # Log-probability and entropy of the head's distribution.
    if policy.discrete:
        log_p = torch.log_softmax(params, dim=-1)
        p = log_p.exp()
        index = batch.actions.reshape(-1, 1).long()
        log_prob = log_p.gather(-1, index).squeeze(-1)
        entropy = -(p * log_p).sum(-1)
    else:
        log_std = policy.log_std
        inv_std = torch.exp(-log_std)
        z = (batch.actions.reshape(params.shape).to(params.dtype) - params) * inv_std
        log_prob = (-0.5 * z.square() - log_std - _LOG_SQRT_2PI).sum(-1)
        entropy = (0.5 + _LOG_SQRT_2PI + log_std).sum(-1).expand(n)

    # The clipped surrogate (PPO eq. 7) and d(policy_loss)/d(log_prob).
    log_ratio = log_prob - batch.old_log_prob
    ratio = log_ratio.exp()
    adv = batch.advantages
    surrogate = ratio * adv
    clipped = ratio.clamp(1.0 - clip_range, 1.0 + clip_range) * adv
    smaller = torch.min(surrogate, clipped)
    to_surrogate = _min_weight(surrogate, clipped)
    in_range = (ratio >= 1.0 - clip_range) & (ratio <= 1.0 + clip_range)
    d_ratio = adv * (to_surrogate + (1.0 - to_surrogate) * in_range)
    g_log_prob = d_ratio.mul_(ratio).mul_(-1.0 / n)

    # The head's gradient: the surrogate through log_prob, the entropy bonus directly.
    if policy.discrete:
        g_params = -p * g_log_prob.unsqueeze(-1)
        g_params.scatter_add_(-1, index, g_log_prob.unsqueeze(-1))
        if cfg.ent_coef:
            g_params += (cfg.ent_coef / n) * p * (log_p + entropy.unsqueeze(-1))
    else:
        g_params = g_log_prob.unsqueeze(-1) * z * inv_std
        g_log_std = (g_log_prob.unsqueeze(-1) * (z.square() - 1.0)).sum(0) - cfg.ent_coef
        grads.set(policy.log_std, g_log_std)

    # The value loss and d(total)/d(value) (the max of OpenAI baselines' clipped variant).
    error = value - batch.returns
    squared = error.square()
    g_value = error
    if cfg.clip_value_loss:
        delta = value - batch.old_value
        error_clipped = batch.old_value + delta.clamp(-clip_range, clip_range) - batch.returns
        squared_clipped = error_clipped.square()
        to_plain = _min_weight(squared_clipped, squared)  # max(a, b)'s share of a
        in_value_range = (delta >= -clip_range) & (delta <= clip_range)
        g_value = to_plain * error + (1.0 - to_plain) * error_clipped * in_value_range
        squared = torch.max(squared, squared_clipped)
    g_value = g_value * (cfg.vf_coef / n)

    # Heads, then trunks.
    grads.mm(head.weight, g_params.t(), pi_hs[-1])
    grads.sum(head.bias, g_params)
    grads.mm(v_head.weight, g_value.unsqueeze(0), v_hs[-1])
    grads.sum(v_head.bias, g_value.unsqueeze(-1))
    dh_pi = g_params.mm(head.weight)
    dh_v = g_value.unsqueeze(-1) * v_head.weight
    if policy.shared_trunk:
        _trunk_backward(policy.trunk, pi_hs, dh_pi + dh_v, relu, grads)
    else:
        _trunk_backward(policy.actor_trunk, pi_hs, dh_pi, relu, grads)
        _trunk_backward(policy.critic_trunk, v_hs, dh_v, relu, grads)

    # The five terms' means at once: [-min, squared / 2, H, k3, clipped] / n.
    ratio_m1 = ratio - 1.0
    rows = torch.stack(
        [
            smaller, squared, entropy, ratio_m1 - log_ratio,
            (ratio_m1.abs() > clip_range).to(ratio.dtype),
        ]
    )  # fmt: skip
    weights = torch.tensor([-1.0, 0.5, 1.0, 1.0, 1.0], dtype=ratio.dtype, device=ratio.device)
    terms = rows.sum(1).mul_(weights.div_(n))
    policy_loss, value_loss, entropy_mean, approx_kl, clip_fraction = terms.unbind()
    total = policy_loss - cfg.ent_coef * entropy_mean + cfg.vf_coef * value_loss
    return PPOLoss(total, policy_loss, value_loss, entropy_mean, approx_kl, clip_fraction)
