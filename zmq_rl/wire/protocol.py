"""Wire protocol v2: every message that crosses a socket, and nothing else.

A message is one ZeroMQ frame holding one msgpack map. Every map has

* ``"proto"``: the protocol version (:data:`PROTOCOL_VERSION`), and
* ``"type"``: the message type (``"fragment"``, ``"weights"``, ``"hello"``, ...),

plus the fields of that type. Arrays travel as a map
``{"dtype": str, "shape": [int, ...], "data": bin}`` holding the raw little-endian,
C-ordered bytes of a numpy array whose dtype is one of :data:`ARRAY_DTYPES`
(:mod:`zmq_rl.wire.codec`); observations of structured spaces travel as maps and lists of
such arrays (:mod:`zmq_rl.wire.spaces`).
Nothing here constructs arbitrary objects: msgpack yields only maps, lists,
strings, numbers and bytes, and every field is checked before a message object
exists. ``docs/protocol.md`` is the normative specification of the same rules.

``encode(msg) -> bytes`` and ``decode(frame) -> Message`` are the only entry
points the socket code needs. ``decode`` raises :class:`ProtocolError` (with a
``reason`` code used by the reject counters) for anything malformed.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar

import msgpack
import numpy as np

from ..config import POLICY_ID_PATTERN
from .codec import (
    ARRAY_DTYPES,
    DEFAULT_MAX_MESSAGE_BYTES,
    MAX_ENVS_PER_ACTOR,
    PROTOCOL_VERSION,
    ProtocolError,
    ProtocolVersionMismatch,
    decode_array,
    encode_array,
    finite_problem,
    unpack_map,
)
from .spaces import (
    Value,
    as_value,
    decode_value,
    encode_value,
    leaves,
    map_value,
    space_from_spec,
    space_spec,
    value_nbytes,
)

if TYPE_CHECKING:  # gymnasium is imported where spaces are built, not by every peer
    import gymnasium as gym

# --------------------------------------------------------------------------- field checks


def _int(value: Any, where: str, lo: int = 0, hi: int = 2**63 - 1) -> int:
    if type(value) is not int or not lo <= value <= hi:
        raise ProtocolError("bad_field", f"{where}: expected an int in [{lo}, {hi}], got {value!r}")
    return value


def _optional_int(value: Any, where: str) -> int | None:
    """An optional non-negative int field (None when absent)."""
    return None if value is None else _int(value, where)


def _str(value: Any, where: str, max_len: int = 256) -> str:
    if not isinstance(value, str) or len(value) > max_len:
        raise ProtocolError("bad_field", f"{where}: expected a string of <= {max_len} chars")
    return value


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
    if value is None:  # absent: a missing required field is bad_field (docs/protocol.md §4)
        raise ProtocolError("bad_field", f"{where}: missing")
    array = decode_array(value, where)
    name = value["dtype"]  # validated by decode_array
    if name not in dtypes:
        raise ProtocolError("bad_dtype", f"{where}: dtype {name}, expected {dtypes}")
    if ndim is not None and array.ndim != ndim:
        raise ProtocolError("bad_shape", f"{where}: expected {ndim} dims, got {list(array.shape)}")
    return array


def _require_finite(array: np.ndarray, where: str) -> None:
    problem = finite_problem(array, where)
    if problem:
        raise ProtocolError("not_finite", problem)


# --------------------------------------------------------------------------- several policies

# What a policy id is (docs/protocol.md section 4.9, config.POLICY_ID_PATTERN): 1 to
# 64 ASCII letters, digits, ``_``, ``.`` or ``-``; it names a policy in ``policy_map``,
# ``policies``, ``weights.policy`` and the weights topic.
_POLICY_ID = re.compile(POLICY_ID_PATTERN)
FEATURE_POLICIES = "policies"
"""The ``hello.features`` entry of an actor that runs several policies (reads
``policy_map``, ``policies`` and ``policy_weights``, subscribes per policy topic)."""
FEATURE_GRANTS = "grants"
"""The ``hello.features`` entry of an actor whose staleness valve follows the learner's
grants (``welcome.grant``, ``heartbeat.grant``; docs/protocol.md section 5.4): a
learner that takes fixed-size batches from whichever slots delivered tells each such
actor how many steps per slot it may have recorded, instead of the ``S``/``L`` rule."""
MAX_FEATURES = 16
"""Most entries of ``hello.features``."""
MAX_FEATURE_CHARS = 64
"""Longest entry of ``hello.features``."""


OPPONENT_CHOICES = ("uniform", "latest", "win_rate")
"""How an actor draws the snapshot a game is played against (``opponent_choice``,
docs/protocol.md section 4.4)."""
MAX_OPENING_MOVES = 1 << 16
"""The most random opening moves a welcome may ask for (``opening_moves``)."""


def _choice(value: Any, where: str, choices: Sequence[str]) -> str:
    """``value`` when it is one of ``choices``; else ProtocolError ``bad_field``."""
    if value not in choices:
        raise ProtocolError("bad_field", f"{where}: {value!r} is not one of {list(choices)}")
    return str(value)


def _bool(value: Any, where: str) -> bool:
    if type(value) is not bool:
        raise ProtocolError("bad_field", f"{where}: expected a bool, got {value!r}")
    return value


def _hidden_sizes(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or not value:
        raise ProtocolError("bad_field", f"{where}: expected a non-empty list of ints >= 1")
    return [_int(width, f"{where}[{i}]", 1) for i, width in enumerate(value)]


POLICY_KEYS: dict[str, Any] = {
    "hidden_sizes": _hidden_sizes,
    "activation": lambda v, where: _choice(v, where, ("tanh", "relu")),
    "shared_trunk": _bool,
    "ortho_init": _bool,
    "log_std_init": _finite_float,
    "normalize_obs": _bool,
    "factory": _str,
    "policy_type": lambda v, where: _choice(v, where, ("mlp", "lstm", "gru")),
}
"""Every key of a welcome's ``config.policy`` (and of each ``config.policies`` entry),
each with its check (docs/protocol.md section 4.4): all required; other keys are
ignored."""


def _policy(value: Any, where: str) -> dict[str, Any]:
    """A network map of a welcome (``config.policy``, a ``config.policies`` entry):
    every key of :data:`POLICY_KEYS` present and valid (``bad_field`` naming the first
    that is not; a non-finite ``log_std_init`` is ``bad_value``); the map is kept as
    it is, unknown keys included."""
    body = _map(value, where)
    for key, check in POLICY_KEYS.items():
        if key not in body:
            raise ProtocolError("bad_field", f"{where}.{key}: missing")
        check(body[key], f"{where}.{key}")
    return body


def check_policy_id(value: Any, where: str) -> str:
    """``value`` when it is a policy id (a str matching :data:`POLICY_ID_PATTERN`);
    else raise ProtocolError ``bad_field`` naming ``where`` and the value."""
    if not isinstance(value, str) or _POLICY_ID.fullmatch(value) is None:
        raise ProtocolError(
            "bad_field",
            f"{where}: {value!r} is not a policy id (1 to 64 of A-Z a-z 0-9 _ . -)",
        )
    return value


def _features(value: Any, where: str) -> list[str]:
    """``hello.features``: a list of at most 16 strings of at most 64 chars."""
    if not isinstance(value, list) or len(value) > MAX_FEATURES:
        raise ProtocolError(
            "bad_field", f"{where}: expected a list of <= {MAX_FEATURES} strings, got {value!r}"
        )
    for i, name in enumerate(value):
        if not isinstance(name, str) or len(name) > MAX_FEATURE_CHARS:
            raise ProtocolError(
                "bad_field",
                f"{where}[{i}]: expected a string of <= {MAX_FEATURE_CHARS} chars, got {name!r}",
            )
    return list(value)


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
OBS_DTYPES = ("float32", "float64", "float16", "uint8", "int8", "int16", "int32", "int64", "bool")
ACTION_DTYPES = ("int64", "int32", "float32", "float64", "int8", "uint8", "bool")
TOKEN_BYTES = 16
"""Length of the session token a welcome hands out and every later message carries."""
MAX_SEQ_GAP = 1024
"""A fragment whose ``seq`` is more than this beyond the expected one is rejected
(``seq_jump``); smaller gaps are fragments lost on a broken connection (counted)."""


def _like(example: Any, lead: tuple[int, ...], drop: int) -> Any:
    """Uninitialised arrays shaped ``(*lead, *leaf.shape[drop:])`` for each leaf of
    ``example`` (a value), with the leaf's dtype."""
    return map_value(lambda a: np.empty((*lead, *a.shape[drop:]), a.dtype), example)


