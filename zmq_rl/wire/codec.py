"""The lowest layer of the wire protocol: its version, its error type and its arrays.

Every array that crosses a socket is a map ``{"dtype": str, "shape": [int, ...],
"data": bin}`` holding the raw little-endian, C-ordered bytes of a numpy array whose
dtype is one of :data:`ARRAY_DTYPES` (docs/protocol.md section 3.3). The message
types live in :mod:`zmq_rl.wire.protocol`, the space specs and structured values in
:mod:`zmq_rl.wire.spaces`; both build on this module, which imports neither.
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

PROTOCOL_VERSION = 2
"""Bumped whenever a message changes incompatibly (docs/protocol.md section 9)."""

ARRAY_DTYPES = (
    "bool",
    "int8",
    "uint8",
    "int16",
    "int32",
    "int64",
    "float16",
    "float32",
    "float64",
)
"""The only dtypes an array may declare (little-endian for multi-byte types)."""

MAX_ARRAY_DIMS = 8

MAX_ENVS_PER_ACTOR = 4096
"""The most env slots one actor may run (hello ``num_envs``, welcome ``num_envs``)."""

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024

MAX_ABS_VALUE = 1e9
"""Rewards, values and log-probs beyond this magnitude are refused (the learner's
``out_of_range``): finite but absurd numbers would otherwise overflow the loss."""


class ProtocolError(ValueError):
    """A frame is not a valid message of this protocol version.

    ``reason`` is a short stable code (``"not_msgpack"``, ``"bad_field"``, ...) under
    which receivers count rejects; the message says what exactly is wrong.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class ProtocolVersionMismatch(ProtocolError):
    """The peer speaks another protocol version (``theirs``) than we do."""

    def __init__(self, theirs: Any) -> None:
        super().__init__(
            "version_mismatch",
            f"protocol version mismatch: peer speaks {theirs!r}, we speak {PROTOCOL_VERSION}",
        )
        self.theirs = theirs


# --------------------------------------------------------------------------- arrays


_ONE_BYTE = ("bool", "int8", "uint8")
_WIRE: dict[str, np.dtype] = {
    name: (np.dtype(name) if name in _ONE_BYTE else np.dtype(name).newbyteorder("<"))
    for name in ARRAY_DTYPES
}
"""Wire dtype string -> the numpy dtype its bytes are read as (built once)."""
_NAME: dict[np.dtype, str] = {}
for _name in ARRAY_DTYPES:
    for _order in ("<", ">", "="):
        _NAME.setdefault(np.dtype(_name).newbyteorder(_order), _name)
_ARRAY_KEYS = frozenset(("dtype", "shape", "data"))


def encode_array(array: np.ndarray) -> dict[str, Any]:
    """Encode a numpy array as ``{"dtype", "shape", "data"}`` (raw C-order bytes).

    Dtype names come from a dict keyed by ``np.dtype`` (``ndarray.dtype.name`` is a
    slow Python-level property in numpy 2, and this runs ten times per fragment).
    """
    if type(array) is not np.ndarray:
        array = np.asarray(array)
    dtype = array.dtype
    name = _NAME.get(dtype)
    if name is None:
        raise TypeError(f"dtype {dtype.name} cannot travel; allowed: {', '.join(ARRAY_DTYPES)}")
    if dtype.byteorder == ">":
        array = array.astype(dtype.newbyteorder("<"))
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    return {"dtype": name, "shape": list(array.shape), "data": array.tobytes()}


def decode_array(value: Any, where: str) -> np.ndarray:
    """Decode and validate an encoded array; the result is a read-only view."""
    if not isinstance(value, dict) or len(value) != 3 or not _ARRAY_KEYS.issuperset(value):
        raise ProtocolError("bad_array", f"{where}: expected an array map {{dtype, shape, data}}")
    dtype, shape, data = value["dtype"], value["shape"], value["data"]
    np_dtype = _WIRE.get(dtype) if type(dtype) is str else None
    if np_dtype is None:
        raise ProtocolError("bad_dtype", f"{where}: dtype {dtype!r} is not one of {ARRAY_DTYPES}")
    if not isinstance(shape, list) or len(shape) > MAX_ARRAY_DIMS:
        raise ProtocolError("bad_shape", f"{where}: shape {shape!r} is not a list of ints >= 0")
    count = 1
    for d in shape:
        if type(d) is not int or d < 0:
            raise ProtocolError("bad_shape", f"{where}: shape {shape!r} is not a list of ints >= 0")
        count *= d
    if not isinstance(data, bytes):
        raise ProtocolError("bad_array", f"{where}: data must be bytes")
    expected = count * np_dtype.itemsize
    if expected != len(data):
        raise ProtocolError(
            "size_mismatch",
            f"{where}: shape {shape} of {dtype} needs {expected} bytes, got {len(data)}",
        )
    if dtype == "bool" and data.translate(None, b"\x00\x01"):
        raise ProtocolError("bad_value", f"{where}: bool array holds bytes other than 0 and 1")
    return np.frombuffer(data, dtype=np_dtype).reshape(shape)


