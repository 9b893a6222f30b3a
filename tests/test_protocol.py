"""Tests for zmq_rl.protocol: round trips of every message, and every way decode rejects."""

from __future__ import annotations

import contextlib
import dataclasses
import re

import msgpack
import numpy as np
import pytest
from gymnasium import spaces
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zmq_rl.config import PolicyConfig
from zmq_rl.wire.protocol import (
    MESSAGE_TYPES,
    PROTOCOL_VERSION,
    Bye,
    Fragment,
    Heartbeat,
    Hello,
    ProtocolError,
    ProtocolVersionMismatch,
    Refuse,
    RunSettings,
    Shutdown,
    Weights,
    Welcome,
    decode,
    encode,
    encode_array,
    space_from_spec,
    space_spec,
)

RNG = np.random.default_rng(0)


TOKEN = bytes(range(16))


def make_fragment(
    T: int = 6, obs_shape=(3,), obs_dtype=np.float32, continuous: bool = False, B: int = 2
) -> Fragment:
    """Column 0: row 1 truncated only (needs final_obs), row 3 terminated and truncated
    (does not), row T-1 terminated; column 1 (if any): row 2 truncated only."""
    obs = (RNG.standard_normal((T, B, *obs_shape)) * 10).astype(obs_dtype)
    terminated = np.zeros((T, B), bool)
    truncated = np.zeros((T, B), bool)
    truncated[[1, 3], 0] = True
    terminated[[3, T - 1], 0] = True
    cells = [1 * B + 0]
    if B > 1:
        truncated[2, 1] = True
        cells.append(2 * B + 1)
    if continuous:
        actions = RNG.standard_normal((T, B, 2)).astype(np.float32)
    else:
        actions = RNG.integers(0, 4, (T, B)).astype(np.int64)
    return Fragment(
        actor_id=7,
        version=11,
        seq=42,
        run_id="run-abc",
        token=TOKEN,
        slots=np.arange(2, 2 + B, dtype=np.int32),
        obs=obs,
        actions=actions,
        rewards=RNG.standard_normal((T, B)).astype(np.float32),
        terminated=terminated,
        truncated=truncated,
        values=RNG.standard_normal((T, B)).astype(np.float32),
        log_probs=-RNG.random((T, B)).astype(np.float32),
        next_obs=(RNG.standard_normal((B, *obs_shape)) * 10).astype(obs_dtype),
        final_obs_index=np.array(cells, np.int32),
        final_obs=(RNG.standard_normal((len(cells), *obs_shape)) * 10).astype(obs_dtype),
        sent_at=1234.5,
    )


def make_weights(version: int = 3) -> Weights:
    return Weights(
        version=version,
        run_id="run-abc",
        tensors=[
            ("trunk.0.weight", RNG.standard_normal((4, 3)).astype(np.float32)),
            ("trunk.0.bias", np.zeros(4, np.float32)),
            ("steps", np.array(5, np.int64)),
        ],
        extras={"obs_mean": np.arange(3, dtype=np.float64)},
    )


NETWORK = {**dataclasses.asdict(PolicyConfig()), "hidden_sizes": [64, 64]}
"""Every key of a welcome's config.policy (each required, docs/protocol.md 4.4)."""


def make_run_settings(**changes) -> RunSettings:
    base = dict(
        env_id="CartPole-v1",
        observation_space=spaces.Box(-1.0, 1.0, (4,), np.float32),
        action_space=spaces.Discrete(2),
        policy={**NETWORK, "hidden_sizes": [8, 8]},
        num_steps=32,
        broadcast_every=2,
        steps_per_broadcast=64,
        max_lead_steps=128,
        fragment_length=16,
        num_envs=4,
        seed=7,
        heartbeat_interval=1.0,
    )
    return RunSettings(**{**base, **changes})


def body_of(message) -> dict:
    return msgpack.unpackb(encode(message), raw=False)


def frame_of(body: dict) -> bytes:
    return msgpack.packb(body, use_bin_type=True)


def assert_same_array(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


# -- round trips --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("obs_shape", "obs_dtype", "continuous"),
    [((3,), np.float32, False), ((2, 2), np.uint8, False), ((4,), np.float64, True)],
)
def test_fragment_round_trip(obs_shape, obs_dtype, continuous):
    sent = make_fragment(obs_shape=obs_shape, obs_dtype=obs_dtype, continuous=continuous)
    got = decode(encode(sent))
    assert isinstance(got, Fragment)
    assert (got.actor_id, got.version, got.seq, got.run_id, got.sent_at, got.token) == (
        7,
        11,
        42,
        "run-abc",
        1234.5,
        TOKEN,
    )
    assert (got.length, got.num_slots) == (6, 2)
    for name in (*Fragment.STEP_FIELDS, "slots", "next_obs", "final_obs_index", "final_obs"):
        assert_same_array(getattr(got, name), getattr(sent, name))


