"""Hostile peers seen from an actor: what its SUB (weights) and DEALER (control) receive.

A fake learner (:class:`FakeLearner`: ROUTER, PULL and XPUB bound by the test) welcomes
a real GymActor, then sends it whatever a test wants:

* **Fuzz** (:func:`test_fuzz_actor_sub_and_dealer`): malformed weights on PUB and
  malformed control on ROUTER; the actor counts each in ``ActorClient.rejects``,
  survives, loads the valid weights that follow and exits cleanly on Shutdown.
* Weights that decode but do not fit the policy are rejected, not fatal; good weights
  read in the same go with them are adopted (one policy, several policies), and
  weights naming a policy in a run of one are refused.
* A learner of a newer protocol refuses the hello: the actor stops at once, told both
  versions.

Figures are printed; run with ``-s`` to see them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch
import zmq

from tests.helpers import (
    ACT_SPACE,
    OBS_SPACE,
    STUB_ENV_ID,
    STUB_POLICY,
    TIMEOUT,
    CheckedBackground,
    FakeLearnerSockets,
    Fuzzer,
    SlotRows,
    body_of,
    cartpole_fragment,
    gym_actor,
    pack,
    slot_rows,
    stub_client,
    total,
    wait_until,
)
from zmq_rl.actor import agent as agent_module
from zmq_rl.actor.client import ActorClient, LearnerRefused
from zmq_rl.rl.policy import ActorCritic, build_policy, export_weights
from zmq_rl.wire.protocol import (
    PROTOCOL_VERSION,
    Bye,
    Fragment,
    Heartbeat,
    Hello,
    Message,
    ProtocolError,
    Refuse,
    RunSettings,
    Shutdown,
    Weights,
    Welcome,
    decode,
    encode,
    encode_array,
    policy_weights_frames,
    space_spec,
)

torch.set_num_threads(1)

FAKE_RUN = "fake-run"


def stub_policy(seed: int):
    torch.manual_seed(seed)
    return build_policy(OBS_SPACE, ACT_SPACE, STUB_POLICY)


def stub_weights(policy, version: int, run_id: str = FAKE_RUN) -> Weights:
    return Weights(version=version, run_id=run_id, tensors=export_weights(policy))


class FakeLearner(FakeLearnerSockets):
    """ROUTER on port, PULL on +1, XPUB (a PUB that reports subscriptions) on +2: just
    enough of a learner to welcome a real actor, then send it whatever a test wants."""

    def __init__(self, ctx: zmq.Context, port: int) -> None:
        super().__init__(ctx, port)
        self.fragments: list[SlotRows] = []

    def recv_control(self, kind: type[Message], timeout: float = TIMEOUT) -> tuple[bytes, Any]:
        """The next control message of type ``kind`` (heartbeats are skipped)."""
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            self.drain_fragments()
            if self.router.poll(min(50, int(remaining * 1000) + 1)):
                routing_id, frame = self.router.recv_multipart()
                message = decode(frame)
                if isinstance(message, kind):
                    return routing_id, message
        pytest.fail(f"no {kind.__name__} on the control socket within {timeout}s")

    def drain_fragments(self) -> None:
        while self.pull.poll(0):
            message = decode(self.pull.recv(), (Fragment,))
            assert isinstance(message, Fragment) and message.num_slots == 1
            self.fragments.append(slot_rows(message))

    def welcome(
        self, routing_id: bytes, weights: Weights, policy_weights: list[Weights] | None = None
    ) -> None:
        """Welcome the actor with ``weights`` (several policies: ``policy_weights``,
        one per agent index, each a ``STUB_POLICY``; ``weights`` is the first)."""
        policy = dataclasses.asdict(STUB_POLICY)
        policy["hidden_sizes"] = list(STUB_POLICY.hidden_sizes)
        ids = [w.policy for w in policy_weights or []]
        several = {"agents_per_env": len(ids), "policy_map": ids} if ids else {}
        config = {
            "env_id": STUB_ENV_ID,
            "observation_space": space_spec(OBS_SPACE),
            "action_space": space_spec(ACT_SPACE),
            "policy": policy,
            "num_steps": 16,
            "broadcast_every": 1,
            "steps_per_broadcast": 16,
            "max_lead_steps": 16,
            "fragment_length": 8,
            "seed": 0,
            "heartbeat_interval": 1.0,
            "state_size": 0,
            "max_weights_bytes": 1 << 20,
            "max_fragment_bytes": 1 << 20,
            "num_envs": len(ids) or 1,
            **several,
        }
        if ids:
            config["policies"] = {pid: policy for pid in ids}
        self.router.send_multipart(
            [
                routing_id,
                encode(
                    Welcome(
                        actor_id=0,
                        token=bytes(16),
                        run_id=FAKE_RUN,
                        base_version=0,
                        experience_port=self.port + 1,
                        weights_port=self.port + 2,
                        settings=RunSettings.from_map(config),
                        weights=weights,
                        policy_weights=policy_weights or [],
                    )
                ),
            ]
        )

    def wait_subscription(self, timeout: float = TIMEOUT) -> None:
        """Wait for a subscription (skipping the unsubscription of a closed SUB)."""
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            if self.pub.poll(int(remaining * 1000) + 1) and self.pub.recv() == b"\x01":
                return
        pytest.fail(f"the actor's SUB did not subscribe within {timeout}s")

    def close(self) -> None:
        for sock in (self.router, self.pull, self.pub):
            sock.close(linger=0)


class RecordingClient(ActorClient):
    """The GymActor's ActorClient, kept where the test can read its ``rejects``."""

    instances: list[ActorClient] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        RecordingClient.instances.append(self)