@dataclass
class StepArrays:
    """The arrays of a block of env steps, one row per step, named once.

    The same record is a fragment's rows and the client's lockstep buffer
    (``[T, num_envs, ...]``) and a learner rollout (``[T, B, ...]``): adding a field to
    experience means adding it here (with its row in :data:`STEP_WIRE`) and in
    ``docs/protocol.md``. Row ``t`` holds the observation the action was taken in, the
    action, and what the step returned. ``obs`` is a *value* (:mod:`zmq_rl.wire.spaces`):
    one array, or a dict/tuple of arrays for a structured observation space.
    """

    obs: Value  # [*lead, *obs_shape] per leaf
    actions: np.ndarray  # [*lead] (discrete) or [*lead, *action_shape]
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

    def step_arrays(self) -> dict[str, Any]:
        """The step fields by name (what ``StepArrays(**...)`` takes)."""
        return {name: getattr(self, name) for name in self.STEP_FIELDS}

    def select(self, index: Any) -> StepArrays:
        """The same rows of every field (``index`` as for numpy), as views where
        numpy gives views: ``steps.select((slice(0, n), slot))`` is one slot's rows."""
        fields_ = {name: getattr(self, name)[index] for name in self.STEP_FIELDS[1:]}
        obs = self.obs
        obs = obs[index] if type(obs) is np.ndarray else map_value(lambda a: a[index], obs)
        return StepArrays(obs=obs, **fields_)

    def write(self, index: Any, source: StepArrays) -> None:
        """Copy ``source``'s fields into rows ``index`` of this record's arrays (numpy
        converts them to these arrays' dtypes). The actor's hot path: per-step cost."""
        mine, theirs = self.__dict__, source.__dict__
        for name in self.STEP_FIELDS[1:]:
            mine[name][index] = theirs[name]
        obs = self.obs
        if type(obs) is np.ndarray:
            obs[index] = theirs["obs"]
        else:
            map_value(lambda a, b: a.__setitem__(index, b), obs, theirs["obs"])

    @classmethod
    def coerce(cls, *arrays: Any) -> StepArrays:
        """The arrays of :attr:`STEP_FIELDS`, in that order, as they travel:
        observations and actions keep their dtype, the other fields take their fixed
        dtype from :data:`STEP_DTYPES`."""
        if len(arrays) != len(cls.STEP_FIELDS):
            raise TypeError(f"StepArrays.coerce takes {', '.join(cls.STEP_FIELDS)}")
        obs, *rest = arrays
        return cls(
            as_value(obs),
            *[np.asarray(a, dtype) for a, dtype in zip(rest, _COERCE_DTYPES[1:], strict=True)],
        )

    @classmethod
    def allocate(
        cls, lead: tuple[int, ...], obs: Value, actions: np.ndarray, drop: int
    ) -> StepArrays:
        """Uninitialised arrays of leading shape ``lead`` (``(T, B)`` for a rollout),
        shaped and typed like ``obs`` and ``actions`` without their first ``drop``
        dimensions."""
        arrays = {name: np.empty(lead, dtype) for name, dtype in STEP_DTYPES.items()}
        arrays["obs"] = _like(obs, lead, drop)
        arrays["actions"] = np.empty((*lead, *actions.shape[drop:]), actions.dtype)
        return cls(**arrays)


_OBS_NP_DTYPES = frozenset(np.dtype(name).newbyteorder("<") for name in OBS_DTYPES) | frozenset(
    np.dtype(name) for name in OBS_DTYPES
)

