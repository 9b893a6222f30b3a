"""Long and broken links: the heartbeat's link fields, an actor that pauses for the
link and re-registers before it sends again, and what the learner measures of each
actor's link (round trip, valve-paused share, the ``max_lead_steps`` that fits).

* Protocol: the optional heartbeat fields round-trip, may be omitted (a v1 peer), and
  are range-checked.
* Actor side, against the fake learner of ``tests/test_client_actor.py`` (real sockets,
  the client driven by hand): a learner heartbeat is answered on the next poll with its
  ``sent_at`` echoed; ``paused`` is the valve's share of the time; a silent learner
  pauses the actor, a stale heartbeat does not end the pause, an echo of a heartbeat
  sent since does; a ``refuse reregister`` or weights no member could have received make
  it register again before it sends anything; toward a learner without the fields
  nothing changes.
* Learner side: a real Learner with a real actor measures a round trip and a paused
  share and reports them (report line, :meth:`Ingest.link_stats`); the advice is
  logged once per actor, with the value of the formula in docs/multi-host.md.
* ``bench/long_link.py --smoke`` over a 200 ms round trip between network namespaces
  (``tc netem``, or the userspace delay line where the kernel has no netem); skipped
  without root or iproute2.
"""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import STUB_ENV_ID
from tests.helpers import Background, stub_hello
from tests.test_client_actor import (
    RUN_ID,
    FakeLearner,
    make_client,
    make_policy,
    stub_rows,
    weights_of,
)
from zmq_rl.actor.client import LINK_SILENCE_INTERVALS, ActorClient
from zmq_rl.config import LearnerConfig, PolicyConfig, PPOConfig
from zmq_rl.learner.links import ADVICE_MIN_SAMPLES, ADVICE_WARNINGS
from zmq_rl.learner.loop import Learner
from zmq_rl.run.progress import format_row
from zmq_rl.wire.protocol import Heartbeat, Hello, ProtocolError, Refuse, decode, encode
from zmq_rl.wire.valve import fitting_max_lead_steps

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 20.0

# -- protocol -------------------------------------------------------------------------


def test_heartbeat_link_fields_round_trip_and_may_be_omitted():
    full = Heartbeat(
        actor_id=3, run_id="r", version=7, sent_at=12.5, echo=10, held=0.25, token=bytes(16)
    )
    got = decode(encode(full))
    assert isinstance(got, Heartbeat)
    assert (got.sent_at, got.echo, got.held, got.paused) == (12.5, 10.0, 0.25, None)
    assert "paused" not in full.to_map()  # None fields are not on the wire
    # A v1 peer's heartbeat: no link field at all.
    plain = decode(encode(Heartbeat(actor_id=-1, run_id="r")))
    assert (plain.sent_at, plain.echo, plain.held, plain.paused) == (None,) * 4
    assert set(Heartbeat(actor_id=-1, run_id="r").to_map()) == {"actor_id", "run_id", "version"}
    # An int where a number is meant is fine; paused at both ends of its range.
    for paused in (0, 1, 0.5):
        beat = Heartbeat(0, "r", paused=paused, token=bytes(16))
        assert decode(encode(beat)).paused == float(paused)


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("sent_at", math.nan, "bad_value"),
        ("sent_at", "1.0", "bad_value"),
        ("echo", True, "bad_value"),
        ("echo", math.inf, "bad_value"),
        ("held", -0.5, "bad_field"),
        ("paused", 1.5, "bad_field"),
        ("paused", -0.1, "bad_field"),
    ],
)
def test_heartbeat_link_fields_are_checked(key, value, reason):
    import msgpack

    beat = Heartbeat(0, "r", token=bytes(16)).to_map()
    body = {**beat, "proto": 2, "type": "heartbeat", key: value}
    with pytest.raises(ProtocolError) as err:
        decode(msgpack.packb(body, use_bin_type=True))
    assert err.value.reason == reason


# -- the actor side -------------------------------------------------------------------

FAST_BEAT = 0.2
"""heartbeat_interval of these fake learners: the client pauses for the link after
LINK_SILENCE_INTERVALS of them (0.6 s)."""


