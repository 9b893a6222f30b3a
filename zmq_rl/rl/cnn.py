"""A Nature-DQN convolutional actor-critic for image observations (Atari frames).

Use it with ``--factory zmq_rl.rl.cnn:nature_cnn`` (any process builds the same network
from the spaces, as for the built-in MLP)::

    zmq-rl run --env zmq_rl.envs:AtariPong-v0 --factory zmq_rl.rl.cnn:nature_cnn \\
        --num-steps 128 --num-envs 8 --num-epochs 4 --minibatch-size 256 \\
        --learning-rate 2.5e-4 --gamma 0.99 --gae-lambda 0.95 --ent-coef 0.01 \\
        --clip-range 0.1 --anneal-clip-range --vf-coef 0.5 --max-grad-norm 0.5

The architecture is Mnih et al. (2015) as in CleanRL's ``ppo_atari.py`` and SB3's
``NatureCNN``: pixels scaled by 1/255, conv 32 8x8 stride 4, conv 64 4x4 stride 2,
conv 64 3x3 stride 1, a 512-unit linear layer (ReLU after each), shared by a
categorical policy head and a value head; orthogonal weights (gain sqrt(2) in the
trunk, 0.01 on the policy head, 1 on the value head) and zero biases.

Observations are ``[C, H, W]`` (channels first, e.g. the ``(4, 84, 84)`` frame
stacks of :mod:`zmq_rl.envs`), ``[H, W, C]`` (channels last: permuted here) or
``[H, W]`` (one channel). Batches may arrive as uint8 (the actors' frames) or as
float (the learner's batches and evaluation cast them): both are scaled by 1/255
when the observation space is uint8, so the two paths compute the same thing. The
policy interface is :class:`zmq_rl.rl.policy.ActorCritic`'s: ``act`` samples without
``torch.distributions`` (Gumbel-max), ``evaluate_actions`` and ``value``.
"""

from __future__ import annotations

import math

import gymnasium
import torch
from torch import nn
from torch.nn import functional as F

from zmq_rl.config import PolicyConfig
from zmq_rl.rl.numpy_nets import check_cnn_spaces, nature_settings

__all__ = ["NatureCNN", "minatar_cnn", "minatar_conv", "nature_cnn"]


def _init(layer: nn.Module, gain: float) -> nn.Module:
    nn.init.orthogonal_(layer.weight, gain=gain)
    nn.init.zeros_(layer.bias)
    return layer


def nature_conv(channels: int) -> nn.Sequential:
    """The convolutional torso of the Nature DQN (Mnih et al. 2015): three conv layers
    with ReLU, flattened; shared by :func:`nature_cnn` and the structured encoder."""
    return nn.Sequential(
        nn.Conv2d(channels, 32, 8, stride=4),
        nn.ReLU(),
        nn.Conv2d(32, 64, 4, stride=2),
        nn.ReLU(),
        nn.Conv2d(64, 64, 3, stride=1),
        nn.ReLU(),
        nn.Flatten(),
    )