@pytest.fixture
def recorded_clients(monkeypatch) -> list[ActorClient]:
    RecordingClient.instances = []
    monkeypatch.setattr(agent_module, "ActorClient", RecordingClient)  # GymActor's Agent
    return RecordingClient.instances


class WelcomedActor(NamedTuple):
    """A real GymActor in a thread, welcomed by ``fake`` (see :func:`welcomed_actor`)."""

    fake: FakeLearner
    actor: CheckedBackground
    routing_id: bytes  # the actor's DEALER, as the fake learner's ROUTER knows it
    client: ActorClient  # the actor's ActorClient (its ``rejects``, ``version``)
    policy_v0: ActorCritic  # the policy whose weights (version 0) the welcome carried
    policy_next: ActorCritic  # another policy, for the weights a test sends next


@pytest.fixture
def welcomed_actor(ctx, learner_port, recorded_clients) -> Iterator[WelcomedActor]:
    """A fake learner at ``learner_port`` and a real GymActor (stub env) in a thread: the
    actor said hello, was welcomed with the weights of ``stub_policy(1)`` at version 0 and
    subscribed to weights. The fake learner is closed after the test."""
    fake = FakeLearner(ctx, learner_port)
    policy_v0, policy_next = stub_policy(1), stub_policy(2)
    try:
        actor = gym_actor(ctx, learner_port, learner_timeout=TIMEOUT)
        routing_id, _ = fake.recv_control(Hello)
        fake.welcome(routing_id, stub_weights(policy_v0, 0))
        fake.wait_subscription()
        wait_until(lambda: bool(recorded_clients), TIMEOUT, "the actor's client")
        yield WelcomedActor(fake, actor, routing_id, recorded_clients[0], policy_v0, policy_next)
    finally:
        fake.close()


