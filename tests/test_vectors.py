"""The golden vectors of docs/protocol/vectors/ against the Python codec, both ways.

Valid vectors: the view encodes to exactly the vector's bytes, the bytes decode (with
:func:`zmq_rl.wire.protocol.decode`) to a message that re-encodes to the same bytes and
whose view is the vector's view. Invalid vectors: each is rejected with its reason at
its stage (decode, the learner's fragment checks, its session check, or the hello
checks). The vectors are regenerated and must match the committed files byte for byte,
and section 10 of docs/protocol.md must be the generated worked example.
"""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from zmq_rl.conformance import vectors as V
from zmq_rl.learner.membership import FragmentRejected, Membership, check_hello
from zmq_rl.wire.protocol import (
    Bye,
    Fragment,
    Heartbeat,
    Hello,
    ProtocolError,
    Refuse,
    Shutdown,
    Weights,
    Welcome,
    decode,
    decode_policy_weights,
    encode,
    weights_topic,
)
from zmq_rl.wire.spaces import space_from_spec, space_spec

ROOT = Path(__file__).resolve().parents[1]
VECTORS = ROOT / "docs" / "protocol" / "vectors"
VALID = sorted(p for p in VECTORS.glob("*.json") if p.name != "index.json")
INVALID = sorted((VECTORS / "invalid").glob("*.json"))
SOCKET_TYPES = {
    "experience": (Fragment,),
    "control": (Hello, Heartbeat, Bye),
    # what an actor receives: its DEALER, and its SUB (section 4.9: with a topic frame)
    "actor-control": (Welcome, Refuse, Heartbeat, Shutdown),
    "weights": (Weights,),
}
ROUTING_ID = b"\x00\x01\x02\x03\x04"


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_every_kind_is_covered():
    names = {p.stem for p in VALID}
    for kind in ("box", "discrete", "multi_binary", "multi_discrete", "dict", "tuple"):
        assert f"space-{kind}" in names and f"fragment-obs-{kind}" in names
    types = {load(p)["type"] for p in VALID}
    assert types >= {
        "hello",
        "welcome",
        "refuse",
        "heartbeat",
        "shutdown",
        "bye",
        "fragment",
        "weights",
        "space",
    }
    reasons = {load(p)["reason"] for p in INVALID}
    assert len(INVALID) >= 30 and {"bad_field", "bad_array", "old_seq", "bad_state"} <= reasons


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.stem)
def test_valid_vector_both_ways(path):
    vector = load(path)
    frame = bytes.fromhex(vector["hex"])
    assert vector["size"] == len(frame)
    # view -> bytes: the view is byte-exact under the Python encoder's key order
    assert V.pack(V.from_view(vector["view"])) == frame
    if vector["type"] == "space":
        space = space_from_spec(V.unpack(frame))
        assert V.pack(space_spec(space)) == frame
        return
    # bytes -> message -> bytes, and the message's view is the vector's
    message = decode(frame)
    if "topic" in vector:  # a per-policy publication: [topic, frame] (section 4.9)
        topic = bytes.fromhex(vector["topic"])
        assert topic == weights_topic(message.policy)
        assert encode(decode_policy_weights([topic, frame], len(frame))) == frame
    assert vector["type"] == message.TYPE
    assert encode(message) == frame
    assert V.to_view(V.unpack(encode(message))) == vector["view"]
    # view -> message (through the codec's own checks) -> the same bytes
    body = V.from_view(vector["view"])
    rebuilt = type(message).from_map({k: v for k, v in body.items() if k not in ("proto", "type")})
    assert encode(rebuilt) == frame


def _membership(context: dict) -> Membership:
    members = Membership()
    hello = Hello(context["actor_id"], "CartPole-v1", {}, {}, context["num_envs"])
    rec, _ = members.register(ROUTING_ID, hello, version=0, started=False, default_envs=1, now=0.0)
    rec.token = bytes.fromhex(context["token"])
    rec.next_seq = context["next_seq"]
    return members


def _run_spaces(context: dict) -> tuple[gym.Space, gym.Space]:
    """The run's spaces as a vector's context holds them (section 11.1)."""
    return tuple(
        space_from_spec(V.from_view(context[k])) for k in ("observation_space", "action_space")
    )