def registered(ctx, fake: FakeLearner, **config: Any) -> tuple[ActorClient, bytes]:
    """A client welcomed by ``fake`` (stub env, one slot) with ``config`` in the welcome."""
    client = make_client(ctx, fake.port)
    registering = Background(lambda: client.register(timeout=TIMEOUT))
    routing_id, _ = fake.recv_control(Hello)
    fake.welcome(routing_id, 0, weights_of(make_policy(0), 0), **config)
    registering.join()
    assert registering.error is None, repr(registering.error)
    return client, routing_id


def learner_beat(fake: FakeLearner, routing_id: bytes, **fields: Any) -> float:
    """Send a learner heartbeat of RUN_ID (``fields``: sent_at, echo, held); return when."""
    fake.send(routing_id, Heartbeat(actor_id=-1, run_id=RUN_ID, **fields))
    return time.monotonic()


def actor_beat(fake: FakeLearner, client: ActorClient, match, timeout: float = TIMEOUT):
    """Poll the client until it sends a heartbeat for which ``match(beat)`` holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        client.poll()
        if fake.router.poll(10):
            _, frame = fake.router.recv_multipart()
            message = decode(frame)
            if isinstance(message, Heartbeat) and match(message):
                return message
    pytest.fail(f"no matching heartbeat from the actor within {timeout}s")


def send_rows(client: ActorClient, start: int, n: int) -> None:
    """``n`` stub steps of slot 0 through the lockstep buffer (ActorClient.step)."""
    for t in range(start, start + n):
        obs = stub_rows(t, 1)
        client.step(obs, np.array([0]), [1.0], [False], [False], [0.0], [0.0], stub_rows(t + 1, 1))


def poll_until(client: ActorClient, condition, timeout: float, what: str) -> float:
    """Poll (10 ms apart) until ``condition()``; return how long it took."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        client.wait_for_weights(0.01)
    return time.monotonic() - start


def test_actor_answers_a_learner_heartbeat_at_once_echoing_it(ctx, learner_port):
    """The answer comes on the next poll, not a heartbeat interval later (5 s here),
    with the learner's sent_at unchanged and how long the actor held it."""
    fake = FakeLearner(ctx, learner_port)
    client, routing_id = registered(ctx, fake, heartbeat_interval=5.0)
    actor_beat(fake, client, lambda b: True)  # its first periodic heartbeat
    sent = learner_beat(fake, routing_id, sent_at=1234.5)
    answer = actor_beat(fake, client, lambda b: b.echo == 1234.5, timeout=2.0)
    took = time.monotonic() - sent
    print(f"\nanswer to a learner heartbeat after {1e3 * took:.1f} ms, held {answer.held}")
    assert took < 1.0, "the answer waited for the next periodic heartbeat"
    assert 0.0 <= answer.held < took
    assert answer.sent_at is not None and answer.paused == 0.0
    assert answer.actor_id == client.actor_id and answer.run_id == RUN_ID
    client.close()


def test_heartbeat_reports_the_share_of_time_the_valve_held_the_actor(ctx, learner_port):
    fake = FakeLearner(ctx, learner_port)
    # steps_per_broadcast = max_lead_steps = 40: at version 0 the valve holds at 40 steps.
    client, routing_id = registered(ctx, fake, heartbeat_interval=5.0)
    actor_beat(fake, client, lambda b: True)
    start = time.monotonic()
    while time.monotonic() - start < 0.4:  # running: the valve is open
        assert not client.should_pause()
        client.wait_for_weights(0.01)
    learner_beat(fake, routing_id, sent_at=1.0)
    running = actor_beat(fake, client, lambda b: b.echo == 1.0)
    send_rows(client, 0, 40)
    start = time.monotonic()
    while time.monotonic() - start < 0.6:  # held by the valve
        assert client.should_pause()
        client.wait_for_weights(0.01)
    learner_beat(fake, routing_id, sent_at=2.0)
    held = actor_beat(fake, client, lambda b: b.echo == 2.0)
    print(f"\nvalve-paused share: running {running.paused:.3f}, held {held.paused:.3f}")
    assert running.paused < 0.05
    assert held.paused > 0.6
    client.close()


