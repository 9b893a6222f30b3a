"""Prototype of a faster protocol codec, installed by monkeypatching (bench only).

Not used by the package: the transport benchmark installs it with
``--prototype`` to measure what the proposed core change to
``zmq_rl/protocol.py`` would gain. Semantics are meant to be identical to the
current functions (same accepted frames, same ``ProtocolError`` reasons); check
with::

    python bench/fastproto.py --check     # runs tests/test_protocol.py patched

What changes (all in ``zmq_rl/protocol.py``):

* ``encode_array`` / ``_array``: look dtype names up in a dict keyed by
  ``np.dtype`` instead of reading ``ndarray.dtype.name`` (a Python-level property
  in numpy 2 that costs ~2.5 us per call, 10 calls per fragment each way);
* ``decode_array``: the numpy dtype for a wire dtype string comes from a dict
  built once (instead of ``np.dtype(name).newbyteorder("<")`` per array); the
  bool 0/1 check scans the raw bytes (``bytes.translate``) instead of calling
  ``np.isin`` (~10 us per bool array, two per fragment);
* ``Fragment.from_map``: the final-observation index check short-circuits when
  no row is truncated (a byte search on the validated bool bytes) instead of
  ``flatnonzero`` + ``astype`` + ``array_equal`` on every fragment.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from zmq_rl import protocol as P

_ORIGINAL: dict[str, Any] = {}

_ONE_BYTE = ("bool", "int8", "uint8")
_WIRE: dict[str, np.dtype] = {
    name: (np.dtype(name) if name in _ONE_BYTE else np.dtype(name).newbyteorder("<"))
    for name in P.ARRAY_DTYPES
}
"""Wire dtype string -> the numpy dtype its bytes are read as."""
_NAME: dict[np.dtype, str] = {}
for _name in P.ARRAY_DTYPES:
    for _order in ("<", ">", "="):
        _NAME.setdefault(np.dtype(_name).newbyteorder(_order), _name)
_ARRAY_KEYS = frozenset(("dtype", "shape", "data"))


def encode_array(array: np.ndarray) -> dict[str, Any]:
    if type(array) is not np.ndarray:
        array = np.asarray(array)
    dtype = array.dtype
    name = _NAME.get(dtype)
    if name is None:
        raise TypeError(f"dtype {dtype.name} cannot travel; allowed: {', '.join(P.ARRAY_DTYPES)}")
    if dtype.byteorder == ">":
        array = array.astype(dtype.newbyteorder("<"))
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    return {"dtype": name, "shape": list(array.shape), "data": array.tobytes()}


def decode_array(value: Any, where: str) -> np.ndarray:
    if not isinstance(value, dict) or len(value) != 3 or not _ARRAY_KEYS.issuperset(value):
        raise P.ProtocolError("bad_array", f"{where}: expected an array map {{dtype, shape, data}}")
    dtype, shape, data = value["dtype"], value["shape"], value["data"]
    np_dtype = _WIRE.get(dtype) if type(dtype) is str else None
    if np_dtype is None:
        raise P.ProtocolError(
            "bad_dtype", f"{where}: dtype {dtype!r} is not one of {P.ARRAY_DTYPES}"
        )
    if not isinstance(shape, list) or len(shape) > P.MAX_ARRAY_DIMS:
        raise P.ProtocolError("bad_shape", f"{where}: shape {shape!r} is not a list of ints >= 0")
    count = 1
    for d in shape:
        if type(d) is not int or d < 0:
            raise P.ProtocolError(
                "bad_shape", f"{where}: shape {shape!r} is not a list of ints >= 0"
            )
        count *= d
    if not isinstance(data, bytes):
        raise P.ProtocolError("bad_array", f"{where}: data must be bytes")
    expected = count * np_dtype.itemsize
    if expected != len(data):
        raise P.ProtocolError(
            "size_mismatch",
            f"{where}: shape {shape} of {dtype} needs {expected} bytes, got {len(data)}",
        )
    if dtype == "bool" and data.translate(None, b"\x00\x01"):
        raise P.ProtocolError("bad_value", f"{where}: bool array holds bytes other than 0 and 1")
    return np.frombuffer(data, dtype=np_dtype).reshape(shape)


def _array(value: Any, where: str, dtypes: tuple[str, ...], ndim: int | None = None) -> np.ndarray:
    array = decode_array(value, where)
    name = value["dtype"]  # validated by decode_array: the array's dtype name
    if name not in dtypes:
        raise P.ProtocolError("bad_dtype", f"{where}: dtype {name}, expected {dtypes}")
    if ndim is not None and array.ndim != ndim:
        raise P.ProtocolError(
            "bad_shape", f"{where}: expected {ndim} dims, got {list(array.shape)}"
        )
    return array


def _require_finite(array: np.ndarray, where: str) -> None:
    if array.dtype.kind == "f" and array.size and not np.isfinite(array).all():
        raise P.ProtocolError("not_finite", f"{where}: holds NaN or inf")


def fragment_from_map(cls: type, body: dict[str, Any]) -> Any:
    """``Fragment.from_map`` with the same checks in the same order, cheaper."""
    _arr = _array
    arrays = {
        "obs": _arr(body.get("obs"), "fragment.obs", P.OBS_DTYPES),
        "actions": _arr(body.get("actions"), "fragment.actions", P.ACTION_DTYPES),
        "rewards": _arr(body.get("rewards"), "fragment.rewards", P.FLOAT_DTYPES, 1),
        "terminated": _arr(body.get("terminated"), "fragment.terminated", ("bool",), 1),
        "truncated": _arr(body.get("truncated"), "fragment.truncated", ("bool",), 1),
        "values": _arr(body.get("values"), "fragment.values", P.FLOAT_DTYPES, 1),
        "log_probs": _arr(body.get("log_probs"), "fragment.log_probs", P.FLOAT_DTYPES, 1),
        "next_obs": _arr(body.get("next_obs"), "fragment.next_obs", P.OBS_DTYPES),
        "final_obs_index": _arr(
            body.get("final_obs_index"), "fragment.final_obs_index", ("int32", "int64"), 1
        ),
        "final_obs": _arr(body.get("final_obs"), "fragment.final_obs", P.OBS_DTYPES),
    }
    length = arrays["rewards"].shape[0]
    if length < 1:
        raise P.ProtocolError("bad_shape", "fragment: T must be >= 1")
    for name in ("obs", "actions", "terminated", "truncated", "values", "log_probs"):
        if arrays[name].ndim < 1 or arrays[name].shape[0] != length:
            raise P.ProtocolError(
                "bad_shape",
                f"fragment.{name}: leading dim {list(arrays[name].shape)} != T={length}",
            )
    if arrays["actions"].ndim > 2:
        raise P.ProtocolError("bad_shape", "fragment.actions: expected [T] or [T, act_dim]")
    obs_shape = arrays["obs"].shape[1:]
    if arrays["next_obs"].shape != obs_shape:
        raise P.ProtocolError(
            "bad_shape",
            f"fragment.next_obs: shape {list(arrays['next_obs'].shape)} != obs "
            f"row shape {list(obs_shape)}",
        )
    index = arrays["final_obs_index"]
    if arrays["final_obs"].shape != (index.shape[0], *obs_shape):
        raise P.ProtocolError(
            "bad_shape",
            f"fragment.final_obs: shape {list(arrays['final_obs'].shape)} != "
            f"[{index.shape[0]}, {', '.join(map(str, obs_shape))}]",
        )
    # Bool bytes are validated 0/1 above, so "no truncated row" is a byte search.
    if index.shape[0] or b"\x01" in body["truncated"]["data"]:
        needs_final = np.flatnonzero(arrays["truncated"] & ~arrays["terminated"])
        if not np.array_equal(index.astype(np.int64), needs_final):
            raise P.ProtocolError(
                "bad_field",
                f"fragment.final_obs_index: {index.tolist()} must list exactly the truncated, "
                f"non-terminated rows {needs_final.tolist()}",
            )
    for name in ("obs", "actions", "rewards", "values", "log_probs", "next_obs", "final_obs"):
        _require_finite(arrays[name], f"fragment.{name}")
    return cls(
        actor_id=P._int(body.get("actor_id"), "fragment.actor_id"),
        slot=P._int(body.get("slot"), "fragment.slot", 0, 65535),
        version=P._int(body.get("version"), "fragment.version"),
        seq=P._int(body.get("seq"), "fragment.seq"),
        run_id=P._str(body.get("run_id"), "fragment.run_id"),
        sent_at=P._finite_float(body.get("sent_at", 0.0), "fragment.sent_at"),
        **arrays,
    )


def install() -> None:
    """Patch ``zmq_rl.protocol`` in this process (idempotent)."""
    if _ORIGINAL:
        return
    for name, fn in (
        ("encode_array", encode_array),
        ("decode_array", decode_array),
        ("_array", _array),
        ("_require_finite", _require_finite),
    ):
        _ORIGINAL[name] = getattr(P, name)
        setattr(P, name, fn)
    _ORIGINAL["Fragment.from_map"] = P.Fragment.__dict__["from_map"]
    P.Fragment.from_map = classmethod(fragment_from_map)


def uninstall() -> None:
    """Undo :func:`install`."""
    if not _ORIGINAL:
        return
    for name in ("encode_array", "decode_array", "_array", "_require_finite"):
        setattr(P, name, _ORIGINAL[name])
    P.Fragment.from_map = _ORIGINAL["Fragment.from_map"]
    _ORIGINAL.clear()


def _check() -> int:
    """Run the protocol and rollout tests with the prototype installed."""
    import os

    import pytest

    install()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tests = [os.path.join(root, "tests", t) for t in ("test_protocol.py", "test_rollout.py")]
    return pytest.main(["-q", "-p", "no:cacheprovider", *tests])


if __name__ == "__main__":
    if "--check" in sys.argv:
        sys.exit(_check())
    print(__doc__)


# ------------------------------------------------------------------ a packed-row wire sketch
#
# What a protocol v2 fragment could look like: the seven per-row arrays travel as ONE
# record array (``rows``, raw bytes of a numpy structured dtype whose obs / action
# parts are declared once per message as [dtype, shape]) instead of seven
# {dtype, shape, data} maps. Decoding is one msgpack map of scalars and three bins,
# one frombuffer, a handful of vectorised checks, and Fragment fields that are
# views into the record array. Measured by ``bench/transport.py`` as the
# ``project+packed`` variant; not a finished design (no generic extras, CartPole-
# sized rows assumed only by the benchmark, not by this code).

_PACKED_TYPE = "fragment_packed"
_ROW_CACHE: dict[tuple, np.dtype] = {}


def _row_dtype(obs_spec: Any, act_spec: Any) -> np.dtype:
    key = (obs_spec[0], tuple(obs_spec[1]), act_spec[0], tuple(act_spec[1]))
    row = _ROW_CACHE.get(key)
    if row is None:
        if (
            obs_spec[0] not in P.OBS_DTYPES
            or act_spec[0] not in P.ACTION_DTYPES
            or len(key[1]) > P.MAX_ARRAY_DIMS
            or len(key[3]) > 1
        ):
            raise P.ProtocolError("bad_dtype", f"fragment: row layout {key} not allowed")
        # float32 columns first, so that with float32 observations every float of a
        # row is one strided [T, k] view (one isfinite call), flags last (one check).
        row = np.dtype(
            [
                ("obs", _WIRE[obs_spec[0]], key[1]),
                ("rewards", "<f4"),
                ("values", "<f4"),
                ("log_probs", "<f4"),
                ("actions", _WIRE[act_spec[0]], key[3]),
                ("terminated", "u1"),
                ("truncated", "u1"),
            ]
        )
        if len(_ROW_CACHE) < 64:
            _ROW_CACHE[key] = row
    return row


def encode_packed(fragment: Any) -> bytes:
    obs, actions = fragment.obs, fragment.actions
    obs_spec = [_NAME[obs.dtype], list(obs.shape[1:])]
    act_spec = [_NAME[actions.dtype], list(actions.shape[1:])]
    rows = np.empty(len(fragment.rewards), _row_dtype(obs_spec, act_spec))
    rows["obs"] = obs
    rows["actions"] = actions
    rows["rewards"] = fragment.rewards
    rows["terminated"] = fragment.terminated
    rows["truncated"] = fragment.truncated
    rows["values"] = fragment.values
    rows["log_probs"] = fragment.log_probs
    final = fragment.final_obs
    return P.msgpack.packb(
        {
            "proto": 2,
            "type": _PACKED_TYPE,
            "actor_id": fragment.actor_id,
            "slot": fragment.slot,
            "version": fragment.version,
            "seq": fragment.seq,
            "run_id": fragment.run_id,
            "sent_at": float(fragment.sent_at),
            "obs": obs_spec,
            "actions": act_spec,
            "rows": rows.tobytes(),
            "next_obs": np.ascontiguousarray(fragment.next_obs).tobytes(),
            "final_obs_index": [int(i) for i in fragment.final_obs_index],
            "final_obs": b"" if final is None else np.ascontiguousarray(final).tobytes(),
        },
        use_bin_type=True,
    )


def decode_packed(frame: Any, max_bytes: int = P.DEFAULT_MAX_MESSAGE_BYTES) -> Any:
    if len(frame) > max_bytes:
        raise P.ProtocolError("too_large", f"message of {len(frame)} bytes exceeds {max_bytes}")
    try:
        body = P.msgpack.unpackb(
            frame,
            raw=False,
            strict_map_key=True,
            max_bin_len=max_bytes,
            max_str_len=1 << 20,
            max_array_len=1 << 20,
            max_map_len=64,
            max_ext_len=0,
        )
    except Exception as exc:  # noqa: BLE001
        raise P.ProtocolError("not_msgpack", f"not a msgpack message: {exc}") from None
    if type(body) is not dict or body.get("type") != _PACKED_TYPE:
        raise P.ProtocolError("unknown_type", "not a packed fragment")
    try:
        row = _row_dtype(body["obs"], body["actions"])
        data = body["rows"]
        if type(data) is not bytes or not data or len(data) % row.itemsize:
            raise P.ProtocolError("size_mismatch", "fragment.rows: not a whole number of rows")
        rows = np.frombuffer(data, row)
        obs_shape = row["obs"].shape
        next_obs = np.frombuffer(body["next_obs"], row["obs"].base).reshape(obs_shape)
        index = np.asarray(body["final_obs_index"], np.int64)
        final = np.frombuffer(body["final_obs"], row["obs"].base).reshape((len(index), *obs_shape))
    except P.ProtocolError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise P.ProtocolError("bad_field", f"fragment: {exc}") from None
    n, size = len(rows), row.itemsize
    flags = np.ndarray((n, 2), np.uint8, data, size - 2, (size, 1))
    if flags.max() > 1:
        raise P.ProtocolError("bad_value", "fragment: flags other than 0 and 1")
    terminated, truncated = rows["terminated"], rows["truncated"]
    if len(index) or flags[:, 1].any():
        needs = np.flatnonzero(truncated & (terminated ^ 1))
        if not np.array_equal(index, needs):
            raise P.ProtocolError("bad_field", "fragment.final_obs_index: wrong rows")
    obs_dtype = row["obs"].base
    if obs_dtype == np.float32:  # obs + rewards + values + log_probs: one view, one check
        k = int(np.prod(row["obs"].shape, dtype=np.int64)) + 3
        if not np.isfinite(np.ndarray((n, k), np.float32, data, 0, (size, 4))).all():
            raise P.ProtocolError("not_finite", "fragment: a float holds NaN or inf")
        checks: tuple[str, ...] = ("actions",)
    else:
        checks = ("obs", "actions", "rewards", "values", "log_probs")
    for name in checks:
        column = rows[name]
        if column.dtype.kind == "f" and not np.isfinite(column).all():
            raise P.ProtocolError("not_finite", f"fragment.{name}: holds NaN or inf")
    if not (np.isfinite(next_obs).all() and np.isfinite(final).all()):
        raise P.ProtocolError("not_finite", "fragment.next_obs/final_obs: NaN or inf")
    return P.Fragment(
        actor_id=P._int(body.get("actor_id"), "fragment.actor_id"),
        slot=P._int(body.get("slot"), "fragment.slot", 0, 65535),
        version=P._int(body.get("version"), "fragment.version"),
        seq=P._int(body.get("seq"), "fragment.seq"),
        run_id=P._str(body.get("run_id"), "fragment.run_id"),
        sent_at=P._finite_float(body.get("sent_at", 0.0), "fragment.sent_at"),
        obs=rows["obs"],
        actions=rows["actions"],
        rewards=rows["rewards"],
        terminated=terminated.view(bool),
        truncated=truncated.view(bool),
        values=rows["values"],
        log_probs=rows["log_probs"],
        next_obs=next_obs,
        final_obs_index=index,
        final_obs=final,
    )