class WeightsFuzzer(Fuzzer):
    """Malformed frames for an actor's SUB socket (the learner's PUB)."""

    NOT_MAPS = (1, "weights", [1, 2], None, 2.5, b"\x00")

    def __init__(self, seed: int, policy) -> None:
        super().__init__(seed)
        self.policy = policy

    def body(self) -> dict[str, Any]:
        return body_of(stub_weights(self.policy, version=10**6))

    def truncated(self) -> list[bytes]:
        return self.cut(encode(stub_weights(self.policy, 10**6)))

    def wrong_type(self) -> list[bytes]:
        body = self.body()
        name, value = self.r.choice(
            [
                ("version", "1"),
                ("version", -1),
                ("version", None),
                ("run_id", 5),
                ("run_id", None),
                ("tensors", "x"),
                ("tensors", []),
                ("tensors", [["a"]]),
                ("tensors", [[5, encode_array(np.zeros(1, np.float32))]]),
                ("tensors", [["a", "not an array"]]),
                ("extras", [1]),
                ("extras", {"a": 5}),
            ]
        )
        body[name] = value
        return [pack(body)]

    def bad_dtype_or_shape(self) -> list[bytes]:
        body = self.body()
        entry = self.r.choice(body["tensors"])[1]
        if self.r.random() < 0.5:
            entry["dtype"] = self.r.choice(["float16", "object", "complex64", "<f4", 3])
        else:
            entry["shape"] = self.r.choice([[-1], [1] * 9, "8", [1.0], None])
        return [pack(body)]

    def size_mismatch(self) -> list[bytes]:
        body = self.body()
        entry = self.r.choice(body["tensors"])[1]
        entry["data"] = entry["data"][:-4] if self.r.random() < 0.5 else entry["data"] + b"\0" * 4
        return [pack(body)]

    def not_finite(self) -> list[bytes]:
        weights = stub_weights(self.policy, 10**6)
        k = self.r.randrange(len(weights.tensors))
        name, array = weights.tensors[k]
        array = array.copy()
        array.reshape(-1)[self.r.randrange(array.size)] = self.r.choice([math.nan, math.inf])
        if self.r.random() < 0.3:
            weights.extras = {"obs_mean": np.array([math.nan, 0.0], np.float32)}
        else:
            weights.tensors[k] = (name, array)
        return [encode(weights)]

    def duplicate_names(self) -> list[bytes]:
        body = self.body()
        body["tensors"].append(list(body["tensors"][0]))
        return [pack(body)]

    def huge_length(self) -> list[bytes]:
        if self.r.random() < 0.5:
            return super().huge_length()
        body = self.body()
        self.r.choice(body["tensors"])[1]["shape"] = [2**40]
        return [pack(body)]

    def unknown_type(self) -> list[bytes]:
        return self.set_one(self.body(), "type", ["weightz", "", None, 1, ["weights"]])

    def unexpected_type(self) -> list[bytes]:
        return self.one_of(
            [
                cartpole_fragment(self.rng, FAKE_RUN),
                Heartbeat(actor_id=-1, run_id=FAKE_RUN, version=10**6),
                Shutdown(reason="forged on PUB", run_id=FAKE_RUN),
                Refuse(code="reregister", reason="forged on PUB"),
            ]
        )

    def wrong_version(self) -> list[bytes]:
        return self.set_one(self.body(), "proto", [1, 3, 0, "2", None, 2.0, True])

    def multipart(self) -> list[bytes]:
        return self.several([self.random_bytes, self.wrong_version, self.truncated], 2, 3)

    CLASSES = (
        "random_bytes",
        "truncated",
        "not_a_map",
        "wrong_type",
        "bad_dtype_or_shape",
        "size_mismatch",
        "not_finite",
        "duplicate_names",
        "huge_length",
        "unknown_type",
        "unexpected_type",
        "wrong_version",
        "multipart",
    )

    def check(self, name: str, parts: list[bytes]) -> None:
        for part in parts:
            with pytest.raises(ProtocolError):
                decode(part, (Weights,))


class ActorControlFuzzer(Fuzzer):
    """Malformed frames for an actor's DEALER socket (the learner's ROUTER). An actor
    decodes each part of a multipart message on its own."""

    NOT_MAPS = (0, "shutdown", [1], None, 1.5, b"\x01")

    def __init__(self, seed: int, policy) -> None:
        super().__init__(seed)
        self.policy = policy

    def truncated(self) -> list[bytes]:
        return self.cut(encode(Shutdown(reason="truncated shutdown", run_id=FAKE_RUN)))

    def wrong_type(self) -> list[bytes]:
        kind, name, value = self.r.choice(
            [
                (Shutdown(reason="x", run_id=FAKE_RUN), "reason", 5),
                (Shutdown(reason="x", run_id=FAKE_RUN), "run_id", ["r"]),
                (Shutdown(reason="x", run_id=FAKE_RUN), "reason", "r" * 5000),
                (Heartbeat(actor_id=-1, run_id=FAKE_RUN), "actor_id", "-1"),
                (Heartbeat(actor_id=-1, run_id=FAKE_RUN), "version", -5),
                (Refuse(code="reregister", reason="x"), "code", None),
                (Bye(actor_id=0, stats={}), "stats", {"a": math.nan}),
            ]
        )
        body = body_of(kind)
        body[name] = value
        return [pack(body)]

    def unknown_type(self) -> list[bytes]:
        body = body_of(Shutdown(reason="x", run_id=FAKE_RUN))
        return self.set_one(body, "type", ["shutdown!", "", None, 2])

    def unexpected_type(self) -> list[bytes]:
        """Valid messages an actor has no business receiving on control."""
        return self.one_of(
            [
                cartpole_fragment(self.rng, FAKE_RUN),
                stub_weights(self.policy, 10**6),
                Hello(
                    actor_id=0,
                    env_id="x",
                    observation_space={},
                    action_space={},
                    num_envs=1,
                ),
                Bye(actor_id=0, stats={}),
                Refuse(code="auth_failed", reason="a refusal after the welcome"),
            ]
        )

    def wrong_version(self) -> list[bytes]:
        body = body_of(Shutdown(reason="from the future", run_id=FAKE_RUN))
        return self.set_one(body, "proto", [1, 3, 0, "2", None, 2.0])

    def multi_frame(self) -> list[bytes]:
        return self.several([self.random_bytes, self.wrong_version, self.not_a_map], 2, 4)

    CLASSES = (
        "random_bytes",
        "truncated",
        "not_a_map",
        "wrong_type",
        "huge_length",
        "unknown_type",
        "unexpected_type",
        "wrong_version",
        "multi_frame",
    )


