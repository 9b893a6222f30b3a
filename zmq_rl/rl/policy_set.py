"""Several policies in one run: a :class:`~zmq_rl.rl.trainer.Trainer` per policy of a
multi-agent env's ``policy_map``, updated in lockstep. No sockets.

Every possible agent of the env maps to one policy (``policy_map``, resolved by
:func:`zmq_rl.config.resolve_policy_map`); slot ``s`` of an actor is agent
``s % agents_per_env`` (docs/protocol.md section 4.1.4), so a rollout's columns split
by policy without any tag on the wire. Each policy's trainer takes only its
columns: its own network, optimiser, statistics and episode accounting, as RLlib's
per-policy learners and Sample Factory's per-policy workers do. All policies share
one version counter (every broadcast publishes every policy at the same version),
so the staleness valve, policy lag and V-trace's behaviour versions mean what
they mean in a single-policy run.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from ..config import LearnerConfig, PolicyConfig, PPOConfig
from .policy import Policy
from .rollout import Rollout, SlotKey
from .trainer import PolicyTraining, Trainer, UpdateResult

__all__ = ["PolicyTrainers", "build_trainer"]


class PolicyTrainers:
    """One trainer per policy id (``policy_cfgs``, in the order of first appearance
    in ``agent_policies``, the policy of each agent index). It answers what the
    learner asks of a :class:`~zmq_rl.rl.trainer.Trainer`: :meth:`update`,
    :attr:`version`, :meth:`weights` (the first policy's; :meth:`policy_weights` has
    them all), :meth:`state_dict`."""

    def __init__(
        self,
        cfg: LearnerConfig,
        ppo_cfg: PPOConfig,
        policy_cfgs: dict[str, PolicyConfig],
        observation_space: gym.Space,
        action_space: gym.Space,
        agent_policies: list[str],
    ) -> None:
        self.ids = list(policy_cfgs)
        self.policy_cfgs = dict(policy_cfgs)
        # Different seeds: two policies of the same shape start from different weights.
        self.trainers = {
            pid: Trainer(
                replace(cfg, seed=cfg.seed + i), ppo_cfg, pcfg, observation_space, action_space
            )
            for i, (pid, pcfg) in enumerate(policy_cfgs.items())
        }
        self.agent_policy = np.array([self.ids.index(p) for p in agent_policies], np.int64)
        self.device: torch.device = self.trainers[self.ids[0]].device
        self.episode_returns: dict[str, list[float]] = {pid: [] for pid in self.ids}
        """Every finished episode's return, per policy (its agents' episodes)."""
        self.last_metrics: dict[str, dict[str, float]] = {}
        """Each policy's metrics of the last update that had rows of it."""

    @property
    def policy(self) -> Policy:
        """The first policy (what a single-policy caller reads; :attr:`trainers` has all)."""
        return self.trainers[self.ids[0]].policy

    @property
    def version(self) -> int:
        """The version every policy is at (they move together)."""
        return self.trainers[self.ids[0]].version

    @version.setter
    def version(self, value: int) -> None:
        for trainer in self.trainers.values():
            trainer.version = value

    def next_version(self) -> int:
        """Start the next version of every policy (at a broadcast); return it."""
        for trainer in self.trainers.values():
            trainer.next_version()
        return self.version

    def weights(self) -> list[tuple[str, Any]]:
        """The first policy's tensors (as :meth:`Trainer.weights`)."""
        return self.trainers[self.ids[0]].weights()

    def policy_weights(self) -> dict[str, list[tuple[str, Any]]]:
        """Every policy's tensors as broadcast, by policy id, in :attr:`ids` order."""
        return {pid: self.trainers[pid].weights() for pid in self.ids}

    def eval_policy(self) -> list[Policy]:
        """The policy of each agent index (evaluations act with one per agent)."""
        return [self.trainers[self.ids[i]].policy for i in self.agent_policy]

    def policy_files(self) -> dict[str, tuple[dict[str, Any], PolicyConfig]]:
        """Each policy's ``state_dict`` and network (written as ``policy-<id>.pt``)."""
        return {
            pid: (trainer.policy.state_dict(), self.policy_cfgs[pid])
            for pid, trainer in self.trainers.items()
        }

    def policy_of(self, slots: list[SlotKey]) -> np.ndarray:
        """The index into :attr:`ids` of the policy of each slot."""
        agents = np.fromiter((s for _, s in slots), np.int64, len(slots)) % len(self.agent_policy)
        return self.agent_policy[agents]

    def forget_slots(self, slots: list[SlotKey]) -> None:
        """Drop the unfinished episodes of slots that left, in every policy."""
        for trainer in self.trainers.values():
            trainer.forget_slots(slots)

    def update(self, rollout: Rollout | None, progress: float) -> UpdateResult:
        """Split ``rollout`` by the policy of each column and update each policy on its
        columns. The metrics row holds every policy's metrics under
        ``policy/<id>/<name>`` and, unprefixed, their mean over the policies (the
        maximum for ``*_max``); episode returns are every policy's (also kept per
        policy in :attr:`episode_returns`)."""
        assert rollout is not None, "several policies train on one learner rank"
        owner = self.policy_of(rollout.slots)
        merged: dict[str, list[float]] = {}
        returns: list[float] = []
        for i, pid in enumerate(self.ids):
            columns = np.flatnonzero(owner == i)
            if not columns.size:
                continue
            result = self.trainers[pid].update(rollout.columns(columns), progress)
            self.episode_returns[pid].extend(result.episode_returns)
            returns.extend(result.episode_returns)
            self.last_metrics[pid] = result.metrics
            for name, value in result.metrics.items():
                merged.setdefault(name, []).append(float(value))
        metrics = {
            name: float(max(values) if name.endswith("_max") else np.mean(values))
            for name, values in merged.items()
        }
        for pid, row in self.last_metrics.items():
            metrics.update({f"policy/{pid}/{name}": value for name, value in row.items()})
            recent = self.episode_returns[pid][-100:]
            if recent:
                metrics[f"policy/{pid}/charts/mean_return"] = float(np.mean(recent))
        return UpdateResult(metrics, returns)

    def summary(self, agents: list[str] | None = None) -> dict[str, dict[str, Any]]:
        """What the report says of each policy: its episodes, mean return of the last
        100, last metrics, and (given ``agents``, the names of the env's agent indices)
        the agents it plays."""
        out = {}
        for i, pid in enumerate(self.ids):
            returns = self.episode_returns[pid]
            out[pid] = {
                "episodes_completed": len(returns),
                "mean_recent_return": float(np.mean(returns[-100:])) if returns else None,
                "final_stats": self.last_metrics.get(pid, {}),
            }
            if agents is not None:
                mine = zip(agents, self.agent_policy, strict=True)
                out[pid]["agents"] = [a for a, p in mine if p == i]
        return out

    def state_dict(self) -> dict[str, Any]:
        """The first policy's :meth:`Trainer.state_dict` as it is (a checkpoint reads
        like a single-policy one) and every other policy's under ``policy/<id>/``."""
        first, *others = self.ids
        state = self.trainers[first].state_dict()
        for pid in others:
            state.update(
                {f"policy/{pid}/{k}": v for k, v in self.trainers[pid].state_dict().items()}
            )
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` output; a checkpoint without one of this
        run's policies is refused naming it."""
        first, *others = self.ids
        self.trainers[first].load_state_dict(state)
        for pid in others:
            prefix = f"policy/{pid}/"
            mine = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
            if not mine:
                raise ValueError(f"the checkpoint holds no policy {pid!r} (policies: {self.ids})")
            self.trainers[pid].load_state_dict(mine)


def build_trainer(
    cfg: LearnerConfig,
    ppo_cfg: PPOConfig,
    policy_cfg: PolicyConfig,
    spaces: tuple[gym.Space, gym.Space],
    policy_cfgs: dict[str, PolicyConfig],
    agent_policies: list[str],
) -> PolicyTraining:
    """The training side of a run: a :class:`~zmq_rl.rl.trainer.Trainer` of
    ``policy_cfg``, or, when ``policy_cfgs`` names more than one policy, a
    :class:`PolicyTrainers` of them for the agents' ``agent_policies``."""
    if len(policy_cfgs) > 1:
        return PolicyTrainers(cfg, ppo_cfg, policy_cfgs, *spaces, agent_policies)
    return Trainer(cfg, ppo_cfg, policy_cfg, *spaces)
