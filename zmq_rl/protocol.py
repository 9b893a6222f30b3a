"""Wire protocol v1: every message that crosses a socket, and nothing else.

A message is one ZeroMQ frame holding one msgpack map. Every map has

* ``"proto"``: the protocol version (:data:`PROTOCOL_VERSION`), and
* ``"type"``: the message type (``"fragment"``, ``"weights"``, ``"hello"``, ...),

plus the fields of that type. Arrays travel as a map
``{"dtype": str, "shape": [int, ...], "data": bin}`` holding the raw little-endian,
C-ordered bytes of a numpy array whose dtype is one of :data:`ARRAY_DTYPES`.
Nothing here constructs arbitrary objects: msgpack yields only maps, lists,
strings, numbers and bytes, and every field is checked before a message object
exists. ``docs/protocol.md`` is the normative specification of the same rules.

``encode(msg) -> bytes`` and ``decode(frame) -> Message`` are the only entry
points the socket code needs. ``decode`` raises :class:`ProtocolError` (with a
``reason`` code used by the reject counters) for anything malformed.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar

import msgpack
import numpy as np

if TYPE_CHECKING:  # gymnasium is imported where spaces are built, not by every peer
    import gymnasium as gym

PROTOCOL_VERSION = 1
"""Bumped whenever a message changes incompatibly."""

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


class ProtocolError(ValueError):
    """A frame is not a valid protocol-v1 message.

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


# --------------------------------------------------------------------------- spaces


def space_spec(space: Any) -> dict[str, Any]:
    """Describe a gymnasium ``Box`` or ``Discrete`` space as a plain map."""
    from gymnasium import spaces

    if isinstance(space, spaces.Discrete):
        return {"kind": "discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.Box):
        return {
            "kind": "box",
            "shape": list(space.shape),
            "dtype": space.dtype.name,
            "low": encode_array(np.asarray(space.low)),
            "high": encode_array(np.asarray(space.high)),
        }
    raise TypeError(f"space {space} is not supported (only Box and Discrete)")


def space_from_spec(spec: Any, where: str = "space") -> Any:
    """Rebuild a gymnasium space from :func:`space_spec` output, validating it."""
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
                or not (-(2**31) <= start <= 2**31)
            ):
                raise ProtocolError("bad_field", f"{where}: discrete n={n!r} start={start!r}")
            return spaces.Discrete(n, start=start)
        if kind == "box":
            low = decode_array(spec.get("low"), f"{where}.low")
            high = decode_array(spec.get("high"), f"{where}.high")
            shape = spec.get("shape")
            dtype = spec.get("dtype")
            if dtype not in ARRAY_DTYPES or list(low.shape) != shape or list(high.shape) != shape:
                raise ProtocolError("bad_field", f"{where}: inconsistent box {shape} {dtype}")
            return spaces.Box(low=low, high=high, shape=tuple(shape), dtype=np.dtype(dtype))
    except (TypeError, ValueError, OverflowError) as exc:
        if isinstance(exc, ProtocolError):
            raise
        raise ProtocolError("bad_field", f"{where}: {exc}") from exc
    raise ProtocolError("bad_field", f"{where}: unknown space kind {kind!r}")


# --------------------------------------------------------------------------- field checks


def _int(value: Any, where: str, lo: int = 0, hi: int = 2**63 - 1) -> int:
    if type(value) is not int or not lo <= value <= hi:
        raise ProtocolError("bad_field", f"{where}: expected an int in [{lo}, {hi}], got {value!r}")
    return value


def _str(value: Any, where: str, max_len: int = 256) -> str:
    if not isinstance(value, str) or len(value) > max_len:
        raise ProtocolError("bad_field", f"{where}: expected a string of <= {max_len} chars")
    return value


def _int_list(value: Any, where: str, lo: int = 0) -> list[int]:
    if not isinstance(value, list) or len(value) > 4096:
        raise ProtocolError("bad_field", f"{where}: expected a list of at most 4096 ints")
    return [_int(v, f"{where}[]", lo) for v in value]