ACTOR_FUZZ_SUB = 1_500
ACTOR_FUZZ_DEALER = 1_500


def test_fuzz_actor_sub_and_dealer(welcomed_actor):
    """A real GymActor (stub env) under a fake learner that sends it ACTOR_FUZZ_SUB
    malformed weights on PUB and ACTOR_FUZZ_DEALER malformed control messages on ROUTER,
    then a forged-stale weights message, then valid weights, then Shutdown.

    PUB/SUB drops at its HWM (4), so weights garbage goes 4 at a time and the test waits
    (bounded) until the actor has counted them. The actor must count every frame once
    in ``client.rejects`` (``weights:*`` / ``control:*``), stay alive, re-register after
    weights of another run, act with the valid weights that follow (its fragments carry
    their version and their values), and exit cleanly with a bye on Shutdown.
    """
    fake, actor, routing_id, client, policy_v0, policy_v1 = welcomed_actor

    tried = {"sub": Counter(), "dealer": Counter()}
    sub_frames = dealer_frames = 0
    weights_fuzz = WeightsFuzzer(3, policy_v1)
    for i in range(0, ACTOR_FUZZ_SUB, 4):  # PUB/SUB HWM: a few at a time
        batch = [weights_fuzz.generate(k) for k in range(i, min(i + 4, ACTOR_FUZZ_SUB))]
        for name, parts in batch:
            fake.pub.send_multipart(parts)
            tried["sub"][name] += 1
            sub_frames += len(parts)
        wait_until(
            lambda n=sub_frames: total(client.rejects, "weights:") >= n,
            TIMEOUT,
            "the actor to count the weights garbage",
        )
        assert actor.alive()
    control_fuzz = ActorControlFuzzer(4, policy_v1)
    for i in range(0, ACTOR_FUZZ_DEALER, 100):
        for k in range(i, min(i + 100, ACTOR_FUZZ_DEALER)):
            name, parts = control_fuzz.generate(k)
            fake.router.send_multipart([routing_id, *parts])
            tried["dealer"][name] += 1
            dealer_frames += len(parts)
        wait_until(
            lambda n=dealer_frames: total(client.rejects, "control:") >= n,
            TIMEOUT,
            "the actor to count the control garbage",
        )
        assert actor.alive()
    # A forged or stale shutdown (another run) is ignored, not obeyed.
    fake.router.send_multipart([routing_id, encode(Shutdown("forged", run_id="other"))])

    # Weights of another run: counted, and the actor registers again.
    fake.pub.send(encode(stub_weights(policy_v1, 99, run_id="stale-run")))
    routing_id, rehello = fake.recv_control(Hello)
    assert rehello.rejoin_run_id == FAKE_RUN
    assert client.rejects["weights:other_run"] == 1
    fake.welcome(routing_id, stub_weights(policy_v0, 0))
    fake.wait_subscription()

    # Valid weights: loaded; the actor acts with them.
    fake.pub.send(encode(stub_weights(policy_v1, 1)))

    def acted_with_v1() -> bool:
        fake.drain_fragments()
        return any(f.version == 1 for f in fake.fragments)

    wait_until(acted_with_v1, TIMEOUT, "a fragment acted with version 1")
    fragment = next(f for f in fake.fragments if f.version == 1)
    with torch.no_grad():
        log_probs, _, values = policy_v1.evaluate_actions(
            torch.from_numpy(np.array(fragment.obs)),
            torch.from_numpy(np.array(fragment.actions)),
        )
    np.testing.assert_allclose(fragment.values, values.numpy(), atol=1e-5)
    np.testing.assert_allclose(fragment.log_probs, log_probs.numpy(), atol=1e-5)

    fake.router.send_multipart([routing_id, encode(Shutdown("done", run_id=FAKE_RUN))])
    _, bye = fake.recv_control(Bye)
    stats = actor.join()

    rejects = dict(client.rejects)
    print(
        f"\nactor fuzz: {sum(tried['sub'].values())} messages ({sub_frames} frames) on SUB, "
        f"{sum(tried['dealer'].values())} messages ({dealer_frames} frames) on DEALER"
    )
    print("fuzz classes SUB:", dict(tried["sub"]))
    print("fuzz classes DEALER:", dict(tried["dealer"]))
    print("actor rejects:", json.dumps(dict(sorted(rejects.items()))))
    assert set(tried["sub"]) == set(WeightsFuzzer.CLASSES)
    assert set(tried["dealer"]) == set(ActorControlFuzzer.CLASSES)
    assert total(rejects, "weights:") == sub_frames + 1  # + the weights of another run
    assert total(rejects, "control:") == dealer_frames
    for reason in (
        "not_msgpack",
        "not_a_map",
        "bad_field",
        "bad_dtype",
        "bad_shape",
        "size_mismatch",
        "not_finite",
        "unknown_type",
        "unexpected_type",
        "version_mismatch",
    ):
        assert rejects.get(f"weights:{reason}", 0) > 0, reason
    for reason in (
        "not_msgpack",
        "not_a_map",
        "bad_field",
        "bad_value",
        "unknown_type",
        "unexpected_type",
        "version_mismatch",
    ):
        assert rejects.get(f"control:{reason}", 0) > 0, reason
    assert client.registrations == 2
    assert stats["policy_updates_received"] == 1 and stats["last_policy_version"] == 1
    assert bye.stats["steps_sent"] == stats["steps_sent"] > 0


