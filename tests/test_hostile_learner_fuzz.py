"""Hostile peers on both learner sockets at once: a fuzz of PULL and ROUTER during training.

:func:`test_fuzz_learner_pull_and_router_during_training`: a real learner trains
CartPole-v1 with two real GymActors while raw PUSH and DEALER peers send it >= 10,000
malformed messages of every class (:class:`ExperienceFuzzer`, :class:`ControlFuzzer`).
Every one is counted exactly once under ``rejected/*``, the good actors lose nothing, and
the policy learns as well as without the fuzz. (One run for both sockets, so this test
has its own file; the other tests of each socket are in ``test_hostile_experience.py``
and ``test_hostile_control.py``.) Figures are printed; run with ``-s`` to see them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections import Counter
from typing import Any

import numpy as np
import torch
import zmq

from tests.helpers import (
    TIMEOUT,
    Fuzzer,
    body_of,
    cartpole_fragment,
    gym_actor,
    pack,
    raw_socket,
    total,
    wait_until,
)
from zmq_rl.config import LearnerConfig, PolicyConfig, PPOConfig
from zmq_rl.learner.evaluation import evaluate_policy
from zmq_rl.wire.protocol import (
    Bye,
    Fragment,
    Heartbeat,
    Hello,
    ProtocolError,
    Refuse,
    Shutdown,
    Weights,
    decode,
    encode,
    encode_array,
)

torch.set_num_threads(1)


def cartpole_hello(**changes: Any) -> Hello:
    """A hello for CartPole-v1 that takes the learner's spaces (empty space maps)."""
    fields: dict[str, Any] = dict(
        actor_id=-1, env_id="CartPole-v1", observation_space={}, action_space={}, num_envs=1
    )
    return Hello(**{**fields, **changes})


