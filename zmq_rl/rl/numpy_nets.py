"""Every shipped network on an actor, in numpy alone: no torch in the process.

:mod:`zmq_rl.rl.numpy_mlp` holds the plain MLP; this module holds the others, built
from the spaces and the :class:`~zmq_rl.config.PolicyConfig` exactly as
:func:`~zmq_rl.rl.policy.build_policy` builds their torch modules:

* the **structured** actor-critic (:class:`~zmq_rl.rl.networks.StructuredActorCritic`,
  docs/protocol.md section 6.4): Dict / Tuple observations flattened leaf by leaf in
  spec order (float boxes flattened and normalised, integer boxes flattened,
  Discrete / MultiDiscrete one-hot, MultiBinary 0/1, uint8 images through the
  Nature-DQN convolutions), masked categorical heads, MultiDiscrete, MultiBinary and
  Box heads;
* the **recurrent** one (:class:`~zmq_rl.rl.networks.RecurrentActorCritic`): the same
  encoder and a trunk, then an LSTM or GRU cell whose state goes in and comes out;
* the CNNs of the pixel presets (``zmq_rl.rl.cnn:minatar_cnn``, ``:nature_cnn``) and
  the board networks of the multi-agent games (``zmq_rl.rl.boards:board_cnn``,
  ``:gravity_board_cnn``, ``:drop_game_cnn``).

:func:`numpy_network` builds the one a run uses (a :class:`~zmq_rl.rl.numpy_mlp.NumpyMLP`
for the plain MLP), or returns None for a custom ``factory``, which only torch can
build (:func:`needs_torch_line` words the refusal on a host without torch). Each
network's :attr:`~NumpyNetwork.layout` is its torch module's ``state_dict`` (names,
shapes, dtypes, in order), so broadcast weights are refused exactly as the module
refuses them; :meth:`~NumpyNetwork.act` samples as the module's ``act`` does
(Gumbel-max for categorical heads, ``u < sigmoid(l)`` for Bernoulli bits,
``mu + sigma * eps`` for Gaussians), drawing from a numpy ``Generator``, and
``tests/test_numpy_nets.py`` holds each to its torch module on 1,000 observations
(modes, log-probabilities, values, recurrent states).

Convolutions run channels last as one matrix product per layer over the windows
(im2col, after a space-to-depth of the strided ones); the measured cost per step
against torch and ONNX Runtime is in docs/benchmarks.md (section 27, "Actor hosts
without torch").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..config import PolicyConfig
from .installs import TorchMissing, needs_torch_line, torch_installed
from .masking import mask_key
from .numpy_mlp import OBS_CLIP, OBS_NORM_EPS, NumpyMLP, mlp_dims
from .weights import ArrayWeights, Layout

__all__ = [
    "FACTORIES",
    "IMAGE_MIN_SIDE",
    "LEAF_KINDS",
    "TORCH_FIRST",
    "NumpyNetwork",
    "acting_network",
    "canonical_factory",
    "categorical_nvec",
    "category_index",
    "check_board_spaces",
    "check_cnn_spaces",
    "check_drop_game_spaces",
    "fresh_weights",
    "is_board_space",
    "is_image_space",
    "leaf_kind",
    "leaf_paths",
    "nature_settings",
    "numpy_network",
    "one_hot_layout",
    "value_at",
]

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)
IMAGE_MIN_SIDE = 36
"""The Nature-DQN convolutions need at least 36 pixels per side."""
BOARD_FILTERS = 64
"""Filters of a board part's convolution (:class:`~zmq_rl.rl.networks.BoardPart`)."""
DROP_REACH = 3
"""Cells on each side of a column's landing cell that its logit sees (DropGameCNN)."""

Weights = dict[str, np.ndarray]
Entries = list[tuple[str, tuple[int, ...], np.dtype]]


# --------------------------------------------------------------------------- spaces


def leaf_paths(space: Any, path: tuple = ()) -> list[tuple[tuple, Any]]:
    """``(path, leaf space)`` of every leaf of ``space`` in spec order; a path is the
    keys / indices that lead to the leaf in a value."""
    if isinstance(space, gymnasium.spaces.Dict):
        return [p for k, s in space.spaces.items() for p in leaf_paths(s, (*path, k))]
    if isinstance(space, gymnasium.spaces.Tuple):
        return [p for i, s in enumerate(space.spaces) for p in leaf_paths(s, (*path, i))]
    return [(path, space)]


def value_at(value: Any, path: tuple) -> Any:
    """The part of an observation value (or a space) that ``path`` (:func:`leaf_paths`)
    leads to."""
    for key in path:
        value = value[key]
    return value


def is_board_space(space: Any) -> bool:
    """A board: a Box of rank 3, ``[H, W, C]`` with fewer channels than either side."""
    if not isinstance(space, gymnasium.spaces.Box) or len(space.shape) != 3:
        return False
    height, width, channels = space.shape
    return channels < min(height, width)


LEAF_KINDS = ("image", "board", "box", "one_hot", "binary")
"""How an observation leaf is encoded (:func:`leaf_kind`)."""


def leaf_kind(leaf: gymnasium.Space, boards: bool | str = False) -> str:
    """How the encoder of :class:`~zmq_rl.rl.networks.ObsEncoder` (and its numpy twin)
    encodes ``leaf``, one of :data:`LEAF_KINDS`: an image box through the Nature
    convolutions, a board (with ``boards``) through the board convolutions, another box
    flattened, Discrete and MultiDiscrete one-hot, MultiBinary as 0/1. One rule for
    both, so that torch and numpy networks built from the same spaces agree.
    ValueError names an unsupported leaf."""
    if isinstance(leaf, gymnasium.spaces.Box):
        if is_image_space(leaf):
            return "image"
        return "board" if boards and is_board_space(leaf) else "box"
    if isinstance(leaf, (gymnasium.spaces.Discrete, gymnasium.spaces.MultiDiscrete)):
        return "one_hot"
    if isinstance(leaf, gymnasium.spaces.MultiBinary):
        return "binary"
    raise ValueError(f"unsupported observation space part {leaf!r}")


def one_hot_layout(leaf: gymnasium.Space) -> tuple[np.ndarray, np.ndarray]:
    """``(nvec, start)`` of a Discrete (one component) or MultiDiscrete leaf."""
    if isinstance(leaf, gymnasium.spaces.Discrete):
        return np.array([leaf.n]), np.array([leaf.start])
    return leaf.nvec, leaf.start