def _admit(members: Membership, fragment: Fragment, context: dict) -> None:
    members.admit(
        fragment,
        "",
        run_id=context["run_id"],
        version=context["published_version"],
        spaces=_run_spaces(context),
        queued_rows=lambda key: 0,
        slot_cap=10**6,
        now=1.0,
        state_size=context["state_size"],
        agents_per_env=context["agents_per_env"],
    )


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_invalid_vector_is_rejected_with_its_reason(path):
    vector = load(path)
    frame = bytes.fromhex(vector["hex"])
    expected = SOCKET_TYPES[vector["socket"]]
    assert vector["counter"].endswith(vector["reason"])
    if vector["stage"] == "decode":
        with pytest.raises(ProtocolError) as info:
            if "topic" in vector:  # a per-policy publication (section 4.9)
                decode_policy_weights([bytes.fromhex(vector["topic"]), frame], len(frame))
            else:
                decode(frame, expected)
        assert info.value.reason == vector["reason"], str(info.value)
        return
    message = decode(frame, expected)  # caught later, not while decoding
    if vector["stage"] == "admit":
        members = _membership(vector["context"])
        with pytest.raises(FragmentRejected) as rejected:
            _admit(members, message, vector["context"])
        assert rejected.value.reason == vector["reason"], str(rejected.value)
        rec = members.get(vector["context"]["actor_id"])
        assert rec.next_seq == vector["context"]["next_seq"]  # a reject changes nothing
    elif vector["stage"] == "session":
        members = _membership(vector["context"])
        assert members.sender(ROUTING_ID, message.actor_id, message.token) is None
        assert vector["refuse"] == "reregister"
        # A heartbeat of another run is what a restart leaves in flight (section 5.6).
        other_run = message.run_id != vector["context"]["run_id"]
        assert vector["reason"] == ("other_run" if other_run else "unknown_actor")
    else:
        assert vector["stage"] == "hello"
        context = vector["context"]
        problem = check_hello(
            Membership(),
            ROUTING_ID,
            message,
            context["env_id"],
            *_run_spaces(context),
            agents_per_env=context["agents_per_env"],
        )
        assert problem is not None and problem[0] == vector["reason"], problem


def test_the_welcome_vector_is_a_network_an_actor_can_build_and_load():
    """Issue 29, item 14: the welcome's policy had ``hidden_sizes = []``, which section
    6.1 did not cover and zmq_rl refuses; it is now a real network (one hidden layer
    of 2) whose weights, and the broadcast's, load exactly by name."""
    from zmq_rl.rl.policy import check_weights, policy_from_welcome

    welcome = decode(bytes.fromhex(load(VECTORS / "welcome.json")["hex"]))
    policy = policy_from_welcome(welcome)
    assert welcome.settings.policy["hidden_sizes"] == [2]
    weights = decode(bytes.fromhex(load(VECTORS / "weights.json")["hex"]))
    check_weights(policy, weights.tensors)


def test_the_two_policy_welcome_vector_builds_and_loads_each_policy():
    """Section 4.9: each policy's network is built from its own config map and loads
    its own weights by name; the vector's shape is the one the page describes."""
    import dataclasses

    from zmq_rl.rl.policy import build_policy, check_weights, policy_config_from

    welcome = decode(bytes.fromhex(load(VECTORS / "welcome-policies.json")["hex"]))
    settings = welcome.settings
    assert settings.policy_map == ["first", "second"] and settings.agents_per_env == 2
    assert settings.policy_ids == [w.policy for w in welcome.policy_weights]
    assert welcome.weights.policy == "first" and settings.policy == settings.policies["first"]
    for pid, weights in zip(settings.policy_ids, welcome.policy_weights, strict=True):
        one = dataclasses.replace(settings, policy=settings.policies[pid])
        policy = build_policy(one.observation_space, one.action_space, policy_config_from(one))
        check_weights(policy, weights.tensors)
        assert weights.version == welcome.weights.version
    published = load(VECTORS / "weights-policy.json")
    assert bytes.fromhex(published["topic"]) == b"policy/second\0"


def test_an_actor_ignores_a_policy_key_it_does_not_know():
    """Section 4.4 (issue 45, G3): every one of the eight ``config.policy`` keys is
    required (the invalid vector ``welcome-policy-key-missing``), and other keys MAY
    appear: an actor builds the same network from the welcome vector's map with an
    unknown key added."""
    import dataclasses

    from zmq_rl.rl.policy import policy_config_from

    settings = decode(bytes.fromhex(load(VECTORS / "welcome.json")["hex"])).settings
    future = dataclasses.replace(settings, policy={**settings.policy, "from_v3": [1, 2]})
    assert policy_config_from(future) == policy_config_from(settings)