def test_structured_fragment_round_trip():
    """A dict observation travels as one array per key, a tuple as a list; a recurrent
    state as one [B, S] array."""
    sent = make_fragment(B=2)
    T, B = 6, 2
    sent.obs = {"pos": sent.obs, "cell": (np.ones((T, B), np.int64), np.zeros((T, B, 2), np.int8))}
    sent.next_obs = {
        "pos": sent.next_obs,
        "cell": (np.ones(B, np.int64), np.zeros((B, 2), np.int8)),
    }
    sent.final_obs = {
        "pos": sent.final_obs,
        "cell": (np.ones(2, np.int64), np.zeros((2, 2), np.int8)),
    }
    sent.state = np.arange(B * 5, dtype=np.float32).reshape(B, 5)
    got = decode(encode(sent))
    assert list(got.obs) == ["pos", "cell"] and isinstance(got.obs["cell"], tuple)
    assert_same_array(got.obs["cell"][1], sent.obs["cell"][1])
    assert_same_array(got.final_obs["pos"], sent.final_obs["pos"])
    assert_same_array(got.state, sent.state)
    body = body_of(sent)
    body["next_obs"] = body["next_obs"]["pos"]  # does not nest like the rows
    rejected(frame_of(body), "bad_shape")


def test_for_slot_builds_a_one_column_fragment():
    rows = make_fragment(B=1)
    got = Fragment.for_slot(
        4,
        actor_id=1,
        version=0,
        seq=0,
        run_id="r",
        token=TOKEN,
        **{name: getattr(rows, name)[:, 0] for name in Fragment.STEP_FIELDS},
        next_obs=rows.next_obs[0],
        final_obs_index=[1],
        final_obs=rows.final_obs,
    )
    assert (got.num_slots, got.slots.tolist()) == (1, [4])
    assert_same_array(decode(encode(got)).obs, rows.obs)


def test_fragment_without_final_obs_round_trips_to_empty():
    sent = make_fragment()
    sent.truncated[:] = False
    sent.final_obs_index = np.zeros(0, np.int32)
    sent.final_obs = None
    got = decode(encode(sent), expected=(Fragment,))
    assert got.final_obs.shape == (0, 3)  # [K, *obs_shape]
    assert got.final_obs.dtype == np.float32
    assert got.final_obs_index.shape == (0,)


def test_weights_round_trip_keeps_order_names_and_dtypes():
    sent = make_weights()
    got = decode(encode(sent))
    assert isinstance(got, Weights)
    assert (got.version, got.run_id) == (3, "run-abc")
    assert [name for name, _ in got.tensors] == [name for name, _ in sent.tensors]
    for (_, a), (_, b) in zip(got.tensors, sent.tensors, strict=True):
        assert_same_array(a, b)
    assert list(got.extras) == ["obs_mean"]
    assert_same_array(got.extras["obs_mean"], sent.extras["obs_mean"])


def test_big_endian_arrays_arrive_little_endian_with_same_values():
    values = np.arange(5, dtype=">f4")
    got = decode(encode(Weights(version=1, run_id="r", tensors=[("w", values)])))
    array = got.tensors[0][1]
    assert array.dtype == np.dtype("<f4")
    np.testing.assert_array_equal(array, np.arange(5, dtype=np.float32))