def categorical_nvec(space: gymnasium.Space) -> np.ndarray:
    """Categories per component of a Discrete (one) or MultiDiscrete action space,
    int64 ``[components]``: the layout of the categorical heads' logits."""
    if isinstance(space, gymnasium.spaces.Discrete):
        return np.array([space.n], np.int64)
    return np.asarray(space.nvec, np.int64).reshape(-1)


def is_image_space(space: Any) -> bool:
    """An image box: uint8, rank 2 or 3, both spatial sides >= 36 pixels."""
    if not isinstance(space, gymnasium.spaces.Box) or space.dtype != np.uint8:
        return False
    shape = space.shape
    if len(shape) == 2:
        return min(shape) >= IMAGE_MIN_SIDE
    if len(shape) == 3:
        sides = shape[:2] if shape[-1] < shape[0] else shape[1:]
        return min(sides) >= IMAGE_MIN_SIDE
    return False


def check_cnn_spaces(
    factory: str,
    observation_space: gymnasium.Space,
    action_space: gymnasium.Space,
    ranks: tuple[int, ...],
    shapes: str,
) -> None:
    """ValueError naming ``zmq_rl.rl.cnn:<factory>`` unless the observation space is a
    Box of one of ``ranks`` (described as ``shapes``) and the action space Discrete
    from 0 (what :mod:`zmq_rl.rl.cnn`'s factories refuse, in their words)."""
    if (
        not isinstance(observation_space, gymnasium.spaces.Box)
        or len(observation_space.shape) not in ranks
    ):
        raise ValueError(  # noqa: TRY004
            f"zmq_rl.rl.cnn:{factory} needs an image Box observation space of shape {shapes}, "
            f"got {observation_space!r}"
        )
    if not isinstance(action_space, gymnasium.spaces.Discrete) or int(action_space.start) != 0:
        raise ValueError(
            f"zmq_rl.rl.cnn:{factory} needs a Discrete action space starting at 0, "
            f"got {action_space!r}"
        )


def check_board_spaces(observation_space: gymnasium.Space, name: str) -> None:
    """ValueError naming ``zmq_rl.rl.boards:<name>`` unless the observation holds a
    board (:func:`is_board_space`)."""
    if not any(is_board_space(leaf) for _, leaf in leaf_paths(observation_space)):
        raise ValueError(
            f"zmq_rl.rl.boards:{name} needs a board in the observation: a Box of shape "
            f"(H, W, C) with fewer channels than either side, got {observation_space!r}"
        )


def check_drop_game_spaces(
    observation_space: gymnasium.Space, action_space: gymnasium.Space
) -> tuple[tuple, gymnasium.spaces.Box, str | None]:
    """What ``zmq_rl.rl.boards:drop_game_cnn`` needs (one board, at most an
    ``action_mask`` beside it, ``Discrete(width)`` actions), else ValueError in its
    words; the board's path, its space and the mask key."""
    key = mask_key(observation_space, action_space)
    paths = leaf_paths(observation_space)
    boards = [p for p, leaf in paths if is_board_space(leaf)]
    others = [p for p, leaf in paths if not is_board_space(leaf) and p != (key,)]
    if len(boards) != 1 or others:
        raise ValueError(
            "zmq_rl.rl.boards:drop_game_cnn needs an observation of one board (a Box "
            "of shape (H, W, C) with fewer channels than either side) and at most an "
            f"action_mask beside it, got {observation_space!r}"
        )
    board = value_at(observation_space, boards[0])
    width = int(board.shape[1])
    if not isinstance(action_space, gymnasium.spaces.Discrete) or int(action_space.n) != width:
        raise ValueError(
            "zmq_rl.rl.boards:drop_game_cnn needs one discrete action per column: "
            f"Discrete({width}) for a board {width} wide, got {action_space!r}"
        )
    return boards[0], board, key


# --------------------------------------------------------------------------- layers


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0, out=x)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return np.exp(-np.logaddexp(0.0, -x)).astype(x.dtype, copy=False)


class _Linear:
    """``y = x W^T + b`` with ``<prefix>.weight`` ``[out, in]`` and ``<prefix>.bias``."""

    def __init__(self, prefix: str, in_features: int, out_features: int) -> None:
        self.weight, self.bias = f"{prefix}.weight", f"{prefix}.bias"
        self.shapes = ((out_features, in_features), (out_features,))

    def entries(self) -> Entries:
        return [(self.weight, self.shapes[0], _F32), (self.bias, self.shapes[1], _F32)]

    def __call__(self, w: Weights, x: np.ndarray) -> np.ndarray:
        y = x @ w[self.weight].T
        y += w[self.bias]
        return y


class _Trunk:
    """:func:`~zmq_rl.rl.layers.trunk`: a ``Linear`` and the activation per hidden width
    (the linear layers at every other index of the ``Sequential``)."""

    def __init__(self, prefix: str, in_features: int, cfg: PolicyConfig) -> None:
        self.layers: list[_Linear] = []
        for i, hidden in enumerate(cfg.hidden_sizes):
            self.layers.append(_Linear(f"{prefix}.{2 * i}", in_features, hidden))
            in_features = hidden
        self.relu = cfg.activation == "relu"

    def entries(self) -> Entries:
        return [e for layer in self.layers for e in layer.entries()]

    def __call__(self, w: Weights, x: np.ndarray) -> np.ndarray:
        for layer in self.layers:
            x = layer(w, x)
            x = _relu(x) if self.relu else np.tanh(x, out=x)
        return x


def _conv_out(side: int, kernel: int, stride: int) -> int:
    return (side - kernel) // stride + 1


