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
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import torch
from torch import nn

from zmq_rl.config import PPOConfig
from zmq_rl.rl.policy import Policy
from zmq_rl.wire.spaces import leaves, map_value

__all__ = [
    "PPOLoss",
    "PPOTrainer",
    "RolloutBatch",
    "decoupled_ppo_loss",
    "explained_variance",
    "impact_loss",
    "ppo_loss",
]


class PPOLoss(NamedTuple):
    """Output of :func:`ppo_loss` (all scalar tensors).

    Attributes:
      total: the loss to minimise, ``policy_loss - ent_coef * entropy + vf_coef * value_loss``
        (the negated objective ``L^{CLIP+VF+S}`` of eq. 9); the only field with grad
        through all three terms.
      policy_loss: ``-L^{CLIP}`` (eq. 7), with grad.
      value_loss: ``0.5 * mean((V - R)^2)`` or its clipped variant, with grad.
      entropy: mean policy entropy, with grad.
      approx_kl: ``mean((r - 1) - log r)``, detached: an unbiased, non-negative
        estimator of ``KL(pi_old || pi)`` (Schulman's "k3", http://joschu.net/blog/kl-approx.html).
      clip_fraction: fraction of samples with ``|r - 1| > clip_range``, detached.
    """

    total: torch.Tensor
    policy_loss: torch.Tensor
    value_loss: torch.Tensor
    entropy: torch.Tensor
    approx_kl: torch.Tensor
    clip_fraction: torch.Tensor


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
    surrogate of eq. 7::

        L^CLIP = mean(min(r * A, clip(r, 1 - eps, 1 + eps) * A)),  policy_loss = -L^CLIP

    The value loss is ``0.5 * mean((V - R)^2)``, or, when ``clip_value_loss`` (OpenAI
    baselines' variant; c = ``value_clip_range``)::

        0.5 * mean(max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2))

    and the total is eq. 9 negated: ``policy_loss - ent_coef * mean(entropy) +
    vf_coef * value_loss``. ``approx_kl`` and ``clip_fraction`` are detached
    diagnostics (see :class:`PPOLoss`).
    """
    log_ratio = log_prob - old_log_prob
    ratio = log_ratio.exp()
    surrogate = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range) * advantages
    policy_loss = -torch.min(surrogate, clipped).mean()
    with torch.no_grad():
        clip_fraction = ((ratio - 1.0).abs() > clip_range).to(ratio.dtype).mean()
    return _combine(
        policy_loss,
        log_ratio,
        clip_fraction,
        value,
        old_value,
        returns,
        entropy,
        clip_value_loss=clip_value_loss,
        value_clip_range=value_clip_range,
        vf_coef=vf_coef,
        ent_coef=ent_coef,
    )


def _combine(
    policy_loss: torch.Tensor,
    log_ratio: torch.Tensor,
    clip_fraction: torch.Tensor,
    value: torch.Tensor,
    old_value: torch.Tensor,
    returns: torch.Tensor,
    entropy: torch.Tensor,
    *,
    clip_value_loss: bool,
    value_clip_range: float,
    vf_coef: float,
    ent_coef: float,
) -> PPOLoss:
    """Value loss, entropy, eq. 9's total and ``approx_kl`` (k3 of ``log_ratio``, the
    log-ratio to the trust region's centre) around a policy loss."""
    squared = (value - returns).square()
    if clip_value_loss:
        v_clipped = old_value + torch.clamp(value - old_value, -value_clip_range, value_clip_range)
        squared = torch.max(squared, (v_clipped - returns).square())
    value_loss = 0.5 * squared.mean()

    entropy_mean = entropy.mean()
    total = policy_loss - ent_coef * entropy_mean + vf_coef * value_loss
    with torch.no_grad():
        ratio = log_ratio.exp()
        approx_kl = ((ratio - 1.0) - log_ratio).mean()
    return PPOLoss(total, policy_loss, value_loss, entropy_mean, approx_kl, clip_fraction)


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
    log_ratio = log_prob - prox_log_prob
    ratio = log_ratio.exp()
    with torch.no_grad():
        weight = torch.clamp((prox_log_prob - behaviour_log_prob).exp(), max=rho_bar)
    surrogate = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range) * advantages
    policy_loss = -(weight * torch.min(surrogate, clipped)).mean()
    with torch.no_grad():
        clip_fraction = ((ratio - 1.0).abs() > clip_range).to(ratio.dtype).mean()
    return _combine(
        policy_loss,
        log_ratio,
        clip_fraction,
        value,
        old_value,
        returns,
        entropy,
        clip_value_loss=clip_value_loss,
        value_clip_range=value_clip_range,
        vf_coef=vf_coef,
        ent_coef=ent_coef,
    )


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
    ratio = (log_prob - behaviour_log_prob).exp()
    with torch.no_grad():
        rho = torch.clamp((target_log_prob - behaviour_log_prob).exp(), max=rho_bar)
    low, high = rho * (1.0 - clip_range), rho * (1.0 + clip_range)
    surrogate = ratio * advantages
    clipped = torch.clamp(ratio, low, high) * advantages
    policy_loss = -torch.min(surrogate, clipped).mean()
    with torch.no_grad():
        clip_fraction = ((ratio < low) | (ratio > high)).to(ratio.dtype).mean()
    return _combine(
        policy_loss,
        log_prob - target_log_prob,
        clip_fraction,
        value,
        old_value,
        returns,
        entropy,
        clip_value_loss=clip_value_loss,
        value_clip_range=value_clip_range,
        vf_coef=vf_coef,
        ent_coef=ent_coef,
    )


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