def test_control_messages_round_trip():
    box = spaces.Box(-1.0, 2.0, (3,), np.float32)
    hello = Hello(
        actor_id=-1,
        env_id="CartPole-v1",
        observation_space=space_spec(box),
        action_space=space_spec(spaces.Discrete(2)),
        num_envs=4,
        host="h",
        pid=99,
        rejoin_run_id="old",
    )
    welcome = Welcome(
        actor_id=3,
        run_id="run-abc",
        base_version=2,
        experience_port=6001,
        weights_port=6002,
        settings=make_run_settings(),
        weights=make_weights(2),
        token=TOKEN,
    )
    plain = [
        hello,
        Refuse(code="space_mismatch", reason="spaces differ"),
        Shutdown(reason="budget spent", run_id="run-abc"),
        Bye(actor_id=3, token=TOKEN, stats={"steps_sent": 40.0, "episodes_completed": 8}),
        Heartbeat(actor_id=-1, run_id="run-abc", version=9, base_version=3),
        Heartbeat(actor_id=2, run_id="run-abc", version=9, token=TOKEN, paused=0.5),
    ]
    for message in plain:
        got = decode(encode(message))
        assert type(got) is type(message)
        assert got == message
    got = decode(encode(welcome))
    assert isinstance(got, Welcome)
    assert (got.actor_id, got.run_id, got.base_version, got.token) == (3, "run-abc", 2, TOKEN)
    assert (got.experience_port, got.weights_port) == (6001, 6002)
    assert got.settings == welcome.settings
    assert got.weights.version == 2
    for (na, a), (nb, b) in zip(got.weights.tensors, welcome.weights.tensors, strict=True):
        assert na == nb
        assert_same_array(a, b)
    assert space_from_spec(decode(encode(hello)).observation_space) == box


def test_every_message_type_is_covered():
    assert set(MESSAGE_TYPES) == {
        "fragment",
        "weights",
        "hello",
        "welcome",
        "refuse",
        "shutdown",
        "bye",
        "heartbeat",
    }
    assert body_of(Heartbeat(actor_id=1, run_id="r", token=TOKEN))["proto"] == PROTOCOL_VERSION == 2


def test_actor_heartbeats_and_byes_need_the_token():
    body = body_of(Heartbeat(actor_id=1, run_id="r", token=TOKEN))
    del body["token"]
    rejected(frame_of(body), "bad_field")
    body = body_of(Heartbeat(actor_id=-1, run_id="r"))
    body["token"] = TOKEN
    rejected(frame_of(body), "bad_field")  # a learner heartbeat carries none
    body = body_of(Bye(actor_id=1, token=TOKEN, stats={}))
    body["token"] = b"short"
    rejected(frame_of(body), "bad_field")


@pytest.mark.parametrize(
    "space",
    [
        spaces.Box(-np.inf, np.inf, (4,), np.float32),
        spaces.Box(np.array([-1.0, 0.0]), np.array([1.0, 5.0]), dtype=np.float64),
        spaces.Box(0, 255, (2, 3), np.uint8),
        spaces.Discrete(2),
        spaces.Discrete(5, start=-2),
        spaces.MultiBinary(5),
        spaces.MultiBinary([2, 3]),
        spaces.MultiDiscrete([3, 4, 2]),
        spaces.MultiDiscrete(np.array([[2, 3], [4, 5]]), start=np.array([[0, 1], [-1, 0]])),
        spaces.Dict({"a": spaces.Box(-1, 1, (3,)), "b": spaces.Discrete(4)}),
        spaces.Dict({"z": spaces.MultiBinary(2), "a": spaces.Tuple([spaces.Discrete(2)])}),
        spaces.Tuple([spaces.Box(0, 255, (4, 4), np.uint8), spaces.MultiDiscrete([2, 2])]),
    ],
)
def test_space_spec_round_trip(space):
    spec = space_spec(space)
    # The spec survives the wire (it travels inside hello / welcome).
    spec = msgpack.unpackb(msgpack.packb(spec, use_bin_type=True), raw=False)
    rebuilt = space_from_spec(spec)
    assert rebuilt == space
    assert type(rebuilt) is type(space)
    if isinstance(space, spaces.Box):
        assert rebuilt.dtype == space.dtype
        np.testing.assert_array_equal(rebuilt.low, space.low)
        np.testing.assert_array_equal(rebuilt.high, space.high)


def test_space_spec_distinguishes_spaces():
    a = space_from_spec(space_spec(spaces.Box(-1.0, 1.0, (4,), np.float32)))
    b = space_from_spec(space_spec(spaces.Box(-2.0, 1.0, (4,), np.float32)))
    assert a != b
    assert space_from_spec(space_spec(spaces.Discrete(2))) != spaces.Discrete(3)