def test_the_policy_vectors_are_all_there_and_actor_vectors_count_as_the_actor_does():
    valid = {p.stem for p in VALID}
    assert {"hello-features", "welcome-policies", "weights-policy"} <= valid
    invalid = {p.stem: load(p) for p in INVALID}
    for name in (
        "welcome-policy_map-length",
        "welcome-policy_map-unknown-id",
        "welcome-policy-id-bad",
        "welcome-policy_weights-order",
        "weights-topic-mismatch",
    ):
        vector = invalid[name]
        assert vector["reason"] == "bad_field" and vector["refuse"] is None
        prefix = "weights" if vector["socket"] == "weights" else "control"
        assert vector["counter"] == f"{prefix}:bad_field"
    assert "topic" in invalid["weights-topic-mismatch"]


def test_a_hello_that_does_not_decode_is_answered_bad_hello():
    """Issue 29, item 14: the out-of-range hello vector is refused bad_hello (not
    ignored), and no other control vector that fails to decode gets that answer."""
    from zmq_rl.learner.membership import invalid_hello_refusal

    for path in INVALID:
        vector = load(path)
        if vector["socket"] != "control" or vector["stage"] != "decode":
            continue
        frame = bytes.fromhex(vector["hex"])
        with pytest.raises(ProtocolError) as info:
            decode(frame, SOCKET_TYPES["control"])
        refusal = invalid_hello_refusal(frame, info.value, 1 << 20)
        want = vector["refuse"] if vector["refuse"] == "bad_hello" else None
        assert (refusal.code if refusal else None) == want, path.name
    out_of_range = load(VECTORS / "invalid" / "hello-num_envs-out-of-range.json")
    assert out_of_range["refuse"] == "bad_hello" and out_of_range["reason"] == "bad_field"


def test_the_unmutated_base_of_the_admit_vectors_is_admitted():
    """Each admit vector differs from an accepted fragment only by its defect."""
    worked = load(VECTORS / "fragment-cartpole-worked.json")
    context = V.worked_context().to_json()
    members = _membership(context)
    fragment = decode(bytes.fromhex(worked["hex"]))
    _admit(members, fragment, context)
    assert members.get(0).next_seq == context["next_seq"] + 1


def test_missing_required_fragment_field_is_bad_field_for_every_field():
    """Finding 1 of issue 21: absent is bad_field, whatever the field's type."""
    frame = bytes.fromhex(load(VECTORS / "fragment-cartpole-worked.json")["hex"])
    for name in Fragment.REQUIRED:
        body = V.unpack(frame)
        body.pop(name)
        with pytest.raises(ProtocolError, match=f"fragment.{name}: missing") as info:
            decode(V.pack(body))
        assert info.value.reason == "bad_field"


def test_worked_example_is_real_cartpole_and_in_the_page():
    """Finding 2: final_obs is the env's successor of the truncated cell, and the page's
    section 10 is generated from the vector."""
    fragment = V.cartpole_fragment()
    env = gym.make("CartPole-v1")
    env.reset(seed=1)
    env.unwrapped.state = fragment.obs[1, 1].astype(np.float64)
    successor, *_ = env.step(int(fragment.actions[1, 1]))
    env.close()
    np.testing.assert_allclose(fragment.final_obs[0], successor, rtol=1e-6)
    assert fragment.final_obs_index.tolist() == [3] and fragment.truncated[1, 1]
    page = (ROOT / "docs" / "protocol.md").read_text()
    assert V.worked_example_markdown() in page


def test_generator_is_deterministic_and_matches_the_committed_files(tmp_path):
    valid, invalid = V.generate(tmp_path)
    assert (valid, invalid) == (len(VALID), len(INVALID))
    for path in [*VALID, *INVALID, VECTORS / "index.json"]:
        fresh = tmp_path / path.relative_to(VECTORS)
        assert fresh.read_bytes() == path.read_bytes(), path.name