def pause_by_silence(fake: FakeLearner, client: ActorClient, routing_id: bytes) -> float:
    """Arm the link checks with one learner heartbeat (sent_at), then stay silent until
    the client pauses for the link; return how long that took."""
    learner_beat(fake, routing_id, sent_at=100.0)
    actor_beat(fake, client, lambda b: b.echo == 100.0)
    quiet_since = time.monotonic()
    limit = LINK_SILENCE_INTERVALS * FAST_BEAT
    poll_until(client, lambda: client.link_paused_since is not None, 10 * limit, "a link pause")
    took = time.monotonic() - quiet_since
    assert took >= limit * 0.95, f"paused after {took:.2f}s of silence, limit {limit}s"
    return took


def test_silent_learner_pauses_the_actor_until_an_echo_proves_it_is_known(ctx, learner_port):
    """No control message for LINK_SILENCE_INTERVALS heartbeat intervals: the actor stops
    stepping (and sends nothing). A learner heartbeat that echoes a heartbeat sent before
    the pause (as one queued in a cut link would) does not end it; one that echoes a
    heartbeat sent since does."""
    fake = FakeLearner(ctx, learner_port)
    client, routing_id = registered(ctx, fake, heartbeat_interval=FAST_BEAT)
    send_rows(client, 0, 2)  # buffered, not a whole fragment (fragment_length 6)
    took = pause_by_silence(fake, client, routing_id)
    since = client.link_paused_since
    assert since is not None and client.should_pause()
    # The actor's heartbeat sent at the pause: what the learner must echo.
    probe = actor_beat(fake, client, lambda b: b.sent_at >= since)
    stale = learner_beat(fake, routing_id, sent_at=101.0, echo=since - 0.5, held=0.0)
    poll_until(client, lambda: time.monotonic() - stale > 0.3, 1.0, "the stale heartbeat")
    assert client.link_paused_since == since and client.should_pause()
    learner_beat(fake, routing_id, sent_at=102.0, echo=probe.sent_at, held=0.0)
    poll_until(client, lambda: client.link_paused_since is None, 5.0, "the end of the pause")
    assert not client.should_pause()
    assert client.stats["link_pauses"] == 1
    assert "steps_sent_in_link_pause" not in client.stats
    assert not fake.pull.poll(100), "the actor sent experience while paused for the link"
    send_rows(client, 2, 4)  # the buffered rows were kept: a whole fragment now
    fragment = fake.recv_fragment()
    assert (fragment.seq, fragment.length) == (0, 6)
    print(f"\npaused after {took:.2f}s of silence")
    client.close()


def reregister(fake: FakeLearner, client: ActorClient, trigger) -> Hello:
    """``trigger()`` makes the client register again: answer its hello with a welcome;
    return the hello. Fails if any fragment reached the learner meanwhile."""
    before = client.registrations
    trigger()

    def poll_until_registered() -> None:
        deadline = time.monotonic() + TIMEOUT
        while client.registrations == before and time.monotonic() < deadline:
            client.wait_for_weights(0.02)

    polling = Background(poll_until_registered)
    routing_id, hello = fake.recv_control(Hello)
    assert not fake.pull.poll(0), "the actor sent experience before registering again"
    fake.welcome(routing_id, client.actor_id, weights_of(make_policy(0), 9))
    polling.join()
    assert polling.error is None, repr(polling.error)
    assert client.version == 9  # the new welcome's weights
    return hello


def test_refuse_after_a_silence_makes_the_actor_register_again_first(ctx, learner_port):
    fake = FakeLearner(ctx, learner_port)
    client, routing_id = registered(ctx, fake, heartbeat_interval=FAST_BEAT)
    send_rows(client, 0, 6)  # one fragment sent, seq 0
    assert fake.recv_fragment().seq == 0
    send_rows(client, 6, 3)  # buffered
    pause_by_silence(fake, client, routing_id)
    hello = reregister(
        fake, client, lambda: fake.send(routing_id, Refuse("reregister", "who are you?"))
    )
    assert (hello.actor_id, hello.rejoin_run_id) == (0, RUN_ID)
    assert client.link_paused_since is None and not client.should_pause()
    assert not fake.pull.poll(100), "rows of the ended registration were sent"
    send_rows(client, 0, 6)
    assert fake.recv_fragment().seq == 0  # a new registration counts from 0
    assert client.stats["reregistrations"] == 1 and client.stats["link_pauses"] == 1
    client.close()