STEP_DTYPES: dict[str, Any] = {
    "rewards": np.float32,
    "terminated": np.bool_,
    "truncated": np.bool_,
    "values": np.float32,
    "log_probs": np.float32,
}
"""The fixed dtype of each step field (observations and actions keep the env's)."""
_COERCE_DTYPES = tuple(STEP_DTYPES.get(name) for name in StepArrays.STEP_FIELDS)

STEP_WIRE: dict[str, tuple[str, ...]] = {
    "actions": ACTION_DTYPES,
    "rewards": FLOAT_DTYPES,
    "terminated": ("bool",),
    "truncated": ("bool",),
    "values": FLOAT_DTYPES,
    "log_probs": FLOAT_DTYPES,
}
"""Per array step field of a fragment: the dtypes it may travel as (each is ``[T, B,
...]``; ``obs`` is a value whose leaves are any of :data:`OBS_DTYPES`)."""


def _nests_like_rows(rows: Value, other: Value) -> bool:
    """Whether ``other`` (one leading dim) nests like ``rows`` (``[T, B, ...]`` leaves)
    with leaves of the same dtype and element shape."""
    if type(rows) is np.ndarray:  # the common case: one array
        return (
            type(other) is np.ndarray
            and other.dtype == rows.dtype
            and other.shape[1:] == rows.shape[2:]
        )
    return _same_structure(map_value(lambda a: a[0, 0], rows), other) and all(
        x.shape[2:] == y.shape[1:] for x, y in zip(leaves(rows), leaves(other), strict=True)
    )


def _same_structure(a: Value, b: Value) -> bool:
    """Whether two values nest alike with leaves of the same dtypes (shapes are the
    caller's to compare: their leading dims differ)."""
    if isinstance(a, dict):
        return (
            isinstance(b, dict)
            and list(a) == list(b)
            and all(_same_structure(a[k], b[k]) for k in a)
        )
    if isinstance(a, tuple):
        return (
            isinstance(b, tuple)
            and len(a) == len(b)
            and all(_same_structure(x, y) for x, y in zip(a, b, strict=True))
        )
    return isinstance(b, np.ndarray) and a.dtype == b.dtype


