"""The training side of the learner: one rollout in, one PPO update out. No sockets.

:class:`Trainer` owns the policy, the PPO optimiser, reward scaling, observation
statistics, the advantage settings, episode accounting and the policy version.
The learner (:mod:`zmq_rl.learner.loop`) does the plumbing — sockets, membership,
rollout assembly — and hands each complete rollout to :meth:`Trainer.update`; the
split follows Sample Factory's ``learner_worker.py`` (plumbing) and ``learner.py``
(training).

The policy and the optimiser live on ``cfg.device`` (:mod:`zmq_rl.device`): the
rollout arrives as host arrays, :func:`~zmq_rl.rl.targets.rollout_to_batch` copies its
tensors to the device once and runs the targets' forward passes there, PPO runs
there, and :meth:`Trainer.weights` and :meth:`Trainer.state_dict` hand out CPU
tensors.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

import gymnasium as gym
import numpy as np
import torch

from ..config import LearnerConfig, PolicyConfig, PPOConfig
from ..wire.spaces import map_value
from .device import resolve_device, set_compute_threads, to_cpu
from .distributed import Collective, DataParallel
from .normalization import RewardScaler
from .policy import Policy, build_policy, export_weights
from .ppo import PPOTrainer
from .rollout import Rollout, SlotKey
from .targets import TargetSettings, rollout_to_batch

# set_compute_threads is re-exported from device.py
__all__ = ["PolicyTraining", "Trainer", "UpdateResult", "set_compute_threads"]


@dataclass
class UpdateResult:
    """What one update produced: its metrics row and the returns of the episodes
    that ended in the rollout (in consumption order)."""

    metrics: dict[str, float]
    episode_returns: list[float]


class PolicyTraining(Protocol):
    """What the learner asks of its training side, one policy (:class:`Trainer`) or
    several (:class:`~zmq_rl.rl.policy_set.PolicyTrainers`): a set of policies is
    trained, broadcast, evaluated, saved and summarised the same way, so the learner
    never asks which it holds (as RLlib's ``MultiRLModule`` is itself a module)."""

    version: int
    device: torch.device

    @property
    def policy(self) -> Policy:
        """The policy a single-policy caller reads (the first of several)."""
        ...

    def next_version(self) -> int:
        """Start the next policy version (at a broadcast); return it."""
        ...

    def update(self, rollout: Rollout | None, progress: float) -> UpdateResult:
        """One update on ``rollout`` (:meth:`Trainer.update`)."""
        ...

    def forget_slots(self, slots: list[SlotKey]) -> None:
        """Drop the unfinished episodes of slots that left."""
        ...

    def policy_weights(self) -> dict[str, list[tuple[str, Any]]]:
        """Every policy's tensors as broadcast, by policy id (``""``: the only one)."""
        ...

    def eval_policy(self) -> Policy | list[Policy]:
        """What evaluations act with: the policy, or the policy of each agent index."""
        ...

    def policy_files(self) -> dict[str, tuple[dict[str, Any], PolicyConfig]]:
        """The files a run writes beside ``policy.pt``: by policy id, each policy's
        ``state_dict`` and network (none for a single policy)."""
        ...

    def summary(self, agents: list[str]) -> dict[str, dict[str, Any]]:
        """The report's ``policies``: each policy's episodes, recent mean and the
        ``agents`` (names of the env's agent indices) it plays (empty for one policy)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """A checkpoint's training state."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` output."""
        ...


class Trainer:
    """Policy, optimiser and everything else that one update reads or changes.

    ``version`` counts broadcasts (0 = the initial policy); the learner bumps it
    with :meth:`next_version` when it publishes. Rollouts must come in consumption
    order: episode returns run on across rollouts, per slot.
    """

    def __init__(
        self,
        cfg: LearnerConfig,
        ppo_cfg: PPOConfig,
        policy_cfg: PolicyConfig,
        observation_space: gym.Space,
        action_space: gym.Space,
    ) -> None:
        torch.manual_seed(cfg.seed)
        set_compute_threads(cfg.torch_threads)
        self.cfg = cfg
        self.device: torch.device = resolve_device(cfg.device)
        # Built on the CPU from the seeded RNG, then moved: the same initial weights
        # on every device.
        policy = build_policy(observation_space, action_space, policy_cfg)
        self.policy: Policy = policy.to(self.device)
        self.ppo = PPOTrainer(self.policy, ppo_cfg, seed=cfg.seed)
        self.targets = TargetSettings.from_config(cfg, ppo_cfg)
        self.reward_scaler = RewardScaler(cfg.gamma) if cfg.normalize_reward else None
        self.version = 0
        self.running_return: dict[SlotKey, float] = {}
        # Recurrent policies: the state each slot's next rollout starts from where it
        # begins mid-fragment (computed by the learner; not checkpointed: zeros after
        # a resume).
        self.carry_states: dict[SlotKey, Any] = {}
        self.collective: Collective | None = None  # data-parallel ranks (attach)

    def next_version(self) -> int:
        """Start the next policy version (at a broadcast); return it."""
        self.version += 1
        return self.version

    def weights(self) -> list[tuple[str, Any]]:
        """The policy's tensors as broadcast (:func:`zmq_rl.rl.policy.export_weights`)."""
        return export_weights(self.policy)

    def policy_weights(self) -> dict[str, list[tuple[str, Any]]]:
        """The tensors under the policy id ``""`` (:class:`PolicyTraining`)."""
        return {"": self.weights()}

    def eval_policy(self) -> Policy:
        """The policy (:class:`PolicyTraining`)."""
        return self.policy

    def policy_files(self) -> dict[str, tuple[dict[str, Any], PolicyConfig]]:
        """None beside ``policy.pt`` (:class:`PolicyTraining`)."""
        return {}

    def summary(self, agents: list[str]) -> dict[str, dict[str, Any]]:
        """Nothing: the report's top level is this policy's (:class:`PolicyTraining`)."""
        return {}

    def forget_slots(self, slots: list[SlotKey]) -> None:
        """Drop the unfinished episodes of slots that left (their rows are gone) or start
        a new stream (a new registration): returns, reward-scaling returns, states."""
        for key in slots:
            self.running_return.pop(key, None)
            self.carry_states.pop(key, None)
            if self.reward_scaler is not None:
                self.reward_scaler.returns.pop(key, None)

    def attach(self, collective: Collective) -> None:
        """Train as one of several data-parallel learner ranks (:mod:`zmq_rl.rl.distributed`):
        gradients are averaged over the ranks at every minibatch, and the observation
        and reward statistics are rank 0's (its actors sample the same distribution),
        so every rank holds the identical policy after every update."""
        self.collective = collective
        self.ppo.sync = DataParallel(collective)

    def share_state(self) -> None:
        """Make every rank's training state rank 0's (at the start of a run, after a
        resume): parameters, buffers, the optimiser's moments, the update count, the
        IMPACT target network and the reward statistics."""
        collective = self.collective
        assert collective is not None
        collective.share_tensors(self.policy.state_dict().values())
        if self.ppo.target_policy is not None:
            collective.share_tensors(self.ppo.target_policy.state_dict().values())
        optimizer = self.ppo.optimizer
        params = [p for group in optimizer.param_groups for p in group["params"]]
        have = torch.tensor([int(p in optimizer.state) for p in params], dtype=torch.int64)
        collective.share_tensors([have])
        for p, known in zip(params, have.tolist(), strict=True):
            if not known:
                continue
            if p not in optimizer.state:  # as Adam makes it at its first step
                fused = bool(optimizer.defaults.get("fused"))  # fused Adam: step on the device
                optimizer.state[p] = {
                    "step": torch.zeros(
                        (), dtype=torch.float32, device=p.device if fused else None
                    ),
                    "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
                }
            collective.share_tensors(
                optimizer.state[p][k] for k in ("step", "exp_avg", "exp_avg_sq")
            )
        counts = torch.tensor([self.ppo.updates, self.version], dtype=torch.int64)
        collective.share_tensors([counts])
        self.ppo.updates, self.version = (int(v) for v in counts.tolist())
        self._share_reward_stats()

    def _share_reward_stats(self) -> None:
        if self.reward_scaler is None or self.collective is None:
            return
        scaler = self.reward_scaler
        stats = torch.tensor(
            [float(scaler.mean), float(scaler.var), scaler.count], dtype=torch.float64
        )
        self.collective.share_tensors([stats])
        scaler.mean, scaler.var = np.asarray(float(stats[0])), np.asarray(float(stats[1]))
        scaler.count = float(stats[2])

    def update(self, rollout: Rollout | None, progress: float) -> UpdateResult:
        """Account the rollout's episodes, update observation statistics, scale
        rewards, compute targets and run one PPO update; ``progress`` in [0, 1] drives
        the learning-rate and clip schedules. ``rollout`` is None only on a
        data-parallel rank that has no rows this update (it still takes the ranks'
        common steps).

        Rows that are not valid (``rollout.valid``) have no effect: they count in no
        episode, in neither the observation nor the reward statistics, in no target
        and no loss (:func:`~zmq_rl.rl.targets.rollout_to_batch` drops them). A
        rollout without a single valid row takes no gradient step (on data-parallel
        ranks: the ranks' common steps, with weight 0)."""
        returns = self._account(rollout) if rollout is not None else []
        valid = None if rollout is None else rollout.valid
        if rollout is not None and hasattr(self.policy, "update_obs_stats"):
            if valid is None:
                self.policy.update_obs_stats(rollout.obs)
            elif valid.any():
                self.policy.update_obs_stats(map_value(lambda a: a[valid], rollout.obs))
        if self.collective is not None:
            self.collective.share_tensors(self.policy.buffers())
        if self.reward_scaler is not None:
            if rollout is not None:
                done = rollout.terminated | rollout.truncated
                self.reward_scaler.observe(rollout.rewards, done, rollout.slots, valid)
            self._share_reward_stats()
            if rollout is not None:
                rollout.rewards = self.reward_scaler.apply(rollout.rewards)
        if rollout is not None and rollout.env_steps == 0:
            # Every slot was empty: nothing to learn from, and each slot's next agent
            # starts from a zero state.
            self.forget_carry(rollout.slots)
            rollout = None
        if rollout is None:
            if self.collective is None:
                return UpdateResult(self.ppo.update_without_rows(progress), returns)
            return UpdateResult(self.ppo.update(None, progress), returns)
        batch, diagnostics = rollout_to_batch(
            rollout, self.policy, self.targets, self.carry_states, device=self.device
        )
        metrics = self.ppo.update(batch, progress)
        metrics.update(diagnostics)
        versions = rollout.versions if valid is None else rollout.versions[valid]
        metrics["charts/policy_lag_mean"] = float(self.version - versions.mean())
        metrics["charts/policy_lag_max"] = float(self.version - versions.min())
        return UpdateResult(metrics, returns)

    def forget_carry(self, slots: list[SlotKey]) -> None:
        """Start the next rollout of each of ``slots`` from a zero recurrent state."""
        for key in slots:
            self.carry_states.pop(key, None)

    def _account(self, rollout: Rollout) -> list[float]:
        """Episode returns completed in ``rollout``, from unscaled rewards, in the order
        they ended (by row, then slot: the progress line's recent mean is then over
        the episodes that ended last, not over the last slots' episodes); unfinished
        episodes carry over to the next rollout. Rows that are not valid belong to no
        episode and are skipped."""
        done = rollout.terminated | rollout.truncated
        valid = rollout.valid
        every_row = range(rollout.num_steps)
        finished: list[tuple[int, int, float]] = []
        for b, key in enumerate(rollout.slots):
            running = self.running_return.get(key, 0.0)
            for t in every_row if valid is None else np.flatnonzero(valid[:, b]).tolist():
                running += float(rollout.rewards[t, b])
                if done[t, b]:
                    finished.append((t, b, running))
                    running = 0.0
            self.running_return[key] = running
        return [ret for _, _, ret in sorted(finished)]

    def state_dict(self) -> dict[str, Any]:
        """Tensors, numbers and JSON strings only (loads with ``weights_only=True``);
        every tensor on the CPU, so the checkpoint loads on any device. Nothing of the
        slots' streams (unfinished episodes, reward-scaling returns, recurrent states):
        a resumed run has a new run id, so every slot's rows after it are a new
        registration's, a new stream (docs/protocol.md 5.6)."""
        scaler = self.reward_scaler.state() if self.reward_scaler else None
        return {
            "trainer": to_cpu(self.ppo.state_dict()),
            "version": self.version,
            "torch_rng": torch.get_rng_state(),
            "reward_scaler": json.dumps(scaler),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` output (a checkpoint), whatever device it
        was written on: tensors are copied onto this trainer's device (the optimiser's
        state follows its parameters)."""
        self.ppo.load_state_dict(state["trainer"])
        self.version = int(state["version"])
        self.running_return = {}  # (an older checkpoint's "running_reward" is not a stream)
        torch.set_rng_state(state["torch_rng"])
        scaler_state = json.loads(state.get("reward_scaler", "null"))
        if self.reward_scaler is not None and scaler_state:
            self.reward_scaler.load(scaler_state)
