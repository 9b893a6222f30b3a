"""Hostile peers on the learner's ROUTER (control): hellos, heartbeats, refusals.

* A protocol-version mismatch is refused naming both versions (an actor facing a newer
  learner: ``test_hostile_actor.py``).
* Hellos with unusable spaces are refused without stopping the run.
* A registered peer that only heartbeats is dropped instead of stalling the run.

The control fuzz (malformed hellos, heartbeats and byes, during training) is in
``test_hostile_learner_fuzz.py``. Figures are printed; run with ``-s`` to see them.
"""

from __future__ import annotations

import math
import time

import msgpack
import numpy as np
import pytest
import torch
import zmq

from tests.helpers import (
    OBS_SPACE,
    STUB_ENV_ID,
    TIMEOUT,
    RegisteredPeer,
    body_of,
    gym_actor,
    pack,
    raw_socket,
    recv_message,
    stub_client,
    stub_hello,
    stub_learner_config,
    wait_until,
)
from zmq_rl.actor import client as client_module
from zmq_rl.actor.client import LearnerRefused
from zmq_rl.actor.gym_actor import GymActor
from zmq_rl.config import ActorConfig
from zmq_rl.wire.protocol import (
    PROTOCOL_VERSION,
    Heartbeat,
    Hello,
    Message,
    Refuse,
    encode,
    encode_array,
    space_spec,
)

torch.set_num_threads(1)


def test_protocol_version_mismatch_is_refused_naming_both_versions(
    ctx, learner_port, start_learner, monkeypatch, caplog
):
    """A v1 actor's hello (made by hand on a raw DEALER, and from an ActorClient whose
    encoder is made to stamp proto 1) is refused with ``version_mismatch``; the refusal,
    the client's LearnerRefused and the learner's log name both versions, and the
    learner counts each under ``rejected/control/version_mismatch``."""
    learner, run = start_learner(stub_learner_config(learner_port))
    dealer = raw_socket(ctx, zmq.DEALER, f"tcp://127.0.0.1:{learner_port}")
    body = body_of(stub_hello())
    body["proto"] = 1
    dealer.send(pack(body))
    refusal = recv_message(dealer)
    assert isinstance(refusal, Refuse) and refusal.code == "version_mismatch"
    assert "peer speaks 1" in refusal.reason and f"we speak {PROTOCOL_VERSION}" in refusal.reason

    def encode_v1(message: Message) -> bytes:
        frame = encode(message)
        if not isinstance(message, Hello):
            return frame
        body = msgpack.unpackb(frame, raw=False)
        body["proto"] = 1
        return pack(body)

    monkeypatch.setattr(client_module, "encode", encode_v1)
    client = stub_client(ctx, learner_port, register_timeout=10.0)
    start = time.monotonic()
    with pytest.raises(LearnerRefused) as info:
        client.register()
    elapsed = time.monotonic() - start
    client.close()
    learner.request_stop("test over")
    report = run.join()
    dealer.close()
    print(f"\nversion mismatch: refused in {elapsed * 1000:.0f} ms: {info.value}")
    assert info.value.code == "version_mismatch" and elapsed < 5.0
    assert "peer speaks 1" in str(info.value) and f"we speak {PROTOCOL_VERSION}" in str(info.value)
    assert report.counters["rejected/control/version_mismatch"] == 2
    assert "registered" not in report.counters
    logged = [r.getMessage() for r in caplog.records if "version_mismatch" in r.getMessage()]
    assert logged and "peer speaks 1" in logged[0]


def test_hello_with_an_out_of_range_field_is_refused_not_ignored(ctx, learner_port, start_learner):
    """Issue 29, item 14: a protocol-2 hello with a field out of range (or of the wrong
    type) used to be counted and dropped: the actor waited out its registration
    timeout. It is answered ``refuse bad_hello`` naming the field and the value (and
    still counted under ``rejected/control/bad_field``); other frames that fail to
    decode still get no answer."""
    learner, run = start_learner(stub_learner_config(learner_port))
    dealer = raw_socket(ctx, zmq.DEALER, f"tcp://127.0.0.1:{learner_port}")
    cases = [
        ("num_envs", 5000, "hello.num_envs: expected an int in [0, 4096], got 5000"),
        ("actor_id", 2**31, "hello.actor_id"),
        ("env_id", "x" * 300, "hello.env_id"),
        ("pid", -1, "hello.pid"),
    ]
    for name, value, named in cases:
        body = body_of(stub_hello())
        body[name] = value
        start = time.monotonic()
        dealer.send(pack(body))
        refusal = recv_message(dealer)
        assert isinstance(refusal, Refuse) and refusal.code == "bad_hello", refusal
        assert named in refusal.reason and time.monotonic() - start < 5.0
    beat = body_of(Heartbeat(actor_id=0, run_id="", token=bytes(16)))
    beat["version"] = -1  # not a hello: rejected, no answer
    dealer.send(pack(beat))
    assert not dealer.poll(500)
    learner.request_stop("test over")
    report = run.join()
    dealer.close()
    assert report.counters["rejected/control/bad_field"] == len(cases) + 1
    assert "registered" not in report.counters