@dataclass
class Fragment(StepArrays, Message):
    """T >= 1 consecutive steps of B >= 1 env slots of one actor (``[T, B, ...]``
    arrays, column ``b`` is slot ``slots[b]``): :class:`StepArrays` plus where they
    come from and what follows them.

    ``token`` is the session token of the registration (from the welcome); ``seq``
    counts this registration's fragments from 0. ``next_obs`` (``[B, ...]``) is the
    observation after the last row (the reset observation when the last row ended an
    episode). For every cell ``(t, b)`` that was truncated (and not terminated)
    ``final_obs`` holds the true last observation of that episode, and
    ``final_obs_index`` its flat index ``t * B + b``, ascending, so the learner can
    bootstrap V(final observation). ``state`` (``[B, S]`` float32, recurrent policies
    only) is the policy state each slot acted from at row 0. ``valid`` (``[T, B]``
    bool, multi-agent actors only; None: every row is valid) is False where the slot
    held no live agent (its agent finished before its env's episode did, or none has
    taken the slot yet): such a row took no action, has reward 0 and is neither
    terminated nor truncated, and the row before it in its column ended an episode
    (docs/protocol.md section 4.1.4).
    """

    TYPE: ClassVar[str] = "fragment"

    actor_id: int
    version: int
    seq: int
    run_id: str
    token: bytes
    slots: np.ndarray  # [B] int
    next_obs: Value  # [B, *obs_shape]
    final_obs_index: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # [K]
    final_obs: Value | None = None  # [K, *obs_shape]
    state: np.ndarray | None = None  # [B, S] float32
    sent_at: float = 0.0
    valid: np.ndarray | None = None  # [T, B] bool; None: every row valid

    @property
    def num_slots(self) -> int:
        """B, the number of slots (the second dimension)."""
        return int(self.rewards.shape[1])

    @classmethod
    def for_slot(
        cls,
        slot: int,
        *,
        next_obs: Value,
        final_obs_index: Any = (),
        final_obs: Value | None = None,
        state: Any = None,
        valid: Any = None,
        **fields_: Any,
    ) -> Fragment:
        """A fragment of the one slot ``slot`` from ``[T, ...]`` rows: every step array
        gets a column dimension of 1, ``next_obs`` and ``state`` a slot dimension;
        ``final_obs_index`` lists row numbers (with one column they are the flat
        indices). The other keywords are the header fields (``actor_id``, ``token``,
        ...)."""
        column = {
            name: map_value(lambda a: np.asarray(a)[:, np.newaxis], as_value(fields_.pop(name)))
            for name in StepArrays.STEP_FIELDS
        }
        widened = map_value(lambda a: np.asarray(a)[np.newaxis], as_value(next_obs))
        return cls(
            **column,
            **fields_,
            slots=np.array([slot], np.int32),
            next_obs=widened,
            final_obs_index=np.asarray(final_obs_index, np.int32).reshape(-1),
            final_obs=None if final_obs is None else as_value(final_obs),
            state=None if state is None else np.asarray(state, np.float32).reshape(1, -1),
            valid=None if valid is None else np.asarray(valid, bool).reshape(-1, 1),
        )

    def to_map(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "run_id": self.run_id,
            "actor_id": self.actor_id,
            "token": self.token,
            "seq": self.seq,
            "version": self.version,
            "sent_at": float(self.sent_at),
            "slots": encode_array(self.slots),
            "obs": encode_value(self.obs),
        }
        for name in STEP_WIRE:
            body[name] = encode_array(getattr(self, name))
        body["next_obs"] = encode_value(self.next_obs)
        final_obs = self.final_obs
        if final_obs is None:
            final_obs = map_value(lambda a: np.zeros((0, *a.shape[1:]), a.dtype), self.next_obs)
        body["final_obs_index"] = encode_array(self.final_obs_index)
        body["final_obs"] = encode_value(final_obs)
        if self.state is not None:
            body["state"] = encode_array(self.state)
        if self.valid is not None:
            body["valid"] = encode_array(np.asarray(self.valid, bool))
        return body

    REQUIRED: ClassVar[tuple[str, ...]] = (
        "run_id",
        "actor_id",
        "token",
        "seq",
        "version",
        "slots",
        "obs",
        *STEP_WIRE,
        "next_obs",
        "final_obs_index",
        "final_obs",
    )

    @classmethod
    def from_map(cls, body: dict[str, Any]) -> Fragment:
        for name in cls.REQUIRED:  # absent is bad_field whatever the field's type
            if name not in body:
                raise ProtocolError("bad_field", f"fragment.{name}: missing")
        arrays: dict[str, Any] = {
            name: _array(body.get(name), f"fragment.{name}", dtypes)
            for name, dtypes in STEP_WIRE.items()
        }
        lead = arrays["rewards"].shape
        if len(lead) != 2 or lead[0] < 1 or lead[1] < 1:
            raise ProtocolError(
                "bad_shape", f"fragment.rewards: shape {list(lead)}, expected [T >= 1, B >= 1]"
            )
        length, width = lead
        for name, array in arrays.items():
            if array.shape[:2] != lead or (name != "actions" and array.ndim != 2):
                raise ProtocolError(
                    "bad_shape", f"fragment.{name}: shape {list(array.shape)}, expected [T, B]"
                )
        slots = _array(body.get("slots"), "fragment.slots", ("int32", "int64"), 1)
        numbers = slots.tolist()
        if len(numbers) != width or min(numbers) < 0 or len(set(numbers)) != width:
            raise ProtocolError(
                "bad_field", f"fragment.slots: {slots.tolist()} must be {width} distinct ints >= 0"
            )
        obs = decode_value(body.get("obs"), "fragment.obs", lead)
        next_obs = decode_value(body.get("next_obs"), "fragment.next_obs", (width,))
        index = _array(body.get("final_obs_index"), "fragment.final_obs_index", INDEX_DTYPES, 1)
        final_obs = decode_value(body.get("final_obs"), "fragment.final_obs", index.shape)
        for leaf in leaves(obs):
            if leaf.dtype not in _OBS_NP_DTYPES:
                raise ProtocolError("bad_dtype", f"fragment.obs: dtype {leaf.dtype} not allowed")
        for name, other in (("next_obs", next_obs), ("final_obs", final_obs)):
            if not _nests_like_rows(obs, other):
                raise ProtocolError(
                    "bad_shape", f"fragment.{name}: does not nest, shape or type like obs rows"
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
                f"fragment.final_obs_index: {index.tolist()} must list exactly the flat "
                f"indices t*B+b of the truncated, non-terminated cells {needs_final.tolist()}",
            )
        state = body.get("state")
        if state is not None:
            state = _array(state, "fragment.state", ("float32",), 2)
            if state.shape[0] != width:
                raise ProtocolError("bad_shape", f"fragment.state: shape {list(state.shape)}")
            _require_finite(state, "fragment.state")
        valid = body.get("valid")
        if valid is not None:
            valid = _valid_rows(_array(valid, "fragment.valid", ("bool",), 2), arrays, lead)
        for name, array in arrays.items():
            _require_finite(array, f"fragment.{name}")
        for name, value in (("obs", obs), ("next_obs", next_obs), ("final_obs", final_obs)):
            for leaf in leaves(value):
                _require_finite(leaf, f"fragment.{name}")
        return cls(
            obs=obs,
            **arrays,
            actor_id=_int(body.get("actor_id"), "fragment.actor_id", 0, MAX_ACTOR_ID),
            version=_int(body.get("version"), "fragment.version"),
            seq=_int(body.get("seq"), "fragment.seq"),
            run_id=_str(body.get("run_id"), "fragment.run_id"),
            token=_token(body.get("token"), "fragment.token"),
            slots=slots,
            next_obs=next_obs,
            final_obs_index=index,
            final_obs=final_obs,
            state=state,
            sent_at=_finite_float(body.get("sent_at", 0.0), "fragment.sent_at"),
            valid=valid,
        )


def _valid_rows(valid: np.ndarray, arrays: dict[str, np.ndarray], lead: tuple[int, ...]) -> Any:
    """``fragment.valid`` checked against the rows (docs/protocol.md section 4.1.4): an
    invalid row has reward 0 and ends nothing, and the valid row before an invalid one
    in its column ended an episode. All True is the same as absent (None)."""
    if valid.shape != lead:
        raise ProtocolError(
            "bad_shape", f"fragment.valid: shape {list(valid.shape)}, expected [T, B] {list(lead)}"
        )
    if valid.all():
        return None
    invalid = ~valid
    ended = arrays["terminated"] | arrays["truncated"]
    for name, bad in (
        ("rewards", invalid & (arrays["rewards"] != 0)),
        ("terminated", invalid & arrays["terminated"]),
        ("truncated", invalid & arrays["truncated"]),
        ("valid", valid[:-1] & invalid[1:] & ~ended[:-1]),
    ):
        if bad.any():
            t, b = (int(i) for i in np.argwhere(bad)[0])
            why = (
                "a valid row followed by an invalid one must end its episode"
                if name == "valid"
                else "must be 0/false in a row that is not valid"
            )
            raise ProtocolError("bad_field", f"fragment.{name}[{t}, {b}]: {why}")
    return valid


INDEX_DTYPES = ("int32", "int64")
MAX_STATE_SIZE = 1 << 20
"""Most floats of recurrent state per slot (``RunSettings.state_size``)."""
MAX_MESSAGE_LIMIT = 1 << 40
"""Largest message size a learner may announce (``max_weights_bytes``, ...)."""
MAX_ACTOR_ID = 2**31 - 1
"""Actor ids are in [0, MAX_ACTOR_ID] everywhere (-1 in a hello: any free id)."""


def _token(value: Any, where: str) -> bytes:
    if not isinstance(value, bytes) or len(value) != TOKEN_BYTES:
        raise ProtocolError("bad_field", f"{where}: expected {TOKEN_BYTES} bytes (bin)")
    return value


