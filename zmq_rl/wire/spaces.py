"""Spaces on the wire: space specs, and the structured values that travel in fragments.

A *space spec* (docs/protocol.md section 3.4) is a plain map describing a gymnasium
space; :func:`space_spec` and :func:`space_from_spec` round-trip every kind the
protocol carries: ``box``, ``discrete``, ``multi_binary``, ``multi_discrete`` (the
*leaf* kinds) and ``dict`` / ``tuple`` of those, nested up to :data:`MAX_DEPTH` levels.

A *value* of a space (section 3.5) is what one step of it looks like in numpy: one
array for a leaf space, a ``dict`` of values for a Dict space, a ``tuple`` of values
for a Tuple space. In a message every leaf carries the message's leading dimensions
(``[T, B]`` for rows, ``[B]`` for the next observation, ``[K]`` for final
observations) before the leaf's own element shape. The helpers here walk such values
(:func:`map_value`, :func:`leaves`), encode and decode them, and check that one fits a
space (:func:`value_problem`); no RL and no sockets.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .codec import ARRAY_DTYPES, ProtocolError, decode_array, encode_array

__all__ = [
    "LEAF_KINDS",
    "MAX_DEPTH",
    "Value",
    "allocate_value",
    "batch_obs",
    "decode_value",
    "encode_value",
    "leaves",
    "map_value",
    "space_from_spec",
    "space_spec",
    "value_problem",
]

Value = np.ndarray | dict[str, "Value"] | tuple["Value", ...]  # noqa: UP007 (a runtime alias)
"""One array, or a dict / tuple of values (the shape of a gymnasium space's sample)."""

LEAF_KINDS = ("box", "discrete", "multi_binary", "multi_discrete")
"""Spec kinds that are one array; ``dict`` and ``tuple`` hold other specs."""
ACTION_KINDS = LEAF_KINDS
"""Action spaces are always one array (one head per component in the policy)."""
MAX_DEPTH = 4
"""Deepest nesting of dict/tuple specs (a dict of boxes is depth 2)."""
MAX_PARTS = 256
"""Most entries of one dict/tuple spec."""
_ARRAY_KEYS = frozenset(("dtype", "shape", "data"))
INT_DTYPES = ("int32", "int64")
BINARY_DTYPES = ("int8", "uint8", "bool")


# --------------------------------------------------------------------------- specs


def space_spec(space: Any) -> dict[str, Any]:
    """Describe a gymnasium space as a plain map (docs/protocol.md section 3.4).

    Raises TypeError naming the space for a kind the protocol does not carry."""
    from gymnasium import spaces

    if isinstance(space, spaces.Discrete):
        return {"kind": "discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.Box):
        return {
            "kind": "box",
            "shape": list(space.shape),
            "dtype": space.dtype.name,
            "low": encode_array(np.asarray(space.low, space.dtype)),
            "high": encode_array(np.asarray(space.high, space.dtype)),
        }
    if isinstance(space, spaces.MultiBinary):
        return {"kind": "multi_binary", "shape": [int(d) for d in space.shape]}
    if isinstance(space, spaces.MultiDiscrete):
        return {
            "kind": "multi_discrete",
            "nvec": encode_array(np.asarray(space.nvec, np.int64)),
            "start": encode_array(np.asarray(space.start, np.int64)),
        }
    if isinstance(space, spaces.Dict):
        return {"kind": "dict", "spaces": [[k, space_spec(s)] for k, s in space.spaces.items()]}
    if isinstance(space, spaces.Tuple):
        return {"kind": "tuple", "spaces": [space_spec(s) for s in space.spaces]}
    raise TypeError(
        f"space {space} is not supported (supported: Box, Discrete, MultiBinary, "
        "MultiDiscrete, and Dict/Tuple of those)"
    )


def space_from_spec(spec: Any, where: str = "space", depth: int = 1) -> Any:
    """Rebuild a gymnasium space from :func:`space_spec` output, validating every field;
    raises :class:`~zmq_rl.wire.codec.ProtocolError` (``bad_field``) naming what is wrong."""
    from gymnasium import spaces

    if not isinstance(spec, dict):
        raise ProtocolError("bad_field", f"{where}: expected a space map")
    kind = spec.get("kind")
    try:
        if kind == "discrete":
            n, start = spec.get("n"), spec.get("start", 0)
            if (
                type(n) is not int
                or not 1 <= n <= 2**31
                or type(start) is not int
                or not -(2**31) <= start <= 2**31
            ):
                raise ProtocolError("bad_field", f"{where}: discrete n={n!r} start={start!r}")
            return spaces.Discrete(n, start=start)
        if kind == "box":
            return _box_from_spec(spec, where)
        if kind == "multi_binary":
            shape = _shape(spec.get("shape"), f"{where}.shape", minimum=1)
            return spaces.MultiBinary(shape if len(shape) != 1 else shape[0])
        if kind == "multi_discrete":
            nvec = decode_array(spec.get("nvec"), f"{where}.nvec")
            start = decode_array(spec.get("start"), f"{where}.start")
            if nvec.dtype != np.int64 or start.dtype != np.int64 or nvec.shape != start.shape:
                raise ProtocolError(
                    "bad_field", f"{where}: nvec and start must be int64 arrays of one shape"
                )
            if nvec.size == 0 or int(nvec.min()) < 1 or int(np.abs(start).max()) > 2**31:
                raise ProtocolError("bad_field", f"{where}: nvec must be >= 1, |start| <= 2^31")
            return spaces.MultiDiscrete(nvec.copy(), start=start.copy())
        if kind in ("dict", "tuple"):
            return _container_from_spec(spec, kind, where, depth)
    except ProtocolError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:
        raise ProtocolError("bad_field", f"{where}: {exc}") from exc
    raise ProtocolError("bad_field", f"{where}: unknown space kind {kind!r}")


def _shape(value: Any, where: str, minimum: int = 0) -> tuple[int, ...]:
    if (
        not isinstance(value, list)
        or len(value) > 8
        or not all(type(d) is int and minimum <= d <= 2**31 for d in value)
    ):
        raise ProtocolError("bad_field", f"{where}: expected a list of ints >= {minimum}")
    return tuple(value)


def _box_from_spec(spec: dict[str, Any], where: str) -> Any:
    from gymnasium import spaces

    shape = _shape(spec.get("shape"), f"{where}.shape")
    dtype = spec.get("dtype")
    if dtype not in ARRAY_DTYPES or dtype == "bool":
        raise ProtocolError("bad_field", f"{where}.dtype: {dtype!r} is not a box dtype")
    bounds = []
    for name in ("low", "high"):
        array = decode_array(spec.get(name), f"{where}.{name}")
        if array.dtype.name != dtype or array.shape != shape:
            raise ProtocolError(
                "bad_field",
                f"{where}.{name}: {array.dtype.name} {list(array.shape)}, "
                f"expected {dtype} {list(shape)}",
            )
        if array.dtype.kind == "f" and np.isnan(array).any():
            raise ProtocolError("bad_field", f"{where}.{name}: holds NaN")
        bounds.append(array)
    if (bounds[0] > bounds[1]).any():
        raise ProtocolError("bad_field", f"{where}: low > high")
    return spaces.Box(low=bounds[0], high=bounds[1], shape=shape, dtype=np.dtype(dtype))


def _container_from_spec(spec: dict[str, Any], kind: str, where: str, depth: int) -> Any:
    from gymnasium import spaces

    if depth >= MAX_DEPTH:
        raise ProtocolError("bad_field", f"{where}: nested deeper than {MAX_DEPTH} levels")
    parts = spec.get("spaces")
    if not isinstance(parts, list) or not 1 <= len(parts) <= MAX_PARTS:
        raise ProtocolError("bad_field", f"{where}.spaces: expected 1..{MAX_PARTS} entries")
    if kind == "tuple":
        return spaces.Tuple(
            [space_from_spec(s, f"{where}[{i}]", depth + 1) for i, s in enumerate(parts)]
        )
    built: dict[str, Any] = {}
    for i, entry in enumerate(parts):
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)):
            raise ProtocolError("bad_field", f"{where}.spaces[{i}]: expected [key, spec]")
        key = entry[0]
        if key in built or not 1 <= len(key) <= 64:
            raise ProtocolError("bad_field", f"{where}.spaces[{i}]: key {key!r} empty or repeated")
        built[key] = space_from_spec(entry[1], f"{where}[{key}]", depth + 1)
    if set(built) == _ARRAY_KEYS:
        raise ProtocolError("bad_field", f"{where}: the key set dtype/shape/data is reserved")
    return spaces.Dict(built)  # insertion order is kept: it is the spec's order