def test_weights_no_member_could_get_pause_the_actor_and_it_registers_again(ctx, learner_port):
    """Version 2 proves that the learner consumed 2 * 40 steps of every member slot; an
    actor that sent 6 cannot still be a member: it loads them, pauses for the link, and
    on the learner's refusal registers again without sending."""
    fake = FakeLearner(ctx, learner_port)
    client, routing_id = registered(ctx, fake, heartbeat_interval=5.0)
    learner_beat(fake, routing_id, sent_at=5.0)  # a learner with the link fields
    actor_beat(fake, client, lambda b: b.echo == 5.0)
    fake.wait_subscribers(1)
    send_rows(client, 0, 6)
    assert fake.recv_fragment().seq == 0
    send_rows(client, 6, 2)  # buffered, version 0
    deadline = time.monotonic() + TIMEOUT
    while client.version < 2:
        assert time.monotonic() < deadline, "version 2 never arrived"
        fake.pub.send(encode(weights_of(make_policy(1), 2)))
        client.wait_for_weights(0.05)
    assert client.link_paused_since is not None and client.should_pause()
    # Loading them flushed the two rows acted with version 0 (the one fragment a slot
    # may lose), then nothing more.
    flushed = fake.recv_fragment()
    assert (flushed.seq, flushed.length, flushed.version) == (1, 2, 0)
    reregister(fake, client, lambda: fake.send(routing_id, Refuse("reregister", "no")))
    assert client.stats["steps_sent_in_link_pause"] == 2
    client.close()


def test_weights_beyond_its_steps_end_in_a_resume_when_the_learner_still_knows_it(
    ctx, learner_port
):
    fake = FakeLearner(ctx, learner_port)
    client, routing_id = registered(ctx, fake, heartbeat_interval=5.0)
    learner_beat(fake, routing_id, sent_at=5.0)
    actor_beat(fake, client, lambda b: b.echo == 5.0)
    fake.wait_subscribers(1)
    deadline = time.monotonic() + TIMEOUT
    while client.version < 3:
        assert time.monotonic() < deadline, "version 3 never arrived"
        fake.pub.send(encode(weights_of(make_policy(1), 3)))
        client.wait_for_weights(0.05)
    since = client.link_paused_since
    assert since is not None
    probe = actor_beat(fake, client, lambda b: b.sent_at >= since, timeout=2.0)
    learner_beat(fake, routing_id, sent_at=6.0, echo=probe.sent_at, held=0.0)
    poll_until(client, lambda: client.link_paused_since is None, 5.0, "the end of the pause")
    assert not client.should_pause() and client.version == 3
    client.close()


def test_toward_a_learner_without_link_fields_nothing_changes(ctx, learner_port):
    """A v1 learner (heartbeats without sent_at): no pause for silence, none for weights
    beyond the actor's steps; heartbeats still go out, with sent_at but no echo."""
    fake = FakeLearner(ctx, learner_port)
    client, routing_id = registered(ctx, fake, heartbeat_interval=FAST_BEAT)
    learner_beat(fake, routing_id)
    beat = actor_beat(fake, client, lambda b: True)
    assert beat.echo is None and beat.held is None and beat.sent_at is not None
    quiet = time.monotonic()
    while time.monotonic() - quiet < 4 * LINK_SILENCE_INTERVALS * FAST_BEAT:
        assert not client.should_pause()
        client.wait_for_weights(0.02)
    fake.wait_subscribers(1)
    deadline = time.monotonic() + TIMEOUT
    while client.version < 5:
        assert time.monotonic() < deadline, "version 5 never arrived"
        fake.pub.send(encode(weights_of(make_policy(1), 5)))
        client.wait_for_weights(0.05)
    assert client.link_paused_since is None and not client.should_pause()
    assert "link_pauses" not in client.stats
    client.close()


# -- the learner side -----------------------------------------------------------------