@dataclass
class Weights(Message):
    """A versioned policy: every tensor of the network, by name, in order.

    Published on PUB after every ``broadcast_every`` updates and embedded in the
    welcome. ``extras`` holds other named arrays that actors must apply exactly as
    the learner does (e.g. observation-normalisation statistics). ``policy`` is the
    id of the policy these weights are of in a run of several policies (on the wire
    only when non-empty; docs/protocol.md section 4.9), ``""`` in a single-policy run.
    """

    TYPE: ClassVar[str] = "weights"

    version: int
    run_id: str
    tensors: list[tuple[str, np.ndarray]]
    extras: dict[str, np.ndarray] = field(default_factory=dict)
    policy: str = ""

    def to_map(self) -> dict[str, Any]:
        body: dict[str, Any] = {"version": self.version, "run_id": self.run_id}
        if self.policy:  # absent in a single-policy run: its weights keep their bytes
            body["policy"] = self.policy
        body["tensors"] = [[name, encode_array(a)] for name, a in self.tensors]
        body["extras"] = {name: encode_array(a) for name, a in self.extras.items()}
        return body

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
        policy = body.get("policy")
        return cls(
            version=_int(body.get("version"), "weights.version"),
            run_id=_str(body.get("run_id"), "weights.run_id"),
            tensors=tensors,
            extras=extras,
            policy="" if policy is None else check_policy_id(policy, "weights.policy"),
        )