def forged_weights(policy, version: int) -> list[Weights]:
    """Weights that decode fine but do not fit ``policy``: renamed, reshaped, retyped,
    missing and extra tensors, and a ``[1]`` tensor sent as a scalar ``[]``."""
    tensors = export_weights(policy)
    name0, array0 = tensors[0]
    return [
        Weights(version, FAKE_RUN, [("evil." + name0, array0), *tensors[1:]]),
        Weights(version, FAKE_RUN, [(name0, np.zeros((3, 3), np.float32)), *tensors[1:]]),
        Weights(version, FAKE_RUN, [(name0, array0.astype(np.float64)), *tensors[1:]]),
        Weights(version, FAKE_RUN, tensors[1:]),
        Weights(version, FAKE_RUN, [*tensors, ("extra", np.zeros(1, np.float32))]),
        Weights(
            version, FAKE_RUN, [(n, a.reshape(()) if a.shape == (1,) else a) for n, a in tensors]
        ),
    ]


@pytest.mark.parametrize("case", range(6))
def test_forged_weights_with_wrong_tensors_are_rejected_not_fatal(welcomed_actor, case):
    """Weights whose names/shapes/dtypes do not fit the policy (but decode) are counted
    as ``weights:wrong_tensors`` and skipped: the actor keeps its current version (it
    does not tag fragments with a version it could not load), then loads the valid
    weights that follow (the forged version is huge, so "newest wins" must not let it
    block them) and exits on Shutdown."""
    fake, actor, routing_id, client, _, policy_v2 = welcomed_actor
    fake.pub.send(encode(forged_weights(policy_v2, 10**9)[case]))
    wait_until(
        lambda: total(client.rejects, "weights:") >= 1 or not actor.alive(),
        10.0,
        "the forged weights to be rejected (or the actor to die)",
    )
    assert actor.alive(), f"the actor died: {actor.error!r}"
    assert client.version == 0, "the client adopted the version of unusable weights"
    fake.pub.send(encode(stub_weights(policy_v2, 2)))
    wait_until(lambda: client.version == 2 or not actor.alive(), 10.0, "version 2")
    fake.router.send_multipart([routing_id, encode(Shutdown("done", run_id=FAKE_RUN))])
    fake.recv_control(Bye, timeout=10.0)
    stats = actor.join(10.0)
    assert client.rejects["weights:wrong_tensors"] == 1
    assert stats["last_policy_version"] == 2 and stats["policy_updates_received"] == 1