def _str_keys(pairs: list[tuple[Any, Any]]) -> dict[str, Any]:
    """A decoded msgpack map whose every key is a ``str`` (docs/protocol.md section 3.1);
    any other key (an int, a bin, ...) makes the frame ``not_msgpack``."""
    for key, _ in pairs:
        if type(key) is not str:
            raise ValueError(f"a map key is a {type(key).__name__} ({key!r}), not a str")
    return dict(pairs)


def unpack_map(frame: bytes | memoryview, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> dict:
    """The msgpack map of one frame, read with every length bounded (no allocation
    larger than the frame can claim); raises :class:`ProtocolError` ``too_large``,
    ``not_msgpack`` (also for a map key, anywhere in the frame, that is not a ``str``)
    or ``not_a_map``. Shared by every receiver of this protocol family (the learner
    and actor, and the inference server)."""
    if len(frame) > max_bytes:
        raise ProtocolError("too_large", f"message of {len(frame)} bytes exceeds {max_bytes}")
    try:
        body = msgpack.unpackb(
            frame,
            raw=False,
            strict_map_key=True,
            object_pairs_hook=_str_keys,
            use_list=True,
            max_bin_len=max_bytes,
            max_str_len=1 << 20,
            max_array_len=1 << 20,
            max_map_len=1 << 16,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises several unrelated types
        raise ProtocolError("not_msgpack", f"not a msgpack message: {exc}") from None
    if not isinstance(body, dict):
        raise ProtocolError("not_a_map", f"message is a {type(body).__name__}, not a map")
    return body


# --------------------------------------------------------------------------- limits


def finite_problem(array: np.ndarray, where: str) -> str | None:
    """``"<where>: holds NaN or inf"`` when a float array holds one, else None: what a
    learner refuses as ``not_finite`` (docs/protocol.md section 4.1). The one definition
    every sender checks against before its rows leave (actor, inference server)."""
    if array.dtype.kind == "f" and array.size and not np.isfinite(array).all():
        return f"{where}: holds NaN or inf"
    return None


def magnitude_problem(array: np.ndarray, where: str) -> str | None:
    """``"|<where>| exceeds 1e+09"`` when a value's magnitude passes
    :data:`MAX_ABS_VALUE` (rewards, values, log-probs), else None: what a learner
    refuses as ``out_of_range``."""
    if array.size and float(np.abs(array).max()) > MAX_ABS_VALUE:
        return f"|{where}| exceeds {MAX_ABS_VALUE:g}"
    return None


def named_leaves(value: Any, where: str) -> list[tuple[str, np.ndarray]]:
    """The arrays of a value (an array, or maps and lists of them: a structured
    space's value) with their field paths: ``obs``, ``obs.pos``, ``obs[1]``."""
    if isinstance(value, dict):
        return [pair for k, v in value.items() for pair in named_leaves(v, f"{where}.{k}")]
    if isinstance(value, (tuple, list)):
        return [pair for i, v in enumerate(value) for pair in named_leaves(v, f"{where}[{i}]")]
    return [(where, np.asarray(value))]


def first_bad_row(array: np.ndarray, magnitude: bool = False) -> int:
    """The first row (leading index) of ``array`` holding NaN or inf (``magnitude``:
    or a magnitude past :data:`MAX_ABS_VALUE`); -1 when none does."""
    rows = np.asarray(array, np.float64).reshape(len(array), -1) if np.ndim(array) else None
    if rows is None:
        return -1
    bad = ~np.isfinite(rows)
    if magnitude:
        bad |= np.abs(np.nan_to_num(rows)) > MAX_ABS_VALUE
    hits = np.flatnonzero(bad.any(axis=1))
    return int(hits[0]) if hits.size else -1