def test_fitting_lead_formula():
    """S + r * (round trip + U), r capped at S / U, rounded up to fragments."""
    base = dict(steps_per_broadcast=32, fragment_length=32)
    # A link-bound actor: 1,000 steps/s per slot, 200 ms round trip, 10 ms updates.
    assert fitting_max_lead_steps(**base, step_rate=1000, round_trip=0.2, cycle_time=0.01) == 256
    # A learner-bound one: it could step 10,000/s, the learner takes 32 rows per 20 ms.
    assert fitting_max_lead_steps(**base, step_rate=1e4, round_trip=0.0, cycle_time=0.02) == 64
    # Nothing to cover: one cycle.
    assert fitting_max_lead_steps(**base, step_rate=0.0, round_trip=0.2, cycle_time=0.01) == 32


def small_learner(port: int, ctx, **changes: Any) -> Learner:
    settings: dict[str, Any] = dict(
        env_id=STUB_ENV_ID,
        port=port,
        num_actors=1,
        num_envs=1,
        num_steps=8,
        fragment_length=8,
        total_env_steps=10**9,
        eval_episodes=1,
        starvation_timeout=TIMEOUT,
        checkpoint_every=0,
    )
    cfg = LearnerConfig(**{**settings, **changes})
    return Learner(cfg, PPOConfig(num_epochs=1), PolicyConfig(hidden_sizes=(8,)), context=ctx)


def test_learner_advises_a_fitting_lead_once_per_actor(ctx, learner_port, caplog):
    """Heartbeats of an actor held 80 % of the time, 200 ms away, stepping 800 steps/s
    per slot while it runs, with 10 ms of learner work per cycle (S = 8 rows per slot,
    the learner could take 800/s): the advice is S + r * (rtt + U) = 8 + 800 * 0.21 =
    176 (a multiple of the 8-row fragments), logged once, at WARNING (the lead is 16)."""
    learner = small_learner(learner_port, ctx)
    try:
        ingest = learner.ingest
        rec, _ = ingest.members.register(
            b"peer", stub_hello(), version=0, started=True, default_envs=1, now=0.0
        )
        ingest.started = True
        ingest.links.cycle_busy.extend([0.01] * 3)
        ingest.links.after_busy = False
        caplog.set_level(logging.INFO, logger="zmq_rl.ingest")
        now = 1000.0
        for _ in range(3 * ADVICE_MIN_SAMPLES):
            now += 1.0
            rec.steps_received += 160  # 160 steps in 0.2 s of running: 800 steps/s
            # It held the learner's heartbeat 50 ms: a 200 ms round trip.
            beat = Heartbeat(
                rec.actor_id, learner.run_id, sent_at=now, echo=now - 0.25, held=0.05, paused=0.8
            )
            ingest._on_heartbeat(rec, beat, now)
        advice = [r for r in caplog.records if "--max-lead-steps" in r.getMessage()]
        assert len(advice) == 1, [r.getMessage() for r in advice]
        text = advice[0].getMessage()
        print("\n" + text)
        assert advice[0].levelno == logging.WARNING
        assert "--max-lead-steps 176 would cover its round trip (now 16" in text
        assert "round trip 200 ms" in text and "80%" in text
        line = rec.summary()
        assert line["rtt_ms"] == pytest.approx(200.0, abs=0.5)
        assert line["valve_paused_share"] == pytest.approx(0.8)
        assert line["running_steps_per_s_per_slot"] == pytest.approx(800.0)
        assert line["suggested_max_lead_steps"] == 176
        stats = ingest.links.stats(ingest.members)
        assert stats["links/rtt_ms_max"] == pytest.approx(200.0, abs=0.5)
        assert stats["links/valve_paused_share_max"] == pytest.approx(0.8)
        assert stats["links/suggested_max_lead_steps"] == 176
    finally:
        learner.close()