def test_refused_welcome_at_a_huge_version_moves_nothing(welcomed_actor, caplog):
    """Issue 29, item 6: a learner makes the actor register again and welcomes it
    into the same run with a scalar ``[]`` for the ``[1]`` tensor ``value_head.bias``
    at version 10**12. The weights are refused and logged naming the tensor and both
    shapes; neither the actor's version nor the version it believes the learner has
    moves (before: the latter stuck at 10**12, so the actor re-subscribed every five
    intervals and lost later broadcasts); every later legitimate broadcast loads."""
    fake, actor, routing_id, client, _, policy_next = welcomed_actor
    fake.router.send_multipart([routing_id, encode(Refuse("reregister", "forgot you"))])
    routing_id, _ = fake.recv_control(Hello)
    fake.welcome(routing_id, forged_weights(policy_next, 10**12)[5])
    fake.wait_subscription()
    wait_until(
        lambda: client.rejects["weights:wrong_tensors"] >= 1 or not actor.alive(),
        TIMEOUT,
        "the welcome's weights to be refused",
    )
    assert actor.alive(), f"the actor died: {actor.error!r}"
    assert client.version == 0 and client.learner_version < 10**12
    assert any(
        "value_head.bias" in r.getMessage() and "(1,)" in r.getMessage() and "()" in r.getMessage()
        for r in caplog.records
    ), [r.getMessage() for r in caplog.records]
    for version in (2, 3):
        fake.pub.send(encode(stub_weights(policy_next, version)))
        wait_until(lambda v=version: client.version == v or not actor.alive(), 10.0, f"v{version}")
    fake.router.send_multipart([routing_id, encode(Shutdown("done", run_id=FAKE_RUN))])
    _, bye = fake.recv_control(Bye, timeout=10.0)
    stats = actor.join(10.0)
    assert stats["last_policy_version"] == 3 and client.rejects["weights:wrong_tensors"] == 1
    assert client.rejects["weights:behind"] == 0
    fake.drain_fragments()
    assert all(f.version < 10**12 for f in fake.fragments)


def test_actor_facing_a_newer_learner_is_told_both_versions(ctx, learner_port):
    """A learner of protocol 2 answers the hello with a refusal in protocol 2: the
    actor stops at once (not after register_timeout) with
    LearnerRefused(version_mismatch) naming both versions."""
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(f"tcp://127.0.0.1:{learner_port}")
    client = stub_client(ctx, learner_port, register_timeout=2.0)
    try:
        attempt = CheckedBackground(client.register)
        assert router.poll(5000), "no hello"
        routing_id, _ = router.recv_multipart()
        body = body_of(Refuse("version_mismatch", "peer speaks 2, we speak 3"))
        body["proto"] = 3
        router.send_multipart([routing_id, pack(body)])
        start = time.monotonic()
        attempt.thread.join(5.0)
        elapsed = time.monotonic() - start
        assert isinstance(attempt.error, LearnerRefused), repr(attempt.error)
        assert attempt.error.code == "version_mismatch" and elapsed < 1.5
        assert "2" in str(attempt.error) and str(PROTOCOL_VERSION) in str(attempt.error)
        print(f"\nnewer learner: refused in {elapsed * 1000:.0f} ms: {attempt.error}")
    finally:
        client.close()
        router.close()


