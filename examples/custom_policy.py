"""A custom policy for ``--factory examples.custom_policy:make`` (docs/embedding.md,
"Custom policies").

A shared trunk with LayerNorm and a categorical head, for flat ``Box`` observations and
``Discrete`` actions. It follows the whole interface: ``act`` (sampling on the actors),
``evaluate_actions`` (the learner's PPO loss), ``value`` (bootstraps), and the optional
``update_obs_stats``, which keeps a running mean and variance in buffers so that they
travel to the actors with every weights broadcast::

    zmq-rl run --env CartPole-v1 --factory examples.custom_policy:make
"""

from __future__ import annotations

import gymnasium
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from zmq_rl.config import PolicyConfig


class LayerNormPolicy(nn.Module):
    """Actor-critic: trunk ``Linear -> LayerNorm -> tanh`` per hidden size, two heads."""

    def __init__(self, obs_dim: int, num_actions: int, hidden_sizes: tuple[int, ...]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = obs_dim
        for size in hidden_sizes:
            layers += [nn.Linear(width, size), nn.LayerNorm(size), nn.Tanh()]
            width = size
        self.trunk = nn.Sequential(*layers)
        self.logits = nn.Linear(width, num_actions)
        self.critic = nn.Linear(width, 1)
        # Buffers are part of state_dict, so the learner broadcasts them with the
        # parameters and every actor normalises with the learner's statistics.
        self.register_buffer("obs_mean", torch.zeros(obs_dim, dtype=torch.float64))
        self.register_buffer("obs_var", torch.ones(obs_dim, dtype=torch.float64))
        self.register_buffer("obs_count", torch.zeros((), dtype=torch.float64))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits ``[B, n]`` and values ``[B]``; ``obs`` arrives in the env's dtype."""
        x = obs.reshape(obs.shape[0], -1).double()
        x = ((x - self.obs_mean) / torch.sqrt(self.obs_var + 1e-8)).clamp(-10, 10).float()
        h = self.trunk(x)
        return self.logits(h), self.critic(h).squeeze(-1)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """``V(obs)``, ``[B]``."""
        return self(obs)[1]

    @torch.no_grad()
    def act(
        self,
        obs: torch.Tensor,
        generator: torch.Generator | None = None,
        deterministic: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample (or, ``deterministic``, take the mode): ``(action, log_prob, value)``."""
        logits, value = self(obs)
        log_p = F.log_softmax(logits, dim=-1)
        if deterministic:
            action = log_p.argmax(dim=-1)
        else:
            action = torch.multinomial(log_p.exp(), 1, generator=generator).squeeze(-1)
        return action, log_p.gather(-1, action[:, None]).squeeze(-1), value

    def evaluate_actions(
        self, obs: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(log_prob, entropy, value)`` of given actions, with grad (PPO's loss)."""
        logits, value = self(obs)
        log_p = F.log_softmax(logits, dim=-1)
        entropy = -(log_p.exp() * log_p).sum(dim=-1)
        return log_p.gather(-1, actions.long().reshape(-1, 1)).squeeze(-1), entropy, value

    def update_obs_stats(self, obs: np.ndarray) -> None:
        """Fold one rollout's observations ``[N, *obs_shape]`` into the running moments
        (Chan et al.'s parallel update); the learner calls this once per rollout."""
        batch = torch.from_numpy(np.asarray(obs, np.float64).reshape(-1, self.obs_mean.numel()))
        n, total = batch.shape[0], self.obs_count + batch.shape[0]
        delta = batch.mean(0) - self.obs_mean
        m2 = self.obs_var * self.obs_count + batch.var(0, unbiased=False) * n
        self.obs_mean += delta * n / total
        self.obs_var.copy_((m2 + delta**2 * self.obs_count * n / total) / total)
        self.obs_count.fill_(total)


def make(
    observation_space: gymnasium.Space, action_space: gymnasium.Space, cfg: PolicyConfig
) -> LayerNormPolicy:
    """The factory: the spaces and the run's ``[policy]`` config in, a module out.

    Only ``cfg.hidden_sizes`` is used here; a factory is free to read any field.
    """
    if not isinstance(observation_space, gymnasium.spaces.Box):
        raise ValueError(f"needs a Box observation space, got {observation_space!r}")  # noqa: TRY004
    if not isinstance(action_space, gymnasium.spaces.Discrete):
        raise ValueError(f"needs Discrete actions, got {action_space!r}")  # noqa: TRY004
    obs_dim = int(np.prod(observation_space.shape))
    return LayerNormPolicy(obs_dim, int(action_space.n), tuple(cfg.hidden_sizes))