class _Conv:
    """``nn.Conv2d`` (no padding; a stride that divides the kernel, as in every shipped
    network) on channels-last input ``[N, H, W, C]`` -> ``[N, H', W', F]``: the windows
    as rows of one matrix (im2col) times the filters."""

    def __init__(self, prefix: str, channels: int, filters: int, kernel: int, stride: int) -> None:
        if kernel % stride:
            raise ValueError(f"{prefix}: a stride ({stride}) that does not divide the kernel")
        self.weight, self.bias = f"{prefix}.weight", f"{prefix}.bias"
        self.channels, self.filters, self.kernel, self.stride = channels, filters, kernel, stride

    def entries(self) -> Entries:
        k = self.kernel
        return [
            (self.weight, (self.filters, self.channels, k, k), _F32),
            (self.bias, (self.filters,), _F32),
        ]

    def __call__(self, w: Weights, x: np.ndarray) -> np.ndarray:
        n, rows, cols, channels = x.shape
        k, s, filters = self.kernel, self.stride, self.filters
        out_rows, out_cols = _conv_out(rows, k, s), _conv_out(cols, k, s)
        # Space to depth: s x s blocks of cells become one cell of s * s * C channels,
        # and the k x k stride-s window an m x m stride-1 window of blocks (m = k / s),
        # whose columns copy runs of s * s * C contiguous floats, not runs of C: this
        # im2col copy is the larger part of a layer's cost.
        m = k // s
        if s > 1:
            rows_b, cols_b = out_rows + m - 1, out_cols + m - 1
            x = x[:, : rows_b * s, : cols_b * s].reshape(n, rows_b, s, cols_b, s, channels)
            x = x.transpose(0, 1, 3, 2, 4, 5).reshape(n, rows_b, cols_b, s * s * channels)
        columns = np.concatenate(
            [x[:, i : i + out_rows, j : j + out_cols] for i in range(m) for j in range(m)],
            axis=3,
        )
        # the weight [F, C, k, k] in the columns' order (i, j, row in block, column, C)
        weight = w[self.weight].reshape(filters, channels, m, s, m, s).transpose(0, 2, 4, 3, 5, 1)
        out = columns.reshape(n * out_rows * out_cols, -1) @ weight.reshape(filters, -1).T
        out += w[self.bias]
        return out.reshape(n, out_rows, out_cols, filters)


def _flat_nchw(x: np.ndarray) -> np.ndarray:
    """A channels-last ``[N, H, W, F]`` map flattened as torch flattens ``[N, F, H, W]``."""
    return x.transpose(0, 3, 1, 2).reshape(x.shape[0], -1)


def _conv_stack(prefix: str, channels: int, specs: Sequence[tuple[int, int, int]]) -> list[_Conv]:
    """Conv layers ``(filters, kernel, stride)`` with a ReLU after each, at every other
    index of a ``Sequential`` named ``prefix`` (:func:`~zmq_rl.rl.cnn.nature_conv`,
    :func:`~zmq_rl.rl.cnn.minatar_conv`)."""
    convs = []
    for i, (filters, kernel, stride) in enumerate(specs):
        convs.append(_Conv(f"{prefix}.{2 * i}", channels, filters, kernel, stride))
        channels = filters
    return convs


NATURE_CONV = ((32, 8, 4), (64, 4, 2), (64, 3, 1))
"""The Nature-DQN torso (Mnih et al. 2015): ``(filters, kernel, stride)`` per layer."""
MINATAR_CONV = ((16, 3, 1),)
"""MinAtar's torso (Young & Tian 2019): one layer of 16 3x3 filters."""


def _conv_features(w: Weights, convs: list[_Conv], x: np.ndarray) -> np.ndarray:
    for conv in convs:
        x = _relu(conv(w, x))
    return _flat_nchw(x)


def _conv_width(convs: list[_Conv], height: int, width: int) -> int:
    for conv in convs:
        height = _conv_out(height, conv.kernel, conv.stride)
        width = _conv_out(width, conv.kernel, conv.stride)
    return convs[-1].filters * height * width


def _image_layout(shape: tuple[int, ...], channels_last: bool) -> tuple[int, int, int]:
    """``(channels, height, width)`` of an image shape ``[H, W]``, ``[H, W, C]`` or
    ``[C, H, W]``."""
    if len(shape) == 2:
        return 1, shape[0], shape[1]
    if channels_last:
        return shape[2], shape[0], shape[1]
    return shape[0], shape[1], shape[2]


def _channels_last(x: np.ndarray, rank: int, channels_last: bool) -> np.ndarray:
    """An image batch ``[N, *shape]`` as ``[N, H, W, C]`` (a view)."""
    if rank == 2:
        return x[..., None]
    return x if channels_last else x.transpose(0, 2, 3, 1)


def landing_cells(planes: np.ndarray) -> np.ndarray:
    """:func:`~zmq_rl.rl.networks.landing_cells` channels last: ``[N, H, W, 1]``, 1 at
    the cells a piece dropped in its column lands on, for ``planes`` ``[N, H, W, C]``
    (row 0 the top)."""
    occupied = planes.sum(axis=3, keepdims=True) > 0
    below = np.ones_like(occupied)
    below[:, :-1] = occupied[:, 1:]
    return (~occupied & below).astype(planes.dtype)


# --------------------------------------------------------------------------- encoder


class _BoxPart:
    """A flattened box, standardised by its own running statistics when asked (float
    boxes only): :class:`~zmq_rl.rl.networks._BoxPart`."""

    def __init__(self, prefix: str, space: gymnasium.spaces.Box, normalize: bool) -> None:
        self.prefix = prefix
        self.out_features = int(np.prod(space.shape, dtype=np.int64))
        self.normalize = bool(normalize) and np.issubdtype(space.dtype, np.floating)

    def entries(self) -> Entries:
        if not self.normalize:
            return []
        p, size = self.prefix, self.out_features
        return [(f"{p}.obs_mean", (size,), _F64), (f"{p}.obs_var", (size,), _F64),
                (f"{p}.obs_count", (), _F64)]  # fmt: skip

    def __call__(self, w: Weights, x: np.ndarray, dtype: np.dtype) -> np.ndarray:
        flat = x.reshape(x.shape[0], -1)
        if flat.shape[1] != self.out_features:
            raise ValueError(f"box part of shape {x.shape} is not [N, {self.out_features}]")
        flat = flat.astype(dtype, copy=False)
        if self.normalize:
            mean, var = w[f"{self.prefix}.obs_mean"], w[f"{self.prefix}.obs_var"]
            std = np.sqrt(var + OBS_NORM_EPS).astype(dtype)
            flat = np.maximum((flat - mean.astype(dtype)) / std, -OBS_CLIP)
            flat = np.minimum(flat, OBS_CLIP, out=flat)
        return flat