class ExperienceFuzzer(Fuzzer):
    """Malformed frames for the learner's PULL socket, one class at a time.

    Each class returns the frames (parts) of one message; a PULL socket receives the
    parts of a multipart message one by one, so the learner rejects each part once.
    Frames of the classes in :attr:`SEMANTIC` decode (they are protocol-valid) and are
    rejected by the learner's own checks; every other frame fails ``decode``.
    """

    SEMANTIC = frozenset(
        {"unknown_actor", "bad_slot", "bad_obs", "bad_actions", "stale_run_id", "old_seq"}
    )

    NOT_MAPS = (1, -7, "fragment", [1, 2, 3], None, 3.5, b"\x00", True)

    def __init__(
        self, seed: int, run_id: str, actors: dict[int, int], tokens: dict[int, bytes]
    ) -> None:
        super().__init__(seed)
        self.run_id = run_id
        self.actors = actors  # actor_id -> num_envs (registered, good actors)
        self.tokens = tokens  # actor_id -> its session token (the worst case: known)

    def fragment(self, **changes: Any) -> Fragment:
        """A fragment of a good actor with its token and a seq far in the future (so it
        can never move the actor's expected seq: seq_jump if nothing else is wrong)."""
        actor_id = changes.pop("actor_id", self.r.choice(sorted(self.actors)))
        run_id = changes.pop("run_id", self.run_id)
        changes.setdefault("token", self.tokens.get(actor_id, bytes(16)))
        return cartpole_fragment(
            self.rng,
            run_id,
            actor_id=actor_id,
            slot=0,
            seq=10**9,
            length=self.r.randint(1, 8),
            **changes,
        )

    def body(self, **changes: Any) -> dict[str, Any]:
        return body_of(self.fragment(**changes))

    def truncated(self) -> list[bytes]:
        return self.cut(encode(self.fragment()))

    def wrong_type(self) -> list[bytes]:
        body = self.body()
        name = self.r.choice(
            [
                "actor_id",
                "slots",
                "version",
                "seq",
                "run_id",
                "sent_at",
                "token",
                *Fragment.STEP_FIELDS,
                "next_obs",
                "final_obs_index",
                "final_obs",
            ]
        )
        if name in ("actor_id", "version", "seq", "token"):
            value = self.r.choice(["7", 1.5, None, True, [1], {"a": 1}, -3, b"\x01"])
        elif name == "run_id":
            value = self.r.choice([5, None, b"raw", [self.run_id], "x" * 300])
        elif name == "sent_at":
            value = self.r.choice(["now", None, [1.0], True, {"t": 1}])
        else:
            value = self.r.choice(
                [
                    "array",
                    5,
                    [1.0, 2.0],
                    None,
                    {"dtype": "float32"},
                    b"\x00" * 16,
                    {"dtype": "float32", "shape": [1], "data": b"\x00" * 4, "extra": 1},
                ]
            )
        if name != "sent_at" and self.r.random() < 0.2:
            del body[name]  # a missing field is as wrong as a mistyped one
        else:
            body[name] = value
        return [pack(body)]

    def bad_dtype_or_shape(self) -> list[bytes]:
        body = self.body()
        name = self.r.choice(["rewards", "values", "log_probs", "terminated", "obs", "actions"])
        case = self.r.randrange(9)
        if case == 0:
            body[name]["dtype"] = self.r.choice(
                ["float16", "complex64", "object", "<f4", "int16", "str", 5, None, "V8"]
            )
        elif case == 1:
            body[name]["shape"] = self.r.choice(
                [[-1], [1.5], "4", [1] * 9, None, [True], [2**64 - 1]]
            )
        elif case == 2:  # a 1-D field with two dimensions
            body["rewards"] = encode_array(np.ones(len(body["terminated"]["data"]), np.float32))
        elif case == 3:  # T disagrees between fields
            n = body["values"]["shape"][0] + 1
            body["values"] = encode_array(np.zeros((n, 1), np.float32))
        elif case == 4:
            body["next_obs"] = encode_array(np.zeros((2, 4), np.float32))
        elif case == 5:
            n = body["actions"]["shape"][0]
            body["actions"] = encode_array(np.zeros((n, 2, 1), np.int64))
        elif case == 6:  # T = 0
            fragment = self.fragment()
            for field in Fragment.STEP_FIELDS:  # the [T, B] ones
                array = getattr(fragment, field)
                body[field] = encode_array(array[:0])
        elif case == 7:  # obs with no time axis
            body["obs"] = encode_array(np.float32(1.0))
        else:  # a rewards dtype outside the float ones
            body["rewards"]["dtype"] = "int32"
        return [pack(body)]

    def size_mismatch(self) -> list[bytes]:
        body = self.body()
        name = self.r.choice(["obs", "actions", "rewards", "values", "log_probs", "next_obs"])
        data = body[name]["data"]
        if self.r.random() < 0.5 and data:
            body[name]["data"] = data[: self.r.randrange(len(data))]
        else:
            body[name]["data"] = data + self.rng.bytes(self.r.randint(1, 64))
        return [pack(body)]

    def not_finite(self) -> list[bytes]:
        bad = self.r.choice([math.nan, math.inf, -math.inf])
        name = self.r.choice(["rewards", "values", "log_probs", "obs", "next_obs", "sent_at"])
        if name == "sent_at":
            return [encode(self.fragment(sent_at=bad))]
        fragment = self.fragment()
        array = np.array(getattr(fragment, name))
        array.reshape(-1)[self.r.randrange(array.size)] = bad
        return [encode(dataclasses.replace(fragment, **{name: array}))]

    def huge_length(self) -> list[bytes]:
        if self.r.random() < 0.5:
            return super().huge_length()
        body = self.body()  # an array that declares 2**40 rows but carries a few bytes
        body[self.r.choice(["obs", "rewards"])]["shape"][0] = 2**40
        return [pack(body)]

    def unknown_type(self) -> list[bytes]:
        body = self.body()
        if self.r.random() < 0.2:
            del body["type"]
            return [pack(body)]
        return self.set_one(body, "type", ["frobnicate", "", None, 5, "Fragment", ["fragment"]])

    def unexpected_type(self) -> list[bytes]:
        return self.one_of(
            [
                Heartbeat(actor_id=0, run_id=self.run_id),
                cartpole_hello(),
                Weights(version=1, run_id=self.run_id, tensors=[("w", np.zeros(2, np.float32))]),
                Shutdown(reason="x", run_id=self.run_id),
                Bye(actor_id=0, stats={}),
                Refuse(code="x", reason="y"),
            ]
        )

    def wrong_version(self) -> list[bytes]:
        body = self.body()
        if self.r.random() < 0.2:
            del body["proto"]
            return [pack(body)]
        return self.set_one(body, "proto", [1, 3, 0, "2", None, 2.0, True, -1, 2**40])

    def unknown_actor(self) -> list[bytes]:
        return [encode(self.fragment(actor_id=self.r.choice([2, 7, 999, 123_456, 2**31])))]

    def out_of_range_id(self) -> list[bytes]:
        body = self.body()
        if self.r.random() < 0.5:
            body["actor_id"] = self.r.choice([-1, 2**63, 2**64 - 1])
        else:
            body["slots"] = encode_array(np.array([self.r.choice([-1, -(2**40)])], np.int64))
        return [pack(body)]

    def bad_slot(self) -> list[bytes]:
        actor_id = self.r.choice(sorted(self.actors))
        fragment = self.fragment(actor_id=actor_id)
        slot = self.r.choice([self.actors[actor_id], self.actors[actor_id] + 1, 65535])
        return [encode(dataclasses.replace(fragment, slots=np.array([slot], np.int32)))]

    def bad_obs(self) -> list[bytes]:
        fragment = self.fragment()
        n = fragment.length
        case = self.r.randrange(3)
        if case == 0:  # rows of the wrong shape (consistent within the fragment)
            return [
                encode(
                    dataclasses.replace(
                        fragment,
                        obs=np.zeros((n, 1, 3), np.float32),
                        next_obs=np.zeros((1, 3), np.float32),
                        final_obs=np.zeros((0, 3), np.float32),
                    )
                )
            ]
        dtype = np.float64 if case == 1 else np.uint8
        return [
            encode(
                dataclasses.replace(
                    fragment,
                    obs=fragment.obs.astype(dtype),
                    next_obs=fragment.next_obs.astype(dtype),
                    final_obs=np.zeros((0, 4), dtype),
                )
            )
        ]

    def bad_actions(self) -> list[bytes]:
        fragment = self.fragment()
        n = fragment.length
        actions = self.r.choice(
            [
                np.full((n, 1), 2, np.int64),
                np.full((n, 1), -1, np.int64),
                np.full((n, 1), 2**40, np.int64),
                np.zeros((n, 1), np.float32),
                np.zeros((n, 1, 1), np.int64),
            ]
        )
        return [encode(dataclasses.replace(fragment, actions=actions))]

    def stale_run_id(self) -> list[bytes]:
        stale = self.r.choice(["", "0" * 12, "stale-run", self.run_id[::-1]])
        return [encode(self.fragment(run_id=stale))]

    def old_seq(self) -> list[bytes]:
        """A replayed fragment: seq 0 of an actor that has sent beyond it."""
        actor_id = self.r.choice(sorted(self.actors))
        slot = self.r.randrange(self.actors[actor_id])
        fragment = self.fragment(actor_id=actor_id)
        return [encode(dataclasses.replace(fragment, slots=np.array([slot], np.int32), seq=0))]

    def bad_final_obs(self) -> list[bytes]:
        fragment = self.fragment()
        truncated = np.zeros((fragment.length, 1), bool)
        truncated[-1, 0] = True  # a truncated row without its final observation
        if self.r.random() < 0.5:
            return [encode(dataclasses.replace(fragment, truncated=truncated))]
        body = body_of(fragment)
        body["terminated"]["data"] = b"\x02" * fragment.length  # a bool that is not 0/1
        return [pack(body)]

    def multipart(self) -> list[bytes]:
        return self.several([self.random_bytes, self.truncated, self.wrong_version], 2, 4)

    CLASSES = (
        "random_bytes",
        "truncated",
        "not_a_map",
        "wrong_type",
        "bad_dtype_or_shape",
        "size_mismatch",
        "not_finite",
        "huge_length",
        "unknown_type",
        "unexpected_type",
        "wrong_version",
        "unknown_actor",
        "out_of_range_id",
        "bad_slot",
        "bad_obs",
        "bad_actions",
        "stale_run_id",
        "old_seq",
        "bad_final_obs",
        "multipart",
    )

    def check(self, name: str, parts: list[bytes]) -> None:
        for part in parts:  # the generator never makes a frame that decode() passes...
            try:
                message = decode(part, (Fragment,))
            except ProtocolError:
                continue
            # ...except those the learner's checks reject by construction.
            assert name in self.SEMANTIC, f"{name} made a valid frame: {message}"