@dataclass
class Hello(Message):
    """Actor → learner on DEALER: ask to join the run.

    ``actor_id`` -1 lets the learner choose; ``num_envs`` 0 takes the learner's
    ``num_envs``; empty space maps take the learner's env. ``rejoin_run_id`` names the run the
    actor was in before (empty on first contact) so a restarted learner can tell
    re-registration from a new actor. (Protocol v1's ``next_seq`` is gone: every
    registration gets its own token and counts its fragments from 0.) ``features``
    lists optional abilities of the actor (on the wire only when non-empty):
    :data:`FEATURE_POLICIES` says it can run several policies (docs/protocol.md
    section 4.9).
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
    features: list[str] = field(default_factory=list)

    def to_map(self) -> dict[str, Any]:
        body = {f.name: getattr(self, f.name) for f in fields(self)}
        if not self.features:  # absent means none: a hello without features keeps its bytes
            del body["features"]
        else:
            body["features"] = list(self.features)
        return body

    @classmethod
    def from_map(cls, body: dict[str, Any]) -> Hello:
        return cls(
            actor_id=_int(body.get("actor_id"), "hello.actor_id", -1, MAX_ACTOR_ID),
            env_id=_str(body.get("env_id"), "hello.env_id"),
            observation_space=_map(body.get("observation_space"), "hello.observation_space"),
            action_space=_map(body.get("action_space"), "hello.action_space"),
            num_envs=_int(body.get("num_envs"), "hello.num_envs", 0, MAX_ENVS_PER_ACTOR),
            host=_str(body.get("host", ""), "hello.host"),
            pid=_int(body.get("pid", 0), "hello.pid", 0, 2**31 - 1),
            rejoin_run_id=_str(body.get("rejoin_run_id", ""), "hello.rejoin_run_id"),
            features=_features(body.get("features", []), "hello.features"),
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
    policy: dict[str, Any]  # the PolicyConfig fields (zmq_rl.rl.policy.policy_config_from)
    num_steps: int
    broadcast_every: int
    steps_per_broadcast: int
    max_lead_steps: int  # 0 = no valve (unbounded lead)
    fragment_length: int
    num_envs: int
    seed: int
    heartbeat_interval: float
    state_size: int = 0  # floats of recurrent state per slot (0: feed-forward policy)
    max_weights_bytes: int = DEFAULT_MAX_MESSAGE_BYTES  # largest weights frame published
    max_fragment_bytes: int = DEFAULT_MAX_MESSAGE_BYTES  # the learner's experience limit
    # Optional on the wire (absent = none):
    env_kwargs: dict[str, Any] = field(default_factory=dict)  # gym.make kwargs (§4.4)
    wrappers: list[str] = field(default_factory=list)  # "module:Wrapper", applied in order
    # Slots per env of a multi-agent env (absent = 1); a learner that sends it reads
    # fragments' ``valid`` rows (docs/protocol.md section 4.1.4).
    agents_per_env: int = 1
    # Turn-based self-play against frozen snapshots (absent = none): how many the actor
    # keeps, every how many versions it takes one, in what share of games one plays.
    opponent_pool: int = 0
    opponent_every: int = 1
    opponent_share: float = 0.0
    opponent_choice: str = "uniform"  # which snapshot a game draws (OPPONENT_CHOICES)
    # Turn-based games: random legal moves (0..N, whole rounds) that start every game
    # (absent = 0: games start from the env's reset).
    opening_moves: int = 0
    # Several policies (absent = one, ``policy``; docs/protocol.md section 4.9): the
    # policy id of each agent index (agents_per_env entries), and each id's network
    # config (a map like ``policy``). Both or neither; ``policy`` is agent 0's.
    policy_map: list[str] = field(default_factory=list)
    policies: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Informational (absent = 0: every-slot rollouts): the rows one update of a learner
    # of rows batches takes from whichever slots delivered (docs/protocol.md section
    # 5.3); its versions then prove nothing about one actor's slots (section 5.5).
    batch_rows: int = 0

    OPTIONAL: ClassVar[tuple[str, ...]] = (
        "env_kwargs",
        "wrappers",
        "agents_per_env",
        "opponent_pool",
        "opponent_every",
        "opponent_share",
        "opponent_choice",
        "opening_moves",
        "policy_map",
        "policies",
        "batch_rows",
    )

    @property
    def policy_ids(self) -> list[str]:
        """The distinct policy ids in order of first appearance in ``policy_map``
        (empty in a single-policy run)."""
        return list(dict.fromkeys(self.policy_map))

    def policy_of_slot(self, slot: int) -> str:
        """The policy id of slot ``slot`` (agent index ``slot % agents_per_env``,
        docs/protocol.md section 4.1.4); ``""`` in a single-policy run."""
        if not self.policy_map:
            return ""
        return self.policy_map[slot % self.agents_per_env]

    def to_map(self) -> dict[str, Any]:
        """The msgpack map of these settings (spaces as space maps)."""
        body = {f.name: getattr(self, f.name) for f in fields(self)}
        body["observation_space"] = space_spec(self.observation_space)
        body["action_space"] = space_spec(self.action_space)
        body["heartbeat_interval"] = float(self.heartbeat_interval)
        if self.agents_per_env == 1:  # absent means 1: single-agent welcomes keep their bytes
            del body["agents_per_env"]
        if not self.opponent_pool:  # absent means none
            for name in ("opponent_pool", "opponent_every", "opponent_share", "opponent_choice"):
                del body[name]
        elif self.opponent_choice == "uniform":  # absent means uniform: earlier bytes kept
            del body["opponent_choice"]
        if not self.opening_moves:  # absent means none: earlier bytes kept
            del body["opening_moves"]
        for name in ("policy_map", "policies"):  # absent means one policy
            if not body[name]:
                del body[name]
        if not self.batch_rows:  # absent means every-slot rollouts: earlier bytes kept
            del body["batch_rows"]
        if "policy_map" in body:
            body["policy_map"] = list(self.policy_map)
        if "policies" in body:
            body["policies"] = {key: dict(value) for key, value in self.policies.items()}
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
        policy = _policy(body["policy"], f"{where}.policy")
        agents_per_env = _int(
            body.get("agents_per_env", 1), f"{where}.agents_per_env", 1, MAX_ENVS_PER_ACTOR
        )
        policy_map, policies = _policies(body, policy, agents_per_env, where)
        return cls(
            env_id=_str(body["env_id"], f"{where}.env_id"),
            observation_space=space_from_spec(
                body["observation_space"], f"{where}.observation_space"
            ),
            action_space=space_from_spec(body["action_space"], f"{where}.action_space"),
            policy=policy,
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
            state_size=_int(body["state_size"], f"{where}.state_size", 0, MAX_STATE_SIZE),
            max_weights_bytes=_int(
                body["max_weights_bytes"], f"{where}.max_weights_bytes", 1, MAX_MESSAGE_LIMIT
            ),
            max_fragment_bytes=_int(
                body["max_fragment_bytes"], f"{where}.max_fragment_bytes", 1, MAX_MESSAGE_LIMIT
            ),
            env_kwargs=env_kwargs,
            wrappers=list(wrappers),
            agents_per_env=agents_per_env,
            opponent_pool=_int(body.get("opponent_pool", 0), f"{where}.opponent_pool", 0, 4096),
            opponent_every=_int(body.get("opponent_every", 1), f"{where}.opponent_every", 1),
            opponent_share=_share(body.get("opponent_share", 0.0), f"{where}.opponent_share"),
            opponent_choice=_choice(
                body.get("opponent_choice", "uniform"),
                f"{where}.opponent_choice",
                OPPONENT_CHOICES,
            ),
            opening_moves=_int(
                body.get("opening_moves", 0), f"{where}.opening_moves", 0, MAX_OPENING_MOVES
            ),
            policy_map=policy_map,
            policies=policies,
            batch_rows=(
                _int(body["batch_rows"], f"{where}.batch_rows", 1) if "batch_rows" in body else 0
            ),
        )


def _policies(
    body: dict[str, Any], policy: dict[str, Any], agents_per_env: int, where: str
) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """``policy_map`` and ``policies`` of a welcome's config, checked (docs/protocol.md
    section 4.9): both or neither; one valid id per agent index; the ids of the map
    exactly the keys of ``policies``; at least two of them; ``policy`` is agent 0's."""
    raw_map, raw_policies = body.get("policy_map"), body.get("policies")
    if raw_map is None and raw_policies is None:
        return [], {}
    if raw_map is None or raw_policies is None:
        absent, present = (
            ("policy_map", "policies") if raw_map is None else ("policies", "policy_map")
        )
        raise ProtocolError(
            "bad_field", f"{where}.{absent}: missing ({where}.{present} is present: send both)"
        )
    if not isinstance(raw_map, list) or len(raw_map) != agents_per_env:
        size = len(raw_map) if isinstance(raw_map, list) else raw_map
        raise ProtocolError(
            "bad_field",
            f"{where}.policy_map: {size!r} entries, expected one per agent index "
            f"(agents_per_env {agents_per_env})",
        )
    policy_map = [check_policy_id(pid, f"{where}.policy_map[{i}]") for i, pid in enumerate(raw_map)]
    policies: dict[str, dict[str, Any]] = {}
    for pid, config in _map(raw_policies, f"{where}.policies").items():
        check_policy_id(pid, f"{where}.policies")
        policies[pid] = _policy(config, f"{where}.policies.{pid}")
    for i, pid in enumerate(policy_map):
        if pid not in policies:
            raise ProtocolError(
                "bad_field",
                f"{where}.policy_map[{i}]: policy {pid!r} is not a key of {where}.policies",
            )
    for pid in policies:
        if pid not in policy_map:
            raise ProtocolError(
                "bad_field",
                f"{where}.policies.{pid}: policy {pid!r} is unused (no agent of "
                f"{where}.policy_map {policy_map} has it)",
            )
    if len(policies) < 2:
        raise ProtocolError(
            "bad_field",
            f"{where}.policy_map: {policy_map} names one policy; a run of several names at "
            f"least 2 (a single-policy run sends neither policy_map nor policies)",
        )
    if policy != policies[policy_map[0]]:
        raise ProtocolError(
            "bad_field",
            f"{where}.policy: must equal {where}.policies.{policy_map[0]} (the policy of "
            f"agent index 0)",
        )
    return policy_map, policies


