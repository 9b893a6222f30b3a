"""Proximal Policy Optimization (Schulman et al. 2017, arXiv:1707.06347), without sockets.

* :func:`ppo_loss` is the pure loss: the clipped surrogate objective (eq. 7), the
  value loss (plain or clipped, as in OpenAI baselines / CleanRL) and the entropy
  bonus, combined as in eq. 9, plus the usual diagnostics.
* :func:`decoupled_ppo_loss` (Hilton et al. 2021) and :func:`impact_loss` (Luo et al.
  2020) are the same loss with an off-policy surrogate: the trust region is centred
  on a recent proximal / target policy instead of the (possibly stale) behaviour
  policy, and a truncated importance weight corrects for the behaviour policy
  (``PPOConfig.objective``).
* :class:`RolloutBatch` is a flat batch of transitions with their advantages and
  value targets (computed elsewhere, e.g. :mod:`zmq_rl.rl.advantages`).
* :class:`PPOTrainer` runs the epochs of shuffled minibatch Adam steps on one batch,
  with learning-rate / clip-range annealing, per-minibatch advantage normalisation,
  gradient-norm clipping and target-KL early stopping; its metric names follow
  CleanRL's ``ppo.py``.
"""

from __future__ import annotations

import copy
import logging
import math
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch
from torch import nn

from zmq_rl.config import PPOConfig
from zmq_rl.rl.analytic import AnalyticBatch, analytic_support, loss_of_sums
from zmq_rl.rl.closed_form import ClosedFormSteps
from zmq_rl.rl.loss_terms import MEAN_KEYS as _MEAN_KEYS
from zmq_rl.rl.loss_terms import PPOLoss
from zmq_rl.rl.policy import Policy
from zmq_rl.wire.spaces import leaves, map_value

log = logging.getLogger("zmq_rl.ppo")

__all__ = [
    "LossInputs",
    "PPOLoss",
    "PPOTrainer",
    "RolloutBatch",
    "clipped_surrogate",
    "decoupled_ppo_loss",
    "explained_variance",
    "impact_loss",
    "objective_loss",
    "ppo_loss",
]


class LossInputs(NamedTuple):
    """One minibatch's tensors as every objective takes them.

    ``log_prob``, ``entropy`` and ``value`` come from the policy being trained (with
    grad); the others are constants of the batch: ``old_log_prob`` (the behaviour
    policy's), ``centre`` (the trust region's centre for ``decoupled`` / ``impact``,
    None for ``ppo``), ``old_value``, ``returns`` and ``advantages`` (already
    normalised when the config says so).
    """

    log_prob: torch.Tensor
    entropy: torch.Tensor
    value: torch.Tensor
    old_log_prob: torch.Tensor
    centre: torch.Tensor | None
    old_value: torch.Tensor
    returns: torch.Tensor
    advantages: torch.Tensor


class _ValueAndEntropy(NamedTuple):
    """How eq. 9 adds the value loss and the entropy bonus to a policy surrogate."""

    clip_value_loss: bool
    value_clip_range: float
    vf_coef: float
    ent_coef: float


class _Surrogate(NamedTuple):
    """An objective's policy loss (with grad) and its detached diagnostics' inputs:
    the log-ratio to the trust region's centre (for ``approx_kl``) and the clip
    fraction."""

    policy_loss: torch.Tensor
    log_ratio: torch.Tensor
    clip_fraction: torch.Tensor


def clipped_surrogate(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    low: float | torch.Tensor,
    high: float | torch.Tensor,
) -> torch.Tensor:
    """``min(r * A, clip(r, low, high) * A)`` per row: the term of PPO's clipped
    surrogate objective (Schulman et al. 2017, eq. 7, band ``[1 - eps, 1 + eps]``) that
    every objective here averages, IMPACT's with its band ``[rho (1 - eps), rho (1 +
    eps)]``."""
    return torch.min(ratio * advantages, torch.clamp(ratio, low, high) * advantages)


def _clipped_around(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    clip_range: float,
    weight: torch.Tensor | None,
) -> _Surrogate:
    """The clipped surrogate of ``r = exp(log_ratio)``, the ratio to the trust region's
    centre, in the band ``[1 - eps, 1 + eps]``, each row weighted by ``weight`` (a
    constant) when given."""
    ratio = log_ratio.exp()
    surrogate = clipped_surrogate(ratio, advantages, 1.0 - clip_range, 1.0 + clip_range)
    policy_loss = -(surrogate if weight is None else weight * surrogate).mean()
    with torch.no_grad():
        clip_fraction = ((ratio - 1.0).abs() > clip_range).to(ratio.dtype).mean()
    return _Surrogate(policy_loss, log_ratio, clip_fraction)


def _ppo_surrogate(i: LossInputs, clip_range: float, rho_bar: float) -> _Surrogate:
    """:func:`ppo_loss`'s policy loss: clipped around the behaviour policy (``rho_bar``
    unused)."""
    return _clipped_around(i.log_prob - i.old_log_prob, i.advantages, clip_range, None)


def _decoupled_surrogate(i: LossInputs, clip_range: float, rho_bar: float) -> _Surrogate:
    """:func:`decoupled_ppo_loss`'s policy loss: clipped around the proximal policy
    (``i.centre``), weighted by its truncated ratio to the behaviour policy."""
    assert i.centre is not None
    with torch.no_grad():
        weight = torch.clamp((i.centre - i.old_log_prob).exp(), max=rho_bar)
    return _clipped_around(i.log_prob - i.centre, i.advantages, clip_range, weight)


def _impact_surrogate(i: LossInputs, clip_range: float, rho_bar: float) -> _Surrogate:
    """:func:`impact_loss`'s policy loss: the ratio to the behaviour policy, clipped
    around the target network's (``i.centre``) truncated ratio to it."""
    assert i.centre is not None
    ratio = (i.log_prob - i.old_log_prob).exp()
    with torch.no_grad():
        rho = torch.clamp((i.centre - i.old_log_prob).exp(), max=rho_bar)
    low, high = rho * (1.0 - clip_range), rho * (1.0 + clip_range)
    policy_loss = -clipped_surrogate(ratio, i.advantages, low, high).mean()
    with torch.no_grad():
        clip_fraction = ((ratio < low) | (ratio > high)).to(ratio.dtype).mean()
    return _Surrogate(policy_loss, i.log_prob - i.centre, clip_fraction)