def test_hello_with_an_unusable_space_is_refused_and_the_run_goes_on(
    ctx, learner_port, start_learner
):
    """Hellos whose spaces cannot be built (a Discrete of 2**63 made gymnasium raise
    OverflowError, which used to escape and stop the learner) are refused with
    ``bad_hello``; then a real actor registers and the run completes."""
    learner, run = start_learner(stub_learner_config(learner_port))
    dealer = raw_socket(ctx, zmq.DEALER, f"tcp://127.0.0.1:{learner_port}")
    box = space_spec(OBS_SPACE)
    for action_space in (
        {"kind": "discrete", "n": 2**63},
        {"kind": "discrete", "n": 2, "start": 2**64 - 1},
        {**box, "low": encode_array(np.array([math.nan, 0.0], np.float32))},
        {**box, "dtype": "bool"},
        {"kind": "tuple"},
    ):
        dealer.send(encode(stub_hello(action_space=action_space)))
        refusal = recv_message(dealer)
        assert isinstance(refusal, Refuse) and refusal.code in ("bad_hello", "space_mismatch")
        assert run.alive(), f"the learner died: {run.error!r}"
    stats = GymActor(
        ActorConfig(
            learner=f"127.0.0.1:{learner_port}", env_id=STUB_ENV_ID, register_timeout=TIMEOUT
        ),
        context=ctx,
    ).run()
    report = run.join()
    dealer.close()
    assert report.stop_reason == "budget spent" and stats["steps_sent"] > 0
    assert report.counters["registered"] == 1


def test_registered_peer_sending_only_heartbeats_cannot_stall_the_run(
    ctx, learner_port, start_learner
):
    """A peer registers while a good actor trains, then only heartbeats. Its slot joins
    the rollout at the next broadcast and never fills; the learner must drop it (as it
    drops a silent actor after ``actor_timeout``) and finish its budget, instead of
    starving."""
    cfg = stub_learner_config(
        learner_port,
        fragment_length=4,
        total_env_steps=8 * 200,
        actor_timeout=1.5,
        starvation_timeout=4.0,
    )
    learner, run = start_learner(cfg)
    good = gym_actor(ctx, learner_port, learner_timeout=10.0)
    wait_until(lambda: learner.report.updates_completed >= 1, TIMEOUT, "training")
    peer = RegisteredPeer(ctx, learner_port)
    deadline = time.monotonic() + TIMEOUT
    while run.alive() and time.monotonic() < deadline:
        peer.dealer.send(encode(Heartbeat(actor_id=peer.actor_id, run_id=peer.run_id)))
        peer.serve_control()
        run.thread.join(0.3)  # bounded: one heartbeat every 0.3 s while the run lasts
    report = run.join()
    good.join()
    peer.close()
    assert report.updates_completed == cfg.num_updates()


def hello_answer(ctx, port: int, **changes) -> Message:
    """The learner's answer to one raw hello (a new connection each)."""
    dealer = raw_socket(ctx, zmq.DEALER, f"tcp://127.0.0.1:{port}")
    try:
        dealer.send(encode(stub_hello(**changes)))
        return recv_message(dealer)
    finally:
        dealer.close()


def test_membership_limits_refuse_with_full_and_too_many_envs(ctx, learner_port, start_learner):
    """max_envs_per_actor, max_actors and max_total_envs bound what hellos alone can
    register: beyond them the refusal says which limit (``too_many_envs``, ``full``)."""
    cfg = stub_learner_config(
        learner_port, num_actors=3, max_actors=3, max_envs_per_actor=4, max_total_envs=6
    )
    learner, _ = start_learner(cfg)
    refused = hello_answer(ctx, learner_port, num_envs=5, pid=10)
    assert isinstance(refused, Refuse) and refused.code == "too_many_envs"
    assert "max_envs_per_actor=4" in refused.reason
    for pid in (11, 12):
        welcome = hello_answer(ctx, learner_port, num_envs=2, pid=pid)
        assert welcome.TYPE == "welcome", welcome
    slots = hello_answer(ctx, learner_port, num_envs=3, pid=13)  # 4 + 3 slots > 6
    assert isinstance(slots, Refuse) and slots.code == "full"
    assert "max_total_envs=6" in slots.reason
    assert hello_answer(ctx, learner_port, num_envs=2, pid=14).TYPE == "welcome"
    full = hello_answer(ctx, learner_port, num_envs=1, pid=15)  # a fourth actor
    assert isinstance(full, Refuse) and full.code == "full" and "max_actors=3" in full.reason
    counters = learner.counters
    assert (counters["refused/too_many_envs"], counters["refused/full"]) == (1, 2)
    assert counters["registered"] == 3


def test_a_hello_alone_never_ends_the_run(ctx, learner_port, start_learner):
    """A registration that never sends experience, however many slots it claims, does
    not change the budget: the run consumes all of it and says "budget spent" only
    then (before, one hello with many slots made the next rollout look too big)."""
    budget = 8 * 40
    cfg = stub_learner_config(
        learner_port, total_env_steps=budget, actor_timeout=1.5, max_envs_per_actor=256
    )
    learner, run = start_learner(cfg)
    actor = gym_actor(ctx, learner_port)
    wait_until(lambda: learner.report.updates_completed >= 2, TIMEOUT, "two updates")
    answer = hello_answer(ctx, learner_port, num_envs=200, pid=99)
    assert answer.TYPE == "welcome"
    report = run.join(TIMEOUT * 4)
    actor.join()
    assert report.stop_reason == "budget spent"
    assert report.env_steps_consumed == budget
    # It never joined the rollout (it delivered nothing), so it was never waited on
    # nor declared dead: dropped after a few silent heartbeat intervals, or still
    # waiting to join when the run ended.
    assert [d["pid"] for d in report.dead_actors] == []
    departed = {d["pid"]: d["left_because"] for d in report.departed_actors}
    assert departed.get(99, "dropped_silent") == "dropped_silent", departed
