"""Several policies in one run, on the wire (docs/protocol.md section 4.9): the hello's
``features``, ``weights.policy``, the welcome's ``policy_map``, ``policies`` and
``policy_weights``, and the per-policy topic of a weights publication. Every rule is
refused as ``bad_field`` naming the field; a single-policy run keeps every byte."""

from __future__ import annotations

import dataclasses

import msgpack
import numpy as np
import pytest
from gymnasium import spaces

from tests.test_protocol import NETWORK
from zmq_rl.wire.protocol import (
    FEATURE_POLICIES,
    POLICY_ID_PATTERN,
    Hello,
    ProtocolError,
    RunSettings,
    Weights,
    Welcome,
    check_policy_id,
    decode,
    decode_policy_weights,
    encode,
    policy_weights_frames,
    weights_topic,
)

TOKEN = bytes(range(16))
FIRST = {**NETWORK, "hidden_sizes": [8, 8], "activation": "tanh"}
SECOND = {**NETWORK, "hidden_sizes": [8, 8], "activation": "relu"}


def settings(**changes) -> RunSettings:
    base = dict(
        env_id="pairs",
        observation_space=spaces.Box(-1.0, 1.0, (4,), np.float32),
        action_space=spaces.Discrete(2),
        policy=dict(FIRST),
        num_steps=32,
        broadcast_every=1,
        steps_per_broadcast=32,
        max_lead_steps=64,
        fragment_length=16,
        num_envs=6,
        seed=7,
        heartbeat_interval=1.0,
    )
    return RunSettings(**{**base, **changes})


def two_policies(**changes) -> RunSettings:
    """Three agents per env: agents 0 and 2 on ``red``, agent 1 on ``blue``."""
    return settings(
        agents_per_env=3,
        policy_map=["red", "blue", "red"],
        policies={"red": dict(FIRST), "blue": dict(SECOND)},
        **changes,
    )


def weights(policy: str = "", version: int = 4, run_id: str = "run") -> Weights:
    return Weights(
        version=version,
        run_id=run_id,
        tensors=[("w", np.arange(6, dtype=np.float32).reshape(2, 3))],
        policy=policy,
    )


def welcome(run: RunSettings, policy_weights: list[Weights], first: Weights | None = None):
    return Welcome(
        actor_id=1,
        run_id="run",
        base_version=0,
        experience_port=6001,
        weights_port=6002,
        settings=run,
        weights=first if first is not None else (policy_weights or [weights()])[0],
        token=TOKEN,
        policy_weights=policy_weights,
    )


def body_of(message) -> dict:
    return msgpack.unpackb(encode(message), raw=False)


def frame_of(body: dict) -> bytes:
    return msgpack.packb(body, use_bin_type=True)


def refused(frame: bytes, field: str) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        decode(frame)
    assert info.value.reason == "bad_field", str(info.value)
    assert field in str(info.value), str(info.value)
    return info.value


def config_frame(**config_changes) -> bytes:
    """The frame of a two-policy welcome whose config has ``config_changes`` (a value
    of None deletes the key)."""
    body = body_of(
        welcome(two_policies(), [weights("red"), weights("blue")]),
    )
    for key, value in config_changes.items():
        if value is None:
            body["config"].pop(key)
        else:
            body["config"][key] = value
    return frame_of(body)


# -- a single-policy run keeps its bytes ---------------------------------------------------


def test_single_policy_messages_have_no_new_keys():
    assert not {"policy_map", "policies"} & set(settings().to_map())
    assert "features" not in Hello(-1, "", {}, {}, 0).to_map()
    assert "policy" not in weights().to_map()
    body = welcome(settings(), []).to_map()
    assert "policy_weights" not in body and "policy" not in body["weights"]
    assert settings().policy_ids == [] and settings().policy_of_slot(5) == ""


def test_single_policy_messages_round_trip_unchanged():
    for message in (Hello(-1, "e", {}, {}, 2, host="h"), weights()):
        assert encode(decode(encode(message))) == encode(message)
    plain = welcome(settings(), [])
    got = decode(encode(plain))
    assert got.policy_weights == [] and got.settings == plain.settings
    assert encode(got) == encode(plain)


# -- policy ids and topics -----------------------------------------------------------------


@pytest.mark.parametrize("value", ["a", "red", "Team_1.v-2", "x" * 64, "0"])
def test_a_policy_id_is_1_to_64_safe_chars(value):
    assert check_policy_id(value, "here") == value
    assert POLICY_ID_PATTERN == "[A-Za-z0-9_.-]{1,64}"


@pytest.mark.parametrize("value", ["", "x" * 65, "a b", "a/b", "a\0", "é", "a\n", 3, None, b"a"])
def test_anything_else_is_not_a_policy_id(value):
    with pytest.raises(ProtocolError, match="here") as info:
        check_policy_id(value, "here")
    assert info.value.reason == "bad_field" and repr(value) in str(info.value)