def test_welcome_with_other_slots_than_asked_is_invalid(ctx, learner_port):
    """docs/protocol.md section 4.3 (issue 29, item 14): a welcome whose num_envs (1)
    differs from the non-zero num_envs of the hello (2) is invalid, counted as
    ``control:bad_field`` and not accepted: the client does not change its slots."""
    from zmq_rl.actor.client import LearnerUnreachable

    fake = FakeLearner(ctx, learner_port)
    client = ActorClient(
        f"127.0.0.1:{learner_port}",
        env_id=STUB_ENV_ID,
        observation_space=OBS_SPACE,
        action_space=ACT_SPACE,
        num_envs=2,
        context=ctx,
        register_timeout=3.0,
    )
    try:
        attempt = CheckedBackground(client.register)
        routing_id, hello = fake.recv_control(Hello)
        assert hello.num_envs == 2
        fake.welcome(routing_id, stub_weights(stub_policy(1), 0))  # num_envs 1
        attempt.thread.join(TIMEOUT)
        assert isinstance(attempt.error, LearnerUnreachable), repr(attempt.error)
        assert client.rejects["control:bad_field"] == 1
        assert client.num_envs == 2 and client.welcome is None
    finally:
        client.close()
        fake.close()


# -- good weights read in one go with forged ones ----------------------------------------


def welcomed_client(
    ctx: zmq.Context, fake: FakeLearner, port: int, policy_ids: tuple[str, ...] = ()
) -> ActorClient:
    """An ActorClient on the stub env (one slot per policy), welcomed by ``fake`` at
    version 1 with the weights of ``stub_policy(1)`` (each policy's, with
    ``policy_ids``), its weights read from an inproc XPUB (:func:`queue_weights`)."""
    client = ActorClient(
        f"127.0.0.1:{port}",
        env_id=STUB_ENV_ID,
        observation_space=OBS_SPACE,
        action_space=ACT_SPACE,
        num_envs=len(policy_ids) or 1,
        context=ctx,
        register_timeout=TIMEOUT,
        features=["policies"] if policy_ids else [],
    )
    registering = CheckedBackground(client.register)
    routing_id, _ = fake.recv_control(Hello)
    weights = [dataclasses.replace(stub_weights(stub_policy(1), 1), policy=p) for p in policy_ids]
    fake.welcome(routing_id, weights[0] if weights else stub_weights(stub_policy(1), 1), weights)
    registering.join()
    return client


def queue_weights(ctx: zmq.Context, client: ActorClient, topics: int) -> zmq.Socket:
    """An XPUB on inproc whose weights ``client`` reads from now on (through a SUB made
    and subscribed as the client makes its own): what the test publishes there is
    queued for the SUB at once, so the next ``poll`` reads it all in one go."""
    endpoint = f"inproc://weights-{id(client)}"
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(endpoint)
    client.subscriber.start(client._weights_socket(endpoint))
    for _ in range(topics):
        assert pub.poll(int(TIMEOUT * 1000)), "the client's SUB did not subscribe"
        assert pub.recv()[:1] == b"\x01"
    return pub


def checking(policy) -> Any:
    """A ``weights_check`` against ``policy``'s network."""
    from zmq_rl.rl.policy import check_weights

    return lambda weights: check_weights(policy, weights.tensors)


@pytest.mark.parametrize("forged_last", [True, False], ids=["good-then-forged", "forged-then-good"])
def test_good_weights_read_with_forged_ones_are_adopted(ctx, learner_port, forged_last):
    """docs/protocol.md sections 4.2 and 5.3: "newest wins" among the weights that fit.
    A good version 2 and a forged version 10**12 (a scalar for a ``[1]`` tensor) read in
    one go: the forged ones are refused (``weights:wrong_tensors``, once) and version 2
    is adopted, whichever came last (before: the last to arrive was the only one
    looked at, so good-then-forged lost version 2)."""
    fake = FakeLearner(ctx, learner_port)
    policy = stub_policy(1)
    client = welcomed_client(ctx, fake, learner_port)
    client.weights_check = checking(policy)
    try:
        pub = queue_weights(ctx, client, 1)
        queued = [stub_weights(stub_policy(2), 2), forged_weights(policy, 10**12)[5]]
        for weights in queued if forged_last else queued[::-1]:
            pub.send(encode(weights))
        adopted = client.poll()
        assert adopted is not None and adopted.version == 2, adopted
        assert client.version == 2 and client.stats["last_policy_version"] == 2
        assert client.rejects["weights:wrong_tensors"] == (1 if forged_last else 0)
        assert client.poll() is None and client.version == 2
    finally:
        client.close()
        fake.close()