class ControlFuzzer(Fuzzer):
    """Malformed messages for the learner's ROUTER socket (sent from a raw DEALER).

    A message of n parts from a DEALER arrives as n + 1 frames (the routing id first);
    the learner rejects anything but 2 frames once, as ``bad_frames``.
    """

    SEMANTIC = frozenset({"unknown_actor"})

    NOT_MAPS = (1, "hello", [1, 2], None, 2.5, b"\x00", False)

    def __init__(self, seed: int, run_id: str) -> None:
        super().__init__(seed)
        self.run_id = run_id

    def hello_body(self) -> dict[str, Any]:
        return body_of(cartpole_hello(host="fuzz", pid=1))

    def truncated(self) -> list[bytes]:
        frame = encode(
            self.r.choice(
                [
                    Heartbeat(actor_id=0, run_id=self.run_id, token=bytes(16)),
                    Bye(actor_id=0, stats={"steps_sent": 1.0}),
                ]
            )
        )
        if self.r.random() < 0.5:
            frame = pack(self.hello_body())
        return self.cut(frame)

    def wrong_type(self) -> list[bytes]:
        case = self.r.randrange(3)
        if case == 0:
            body = self.hello_body()
            name, value = self.r.choice(
                [
                    ("actor_id", "x"),
                    ("actor_id", 1.5),
                    ("env_id", 5),
                    ("env_id", "x" * 300),
                    ("observation_space", [1]),
                    ("action_space", "box"),
                    ("num_envs", "4"),
                    ("num_envs", -1),
                    ("num_envs", 5000),
                    ("host", "h" * 300),
                    ("pid", -1),
                    ("rejoin_run_id", 5),
                    ("pid", 2**40),
                    ("observation_space", {1: 2}),
                ]
            )
            body[name] = value
        elif case == 1:
            body = body_of(Heartbeat(actor_id=0, run_id=self.run_id, token=bytes(16)))
            name, value = self.r.choice(
                [
                    ("actor_id", "0"),
                    ("actor_id", None),
                    ("run_id", 5),
                    ("version", -1),
                    ("token", None),
                    ("token", "x" * 16),
                ]
            )
            body[name] = value
        else:
            body = body_of(Bye(actor_id=0, stats={"steps_sent": 1.0}))
            name, value = self.r.choice(
                [
                    ("stats", {"steps_sent": math.nan}),
                    ("stats", {"x": math.inf}),
                    ("stats", [1]),
                    ("stats", {"x": "1"}),
                    ("last_seq", -2),
                    ("last_seq", "0"),
                    ("token", b"\x00" * 15),
                    ("actor_id", -1),
                ]
            )
            body[name] = value
        return [pack(body)]

    def out_of_range_id(self) -> list[bytes]:
        return self.set_one(self.hello_body(), "actor_id", [2**31, -2, 2**63, 2**64 - 1])

    def unknown_type(self) -> list[bytes]:
        return self.set_one(self.hello_body(), "type", ["helo", "", None, 7, "Hello", ["hello"]])

    def unexpected_type(self) -> list[bytes]:
        return self.one_of(
            [
                cartpole_fragment(self.rng, self.run_id),
                Weights(version=1, run_id=self.run_id, tensors=[("w", np.zeros(2, np.float32))]),
                Refuse(code="x", reason="y"),
                Shutdown(reason="x", run_id=self.run_id),
            ]
        )

    def wrong_version(self) -> list[bytes]:
        """Answered with Refuse(version_mismatch)."""
        body = (
            self.hello_body()
            if self.r.random() < 0.5
            else body_of(Heartbeat(actor_id=0, run_id=self.run_id))
        )
        return self.set_one(body, "proto", [1, 3, 0, "2", None, 2.0, True])

    def unknown_actor(self) -> list[bytes]:
        """Valid heartbeats / byes from a peer that never registered; answered with
        Refuse(reregister)."""
        actor_id = self.r.choice([0, 1, 5, 999])
        if self.r.random() < 0.5:
            return [encode(Heartbeat(actor_id=actor_id, run_id=self.run_id))]
        return [encode(Bye(actor_id=actor_id, stats={"steps_sent": 1e9}))]

    def multi_frame(self) -> list[bytes]:
        parts = self.several([self.random_bytes, self.unknown_actor, self.wrong_version], 2, 4)
        if self.r.random() < 0.3:
            parts[0] = b""  # a REQ-style empty delimiter
        return parts

    CLASSES = (
        "random_bytes",
        "truncated",
        "not_a_map",
        "wrong_type",
        "out_of_range_id",
        "huge_length",
        "unknown_type",
        "unexpected_type",
        "wrong_version",
        "unknown_actor",
        "multi_frame",
    )

    def check(self, name: str, parts: list[bytes]) -> None:
        if len(parts) == 1:
            try:
                message = decode(parts[0], (Hello, Heartbeat, Bye))
            except ProtocolError:
                pass
            else:
                assert name in self.SEMANTIC, f"{name} made a valid message: {message}"
                assert not isinstance(message, Hello)