_SURROGATES = {
    "ppo": _ppo_surrogate,
    "decoupled": _decoupled_surrogate,
    "impact": _impact_surrogate,
}
"""``PPOConfig.objective`` -> its policy surrogate."""


def _total_loss(s: _Surrogate, i: LossInputs, terms: _ValueAndEntropy) -> PPOLoss:
    """Eq. 9 negated around a policy surrogate: the value loss (plain or clipped),
    the entropy bonus, the total and ``approx_kl`` (k3 of the log-ratio to the trust
    region's centre)."""
    squared = (i.value - i.returns).square()
    if terms.clip_value_loss:
        c = terms.value_clip_range
        v_clipped = i.old_value + torch.clamp(i.value - i.old_value, -c, c)
        squared = torch.max(squared, (v_clipped - i.returns).square())
    value_loss = 0.5 * squared.mean()

    entropy_mean = i.entropy.mean()
    total = s.policy_loss - terms.ent_coef * entropy_mean + terms.vf_coef * value_loss
    with torch.no_grad():
        ratio = s.log_ratio.exp()
        approx_kl = ((ratio - 1.0) - s.log_ratio).mean()
    return PPOLoss(total, s.policy_loss, value_loss, entropy_mean, approx_kl, s.clip_fraction)


def _loss(
    objective: str,
    inputs: LossInputs,
    clip_range: float,
    rho_bar: float,
    terms: _ValueAndEntropy,
) -> PPOLoss:
    """``objective``'s loss: its surrogate (:data:`_SURROGATES`) in eq. 9."""
    return _total_loss(_SURROGATES[objective](inputs, clip_range, rho_bar), inputs, terms)


def ppo_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    value: torch.Tensor,
    old_value: torch.Tensor,
    returns: torch.Tensor,
    entropy: torch.Tensor,
    *,
    clip_range: float,
    clip_value_loss: bool,
    value_clip_range: float,
    vf_coef: float,
    ent_coef: float,
) -> PPOLoss:
    """The PPO loss on a minibatch of ``[N]`` tensors (Schulman et al. 2017).

    With the probability ratio ``r = exp(log_prob - old_log_prob)`` and advantages
    ``A`` (already normalised if wanted), the policy loss is the negated clipped
    surrogate of eq. 7 (:func:`clipped_surrogate`)::

        L^CLIP = mean(min(r * A, clip(r, 1 - eps, 1 + eps) * A)),  policy_loss = -L^CLIP

    The value loss is ``0.5 * mean((V - R)^2)``, or, when ``clip_value_loss`` (OpenAI
    baselines' variant; c = ``value_clip_range``)::

        0.5 * mean(max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2))

    and the total is eq. 9 negated: ``policy_loss - ent_coef * mean(entropy) +
    vf_coef * value_loss``. ``approx_kl`` and ``clip_fraction`` are detached
    diagnostics (see :class:`PPOLoss`).
    """
    terms = _ValueAndEntropy(clip_value_loss, value_clip_range, vf_coef, ent_coef)
    inputs = LossInputs(
        log_prob, entropy, value, old_log_prob, None, old_value, returns, advantages
    )
    return _loss("ppo", inputs, clip_range, math.inf, terms)


def decoupled_ppo_loss(
    log_prob: torch.Tensor,
    prox_log_prob: torch.Tensor,
    behaviour_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    value: torch.Tensor,
    old_value: torch.Tensor,
    returns: torch.Tensor,
    entropy: torch.Tensor,
    *,
    clip_range: float,
    rho_bar: float,
    clip_value_loss: bool,
    value_clip_range: float,
    vf_coef: float,
    ent_coef: float,
) -> PPOLoss:
    """Decoupled PPO (Hilton, Cobbe and Schulman, "Batch size-invariance for policy
    optimization", arXiv:2110.00641, 2021 / NeurIPS 2022: the decoupled clipped
    objective, PPO-clip with the proximal policy separated from the behaviour policy).

    PPO's clipped ratio plays two roles: an importance weight against the behaviour
    policy ``mu`` and a trust region around it. Decoupled PPO separates them: the
    trust region is centred on a *proximal* policy ``pi_prox`` (here: the policy at the
    start of the update), and a separate weight ``pi_prox / mu`` corrects for the
    behaviour policy. With ``r = pi_theta / pi_prox``::

        L^CLIP_decoupled = mean(w * min(r * A, clip(r, 1 - eps, 1 + eps) * A)),
        w = min(rho_bar, pi_prox / mu)

    The weight is truncated at ``rho_bar`` as V-trace truncates its ``rho`` (Espeholt
    et al. 2018, eq. 1), which the paper's untruncated ``w`` becomes for
    ``rho_bar = inf``; it is a constant (no gradient). When ``pi_prox = mu`` (fresh
    data) and ``rho_bar >= 1`` this is :func:`ppo_loss` exactly.
    ``policy_loss = -L^CLIP_decoupled``; value loss, entropy and total as in
    :func:`ppo_loss`; ``approx_kl`` and ``clip_fraction`` are measured against
    ``pi_prox`` (the trust region's centre).
    """
    terms = _ValueAndEntropy(clip_value_loss, value_clip_range, vf_coef, ent_coef)
    centre, behaviour = prox_log_prob, behaviour_log_prob
    inputs = LossInputs(log_prob, entropy, value, behaviour, centre, old_value, returns, advantages)
    return _loss("decoupled", inputs, clip_range, rho_bar, terms)