def test_the_topic_of_a_policy_is_exact_under_prefix_subscription():
    assert weights_topic("a") == b"policy/a\0"
    assert not weights_topic("ab").startswith(weights_topic("a"))
    with pytest.raises(ProtocolError):
        weights_topic("a/b")


def test_a_per_policy_publication_round_trips():
    published = weights("blue", version=9)
    frames = policy_weights_frames(published)
    assert frames == [b"policy/blue\0", encode(published)]
    got = decode_policy_weights(frames, 1 << 20)
    assert (got.policy, got.version) == ("blue", 9)
    got = decode_policy_weights([memoryview(f) for f in frames], 1 << 20)
    assert got.policy == "blue"


def test_a_publication_under_another_topic_is_refused_naming_both():
    frames = [weights_topic("red"), encode(weights("blue"))]
    with pytest.raises(ProtocolError) as info:
        decode_policy_weights(frames, 1 << 20)
    assert info.value.reason == "bad_field"
    assert "policy/red" in str(info.value) and "'blue'" in str(info.value)


def test_a_publication_without_a_policy_or_of_one_frame_is_refused():
    with pytest.raises(ProtocolError, match="weights.policy: missing") as info:
        decode_policy_weights([weights_topic("red"), encode(weights())], 1 << 20)
    assert info.value.reason == "bad_field"
    with pytest.raises(ProtocolError) as info:
        decode_policy_weights([encode(weights("red"))], 1 << 20)
    assert info.value.reason == "bad_frames"
    with pytest.raises(ProtocolError) as info:  # the size limit of decode applies
        decode_policy_weights([weights_topic("red"), encode(weights("red"))], 10)
    assert info.value.reason == "too_large"


# -- weights.policy and hello.features -----------------------------------------------------


def test_weights_carry_their_policy():
    got = decode(encode(weights("red")))
    assert got.policy == "red"
    assert body_of(weights("red"))["policy"] == "red"
    body = body_of(weights("red"))
    body["policy"] = ""
    refused(frame_of(body), "weights.policy")
    body["policy"] = "no such/id"
    refused(frame_of(body), "'no such/id'")


def test_hello_features_round_trip():
    hello = Hello(-1, "e", {}, {}, 3, features=[FEATURE_POLICIES, "other"])
    assert FEATURE_POLICIES == "policies"
    assert body_of(hello)["features"] == ["policies", "other"]
    assert decode(encode(hello)) == hello


@pytest.mark.parametrize(
    ("features", "named"),
    [
        ("policies", "hello.features"),
        (["x"] * 17, "hello.features"),
        (["x" * 65], "hello.features[0]"),
        (["policies", 3], "hello.features[1]"),
    ],
)
def test_bad_hello_features_are_refused_by_name(features, named):
    body = body_of(Hello(-1, "e", {}, {}, 3))
    body["features"] = features
    refused(frame_of(body), named)


# -- the welcome's config ------------------------------------------------------------------


def test_two_policy_settings_round_trip_with_their_slots():
    run = two_policies()
    body = run.to_map()
    assert body["policy_map"] == ["red", "blue", "red"]
    assert body["policies"] == {"red": FIRST, "blue": SECOND}
    got = RunSettings.from_map(msgpack.unpackb(msgpack.packb(body), raw=False))
    assert got == run
    assert got.policy_ids == ["red", "blue"]
    assert [got.policy_of_slot(s) for s in range(6)] == ["red", "blue", "red"] * 2


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"policies": None}, "welcome.config.policies: missing"),
        ({"policy_map": None}, "welcome.config.policy_map: missing"),
        ({"policy_map": ["red", "blue"]}, "welcome.config.policy_map: 2 entries"),
        ({"policy_map": "red"}, "welcome.config.policy_map"),
        ({"policy_map": ["red", "b lue", "red"]}, "welcome.config.policy_map[1]: 'b lue'"),
        ({"policy_map": ["red", "green", "red"]}, "welcome.config.policy_map[1]: policy 'green'"),
        (
            {"policies": {"red": FIRST, "blue": SECOND, "green": SECOND}},
            "welcome.config.policies.green",
        ),
        ({"policies": {"red": FIRST, "b/lue": SECOND}}, "welcome.config.policies: 'b/lue'"),
        ({"policies": {"red": FIRST, "blue": [1]}}, "welcome.config.policies.blue"),
        ({"policies": [FIRST, SECOND]}, "welcome.config.policies"),
        (
            {"policy_map": ["red", "red", "red"], "policies": {"red": FIRST}},
            "welcome.config.policy_map: ['red', 'red', 'red'] names one policy",
        ),
        ({"policy": SECOND}, "welcome.config.policy: must equal welcome.config.policies.red"),
    ],
)
def test_each_rule_of_the_policy_map_is_refused_by_name(changes, named):
    refused(config_frame(**changes), named)