def _share(value: Any, where: str) -> float:
    """A finite number in [0, 1]."""
    share = _finite_float(value, where)
    if not 0.0 <= share <= 1.0:
        raise ProtocolError("bad_field", f"{where}: {share} is not in [0, 1]")
    return share


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
    or stale weights. In a run of several policies (``settings.policies``)
    ``policy_weights`` holds the current weights of each policy, in the order of
    ``settings.policy_ids``, and ``weights`` is the first of them (docs/protocol.md
    section 4.9); in a single-policy run it is empty (absent on the wire).
    """

    TYPE: ClassVar[str] = "welcome"

    actor_id: int
    run_id: str
    base_version: int
    experience_port: int
    weights_port: int
    settings: RunSettings
    weights: Weights
    token: bytes = b"\0" * TOKEN_BYTES
    policy_weights: list[Weights] = field(default_factory=list)
    grant: int | None = None
    """The steps per slot the actor may record before it hears a larger grant (its
    valve follows grants, docs/protocol.md section 5.4); None (absent on the wire): the
    ``steps_per_broadcast`` / ``max_lead_steps`` rule. Sent only to an actor whose
    hello has :data:`FEATURE_GRANTS`."""

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
        body = {
            "actor_id": self.actor_id,
            "run_id": self.run_id,
            "token": self.token,
            "base_version": self.base_version,
            "experience_port": self.experience_port,
            "weights_port": self.weights_port,
            "config": self.settings.to_map(),
            "weights": self.weights.to_map(),
        }
        if self.policy_weights:  # absent in a single-policy run
            body["policy_weights"] = [w.to_map() for w in self.policy_weights]
        if self.grant is not None:  # absent: the actor's valve follows S and L
            body["grant"] = self.grant
        return body

    @classmethod
    def from_map(cls, body: dict[str, Any]) -> Welcome:
        welcome = cls(
            actor_id=_int(body.get("actor_id"), "welcome.actor_id", 0, MAX_ACTOR_ID),
            run_id=_str(body.get("run_id"), "welcome.run_id"),
            token=_token(body.get("token"), "welcome.token"),
            base_version=_int(body.get("base_version"), "welcome.base_version"),
            experience_port=_int(body.get("experience_port"), "welcome.experience_port", 1, 65535),
            weights_port=_int(body.get("weights_port"), "welcome.weights_port", 1, 65535),
            settings=RunSettings.from_map(body.get("config")),
            weights=Weights.from_map(_map(body.get("weights"), "welcome.weights")),
            policy_weights=_policy_weights(body.get("policy_weights")),
            grant=_optional_int(body.get("grant"), "welcome.grant"),
        )
        _check_policy_weights(welcome.settings, welcome.weights, welcome.policy_weights)
        return welcome


def _policy_weights(raw: Any) -> list[Weights]:
    """``welcome.policy_weights`` decoded (absent: empty), each error naming its entry."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ProtocolError("bad_field", "welcome.policy_weights: expected a list of weights maps")
    out = []
    for i, entry in enumerate(raw):
        where = f"welcome.policy_weights[{i}]"
        try:
            out.append(Weights.from_map(_map(entry, where)))
        except ProtocolError as exc:
            message = str(exc)
            if not message.startswith(where):
                message = f"{where}: {message}"
            raise ProtocolError(exc.reason, message) from None
    return out