FUZZ_STEPS = 30_000
FUZZ_EXPERIENCE = 6_000
FUZZ_CONTROL = 4_000
FUZZ_BATCH = 200
MIN_RETURN = 100.0
"""Deterministic-evaluation return the policy must reach after FUZZ_STEPS. Measured
without fuzzing on this config (seeds 0-3, two GymActor threads): 137, 198, 147, 155."""


def test_fuzz_learner_pull_and_router_during_training(ctx, learner_port, start_learner):
    """>= 10,000 malformed messages on the learner's PULL and ROUTER during a live run.

    Learner and two GymActors (CartPole-v1, 4 envs each) train 30k steps in threads.
    Once both actors have sent on every slot, a raw PUSH sends FUZZ_EXPERIENCE messages
    and a raw DEALER FUZZ_CONTROL messages, in batches; after each batch the test waits
    (bounded) until the learner has counted every message, so each is counted exactly
    once while training goes on. Afterwards: the run completed its budget, the
    ``rejected/*`` counters sum to what was sent (per socket), each good actor's bye
    says it sent exactly what the learner received, and the final evaluation return is
    above MIN_RETURN.
    """
    cfg = LearnerConfig(
        env_id="CartPole-v1",
        port=learner_port,
        num_actors=2,
        num_envs=4,
        num_steps=32,
        total_env_steps=100 * FUZZ_STEPS,
        fragment_length=16,
        eval_episodes=10,
        seed=0,
        starvation_timeout=TIMEOUT,
        checkpoint_every=0,
    )
    learner, run = start_learner(cfg, PPOConfig(num_epochs=10), PolicyConfig())
    actors = [gym_actor(ctx, learner_port, env_id="CartPole-v1") for _ in range(2)]

    def every_slot_sent() -> bool:
        records = list(learner.members)
        return len(records) == 2 and all(rec.next_seq >= 1 for rec in records)

    wait_until(every_slot_sent, TIMEOUT, "both actors to send on every slot")
    good = {rec.actor_id: rec.num_envs for rec in learner.members}
    tokens = {rec.actor_id: rec.token for rec in learner.members}
    push = raw_socket(ctx, zmq.PUSH, f"tcp://127.0.0.1:{cfg.experience_port()}")
    dealer = raw_socket(ctx, zmq.DEALER, f"tcp://127.0.0.1:{learner_port}")
    experience = ExperienceFuzzer(1, learner.run_id, good, tokens)
    control = ControlFuzzer(2, learner.run_id)
    tried = {"experience": Counter(), "control": Counter()}
    parts_sent = messages_sent = 0
    replies: Counter[str] = Counter()
    started_at = learner.report.updates_completed
    start = time.monotonic()
    for batch_start in range(0, max(FUZZ_EXPERIENCE, FUZZ_CONTROL), FUZZ_BATCH):
        for i in range(batch_start, min(batch_start + FUZZ_BATCH, FUZZ_EXPERIENCE)):
            name, parts = experience.generate(i)
            push.send_multipart(parts)
            tried["experience"][name] += 1
            parts_sent += len(parts)
        for i in range(batch_start, min(batch_start + FUZZ_BATCH, FUZZ_CONTROL)):
            name, parts = control.generate(i)
            dealer.send_multipart(parts)
            tried["control"][name] += 1
            messages_sent += 1
        wait_until(
            lambda n=parts_sent, m=messages_sent: (
                total(learner.counters, "rejected/experience/") >= n
                and total(learner.counters, "rejected/control/") >= m
            ),
            TIMEOUT,
            "the learner to count every malformed message",
        )
        while dealer.poll(0):
            reply = decode(dealer.recv())
            assert isinstance(reply, Refuse)
            replies[reply.code] += 1
    fuzz_seconds = time.monotonic() - start
    updates_during_fuzz = learner.report.updates_completed - started_at
    assert run.alive(), "the run ended before the fuzzing did"
    # Train on to FUZZ_STEPS (however fast the fuzzing went), then stop the run.
    wait_until(
        lambda: learner.report.env_steps_consumed >= FUZZ_STEPS,
        120,
        f"{FUZZ_STEPS} steps of training",
    )
    learner.request_stop("fuzzing over")
    report = run.join(120)
    final_return, _ = evaluate_policy(learner.policy, "CartPole-v1", 10, seed=10_000)
    stats = [a.join() for a in actors]
    while dealer.poll(0):
        replies[decode(dealer.recv()).code] += 1
    push.close()
    dealer.close()

    counters = report.counters
    rejected = {k: v for k, v in sorted(counters.items()) if k.startswith("rejected/")}
    print(
        f"\nfuzz: {sum(tried['experience'].values())} messages ({parts_sent} frames) "
        f"to PULL, {messages_sent} to ROUTER in {fuzz_seconds:.1f}s, "
        f"{updates_during_fuzz} updates meanwhile"
    )
    print("fuzz classes PULL:", dict(tried["experience"]))
    print("fuzz classes ROUTER:", dict(tried["control"]))
    print("learner rejected:", json.dumps(rejected))
    print("learner replies to the fuzzing DEALER:", dict(replies))
    print(
        f"final evaluation: {final_return:.1f} after "
        f"{report.env_steps_consumed} steps; received/fragments "
        f"{counters['received/fragments']}"
    )

    assert sum(tried["experience"].values()) + messages_sent >= 10_000
    assert set(tried["experience"]) == set(ExperienceFuzzer.CLASSES)
    assert set(tried["control"]) == set(ControlFuzzer.CLASSES)
    assert updates_during_fuzz >= 1, "no training happened while fuzzing"
    # Every malformed message counted exactly once, on the socket it came in on.
    assert total(counters, "rejected/experience/") == parts_sent
    assert total(counters, "rejected/control/") == messages_sent
    assert total(counters, "rejected/") == parts_sent + messages_sent
    for reason in (
        "not_msgpack",
        "not_a_map",
        "bad_field",
        "bad_array",
        "bad_dtype",
        "bad_shape",
        "size_mismatch",
        "not_finite",
        "bad_value",
        "unknown_type",
        "unexpected_type",
        "version_mismatch",
        "unknown_actor",
        "bad_slot",
        "bad_obs",
        "bad_actions",
        "other_run",
        "old_seq",
    ):
        assert counters.get(f"rejected/experience/{reason}", 0) > 0, reason
    for reason in (
        "bad_frames",
        "version_mismatch",
        "unknown_actor",
        "unexpected_type",
        "bad_field",
        "not_msgpack",
        "unknown_type",
    ):
        assert counters.get(f"rejected/control/{reason}", 0) > 0, reason
    # Version mismatches are answered with a refusal, strangers' heartbeats with
    # "reregister"; nothing else is answered.
    assert replies["version_mismatch"] == counters["rejected/control/version_mismatch"]
    assert replies["reregister"] == counters["rejected/control/unknown_actor"]
    assert counters.get("registered") == 2 and not counters.get("control/undeliverable")
    # The run itself is untouched.
    assert report.stop_reason == "fuzzing over"
    assert report.env_steps_consumed >= FUZZ_STEPS
    assert sorted(report.actor_stats) == ["0", "1"]
    for summary in report.actor_stats.values():
        assert summary["said_bye"]
        assert summary["steps_received"] == summary["actor/steps_sent"] > 0
        assert summary["fragments_received"] == summary["actor/fragments_sent"]
    assert counters["received/fragments"] == sum(s["fragments_sent"] for s in stats)
    assert final_return > MIN_RETURN
