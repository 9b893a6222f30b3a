"""Closed-form gradients of the PPO loss for the MLP actor-critic, in numpy (issue 28:
gradient steps that cost math, not overhead).

On a CPU, a minibatch step of the small :class:`~zmq_rl.rl.policy.ActorCritic` through
autograd is mostly not arithmetic: the autograd engine walks its graph and each of
many small torch ops pays the dispatcher, for matrices of 64 x 64. The loss of
:func:`zmq_rl.rl.ppo.ppo_loss` on an MLP has short derivatives, so
:func:`mlp_gradients` computes the loss terms and every parameter's gradient directly,
in a few dozen numpy operations on the parameters' own memory (numpy views of the CPU
tensors: no copy); docs/benchmarks.md §23 has the costs. One function per term of
PPO's objective (Schulman et al. 2017, arXiv:1707.06347, eq. 9:
``L^{CLIP+VF+S} = L^CLIP - c1 L^VF + c2 S``, whose negation is the loss minimised):

* :func:`clipped_surrogate`: ``L^CLIP`` (eq. 7) and its derivative with respect to
  ``log pi(a|s)``, with the sub-gradients autograd uses at the kinks: ``clamp``
  passes the gradient on its closed interval, an elementwise ``min``/``max`` tie
  splits it in halves;
* :func:`value_loss`: ``L^VF``, the squared error of eq. 9 halved, or OpenAI
  baselines' clipped variant (the ``max`` with the error of a value clipped around
  the behaviour value; among the code-level optimisations of Engstrom et al. 2020,
  "Implementation Matters in Deep Policy Gradients", arXiv:2005.12729);
* :func:`categorical` / :func:`gaussian`: the policy head's ``log pi(a|s)`` and
  entropy ``S`` (the entropy bonus), whose ``gradients`` chain both to the head:
  ``d log pi(a) / dz = onehot(a) - p`` and ``dS / dz = -p (log p + S)`` for a
  categorical, ``d log pi / d mu = z / sigma``, ``d log pi / d log sigma = z^2 - 1``
  and ``dS / d log sigma = 1`` for a Gaussian (``z = (a - mu) / sigma``);
* :func:`backpropagate`: the heads and trunks (backpropagation, Rumelhart et al.
  1986): ``dW_k = da_k^T h_{k-1}``, ``db_k = sum da_k``, ``dh_{k-1} = da_k W_k`` with
  ``da_k = dh_k * f'``, ``tanh' = 1 - h^2``, ``relu' = [h > 0]``, through the forward
  pass the actors sample from (:func:`~zmq_rl.rl.numpy_mlp.mlp_forward`);
* :func:`policy_shift`: the diagnostics, Schulman's "k3" estimate of ``KL(pi_old ||
  pi)`` and the clipped rows.

The result equals autograd's to float rounding (``tests/test_analytic.py`` compares
every parameter's gradient and every loss term across heads, trunks, activations and
value clipping, and ``tests/test_ppo.py`` the whole update against its golden
figures). :func:`analytic_support` says which policies and configs qualify: the
``PPOConfig`` fields the closed form implements are :data:`CLOSED_FORM_FIELDS`, those
that leave a step's gradient alone :data:`GRADIENT_FREE_FIELDS`, and a config that sets
any other field from its default is refused (logged once), so a new field cannot be
silently ignored here. The trainer falls back to autograd for everything refused
(recurrent and structured networks, the decoupled and IMPACT objectives, parameters
on a GPU, where the steps are CUDA graphs). :mod:`zmq_rl.rl.closed_form` runs the
trainer's steps with it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn

from zmq_rl.config import PPOConfig
from zmq_rl.rl.loss_terms import PPOLoss
from zmq_rl.rl.numpy_mlp import Layer, MLPArrays, mlp_forward
from zmq_rl.rl.policy import ActorCritic

__all__ = [
    "CLOSED_FORM_FIELDS",
    "GRADIENT_FREE_FIELDS",
    "AnalyticBatch",
    "Categorical",
    "ClippedSurrogate",
    "Gaussian",
    "LossSums",
    "MLPArrays",
    "PolicyShift",
    "ValueLoss",
    "analytic_support",
    "backpropagate",
    "batch_arrays",
    "categorical",
    "clipped_surrogate",
    "gaussian",
    "loss_of_sums",
    "mlp_arrays",
    "mlp_gradients",
    "mlp_support",
    "normalised_obs",
    "policy_shift",
    "ppo_gradients",
    "unlisted_fields",
    "value_loss",
]

log = logging.getLogger("zmq_rl.analytic")

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)

CLOSED_FORM_FIELDS: dict[str, str] = {
    "clip_range": "eq. 7's epsilon (clipped_surrogate) and the value clip (value_loss), "
    "as the trainer schedules it for the step",
    "clip_value_loss": "value_loss's clipped variant",
    "vf_coef": "c1 of eq. 9 (value_loss's weight)",
    "ent_coef": "c2 of eq. 9 (the entropy bonus's weight)",
    "normalize_advantages": "ClosedFormSteps.gradients standardises a minibatch's advantages",
    "max_grad_norm": "ClosedFormSteps.step clips the gradient's global norm",
    "learning_rate": "Adam's step size, which ClosedFormSteps reads from the optimiser",
    "adam_eps": "Adam's eps, which ClosedFormSteps reads from the optimiser",
    "objective": "'ppo' only: analytic_support refuses the others",
}
"""The ``PPOConfig`` fields the closed form (:func:`mlp_gradients` and
:class:`~zmq_rl.rl.closed_form.ClosedFormSteps`' clip and Adam step) implements, and
where."""

GRADIENT_FREE_FIELDS: dict[str, str] = {
    "anneal_lr": "the trainer's schedule: the learning rate each update starts with",
    "anneal_clip_range": "the trainer's schedule: the clip_range each step is given",
    "num_epochs": "the trainer's passes over a batch",
    "minibatch_size": "the trainer's cut of a batch into minibatches",
    "num_minibatches": "the trainer's cut of a batch into minibatches",
    "target_kl": "the trainer's early stop, on each step's approx_kl",
    "cuda_graphs": "steps on a CUDA device, where the closed form never runs",
    "analytic_gradients": "the switch that asks for the closed form",
    "objective_rho_bar": "the decoupled and impact objectives only, which are refused",
    "impact_target_update_every": "the impact objective only, which is refused",
}
"""The ``PPOConfig`` fields that do not touch a step's gradient: the trainer applies
them the same way whichever computes it (or they belong to refused paths)."""

_logged_fields: set[str] = set()
"""The unlisted fields whose refusal this process has logged."""


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


class LossSums(NamedTuple):
    """A minibatch's loss terms summed over its ``N`` rows (float64), in the order of
    :data:`~zmq_rl.rl.loss_terms.MEAN_KEYS`: :class:`PPOLoss`'s terms are these over
    ``N`` (:func:`loss_of_sums`)."""

    policy_loss: float
    """``-sum min(r A, clip(r, 1 - eps, 1 + eps) A)``: ``-N L^CLIP``."""
    value_loss: float
    """Half the sum of the (clipped) squared errors: ``N L^VF``."""
    entropy: float
    """The sum of the policy's entropies: ``N S``."""
    approx_kl: float
    """The sum of ``(r - 1) - log r`` (k3)."""
    clip_fraction: float
    """How many rows have ``|r - 1| > eps``."""


# -- the fence ----------------------------------------------------------------------


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


def _default(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING  # no default: any value counts as set


def unlisted_fields(cfg: PPOConfig) -> list[str]:
    """The fields of ``cfg`` in neither :data:`CLOSED_FORM_FIELDS` nor
    :data:`GRADIENT_FREE_FIELDS` whose value is not their default."""
    return [
        field.name
        for field in dataclasses.fields(cfg)
        if field.name not in CLOSED_FORM_FIELDS
        and field.name not in GRADIENT_FREE_FIELDS
        and getattr(cfg, field.name) != _default(field)
    ]


def analytic_support(policy: nn.Module, cfg: PPOConfig) -> str | None:
    """``None`` when :func:`mlp_gradients` computes this policy's PPO gradients, else
    the reason it does not (the trainer then uses autograd): the plain MLP of
    :func:`mlp_support`, with every parameter trainable, under the ``ppo`` objective,
    and a config that sets no field the closed form does not know
    (:func:`unlisted_fields`; such a refusal is logged once per process and field)."""
    if (reason := mlp_support(policy)) is not None:
        return reason
    if cfg.objective != "ppo":
        return f"objective {cfg.objective!r} is not 'ppo'"
    if not all(p.requires_grad for p in policy.parameters()):
        return "some of its parameters are frozen (requires_grad False)"
    unlisted = unlisted_fields(cfg)
    if not unlisted:
        return None
    names = ", ".join(unlisted)
    reason = (
        f"PPOConfig sets {names}, which rl/analytic.py lists neither as implemented by "
        "the closed form nor as leaving the gradient alone"
    )
    if not _logged_fields.issuperset(unlisted):
        _logged_fields.update(unlisted)
        log.warning("closed-form gradients off, autograd computes them: %s", reason)
    return reason


# -- arrays -------------------------------------------------------------------------


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


# -- the terms ----------------------------------------------------------------------


def _min_weight(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The share of ``min(a, b)``'s gradient that goes to ``a``: 1 where ``a < b``,
    1/2 on a tie, 0 where ``a > b`` (autograd's rule for ``torch.min(a, b)``)."""
    weight = (a < b).astype(a.dtype)
    weight += 0.5 * (a == b)
    return weight


class ClippedSurrogate(NamedTuple):
    """PPO's clipped surrogate objective on a minibatch (:func:`clipped_surrogate`)."""

    objective: float
    """``sum min(r A, clip(r, 1 - eps, 1 + eps) A)`` over the rows: ``N L^CLIP``."""
    d_log_prob: np.ndarray
    """Each row's term's derivative with respect to ``log pi(a|s)``."""
    ratio: np.ndarray
    """``r = pi(a|s) / pi_old(a|s)``."""
    log_ratio: np.ndarray
    """``log r``."""


def clipped_surrogate(
    log_prob: np.ndarray,
    old_log_prob: np.ndarray,
    advantages: np.ndarray,
    clip_range: float,
) -> ClippedSurrogate:
    """``L^CLIP`` (Schulman et al. 2017, eq. 7) with ``r = exp(log_prob -
    old_log_prob)`` and ``epsilon = clip_range``, and its derivative ``dr/d log pi = r``
    times the advantage through the branch the ``min`` takes (both halves on a tie),
    where the clipped branch passes it only inside ``[1 - eps, 1 + eps]``."""
    dtype = log_prob.dtype.type
    log_ratio = log_prob - old_log_prob
    ratio = np.exp(log_ratio)
    low, high = dtype(1.0 - clip_range), dtype(1.0 + clip_range)
    surrogate = ratio * advantages
    clipped = np.minimum(np.maximum(ratio, low), high) * advantages  # np.clip's own math
    smaller = np.minimum(surrogate, clipped)
    to_surrogate = _min_weight(surrogate, clipped)
    in_range = (ratio >= low) & (ratio <= high)
    d_log_prob = advantages * (to_surrogate + (1.0 - to_surrogate) * in_range)
    d_log_prob *= ratio
    objective = np.add.reduce(smaller, dtype=np.float64)
    return ClippedSurrogate(objective, d_log_prob, ratio, log_ratio)


class ValueLoss(NamedTuple):
    """The value function's loss on a minibatch (:func:`value_loss`)."""

    loss: float
    """Half the sum of the (clipped) squared errors over the rows: ``N L^VF``."""
    d_value: np.ndarray
    """Each row's term's derivative with respect to the value ``V(s)``."""


def value_loss(
    value: np.ndarray,
    old_value: np.ndarray,
    returns: np.ndarray,
    clip_range: float | None,
) -> ValueLoss:
    """``L^VF``, eq. 9's squared error ``(V(s) - V^targ)^2`` halved; with
    ``clip_range`` (``clip_value_loss``), OpenAI baselines' variant, the larger of it
    and the error of ``V_old + clip(V - V_old, -c, c)`` (whose derivative passes only
    inside the clip band; a tie of the two splits it in halves)."""
    error = value - returns
    squared = error * error
    d_value = error
    if clip_range is not None:
        clip = value.dtype.type(clip_range)
        delta = value - old_value
        error_clipped = old_value + np.minimum(np.maximum(delta, -clip), clip) - returns
        squared_clipped = error_clipped * error_clipped
        to_plain = _min_weight(squared_clipped, squared)  # max(a, b)'s share of a
        in_value_range = (delta >= -clip) & (delta <= clip)
        d_value = to_plain * error + (1.0 - to_plain) * error_clipped * in_value_range
        squared = np.maximum(squared, squared_clipped)
    return ValueLoss(0.5 * np.add.reduce(squared, dtype=np.float64), d_value)


class Categorical(NamedTuple):
    """A categorical head ``pi = softmax(z)`` at a minibatch's actions
    (:func:`categorical`)."""

    log_prob: np.ndarray
    """``log pi(a|s) = z_a - logsumexp(z)``, ``[N]``."""
    entropy: np.ndarray
    """``S = -sum p log p``, ``[N]``."""
    p: np.ndarray
    """``softmax(z)``, ``[N, n]``."""
    log_p: np.ndarray
    """``log softmax(z)``, ``[N, n]``."""
    pick: tuple[np.ndarray, np.ndarray]
    """The rows and their actions, to index ``[N, n]`` arrays at the actions."""

    def gradients(self, d_log_prob: np.ndarray, ent_coef: float) -> tuple[np.ndarray, None]:
        """The loss's gradient at the logits, from its derivative ``d_log_prob`` with
        respect to each row's ``log pi(a|s)`` (``onehot(a) - p``) and the entropy
        bonus ``-ent_coef * mean(S)`` (``dS / dz = -p (log p + S)``); no ``log_std``."""
        g_logits = self.p * -d_log_prob[:, None]
        g_logits[self.pick] += d_log_prob
        if ent_coef:
            n = len(d_log_prob)
            g_logits += (
                d_log_prob.dtype.type(ent_coef / n) * self.p * (self.log_p + self.entropy[:, None])
            )
        return g_logits, None


def categorical(logits: np.ndarray, actions: np.ndarray) -> Categorical:
    """The categorical policy of ``logits`` ``[N, n]`` at ``actions`` ``[N]``."""
    shifted = logits - np.maximum.reduce(logits, axis=1, keepdims=True)
    exp = np.exp(shifted)
    total_exp = np.add.reduce(exp, axis=1, keepdims=True)
    log_p = shifted - np.log(total_exp)
    p = exp / total_exp
    index = actions.reshape(-1).astype(np.intp, copy=False)
    pick = (np.arange(len(index)), index)
    log_prob = log_p[pick]
    return Categorical(log_prob, -np.add.reduce(p * log_p, axis=1), p, log_p, pick)


class Gaussian(NamedTuple):
    """A diagonal Gaussian head ``N(mu, sigma^2)`` at a minibatch's actions
    (:func:`gaussian`)."""

    log_prob: np.ndarray
    """``log pi(a|s) = sum(-z^2 / 2 - log sigma - log sqrt(2 pi))``, ``[N]``."""
    entropy: np.ndarray
    """``S = sum(1/2 + log sqrt(2 pi) + log sigma)``, ``[N]``."""
    z: np.ndarray
    """``(a - mu) / sigma``, ``[N, d]``."""
    inv_std: np.ndarray
    """``1 / sigma``, ``[d]``."""

    def gradients(self, d_log_prob: np.ndarray, ent_coef: float) -> tuple[np.ndarray, np.ndarray]:
        """The loss's gradient at the mean (``d log pi / d mu = z / sigma``) and at
        ``log_std`` (``d log pi / d log sigma = z^2 - 1``, and ``dS / d log sigma = 1``
        for the entropy bonus ``-ent_coef * mean(S)``), from its derivative
        ``d_log_prob`` with respect to each row's ``log pi(a|s)``."""
        g_mean = d_log_prob[:, None] * self.z * self.inv_std
        g_log_std = np.add.reduce(d_log_prob[:, None] * (self.z * self.z - 1.0), axis=0)
        return g_mean, g_log_std - d_log_prob.dtype.type(ent_coef)


def gaussian(mean: np.ndarray, log_std: np.ndarray, actions: np.ndarray) -> Gaussian:
    """The Gaussian policy of ``mean`` ``[N, d]`` and ``log_std`` ``[d]`` at
    ``actions``."""
    dtype = mean.dtype.type
    inv_std = np.exp(-log_std)
    z = (actions.reshape(mean.shape) - mean) * inv_std
    log_prob = np.add.reduce(-0.5 * z * z - log_std - dtype(_LOG_SQRT_2PI), axis=1)
    entropy = np.full(len(mean), np.add.reduce(0.5 + _LOG_SQRT_2PI + log_std), dtype=mean.dtype)
    return Gaussian(log_prob, entropy, z, inv_std)


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


def backpropagate(
    net: MLPArrays,
    grads: MLPArrays,
    activations: tuple[list[np.ndarray], list[np.ndarray]],
    g_params: np.ndarray,
    g_value: np.ndarray,
    relu: bool,
) -> None:
    """Write into ``grads`` the gradient of every head and trunk parameter of ``net``
    from the loss's gradients at the policy head's output (``g_params``) and at the
    values (``g_value``), through the actor's and the critic's ``activations``
    (:func:`~zmq_rl.rl.numpy_mlp.mlp_forward`'s); a shared trunk takes the sum of
    both heads' gradients."""
    actor, critic = activations
    np.matmul(g_params.T, actor[-1], out=grads.head[0])
    np.add.reduce(g_params, axis=0, out=grads.head[1])
    np.matmul(g_value, critic[-1], out=grads.value[0][0])
    grads.value[1][0] = np.add.reduce(g_value)
    dh_pi = g_params @ net.head[0]
    dh_v = g_value[:, None] * net.value[0][0]
    if net.critic:
        _trunk_backward(net.actor, grads.actor, actor, dh_pi, relu)
        _trunk_backward(net.critic, grads.critic, critic, dh_v, relu)
    else:
        _trunk_backward(net.actor, grads.actor, actor, dh_pi + dh_v, relu)


class PolicyShift(NamedTuple):
    """How far a step's policy is from the behaviour policy (:func:`policy_shift`)."""

    approx_kl: float
    """The sum of ``(r - 1) - log r`` over the rows."""
    clipped: int
    """The rows with ``|r - 1| > clip_range``."""


def policy_shift(ratio: np.ndarray, log_ratio: np.ndarray, clip_range: float) -> PolicyShift:
    """The diagnostics of :class:`PPOLoss`: Schulman's "k3", an unbiased, non-negative
    estimate of ``KL(pi_old || pi)`` (http://joschu.net/blog/kl-approx.html), and the
    rows the clip of eq. 7 reaches."""
    ratio_m1 = ratio - 1.0
    return PolicyShift(
        np.add.reduce(ratio_m1 - log_ratio, dtype=np.float64),
        np.count_nonzero(np.abs(ratio_m1) > clip_range),
    )


# -- the loss -----------------------------------------------------------------------


def mlp_gradients(
    net: MLPArrays,
    grads: MLPArrays,
    batch: AnalyticBatch,
    cfg: PPOConfig,
    clip_range: float,
    relu: bool,
) -> LossSums:
    """The gradient of the PPO loss's total (eq. 9 negated: ``policy_loss - ent_coef *
    S + vf_coef * value_loss``, as :func:`zmq_rl.rl.ppo.ppo_loss`) on ``batch``, with
    respect to every parameter of ``net``, written into ``grads`` (arrays of the same
    shapes); the head is categorical when ``net.log_std`` is None, else Gaussian.
    ``batch`` holds numpy arrays, its observations flat and normalised
    (:func:`normalised_obs`). Returns the terms' sums over the rows: a pure function
    of its arguments but for the writes into ``grads``."""
    n = batch.obs.shape[0]
    dtype = batch.obs.dtype.type
    actor, critic, params, value = mlp_forward(net, batch.obs, relu)
    if net.log_std is None:
        pi: Categorical | Gaussian = categorical(params, batch.actions)
    else:
        pi = gaussian(params, net.log_std, batch.actions)
    l_clip = clipped_surrogate(pi.log_prob, batch.old_log_prob, batch.advantages, clip_range)
    l_vf = value_loss(
        value, batch.old_value, batch.returns, clip_range if cfg.clip_value_loss else None
    )
    g_log_prob = l_clip.d_log_prob
    g_log_prob *= dtype(-1.0 / n)  # the loss is -mean(L^CLIP)
    g_params, g_log_std = pi.gradients(g_log_prob, cfg.ent_coef)
    if g_log_std is not None:
        assert grads.log_std is not None
        grads.log_std[...] = g_log_std
    g_value = l_vf.d_value * dtype(cfg.vf_coef / n)
    backpropagate(net, grads, (actor, critic), g_params, g_value, relu)
    shift = policy_shift(l_clip.ratio, l_clip.log_ratio, clip_range)
    return LossSums(
        -l_clip.objective,
        l_vf.loss,
        np.add.reduce(pi.entropy, dtype=np.float64),
        shift.approx_kl,
        shift.clipped,
    )


def loss_of_sums(sums: LossSums, n: int, cfg: PPOConfig, dtype: torch.dtype) -> PPOLoss:
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
