"""Sampling the MLP actor-critic's actions in numpy: the actor's hot path (issue 28).

An actor's forward runs on a handful of rows (the preset's 8 envs), where torch's
per-op dispatch, not arithmetic, is the cost, and a numpy call costs a fraction of a
torch one (``bench/actor_loop.py``; the figures in docs/benchmarks.md §6 and §23).
:class:`NumpySampler` computes exactly what :meth:`ActorCritic.act` does (same
flattening, observation normalisation and clipping, trunks, heads,
log-probabilities) from numpy views of the module's tensors, which
:func:`~zmq_rl.rl.policy.import_weights` updates in place, with
:func:`~zmq_rl.rl.numpy_mlp.sample_mlp` (which cites the sampling's math). An actor
that never needs the torch module holds the same network without torch
(:class:`~zmq_rl.rl.numpy_mlp.NumpyMLP`).

Its random numbers come from a numpy ``Generator``, not torch's, so a seed gives a
different (equally reproducible) stream of actions than the torch path.
:func:`numpy_act_support` says which policies qualify; the rest (recurrent,
structured, masked or custom networks, parameters off the CPU) keep torch.
"""

from __future__ import annotations

import numpy as np
from torch import nn

from zmq_rl.rl.analytic import mlp_arrays, mlp_support
from zmq_rl.rl.numpy_mlp import MLPArrays, flat_obs, mode_mlp, rng_of, sample_mlp
from zmq_rl.rl.policy import ActorCritic

__all__ = ["NumpySampler", "numpy_act_support", "numpy_mode"]


def numpy_act_support(policy: nn.Module) -> str | None:
    """``None`` when :class:`NumpySampler` samples this policy's actions, else why not:
    the plain CPU MLP of :func:`~zmq_rl.rl.analytic.mlp_support`."""
    return mlp_support(policy)


def _norm_of(policy: ActorCritic) -> tuple[np.ndarray, np.ndarray] | None:
    """Numpy views of the observation statistics (None without ``normalize_obs``)."""
    return (policy.obs_mean.numpy(), policy.obs_var.numpy()) if policy.normalize_obs else None


def numpy_mode(policy: ActorCritic, obs: np.ndarray) -> np.ndarray:
    """:meth:`ActorCritic.act` with ``deterministic``'s actions for ``obs``, in numpy on
    the module's memory (:func:`~zmq_rl.rl.numpy_mlp.mode_mlp`; a policy that
    :func:`numpy_act_support` accepts): what a torch-free evaluator plays for it."""
    arrays = mlp_arrays(policy)
    x = flat_obs(obs, policy.obs_dim, arrays.head[0].dtype, _norm_of(policy))
    return mode_mlp(arrays, x, policy.activation_name == "relu")


class NumpySampler:
    """:meth:`ActorCritic.act` (sampling, not the mode) in numpy for ``policy``, with
    its own random stream seeded by ``seed`` (or ``rng``, a stream to go on with).
    Reads the parameters through numpy views: call :meth:`refresh` if a tensor is
    given new memory (loading weights with :func:`~zmq_rl.rl.policy.import_weights`
    copies in place and needs none)."""

    def __init__(
        self, policy: ActorCritic, seed: int, rng: np.random.Generator | None = None
    ) -> None:
        reason = numpy_act_support(policy)
        if reason is not None:
            raise ValueError(f"numpy sampling does not support this policy: {reason}")
        self.policy = policy
        self.rng = rng_of(seed) if rng is None else rng
        self.refresh()

    def refresh(self) -> None:
        """Take fresh views of the policy's tensors."""
        policy = self.policy
        self.arrays: MLPArrays = mlp_arrays(policy)
        self.dtype = self.arrays.head[0].dtype
        self.relu = policy.activation_name == "relu"
        self.norm = _norm_of(policy)

    def act(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sampled actions (int64 ``[B]`` or the unclipped Gaussian sample ``[B, d]``),
        their log-probabilities and the values, ``[B]`` each, as :meth:`ActorCritic.act`
        returns them (as numpy arrays; :func:`~zmq_rl.rl.numpy_mlp.sample_mlp`)."""
        x = flat_obs(obs, self.policy.obs_dim, self.dtype, self.norm)
        return sample_mlp(self.arrays, x, self.relu, self.rng)