def _check_policy_weights(
    settings: RunSettings, weights: Weights, policy_weights: list[Weights]
) -> None:
    """A welcome's ``policy_weights`` against its settings (docs/protocol.md section
    4.9): one per policy id, in the order of ``policy_ids``, each of that policy and of
    the version and run of ``weights``, which is the first policy's; none (and no
    ``weights.policy``) in a single-policy run."""
    ids = settings.policy_ids
    if not ids:
        if policy_weights:
            raise ProtocolError(
                "bad_field",
                "welcome.policy_weights: present, but welcome.config has no policies "
                "(a single-policy run sends none)",
            )
        if weights.policy:
            raise ProtocolError(
                "bad_field",
                f"welcome.weights.policy: {weights.policy!r} in a single-policy run (absent there)",
            )
        return
    if len(policy_weights) != len(ids):
        raise ProtocolError(
            "bad_field",
            f"welcome.policy_weights: {len(policy_weights)} weights, expected one per "
            f"policy of welcome.config.policy_map, in this order: {ids}",
        )
    for i, (pid, each) in enumerate(zip(ids, policy_weights, strict=True)):
        where = f"welcome.policy_weights[{i}]"
        if each.policy != pid:
            raise ProtocolError(
                "bad_field",
                f"{where}.policy: {each.policy!r}, expected {pid!r} (the policies in order "
                f"of first appearance in welcome.config.policy_map: {ids})",
            )
        if each.version != weights.version:
            raise ProtocolError(
                "bad_field",
                f"{where}.version: {each.version}, expected welcome.weights.version "
                f"{weights.version} (every policy is at one version)",
            )
        if each.run_id != weights.run_id:
            raise ProtocolError(
                "bad_field",
                f"{where}.run_id: {each.run_id!r}, expected welcome.weights.run_id "
                f"{weights.run_id!r}",
            )
    if weights.policy != ids[0]:
        raise ProtocolError(
            "bad_field",
            f"welcome.weights.policy: {weights.policy!r}, expected {ids[0]!r} "
            "(welcome.weights is welcome.policy_weights[0])",
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
    ``seq`` of the last fragment this registration sent (``last_seq``, -1 if none), so
    the learner knows when every fragment sent before the bye has arrived."""

    TYPE: ClassVar[str] = "bye"

    actor_id: int
    stats: dict[str, float]
    last_seq: int = -1
    token: bytes = b"\0" * TOKEN_BYTES

    def to_map(self) -> dict[str, Any]:
        return {
            "actor_id": self.actor_id,
            "token": self.token,
            "stats": self.stats,
            "last_seq": self.last_seq,
        }

    @classmethod
    def from_map(cls, body: dict[str, Any]) -> Bye:
        return cls(
            actor_id=_int(body.get("actor_id"), "bye.actor_id", 0, MAX_ACTOR_ID),
            token=_token(body.get("token"), "bye.token"),
            stats=_numbers(body.get("stats"), "bye.stats"),
            last_seq=_int(body.get("last_seq"), "bye.last_seq", -1),
        )


@dataclass
class Heartbeat(Message):
    """Either direction on the control channel: "I am alive".

    From an actor, ``actor_id`` is its id and ``token`` its registration's session
    token (required); from the learner, ``actor_id`` is -1 and there is no token.
    ``run_id`` lets each side notice that the other one restarted. A learner's
    heartbeat may carry ``base_version``: the recipient's base version, which the
    actor adopts when it is greater than its own (the learner admits a registration
    into the rollout once it delivers, docs/protocol.md section 4.6).

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
    token: bytes | None = None
    base_version: int | None = None
    grant: int | None = None
    """Learner only, to an actor welcomed with a grant: the steps per slot it may
    have recorded by now (it adopts a larger one, docs/protocol.md section 5.4)."""

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
        if self.token is not None:
            body["token"] = self.token
        if self.base_version is not None:
            body["base_version"] = self.base_version
        if self.grant is not None:
            body["grant"] = self.grant
        return body

    @classmethod
    def from_map(cls, body: dict[str, Any]) -> Heartbeat:
        actor_id = _int(body.get("actor_id"), "heartbeat.actor_id", -1, MAX_ACTOR_ID)
        token = body.get("token")
        if actor_id >= 0:
            token = _token(token, "heartbeat.token")
        elif token is not None:
            raise ProtocolError("bad_field", "heartbeat.token: a learner heartbeat has none")
        base_version = body.get("base_version")
        grant = _optional_int(body.get("grant"), "heartbeat.grant")
        if grant is not None and actor_id >= 0:
            raise ProtocolError("bad_field", "heartbeat.grant: only a learner heartbeat has one")
        return cls(
            grant=grant,
            actor_id=actor_id,
            token=token,
            base_version=(
                None if base_version is None else _int(base_version, "heartbeat.base_version")
            ),
            run_id=_str(body.get("run_id"), "heartbeat.run_id"),
            version=_int(body.get("version", 0), "heartbeat.version"),
            sent_at=_optional_number(body.get("sent_at"), "heartbeat.sent_at"),
            echo=_optional_number(body.get("echo"), "heartbeat.echo"),
            held=_optional_number(body.get("held"), "heartbeat.held", lo=0.0),
            paused=_optional_number(body.get("paused"), "heartbeat.paused", lo=0.0, hi=1.0),
        )


FRAGMENT_TARGET_BYTES = 1 << 20
"""The Python actor groups a flush's slots into fragments of about this size (one
slot per fragment where a slot alone is larger)."""


def fragment_bytes(observation_space: Any, action_space: Any, rows: int, slots: int) -> int:
    """An upper bound of the encoded size of a fragment of ``rows`` x ``slots`` steps
    (every cell truncated, so a final observation each, plus 4 KB of map overhead)."""
    obs, act = value_nbytes(observation_space), value_nbytes(action_space)
    # obs (+ a final obs), action, reward, done x2, value, log-prob, valid (multi-agent)
    cell = 2 * obs + act + 4 + 1 + 1 + 4 + 4 + 1
    return slots * (rows * cell + obs + 16) + 4096


def slots_per_fragment(observation_space: Any, action_space: Any, rows: int) -> int:
    """How many slots the Python actor puts in one fragment of ``rows`` rows: as many
    as fit in :data:`FRAGMENT_TARGET_BYTES`, at least one."""
    one = fragment_bytes(observation_space, action_space, rows, 1)
    return max(1, FRAGMENT_TARGET_BYTES // one)


def largest_fragment_bytes(observation_space: Any, action_space: Any, fragment_length: int) -> int:
    """Twice the size bound of the largest fragment the Python actor sends, plus 64 KB:
    the default message limit of the learner's experience socket (``max_message_bytes``,
    announced to actors as ``max_fragment_bytes``)."""
    spaces_ = (observation_space, action_space)
    slots = slots_per_fragment(*spaces_, fragment_length)
    return 2 * fragment_bytes(*spaces_, fragment_length, slots) + 64 * 1024


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
    body = unpack_map(frame, max_bytes)
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


# --------------------------------------------------------------------------- per-policy weights


def weights_topic(policy_id: str) -> bytes:
    """The PUB topic frame of the weights of policy ``policy_id`` in a run of several
    policies (docs/protocol.md section 4.9): ``b"policy/" + id + b"\\0"``. The
    trailing NUL makes a prefix subscription exact (``"a"`` does not match ``"ab"``)."""
    return b"policy/" + check_policy_id(policy_id, "policy_id").encode("ascii") + b"\0"


def policy_weights_frames(weights: Weights) -> list[bytes]:
    """The two frames ``[topic, weights]`` that publish ``weights`` (whose ``policy``
    is set) in a run of several policies (docs/protocol.md section 4.9)."""
    return [weights_topic(weights.policy), encode(weights)]


def decode_policy_weights(
    frames: Sequence[bytes | memoryview],
    max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> Weights:
    """Parse and validate one weights publication of a run of several policies: two
    frames ``[topic, weights]`` (else ``bad_frames``) whose topic is
    :func:`weights_topic` of the weights' ``policy`` (else ``bad_field``, naming both);
    the weights frame is decoded as by :func:`decode` with ``max_bytes``."""
    if len(frames) != 2:
        raise ProtocolError(
            "bad_frames",
            f"a per-policy weights publication is 2 frames [topic, weights], got {len(frames)}",
        )
    weights = decode(frames[1], (Weights,), max_bytes)
    assert isinstance(weights, Weights)
    topic = bytes(frames[0])
    if not weights.policy:
        raise ProtocolError(
            "bad_field",
            f"weights.policy: missing in a publication under topic {topic!r}",
        )
    expected = weights_topic(weights.policy)
    if topic != expected:
        raise ProtocolError(
            "bad_field",
            f"weights topic {topic!r} does not match weights.policy {weights.policy!r} "
            f"(expected topic {expected!r})",
        )
    return weights