@pytest.mark.parametrize(
    "spec",
    [
        "box",
        {"kind": "tuple"},
        {"kind": "discrete", "n": 0},
        {"kind": "discrete", "n": True},
        {"kind": "box", "shape": [2], "dtype": "float32", "low": None, "high": None},
        {"kind": "dict", "spaces": []},
        {"kind": "dict", "spaces": [["a", {"kind": "discrete", "n": 2}]] * 2},
        {"kind": "multi_binary", "shape": [0]},
        {"kind": "multi_discrete", "nvec": encode_array(np.array([0])), "start": None},
        {
            "kind": "dict",
            "spaces": [[k, {"kind": "discrete", "n": 2}] for k in ("dtype", "shape", "data")],
        },
        {
            "kind": "tuple",
            "spaces": [
                {
                    "kind": "tuple",
                    "spaces": [
                        {
                            "kind": "tuple",
                            "spaces": [{"kind": "tuple", "spaces": [{"kind": "discrete", "n": 2}]}],
                        }
                    ],
                }
            ],
        },
    ],
)
def test_space_from_spec_rejects_garbage(spec):
    with pytest.raises(ProtocolError):
        space_from_spec(spec)


@pytest.mark.parametrize(
    "spec",
    [
        {"kind": "discrete", "n": 2**63},
        {"kind": "discrete", "n": 2, "start": 2**64 - 1},
    ],
)
def test_space_from_spec_rejects_huge_discrete(spec):
    with pytest.raises(ProtocolError):
        space_from_spec(spec)


# -- decode rejects -----------------------------------------------------------------------


def rejected(frame, reason: str, **kwargs) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        decode(frame, **kwargs)
    assert info.value.reason == reason, f"reason {info.value.reason!r}: {info.value}"
    return info.value


def test_rejects_non_msgpack_and_non_maps():
    rejected(b"\xc1\x00\x01", "not_msgpack")  # 0xc1 is never used by msgpack
    rejected(b"", "not_msgpack")
    rejected(encode(make_fragment())[:-10], "not_msgpack")
    rejected(msgpack.packb([1, 2, 3]), "not_a_map")
    rejected(msgpack.packb("fragment"), "not_a_map")


def test_rejects_missing_or_other_protocol_version():
    body = body_of(Heartbeat(actor_id=1, run_id="r", token=TOKEN))
    del body["proto"]
    err = rejected(frame_of(body), "version_mismatch")
    assert isinstance(err, ProtocolVersionMismatch)
    assert err.theirs is None
    for other in (1, 3, 0, "2", 2.0, True):
        body["proto"] = other
        err = rejected(frame_of(body), "version_mismatch")
        assert isinstance(err, ProtocolVersionMismatch)
        assert err.theirs == other
    body["proto"] = 1
    message = str(rejected(frame_of(body), "version_mismatch"))
    assert re.search(r"\b1\b", message) and re.search(rf"\b{PROTOCOL_VERSION}\b", message)


def test_rejects_unknown_and_unexpected_types():
    body = body_of(Heartbeat(actor_id=1, run_id="r", token=TOKEN))
    for kind in ("teleport", None, 3, ["heartbeat"]):
        body["type"] = kind
        rejected(frame_of(body), "unknown_type")
    beat = encode(Heartbeat(actor_id=1, run_id="r", token=TOKEN))
    rejected(beat, "unexpected_type", expected=(Fragment,))
    assert isinstance(decode(beat, expected=(Hello, Heartbeat)), Heartbeat)
    rejected(encode(make_weights()), "unexpected_type", expected=(Fragment,))


def mutated_fragment(mutate) -> bytes:
    body = body_of(make_fragment())
    mutate(body)
    return frame_of(body)


def _set(path, value):
    def mutate(body):
        target = body
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


def _replace_array(name, array):
    def mutate(body):
        body[name] = encode_array(array)

    return mutate


def _bool_byte_2(body):
    data = bytearray(body["terminated"]["data"])
    data[0] = 2
    body["terminated"]["data"] = bytes(data)


def _nan_reward(body):
    rewards = np.frombuffer(body["rewards"]["data"], np.float32).copy()
    rewards[2] = np.nan
    body["rewards"]["data"] = rewards.tobytes()