def impact_loss(
    log_prob: torch.Tensor,
    target_log_prob: torch.Tensor,
    behaviour_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    value: torch.Tensor,
    old_value: torch.Tensor,
    returns: torch.Tensor,
    entropy: torch.Tensor,
    *,
    clip_range: float,
    rho_bar: float,
    clip_value_loss: bool,
    value_clip_range: float,
    vf_coef: float,
    ent_coef: float,
) -> PPOLoss:
    """IMPACT's target-network surrogate (Luo, Yao, Liaw, Liang and Stoica 2020,
    "IMPACT: Importance Weighted Asynchronous Architectures with Clipped Target
    Networks", ICLR 2020, arXiv:1912.00167, section 3.1).

    The importance ratio is taken against the behaviour policy ``mu``, ``r = pi_theta /
    mu``, but clipped around the ratio of a slowly updated *target network*
    ``pi_target``, ``rho = min(rho_bar, pi_target / mu)`` (the target-worker ratio,
    truncated as V-trace's ``rho``)::

        L^IMPACT = mean(min(r * A, clip(r, rho * (1 - eps), rho * (1 + eps)) * A))

    So the trust region sits around ``pi_target`` (for ``rho`` below ``rho_bar``,
    ``clip(r, rho(1-eps), rho(1+eps)) = rho * clip(pi_theta / pi_target, 1-eps, 1+eps)``:
    the decoupled objective with ``pi_prox = pi_target``), while the unclipped
    branch keeps the untruncated ratio to ``mu``. With ``pi_target = mu`` and
    ``rho_bar >= 1`` this is :func:`ppo_loss` exactly. ``policy_loss = -L^IMPACT``;
    value loss, entropy and total as in :func:`ppo_loss`; ``approx_kl`` is measured
    against ``pi_target`` and ``clip_fraction`` is the fraction of ``r`` outside
    ``[rho (1 - eps), rho (1 + eps)]``.
    """
    terms = _ValueAndEntropy(clip_value_loss, value_clip_range, vf_coef, ent_coef)
    centre, behaviour = target_log_prob, behaviour_log_prob
    inputs = LossInputs(log_prob, entropy, value, behaviour, centre, old_value, returns, advantages)
    return _loss("impact", inputs, clip_range, rho_bar, terms)


def objective_loss(inputs: LossInputs, cfg: PPOConfig, clip_range: float) -> PPOLoss:
    """``cfg.objective``'s loss on one minibatch (:func:`ppo_loss`,
    :func:`decoupled_ppo_loss` or :func:`impact_loss`), with ``clip_range`` for the
    ratio and (when ``clip_value_loss``) the value clip."""
    terms = _ValueAndEntropy(cfg.clip_value_loss, clip_range, cfg.vf_coef, cfg.ent_coef)
    return _loss(cfg.objective, inputs, clip_range, cfg.objective_rho_bar, terms)


def explained_variance(prediction: torch.Tensor, target: torch.Tensor) -> float:
    """``1 - Var(target - prediction) / Var(target)``: 1 is a perfect value function,
    0 no better than a constant, negative worse. NaN when ``target`` is constant
    (the CleanRL / SB3 convention)."""
    var_y = torch.var(target.double(), unbiased=False)
    if var_y.item() == 0.0:
        return math.nan
    return float(1.0 - torch.var((target - prediction).double(), unbiased=False) / var_y)


@dataclass
class RolloutBatch:
    """A batch of transitions for one PPO update.

    Feed-forward policies get a flat batch of ``N`` transitions; recurrent ones
    (``states`` given) a time-major batch of ``N`` sequences of up to ``L`` rows, in
    which every per-row tensor is ``[L, N, ...]`` and minibatches are made of whole
    sequences (:mod:`zmq_rl.rl.targets` builds them).

    Attributes:
      obs: ``[N, *obs_shape]`` observations: one tensor, or a dict / tuple of
        tensors for a structured observation space (:mod:`zmq_rl.wire.spaces` values).
      actions: ``[N]`` (Discrete), ``[N, *action_shape]`` (the other kinds).
      old_log_probs: ``[N]`` log-probabilities of ``actions`` under the behaviour policy.
      old_values: ``[N]`` values the behaviour policy predicted (for the clipped
        value loss and explained variance).
      advantages: ``[N]`` advantage estimates (e.g. GAE, unnormalised).
      returns: ``[N]`` value targets.
      states: recurrent only, ``[N, S]``: the state each sequence starts from.
      lengths: recurrent only, ``[N]`` int64: the real rows of each sequence.
      mask: recurrent only, ``[L, N]`` bool: the row is real (False = padding).
    """

    obs: Any
    actions: torch.Tensor
    old_log_probs: torch.Tensor
    old_values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    states: torch.Tensor | None = None
    lengths: torch.Tensor | None = None
    mask: torch.Tensor | None = None

    def __len__(self) -> int:
        """Transitions (feed-forward) or sequences (recurrent)."""
        return int(self.actions.shape[1 if self.states is not None else 0])

    def to(self, device: torch.device | str) -> RolloutBatch:
        """The batch with every tensor on ``device`` (no copy for tensors already there)."""
        return RolloutBatch(
            obs=map_value(lambda t: t.to(device), self.obs),
            actions=self.actions.to(device),
            old_log_probs=self.old_log_probs.to(device),
            old_values=self.old_values.to(device),
            advantages=self.advantages.to(device),
            returns=self.returns.to(device),
            states=None if self.states is None else self.states.to(device),
            lengths=self.lengths,
            mask=None if self.mask is None else self.mask.to(device),
        )

    def validate(self) -> None:
        """Raise ``ValueError`` unless every tensor has the same leading size(s)
        (``[N]`` flat, ``[L, N]`` sequences) with ``N >= 1``."""
        n = len(self)
        if n < 1:
            raise ValueError("RolloutBatch is empty")
        lead = (n,) if self.states is None else (int(self.actions.shape[0]), n)
        for leaf in leaves(self.obs):
            if tuple(leaf.shape[: len(lead)]) != lead:
                raise ValueError(f"obs has leading dims {tuple(leaf.shape)}, expected {lead}")
        if tuple(self.actions.shape[: len(lead)]) != lead:
            raise ValueError(
                f"actions has leading dims {tuple(self.actions.shape)}, expected {lead}"
            )
        names = ["old_log_probs", "old_values", "advantages", "returns"]
        if self.states is not None:
            names += ["mask"]
            if self.lengths is None or self.mask is None or self.states.shape[0] != n:
                raise ValueError("a sequence batch needs states [N, S], lengths and mask")
        for name in names:
            shape = tuple(getattr(self, name).shape)
            if shape != lead:
                raise ValueError(f"{name} has shape {shape}, expected {lead}")


