"""The PPO trainer's minibatch steps with closed-form gradients, in numpy, on the
CPU (issue 28: a learner whose gradient steps cost math).

:func:`zmq_rl.rl.analytic.mlp_gradients` gives the gradients without autograd; this
module takes the rest of the step out of torch's per-op dispatch as well. Every
parameter, its gradient and Adam's moments and step counters live in one flat buffer
each (the policy's parameters and the optimiser's state tensors are made views of
them, so ``state_dict``, checkpoints, broadcasts and a ``torch.optim`` step all see
the same memory): the norm clip is one dot product and one scale, and Adam is six
numpy operations over the whole buffer, where torch would pay its per-op dispatch on
every parameter's tensor (``bench/update_cost.py``; the figures in
docs/benchmarks.md §23).

Reading a number on the CPU costs nothing, so every step is checked: a step whose
gradient norm is not finite is skipped and counted, and ``target_kl`` reads the
step's ``approx_kl`` directly (the trainer needs no snapshot and no second pass).
The arithmetic is torch's: ``clip_grad_norm_`` followed by ``Adam`` (Kingma & Ba
2015, Algorithm 1, with torch's placement of ``eps`` outside the bias-corrected
square root).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch.optim import optimizer as optimizer_module

from zmq_rl.config import PPOConfig
from zmq_rl.rl.analytic import (
    AnalyticBatch,
    LossSums,
    batch_arrays,
    mlp_arrays,
    mlp_gradients,
)
from zmq_rl.rl.policy import ActorCritic

__all__ = ["ClosedFormSteps"]


def _alias(tensor: torch.Tensor, flat: torch.Tensor, offset: int) -> None:
    """Copy ``tensor`` into ``flat[offset:]`` and make it a view of that memory (the
    same tensor object, so whoever holds it sees the flat buffer from now on)."""
    size = tensor.numel()
    with torch.no_grad():
        flat[offset : offset + size].copy_(tensor.reshape(-1))
        tensor.set_(flat.untyped_storage(), offset, tensor.shape)  # contiguous strides


class ClosedFormSteps:
    """Closed-form minibatch steps of an :class:`ActorCritic` (see the module
    docstring): :meth:`batch` / :meth:`permuted` make the update's numpy rows,
    :meth:`gradients` writes a minibatch's gradient into the flat buffer, and
    :meth:`step` clips it and takes Adam's step."""

    def __init__(
        self, policy: ActorCritic, optimizer: torch.optim.Optimizer, cfg: PPOConfig
    ) -> None:
        self.policy = policy
        self.optimizer = optimizer
        self.cfg = cfg
        self.params = list(policy.parameters())
        self.offsets = list(np.cumsum([0] + [p.numel() for p in self.params[:-1]]))
        dtype = self.params[0].dtype
        total = sum(p.numel() for p in self.params)
        self.flat_params = torch.zeros(total, dtype=dtype)
        self.flat = torch.zeros(total, dtype=dtype)
        """The gradient of every parameter, in the parameters' order."""
        self.views = {
            p: self.flat[o : o + p.numel()].view_as(p)
            for p, o in zip(self.params, self.offsets, strict=True)
        }
        self._alias_params()
        self.relu = policy.activation_name == "relu"
        self.net = mlp_arrays(policy)
        self.grads = mlp_arrays(policy, self.views)
        self.g = self.flat.numpy()
        self.p = self.flat_params.numpy()
        self.scratch = np.empty_like(self.g)
        self._moments: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._state_of: torch.Tensor | None = None

    def _alias_params(self) -> None:
        for param, offset in zip(self.params, self.offsets, strict=True):
            _alias(param, self.flat_params, int(offset))

    def _check_params(self) -> None:
        """Alias the parameters again if something replaced their memory (e.g. a
        ``param.data = ...``): the steps must move the policy's own weights."""
        base = self.flat_params.data_ptr()
        size = self.flat_params.element_size()
        for param, offset in zip(self.params, self.offsets, strict=True):
            if param.data_ptr() != base + int(offset) * size:
                self._alias_params()
                self.net = mlp_arrays(self.policy)
                return

    # ------------------------------------------------------------------ rows

    def batch(self, obs: Any, tensors: dict[str, torch.Tensor]) -> AnalyticBatch:
        """Rows (CPU tensors: the observations and the trainer's per-row tensors) as
        :func:`~zmq_rl.rl.analytic.batch_arrays` gives them to the closed form. Called
        once per update (the whole batch) or per minibatch (learner ranks)."""
        self._check_params()
        rows = AnalyticBatch(
            obs, tensors["actions"], tensors["old_log_probs"], tensors["old_values"],
            tensors["returns"], tensors["advantages"],
        )  # fmt: skip
        return batch_arrays(self.policy, rows)

    @staticmethod
    def permuted(batch: AnalyticBatch, perm: np.ndarray) -> AnalyticBatch:
        """Every array of ``batch`` gathered in the order ``perm`` (one epoch's shuffle)."""
        return AnalyticBatch(*(a[perm] for a in batch))

    @staticmethod
    def part(batch: AnalyticBatch, start: int, end: int) -> AnalyticBatch:
        """Rows ``start:end`` of ``batch``: views."""
        return AnalyticBatch(*(a[start:end] for a in batch))

    # ------------------------------------------------------------------ one step

    def gradients(self, batch: AnalyticBatch, clip_range: float) -> LossSums:
        """Write the gradient of ``batch``'s PPO loss into :attr:`flat` (advantages
        normalised here when the config says so) and return
        :func:`~zmq_rl.rl.analytic.mlp_gradients`' row sums of the loss terms."""
        adv = batch.advantages
        if self.cfg.normalize_advantages and adv.shape[0] > 1:
            batch = batch._replace(advantages=standardised(adv))
        return mlp_gradients(self.net, self.grads, batch, self.cfg, clip_range, self.relu)

    def set_grads(self) -> None:
        """Point every parameter's ``grad`` at its part of :attr:`flat` (for the torch
        paths: learner ranks average them, ``torch.optim`` steps on them)."""
        for param, view in self.views.items():
            param.grad = view

    def step(self, max_grad_norm: float) -> bool:
        """Clip :attr:`flat`'s global norm to ``max_grad_norm`` and take Adam's step;
        False (no step) when the norm is not finite (a poisoned minibatch)."""
        g = self.g
        norm = math.sqrt(float(np.dot(g, g)))
        if not math.isfinite(norm):
            return False
        coef = max_grad_norm / (norm + 1e-6)
        if coef < 1.0:
            g *= g.dtype.type(coef)
        moments = self._adam_moments()
        if moments is None:
            self.set_grads()
            self.optimizer.step()  # hooks must run, or options the numpy step lacks
            return True
        self._adam(*moments)
        return True

    def _start_adam_state(self) -> None:
        """Give the optimiser Adam's initial state (step 0, zero moments) through
        ``load_state_dict``, as its first ``step()`` would have: that call's wrapper
        imports ``torch._dynamo`` (a large share of a CPU learner's start-up,
        docs/benchmarks.md §23), which a learner that never compiles does not need."""
        optimizer = self.optimizer
        state = optimizer.state_dict()
        state["state"] = {
            index: {
                "step": torch.tensor(0.0),
                "exp_avg": torch.zeros_like(param),
                "exp_avg_sq": torch.zeros_like(param),
            }
            for index, param in enumerate(optimizer.param_groups[0]["params"])
        }
        optimizer.load_state_dict(state)

    def _adam(self, exp_avg: np.ndarray, exp_avg_sq: np.ndarray, steps: np.ndarray) -> None:
        """One Adam step of every parameter from the flat gradient, as torch's
        ``Adam`` (no weight decay, amsgrad or maximize: :meth:`_adam_moments` checks)."""
        group = self.optimizer.param_groups[0]
        beta1, beta2 = group["betas"]
        g, tmp = self.g, self.scratch
        steps += 1.0
        t = float(steps[0])
        np.subtract(g, exp_avg, out=tmp)  # exp_avg.lerp_(g, 1 - beta1)
        tmp *= 1.0 - beta1
        exp_avg += tmp
        np.multiply(g, g, out=tmp)
        tmp *= 1.0 - beta2
        exp_avg_sq *= beta2
        exp_avg_sq += tmp
        step_size = group["lr"] / (1.0 - beta1**t)
        np.sqrt(exp_avg_sq, out=tmp)
        tmp /= math.sqrt(1.0 - beta2**t)
        tmp += group["eps"]
        np.divide(exp_avg, tmp, out=tmp)
        tmp *= step_size
        self.p -= tmp

    def _adam_moments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Adam's first and second moments and step counters as flat numpy arrays (the
        optimiser's state tensors made views of them), or None where ``torch.optim``
        must take the step: with step hooks, or with options the numpy step does not
        have. Adam's initial state is made here if it has none yet; the state is
        aliased again whenever it was replaced (a restore or a checkpoint load)."""
        optimizer = self.optimizer
        if _has_step_hooks(optimizer) or not _plain_adam(optimizer):
            return None
        if self.params[0] not in optimizer.state:
            self._start_adam_state()
        first = optimizer.state[self.params[0]]["exp_avg"]
        if self._moments is None or first is not self._state_of:
            self._moments = self._alias_state()
            self._state_of = first
        return self._moments

    def _alias_state(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        dtype = self.params[0].dtype
        exp_avg = torch.zeros_like(self.flat_params)
        exp_avg_sq = torch.zeros_like(self.flat_params)
        states = [self.optimizer.state[p] for p in self.params]
        steps = torch.zeros(len(self.params), dtype=states[0]["step"].dtype)
        for index, (state, offset) in enumerate(zip(states, self.offsets, strict=True)):
            assert state["exp_avg"].dtype == dtype
            _alias(state["exp_avg"], exp_avg, int(offset))
            _alias(state["exp_avg_sq"], exp_avg_sq, int(offset))
            _alias(state["step"], steps, index)
        return exp_avg.numpy(), exp_avg_sq.numpy(), steps.numpy()


def standardised(x: np.ndarray) -> np.ndarray:
    """``(x - mean) / (std + 1e-8)`` with the unbiased std (``torch.std``'s default), as
    the torch update normalises a minibatch's advantages (Schulman et al.'s
    baselines); a dot product instead of ``np.std``, whose Python wrapper costs more
    than the arithmetic on a minibatch's rows (docs/benchmarks.md §23, stop 44)."""
    centred = x - np.add.reduce(x) / x.dtype.type(x.shape[0])
    std = math.sqrt(float(np.dot(centred, centred)) / (x.shape[0] - 1))
    centred /= x.dtype.type(std + 1e-8)
    return centred


def _plain_adam(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` is one ``Adam`` group without weight decay, amsgrad or
    maximize, with a float learning rate (what :meth:`ClosedFormSteps._adam` does)."""
    groups = optimizer.param_groups
    if type(optimizer) is not torch.optim.Adam or len(groups) != 1:
        return False
    group = groups[0]
    return (
        not group.get("weight_decay")
        and not group.get("amsgrad")
        and not group.get("maximize")
        and isinstance(group["lr"], float)
    )


def _has_step_hooks(optimizer: torch.optim.Optimizer) -> bool:
    """Whether a step hook is registered on ``optimizer`` or globally (then only
    ``optimizer.step()`` runs it); True where torch keeps them elsewhere."""
    try:
        return bool(
            optimizer._optimizer_step_pre_hooks
            or optimizer._optimizer_step_post_hooks
            or optimizer_module._global_optimizer_pre_hooks
            or optimizer_module._global_optimizer_post_hooks
        )
    except AttributeError:
        return True
