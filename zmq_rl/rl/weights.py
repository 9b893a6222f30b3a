"""What the actor side knows of a network without torch: the check that broadcast
weights (named arrays) fit it, its config from a welcome, whether it is recurrent.

What :func:`zmq_rl.rl.policy.check_weights` checks against a torch module's
``state_dict``, :func:`check_arrays` checks against a table of names, shapes and
dtypes, so that an actor which runs the plain MLP in numpy
(:class:`~zmq_rl.rl.numpy_mlp.NumpyMLP`) refuses exactly what a torch actor refuses,
with the same words (docs/protocol.md section 4.2), and never imports torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from zmq_rl.config import PolicyConfig

if TYPE_CHECKING:
    from zmq_rl.wire.protocol import RunSettings

__all__ = [
    "ArrayWeights",
    "Layout",
    "WeightsMismatch",
    "check_arrays",
    "is_recurrent",
    "policy_config_from",
]

Layout = Mapping[str, tuple[tuple[int, ...], np.dtype]]
"""A network's tensors by name, in ``state_dict`` order: ``(shape, numpy dtype)``."""


class WeightsMismatch(ValueError):
    """Imported weights do not match the module: names, shapes or dtypes differ."""


def check_arrays(
    layout: Layout, weights: Sequence[tuple[str, np.ndarray]]
) -> dict[str, np.ndarray]:
    """Check that ``(name, array)`` pairs fit ``layout`` exactly: the names exactly its
    names (no missing, unexpected or duplicate one), each a numpy array of exactly
    the shape and dtype listed. No broadcasting and no reshaping: a scalar ``[]`` is
    not a ``[1]`` tensor, nor the reverse (docs/protocol.md section 4.2). Raises
    :class:`WeightsMismatch` naming the tensor and both shapes; returns the arrays by
    name."""
    seen: dict[str, np.ndarray] = {}
    for entry in weights:
        name, array = entry
        if name in seen:
            raise WeightsMismatch(f"duplicate tensor {name!r} in imported weights")
        seen[name] = array
    missing = [name for name in layout if name not in seen]
    unexpected = [name for name in seen if name not in layout]
    if missing or unexpected:
        raise WeightsMismatch(
            f"imported weights do not match the module: missing {missing}, unexpected {unexpected}"
        )
    for name, (shape, want) in layout.items():
        array = seen[name]
        if not isinstance(array, np.ndarray):
            raise WeightsMismatch(
                f"tensor {name!r}: expected a numpy array, got {type(array).__name__}"
            )
        if tuple(array.shape) != tuple(shape) or array.dtype != want:
            raise WeightsMismatch(
                f"tensor {name!r}: module has shape {tuple(shape)} dtype {want}, "
                f"imported has shape {tuple(array.shape)} dtype {array.dtype}"
            )
    return seen


class ArrayWeights:
    """A network's weights as numpy arrays by name, ``w``, against its ``layout`` (the
    torch module's ``state_dict``: names, shapes, dtypes, in order): what the numpy
    networks of an actor hold (:class:`~zmq_rl.rl.numpy_mlp.NumpyMLP`,
    :class:`~zmq_rl.rl.numpy_nets.NumpyNetwork`). Subclasses set ``layout`` and call
    :meth:`_zeros` in their constructor; :meth:`_held` runs whenever ``w`` is new."""

    layout: Layout
    w: dict[str, np.ndarray]

    def _zeros(self) -> None:
        """Zero weights of the layout (until the welcome's are loaded)."""
        self.w = {name: np.zeros(shape, dtype) for name, (shape, dtype) in self.layout.items()}
        self._held()

    def _held(self) -> None:
        """Called after ``w`` changed (index it, if the subclass keeps views of it)."""

    def check(self, weights: Sequence[tuple[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """Raise :class:`WeightsMismatch` unless ``weights`` fit the network exactly;
        the arrays by name."""
        return check_arrays(self.layout, weights)

    def load(self, weights: Sequence[tuple[str, np.ndarray]]) -> None:
        """Check ``weights`` (:meth:`check`), then take copies of them (frames from a
        socket are read-only and reused); nothing changes when they do not fit."""
        seen = self.check(weights)
        self.w = {name: np.array(seen[name], copy=True) for name in self.layout}
        self._held()

    def bind(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Act on ``arrays`` (by name, the layout's) as they are, without copying: numpy
        views of a torch module's tensors, which loading weights into the module updates
        in place."""
        self.w = {name: arrays[name] for name in self.layout}
        self._held()

    def named_arrays(self) -> list[tuple[str, np.ndarray]]:
        """The weights as ``(name, array)`` copies in ``state_dict`` order."""
        return [(name, self.w[name].copy()) for name in self.layout]


def policy_config_from(settings: RunSettings, policy_id: str = "") -> PolicyConfig:
    """The :class:`PolicyConfig` of a welcome's :class:`~zmq_rl.wire.protocol.RunSettings`
    (its ``policy`` map, or policy ``policy_id``'s of a several-policy run; lists
    become tuples), validated. Keys that are no :class:`PolicyConfig` field are
    ignored (docs/protocol.md section 4.4: other keys MAY appear)."""
    known = {f.name for f in dataclasses.fields(PolicyConfig)}
    chosen = settings.policies[policy_id] if policy_id else settings.policy
    raw = {key: value for key, value in chosen.items() if key in known}
    if "hidden_sizes" in raw:
        raw["hidden_sizes"] = tuple(raw["hidden_sizes"])
    return PolicyConfig(**raw).validate()


def is_recurrent(policy: object) -> bool:
    """Whether ``policy`` carries a recurrent state (``state_size > 0``)."""
    return int(getattr(policy, "state_size", 0) or 0) > 0