def _inf_value(body):
    values = np.frombuffer(body["values"]["data"], np.float32).copy()
    values[0] = np.inf
    body["values"]["data"] = values.tobytes()


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (_set(("obs", "dtype"), "complex64"), "bad_dtype"),
        (_set(("obs", "dtype"), "object"), "bad_dtype"),
        (_replace_array("rewards", np.ones((6, 2), np.int32)), "bad_dtype"),  # not here
        (_set(("obs", "shape"), [6, 2, 4]), "size_mismatch"),
        (_set(("obs", "data"), b"\x00" * 7), "size_mismatch"),
        (_set(("obs", "shape"), [-6, -2, -3]), "bad_shape"),
        (_set(("obs", "shape"), [6, 2, 3.0]), "bad_shape"),
        (_set(("obs", "shape"), [1] * 9 + [36]), "bad_shape"),
        (_set(("obs", "shape"), [12, 1, 3]), "bad_shape"),  # leading dims are not [T, B]
        (_set(("obs",), [1, 2, 3]), "bad_array"),
        (_nan_reward, "not_finite"),
        (_inf_value, "not_finite"),
        (_replace_array("values", np.zeros((5, 2), np.float32)), "bad_shape"),
        (_replace_array("actions", np.zeros((7, 2), np.int64)), "bad_shape"),
        (_replace_array("next_obs", np.zeros((2, 4), np.float32)), "bad_shape"),
        (_replace_array("next_obs", np.zeros((3, 3), np.float32)), "bad_shape"),
        (_replace_array("rewards", np.zeros((0, 2), np.float32)), "bad_shape"),
        (_replace_array("rewards", np.zeros(6, np.float32)), "bad_shape"),
        (_replace_array("slots", np.array([2, 2], np.int32)), "bad_field"),
        (_replace_array("slots", np.array([2], np.int32)), "bad_field"),
        (_replace_array("slots", np.array([2, -3], np.int32)), "bad_field"),
        (_replace_array("state", np.zeros((3, 4), np.float32)), "bad_shape"),
        (_replace_array("state", np.zeros((2, 4), np.float64)), "bad_dtype"),
        # Cell (3, 0) is terminated too: it must not be listed.
        (_replace_array("final_obs_index", np.array([2, 6], np.int32)), "bad_field"),
        (_bool_byte_2, "bad_value"),
        (_set(("token",), b"x" * 15), "bad_field"),
        (_set(("token",), "0123456789abcdef"), "bad_field"),
        (_set(("seq",), "1"), "bad_field"),
        (_set(("version",), True), "bad_field"),
        (_set(("sent_at",), float("nan")), "bad_value"),
    ],
)
def test_fragment_field_rejects(mutate, reason):
    rejected(mutated_fragment(mutate), reason)


def test_final_obs_index_must_list_exactly_the_truncated_cells():
    """Flat indices t * B + b: here (1, 0) -> 2 and (2, 1) -> 5, ascending."""

    def index_and_obs(index):
        def mutate(body):
            body["final_obs_index"] = encode_array(np.array(index, np.int32))
            body["final_obs"] = encode_array(np.zeros((len(index), 3), np.float32))

        return mutate

    for index in ([2], [5, 2], [2, 5, 6], [], [1, 5], [2, 2]):
        rejected(mutated_fragment(index_and_obs(index)), "bad_field")
    decode(mutated_fragment(index_and_obs([2, 5])))  # the right cells pass


def test_rejects_oversized_frames():
    frame = encode(make_fragment())
    rejected(frame, "too_large", max_bytes=len(frame) - 1)
    assert isinstance(decode(frame, max_bytes=len(frame)), Fragment)


def test_rejects_bin_claiming_huge_size():
    # {"data": bin32 of 2**31 - 1 bytes} followed by only 3 bytes.
    frame = b"\x81\xa4data\xc6\x7f\xff\xff\xff" + b"abc"
    rejected(frame, "not_msgpack")
    # Same within a real-looking message.
    head = frame_of({"proto": 2, "type": "fragment"})
    rejected(b"\x83" + head[1:] + b"\xa3obs\xc6\xff\xff\xff\xf0" + b"x" * 10, "not_msgpack")


def test_weights_rejects_duplicate_names_and_bad_tensors():
    body = body_of(make_weights())
    body["tensors"][1][0] = body["tensors"][0][0]
    err = rejected(frame_of(body), "bad_field")
    assert "trunk.0.weight" in str(err)
    body = body_of(make_weights())
    body["tensors"] = []
    rejected(frame_of(body), "bad_field")
    weights = make_weights()
    weights.tensors[0][1][0, 0] = np.nan
    rejected(encode(weights), "not_finite")


# -- arbitrary input never raises anything but ProtocolError ------------------------------

