"""Sampling the MLP actor-critic's actions in numpy: the actor's hot path (issue 28).

An actor's forward runs on a handful of rows (the preset's 8 envs), where torch's
per-op dispatch, not arithmetic, is the cost: :meth:`ActorCritic.act` on 8 rows of
LunarLander takes ~58 us on one core, the same forward and sample in numpy on the
parameters' own memory ~23 us. On two cores that is ~4.5 us of every ~60 us env
step an actor takes. :class:`NumpySampler` computes exactly what
:meth:`ActorCritic.act` does (same flattening, observation normalisation and
clipping, trunks, heads, log-probabilities) from numpy views of the module's
tensors, which :func:`~zmq_rl.rl.policy.import_weights` updates in place:

* categorical head: Gumbel-max, ``argmax(z - log E)`` with ``E ~ Exp(1)`` is an exact
  sample of ``softmax(z)`` (Gumbel 1954; Maddison et al. 2014), and
  ``log pi(a) = z_a - logsumexp(z)``;
* Gaussian head: ``a = mu + sigma * eps``, ``log pi(a) = -|eps|^2 / 2 - sum log sigma
  - d log sqrt(2 pi)``.

Its random numbers come from a numpy ``Generator``, not torch's, so a seed gives a
different (equally reproducible) stream of actions than the torch path.
:func:`numpy_act_support` says which policies qualify; the rest (recurrent,
structured, masked or custom networks, parameters off the CPU) keep torch.
"""

from __future__ import annotations

import math

import numpy as np
from torch import nn

from zmq_rl.rl.analytic import MLPArrays, mlp_arrays, mlp_support
from zmq_rl.rl.policy import OBS_CLIP, OBS_NORM_EPS, ActorCritic

__all__ = ["NumpySampler", "numpy_act_support"]

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def numpy_act_support(policy: nn.Module) -> str | None:
    """``None`` when :class:`NumpySampler` samples this policy's actions, else why not:
    the plain CPU MLP of :func:`~zmq_rl.rl.analytic.mlp_support`."""
    return mlp_support(policy)


def _trunk(layers: tuple[tuple[np.ndarray, np.ndarray], ...], x: np.ndarray, relu: bool):
    for weight, bias in layers:
        x = x @ weight.T
        x += bias
        x = np.maximum(x, 0.0, out=x) if relu else np.tanh(x, out=x)
    return x


class NumpySampler:
    """:meth:`ActorCritic.act` (sampling, not the mode) in numpy for ``policy``, with
    its own random stream seeded by ``seed``. Reads the parameters through numpy
    views: call :meth:`refresh` if a tensor is given new memory (loading weights
    with :func:`~zmq_rl.rl.policy.import_weights` copies in place and needs none)."""

    def __init__(self, policy: ActorCritic, seed: int) -> None:
        reason = numpy_act_support(policy)
        if reason is not None:
            raise ValueError(f"numpy sampling does not support this policy: {reason}")
        self.policy = policy
        self.rng = np.random.default_rng(int(seed) & 0xFFFF_FFFF_FFFF_FFFF)
        self.refresh()

    def refresh(self) -> None:
        """Take fresh views of the policy's tensors."""
        policy = self.policy
        self.arrays: MLPArrays = mlp_arrays(policy)
        self.dtype = self.arrays.head[0].dtype
        self.tiny = np.finfo(self.dtype).tiny
        self.relu = policy.activation_name == "relu"
        self.norm = (
            (policy.obs_mean.numpy(), policy.obs_var.numpy()) if policy.normalize_obs else None
        )

    def _flat(self, obs: np.ndarray) -> np.ndarray:
        """:meth:`ActorCritic.flat_obs` in numpy."""
        flat = np.asarray(obs).reshape(len(obs), -1)
        if flat.shape[1] != self.policy.obs_dim:
            raise ValueError(
                f"observation batch of shape {np.shape(obs)} does not flatten to "
                f"[B, {self.policy.obs_dim}]"
            )
        flat = flat.astype(self.dtype, copy=False)
        if self.norm is not None:
            mean, var = self.norm
            std = np.sqrt(var + OBS_NORM_EPS).astype(self.dtype)
            flat = np.clip((flat - mean.astype(self.dtype)) / std, -OBS_CLIP, OBS_CLIP)
        return flat

    def act(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sampled actions (int64 ``[B]`` or the unclipped Gaussian sample ``[B, d]``),
        their log-probabilities and the values, ``[B]`` each, as :meth:`ActorCritic.act`
        returns them (as numpy arrays)."""
        a = self.arrays
        x = self._flat(obs)
        h = _trunk(a.actor, x, self.relu)
        params = h @ a.head[0].T
        params += a.head[1]
        if a.critic:
            h = _trunk(a.critic, x, self.relu)
        value = h @ a.value[0][0]
        value += a.value[1][0]
        if a.log_std is None:
            z = params - params.max(axis=1, keepdims=True)
            # Gumbel-max: argmax(z - log E), E ~ Exp(1). A float32 draw of exactly 0
            # (about one in 2^24) is raised to the smallest normal float, so its action
            # still wins and numpy warns of no log(0) in the actor's log.
            gumbel = self.rng.standard_exponential(z.shape, dtype=self.dtype)
            np.maximum(gumbel, self.tiny, out=gumbel)
            np.log(gumbel, out=gumbel)
            action = (z - gumbel).argmax(axis=1)
            rows = np.arange(len(action))
            log_prob = z[rows, action] - np.log(np.exp(z).sum(axis=1))
            return action.astype(np.int64), log_prob, value
        noise = self.rng.standard_normal(params.shape, dtype=self.dtype)
        action = params + np.exp(a.log_std) * noise
        log_norm = a.log_std.sum() + _LOG_SQRT_2PI * params.shape[1]
        log_prob = (-0.5 * np.square(noise).sum(axis=1) - log_norm).astype(self.dtype)
        return action, log_prob, value