def _skip_lazy_dynamo_import() -> None:
    """Spare the learner's start-up the import of ``torch._dynamo`` (a large share of a
    CPU learner's start, docs/benchmarks.md §23): torch wraps ``Optimizer``'s
    ``add_param_group``, ``zero_grad``, ``state_dict`` and ``load_state_dict`` in a
    ``dynamo.disable`` that imports dynamo at its first call, only to keep a
    ``torch.compile`` from tracing into them. zmq_rl compiles nothing, so these are
    marked as already disabled (the attribute torch's wrapper caches) while dynamo
    is not loaded; where torch's internals differ, nothing changes but the time."""
    if "torch._dynamo" in sys.modules:
        return
    for name in ("add_param_group", "zero_grad", "state_dict", "load_state_dict"):
        fn = getattr(getattr(torch.optim.Optimizer, name, None), "__wrapped__", None)
        if callable(fn) and getattr(fn, "__dynamo_disable", None) is None:
            fn.__dynamo_disable = fn  # type: ignore[attr-defined]


def _adam_implementation(params: list[nn.Parameter]) -> dict[str, bool]:
    """Adam's implementation flags: ``fused`` (one kernel updates every parameter,
    instead of a loop over the parameters' tensors) where torch has it for the
    parameters' device and dtypes, else torch's default; on CUDA
    also ``capturable`` (its step counters stay on the device, so the step can be
    captured in a CUDA graph)."""
    devices = {p.device.type for p in params}
    if devices <= {"cpu", "cuda"} and all(p.is_floating_point() for p in params):
        return {"fused": True, "capturable": devices == {"cuda"}}
    return {}


_ROW_FIELDS = ("actions", "old_log_probs", "old_values", "advantages", "returns")


@dataclass
class _Rows:
    """A batch's per-row tensors in one order, cut into minibatches by slicing.

    Shuffling gathers each tensor once per epoch (:meth:`permuted`); a minibatch is
    then a slice (:meth:`part`), a view that costs no kernel. Flat batches are
    indexed along dim 0; sequence batches (``lengths`` set) along dim 1, with
    ``states`` and ``lengths`` along dim 0 (``lengths`` stays on the host).
    """

    obs: Any
    tensors: dict[str, torch.Tensor]
    states: torch.Tensor | None = None
    lengths: torch.Tensor | None = None
    mask: torch.Tensor | None = None

    @classmethod
    def of(cls, batch: RolloutBatch, centre: torch.Tensor | None) -> _Rows:
        tensors = {name: getattr(batch, name) for name in _ROW_FIELDS}
        if centre is not None:
            tensors["centre"] = centre
        return cls(batch.obs, tensors, batch.states, batch.lengths, batch.mask)

    def _index(self, index: Any, host_index: Any) -> _Rows:
        if self.lengths is None:
            return _Rows(
                map_value(lambda t: t[index], self.obs),
                {k: t[index] for k, t in self.tensors.items()},
            )
        assert self.states is not None and self.mask is not None
        return _Rows(
            map_value(lambda t: t[:, index], self.obs),
            {k: t[:, index] for k, t in self.tensors.items()},
            self.states[index],
            self.lengths[host_index],
            self.mask[:, index],
        )

    def permuted(self, perm: torch.Tensor, host_perm: torch.Tensor) -> _Rows:
        """Every tensor gathered in the order ``perm`` (``host_perm``: the same on the
        host, for ``lengths``)."""
        return self._index(perm, host_perm)

    def part(self, start: int, end: int) -> _Rows:
        """Rows (sequences) ``start:end``: views."""
        return self._index(slice(start, end), slice(start, end))


@dataclass
class _Tally:
    """What the steps of one update add up: loss sums on the device, step counts, the
    stop flag of ``target_kl``, and -- for the unchecked steps -- whether every
    gradient norm was finite (a device flag, read once at the end)."""

    sums: torch.Tensor
    finite: torch.Tensor
    steps: int = 0
    skipped: int = 0
    minibatches: int = 0
    stop: bool = False

    @classmethod
    def on(cls, device: torch.device) -> _Tally:
        return cls(
            torch.zeros(len(_MEAN_KEYS), dtype=torch.float64, device=device),
            torch.ones((), dtype=torch.bool, device=device),
        )

    def add(self, loss: PPOLoss) -> None:
        self.sums += torch.stack([getattr(loss, key).detach() for key in _MEAN_KEYS]).double()
        self.minibatches += 1


@dataclass(frozen=True)
class _Plan:
    """How one update cuts its batch: this rank's rows (sequences) ``n``, the
    minibatch size and the minibatch count per epoch (of the union of every rank's
    batch), the learning rate and the clip range."""

    n: int
    mb_size: int
    per_epoch: int
    lr: float
    clip_range: float

    def bounds(self, synced: bool) -> list[tuple[int, int]]:
        """The ``(start, end)`` of each minibatch of an epoch: consecutive
        ``mb_size`` runs (the last one the remainder), or -- for data-parallel ranks --
        ``per_epoch`` near-equal parts, some possibly empty (``torch.tensor_split``'s)."""
        if not synced:
            return [(s, min(s + self.mb_size, self.n)) for s in range(0, self.n, self.mb_size)]
        size, extra = divmod(self.n, self.per_epoch)
        bounds, start = [], 0
        for part in range(self.per_epoch):
            end = start + size + (1 if part < extra else 0)
            bounds.append((start, end))
            start = end
        return bounds