@pytest.mark.parametrize(
    ("case", "changes", "busy", "rtts"),
    [
        # A local MinAtar-like run on a busy 2-core box: 128-row rollouts, 0.5 s updates;
        # heartbeats often wait for a CPU (smoothed round trip ~200 ms), but some are
        # answered at once: the path itself costs 2 ms.
        ("busy local", {"num_steps": 128, "fragment_length": 32}, 0.5, [0.3, 0.25, 0.35, 0.002]),
        # A fast loopback link cut once for 1 s, at the fifth heartbeat.
        ("one cut", {}, 0.02, [0.001] * 4 + [1.0] + [0.001] * 10),
    ],
)
def test_no_lead_warning_when_the_link_is_fast(
    ctx, learner_port, caplog, case, changes, busy, rtts
):
    """Issue 29 item 13: the advice appeared as WARNINGs in a plain local MinAtar run and
    after one transient 1 s link cut on a fast link. The link's round-trip floor (the
    least of its recent samples) needs no lead of its own: one INFO line, no WARNING."""
    learner = small_learner(learner_port, ctx, **changes)
    try:
        ingest = learner.ingest
        rec, _ = ingest.members.register(
            b"peer", stub_hello(), version=0, started=True, default_envs=1, now=0.0
        )
        ingest.started = True
        ingest.links.cycle_busy.extend([busy] * 3)
        ingest.links.after_busy = False
        caplog.set_level(logging.INFO, logger="zmq_rl.ingest")
        now = 1000.0
        for i in range(15):
            now += 1.0
            rec.steps_received += 800  # 2,000 steps/s while running 0.4 s of each second
            rtt = rtts[i % len(rtts)]
            beat = Heartbeat(
                rec.actor_id, learner.run_id, sent_at=now, echo=now - rtt - 0.01, held=0.01,
                paused=0.6,
            )  # fmt: skip
            ingest._on_heartbeat(rec, beat, now)
        advice = [r for r in caplog.records if "max-lead-steps" in r.getMessage()]
        assert [r.levelno for r in advice] == [logging.INFO], [r.getMessage() for r in advice]
        assert "not the link" in advice[0].getMessage(), case
        assert rec.link.rtt_floor == pytest.approx(min(rtts), abs=1e-6)
    finally:
        learner.close()


def test_advice_to_many_actors_warns_a_few_times_then_informs(ctx, learner_port, caplog):
    """256 actors on one slow learner must not print 256 warnings: the first
    ADVICE_WARNINGS actors' advice is a WARNING (the last of them says where the rest
    goes), every further actor's is an INFO line, each actor still advised once."""
    learner = small_learner(learner_port, ctx, max_actors=64)
    try:
        ingest = learner.ingest
        ingest.started = True
        ingest.links.cycle_busy.extend([0.01] * 3)
        ingest.links.after_busy = False
        caplog.set_level(logging.INFO, logger="zmq_rl.ingest")
        count = ADVICE_WARNINGS + 3
        recs = [
            ingest.members.register(
                f"peer{i}".encode(), stub_hello(pid=100 + i), version=0, started=True,
                default_envs=1, now=0.0,
            )[0]
            for i in range(count)
        ]  # fmt: skip
        now = 1000.0
        for _ in range(3 * ADVICE_MIN_SAMPLES):
            now += 1.0
            for rec in recs:
                rec.steps_received += 160
                beat = Heartbeat(
                    rec.actor_id, learner.run_id, sent_at=now, echo=now - 0.25, held=0.05,
                    paused=0.8,
                )  # fmt: skip
                ingest._on_heartbeat(rec, beat, now)
        advice = [r for r in caplog.records if "would cover its round trip" in r.getMessage()]
        levels = [r.levelno for r in advice]
        assert levels == [logging.WARNING] * ADVICE_WARNINGS + [logging.INFO] * 3, levels
        assert (
            "further actors' advice is logged at INFO" in advice[ADVICE_WARNINGS - 1].getMessage()
        )
        assert len({r.getMessage().split(" (")[0] for r in advice}) == count  # once each
    finally:
        learner.close()