class NatureCNN(nn.Module):
    """Nature-DQN trunk with a categorical policy head and a value head.

    Args:
      obs_shape: the observation space's shape, ``(C, H, W)``, ``(H, W, C)`` or ``(H, W)``.
      num_actions: size of the ``Discrete`` action space.
      channels_last: whether ``obs_shape`` is ``(H, W, C)``.
      scale: multiplier of the raw pixels (1/255 for uint8 frames).
      ortho_init: orthogonal initialisation (as :class:`~zmq_rl.config.PolicyConfig`).
      hidden: width of the linear layer after the convolutions (512).
      conv: the convolutional torso (default :func:`nature_conv`; ``[B, C, H, W]`` in,
        flat features out).
    """

    def __init__(
        self,
        obs_shape: tuple[int, ...],
        num_actions: int,
        *,
        channels_last: bool = False,
        scale: float = 1.0 / 255.0,
        ortho_init: bool = True,
        hidden: int = 512,
        conv: nn.Sequential | None = None,
    ) -> None:
        super().__init__()
        if len(obs_shape) == 2:
            channels, height, width = 1, *obs_shape
        elif channels_last:
            height, width, channels = obs_shape
        else:
            channels, height, width = obs_shape
        self.obs_shape = tuple(int(d) for d in obs_shape)
        self.channels_last = bool(channels_last) and len(obs_shape) == 3
        self.scale = float(scale)
        self.discrete = True
        self.action_dim = int(num_actions)
        self.conv = conv if conv is not None else nature_conv(channels)
        with torch.no_grad():
            flat = int(self.conv(torch.zeros(1, channels, height, width)).shape[1])
        self.fc = nn.Linear(flat, hidden)
        self.policy_head = nn.Linear(hidden, self.action_dim)
        self.value_head = nn.Linear(hidden, 1)
        if ortho_init:
            for layer in self.conv:
                if isinstance(layer, nn.Conv2d):
                    _init(layer, math.sqrt(2.0))
            _init(self.fc, math.sqrt(2.0))
            _init(self.policy_head, 0.01)
            _init(self.value_head, 1.0)

    def _features(self, obs: torch.Tensor) -> torch.Tensor:
        """``[B, *obs_shape]`` (uint8 or float) -> ``[B, hidden]``."""
        if tuple(obs.shape[1:]) != self.obs_shape:
            raise ValueError(
                f"observation batch of shape {tuple(obs.shape)} is not [B, {self.obs_shape}]"
            )
        dtype = self.fc.weight.dtype
        x = obs.to(dtype) * self.scale  # one fused cast+scale pass; uint8 stays uint8 until here
        if x.dim() == 3:
            x = x.unsqueeze(1)
        elif self.channels_last:
            x = x.permute(0, 3, 1, 2)
        return F.relu(self.fc(self.conv(x)))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits ``[B, n]``, value ``[B]``) from one pass through the shared trunk."""
        h = self._features(obs)
        return self.policy_head(h), self.value_head(h).squeeze(-1)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """State values ``V(obs)``, ``[B]``."""
        return self.value_head(self._features(obs)).squeeze(-1)

    @torch.no_grad()
    def act(
        self,
        obs: torch.Tensor,
        generator: torch.Generator | None = None,
        deterministic: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(action int64 ``[B]``, log_prob ``[B]``, value ``[B]``); Gumbel-max sampling
        with ``generator``, or the argmax when ``deterministic``."""
        logits, value = self(obs)
        log_p = F.log_softmax(logits, dim=-1)
        if deterministic:
            action = logits.argmax(dim=-1)
        else:
            e = torch.empty_like(logits).exponential_(generator=generator)
            action = (logits - e.log()).argmax(dim=-1)
        return action, log_p.gather(-1, action.unsqueeze(-1)).squeeze(-1), value

    def evaluate_actions(
        self, obs: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(log_prob, entropy, value) of ``actions`` ``[B]``, with grad."""
        logits, value = self(obs)
        log_p = F.log_softmax(logits, dim=-1)
        log_prob = log_p.gather(-1, actions.reshape(-1, 1).long()).squeeze(-1)
        entropy = -(log_p.exp() * log_p).sum(dim=-1)
        return log_prob, entropy, value


def nature_cnn(
    observation_space: gymnasium.Space, action_space: gymnasium.Space, cfg: PolicyConfig
) -> NatureCNN:
    """The ``--factory zmq_rl.rl.cnn:nature_cnn`` entry point.

    ``observation_space`` must be an image ``Box`` of rank 2 or 3; a rank-3 space
    whose last axis is the smallest (``(84, 84, 4)``) is channels-last, otherwise
    channels-first. uint8 spaces are scaled by 1/255, others are used as they are.
    ``action_space`` must be ``Discrete`` (starting at 0). Of ``cfg`` only
    ``ortho_init`` applies (the MLP settings do not; ``normalize_obs`` is refused:
    pixels are scaled, not standardised).
    """
    channels_last, scale = nature_settings(observation_space, action_space, cfg)
    shape = tuple(int(d) for d in observation_space.shape)
    return NatureCNN(
        shape,
        int(action_space.n),
        channels_last=channels_last,
        scale=scale,
        ortho_init=cfg.ortho_init,
    )


def minatar_conv(channels: int) -> nn.Sequential:
    """The MinAtar network's torso (Young & Tian 2019, section 4: one conv layer of 16
    3x3 filters, stride 1, ReLU), flattened: 10x10 frames are too small for the
    Nature torso's 8x8 stride-4 first layer."""
    return nn.Sequential(nn.Conv2d(channels, 16, 3, stride=1), nn.ReLU(), nn.Flatten())


def minatar_cnn(
    observation_space: gymnasium.Space, action_space: gymnasium.Space, cfg: PolicyConfig
) -> NatureCNN:
    """The ``--factory zmq_rl.rl.cnn:minatar_cnn`` entry point: MinAtar's network (Young &
    Tian 2019: conv 16 3x3 stride 1, a 128-unit layer) with a categorical policy head
    and a value head, for ``[C, H, W]`` frames of 0/1 cells (``zmq_rl.envs``'s
    ``MinAtar<Game>-v1``), used as they are (no 1/255 scaling). ``action_space`` must
    be ``Discrete``; of ``cfg`` only ``ortho_init`` applies."""
    check_cnn_spaces("minatar_cnn", observation_space, action_space, (3,), "(C, H, W)")
    shape = tuple(int(d) for d in observation_space.shape)
    return NatureCNN(
        shape,
        int(action_space.n),
        scale=1.0,
        ortho_init=cfg.ortho_init,
        hidden=128,
        conv=minatar_conv(shape[0]),
    )