_MEAN_KEYS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction")


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
    """

    def __init__(self, policy: Policy, cfg: PPOConfig, seed: int = 0) -> None:
        cfg.validate()
        self.policy = policy
        self.cfg = cfg
        self.optimizer = torch.optim.Adam(
            policy.parameters(), lr=cfg.learning_rate, eps=cfg.adam_eps
        )
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
        shuffled minibatches of ``min(minibatch_size, N)`` transitions (the last
        minibatch of an epoch holds the remainder when ``N`` is not a multiple; for a
        sequence batch, minibatches of whole sequences holding about
        ``minibatch_size`` real rows, unrolled with ``policy.evaluate_sequence``),
        normalising advantages per minibatch (unless it has one element), clipping the
        global gradient norm, and -- when ``target_kl > 0`` -- stopping all remaining
        minibatches and epochs after the step whose minibatch had ``approx_kl >
        target_kl`` (measured before that step, as in CleanRL; at least one step is
        always taken, so stale off-policy data cannot stall learning entirely).

        The policy loss is ``cfg.objective``'s: :func:`ppo_loss` (``"ppo"``, the ratio
        against the batch's behaviour log-probs), :func:`decoupled_ppo_loss`
        (``"decoupled"``, the proximal policy being the policy at the start of this
        update) or :func:`impact_loss` (``"impact"``, against :attr:`target_policy`,
        refreshed from the policy at the start of every
        ``impact_target_update_every``-th update). The centre's log-probs are
        computed once per update, without grad; ``approx_kl`` (and so ``target_kl``)
        and ``clip_fraction`` are measured against that centre.

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
        ``charts/learning_rate``, ``charts/clip_range`` and ``losses/epochs_run``
        (epochs completed, fractional when stopped mid-epoch).
        """
        cfg = self.cfg
        lr, clip_range = self._schedule(progress)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        device = next(self.policy.parameters()).device
        if batch is None and self.sync is None:
            raise ValueError("RolloutBatch is empty")
        if batch is not None:
            batch.validate()
            batch = batch.to(device)
        n = len(batch) if batch is not None else 0
        recurrent = batch is not None and batch.states is not None
        real_rows = int(batch.mask.sum()) if recurrent else n
        if self.sync is not None:  # the union of every rank's batch decides
            n_all, rows_all, recurrent_any = self.sync.sum_counts([n, real_rows, int(recurrent)])
        else:
            n_all, rows_all, recurrent_any = n, real_rows, int(recurrent)
        if recurrent_any:
            # Minibatches of whole sequences holding about minibatch_size real rows.
            mb_size = max(1, min(n_all, round(cfg.minibatch_size * n_all / max(rows_all, 1))))
        else:
            mb_size = min(cfg.minibatch_size, n_all)
        per_epoch = math.ceil(n_all / mb_size)
        # Decoupled / IMPACT: the trust region's centre (the proximal policy or the
        # target network), evaluated once per update, without grad.
        centre_log_probs = self._centre_log_probs(batch) if batch is not None else None

        # Summed on the device; one host sync at the end (plus one per step for target_kl).
        sums = torch.zeros(len(_MEAN_KEYS), dtype=torch.float64, device=device)
        minibatches = skipped = steps = 0
        stop = False
        self.policy.train()
        for _epoch in range(cfg.num_epochs):
            perm = torch.randperm(n, generator=self.generator).to(device)
            if self.sync is None:
                parts = [perm[start : start + mb_size] for start in range(0, n, mb_size)]
            else:  # the same number of parts on every rank (some may be empty)
                parts = list(torch.tensor_split(perm, per_epoch))
            for idx in parts:
                if batch is None or idx.numel() == 0:
                    # No rows of this rank in this step: it contributes a zero
                    # gradient of weight 0 and takes the ranks' common step.
                    self.optimizer.zero_grad(set_to_none=True)
                    steps += 1
                    global_kl = self.sync.average_gradients(self.policy.parameters(), 0, 0.0)
                    if global_kl is None:
                        continue
                    self._clipped_step()
                    if cfg.target_kl > 0.0 and global_kl > cfg.target_kl:
                        stop = True
                        break
                    continue
                if recurrent:
                    lengths = batch.lengths[idx.cpu()]
                    rows = slice(0, int(lengths.max()))  # drop padding-only rows
                    mask = batch.mask[rows, idx]
                    log_prob, entropy, value, _ = self.policy.evaluate_sequence(
                        map_value(lambda t, i=idx, r=rows: t[r, i], batch.obs),
                        batch.actions[rows, idx],
                        batch.states[idx],
                        lengths,
                    )
                    log_prob, entropy, value = log_prob[mask], entropy[mask], value[mask]
                    old_log_prob = batch.old_log_probs[rows, idx][mask]
                    if centre_log_probs is not None:
                        centre = centre_log_probs[rows, idx][mask]
                    old_value = batch.old_values[rows, idx][mask]
                    returns = batch.returns[rows, idx][mask]
                    advantages = batch.advantages[rows, idx][mask]
                else:
                    log_prob, entropy, value = self.policy.evaluate_actions(
                        map_value(lambda t, i=idx: t[i], batch.obs), batch.actions[idx]
                    )
                    old_log_prob = batch.old_log_probs[idx]
                    if centre_log_probs is not None:
                        centre = centre_log_probs[idx]
                    old_value = batch.old_values[idx]
                    returns = batch.returns[idx]
                    advantages = batch.advantages[idx]
                if cfg.normalize_advantages and advantages.numel() > 1:
                    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
                common = dict(
                    clip_value_loss=cfg.clip_value_loss,
                    value_clip_range=clip_range,
                    vf_coef=cfg.vf_coef,
                    ent_coef=cfg.ent_coef,
                )
                if cfg.objective == "ppo":
                    loss = ppo_loss(
                        log_prob,
                        old_log_prob,
                        advantages,
                        value,
                        old_value,
                        returns,
                        entropy,
                        clip_range=clip_range,
                        **common,
                    )
                else:
                    objective = decoupled_ppo_loss if cfg.objective == "decoupled" else impact_loss
                    loss = objective(
                        log_prob,
                        centre,
                        old_log_prob,
                        advantages,
                        value,
                        old_value,
                        returns,
                        entropy,
                        clip_range=clip_range,
                        rho_bar=cfg.objective_rho_bar,
                        **common,
                    )
                self.optimizer.zero_grad(set_to_none=True)
                loss.total.backward()
                approx_kl = float(loss.approx_kl) if cfg.target_kl > 0.0 else 0.0
                steps += 1
                if self.sync is not None:
                    weight = int(mask.sum()) if recurrent else int(idx.numel())
                    global_kl = self.sync.average_gradients(
                        self.policy.parameters(), weight, approx_kl
                    )
                    assert global_kl is not None  # this rank's weight is positive
                    approx_kl = global_kl
                if not self._clipped_step():
                    # A poisoned minibatch (huge or non-finite inputs from a bad peer)
                    # must not turn the weights into NaN: skip it and count it.
                    skipped += 1
                    continue

                sums += torch.stack([getattr(loss, key).detach() for key in _MEAN_KEYS]).double()
                minibatches += 1
                if cfg.target_kl > 0.0 and approx_kl > cfg.target_kl:
                    stop = True
                    break
            if stop:
                break

        self.updates += 1
        means = (sums / max(minibatches, 1)).tolist()
        metrics = {f"losses/{key}": float(v) for key, v in zip(_MEAN_KEYS, means, strict=True)}
        if batch is None:
            metrics["losses/explained_variance"] = float("nan")
        elif recurrent:
            real = batch.mask
            metrics["losses/explained_variance"] = explained_variance(
                batch.old_values[real], batch.returns[real]
            )
        else:
            metrics["losses/explained_variance"] = explained_variance(
                batch.old_values, batch.returns
            )
        if self.sync is not None:
            minibatches = steps - skipped  # every rank took these steps
        metrics["losses/epochs_run"] = float(minibatches / per_epoch)
        metrics["losses/skipped_minibatches"] = float(skipped)
        metrics["charts/learning_rate"] = float(lr)
        metrics["charts/clip_range"] = float(clip_range)
        return metrics

    def _clipped_step(self) -> bool:
        """Clip the global gradient norm and step; False (no step, gradients
        cleared) when the norm is not finite."""
        norm = nn.utils.clip_grad_norm_(self.policy.parameters(), self.cfg.max_grad_norm)
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
        self.optimizer.load_state_dict(state["optimizer"])
        if "generator" in state:
            self.generator.set_state(state["generator"])
        if self.target_policy is not None:
            # An older checkpoint (or one from another objective) has no target
            # network: start it from the restored policy.
            self.target_policy.load_state_dict(state.get("target_policy", state["policy"]))
            self.updates = int(state.get("updates", 0))