def test_good_weights_of_each_policy_read_with_forged_ones_are_adopted(ctx, learner_port):
    """Several policies ("newest wins" per policy, docs/protocol.md section 4.9): each
    policy's good version 2 is read in one go with a forged version 10**12 of the same
    policy (red: forged first, blue: forged last). Both forged ones are refused and
    move no version; both policies adopt version 2 (before: the newest version of each
    policy was the only one looked at, so both lost version 2)."""
    fake = FakeLearner(ctx, learner_port)
    policy = stub_policy(1)
    client = welcomed_client(ctx, fake, learner_port, ("red", "blue"))
    client.weights_check = checking(policy)
    try:
        assert client.policies.versions == {"red": 1, "blue": 1}
        pub = queue_weights(ctx, client, 2)
        good = stub_weights(stub_policy(2), 2)
        forged = forged_weights(policy, 10**12)[5]
        for weights, pid in [(forged, "red"), (good, "red"), (good, "blue"), (forged, "blue")]:
            pub.send_multipart(policy_weights_frames(dataclasses.replace(weights, policy=pid)))
        first = client.poll()
        assert client.weights_ready()
        second = client.poll()
        assert [(w.policy, w.version) for w in (first, second)] == [("red", 2), ("blue", 2)]
        assert client.policies.versions == {"red": 2, "blue": 2}
        assert client.version == 2 and client.rejects["weights:wrong_tensors"] == 2
    finally:
        client.close()
        fake.close()


def test_weights_naming_a_policy_in_a_run_of_one_are_refused(ctx, learner_port, caplog):
    """docs/protocol.md section 4.2: ``weights.policy`` MUST be absent in a run of one
    policy. Such weights, read with a good version 2, are refused as
    ``weights:bad_field`` with a log line naming the policy and the version, and move
    nothing; version 2 is adopted (before: they skipped the tensor check of the Agent,
    whose networks are not by policy in such a run, and were adopted)."""
    fake = FakeLearner(ctx, learner_port)
    client = welcomed_client(ctx, fake, learner_port)
    client.weights_check = checking(stub_policy(1))
    try:
        pub = queue_weights(ctx, client, 1)
        pub.send(encode(stub_weights(stub_policy(2), 2)))
        pub.send(encode(dataclasses.replace(stub_weights(stub_policy(2), 3), policy="red")))
        adopted = client.poll()
        assert adopted is not None and adopted.version == 2 and client.version == 2
        assert client.rejects["weights:bad_field"] == 1
        assert any(
            "weights version 3 of policy 'red'" in r.getMessage() and "bad_field" in r.getMessage()
            for r in caplog.records
        ), [r.getMessage() for r in caplog.records]
    finally:
        client.close()
        fake.close()


def test_weights_rejected_after_adoption_move_their_policy_back(ctx, learner_port, caplog):
    """A client without ``weights_check`` adopts both policies' version 2; the caller
    cannot load blue's and calls ``reject_weights``: blue goes back to version 1 (before:
    it stayed at 2, so the same version sent again was never adopted), so does the
    client's version (the oldest policy's), and the log line names the version and the
    policy. Blue's version 2, published again, is adopted."""
    fake = FakeLearner(ctx, learner_port)
    client = welcomed_client(ctx, fake, learner_port, ("red", "blue"))
    try:
        pub = queue_weights(ctx, client, 2)
        good = stub_weights(stub_policy(2), 2)
        for pid in ("red", "blue"):
            pub.send_multipart(policy_weights_frames(dataclasses.replace(good, policy=pid)))
        red, blue = client.poll(), client.poll()
        assert (red.policy, blue.policy, client.version) == ("red", "blue", 2)
        client.reject_weights(blue, ValueError("does not fit"))
        assert client.policies.versions == {"red": 2, "blue": 1}
        assert client.version == 1 and client.stats["last_policy_version"] == 1
        assert client.rejects["weights:wrong_tensors"] == 1
        assert any(
            "weights version 2 of policy 'blue': does not fit" in r.getMessage()
            for r in caplog.records
        ), [r.getMessage() for r in caplog.records]
        pub.send_multipart(policy_weights_frames(dataclasses.replace(good, policy="blue")))
        again = client.poll()
        assert again is not None and (again.policy, again.version) == ("blue", 2)
        assert client.policies.versions == {"red": 2, "blue": 2} and client.version == 2
    finally:
        client.close()
        fake.close()