class _CudaGraphs:
    """The unchecked minibatch step (loss, backward, clip, Adam, the metrics' sums)
    captured as one CUDA graph per minibatch size, so that a step costs one launch
    instead of one per kernel (PyTorch's "whole network capture" recipe).

    Capture runs three warm-up steps on a side stream and then the captured one; all
    four change the weights, so every parameter, buffer and optimiser tensor is put
    back (in place: the graph holds their addresses) before the real steps run.
    Inputs are copied into the graph's own tensors; the learning rate and the clip
    range are device tensors the graph reads. At most :attr:`MAX_SIZES` sizes are
    kept. Anything that fails during capture turns graphs off for this trainer with
    one log line, and the steps run eagerly (the same math).
    """

    MAX_SIZES = 4

    def __init__(self, trainer: PPOTrainer) -> None:
        self.trainer = trainer
        self.graphs: dict[int, tuple[Any, _Rows, torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self.disabled = False

    def clear(self) -> None:
        """Forget every graph (the optimiser's tensors were replaced)."""
        self.graphs.clear()

    def step(self, rows: _Rows, clip_range: float, tally: _Tally) -> bool:
        """Run one minibatch step through its graph; False (nothing done) when graphs
        are off or the capture failed."""
        if self.disabled:
            return False
        size = int(rows.tensors["actions"].shape[0])
        entry = self.graphs.get(size)
        if entry is None:
            entry = self._capture(rows, clip_range)
            if entry is None:
                return False
        graph, static, clip, losses, finite = entry
        for name, tensor in rows.tensors.items():
            static.tensors[name].copy_(tensor)
        for mine, theirs in zip(leaves(static.obs), leaves(rows.obs), strict=True):
            mine.copy_(theirs)
        clip.fill_(clip_range)
        graph.replay()
        tally.sums += losses
        torch.logical_and(tally.finite, finite, out=tally.finite)
        tally.minibatches += 1
        tally.steps += 1
        return True

    def _capture(self, rows: _Rows, clip_range: float) -> Any:
        trainer = self.trainer
        saved = trainer.state_tensors()
        known = {t.data_ptr() for t in saved}
        clones = [t.detach().clone() for t in saved]
        tensors = {k: t.clone() for k, t in rows.tensors.items()}
        static = _Rows(map_value(lambda t: t.clone(), rows.obs), tensors)
        clip = torch.tensor(clip_range, device=trainer.params[0].device)
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    trainer.optimizer.zero_grad(set_to_none=True)
                    trainer.graph_body(static, clip)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            trainer.optimizer.zero_grad(set_to_none=True)
            with torch.cuda.graph(graph):
                losses, finite = trainer.graph_body(static, clip)
        except Exception as exc:  # noqa: BLE001 -- any capture failure: run eagerly
            self.disabled = True
            log.warning("CUDA graphs off for this run (eager steps instead): %s", exc)
            graph = None
        torch.cuda.synchronize()
        with torch.no_grad():
            for tensor, clone in zip(saved, clones, strict=True):
                tensor.copy_(clone)
            for tensor in trainer.state_tensors():  # Adam's state made by the warm-up
                if tensor.data_ptr() not in known:
                    tensor.zero_()
        trainer.optimizer.zero_grad(set_to_none=True)
        if graph is None:
            return None
        if len(self.graphs) >= self.MAX_SIZES:
            del self.graphs[next(iter(self.graphs))]
        entry = (graph, static, clip, losses, finite)
        self.graphs[int(rows.tensors["actions"].shape[0])] = entry
        return entry


class GradientSync(Protocol):
    """What :class:`PPOTrainer` needs of data-parallel ranks
    (:class:`zmq_rl.rl.distributed.DataParallel`)."""

    def sum_counts(self, counts: list[int]) -> list[int]:
        """Element-wise sums of ``counts`` over every rank."""

    def average_gradients(
        self, parameters: Iterable[nn.Parameter], weight: int, approx_kl: float
    ) -> float | None:
        """Replace each parameter's gradient by the ``weight``-weighted mean over the
        ranks; return the weighted mean ``approx_kl`` (None: every weight was 0)."""


class PPOTrainer:
    """Runs PPO updates of a :class:`~zmq_rl.rl.policy.Policy` with Adam.

    ``seed`` seeds the private ``torch.Generator`` that shuffles minibatches, so two
    trainers built from identical policies and seeds take identical steps (on the
    same device and torch build). The global RNG is not touched.

    A gradient step costs its math, not host round trips: each epoch gathers the
    shuffled batch once and takes minibatches as slices, and nothing inside the epoch
    loop waits for the device -- gradient-norm finiteness is accumulated on the
    device and read once per update (see :meth:`update` for what happens when a norm
    was not finite). Only ``target_kl > 0`` reads ``approx_kl`` after each step, and
    data-parallel ranks synchronise at each step by construction.
    """

    def __init__(self, policy: Policy, cfg: PPOConfig, seed: int = 0) -> None:
        cfg.validate()
        self.policy = policy
        self.cfg = cfg
        self.params = list(policy.parameters())
        _skip_lazy_dynamo_import()
        self.optimizer = torch.optim.Adam(
            self.params, lr=cfg.learning_rate, eps=cfg.adam_eps, **_adam_implementation(self.params)
        )
        on_cuda = bool(self.params) and self.params[0].device.type == "cuda"
        self.graphs: _CudaGraphs | None = _CudaGraphs(self) if cfg.cuda_graphs and on_cuda else None
        """CUDA graphs of the minibatch step (``cuda_graphs`` on a CUDA device)."""
        self.flat: ClosedFormSteps | None = None
        """Closed-form gradients and numpy steps (:mod:`zmq_rl.rl.closed_form`), with
        ``analytic_gradients`` and a policy they support (the CPU MLP under ``ppo``)."""
        if cfg.analytic_gradients and analytic_support(policy, cfg) is None:
            self.flat = ClosedFormSteps(policy, self.optimizer, cfg)  # type: ignore[arg-type]
        self._set_lr(cfg.learning_rate)
        self.generator = torch.Generator()
        self.generator.manual_seed(int(seed))
        self.updates = 0
        self.sync: GradientSync | None = None
        """Data-parallel learners (:mod:`zmq_rl.rl.distributed`): every minibatch's
        gradient is the row-weighted mean over all ranks before the step."""
        # IMPACT's target network: a snapshot of the whole policy (parameters and
        # buffers such as observation statistics), refreshed every
        # impact_target_update_every updates.
        self.target_policy: Policy | None = (
            copy.deepcopy(policy) if cfg.objective == "impact" else None
        )

    def _schedule(self, progress: float) -> tuple[float, float]:
        """(learning rate, clip range) for an update at ``progress`` of the budget."""
        if not (0.0 <= progress <= 1.0):
            raise ValueError(f"progress must be in [0, 1], got {progress!r}")
        frac = 1.0 - progress
        lr = self.cfg.learning_rate * (frac if self.cfg.anneal_lr else 1.0)
        clip = self.cfg.clip_range * (frac if self.cfg.anneal_clip_range else 1.0)
        return lr, clip

    def update(self, batch: RolloutBatch | None, progress: float = 0.0) -> dict[str, float]:
        """One PPO update on ``batch``; returns CleanRL-style metrics as python floats.

        ``progress`` in [0, 1] is the fraction of the training budget already spent;
        with ``anneal_lr`` (``anneal_clip_range``) the learning rate (clip range) of
        this update is ``base * (1 - progress)``. Runs ``num_epochs`` passes of
        shuffled minibatches (:meth:`minibatch_size_for`; the last minibatch of an
        epoch holds the remainder when ``N`` is not a multiple; for a sequence batch,
        minibatches of whole sequences holding about that many real rows, unrolled
        with ``policy.evaluate_sequence``), normalising advantages per minibatch
        (unless it has one element), clipping the global gradient norm, and -- when
        ``target_kl > 0`` -- stopping all remaining minibatches and epochs after the
        step whose minibatch had ``approx_kl > target_kl`` (measured before that
        step, as in CleanRL; at least one step is always taken, so stale off-policy
        data cannot stall learning entirely).

        A minibatch whose gradient norm is not finite (huge or non-finite inputs from
        a bad peer) is skipped and counted, never applied. Without ``target_kl`` and
        ranks, the steps run unchecked and the finiteness of every norm is read once
        at the end; if one was not finite, the policy, the optimiser and the
        shuffling RNG are restored to the start of the update and the update runs
        again checking each step -- the same outcome as checking every step, at no
        cost when nothing is wrong.

        The policy loss is ``cfg.objective``'s (:func:`objective_loss`): the ratio
        against the behaviour log-probs (``"ppo"``), the proximal policy being the
        policy at the start of this update (``"decoupled"``), or :attr:`target_policy`,
        refreshed from the policy at the start of every
        ``impact_target_update_every``-th update (``"impact"``). The centre's
        log-probs are computed once per update, without grad; ``approx_kl`` (and so
        ``target_kl``) and ``clip_fraction`` are measured against that centre.

        With :attr:`sync` (data-parallel learner ranks) the minibatch count is what
        one learner would use for the union of every rank's batch, each rank splits
        its own batch into that many parts, and each step applies the row-weighted
        mean of every rank's gradient (and ``target_kl`` tests the row-weighted mean
        ``approx_kl``), so every rank takes identical steps; ``batch`` is ``None`` on a
        rank that has no rows this update (it still takes the steps). Advantages are
        normalised per rank's part.

        Metrics (losses averaged over the minibatches run): ``losses/policy_loss``,
        ``losses/value_loss``, ``losses/entropy``, ``losses/approx_kl``,
        ``losses/clip_fraction``, ``losses/explained_variance`` (of the behaviour
        values on the returns; NaN when the returns are constant),
        ``charts/learning_rate``, ``charts/clip_range``, ``losses/epochs_run``
        (epochs completed, fractional when stopped mid-epoch) and
        ``losses/skipped_minibatches``.
        """
        if batch is None and self.sync is None:
            raise ValueError("RolloutBatch is empty")
        device = self.params[0].device
        if batch is not None:
            batch.validate()
            batch = batch.to(device)
        plan = self._plan(batch, progress)
        self._set_lr(plan.lr)
        # Decoupled / IMPACT: the trust region's centre (the proximal policy or the
        # target network), evaluated once per update, without grad.
        centre = self._centre_log_probs(batch) if batch is not None else None
        rows = _Rows.of(batch, centre) if batch is not None else None
        self.policy.train()
        if self.sync is None and self.cfg.target_kl == 0.0 and self.flat is None:
            start = self._snapshot()
            tally = self._epochs(rows, plan, checked=False)
            if not bool(tally.finite):  # the update's one read of the device
                self._restore(start)
                tally = self._epochs(rows, plan, checked=True)
        else:
            tally = self._epochs(rows, plan, checked=True)
        self.updates += 1
        return self._metrics(tally, batch, plan)

    def update_without_rows(self, progress: float = 0.0) -> dict[str, float]:
        """The metrics row of an update that has nothing to train on (a multi-agent
        rollout in which no row is valid): no step is taken, the update is counted,
        and the metrics read as those of a data-parallel rank without rows (loss
        means 0, explained variance NaN, no epoch run)."""
        lr, clip_range = self._schedule(progress)
        self.updates += 1
        return self._metrics(_Tally.on(self.params[0].device), None, _Plan(0, 1, 1, lr, clip_range))

    def _set_lr(self, lr: float) -> None:
        """The learning rate of the next steps: a device tensor changed in place where
        CUDA graphs read it, else a float."""
        for group in self.optimizer.param_groups:
            if self.graphs is None:
                group["lr"] = float(lr)
            elif isinstance(group["lr"], torch.Tensor) and group["lr"].device.type == "cuda":
                group["lr"].fill_(lr)
            else:
                group["lr"] = torch.tensor(float(lr), device=self.params[0].device)

    def state_tensors(self) -> list[torch.Tensor]:
        """Every tensor a step changes or reads as state: the policy's parameters and
        buffers and the optimiser's per-parameter state (for CUDA graph capture)."""
        tensors = [*self.params, *self.policy.buffers()]
        for state in self.optimizer.state.values():
            tensors.extend(t for t in state.values() if isinstance(t, torch.Tensor))
        return tensors

    def graph_body(
        self, rows: _Rows, clip_range: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The unchecked step as CUDA graphs capture it (gradients are None before it):
        loss, backward, clip, Adam; returns the loss terms (float64, in
        ``_MEAN_KEYS`` order) and whether the gradient norm was finite."""
        inputs, _ = self._loss_inputs(rows)
        loss = objective_loss(inputs, self.cfg, clip_range)  # type: ignore[arg-type]
        loss.total.backward()
        norm = nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm, foreach=True)
        self.optimizer.step()
        terms = torch.stack([getattr(loss, key).detach() for key in _MEAN_KEYS]).double()
        return terms, torch.isfinite(norm)

    def minibatch_size_for(self, rows: int) -> int:
        """The minibatch size of an update of ``rows`` rows: ``rows / num_minibatches``
        (rounded up) when ``num_minibatches`` is set -- a fixed number of gradient
        steps per epoch however many actors fill the rollout -- else
        ``minibatch_size``; never more than ``rows``."""
        cfg = self.cfg
        if cfg.num_minibatches:
            return max(1, math.ceil(rows / cfg.num_minibatches))
        return max(1, min(cfg.minibatch_size, rows))

    def _plan(self, batch: RolloutBatch | None, progress: float) -> _Plan:
        """Schedules and the cut of this update (the union of every rank's batch
        decides the minibatch count)."""
        lr, clip_range = self._schedule(progress)
        n = len(batch) if batch is not None else 0
        recurrent = batch is not None and batch.states is not None
        assert batch is None or not recurrent or batch.mask is not None
        real_rows = int(batch.mask.sum()) if recurrent else n  # type: ignore[union-attr]
        if self.sync is not None:
            n_all, rows_all, recurrent_any = self.sync.sum_counts([n, real_rows, int(recurrent)])
        else:
            n_all, rows_all, recurrent_any = n, real_rows, int(recurrent)
        rows_per_mb = self.minibatch_size_for(rows_all)
        if recurrent_any:
            # Minibatches of whole sequences holding about rows_per_mb real rows.
            mb_size = max(1, min(n_all, round(rows_per_mb * n_all / max(rows_all, 1))))
        else:
            mb_size = max(1, min(rows_per_mb, n_all))  # n_all = 0: no rank has a row
        return _Plan(n, mb_size, max(1, math.ceil(n_all / mb_size)), lr, clip_range)

    def _epochs(self, rows: _Rows | None, plan: _Plan, checked: bool) -> _Tally:
        """``num_epochs`` shuffled passes over ``rows`` (None: a rank without rows),
        stopping early for ``target_kl``."""
        tally = _Tally.on(self.params[0].device)
        bounds = plan.bounds(synced=self.sync is not None)
        numpy_rows = None
        if self.flat is not None and self.sync is None and rows is not None:
            numpy_rows = self.flat.batch(rows.obs, rows.tensors)
        for _epoch in range(self.cfg.num_epochs):
            host_perm = torch.randperm(plan.n, generator=self.generator)
            if numpy_rows is not None:
                self._closed_form_epoch(numpy_rows, host_perm.numpy(), bounds, plan, tally)
                if tally.stop:
                    return tally
                continue
            shuffled = None
            if rows is not None:
                shuffled = rows.permuted(host_perm.to(self.params[0].device), host_perm)
            for start, end in bounds:
                if shuffled is None or end == start:
                    self._step_without_rows(tally)
                else:
                    self._minibatch_step(shuffled.part(start, end), plan, tally, checked)
                if tally.stop:
                    return tally
        return tally

    def _closed_form_epoch(
        self,
        rows: AnalyticBatch,
        perm: np.ndarray,
        bounds: list[tuple[int, int]],
        plan: _Plan,
        tally: _Tally,
    ) -> None:
        """One epoch of numpy steps (:mod:`zmq_rl.rl.closed_form`) over ``rows`` in the
        order ``perm``: each step checked as :meth:`_minibatch_step` checks one (a
        non-finite gradient norm is skipped and counted; ``target_kl`` stops after
        the step that exceeded it), since reading the CPU costs nothing."""
        flat = self.flat
        assert flat is not None
        shuffled = flat.permuted(rows, perm)
        sums = tally.sums.numpy()
        with np.errstate(all="ignore"):  # an overflow shows as a non-finite norm
            for start, end in bounds:
                loss = flat.gradients(flat.part(shuffled, start, end), plan.clip_range)
                tally.steps += 1
                if not flat.step(self.cfg.max_grad_norm):
                    tally.skipped += 1
                    continue
                sums += np.array(loss) / (end - start)  # the means, in _MEAN_KEYS' order
                tally.minibatches += 1
                if 0.0 < self.cfg.target_kl < loss.approx_kl / (end - start):
                    tally.stop = True
                    return

    def _minibatch_step(self, rows: _Rows, plan: _Plan, tally: _Tally, checked: bool) -> None:
        """Loss, backward, (ranks: gradient average), clip and step on one minibatch
        (through a CUDA graph where :attr:`graphs` can take it)."""
        cfg = self.cfg
        graphable = not checked and rows.lengths is None and self.sync is None
        if graphable and self.graphs is not None and self.graphs.step(rows, plan.clip_range, tally):
            return
        flat = self.flat if rows.lengths is None else None
        if flat is not None:
            loss, weight = self._analytic_gradients(flat, rows, plan.clip_range)
        else:
            inputs, weight = self._loss_inputs(rows)
            loss = objective_loss(inputs, cfg, plan.clip_range)
            self.optimizer.zero_grad(set_to_none=True)
            loss.total.backward()
        approx_kl = float(loss.approx_kl) if cfg.target_kl > 0.0 else 0.0
        tally.steps += 1
        if self.sync is not None:
            global_kl = self.sync.average_gradients(self.params, weight, approx_kl)
            assert global_kl is not None  # this rank's weight is positive
            approx_kl = global_kl
        if checked:
            if not self._clipped_step():
                # A poisoned minibatch (huge or non-finite inputs from a bad peer)
                # must not turn the weights into NaN: skip it and count it.
                tally.skipped += 1
                return
        else:
            norm = nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm, foreach=True)
            torch.logical_and(tally.finite, torch.isfinite(norm), out=tally.finite)
            self.optimizer.step()
        tally.add(loss)
        if cfg.target_kl > 0.0 and approx_kl > cfg.target_kl:
            tally.stop = True

    def _step_without_rows(self, tally: _Tally) -> None:
        """A data-parallel rank with no rows in this step: a zero gradient of weight 0
        joins the ranks' average, and the rank takes their common step."""
        assert self.sync is not None
        self.optimizer.zero_grad(set_to_none=True)
        tally.steps += 1
        global_kl = self.sync.average_gradients(self.params, 0, 0.0)
        if global_kl is None:
            return
        self._clipped_step()
        if self.cfg.target_kl > 0.0 and global_kl > self.cfg.target_kl:
            tally.stop = True

    def _analytic_gradients(
        self, flat: ClosedFormSteps, rows: _Rows, clip_range: float
    ) -> tuple[PPOLoss, int]:
        """The loss terms of one minibatch and its weight, with every parameter's
        ``grad`` set in closed form (:meth:`ClosedFormSteps.gradients`) in ``flat``'s
        buffer (learner ranks then average the gradients)."""
        n = int(rows.tensors["actions"].shape[0])
        with np.errstate(all="ignore"):
            sums = flat.gradients(flat.batch(rows.obs, rows.tensors), clip_range)
        flat.set_grads()
        return loss_of_sums(sums, n, self.cfg, self.params[0].dtype), n

    def _normalised(self, advantages: torch.Tensor) -> torch.Tensor:
        """A minibatch's advantages, normalised when the config says so (and the
        minibatch has more than one row)."""
        if self.cfg.normalize_advantages and advantages.numel() > 1:
            return (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        return advantages

    def _loss_inputs(self, rows: _Rows) -> tuple[LossInputs, int]:
        """The policy's outputs and the batch's constants for one minibatch, with
        advantages normalised; and the minibatch's weight (its real rows)."""
        t = rows.tensors
        if rows.lengths is None:
            log_prob, entropy, value = self.policy.evaluate_actions(rows.obs, t["actions"])
            weight = int(t["actions"].shape[0])
        else:
            assert rows.mask is not None and rows.states is not None
            real = slice(0, int(rows.lengths.max()))  # drop padding-only rows
            mask = rows.mask[real]
            obs = map_value(lambda x: x[real], rows.obs)
            log_prob, entropy, value, _ = self.policy.evaluate_sequence(
                obs, t["actions"][real], rows.states, rows.lengths
            )
            log_prob, entropy, value = log_prob[mask], entropy[mask], value[mask]
            t = {k: x[real][mask] for k, x in t.items() if k != "actions"}
            weight = int(mask.sum())
        inputs = LossInputs(
            log_prob, entropy, value, t["old_log_probs"], t.get("centre"), t["old_values"],
            t["returns"], self._normalised(t["advantages"]),
        )  # fmt: skip
        return inputs, weight

    def _metrics(self, tally: _Tally, batch: RolloutBatch | None, plan: _Plan) -> dict[str, float]:
        """The update's metrics row (one read of the device for the loss means)."""
        means = (tally.sums / max(tally.minibatches, 1)).tolist()
        metrics = {f"losses/{key}": float(v) for key, v in zip(_MEAN_KEYS, means, strict=True)}
        if batch is None:
            metrics["losses/explained_variance"] = float("nan")
        elif batch.mask is not None:
            real = batch.mask
            metrics["losses/explained_variance"] = explained_variance(
                batch.old_values[real], batch.returns[real]
            )
        else:
            metrics["losses/explained_variance"] = explained_variance(
                batch.old_values, batch.returns
            )
        minibatches = tally.minibatches
        if self.sync is not None:
            minibatches = tally.steps - tally.skipped  # every rank took these steps
        metrics["losses/epochs_run"] = float(minibatches / plan.per_epoch)
        metrics["losses/skipped_minibatches"] = float(tally.skipped)
        metrics["charts/learning_rate"] = float(plan.lr)
        metrics["charts/clip_range"] = float(plan.clip_range)
        return metrics

    def _snapshot(self) -> tuple[dict[str, Any], dict[str, Any], torch.Tensor]:
        """The policy, the optimiser and the shuffling RNG as they are (copies)."""
        return (
            copy.deepcopy(self.policy.state_dict()),
            copy.deepcopy(self.optimizer.state_dict()),
            self.generator.get_state(),
        )

    def _restore(self, snapshot: tuple[dict[str, Any], dict[str, Any], torch.Tensor]) -> None:
        policy, optimizer, generator = snapshot
        self.policy.load_state_dict(policy)
        self._load_optimizer(optimizer)
        self.generator.set_state(generator)

    def _load_optimizer(self, state: dict[str, Any]) -> None:
        """Load the optimiser's state; its tensors are new, so captured graphs go."""
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.load_state_dict(state)
        if self.graphs is not None:
            self.graphs.clear()
            for group in self.optimizer.param_groups:
                group["lr"] = lr  # the device tensor the next graphs read

    def _clipped_step(self) -> bool:
        """Clip the global gradient norm and step; False (no step, gradients
        cleared) when the norm is not finite (one read of the device)."""
        norm = nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm, foreach=True)
        if not torch.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            return False
        self.optimizer.step()
        return True

    @torch.no_grad()
    def _centre_log_probs(self, batch: RolloutBatch) -> torch.Tensor | None:
        """Log-probs of the batch's actions under the trust region's centre: ``None``
        for ``ppo`` (the behaviour policy's, already in the batch), the current
        policy's for ``decoupled`` (the proximal policy is the policy at the start of
        this update), the target network's for ``impact`` (first refreshed from the
        policy when ``updates`` is a multiple of ``impact_target_update_every``)."""
        objective = self.cfg.objective
        if objective == "ppo":
            return None
        if objective == "impact":
            assert self.target_policy is not None
            if self.updates % self.cfg.impact_target_update_every == 0:
                self.target_policy.load_state_dict(self.policy.state_dict())
            centre = self.target_policy
        else:
            centre = self.policy
        if batch.states is not None:
            log_prob, _, _, _ = centre.evaluate_sequence(
                batch.obs, batch.actions, batch.states, batch.lengths
            )
            return log_prob.detach()
        n = len(batch)
        chunk = max(self.cfg.minibatch_size, 4096)
        parts = []
        for start in range(0, n, chunk):
            part = slice(start, start + chunk)
            log_prob, _, _ = centre.evaluate_actions(
                map_value(lambda t, p=part: t[p], batch.obs), batch.actions[part]
            )
            parts.append(log_prob.detach())
        return torch.cat(parts)

    def state_dict(self) -> dict[str, Any]:
        """Policy, optimiser and shuffling-RNG state, for checkpoints.

        Holds only tensors and python primitives, so ``torch.save`` output loads with
        ``torch.load(weights_only=True)``.
        """
        state = {
            "policy": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "generator": self.generator.get_state(),
        }
        if self.target_policy is not None:
            state["target_policy"] = self.target_policy.state_dict()
            state["updates"] = self.updates
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved (strict on the policy's tensor names)."""
        self.policy.load_state_dict(state["policy"])
        self._load_optimizer(state["optimizer"])
        if "generator" in state:
            self.generator.set_state(state["generator"])
        if self.target_policy is not None:
            # An older checkpoint (or one from another objective) has no target
            # network: start it from the restored policy.
            self.target_policy.load_state_dict(state.get("target_policy", state["policy"]))
            self.updates = int(state.get("updates", 0))
