"""Actor-critics for structured spaces and recurrent actor-critics.

:func:`zmq_rl.rl.policy.build_policy` picks the network; this module holds the pieces
for everything beyond a flat ``Box`` observation with one ``Discrete`` or 1-D ``Box``
action (which keeps :class:`zmq_rl.rl.policy.ActorCritic`, unchanged):

* :class:`ObsEncoder` turns an observation *value* (:mod:`zmq_rl.wire.spaces`: one
  tensor, or a dict/tuple of tensors, leading dim ``[N]``) into one feature vector
  per row: every part is encoded and the parts are concatenated in spec order.
  ``Box`` parts are flattened (and, with ``normalize_obs``, standardised by running
  statistics kept as buffers -- float boxes only); image boxes (uint8, rank 2 or 3,
  both spatial sides >= 36) go through the Nature-DQN convolutions of
  :mod:`zmq_rl.rl.cnn`; ``Discrete`` parts are one-hot, ``MultiDiscrete`` parts one-hot
  per component (as Stable-Baselines3's ``preprocess_obs``), ``MultiBinary`` parts
  are flattened 0/1 floats. The MLP trunk(s) of :class:`~zmq_rl.config.PolicyConfig`
  then run on the concatenation (SB3's ``CombinedExtractor`` + ``MlpExtractor``).
* :class:`ActionHeads` holds one head per action component: ``Discrete`` one
  categorical, ``MultiDiscrete`` one categorical per component, ``MultiBinary`` one
  Bernoulli per bit, ``Box`` a diagonal Gaussian with a state-independent
  ``log_std`` (any shape, flattened). Log-probabilities and entropies are sums over
  the components (the components are independent given the observation).
  Categorical heads take an optional action mask (:mod:`zmq_rl.rl.masking`): with a
  Dict observation holding ``action_mask`` (PettingZoo's convention), the networks
  below mask their logits with it when they sample, take the mode, and evaluate
  log-probs and entropies. The mask is also encoded as an ordinary observation part.
* :class:`StructuredActorCritic` = encoder + trunk(s) + heads; the feed-forward
  policy interface (``act``, ``evaluate_actions``, ``value``).
* :class:`RecurrentActorCritic` = encoder + trunk + an LSTM or GRU cell + heads; the
  recurrent interface (``state_size``, ``initial_state``, ``act_recurrent``,
  ``evaluate_sequence``; docs/embedding.md "Custom policies").

Actions are the policy's (docs/protocol.md: 0-based indices, 0/1 bits, unclipped
floats); :func:`zmq_rl.wire.spaces.env_actions` turns them into the env's.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ..config import PolicyConfig
from ..wire.spaces import Value, batch_obs, map_value
from .cnn import nature_conv
from .layers import layer as _layer
from .layers import trunk as _trunk
from .masking import mask_key, masked_logits
from .normalization import merge_moments
from .numpy_nets import (
    IMAGE_MIN_SIDE,  # noqa: F401  (defined here before rl/numpy_nets.py)
    categorical_nvec,
    category_index,
    is_board_space,  # noqa: F401  (as IMAGE_MIN_SIDE)
    is_image_space,  # noqa: F401  (as IMAGE_MIN_SIDE)
    leaf_kind,
    leaf_paths,
    one_hot_layout,
    value_at,
)

__all__ = [
    "ActionHeads",
    "BoardPart",
    "FeedForwardActorCritic",
    "ObsEncoder",
    "RecurrentActorCritic",
    "StructuredActorCritic",
    "action_mask_of",
    "batch_obs",
    "leaf_paths",
    "obs_tensor",
    "value_at",
]

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
OBS_NORM_EPS = 1e-8
OBS_CLIP = 10.0


# --------------------------------------------------------------------------- values


def obs_tensor(value: Value) -> Any:
    """A numpy observation value as torch tensors (no copy where numpy allows):
    float64 leaves become float32, every other dtype is kept (the policy casts)."""

    def convert(array: np.ndarray) -> torch.Tensor:
        tensor = torch.from_numpy(np.ascontiguousarray(array))
        return tensor.float() if tensor.dtype == torch.float64 else tensor

    return map_value(convert, value)


# --------------------------------------------------------------------------- encoder


class _BoxPart(nn.Module):
    """A flattened box, standardised by running statistics when asked (float boxes)."""

    def __init__(self, space: gymnasium.spaces.Box, normalize: bool) -> None:
        super().__init__()
        self.size = int(np.prod(space.shape, dtype=np.int64))
        self.normalize = bool(normalize) and np.issubdtype(space.dtype, np.floating)
        if self.normalize:
            self.register_buffer("obs_mean", torch.zeros(self.size, dtype=torch.float64))
            self.register_buffer("obs_var", torch.ones(self.size, dtype=torch.float64))
            self.register_buffer("obs_count", torch.zeros((), dtype=torch.float64))

    @property
    def out_features(self) -> int:
        return self.size

    def forward(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        flat = x.reshape(x.shape[0], -1)
        if flat.shape[1] != self.size:
            raise ValueError(f"box part of shape {tuple(x.shape)} is not [N, {self.size}]")
        flat = flat.to(dtype)
        if self.normalize:
            std = torch.sqrt(self.obs_var + OBS_NORM_EPS).to(dtype)
            flat = ((flat - self.obs_mean.to(dtype)) / std).clamp(-OBS_CLIP, OBS_CLIP)
        return flat

    @torch.no_grad()
    def update_stats(self, batch: np.ndarray) -> None:
        if not self.normalize:
            return
        flat = np.asarray(batch, np.float64).reshape(-1, self.size)
        mean, var, count = merge_moments(
            self.obs_mean.cpu().numpy(),
            self.obs_var.cpu().numpy(),
            float(self.obs_count),
            flat.mean(axis=0),
            flat.var(axis=0),
            flat.shape[0],
        )
        self.obs_mean.copy_(torch.from_numpy(mean))
        self.obs_var.copy_(torch.from_numpy(var))
        self.obs_count.fill_(count)


class _OneHotPart(nn.Module):
    """Discrete (one component) or MultiDiscrete (one per component) indices, one-hot."""

    def __init__(self, nvec: np.ndarray, start: np.ndarray) -> None:
        super().__init__()
        nvec = np.asarray(nvec, np.int64).reshape(-1)
        self.nvec = [int(n) for n in nvec]
        self.register_buffer(
            "start", torch.as_tensor(np.asarray(start, np.int64).reshape(-1)), persistent=False
        )
        self.register_buffer("last", torch.as_tensor(nvec - 1), persistent=False)
        self.register_buffer(
            "offsets",
            torch.as_tensor(np.concatenate([[0], np.cumsum(nvec)[:-1]]), dtype=torch.int64),
            persistent=False,
        )
        self.total = int(nvec.sum())

    @property
    def out_features(self) -> int:
        return self.total

    def forward(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        index = x.reshape(x.shape[0], -1).long() - self.start
        index = torch.minimum(index.clamp(min=0), self.last) + self.offsets
        out = torch.zeros(x.shape[0], self.total, dtype=dtype, device=x.device)
        return out.scatter_(1, index, 1.0)

    def update_stats(self, batch: np.ndarray) -> None:
        pass


class _BinaryPart(nn.Module):
    def __init__(self, space: gymnasium.spaces.MultiBinary) -> None:
        super().__init__()
        self.size = int(np.prod(space.shape, dtype=np.int64))

    @property
    def out_features(self) -> int:
        return self.size

    def forward(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return x.reshape(x.shape[0], -1).to(dtype)

    def update_stats(self, batch: np.ndarray) -> None:
        pass


class _ImagePart(nn.Module):
    """Nature-DQN convolutions + a 512-unit layer (as :class:`zmq_rl.rl.cnn.NatureCNN`)."""

    def __init__(self, space: gymnasium.spaces.Box, ortho: bool) -> None:
        super().__init__()
        shape = tuple(int(d) for d in space.shape)
        self.channels_last = len(shape) == 3 and shape[-1] < shape[0]
        if len(shape) == 2:
            channels, height, width = 1, *shape
        elif self.channels_last:
            height, width, channels = shape
        else:
            channels, height, width = shape
        self.conv = nature_conv(channels)
        with torch.no_grad():
            flat = int(self.conv(torch.zeros(1, channels, height, width)).shape[1])
        self.fc = nn.Linear(flat, 512)
        if ortho:
            for layer in [*self.conv, self.fc]:
                if isinstance(layer, (nn.Conv2d, nn.Linear)):
                    nn.init.orthogonal_(layer.weight, gain=math.sqrt(2.0))
                    nn.init.zeros_(layer.bias)

    @property
    def out_features(self) -> int:
        return 512

    def forward(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        x = x.to(dtype) * (1.0 / 255.0)
        if x.dim() == 3:
            x = x.unsqueeze(1)
        elif self.channels_last:
            x = x.permute(0, 3, 1, 2)
        return F.relu(self.fc(self.conv(x)))

    def update_stats(self, batch: np.ndarray) -> None:
        pass


class BoardPart(nn.Module):
    """A board game's grid (``[H, W, C]`` planes, channels last, as PettingZoo's
    classic games give them) through one layer of ``filters`` convolutions over every
    window of ``min(4, H, W)`` cells square (no padding), ReLU, flattened: every line
    of four cells on the board lies in one window, so a filter can see a threat
    (three of one colour and a free cell) wherever it is. :func:`zmq_rl.rl.boards.board_cnn`
    uses it; with ``gravity`` (:func:`zmq_rl.rl.boards.gravity_board_cnn`) the
    convolutions also see :func:`landing_cells` as one more plane."""

    def __init__(
        self, space: gymnasium.spaces.Box, ortho: bool, filters: int = 64, gravity: bool = False
    ) -> None:
        super().__init__()
        height, width, channels = (int(d) for d in space.shape)
        kernel = min(4, height, width)
        self.gravity = gravity
        self.conv = nn.Conv2d(channels + gravity, filters, kernel)
        self._out = filters * (height - kernel + 1) * (width - kernel + 1)
        if ortho:
            nn.init.orthogonal_(self.conv.weight, gain=math.sqrt(2.0))
            nn.init.zeros_(self.conv.bias)

    @property
    def out_features(self) -> int:
        return self._out

    def forward(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        x = x.to(dtype).permute(0, 3, 1, 2)
        if self.gravity:
            x = torch.cat([x, landing_cells(x)], dim=1)
        return F.relu(self.conv(x)).flatten(1)

    def update_stats(self, batch: np.ndarray) -> None:
        pass


def landing_cells(planes: torch.Tensor) -> torch.Tensor:
    """``[N, 1, H, W]``: 1 at the cells a piece dropped in its column lands on (free,
    with the bottom row or a piece below), for ``planes`` ``[N, C, H, W]`` of a drop
    game (connect four; row 0 the top, as PettingZoo's). A line of four is a threat
    only where its free cell is one of these, and no 4 x 4 window holds a diagonal
    and the cell under its lowest cell (:func:`zmq_rl.rl.boards.gravity_board_cnn`)."""
    occupied = planes.sum(dim=1, keepdim=True) > 0
    below = torch.ones_like(occupied)
    below[:, :, :-1, :] = occupied[:, :, 1:, :]
    return (~occupied & below).to(planes.dtype)


class ObsEncoder(nn.Module):
    """One feature vector ``[N, out_features]`` per row of an observation value.

    The parts live in ``self.parts`` in spec order (``parts.0``, ``parts.1``, ... in
    the ``state_dict``), so two processes that build from equal spaces exchange
    weights and normalisation statistics. With ``boards``, board parts
    (:func:`is_board_space`) go through convolutions (:func:`zmq_rl.rl.boards.board_cnn`)
    instead of being flattened; ``boards="gravity"`` adds the landing plane of a drop
    game (:func:`zmq_rl.rl.boards.gravity_board_cnn`)."""

    def __init__(
        self, space: gymnasium.Space, cfg: PolicyConfig, boards: bool | str = False
    ) -> None:
        super().__init__()
        self.paths: list[tuple] = []
        parts: list[nn.Module] = []
        for path, leaf in leaf_paths(space):
            kind = leaf_kind(leaf, boards)
            if kind == "image":
                part: nn.Module = _ImagePart(leaf, cfg.ortho_init)
            elif kind == "board":
                part = BoardPart(leaf, cfg.ortho_init, gravity=boards == "gravity")
            elif kind == "box":
                part = _BoxPart(leaf, cfg.normalize_obs)
            elif kind == "one_hot":
                part = _OneHotPart(*one_hot_layout(leaf))
            else:
                part = _BinaryPart(leaf)
            self.paths.append(path)
            parts.append(part)
        self.parts = nn.ModuleList(parts)
        self.out_features = sum(p.out_features for p in parts)

    def forward(self, obs: Any, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``obs``: a value of tensors with leading dim ``[N]`` -> ``[N, out_features]``."""
        features = [
            part(value_at(obs, path), dtype)
            for path, part in zip(self.paths, self.parts, strict=True)
        ]
        return features[0] if len(features) == 1 else torch.cat(features, dim=-1)

    def update_obs_stats(self, obs: Value) -> None:
        """Fold a batch of numpy observations (any leading dims) into the running
        statistics of the normalised (float box) parts."""
        for path, part in zip(self.paths, self.parts, strict=True):
            part.update_stats(value_at(obs, path))


# --------------------------------------------------------------------------- heads


class ActionHeads(nn.Module):
    """The distribution of one action space from a flat parameter vector per row.

    ``num_params`` parameters per row: logits of every category (Discrete /
    MultiDiscrete), one logit per bit (MultiBinary), or the Gaussian means (Box; the
    ``log_std`` is a parameter of this module). Log-probs and entropies are sums over
    components.
    """

    def __init__(self, space: gymnasium.Space, cfg: PolicyConfig) -> None:
        super().__init__()
        self.shape = tuple(int(d) for d in getattr(space, "shape", None) or ())
        if isinstance(space, (gymnasium.spaces.Discrete, gymnasium.spaces.MultiDiscrete)):
            self.kind = "categorical"
            nvec = categorical_nvec(space)
            index, valid = category_index(nvec)
            self.register_buffer("index", torch.from_numpy(index), persistent=False)
            self.register_buffer("valid", torch.from_numpy(valid), persistent=False)
            self.padded = not bool(valid.all())
            self.num_components = len(nvec)
            self.num_params = int(nvec.sum())
            self.action_dtype = torch.int64
        elif isinstance(space, gymnasium.spaces.MultiBinary):
            self.kind = "bernoulli"
            self.num_params = int(np.prod(self.shape, dtype=np.int64))
            self.action_dtype = torch.int8
        elif isinstance(space, gymnasium.spaces.Box):
            self.kind = "gaussian"
            self.num_params = int(np.prod(self.shape, dtype=np.int64))
            self.log_std = nn.Parameter(torch.full((self.num_params,), float(cfg.log_std_init)))
            self.action_dtype = torch.float32
        else:
            raise ValueError(
                f"unsupported action space {space!r}: actions must be Discrete, "
                "MultiDiscrete, MultiBinary or Box"
            )

    def _log_softmax(self, params: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """``[N, K, widest]`` log-probabilities; padding is ``-inf``; with an action
        ``mask`` ``[N, num_params]`` (0 = masked) the masked logits are
        :func:`~zmq_rl.rl.masking.masked_logits` first, so the softmax renormalises
        over the allowed actions."""
        if mask is not None:
            params = masked_logits(params, mask)
        logits = params[:, self.index]
        if self.padded:
            logits = logits.masked_fill(~self.valid, -math.inf)
        return F.log_softmax(logits, dim=-1)

    def _allowed(self, mask: torch.Tensor) -> torch.Tensor:
        """The mask ``[N, num_params]`` laid out as the logits: ``[N, K, widest]`` bool,
        False where masked or padding."""
        allowed = (mask.reshape(mask.shape[0], -1) != 0)[:, self.index]
        return allowed & self.valid if self.padded else allowed

    def _out(self, flat: torch.Tensor) -> torch.Tensor:
        return flat.reshape(flat.shape[0], *self.shape)

    def sample(
        self,
        params: torch.Tensor,
        generator: torch.Generator | None = None,
        deterministic: bool = False,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(action ``[N, *shape]``, log_prob ``[N]``) sampled from (or the mode of) the
        distribution with ``params`` ``[N, num_params]``. ``mask`` ``[N, num_params]``
        (categorical heads only; 0 = masked) restricts sampling and the mode to the
        allowed actions; each row needs one allowed action per component."""
        if self.kind == "categorical":
            log_p = self._log_softmax(params, mask)
            if deterministic:
                scores = log_p
            else:  # Gumbel-max, as ActorCritic.act
                e = torch.empty_like(log_p).exponential_(generator=generator)
                scores = log_p - e.log()
            if mask is not None:  # exact even where noise could rival finfo.min
                scores = scores.masked_fill(~self._allowed(mask), -math.inf)
            action = scores.argmax(dim=-1)
            log_prob = log_p.gather(-1, action.unsqueeze(-1)).squeeze(-1).sum(dim=-1)
            return self._out(action), log_prob
        if self.kind == "bernoulli":
            if deterministic:
                bits = params > 0
            else:
                u = torch.rand(params.shape, generator=generator, device=params.device)
                bits = u < torch.sigmoid(params)
            log_prob = -F.binary_cross_entropy_with_logits(
                params, bits.to(params.dtype), reduction="none"
            ).sum(dim=-1)
            return self._out(bits.to(torch.int8)), log_prob
        log_norm = self.log_std.sum() + _LOG_SQRT_2PI * self.num_params
        if deterministic:
            return self._out(params.clone()), (-log_norm).expand(params.shape[0]).clone()
        noise = torch.randn(
            params.shape, generator=generator, dtype=params.dtype, device=params.device
        )
        action = torch.addcmul(params, self.log_std.exp(), noise)
        log_prob = noise.square().sum(dim=-1).mul(-0.5).sub(log_norm)
        return self._out(action), log_prob

    def evaluate(
        self, params: torch.Tensor, actions: torch.Tensor, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(log_prob ``[N]``, entropy ``[N]``) of given policy actions, with grad; with
        ``mask`` (as :meth:`sample`) both are of the distribution renormalised over the
        allowed actions, and masked actions add nothing to the entropy."""
        n = params.shape[0]
        if self.kind == "categorical":
            log_p = self._log_softmax(params, mask)
            index = actions.reshape(n, -1, 1).long()
            log_prob = log_p.gather(-1, index).squeeze(-1).sum(dim=-1)
            # p log p over the allowed categories only. Masked and padding entries
            # are zeroed *before* the product (exp(0) * 0 = 0): after it, their
            # backward would be 0 * log 0 = NaN (padding's log-prob is -inf).
            if mask is not None:
                log_p_kept = log_p.masked_fill(~self._allowed(mask), 0.0)
            elif self.padded:
                log_p_kept = log_p.masked_fill(~self.valid, 0.0)
            else:
                log_p_kept = log_p
            p_log_p = log_p_kept.exp() * log_p_kept
            return log_prob, -p_log_p.sum(dim=(-1, -2))
        if self.kind == "bernoulli":
            bits = actions.reshape(n, -1).to(params.dtype)
            log_prob = -F.binary_cross_entropy_with_logits(params, bits, reduction="none")
            p = torch.sigmoid(params)
            entropy = F.binary_cross_entropy_with_logits(params, p, reduction="none")
            return log_prob.sum(dim=-1), entropy.sum(dim=-1)
        actions = actions.reshape(n, -1).to(params.dtype)
        log_std = self.log_std.expand_as(params)
        z = (actions - params) * torch.exp(-log_std)
        log_prob = (-0.5 * z.square() - log_std - _LOG_SQRT_2PI).sum(dim=-1)
        entropy = (0.5 + _LOG_SQRT_2PI + log_std).sum(dim=-1)
        return log_prob, entropy


# --------------------------------------------------------------------------- networks


def action_mask_of(obs: Any, key: str | None) -> torch.Tensor | None:
    """The ``action_mask`` tensor of an observation value (a dict of tensors), or None
    for a policy without one (``key`` None, from :func:`~zmq_rl.rl.masking.mask_key`).
    The mask is read from the observation itself, so the actor that samples and the
    learner that evaluates the stored row see the same one."""
    return None if key is None else obs[key]


class FeedForwardActorCritic(nn.Module):
    """What every feed-forward network of this package shares: :meth:`act` and
    :meth:`evaluate_actions` from ``forward(obs)`` -> (distribution parameters
    ``[N, num_params]``, value ``[N]``) through ``self.heads`` (:class:`ActionHeads`),
    masked by the observation's ``self.mask_key`` entry (if any)."""

    state_size = 0
    heads: ActionHeads
    mask_key: str | None

    @torch.no_grad()
    def act(
        self,
        obs: Any,
        generator: torch.Generator | None = None,
        deterministic: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample (or take the mode of) actions: (action, log_prob ``[N]``, value ``[N]``);
        masked actions (the observation's ``action_mask``, if any) are never chosen."""
        params, value = self(obs)
        mask = action_mask_of(obs, self.mask_key)
        action, log_prob = self.heads.sample(params, generator, deterministic, mask)
        return action, log_prob, value

    def evaluate_actions(
        self, obs: Any, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(log_prob, entropy, value) of given actions, ``[N]`` each, with grad;
        log-prob and entropy summed over the action components, of the distribution
        masked by the observation's ``action_mask`` (if any), as :meth:`act` sampled."""
        params, value = self(obs)
        mask = action_mask_of(obs, self.mask_key)
        log_prob, entropy = self.heads.evaluate(params, actions, mask)
        return log_prob, entropy, value


class StructuredActorCritic(FeedForwardActorCritic):
    """A feed-forward actor-critic for any supported observation and action space.

    ``obs`` arguments are observation values of tensors with leading dim ``[N]``
    (one tensor for a leaf space, a dict / tuple of tensors for Dict / Tuple spaces).
    Actions: int64 ``[N]`` (Discrete), int64 ``[N, *nvec.shape]`` (MultiDiscrete),
    int8 ``[N, *shape]`` (MultiBinary, 0/1) or float32 ``[N, *shape]`` (Box, unclipped).
    """

    def __init__(
        self,
        observation_space: gymnasium.Space,
        action_space: gymnasium.Space,
        cfg: PolicyConfig,
        boards: bool | str = False,
    ) -> None:
        super().__init__()
        cfg.validate()
        self.encoder = ObsEncoder(observation_space, cfg, boards)
        self.heads = ActionHeads(action_space, cfg)
        self.mask_key = mask_key(observation_space, action_space)
        self.shared_trunk = bool(cfg.shared_trunk)
        width = cfg.hidden_sizes[-1]
        if self.shared_trunk:
            self.trunk = _trunk(self.encoder.out_features, cfg)
        else:
            self.actor_trunk = _trunk(self.encoder.out_features, cfg)
            self.critic_trunk = _trunk(self.encoder.out_features, cfg)
        self.policy_head = _layer(width, self.heads.num_params, 0.01, cfg.ortho_init)
        self.value_head = _layer(width, 1, 1.0, cfg.ortho_init)

    def update_obs_stats(self, obs: Value) -> None:
        """Fold numpy observations (a value, any leading dims) into the float box
        parts' running statistics (no-op without ``normalize_obs``)."""
        self.encoder.update_obs_stats(obs)

    def forward(self, obs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """(distribution parameters ``[N, num_params]``, value ``[N]``)."""
        x = self.encoder(obs, self.value_head.weight.dtype)
        if self.shared_trunk:
            h = self.trunk(x)
            return self.policy_head(h), self.value_head(h).squeeze(-1)
        return (
            self.policy_head(self.actor_trunk(x)),
            self.value_head(self.critic_trunk(x)).squeeze(-1),
        )

    def value(self, obs: Any) -> torch.Tensor:
        """State values ``V(obs)``, ``[N]``."""
        x = self.encoder(obs, self.value_head.weight.dtype)
        return self.value_head((self.trunk if self.shared_trunk else self.critic_trunk)(x)).squeeze(
            -1
        )


class RecurrentActorCritic(nn.Module):
    """encoder -> MLP trunk -> LSTM / GRU cell -> policy and value heads.

    The cell's width is the last of ``hidden_sizes``; its state travels as one float
    vector per slot of :attr:`state_size` floats (LSTM: ``[h, c]``, ``2 * width``;
    GRU: ``h``, ``width``). The interface (docs/embedding.md, "Custom policies"):

    * ``initial_state(n)``: zeros ``[n, state_size]`` (an episode's first state);
    * ``act_recurrent(obs, state, generator, deterministic)``: act on ``[N]`` rows
      from ``state`` ``[N, S]``: (action, log_prob, value, next_state);
    * ``evaluate_sequence(obs, actions, state, lengths)``: the learner's unroll of
      ``N`` padded sequences of ``[L, N]`` time-major rows from ``state`` ``[N, S]``:
      (log_prob, entropy, value ``[L, N]``, the state after each sequence's last
      real row ``[N, S]``). The learner cuts sequences where an episode begins, so a
      sequence never crosses an episode boundary.
    """

    def __init__(
        self,
        observation_space: gymnasium.Space,
        action_space: gymnasium.Space,
        cfg: PolicyConfig,
    ) -> None:
        super().__init__()
        cfg.validate()
        if cfg.policy_type not in ("lstm", "gru"):
            raise ValueError(f"policy_type {cfg.policy_type!r} is not recurrent")
        self.cell_type = cfg.policy_type
        self.encoder = ObsEncoder(observation_space, cfg)
        self.heads = ActionHeads(action_space, cfg)
        self.mask_key = mask_key(observation_space, action_space)
        self.trunk = _trunk(self.encoder.out_features, cfg)
        self.width = width = cfg.hidden_sizes[-1]
        if self.cell_type == "lstm":
            self.rnn: nn.Module = nn.LSTM(width, width)
            self.state_size = 2 * width
        else:
            self.rnn = nn.GRU(width, width)
            self.state_size = width
        if cfg.ortho_init:
            for name, param in self.rnn.named_parameters():
                if "weight" in name:
                    nn.init.orthogonal_(param, 1.0)
                else:
                    nn.init.zeros_(param)
        self.policy_head = _layer(width, self.heads.num_params, 0.01, cfg.ortho_init)
        self.value_head = _layer(width, 1, 1.0, cfg.ortho_init)

    def update_obs_stats(self, obs: Value) -> None:
        """As :meth:`StructuredActorCritic.update_obs_stats`."""
        self.encoder.update_obs_stats(obs)

    def initial_state(self, batch: int) -> torch.Tensor:
        """Zeros ``[batch, state_size]``: the state an episode starts from."""
        return torch.zeros(batch, self.state_size, device=self.value_head.weight.device)

    def features(self, obs: Any) -> torch.Tensor:
        """The trunk's features of an observation batch, ``[N, width]`` (the cell's input)."""
        return self.trunk(self.encoder(obs, self.value_head.weight.dtype))

    def unroll(
        self, x: torch.Tensor, state: torch.Tensor, lengths: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the cell over ``x`` ``[L, N, width]`` from ``state`` ``[N, S]`` in one
        fused call: (outputs ``[L, N, width]``, the state after row ``lengths[n] - 1``
        of each sequence ``[N, S]``; rows past a sequence's length are padding)."""
        if self.cell_type == "lstm":
            hx: Any = (
                state[:, : self.width].unsqueeze(0).contiguous(),
                state[:, self.width :].unsqueeze(0).contiguous(),
            )
        else:
            hx = state.unsqueeze(0).contiguous()
        length = x.shape[0]
        if lengths is not None and bool((lengths != length).any()):
            packed = nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), enforce_sorted=False)
            out, last = self.rnn(packed, hx)
            out, _ = nn.utils.rnn.pad_packed_sequence(out, total_length=length)
        else:
            out, last = self.rnn(x, hx)
        final = torch.cat((last[0][0], last[1][0]), dim=-1) if self.cell_type == "lstm" else last[0]
        return out, final

    def _check_state(self, state: torch.Tensor, n: int) -> torch.Tensor:
        if tuple(state.shape) != (n, self.state_size):
            raise ValueError(f"state of shape {tuple(state.shape)} is not [{n}, {self.state_size}]")
        return state.to(self.value_head.weight.dtype)

    @torch.no_grad()
    def act_recurrent(
        self,
        obs: Any,
        state: torch.Tensor,
        generator: torch.Generator | None = None,
        deterministic: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Act on ``N`` rows from ``state`` ``[N, S]`` (the caller zeroes the rows of
        slots whose episode just began): (action, log_prob, value, next_state)."""
        x = self.features(obs)
        h, next_state = self.unroll(x.unsqueeze(0), self._check_state(state, x.shape[0]))
        h = h[0]
        mask = action_mask_of(obs, self.mask_key)
        action, log_prob = self.heads.sample(self.policy_head(h), generator, deterministic, mask)
        return action, log_prob, self.value_head(h).squeeze(-1), next_state

    def evaluate_sequence(
        self,
        obs: Any,
        actions: torch.Tensor,
        state: torch.Tensor,
        lengths: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Unroll ``N`` sequences of up to ``L`` time-major rows (truncated BPTT:
        gradients flow through the state from row 0 on, and stop at ``state``).

        ``obs``: value with leaves ``[L, N, ...]``; ``actions`` ``[L, N, ...]``;
        ``state`` ``[N, S]`` the state row 0 acts from; ``lengths`` ``[N]`` int64 in
        ``[1, L]``, the real rows of each sequence (the rest is padding, whose outputs
        are ignored). Returns (log_prob, entropy, value) ``[L, N]`` and the state
        after each sequence's last real row ``[N, S]``."""
        length, n = actions.shape[:2]
        flat = map_value(lambda x: x.reshape(length * n, *x.shape[2:]), obs)
        x = self.features(flat).reshape(length, n, -1)
        h, final = self.unroll(x, self._check_state(state, n), lengths)
        h = h.reshape(length * n, -1)
        flat_actions = actions.reshape(length * n, *actions.shape[2:])
        mask = action_mask_of(flat, self.mask_key)
        log_prob, entropy = self.heads.evaluate(self.policy_head(h), flat_actions, mask)
        value = self.value_head(h).squeeze(-1)
        return (
            log_prob.reshape(length, n),
            entropy.reshape(length, n),
            value.reshape(length, n),
            final,
        )
