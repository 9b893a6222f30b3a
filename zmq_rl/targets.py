"""From a time-major :class:`~zmq_rl.rollout.Rollout` to a flat PPO batch.

Advantages are GAE (Schulman et al. 2016) on the actors' behaviour values, or
V-trace (Espeholt et al. 2018) with target log-probs from re-evaluating every
stored ``(obs, action)`` under the learner's current policy (with ``vtrace_lambda``
equal to ``gae_lambda``, on-policy data gives GAE's targets exactly). Episode ends enter
only through the discounts; a truncated step is bootstrapped by adding
``gamma * V(final observation)`` to its reward (its discount is 0 like any episode
end), a terminated one is not. No sockets here.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch

from .advantages import gae, vtrace
from .policy import Policy
from .ppo import RolloutBatch
from .rollout import Rollout


@dataclass(frozen=True)
class TargetSettings:
    """What :func:`rollout_to_batch` needs of the run's configuration; each field has
    the name of the :class:`~zmq_rl.config.LearnerConfig` field it comes from."""

    gamma: float
    gae_lambda: float
    use_vtrace: bool = False
    vtrace_rho_bar: float = 1.0
    vtrace_c_bar: float = 1.0
    vtrace_lambda: float = 1.0
    vtrace_weight_advantages: bool = True

    @classmethod
    def from_config(cls, cfg: Any) -> TargetSettings:
        """The settings of a :class:`~zmq_rl.config.LearnerConfig` (same field names)."""
        return cls(**{f.name: getattr(cfg, f.name) for f in fields(cls)})


def _tensor(array: np.ndarray) -> torch.Tensor:
    """Observations as the policy sees them on the actors: uint8 frames stay uint8
    (a quarter of float32's memory for an Atari rollout; the policy casts each
    minibatch), every other dtype becomes float32."""
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    return tensor if tensor.dtype in (torch.float32, torch.uint8) else tensor.float()


@torch.no_grad()
def rollout_to_batch(
    rollout: Rollout, policy: Policy, settings: TargetSettings
) -> tuple[RolloutBatch, dict[str, float]]:
    """Compute advantages and returns for ``rollout`` and flatten it (time-major).

    ``old_log_probs`` and ``old_values`` are always the behaviour policy's (what the
    actors stored): with V-trace, PPO's clipped ratio pi/mu bounds the step away
    from the acting policy, and the clipped importance weights inside the V-trace
    targets and advantages correct the returns for the lag.
    Returns the batch and a few diagnostics (``charts/...`` keys).
    """
    T, B = rollout.num_steps, rollout.num_slots
    obs_shape = rollout.obs.shape[2:]
    flat_obs = _tensor(rollout.obs.reshape(T * B, *obs_shape))
    flat_actions = torch.from_numpy(
        np.ascontiguousarray(rollout.actions.reshape(T * B, *rollout.actions.shape[2:]))
    )
    rewards = rollout.rewards.astype(np.float32, copy=True)  # [T, B]
    if len(rollout.final_t):
        final_values = policy.value(_tensor(rollout.final_obs)).numpy()
        rewards[rollout.final_t, rollout.final_b] += settings.gamma * final_values
    done = rollout.terminated | rollout.truncated
    discounts = (settings.gamma * (1.0 - done)).astype(np.float32)  # [T, B]
    bootstrap = policy.value(_tensor(rollout.bootstrap_obs)).numpy()  # [B]
    behaviour_log_probs = rollout.log_probs.astype(np.float32)
    diagnostics: dict[str, float] = {}
    if settings.use_vtrace:
        target_log_probs, _, current_values = policy.evaluate_actions(flat_obs, flat_actions)
        target_lp = target_log_probs.numpy().reshape(T, B)
        values = current_values.numpy().reshape(T, B)
        log_rhos = target_lp - behaviour_log_probs
        out = vtrace(
            log_rhos,
            discounts,
            rewards,
            values,
            bootstrap,
            rho_bar=settings.vtrace_rho_bar,
            c_bar=settings.vtrace_c_bar,
            lam=settings.vtrace_lambda,
        )
        returns = out.vs
        # PPO's trust region stays around the behaviour policy mu (as APPO): the
        # ratio pi/mu limits how far an update moves from what acted, while the
        # clipped rhos inside V-trace correct the targets. The advantages carry
        # IMPALA's min(rho_bar, rho_s) on top of that ratio unless told otherwise.
        # Both choices were measured: see docs/learning-quality.md.
        advantages = out.pg_advantages if settings.vtrace_weight_advantages else out.advantages
        old_log_probs = behaviour_log_probs
        old_values = rollout.values.astype(np.float32)
        rhos = np.exp(log_rhos)
        diagnostics["charts/importance_ratio_mean"] = float(rhos.mean())
        diagnostics["charts/importance_ratio_clipped"] = float(
            (rhos > settings.vtrace_rho_bar).mean()
        )
    else:
        values = rollout.values.astype(np.float32)
        advantages, returns = gae(rewards, values, bootstrap, discounts, settings.gae_lambda)
        old_log_probs = behaviour_log_probs
        old_values = values
    batch = RolloutBatch(
        obs=flat_obs,
        actions=flat_actions,
        old_log_probs=torch.from_numpy(np.ascontiguousarray(old_log_probs).reshape(T * B)),
        old_values=torch.from_numpy(np.ascontiguousarray(old_values, np.float32).reshape(T * B)),
        advantages=torch.from_numpy(np.ascontiguousarray(advantages).reshape(T * B)),
        returns=torch.from_numpy(np.ascontiguousarray(returns).reshape(T * B)),
    )
    return batch, diagnostics