def _finite_float(value: Any, where: str) -> float:
    if type(value) not in (int, float) or not math.isfinite(value):
        raise ProtocolError("bad_value", f"{where}: expected a finite number, got {value!r}")
    return float(value)


def _optional_number(
    value: Any, where: str, lo: float = -math.inf, hi: float = math.inf
) -> float | None:
    """None when absent; else a finite number (int or float) in ``[lo, hi]``."""
    if value is None:
        return None
    number = _finite_float(value, where)
    if not lo <= number <= hi:
        raise ProtocolError(
            "bad_field", f"{where}: expected a number in [{lo}, {hi}], got {value!r}"
        )
    return number


def _positive_float(value: Any, where: str) -> float:
    """A finite number > 0; an int is accepted where a float is meant (msgpack encoders
    may write 1.0 as 1)."""
    if type(value) not in (int, float) or not math.isfinite(value) or value <= 0:
        raise ProtocolError("bad_field", f"{where}: expected a number > 0, got {value!r}")
    return float(value)


def _map(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ProtocolError("bad_field", f"{where}: expected a map with string keys")
    return value


def _numbers(value: Any, where: str) -> dict[str, float]:
    """A flat map of string -> finite number (stats, counters)."""
    out = {}
    for key, number in _map(value, where).items():
        out[key] = _finite_float(number, f"{where}.{key}")
    return out


def _array(value: Any, where: str, dtypes: tuple[str, ...], ndim: int | None = None) -> np.ndarray:
    array = decode_array(value, where)
    name = value["dtype"]  # validated by decode_array
    if name not in dtypes:
        raise ProtocolError("bad_dtype", f"{where}: dtype {name}, expected {dtypes}")
    if ndim is not None and array.ndim != ndim:
        raise ProtocolError("bad_shape", f"{where}: expected {ndim} dims, got {list(array.shape)}")
    return array


def _require_finite(array: np.ndarray, where: str) -> None:
    if array.dtype.kind == "f" and array.size and not np.isfinite(array).all():
        raise ProtocolError("not_finite", f"{where}: holds NaN or inf")


# --------------------------------------------------------------------------- messages


class Message:
    """Base of every message type; ``TYPE`` is its ``"type"`` string."""

    TYPE: ClassVar[str] = ""

    def to_map(self) -> dict[str, Any]:
        """The msgpack map of this message (without the envelope)."""
        raise NotImplementedError

    @classmethod
    def from_map(cls, body: dict[str, Any]) -> Message:
        """Validate ``body`` and build the message, or raise ProtocolError."""
        raise NotImplementedError


FLOAT_DTYPES = ("float32", "float64")
OBS_DTYPES = ("float32", "float64", "float16", "uint8", "int8", "int16", "int32", "int64")
ACTION_DTYPES = ("int64", "int32", "float32", "float64")


@dataclass
class StepArrays:
    """The arrays of a block of env steps, one row per step, named once.

    The same record is a fragment's rows (``[T, ...]``), the client's lockstep
    buffer (``[T, num_envs, ...]``) and a learner rollout (``[T, B, ...]``): adding
    a field to experience means adding it here (with its row in :data:`STEP_WIRE`)
    and in ``docs/protocol.md``. Row ``t`` holds the observation the action was
    taken in, the action, and what the step returned.
    """

    obs: np.ndarray  # [*lead, *obs_shape]
    actions: np.ndarray  # [*lead] (discrete) or [*lead, act_dim] (continuous)
    rewards: np.ndarray  # [*lead] float32
    terminated: np.ndarray  # [*lead] bool
    truncated: np.ndarray  # [*lead] bool
    values: np.ndarray  # [*lead] float32, behaviour V(obs_t)
    log_probs: np.ndarray  # [*lead] float32, behaviour log mu(a_t | obs_t)

    STEP_FIELDS: ClassVar[tuple[str, ...]] = (
        "obs",
        "actions",
        "rewards",
        "terminated",
        "truncated",
        "values",
        "log_probs",
    )

    @property
    def length(self) -> int:
        """T, the number of rows (the leading dimension)."""
        return int(self.rewards.shape[0])

    def step_arrays(self) -> dict[str, np.ndarray]:
        """The step fields by name (what ``StepArrays(**...)`` takes)."""
        return {name: getattr(self, name) for name in self.STEP_FIELDS}

    def select(self, index: Any) -> StepArrays:
        """The same rows of every field (``index`` as for numpy), as views where
        numpy gives views: ``steps.select((slice(0, n), slot))`` is one slot's rows."""
        return StepArrays(**{name: getattr(self, name)[index] for name in self.STEP_FIELDS})

    def write(self, index: Any, source: StepArrays) -> None:
        """Copy ``source``'s fields into rows ``index`` of this record's arrays (numpy
        converts them to these arrays' dtypes). The actor's hot path: per-step cost."""
        mine, theirs = self.__dict__, source.__dict__
        for name in self.STEP_FIELDS:
            mine[name][index] = theirs[name]

    @classmethod
    def coerce(cls, *arrays: Any) -> StepArrays:
        """The arrays of :attr:`STEP_FIELDS`, in that order, as they travel:
        observations and actions keep their dtype, the other fields take their fixed
        dtype from :data:`STEP_DTYPES`."""
        if len(arrays) != len(cls.STEP_FIELDS):
            raise TypeError(f"StepArrays.coerce takes {', '.join(cls.STEP_FIELDS)}")
        return cls(*[np.asarray(a, dtype) for a, dtype in zip(arrays, _COERCE_DTYPES, strict=True)])

    @classmethod
    def allocate(
        cls,
        lead: tuple[int, ...],
        obs_shape: tuple[int, ...],
        obs_dtype: Any,
        action_shape: tuple[int, ...],
        action_dtype: Any,
    ) -> StepArrays:
        """Uninitialised arrays of leading shape ``lead`` (``(T, B)`` for a rollout)."""
        arrays = {name: np.empty(lead, dtype) for name, dtype in STEP_DTYPES.items()}
        arrays["obs"] = np.empty((*lead, *obs_shape), obs_dtype)
        arrays["actions"] = np.empty((*lead, *action_shape), action_dtype)
        return cls(**arrays)


STEP_DTYPES: dict[str, Any] = {
    "rewards": np.float32,
    "terminated": np.bool_,
    "truncated": np.bool_,
    "values": np.float32,
    "log_probs": np.float32,
}
"""The fixed dtype of each step field (observations and actions keep the env's)."""
_COERCE_DTYPES = tuple(STEP_DTYPES.get(name) for name in StepArrays.STEP_FIELDS)

STEP_WIRE: dict[str, tuple[tuple[str, ...], int | None]] = {
    "obs": (OBS_DTYPES, None),
    "actions": (ACTION_DTYPES, None),
    "rewards": (FLOAT_DTYPES, 1),
    "terminated": (("bool",), 1),
    "truncated": (("bool",), 1),
    "values": (FLOAT_DTYPES, 1),
    "log_probs": (FLOAT_DTYPES, 1),
}
"""Per step field of a fragment: the dtypes it may travel as, and its rank when fixed."""


@dataclass
class Fragment(StepArrays, Message):
    """T >= 1 consecutive steps of one env slot of one actor: :class:`StepArrays`
    plus where they come from and what follows them.

    ``next_obs`` is the observation after the last row (the reset observation when
    the last row ended an episode). For every row that was truncated (and not
    terminated) ``final_obs`` holds the true last observation of that episode, in
    row order, and ``final_obs_index`` the row numbers, so the learner can
    bootstrap V(final observation).
    """

    TYPE: ClassVar[str] = "fragment"

    actor_id: int
    slot: int
    version: int
    seq: int
    run_id: str
    next_obs: np.ndarray  # [*obs_shape]
    final_obs_index: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # [K]
    final_obs: np.ndarray | None = None  # [K, *obs_shape]
    sent_at: float = 0.0

    ARRAYS: ClassVar[tuple[str, ...]] = (
        *StepArrays.STEP_FIELDS,
        "next_obs",
        "final_obs_index",
        "final_obs",
    )

    def to_map(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "actor_id": self.actor_id,
            "slot": self.slot,
            "version": self.version,
            "seq": self.seq,
            "run_id": self.run_id,
            "sent_at": float(self.sent_at),
        }
        final_obs = self.final_obs
        if final_obs is None:
            final_obs = np.zeros((0, *self.next_obs.shape), self.next_obs.dtype)
        for name in self.ARRAYS:
            body[name] = encode_array(final_obs if name == "final_obs" else getattr(self, name))
        return body

    @classmethod
    def from_map(cls, body: dict[str, Any]) -> Fragment:
        arrays = {
            name: _array(body.get(name), f"fragment.{name}", dtypes, ndim)
            for name, (dtypes, ndim) in STEP_WIRE.items()
        }
        arrays["next_obs"] = _array(body.get("next_obs"), "fragment.next_obs", OBS_DTYPES)
        arrays["final_obs_index"] = _array(
            body.get("final_obs_index"), "fragment.final_obs_index", ("int32", "int64"), 1
        )
        arrays["final_obs"] = _array(body.get("final_obs"), "fragment.final_obs", OBS_DTYPES)
        length = arrays["rewards"].shape[0]
        if length < 1:
            raise ProtocolError("bad_shape", "fragment: T must be >= 1")
        for name in StepArrays.STEP_FIELDS:
            if arrays[name].ndim < 1 or arrays[name].shape[0] != length:
                raise ProtocolError(
                    "bad_shape",
                    f"fragment.{name}: leading dim {list(arrays[name].shape)} != T={length}",
                )
        if arrays["actions"].ndim > 2:
            raise ProtocolError("bad_shape", "fragment.actions: expected [T] or [T, act_dim]")
        obs_shape = arrays["obs"].shape[1:]
        if arrays["next_obs"].shape != obs_shape:
            raise ProtocolError(
                "bad_shape",
                f"fragment.next_obs: shape {list(arrays['next_obs'].shape)} != obs "
                f"row shape {list(obs_shape)}",
            )
        index = arrays["final_obs_index"]
        if arrays["final_obs"].shape != (index.shape[0], *obs_shape):
            raise ProtocolError(
                "bad_shape",
                f"fragment.final_obs: shape {list(arrays['final_obs'].shape)} != "
                f"[{index.shape[0]}, {', '.join(map(str, obs_shape))}]",
            )
        for name in ("next_obs", "final_obs"):
            if arrays[name].dtype != arrays["obs"].dtype:
                raise ProtocolError(
                    "bad_dtype",
                    f"fragment.{name}: dtype {arrays[name].dtype} != obs dtype "
                    f"{arrays['obs'].dtype}",
                )
        # Bool bytes are validated 0/1, so "no truncated row" is a byte search.
        needs_final = (
            np.flatnonzero(arrays["truncated"] & ~arrays["terminated"])
            if index.shape[0] or b"\x01" in body["truncated"]["data"]
            else index
        )
        if not np.array_equal(index.astype(np.int64), needs_final):
            raise ProtocolError(
                "bad_field",
                f"fragment.final_obs_index: {index.tolist()} must list exactly the truncated, "
                f"non-terminated rows {needs_final.tolist()}",
            )
        for name, array in arrays.items():
            _require_finite(array, f"fragment.{name}")
        return cls(
            actor_id=_int(body.get("actor_id"), "fragment.actor_id"),
            slot=_int(body.get("slot"), "fragment.slot", 0, 65535),
            version=_int(body.get("version"), "fragment.version"),
            seq=_int(body.get("seq"), "fragment.seq"),
            run_id=_str(body.get("run_id"), "fragment.run_id"),
            sent_at=_finite_float(body.get("sent_at", 0.0), "fragment.sent_at"),
            **arrays,
        )


@dataclass
class Weights(Message):
    """A versioned policy: every tensor of the network, by name, in order.

    Published on PUB after every ``broadcast_every`` updates and embedded in the
    welcome. ``extras`` holds other named arrays that actors must apply exactly as
    the learner does (e.g. observation-normalisation statistics).
    """

    TYPE: ClassVar[str] = "weights"

    version: int
    run_id: str
    tensors: list[tuple[str, np.ndarray]]
    extras: dict[str, np.ndarray] = field(default_factory=dict)

    def to_map(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "run_id": self.run_id,
            "tensors": [[name, encode_array(a)] for name, a in self.tensors],
            "extras": {name: encode_array(a) for name, a in self.extras.items()},
        }

    @classmethod
    def from_map(cls, body: dict[str, Any]) -> Weights:
        tensors_raw = body.get("tensors")
        if not isinstance(tensors_raw, list) or not tensors_raw:
            raise ProtocolError("bad_field", "weights.tensors: expected a non-empty list")
        tensors = []
        seen = set()
        for i, entry in enumerate(tensors_raw):
            if not isinstance(entry, list) or len(entry) != 2:
                raise ProtocolError("bad_field", f"weights.tensors[{i}]: expected [name, array]")
            name = _str(entry[0], f"weights.tensors[{i}].name")
            if name in seen:
                raise ProtocolError("bad_field", f"weights.tensors: duplicate name {name!r}")
            seen.add(name)
            array = _array(entry[1], f"weights.tensors[{name}]", ARRAY_DTYPES)
            _require_finite(array, f"weights.tensors[{name}]")
            tensors.append((name, array))
        extras = {}
        for name, value in _map(body.get("extras", {}), "weights.extras").items():
            extras[name] = _array(value, f"weights.extras[{name}]", ARRAY_DTYPES)
            _require_finite(extras[name], f"weights.extras[{name}]")
        return cls(
            version=_int(body.get("version"), "weights.version"),
            run_id=_str(body.get("run_id"), "weights.run_id"),
            tensors=tensors,
            extras=extras,
        )


@dataclass
class Hello(Message):
    """Actor → learner on DEALER: ask to join the run.

    ``actor_id`` -1 lets the learner choose; ``num_envs`` 0 takes the learner's
    ``num_envs``; empty space maps take the learner's env. ``rejoin_run_id`` names the run the
    actor was in before (empty on first contact) so a restarted learner can tell
    re-registration from a new actor. ``next_seq`` (optional) is the sequence
    number the actor will put on its next fragment of each slot, so the learner
    can tell fragments of an earlier registration from new ones and count gaps.
    """

    TYPE: ClassVar[str] = "hello"

    actor_id: int
    env_id: str
    observation_space: dict[str, Any]
    action_space: dict[str, Any]
    num_envs: int
    host: str = ""
    pid: int = 0
    rejoin_run_id: str = ""
    next_seq: list[int] = field(default_factory=list)

    def to_map(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_map(cls, body: dict[str, Any]) -> Hello:
        return cls(
            actor_id=_int(body.get("actor_id"), "hello.actor_id", -1, 2**31 - 1),
            env_id=_str(body.get("env_id"), "hello.env_id"),
            observation_space=_map(body.get("observation_space"), "hello.observation_space"),
            action_space=_map(body.get("action_space"), "hello.action_space"),
            num_envs=_int(body.get("num_envs"), "hello.num_envs", 0, MAX_ENVS_PER_ACTOR),
            host=_str(body.get("host", ""), "hello.host"),
            pid=_int(body.get("pid", 0), "hello.pid"),
            rejoin_run_id=_str(body.get("rejoin_run_id", ""), "hello.rejoin_run_id"),
            next_seq=_int_list(body.get("next_seq", []), "hello.next_seq"),
        )


@dataclass(frozen=True)
class RunSettings:
    """The run's settings that an actor obeys: the ``config`` map of a welcome.

    Every field is required on the wire and checked by :meth:`from_map`; a missing
    or ill-typed one is a ``bad_field`` error naming it (never a silent default: a
    learner that left out ``max_lead_steps`` would otherwise turn the staleness
    valve off). ``docs/protocol.md`` §4.4 specifies each field.
    """

    env_id: str
    observation_space: gym.Space  # a space map on the wire (§3.4)
    action_space: gym.Space
    policy: dict[str, Any]  # the PolicyConfig fields (zmq_rl.policy.policy_config_from)
    num_steps: int
    broadcast_every: int
    steps_per_broadcast: int
    max_lead_steps: int  # 0 = no valve (unbounded lead)
    fragment_length: int
    num_envs: int
    seed: int
    heartbeat_interval: float
    # Optional on the wire (absent = none; learners before 0.2 do not send them):
    env_kwargs: dict[str, Any] = field(default_factory=dict)  # gym.make kwargs (§4.4)
    wrappers: list[str] = field(default_factory=list)  # "module:Wrapper", applied in order

    OPTIONAL: ClassVar[tuple[str, ...]] = ("env_kwargs", "wrappers")

    def to_map(self) -> dict[str, Any]:
        """The msgpack map of these settings (spaces as space maps)."""
        body = {f.name: getattr(self, f.name) for f in fields(self)}
        body["observation_space"] = space_spec(self.observation_space)
        body["action_space"] = space_spec(self.action_space)
        body["heartbeat_interval"] = float(self.heartbeat_interval)
        return body

    @classmethod
    def from_map(cls, body: Any, where: str = "welcome.config") -> RunSettings:
        """Validate every field of ``body`` and build the settings."""
        body = _map(body, where)
        missing = [f.name for f in fields(cls) if f.name not in body and f.name not in cls.OPTIONAL]
        if missing:
            raise ProtocolError("bad_field", f"{where}.{missing[0]}: missing")
        num_steps = _int(body["num_steps"], f"{where}.num_steps", 1)
        env_kwargs = _env_kwargs(body.get("env_kwargs", {}), f"{where}.env_kwargs")
        wrappers = body.get("wrappers", [])
        if not isinstance(wrappers, list) or len(wrappers) > 64:
            raise ProtocolError("bad_field", f"{where}.wrappers: expected a list of <= 64 strings")
        for spec in wrappers:
            if _str(spec, f"{where}.wrappers[]").count(":") != 1:
                raise ProtocolError("bad_value", f"{where}.wrappers[]: {spec!r} is not module:Name")
        return cls(
            env_id=_str(body["env_id"], f"{where}.env_id"),
            observation_space=space_from_spec(
                body["observation_space"], f"{where}.observation_space"
            ),
            action_space=space_from_spec(body["action_space"], f"{where}.action_space"),
            policy=_map(body["policy"], f"{where}.policy"),
            num_steps=num_steps,
            broadcast_every=_int(body["broadcast_every"], f"{where}.broadcast_every", 1),
            steps_per_broadcast=_int(
                body["steps_per_broadcast"], f"{where}.steps_per_broadcast", num_steps
            ),
            max_lead_steps=_int(body["max_lead_steps"], f"{where}.max_lead_steps"),
            fragment_length=_int(body["fragment_length"], f"{where}.fragment_length", 1),
            num_envs=_int(body["num_envs"], f"{where}.num_envs", 1, MAX_ENVS_PER_ACTOR),
            seed=_int(body["seed"], f"{where}.seed"),
            heartbeat_interval=_positive_float(
                body["heartbeat_interval"], f"{where}.heartbeat_interval"
            ),
            env_kwargs=env_kwargs,
            wrappers=list(wrappers),
        )


def _env_kwargs(value: Any, where: str) -> dict[str, Any]:
    """RunSettings.env_kwargs: <= 64 identifier keys; values nil, bool, int, finite
    float, str (<= 4096 chars) or a list (<= 4096) of those."""

    def plain(v: Any) -> bool:
        if v is None or isinstance(v, (bool, int)):
            return True
        if isinstance(v, float):
            return math.isfinite(v)
        return isinstance(v, str) and len(v) <= 4096

    body = _map(value, where)
    if len(body) > 64:
        raise ProtocolError("bad_field", f"{where}: more than 64 keys")
    for key, v in body.items():
        ok = plain(v) or (isinstance(v, list) and len(v) <= 4096 and all(plain(x) for x in v))
        if not key.isidentifier() or not ok:
            raise ProtocolError("bad_value", f"{where}.{key}: not a JSON scalar or list of them")
    return body


@dataclass
class Welcome(Message):
    """Learner → actor on ROUTER: registration accepted.

    Carries the actor's id, the run id, the ports of the data sockets, the run's
    settings the actor obeys (``settings``, a :class:`RunSettings`; ``"config"`` on
    the wire), the version from which its slots are consumed (``base_version``, for
    the staleness valve) and the current weights, so an actor never acts on random
    or stale weights.
    """

    TYPE: ClassVar[str] = "welcome"

    actor_id: int
    run_id: str
    base_version: int
    experience_port: int
    weights_port: int
    settings: RunSettings
    weights: Weights

    @property
    def config(self) -> dict[str, Any]:
        """Deprecated: the settings as the untyped map of earlier releases; read the
        typed fields of :attr:`settings` instead."""
        warnings.warn(
            "Welcome.config is deprecated; use Welcome.settings (a RunSettings)",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.settings.to_map()

    def to_map(self) -> dict[str, Any]:
        return {
            "actor_id": self.actor_id,
            "run_id": self.run_id,
            "base_version": self.base_version,
            "experience_port": self.experience_port,
            "weights_port": self.weights_port,
            "config": self.settings.to_map(),
            "weights": self.weights.to_map(),
        }

    @classmethod
    def from_map(cls, body: dict[str, Any]) -> Welcome:
        return cls(
            actor_id=_int(body.get("actor_id"), "welcome.actor_id", 0, 2**31 - 1),
            run_id=_str(body.get("run_id"), "welcome.run_id"),
            base_version=_int(body.get("base_version"), "welcome.base_version"),
            experience_port=_int(body.get("experience_port"), "welcome.experience_port", 1, 65535),
            weights_port=_int(body.get("weights_port"), "welcome.weights_port", 1, 65535),
            settings=RunSettings.from_map(body.get("config")),
            weights=Weights.from_map(_map(body.get("weights"), "welcome.weights")),
        )


@dataclass
class Refuse(Message):
    """Learner → actor: registration refused; ``code`` is machine-readable."""

    TYPE: ClassVar[str] = "refuse"

    code: str
    reason: str

    def to_map(self) -> dict[str, Any]:
        return {"code": self.code, "reason": self.reason}

    @classmethod
    def from_map(cls, body: dict[str, Any]) -> Refuse:
        return cls(
            code=_str(body.get("code"), "refuse.code"),
            reason=_str(body.get("reason"), "refuse.reason", 4096),
        )


@dataclass
class Shutdown(Message):
    """Learner → actor: stop, flush, and answer with :class:`Bye`."""

    TYPE: ClassVar[str] = "shutdown"

    reason: str
    run_id: str = ""

    def to_map(self) -> dict[str, Any]:
        return {"reason": self.reason, "run_id": self.run_id}

    @classmethod
    def from_map(cls, body: dict[str, Any]) -> Shutdown:
        return cls(
            reason=_str(body.get("reason"), "shutdown.reason", 4096),
            run_id=_str(body.get("run_id", ""), "shutdown.run_id"),
        )


@dataclass
class Bye(Message):
    """Actor → learner: leaving, with the actor's counters (``stats``) and the
    highest sequence number sent on each slot (``last_seq``)."""

    TYPE: ClassVar[str] = "bye"

    actor_id: int
    stats: dict[str, float]
    last_seq: list[int] = field(default_factory=list)

    def to_map(self) -> dict[str, Any]:
        return {"actor_id": self.actor_id, "stats": self.stats, "last_seq": self.last_seq}

    @classmethod
    def from_map(cls, body: dict[str, Any]) -> Bye:
        return cls(
            actor_id=_int(body.get("actor_id"), "bye.actor_id"),
            stats=_numbers(body.get("stats"), "bye.stats"),
            last_seq=_int_list(body.get("last_seq", []), "bye.last_seq", -1),
        )


@dataclass
class Heartbeat(Message):
    """Either direction on the control channel: "I am alive".

    From an actor, ``actor_id`` is its id; from the learner, -1. ``run_id`` lets
    each side notice that the other one restarted.

    The optional link fields (absent on the wire when None; a v1 peer that omits
    them just gets no link measurement, see docs/protocol.md section 4.6):

    * ``sent_at``: the sender's monotonic clock at sending, seconds (any origin);
    * ``echo``: the ``sent_at`` of the newest heartbeat the sender received from the
      other side, unchanged, and ``held`` (>= 0): seconds between receiving that
      heartbeat and sending this one, so the receiver's round trip is
      ``now - echo - held`` on its own clock;
    * ``paused`` (actor only, in [0, 1]): the share of wall time the staleness valve
      held the actor paused since its previous heartbeat.
    """

    TYPE: ClassVar[str] = "heartbeat"

    actor_id: int
    run_id: str
    version: int = 0
    sent_at: float | None = None
    echo: float | None = None
    held: float | None = None
    paused: float | None = None

    LINK_FIELDS: ClassVar[tuple[str, ...]] = ("sent_at", "echo", "held", "paused")

    def to_map(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "actor_id": self.actor_id,
            "run_id": self.run_id,
            "version": self.version,
        }
        for key in self.LINK_FIELDS:
            value = getattr(self, key)
            if value is not None:
                body[key] = float(value)
        return body

    @classmethod
    def from_map(cls, body: dict[str, Any]) -> Heartbeat:
        return cls(
            actor_id=_int(body.get("actor_id"), "heartbeat.actor_id", -1),
            run_id=_str(body.get("run_id"), "heartbeat.run_id"),
            version=_int(body.get("version", 0), "heartbeat.version"),
            sent_at=_optional_number(body.get("sent_at"), "heartbeat.sent_at"),
            echo=_optional_number(body.get("echo"), "heartbeat.echo"),
            held=_optional_number(body.get("held"), "heartbeat.held", lo=0.0),
            paused=_optional_number(body.get("paused"), "heartbeat.paused", lo=0.0, hi=1.0),
        )


def largest_fragment_bytes(observation_space: Any, action_space: Any, fragment_length: int) -> int:
    """Twice the encoded size of the largest legitimate fragment, plus 64 KB: the
    default message limit of the learner's receiving sockets (``max_message_bytes``)."""
    obs = int(np.prod(observation_space.shape)) * observation_space.dtype.itemsize
    act = 8 * max(1, int(np.prod(action_space.shape or (1,))))
    row = 2 * obs + act + 4 + 1 + 1 + 4 + 4  # obs (+ a final obs), action, r, done x2, v, logp
    return 2 * (fragment_length * row + obs) + 64 * 1024


MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.TYPE: cls for cls in (Fragment, Weights, Hello, Welcome, Refuse, Shutdown, Bye, Heartbeat)
}


# --------------------------------------------------------------------------- encode / decode


def encode(message: Message) -> bytes:
    """Serialise a message into one frame (a msgpack map with the envelope)."""
    body = message.to_map()
    body["proto"] = PROTOCOL_VERSION
    body["type"] = message.TYPE
    return msgpack.packb(body, use_bin_type=True)


def decode(
    frame: bytes | memoryview,
    expected: tuple[type[Message], ...] | None = None,
    max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> Message:
    """Parse and validate one frame; raise :class:`ProtocolError` if it is invalid.

    ``expected`` restricts the accepted types (a PULL socket only takes fragments);
    anything else is rejected with reason ``"unexpected_type"``.
    """
    if len(frame) > max_bytes:
        raise ProtocolError("too_large", f"message of {len(frame)} bytes exceeds {max_bytes}")
    try:
        body = msgpack.unpackb(
            frame,
            raw=False,
            strict_map_key=True,
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
    proto = body.get("proto")
    if proto != PROTOCOL_VERSION or type(proto) is not int:
        raise ProtocolVersionMismatch(proto)
    kind = body.get("type")
    cls = MESSAGE_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError("unknown_type", f"unknown message type {kind!r}")
    if expected is not None and cls not in expected:
        names = ", ".join(c.TYPE for c in expected)
        raise ProtocolError("unexpected_type", f"{kind!r} is not accepted here (only {names})")
    try:
        return cls.from_map(body)
    except ProtocolError:
        raise
    except (TypeError, ValueError, KeyError, OverflowError) as exc:
        raise ProtocolError("bad_field", f"{kind}: {exc}") from None