VALID_BODIES = [
    body_of(make_fragment()),
    body_of(make_weights()),
    body_of(Heartbeat(actor_id=1, run_id="r", token=TOKEN)),
    body_of(Bye(actor_id=1, token=TOKEN, stats={"a": 1.0}, last_seq=1)),
    body_of(Hello(actor_id=-1, env_id="e", observation_space={}, action_space={}, num_envs=1)),
    body_of(
        Welcome(
            actor_id=1,
            run_id="r",
            base_version=0,
            experience_port=1,
            weights_port=2,
            settings=make_run_settings(),
            weights=make_weights(),
            token=TOKEN,
        )
    ),
]
FIELD_NAMES = sorted({key for body in VALID_BODIES for key in body} | {"dtype", "shape", "data"})

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.binary(max_size=32),
    st.sampled_from(sorted(MESSAGE_TYPES)),
)
arrays = st.fixed_dictionaries(
    {
        "dtype": st.one_of(st.sampled_from(["bool", "int32", "float32", "float16"]), scalars),
        "shape": st.one_of(st.lists(st.integers(-2, 2**40), max_size=4), scalars),
        "data": st.one_of(st.binary(max_size=64), scalars),
    }
)
values = st.recursive(
    st.one_of(scalars, arrays),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(FIELD_NAMES), inner, max_size=3),
    ),
    max_leaves=8,
)


def decode_only_protocol_errors(frame: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        decode(frame)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=256))
def test_arbitrary_bytes_only_raise_protocol_error(data):
    decode_only_protocol_errors(data)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(VALID_BODIES),
    st.dictionaries(st.sampled_from(FIELD_NAMES), values, max_size=3),
    st.lists(st.sampled_from(FIELD_NAMES), max_size=2),
)
def test_mutated_messages_only_raise_protocol_error(body, changes, removals):
    body = {**body, **changes}
    for key in removals:
        body.pop(key, None)
    if "proto" not in changes:
        body["proto"] = PROTOCOL_VERSION
    decode_only_protocol_errors(frame_of(body))


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(st.text(max_size=6), values, max_size=4), st.sampled_from(sorted(MESSAGE_TYPES))
)
def test_arbitrary_maps_only_raise_protocol_error(body, kind):
    body = {**body, "proto": PROTOCOL_VERSION, "type": kind}
    decode_only_protocol_errors(frame_of(body))


# -- the welcome's run settings -----------------------------------------------------------

RUN_SETTINGS_FIELDS = [f for f in make_run_settings().to_map() if f not in RunSettings.OPTIONAL]


def welcome_body(config: dict) -> bytes:
    body = body_of(
        Welcome(
            actor_id=1,
            run_id="r",
            base_version=0,
            experience_port=1,
            weights_port=2,
            settings=make_run_settings(),
            weights=make_weights(),
        )
    )
    body["config"] = config
    return frame_of(body)


def test_run_settings_round_trip_as_typed_fields():
    settings = make_run_settings()
    got = RunSettings.from_map(msgpack.unpackb(msgpack.packb(settings.to_map()), raw=False))
    assert got == settings
    assert got.observation_space == spaces.Box(-1.0, 1.0, (4,), np.float32)
    assert (got.max_lead_steps, got.num_envs, got.heartbeat_interval) == (128, 4, 1.0)


@pytest.mark.parametrize("name", RUN_SETTINGS_FIELDS)
def test_each_missing_run_setting_is_refused_by_name(name):
    config = make_run_settings().to_map()
    del config[name]
    with pytest.raises(ProtocolError, match=rf"welcome\.config\.{name}: missing") as info:
        decode(welcome_body(config))
    assert info.value.reason == "bad_field"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("max_lead_steps", -1),
        ("max_lead_steps", "128"),
        ("num_steps", 0),
        ("steps_per_broadcast", 16),  # less than one rollout
        ("fragment_length", 1.5),
        ("num_envs", 0),
        ("num_envs", 5000),
        ("seed", -3),
        ("heartbeat_interval", 0),
        ("heartbeat_interval", float("nan")),
        ("env_id", 5),
        ("policy", [1, 2]),
        ("observation_space", {"kind": "torus"}),
    ],
)
def test_an_ill_typed_run_setting_is_refused_by_name(name, value):
    config = {**make_run_settings().to_map(), name: value}
    with pytest.raises(ProtocolError, match=rf"welcome\.config\.{name}") as info:
        decode(welcome_body(config))
    assert info.value.reason == "bad_field"


def test_an_integer_heartbeat_interval_is_a_number():
    """A msgpack encoder may write 1.0 as 1: a number field takes either."""
    config = {**make_run_settings().to_map(), "heartbeat_interval": 2}
    assert decode(welcome_body(config)).settings.heartbeat_interval == 2.0


def test_welcome_config_still_reads_as_a_map_with_a_deprecation_warning():
    welcome = decode(welcome_body(make_run_settings().to_map()))
    with pytest.warns(DeprecationWarning, match="Welcome.settings"):
        config = welcome.config
    assert config["max_lead_steps"] == 128 and config["seed"] == 7