# --------------------------------------------------------------------------- values


def map_value(fn: Callable[..., Any], value: Value, *others: Value) -> Any:
    """Apply ``fn`` to each leaf array (and the matching leaves of ``others``), keeping
    the structure: the one walk every structured-observation operation uses."""
    if isinstance(value, dict):
        return {k: map_value(fn, v, *(o[k] for o in others)) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(map_value(fn, v, *(o[i] for o in others)) for i, v in enumerate(value))
    return fn(value, *others)


def leaves(value: Value) -> list[np.ndarray]:
    """The leaf arrays of ``value`` in spec order."""
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in leaves(v)]
    if isinstance(value, tuple):
        return [leaf for v in value for leaf in leaves(v)]
    return [value]


def leading(value: Value, ndim: int) -> tuple[int, ...]:
    """The first ``ndim`` dimensions of ``value``'s first leaf."""
    return tuple(leaves(value)[0].shape[:ndim])


def as_value(value: Any) -> Value:
    """``value`` with every leaf a numpy array (dicts and tuples keep their structure)."""
    if isinstance(value, dict):
        return {k: as_value(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(as_value(v) for v in value)
    return np.asarray(value)


def encode_value(value: Value) -> Any:
    """The wire form of a value: array maps, in maps and lists as the value nests."""
    if isinstance(value, dict):
        return {k: encode_value(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [encode_value(v) for v in value]
    return encode_array(value)


def decode_value(raw: Any, where: str, lead: tuple[int, ...], depth: int = 1) -> Value:
    """Decode a wire value whose every leaf has leading dims ``lead``; raises
    ProtocolError (``bad_array``, ``bad_shape``, ...) naming the leaf."""
    if isinstance(raw, dict) and not _ARRAY_KEYS.issuperset(raw) or isinstance(raw, list):
        if depth >= MAX_DEPTH:
            raise ProtocolError("bad_array", f"{where}: nested deeper than {MAX_DEPTH} levels")
        if isinstance(raw, list):
            if not 1 <= len(raw) <= MAX_PARTS:
                raise ProtocolError("bad_array", f"{where}: expected 1..{MAX_PARTS} parts")
            return tuple(
                decode_value(v, f"{where}[{i}]", lead, depth + 1) for i, v in enumerate(raw)
            )
        if not 1 <= len(raw) <= MAX_PARTS or not all(isinstance(k, str) for k in raw):
            raise ProtocolError("bad_array", f"{where}: expected 1..{MAX_PARTS} named parts")
        return {k: decode_value(v, f"{where}.{k}", lead, depth + 1) for k, v in raw.items()}
    array = decode_array(raw, where)
    if array.shape[: len(lead)] != lead:
        raise ProtocolError(
            "bad_shape",
            f"{where}: leading dims {list(array.shape[: len(lead)])} != {list(lead)}",
        )
    return array


def _leaf_problem(space: Any, leaf: np.ndarray, where: str, lead: int) -> str | None:
    from gymnasium import spaces

    shape, dtype = leaf.shape[lead:], leaf.dtype
    if isinstance(space, spaces.Box):
        if shape != space.shape or dtype != space.dtype:
            return f"{where}: {list(shape)} {dtype}, expected {list(space.shape)} {space.dtype}"
        return None
    if isinstance(space, spaces.Discrete):
        if shape != () or dtype.name not in INT_DTYPES:
            return f"{where}: {list(shape)} {dtype}, expected an int32/int64 index per step"
        lo, n = int(space.start), int(space.n)
        if leaf.size and (int(leaf.min()) < lo or int(leaf.max()) >= lo + n):
            return f"{where}: values outside [{lo}, {lo + n})"
        return None
    if isinstance(space, spaces.MultiBinary):
        if shape != space.shape or dtype.name not in BINARY_DTYPES:
            return f"{where}: {list(shape)} {dtype}, expected {list(space.shape)} int8/uint8/bool"
        if leaf.size and dtype.kind != "b" and (int(leaf.min()) < 0 or int(leaf.max()) > 1):
            return f"{where}: values other than 0 and 1"
        return None
    if isinstance(space, spaces.MultiDiscrete):
        if shape != space.shape or dtype.name not in INT_DTYPES:
            return f"{where}: {list(shape)} {dtype}, expected {list(space.shape)} int32/int64"
        if leaf.size:
            offset = leaf - space.start
            if (offset < 0).any() or (offset >= space.nvec).any():
                return f"{where}: values outside [start, start + nvec)"
        return None
    return f"{where}: space {space} is not a leaf space"


def value_problem(space: Any, value: Value, where: str, lead: int) -> str | None:
    """Why ``value`` (leaves with ``lead`` leading dims) is not a value of ``space``
    (structure, element shapes, dtypes, discrete ranges), or None when it is."""
    from gymnasium import spaces

    if isinstance(space, spaces.Dict):
        if not isinstance(value, dict) or list(value) != list(space.spaces):
            got = list(value) if isinstance(value, dict) else type(value).__name__
            return f"{where}: keys {got}, expected {list(space.spaces)}"
        for key, sub in space.spaces.items():
            problem = value_problem(sub, value[key], f"{where}.{key}", lead)
            if problem:
                return problem
        return None
    if isinstance(space, spaces.Tuple):
        if not isinstance(value, tuple) or len(value) != len(space.spaces):
            return f"{where}: expected a list of {len(space.spaces)} parts"
        for i, sub in enumerate(space.spaces):
            problem = value_problem(sub, value[i], f"{where}[{i}]", lead)
            if problem:
                return problem
        return None
    if not isinstance(value, np.ndarray):
        return f"{where}: expected one array"
    return _leaf_problem(space, value, where, lead)


def wire_dtype(space: Any) -> np.dtype:
    """The dtype a leaf space's values travel as from the Python actor."""
    from gymnasium import spaces

    if isinstance(space, spaces.Box):
        return space.dtype
    if isinstance(space, spaces.MultiBinary):
        return np.dtype(np.int8)
    return np.dtype(np.int64)


def batch_obs(space: Any, observations: list[Any]) -> Value:
    """Stack per-env observations (values of ``space``, as envs return them) into one
    value with a leading batch dim, each leaf in its wire dtype (:func:`wire_dtype`:
    box: the box's dtype; discrete / multi-discrete: int64; multi-binary: int8)."""
    from gymnasium import spaces

    if isinstance(space, spaces.Dict):
        return {k: batch_obs(s, [o[k] for o in observations]) for k, s in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(batch_obs(s, [o[i] for o in observations]) for i, s in enumerate(space))
    return np.stack([np.asarray(o) for o in observations]).astype(wire_dtype(space), copy=False)


def allocate_value(space: Any, lead: tuple[int, ...]) -> Value:
    """Uninitialised arrays for values of ``space`` with leading dims ``lead``."""
    from gymnasium import spaces

    if isinstance(space, spaces.Dict):
        return {k: allocate_value(s, lead) for k, s in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(allocate_value(s, lead) for s in space.spaces)
    return np.empty((*lead, *space.shape), wire_dtype(space))


def is_leaf_space(space: Any) -> bool:
    """Whether ``space`` travels as one array."""
    from gymnasium import spaces

    return not isinstance(space, (spaces.Dict, spaces.Tuple))


def value_nbytes(space: Any) -> int:
    """Bytes of one element (one step, one slot) of a value of ``space``."""
    from gymnasium import spaces

    if isinstance(space, spaces.Dict):
        return sum(value_nbytes(s) for s in space.spaces.values())
    if isinstance(space, spaces.Tuple):
        return sum(value_nbytes(s) for s in space.spaces)
    return int(np.prod(space.shape, dtype=np.int64)) * wire_dtype(space).itemsize


def env_actions(space: Any, actions: np.ndarray) -> np.ndarray:
    """The env's actions for the policy's ``actions`` (``[B, ...]``): discrete and
    multi-discrete indices shifted by the space's ``start``, multi-binary as int8, box
    actions clipped to the bounds. (On the wire actions are the policy's: 0-based
    indices and unclipped floats, docs/protocol.md section 3.5.)"""
    from gymnasium import spaces

    if isinstance(space, spaces.Discrete):
        return actions + int(space.start)
    if isinstance(space, spaces.MultiDiscrete):
        return actions + space.start
    if isinstance(space, spaces.MultiBinary):
        return actions.astype(np.int8)
    return np.clip(actions, space.low, space.high)