class _OneHotPart:
    """Discrete (one component) or MultiDiscrete (one per component) indices, one-hot,
    clamped into range."""

    def __init__(self, nvec: np.ndarray, start: np.ndarray) -> None:
        nvec = np.asarray(nvec, np.int64).reshape(-1)
        self.start = np.asarray(start, np.int64).reshape(-1)
        self.last = nvec - 1
        self.offsets = np.concatenate([[0], np.cumsum(nvec)[:-1]]).astype(np.int64)
        self.out_features = int(nvec.sum())

    def entries(self) -> Entries:
        return []

    def __call__(self, w: Weights, x: np.ndarray, dtype: np.dtype) -> np.ndarray:
        n = x.shape[0]
        index = x.reshape(n, -1).astype(np.int64) - self.start
        index = np.minimum(np.maximum(index, 0), self.last) + self.offsets
        out = np.zeros((n, self.out_features), dtype)
        np.put_along_axis(out, index, 1.0, axis=1)
        return out


class _BinaryPart:
    def __init__(self, space: gymnasium.spaces.MultiBinary) -> None:
        self.out_features = int(np.prod(space.shape, dtype=np.int64))

    def entries(self) -> Entries:
        return []

    def __call__(self, w: Weights, x: np.ndarray, dtype: np.dtype) -> np.ndarray:
        return x.reshape(x.shape[0], -1).astype(dtype)


class _ImagePart:
    """The Nature-DQN convolutions and a 512-unit layer on a uint8 image scaled by
    1/255 (:class:`~zmq_rl.rl.networks._ImagePart`)."""

    out_features = 512

    def __init__(self, prefix: str, space: gymnasium.spaces.Box) -> None:
        shape = tuple(int(d) for d in space.shape)
        self.rank = len(shape)
        self.channels_last = len(shape) == 3 and shape[-1] < shape[0]
        channels, height, width = _image_layout(shape, self.channels_last)
        self.convs = _conv_stack(f"{prefix}.conv", channels, NATURE_CONV)
        self.fc = _Linear(f"{prefix}.fc", _conv_width(self.convs, height, width), 512)

    def entries(self) -> Entries:
        return [e for conv in self.convs for e in conv.entries()] + self.fc.entries()

    def __call__(self, w: Weights, x: np.ndarray, dtype: np.dtype) -> np.ndarray:
        x = _channels_last(x.astype(dtype) * (1.0 / 255.0), self.rank, self.channels_last)
        return _relu(self.fc(w, _conv_features(w, self.convs, x)))


class _BoardPart:
    """A board's ``[H, W, C]`` planes (plus the landing plane with ``gravity``) through
    one layer of 64 convolutions over every ``min(4, H, W)`` window, ReLU, flattened
    (:class:`~zmq_rl.rl.networks.BoardPart`)."""

    def __init__(self, prefix: str, space: gymnasium.spaces.Box, gravity: bool) -> None:
        height, width, channels = (int(d) for d in space.shape)
        kernel = min(4, height, width)
        self.gravity = gravity
        self.conv = _Conv(f"{prefix}.conv", channels + gravity, BOARD_FILTERS, kernel, 1)
        self.out_features = BOARD_FILTERS * (height - kernel + 1) * (width - kernel + 1)

    def entries(self) -> Entries:
        return self.conv.entries()

    def __call__(self, w: Weights, x: np.ndarray, dtype: np.dtype) -> np.ndarray:
        x = x.astype(dtype)
        if self.gravity:
            x = np.concatenate([x, landing_cells(x)], axis=3)
        return _flat_nchw(_relu(self.conv(w, x)))


class _Encoder:
    """:class:`~zmq_rl.rl.networks.ObsEncoder`: every leaf encoded, concatenated in spec
    order; leaf ``i``'s tensors are ``encoder.parts.<i>.*``."""

    def __init__(self, space: gymnasium.Space, cfg: PolicyConfig, boards: bool | str) -> None:
        self.paths: list[tuple] = []
        self.parts: list[Any] = []
        for i, (path, leaf) in enumerate(leaf_paths(space)):
            prefix = f"encoder.parts.{i}"
            kind = leaf_kind(leaf, boards)
            if kind == "image":
                part: Any = _ImagePart(prefix, leaf)
            elif kind == "board":
                part = _BoardPart(prefix, leaf, gravity=boards == "gravity")
            elif kind == "box":
                part = _BoxPart(prefix, leaf, cfg.normalize_obs)
            elif kind == "one_hot":
                part = _OneHotPart(*one_hot_layout(leaf))
            else:
                part = _BinaryPart(leaf)
            self.paths.append(path)
            self.parts.append(part)
        self.out_features = sum(p.out_features for p in self.parts)

    def entries(self) -> Entries:
        return [e for part in self.parts for e in part.entries()]

    def __call__(self, w: Weights, obs: Any, dtype: np.dtype) -> np.ndarray:
        features = [
            part(w, np.asarray(value_at(obs, path)), dtype)
            for path, part in zip(self.paths, self.parts, strict=True)
        ]
        return features[0] if len(features) == 1 else np.concatenate(features, axis=1)


# --------------------------------------------------------------------------- heads