def test_view_keeps_msgpack_types_apart():
    view = V.to_view({"i": 1, "f": 1.0, "b": b"\x01", "inf": float("inf")})
    assert view == {"i": 1, "f": {"$float": 1.0}, "b": {"$bin": "01"}, "inf": {"$float": "inf"}}
    assert V.pack(V.from_view(view)) == V.pack(
        {"i": 1, "f": 1.0, "b": b"\x01", "inf": float("inf")}
    )


def test_valid_vectors_name_the_socket_they_travel_to():
    """Issue 45 G6: a heartbeat's direction (token required from an actor, forbidden from
    the learner) is written in the vector, not inferred; every message vector decodes on
    its socket."""
    for path in VALID:
        vector = load(path)
        if vector["type"] == "space":
            assert "socket" not in vector
            continue
        message = decode(bytes.fromhex(vector["hex"]), SOCKET_TYPES[vector["socket"]])
        if isinstance(message, Heartbeat):
            from_learner = vector["socket"] == "actor-control"
            assert (message.actor_id == -1) == from_learner
            assert (message.token is None) == from_learner, path.name


def test_the_rejoin_hello_vector_is_a_rejoin_as_section_4_3_says():
    """Issue 45 N2: registering again keeps the previous welcome's num_envs (never 0) and
    sends the spaces it acts on explicitly."""
    hello = decode(bytes.fromhex(load(VECTORS / "hello-rejoin.json")["hex"]))
    assert hello.rejoin_run_id and hello.actor_id >= 0
    assert hello.num_envs > 0 and hello.observation_space and hello.action_space
    assert (
        check_hello(
            Membership(),
            ROUTING_ID,
            hello,
            "CartPole-v1",
            *_run_spaces(V.worked_context().to_json()),
        )
        is None
    )


def test_every_welcome_vector_carries_every_network_key():
    """Issue 45 N3 / G3: every key of config.policy is required (section 4.4); the
    vectors carry policy_type, and a welcome without it is invalid."""
    from zmq_rl.wire.protocol import POLICY_KEYS

    for path in VALID:
        vector = load(path)
        if vector["type"] != "welcome":
            continue
        config = V.from_view(vector["view"])["config"]
        for policy in (config["policy"], *config.get("policies", {}).values()):
            assert set(POLICY_KEYS) <= set(policy), path.name
    missing = load(VECTORS / "invalid" / "welcome-policy-key-missing.json")
    assert "policy_type" in missing["description"] and missing["reason"] == "bad_field"


def test_admit_contexts_hold_the_spaces_they_are_checked_against():
    """Issue 45 N4 / C2: an admit vector's context lists every field section 11.1 names,
    the run's spaces among them."""
    keys = {
        "run_id",
        "published_version",
        "actor_id",
        "token",
        "num_envs",
        "next_seq",
        "state_size",
        "observation_space",
        "action_space",
        "agents_per_env",
    }
    admits = [load(p) for p in INVALID if load(p)["stage"] == "admit"]
    assert {v["reason"] for v in admits} >= {"masked_action", "bad_valid"}
    for vector in admits:
        assert set(vector["context"]) == keys, vector["name"]
        _run_spaces(vector["context"])  # the specs decode


def test_the_grant_vectors_say_what_section_5_4_1_says():
    """Issue 43: an actor announces ``grants``; a learner of rows batches welcomes it with
    a grant (and says how many rows an update takes, ``config.batch_rows``) and raises it
    in its heartbeats; an actor's heartbeat never carries one, nor a welcome a negative
    one. Vectors of earlier releases keep their bytes: ``batch_rows`` and ``grant`` are
    absent unless they say something."""
    hello = decode(bytes.fromhex(load(VECTORS / "hello-grants.json")["hex"]))
    assert hello.features == ["grants"]
    welcome = decode(bytes.fromhex(load(VECTORS / "welcome-grant.json")["hex"]))
    assert (welcome.grant, welcome.settings.batch_rows) == (V.GRANT, 128)
    beat = decode(bytes.fromhex(load(VECTORS / "heartbeat-learner-grant.json")["hex"]))
    assert (beat.actor_id, beat.grant, beat.token) == (-1, 544, None)
    plain = load(VECTORS / "welcome.json")["view"]
    assert "grant" not in plain and "batch_rows" not in plain["config"]
    invalid = {p.stem: load(p) for p in INVALID}
    assert invalid["heartbeat-actor-grant"]["socket"] == "control"
    for name in ("welcome-grant-negative", "welcome-batch_rows-zero"):
        assert invalid[name]["counter"] == "control:bad_field", name