def test_a_policy_map_longer_than_one_agent_is_refused_for_one_agent():
    body = two_policies().to_map()
    body["agents_per_env"] = 1
    with pytest.raises(ProtocolError, match=r"welcome\.config\.policy_map: 3 entries"):
        RunSettings.from_map(body)


# -- the welcome's policy_weights ----------------------------------------------------------


def test_a_two_policy_welcome_round_trips():
    each = [weights("red"), weights("blue")]
    message = welcome(two_policies(), each)
    body = body_of(message)
    assert [w["policy"] for w in body["policy_weights"]] == ["red", "blue"]
    got = decode(encode(message))
    assert [w.policy for w in got.policy_weights] == ["red", "blue"]
    assert got.weights.policy == "red" and got.settings == message.settings
    assert encode(got) == encode(message)


@pytest.mark.parametrize(
    ("each", "first", "named"),
    [
        ([], None, "welcome.policy_weights: 0 weights"),
        ([weights("red")], None, "welcome.policy_weights: 1 weights"),
        ([weights("blue"), weights("red")], None, "welcome.policy_weights[0].policy: 'blue'"),
        ([weights("red"), weights("green")], None, "welcome.policy_weights[1].policy"),
        ([weights("red"), weights("blue", 5)], None, "welcome.policy_weights[1].version: 5"),
        (
            [weights("red"), weights("blue", run_id="old")],
            None,
            "welcome.policy_weights[1].run_id",
        ),
        ([weights("red"), weights("blue")], weights("blue"), "welcome.weights.policy: 'blue'"),
        ([weights("red"), weights("blue")], weights(), "welcome.weights.policy: ''"),
    ],
)
def test_each_rule_of_policy_weights_is_refused_by_name(each, first, named):
    message = welcome(two_policies(), each, first=first or weights("red"))
    refused(encode(message), named)


def test_a_single_policy_welcome_takes_no_policy_weights_nor_a_weights_policy():
    refused(
        encode(welcome(settings(), [weights("red")], first=weights())), "welcome.policy_weights"
    )
    refused(encode(welcome(settings(), [], first=weights("red"))), "welcome.weights.policy")


def test_an_invalid_entry_of_policy_weights_is_named_by_its_index():
    body = body_of(welcome(two_policies(), [weights("red"), weights("blue")]))
    body["policy_weights"][1]["tensors"] = []
    refused(frame_of(body), "welcome.policy_weights[1]: weights.tensors")
    body["policy_weights"] = {"red": 1}
    refused(frame_of(body), "welcome.policy_weights: expected a list")
    body["policy_weights"] = [3]
    refused(frame_of(body), "welcome.policy_weights[0]")


def test_replace_keeps_policy_ids_derived_from_the_map():
    run = dataclasses.replace(
        two_policies(), policy_map=["blue", "red", "blue"], policy=dict(SECOND)
    )
    assert run.policy_ids == ["blue", "red"] and run.policy_of_slot(4) == "red"
    assert RunSettings.from_map(run.to_map()) == run


def test_the_opponent_choice_travels_only_when_it_is_not_uniform():
    pool = {"opponent_pool": 4, "opponent_every": 2, "opponent_share": 0.5}
    assert "opponent_choice" not in settings(**pool).to_map()
    latest = settings(**pool, opponent_choice="latest")
    assert latest.to_map()["opponent_choice"] == "latest"
    assert RunSettings.from_map(latest.to_map()).opponent_choice == "latest"
    assert RunSettings.from_map(settings(**pool).to_map()).opponent_choice == "uniform"
    body = {**latest.to_map(), "opponent_choice": "strongest"}
    with pytest.raises(ProtocolError, match="welcome.config.opponent_choice: 'strongest'"):
        RunSettings.from_map(body)


def test_opening_moves_travel_only_when_asked_for():
    """``welcome.config.opening_moves``: absent means 0 (earlier welcomes keep their
    bytes), a count round-trips, and a negative or non-integer one is refused by name."""
    assert "opening_moves" not in settings().to_map()
    assert RunSettings.from_map(settings().to_map()).opening_moves == 0
    opened = settings(opening_moves=6)
    assert opened.to_map()["opening_moves"] == 6
    assert RunSettings.from_map(opened.to_map()).opening_moves == 6
    for bad in (-1, 2.5, "6"):
        with pytest.raises(ProtocolError, match="welcome.config.opening_moves"):
            RunSettings.from_map({**opened.to_map(), "opening_moves": bad})