def _log_softmax(x: np.ndarray) -> np.ndarray:
    z = x - x.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def category_index(nvec: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each categorical component's logits are among the ``sum(nvec)``
    parameters, laid out ``[K, widest]`` (component ``k``'s in row ``k``), and which
    entries are real (the rest pad the narrower components): the layout of
    :class:`~zmq_rl.rl.networks.ActionHeads`'s softmax, shared with :class:`_Heads`."""
    widest = int(nvec.max())
    offsets = np.concatenate([[0], np.cumsum(nvec)[:-1]])
    index = np.zeros((len(nvec), widest), np.int64)
    valid = np.zeros((len(nvec), widest), bool)
    for k, (n, off) in enumerate(zip(nvec, offsets, strict=True)):
        index[k, :n] = off + np.arange(n)
        valid[k, :n] = True
    return index, valid


class _Heads:
    """:class:`~zmq_rl.rl.networks.ActionHeads`: the distribution of the action space
    from ``num_params`` parameters per row, sampled and scored in numpy."""

    def __init__(self, space: gymnasium.Space, cfg: PolicyConfig, prefix: str = "heads") -> None:
        self.shape = tuple(int(d) for d in getattr(space, "shape", None) or ())
        self.log_std = f"{prefix}.log_std"
        if isinstance(space, (gymnasium.spaces.Discrete, gymnasium.spaces.MultiDiscrete)):
            self.kind = "categorical"
            nvec = categorical_nvec(space)
            self.index, self.valid = category_index(nvec)
            self.padded = not bool(self.valid.all())
            self.num_params = int(nvec.sum())
        elif isinstance(space, gymnasium.spaces.MultiBinary):
            self.kind = "bernoulli"
            self.num_params = int(np.prod(self.shape, dtype=np.int64))
        elif isinstance(space, gymnasium.spaces.Box):
            self.kind = "gaussian"
            self.num_params = int(np.prod(self.shape, dtype=np.int64))
        else:
            raise ValueError(
                f"unsupported action space {space!r}: actions must be Discrete, "
                "MultiDiscrete, MultiBinary or Box"
            )

    def entries(self) -> Entries:
        return [(self.log_std, (self.num_params,), _F32)] if self.kind == "gaussian" else []

    def _out(self, flat: np.ndarray) -> np.ndarray:
        return flat.reshape(flat.shape[0], *self.shape)

    def _log_p(self, params: np.ndarray, mask: Any) -> np.ndarray:
        """``[N, K, widest]`` log-probabilities, padding ``-inf``, masked logits the most
        negative finite float first (:func:`~zmq_rl.rl.masking.masked_logits`)."""
        if mask is not None:
            allowed = np.asarray(mask).reshape(params.shape) != 0
            params = np.where(allowed, params, np.finfo(params.dtype).min)
        logits = params[:, self.index]
        if self.padded:
            logits = np.where(self.valid, logits, -np.inf).astype(params.dtype)
        return _log_softmax(logits)

    def _allowed(self, mask: Any, n: int) -> np.ndarray:
        allowed = (np.asarray(mask).reshape(n, -1) != 0)[:, self.index]
        return allowed & self.valid if self.padded else allowed

    def sample(
        self, w: Weights, params: np.ndarray, rng: np.random.Generator | None, mask: Any = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(action ``[N, *shape]``, log_prob ``[N]``) drawn with ``rng``, or the mode
        (``rng`` None), as :meth:`ActionHeads.sample`."""
        n, dtype = params.shape[0], params.dtype
        if self.kind == "categorical":
            log_p = self._log_p(params, mask)
            if rng is None:
                scores = log_p
            else:  # Gumbel-max: argmax(log p - log E), E ~ Exp(1)
                draw = rng.standard_exponential(log_p.shape, dtype=dtype)
                np.maximum(draw, np.finfo(dtype).tiny, out=draw)
                scores = log_p - np.log(draw)
            if mask is not None:  # exact even where noise could rival finfo.min
                scores = np.where(self._allowed(mask, n), scores, -np.inf)
            action = scores.argmax(axis=-1)
            log_prob = np.take_along_axis(log_p, action[..., None], axis=-1)[..., 0].sum(axis=-1)
            return self._out(action.astype(np.int64)), log_prob.astype(dtype, copy=False)
        if self.kind == "bernoulli":
            if rng is None:
                bits = params > 0
            else:
                bits = rng.random(params.shape, dtype=dtype) < _sigmoid(params)
            return self._out(bits.astype(np.int8)), self._bernoulli_log_prob(params, bits)
        log_std = w[self.log_std]
        log_norm = log_std.sum() + _LOG_SQRT_2PI * self.num_params
        if rng is None:
            return self._out(params.copy()), np.full(n, -log_norm, dtype)
        noise = rng.standard_normal(params.shape, dtype=dtype)
        action = params + np.exp(log_std) * noise
        log_prob = (-0.5 * np.square(noise).sum(axis=1) - log_norm).astype(dtype)
        return self._out(action), log_prob

    @staticmethod
    def _bernoulli_log_prob(params: np.ndarray, bits: np.ndarray) -> np.ndarray:
        ones = bits.astype(params.dtype)
        log_prob = -(ones * np.logaddexp(0.0, -params) + (1 - ones) * np.logaddexp(0.0, params))
        return log_prob.sum(axis=1).astype(params.dtype)

    def log_prob(
        self, w: Weights, params: np.ndarray, actions: np.ndarray, mask: Any = None
    ) -> np.ndarray:
        """``[N]`` log-probabilities of given policy ``actions`` (as
        :meth:`ActionHeads.evaluate`)."""
        n = params.shape[0]
        if self.kind == "categorical":
            index = np.asarray(actions).reshape(n, -1, 1).astype(np.int64)
            log_p = self._log_p(params, mask)
            return np.take_along_axis(log_p, index, axis=-1)[..., 0].sum(axis=-1)
        if self.kind == "bernoulli":
            return self._bernoulli_log_prob(params, np.asarray(actions).reshape(n, -1) != 0)
        log_std = w[self.log_std]
        z = (np.asarray(actions, params.dtype).reshape(n, -1) - params) * np.exp(-log_std)
        return (-0.5 * np.square(z) - log_std - _LOG_SQRT_2PI).sum(axis=1)


# --------------------------------------------------------------------------- networks


class NumpyNetwork(ArrayWeights):
    """A network of :func:`numpy_network` holding its weights as numpy arrays.

    :attr:`layout` is the torch module's ``state_dict`` (names, shapes, dtypes, in
    order); :meth:`load` checks broadcast weights against it (all or nothing) and
    copies them, :meth:`bind` adopts arrays as they are (numpy views of a torch
    module's tensors: the module then holds the weights). Feed-forward networks
    (``state_size`` 0) have :meth:`act` and :meth:`mode`, recurrent ones
    :meth:`act_recurrent` and :meth:`mode_recurrent`, as the torch modules' ``act``
    and ``act_recurrent`` with and without ``deterministic``."""

    state_size = 0
    mask_key: str | None = None

    def __init__(self, entries: Entries, rng: np.random.Generator) -> None:
        self.rng = rng
        self.layout: Layout = {name: (tuple(shape), dtype) for name, shape, dtype in entries}
        self._zeros()

    @property
    def dtype(self) -> np.dtype:
        """The dtype the network computes in (its value head's)."""
        return self.w["value_head.weight"].dtype

    def initial_state(self, batch: int) -> np.ndarray:
        """Zeros ``[batch, state_size]``: the state an episode starts from."""
        return np.zeros((batch, self.state_size), np.float32)

    # -- acting ----------------------------------------------------------------------

    def forward(self, obs: Any) -> tuple[np.ndarray, np.ndarray]:
        """(distribution parameters ``[N, P]``, values ``[N]``)."""
        raise NotImplementedError

    def _mask(self, obs: Any) -> Any:
        return None if self.mask_key is None else obs[self.mask_key]

    def act(self, obs: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sampled policy actions, their log-probabilities and the values (``[N]`` each
        but the actions), drawn from :attr:`rng`."""
        params, value = self.forward(obs)
        action, log_prob = self.heads.sample(self.w, params, self.rng, self._mask(obs))
        return action, log_prob, value

    def mode(self, obs: Any) -> np.ndarray:
        """The policy's mode (what deterministic evaluations play)."""
        params, _ = self.forward(obs)
        return self.heads.sample(self.w, params, None, self._mask(obs))[0]

    def log_prob(self, obs: Any, actions: np.ndarray) -> np.ndarray:
        """Log-probabilities of given policy ``actions`` (``[N]``)."""
        params, _ = self.forward(obs)
        return self.heads.log_prob(self.w, params, actions, self._mask(obs))

    heads: _Heads


class StructuredNet(NumpyNetwork):
    """:class:`~zmq_rl.rl.networks.StructuredActorCritic` (``boards``: the board parts'
    convolutions of :func:`~zmq_rl.rl.boards.board_cnn`, ``"gravity"`` with the landing
    plane)."""

    def __init__(
        self,
        observation_space: gymnasium.Space,
        action_space: gymnasium.Space,
        cfg: PolicyConfig,
        rng: np.random.Generator,
        boards: bool | str = False,
    ) -> None:
        self.encoder = _Encoder(observation_space, cfg, boards)
        self.heads = _Heads(action_space, cfg)
        self.mask_key = mask_key(observation_space, action_space)
        width, features = cfg.hidden_sizes[-1], self.encoder.out_features
        if cfg.shared_trunk:
            self.trunks = [_Trunk("trunk", features, cfg)]
        else:
            self.trunks = [
                _Trunk("actor_trunk", features, cfg),
                _Trunk("critic_trunk", features, cfg),
            ]
        self.policy_head = _Linear("policy_head", width, self.heads.num_params)
        self.value_head = _Linear("value_head", width, 1)
        entries = self.encoder.entries() + self.heads.entries()
        entries += [e for trunk in self.trunks for e in trunk.entries()]
        super().__init__(entries + self.policy_head.entries() + self.value_head.entries(), rng)

    def forward(self, obs: Any) -> tuple[np.ndarray, np.ndarray]:
        w = self.w
        x = self.encoder(w, obs, self.dtype)
        actor = self.trunks[0](w, x)
        critic = self.trunks[1](w, x) if len(self.trunks) > 1 else actor
        return self.policy_head(w, actor), self.value_head(w, critic)[:, 0]


class RecurrentNet(NumpyNetwork):
    """:class:`~zmq_rl.rl.networks.RecurrentActorCritic`: encoder, trunk, an LSTM or GRU
    cell of the last hidden width (its state one vector per row: LSTM ``[h, c]``, GRU
    ``h``), heads."""

    def __init__(
        self,
        observation_space: gymnasium.Space,
        action_space: gymnasium.Space,
        cfg: PolicyConfig,
        rng: np.random.Generator,
    ) -> None:
        self.cell_type = cfg.policy_type
        self.encoder = _Encoder(observation_space, cfg, False)
        self.heads = _Heads(action_space, cfg)
        self.mask_key = mask_key(observation_space, action_space)
        self.trunk = _Trunk("trunk", self.encoder.out_features, cfg)
        self.width = width = cfg.hidden_sizes[-1]
        gates = 4 if self.cell_type == "lstm" else 3
        self.state_size = 2 * width if self.cell_type == "lstm" else width
        rnn = [
            ("rnn.weight_ih_l0", (gates * width, width)),
            ("rnn.weight_hh_l0", (gates * width, width)),
            ("rnn.bias_ih_l0", (gates * width,)),
            ("rnn.bias_hh_l0", (gates * width,)),
        ]
        self.policy_head = _Linear("policy_head", width, self.heads.num_params)
        self.value_head = _Linear("value_head", width, 1)
        entries = self.encoder.entries() + self.heads.entries() + self.trunk.entries()
        entries += [(name, shape, _F32) for name, shape in rnn]
        super().__init__(entries + self.policy_head.entries() + self.value_head.entries(), rng)

    def step(self, obs: Any, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The cell's output ``[N, width]`` and next state ``[N, state_size]`` from
        ``state`` (PyTorch's gate order: LSTM i, f, g, o; GRU r, z, n)."""
        w, dtype, width = self.w, self.dtype, self.width
        x = self.trunk(w, self.encoder(w, obs, dtype))
        state = np.asarray(state)
        if state.shape != (x.shape[0], self.state_size):
            raise ValueError(
                f"state of shape {state.shape} is not [{x.shape[0]}, {self.state_size}]"
            )
        state = state.astype(dtype, copy=False)
        gi = x @ w["rnn.weight_ih_l0"].T
        gi += w["rnn.bias_ih_l0"]
        h = state[:, :width]
        gh = h @ w["rnn.weight_hh_l0"].T
        gh += w["rnn.bias_hh_l0"]
        if self.cell_type == "lstm":
            gates = gi + gh
            i, f = _sigmoid(gates[:, :width]), _sigmoid(gates[:, width : 2 * width])
            g, o = np.tanh(gates[:, 2 * width : 3 * width]), _sigmoid(gates[:, 3 * width :])
            c = f * state[:, width:] + i * g
            h = o * np.tanh(c)
            return h, np.concatenate([h, c], axis=1)
        r = _sigmoid(gi[:, :width] + gh[:, :width])
        z = _sigmoid(gi[:, width : 2 * width] + gh[:, width : 2 * width])
        candidate = np.tanh(gi[:, 2 * width :] + r * gh[:, 2 * width :])
        h = (1 - z) * candidate + z * h
        return h, h

    def forward_recurrent(
        self, obs: Any, state: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(distribution parameters, values, next state)."""
        h, next_state = self.step(obs, state)
        return self.policy_head(self.w, h), self.value_head(self.w, h)[:, 0], next_state

    def act_recurrent(
        self, obs: Any, state: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(action, log_prob, value, next_state) sampled from ``state`` (the caller
        zeroes the rows of slots whose episode just began)."""
        params, value, next_state = self.forward_recurrent(obs, state)
        action, log_prob = self.heads.sample(self.w, params, self.rng, self._mask(obs))
        return action, log_prob, value, next_state

    def mode_recurrent(self, obs: Any, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(the mode, next_state) from ``state``."""
        params, _, next_state = self.forward_recurrent(obs, state)
        return self.heads.sample(self.w, params, None, self._mask(obs))[0], next_state

    def log_prob_recurrent(self, obs: Any, actions: np.ndarray, state: np.ndarray) -> np.ndarray:
        """Log-probabilities of given policy ``actions`` from ``state``."""
        params, _, _ = self.forward_recurrent(obs, state)
        return self.heads.log_prob(self.w, params, actions, self._mask(obs))

    def forward(self, obs: Any) -> tuple[np.ndarray, np.ndarray]:
        raise TypeError("a recurrent network acts from a state: act_recurrent / mode_recurrent")


class ConvNet(NumpyNetwork):
    """:class:`~zmq_rl.rl.cnn.NatureCNN` (``nature_cnn``: the Nature-DQN torso and 512
    units; ``minatar_cnn``: MinAtar's one layer and 128 units), a categorical policy
    head and a value head on one shared trunk."""

    def __init__(
        self,
        observation_space: gymnasium.spaces.Box,
        action_space: gymnasium.spaces.Discrete,
        rng: np.random.Generator,
        *,
        channels_last: bool,
        scale: float,
        hidden: int,
        conv: Sequence[tuple[int, int, int]],
    ) -> None:
        self.obs_shape = tuple(int(d) for d in observation_space.shape)
        self.rank = len(self.obs_shape)
        self.channels_last = bool(channels_last) and self.rank == 3
        self.scale = float(scale)
        channels, height, width = _image_layout(self.obs_shape, self.channels_last)
        self.convs = _conv_stack("conv", channels, conv)
        self.fc = _Linear("fc", _conv_width(self.convs, height, width), hidden)
        self.heads = _Heads(action_space, PolicyConfig())  # categorical, unmasked
        self.policy_head = _Linear("policy_head", hidden, int(action_space.n))
        self.value_head = _Linear("value_head", hidden, 1)
        entries = [e for c in self.convs for e in c.entries()] + self.fc.entries()
        super().__init__(entries + self.policy_head.entries() + self.value_head.entries(), rng)

    def forward(self, obs: Any) -> tuple[np.ndarray, np.ndarray]:
        obs = np.asarray(obs)
        if tuple(obs.shape[1:]) != self.obs_shape:
            raise ValueError(
                f"observation batch of shape {tuple(obs.shape)} is not [B, {self.obs_shape}]"
            )
        w = self.w
        x = _channels_last(obs.astype(self.dtype) * self.scale, self.rank, self.channels_last)
        h = _relu(self.fc(w, _conv_features(w, self.convs, x)))
        return self.policy_head(w, h), self.value_head(w, h)[:, 0]


class DropGameNet(NumpyNetwork):
    """:class:`~zmq_rl.rl.boards.DropGameCNN`: column ``c``'s logit is one MLP over the
    7 x 7 cells (board planes, landing plane, a plane of ones, zero-padded) around its
    landing cell; the value is the gravity board part, a trunk and the value head."""

    def __init__(
        self,
        observation_space: gymnasium.Space,
        action_space: gymnasium.Space,
        cfg: PolicyConfig,
        rng: np.random.Generator,
    ) -> None:
        self.board_path, board, self.mask_key = check_drop_game_spaces(
            observation_space, action_space
        )
        channels = int(board.shape[2])
        side = 2 * DROP_REACH + 1
        self.heads = _Heads(action_space, cfg)
        self.actor_trunk = _Trunk("actor_trunk", (channels + 2) * side * side, cfg)
        self.policy_head = _Linear("policy_head", cfg.hidden_sizes[-1], 1)
        self.critic_board = _BoardPart("critic_board", board, gravity=True)
        self.critic_trunk = _Trunk("critic_trunk", self.critic_board.out_features, cfg)
        self.value_head = _Linear("value_head", cfg.hidden_sizes[-1], 1)
        parts = (self.actor_trunk, self.policy_head, self.critic_board, self.critic_trunk)
        super().__init__([e for p in parts for e in p.entries()] + self.value_head.entries(), rng)

    def forward(self, obs: Any) -> tuple[np.ndarray, np.ndarray]:
        w, dtype, r = self.w, self.dtype, DROP_REACH
        board = np.asarray(value_at(obs, self.board_path))
        planes = board.astype(dtype)  # [N, H, W, C]
        n, _, width, _ = planes.shape
        landing = landing_cells(planes)
        x = np.concatenate([planes, landing, np.ones_like(landing)], axis=3)
        free = (planes.sum(axis=3) == 0).sum(axis=1)  # [N, W]: a column fills from the top
        row = np.maximum(free - 1, 0)
        padded = np.pad(x, ((0, 0), (r, r), (r, r), (0, 0)))
        windows = sliding_window_view(padded, (2 * r + 1, 2 * r + 1), axis=(1, 2))
        patches = windows[np.arange(n)[:, None], row, np.arange(width)[None, :]]
        features = patches.reshape(n, width, -1)  # [N, W, (C + 2) * 7 * 7], channels first
        logits = self.policy_head(w, self.actor_trunk(w, features))[..., 0]
        critic = self.critic_trunk(w, self.critic_board(w, board, dtype))
        return logits, self.value_head(w, critic)[:, 0]


# --------------------------------------------------------------------------- builders


def nature_settings(
    observation_space: gymnasium.Space, action_space: gymnasium.Space, cfg: PolicyConfig
) -> tuple[bool, float]:
    """What ``zmq_rl.rl.cnn:nature_cnn`` takes of its spaces and ``cfg``: whether the
    frames are channels last, and the scale of their pixels (1/255 for uint8); a
    ValueError in its words for what it refuses (:func:`check_cnn_spaces`,
    ``normalize_obs``)."""
    check_cnn_spaces(
        "nature_cnn", observation_space, action_space, (2, 3), "(C, H, W), (H, W, C) or (H, W)"
    )
    if cfg.normalize_obs:
        raise ValueError(
            "zmq_rl.rl.cnn:nature_cnn scales pixels by 1/255; turn normalize_obs off "
            "(--no-normalize-obs)"
        )
    shape = tuple(int(d) for d in observation_space.shape)
    channels_last = len(shape) == 3 and shape[-1] < shape[0]
    return channels_last, 1.0 / 255.0 if observation_space.dtype == np.uint8 else 1.0


def _nature(
    observation_space: gymnasium.Space,
    action_space: gymnasium.Space,
    cfg: PolicyConfig,
    rng: np.random.Generator,
) -> ConvNet:
    channels_last, scale = nature_settings(observation_space, action_space, cfg)
    return ConvNet(
        observation_space,
        action_space,
        rng,
        channels_last=channels_last,
        scale=scale,
        hidden=512,
        conv=NATURE_CONV,
    )


def _minatar(
    observation_space: gymnasium.Space,
    action_space: gymnasium.Space,
    cfg: PolicyConfig,
    rng: np.random.Generator,
) -> ConvNet:
    check_cnn_spaces("minatar_cnn", observation_space, action_space, (3,), "(C, H, W)")
    return ConvNet(
        observation_space,
        action_space,
        rng,
        channels_last=False,
        scale=1.0,
        hidden=128,
        conv=MINATAR_CONV,
    )


def _board(gravity: bool) -> Callable[..., StructuredNet]:
    name = "gravity_board_cnn" if gravity else "board_cnn"

    def build(observation_space, action_space, cfg, rng) -> StructuredNet:
        check_board_spaces(observation_space, name)
        boards = "gravity" if gravity else True
        return StructuredNet(observation_space, action_space, cfg, rng, boards=boards)

    return build


FACTORIES: dict[str, Callable[..., NumpyNetwork]] = {
    "zmq_rl.rl.cnn:nature_cnn": _nature,
    "zmq_rl.rl.cnn:minatar_cnn": _minatar,
    "zmq_rl.rl.boards:board_cnn": _board(False),
    "zmq_rl.rl.boards:gravity_board_cnn": _board(True),
    "zmq_rl.rl.boards:drop_game_cnn": DropGameNet,
}
"""The shipped ``--factory`` networks numpy computes, by their canonical spec."""


def canonical_factory(spec: str) -> str:
    """``spec`` with a module path of before the package's layout (``zmq_rl.cnn``) as
    today's (``zmq_rl.rl.cnn``): :data:`zmq_rl._moved.OLD_PATHS`."""
    from .._moved import OLD_PATHS

    module, _, attr = spec.partition(":")
    return f"{OLD_PATHS.get(module, module)}:{attr}"


def numpy_network(
    observation_space: gymnasium.Space,
    action_space: gymnasium.Space,
    cfg: PolicyConfig,
    rng: np.random.Generator,
) -> NumpyNetwork | NumpyMLP | None:
    """The network :func:`~zmq_rl.rl.policy.build_policy` builds for these spaces and
    ``cfg``, in numpy, sampling from ``rng``: the plain MLP as a
    :class:`~zmq_rl.rl.numpy_mlp.NumpyMLP`, every other built-in network and every
    shipped factory (:data:`FACTORIES`) as a :class:`NumpyNetwork`. None for a custom
    ``factory`` (only torch builds it); spaces the network cannot take raise the
    ValueError its torch module raises."""
    if cfg.factory:
        build = FACTORIES.get(canonical_factory(cfg.factory))
        return None if build is None else build(observation_space, action_space, cfg, rng)
    if cfg.policy_type in ("lstm", "gru"):
        return RecurrentNet(observation_space, action_space, cfg, rng)
    dims = mlp_dims(observation_space, action_space, cfg)
    if dims is not None:
        return NumpyMLP(dims, cfg, rng)
    return StructuredNet(observation_space, action_space, cfg, rng)


def fresh_weights(
    observation_space: gymnasium.Space,
    action_space: gymnasium.Space,
    cfg: PolicyConfig,
    rng: np.random.Generator,
) -> list[tuple[str, np.ndarray]]:
    """Weights of an untrained network of these spaces and ``cfg`` (a shipped one:
    :func:`numpy_network`), as a learner broadcasts them, without torch: every tensor
    of the layout, weights ``N(0, 1 / fan_in)``, biases and ``obs_mean`` 0, ``obs_var``
    1, ``log_std`` ``cfg.log_std_init``. What a scripted learner (the conformance tool's
    ``conformance actor``) sends; not torch's initialisation."""
    net = numpy_network(observation_space, action_space, cfg, rng)
    if net is None:
        raise TorchMissing(needs_torch_line(cfg.factory))
    out = []
    for name, (shape, dtype) in net.layout.items():
        if name.endswith("obs_var"):
            array = np.ones(shape, dtype)
        elif name.endswith("log_std"):
            array = np.full(shape, cfg.log_std_init, dtype)
        elif len(shape) >= 2:
            fan_in = int(np.prod(shape[1:]))
            array = (rng.standard_normal(shape) / math.sqrt(fan_in)).astype(dtype)
        else:
            array = np.zeros(shape, dtype)
        out.append((name, array))
    return out


TORCH_FIRST = frozenset({"zmq_rl.rl.cnn:nature_cnn"})
"""Shipped networks that a host with torch runs in torch, where it acts faster than
numpy at an actor's batch sizes (docs/benchmarks.md section 27: the Nature-DQN
torso); a host without torch runs them in numpy."""


def acting_network(
    observation_space: gymnasium.Space,
    action_space: gymnasium.Space,
    cfg: PolicyConfig,
    rng: np.random.Generator,
) -> NumpyNetwork | NumpyMLP | None:
    """The numpy network an actor acts with (:func:`numpy_network`), or None where a
    torch module acts instead: a custom factory, or a network of :data:`TORCH_FIRST`
    on a host with torch. A custom factory on a host without torch raises
    :class:`TorchMissing` with :func:`needs_torch_line`."""
    factory = canonical_factory(cfg.factory) if cfg.factory else ""
    if factory in TORCH_FIRST and torch_installed():
        return None
    net = numpy_network(observation_space, action_space, cfg, rng)
    if net is None and not torch_installed():
        raise TorchMissing(needs_torch_line(cfg.factory))
    return net