def test_a_real_run_measures_the_round_trip_and_the_valve_share(ctx, learner_port, caplog):
    """Learner and GymActor over loopback: the actor's report line holds a round trip
    (loopback: far below a second) and a valve share; the update rows, with what
    learner.py's one-line hook adds, carry the link figures that the progress line
    shows. Whatever the advice (the stub actor steps in microseconds, so the valve holds
    it most of the time), it is given at most once."""
    from tests.helpers import gym_actor

    caplog.set_level(logging.INFO, logger="zmq_rl.ingest")
    learner = small_learner(learner_port, ctx, total_env_steps=8 * 400)
    rows: list[dict[str, Any]] = []
    learner.runlog.on_update = lambda row: rows.append(
        {**row, **learner.ingest.links.stats(learner.members)}  # what the learner adds
    )
    try:
        actor = gym_actor(ctx, learner_port, num_envs=1)
        report = learner.run()
    finally:
        learner.close()
    actor.join()
    line = report.actor_stats["0"]
    print(f"\nreport line: {json.dumps(line)}")
    assert 0.0 <= line["rtt_ms"] < 1000.0
    assert 0.0 <= line["valve_paused_share"] <= 1.0
    measured = [r for r in rows if "links/rtt_ms_max" in r]
    assert measured, "no update row carried link figures"
    print("progress:", format_row(measured[-1]))
    assert "rtt " in format_row(measured[-1]) and "paused " in format_row(measured[-1])
    advice = [r for r in caplog.records if "--max-lead-steps" in r.getMessage()]
    assert len(advice) <= 1, [r.getMessage() for r in advice]


def test_progress_line_shows_the_worst_link_when_measured():
    row = {"charts/SPS": 1000.0, "charts/mean_return": 5.0, "charts/actors": 2}
    assert "rtt" not in format_row(row) and "paused" not in format_row(row)
    row |= {"links/rtt_ms_max": 201.4, "links/valve_paused_share_max": 0.724}
    assert format_row(row).endswith("rtt 201 ms  paused 72%")


# -- the long-link benchmark, smoke-sized, on a real 200 ms link ------------------------


def test_long_link_benchmark_smoke(tmp_path):
    """``bench/long_link.py --smoke``: three short runs (loopback, 200 ms with the
    default lead, 200 ms with the lead the learner suggested). Checks shapes, not
    speeds: the learner measured about the netem round trip and made a suggestion."""
    sys.path.insert(0, str(ROOT / "bench"))
    import long_link

    reason = long_link.unavailable()
    if reason:
        pytest.skip(reason)
    out = tmp_path / "long_link.json"
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "long_link.py"), "--smoke", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=3 * long_link.run_bound_s(1.0, 3.0),
    )
    took = time.monotonic() - start
    print(result.stdout[-3000:], result.stderr[-3000:])
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    runs = {run["name"]: run for run in data["runs"]}
    assert set(runs) == {"loopback", "long_default", "long_suggested"}
    for run in runs.values():
        assert run["steps_per_s"] > 0, run
    measured = runs["long_default"]["rtt_ms"]
    assert 0.8 * data["rtt_ms"] <= measured <= 2.0 * data["rtt_ms"], runs["long_default"]
    assert runs["long_suggested"]["max_lead_steps"] == data["suggested_max_lead_steps"]
    assert data["suggested_max_lead_steps"] > runs["long_default"]["max_lead_steps"]
    print(f"smoke took {took:.1f}s")


def test_an_actor_whose_learner_chosen_id_was_given_away_registers_with_any(ctx, learner_port):
    """An actor that asked for any id (-1) and was declared dead while cut off asks for
    its old id again; when the learner has given it to someone else (duplicate_id) the
    client registers with any free id instead of exiting."""
    fake = FakeLearner(ctx, learner_port)
    client, routing_id = registered(ctx, fake, heartbeat_interval=FAST_BEAT)
    assert client.requested_id == -1 and client.actor_id == 0
    before = client.registrations
    fake.send(routing_id, Refuse("reregister", "who are you?"))

    def poll_until_registered() -> None:
        deadline = time.monotonic() + TIMEOUT
        while client.registrations == before and time.monotonic() < deadline:
            client.wait_for_weights(0.02)

    polling = Background(poll_until_registered)
    routing_id, hello = fake.recv_control(Hello)
    assert hello.actor_id == 0  # its old id first
    fake.send(routing_id, Refuse("duplicate_id", "actor id 0 is already taken"))
    routing_id, again = fake.recv_control(Hello)
    assert again.actor_id == -1
    fake.welcome(routing_id, 5, weights_of(make_policy(0), 3))
    polling.join()
    assert polling.error is None, repr(polling.error)
    assert client.actor_id == 5 and client.registrations == before + 1
    client.close()
