"""The loss terms a PPO step reports: one record for every objective of
:mod:`zmq_rl.rl.ppo` and for the closed form of :mod:`zmq_rl.rl.analytic` (which
:mod:`zmq_rl.rl.ppo` imports, so the record lives below both)."""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["MEAN_KEYS", "PPOLoss"]

MEAN_KEYS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction")
"""The terms a trainer averages over an update's minibatches, in this order."""


class PPOLoss(NamedTuple):
    """The loss terms of one minibatch, as every objective of :mod:`zmq_rl.rl.ppo` and
    the closed form of :mod:`zmq_rl.rl.analytic` return them (scalar tensors).

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
