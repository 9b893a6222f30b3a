"""An actor whose weights subscription breaks subscribes again (issue 19, finding 6).

libzmq drops a SUB's connection for good when a frame exceeds its ZMQ_MAXMSGSIZE and
never reconnects: before this, one oversized frame on the weights port left an actor
acting on stale weights for the rest of the run, silently. Against a real learner
(driven by hand, so the test chooses what its PUB sends) and a real ActorClient:

* an oversized frame: the client logs the dropped connection with its limit,
  subscribes again and loads the next broadcast;
* a subscription that receives nothing while the learner's heartbeats announce newer
  versions (here: unsubscribed behind the client's back) is re-created after
  ``STALE_WEIGHTS_INTERVALS`` heartbeat intervals;
* an undecodable weights frame is logged with its size;
* weights whose publication the actor missed, while the learner publishes nothing
  new (its rollout waits on that actor), are published again by the learner.
"""

from __future__ import annotations

import logging
import time

import pytest
import zmq

from tests.helpers import (
    ACT_SPACE,
    OBS_SPACE,
    STUB_ENV_ID,
    TIMEOUT,
    register_while_pumping,
    stub_learner_config,
)
from zmq_rl.actor import client as client_module
from zmq_rl.actor.client import ActorClient
from zmq_rl.config import PolicyConfig, PPOConfig
from zmq_rl.learner import links as links_module
from zmq_rl.learner.links import Links
from zmq_rl.learner.loop import Learner
from zmq_rl.learner.settings import run_settings
from zmq_rl.wire.protocol import Heartbeat, Weights, decode

LIMIT = 1 << 20  # the client's message limit in these tests


@pytest.fixture
def pair(ctx, learner_port):
    """A learner (not running its loop) and an ActorClient registered with it, whose
    SUB is known to receive (a broadcast reached it)."""
    learner = Learner(stub_learner_config(learner_port), PPOConfig(num_epochs=1), context=ctx)
    client = ActorClient(
        f"127.0.0.1:{learner_port}",
        env_id=STUB_ENV_ID,
        observation_space=OBS_SPACE,
        action_space=ACT_SPACE,
        context=ctx,
        register_timeout=TIMEOUT,
        max_message_bytes=LIMIT,
    )
    try:
        register_while_pumping(learner, client, TIMEOUT)
        broadcast_until_loaded(learner, client)
        yield learner, client
    finally:
        client.close()
        learner.close()


def broadcast_until_loaded(
    learner: Learner, client: ActorClient, timeout: float = TIMEOUT
) -> float:
    """Publish a new version (again every 50 ms: PUB drops what no subscriber takes)
    and serve the learner until the client has loaded it; the seconds it took."""
    learner.trainer.next_version()
    start = time.monotonic()
    last = 0.0
    while client.version < learner.version:
        now = time.monotonic()
        assert now - start < timeout, (client.version, learner.version, client.rejects)
        if now - last > 0.05:
            learner.publish_weights()
            last = now
        learner.pump(5)
        client.poll()
    return time.monotonic() - start


def test_oversized_weights_frame_is_logged_and_the_actor_subscribes_again(pair, caplog):
    learner, client = pair
    caplog.set_level(logging.WARNING)
    learner.ingest.sockets.weights.send(b"\0" * (2 * LIMIT))
    took = broadcast_until_loaded(learner, client)
    print(f"\nloaded version {client.version} {took:.2f}s after the oversized frame")
    assert client.rejects["weights:connection_dropped"] == 1
    assert client.stats["weights_resubscriptions"] == 1
    lines = [r.getMessage() for r in caplog.records if "weights connection" in r.getMessage()]
    assert len(lines) == 1 and f"{LIMIT:,} bytes" in lines[0], lines
    # The new subscription keeps working.
    broadcast_until_loaded(learner, client)
    assert client.subscriber.resubscriptions == 1


def test_subscription_that_gets_nothing_is_made_again(pair, monkeypatch, caplog):
    """The learner announces newer versions in its heartbeats; the SUB (unsubscribed
    here) gets none: after STALE_WEIGHTS_INTERVALS intervals the client subscribes
    again and loads the next broadcast."""
    learner, client = pair
    caplog.set_level(logging.WARNING)
    monkeypatch.setattr(client_module, "STALE_WEIGHTS_INTERVALS", 1.0)
    client.subscriber.socket.setsockopt(zmq.UNSUBSCRIBE, b"")
    start = time.monotonic()
    took = broadcast_until_loaded(learner, client)
    print(f"\nstale subscription re-made; loaded after {took:.2f}s")
    assert client.rejects["weights:behind"] == 1
    assert 1.0 <= took < 1.0 + 3 * client.heartbeat_interval + 2, took
    assert time.monotonic() - start < TIMEOUT
    assert any("announced version" in r.getMessage() for r in caplog.records)


def test_undecodable_weights_frame_is_logged_with_its_size(pair, caplog):
    learner, client = pair
    caplog.set_level(logging.WARNING)
    learner.ingest.sockets.weights.send(b"\xc1" * 1234)  # 0xc1: never valid msgpack
    deadline = time.monotonic() + TIMEOUT
    while not client.rejects["weights:not_msgpack"] and time.monotonic() < deadline:
        client.poll()
        learner.pump(5)
    assert client.rejects["weights:not_msgpack"] == 1
    assert any("1,234 bytes" in r.getMessage() for r in caplog.records)
    broadcast_until_loaded(learner, client)


def test_weights_every_publication_missed_are_published_again(pair, monkeypatch):
    """The one publication of a version is lost before the client sees it (taken off
    its SUB here; in the wild, published before a slow joiner's subscription arrived)
    and the learner publishes nothing more (in a run, its rollout would wait on this
    actor's rows, which the valve holds until the actor has the weights). Hearing the
    client report the older version, the learner publishes the weights again, once,
    REPUBLISH_AFTER_INTERVALS heartbeat intervals after the broadcast."""
    learner, client = pair
    monkeypatch.setattr(client_module, "STALE_WEIGHTS_INTERVALS", 100.0)  # no new SUB
    learner.trainer.next_version()
    learner.publish_weights()
    start = time.monotonic()
    sub = client.subscriber.socket
    lost = None
    while lost is None or lost.version < learner.version:  # earlier copies may be queued
        assert sub.poll(int(TIMEOUT * 1000)), "the publication never reached the SUB"
        lost = decode(sub.recv(), (Weights,))
    while client.version < learner.version:
        assert time.monotonic() - start < TIMEOUT, (client.version, dict(learner.counters))
        learner.pump(5)
        client.poll()
    took = time.monotonic() - start
    print(f"\nloaded the lost version {took:.2f}s after its publication")
    assert learner.counters["weights/republished"] == 1
    assert took >= links_module.REPUBLISH_AFTER_INTERVALS * client.heartbeat_interval - 0.05
    assert client.rejects["weights:behind"] == 0


def test_republishing_waits_for_an_older_version_and_backs_off():
    settings = run_settings(stub_learner_config(1), OBS_SPACE, ACT_SPACE, PolicyConfig())
    links = Links(settings, lambda: True)
    gap = links_module.REPUBLISH_AFTER_INTERVALS * links.settings.heartbeat_interval

    def beat(version: int) -> Heartbeat:
        return Heartbeat(actor_id=0, run_id="r", version=version)

    assert not links.weights_overdue(beat(0), 3, 1e6)  # nothing published yet
    links.cycle_ended()
    t0 = links.published_at
    assert not links.weights_overdue(beat(2), 3, t0 + gap - 0.01)  # too soon
    assert not links.weights_overdue(beat(3), 3, t0 + 10 * gap)  # up to date
    assert links.weights_overdue(beat(2), 3, t0 + gap)  # after 1 gap,
    assert not links.weights_overdue(beat(2), 3, t0 + 1.9 * gap)
    assert links.weights_overdue(beat(2), 3, t0 + 2 * gap)  # 2 gaps,
    assert not links.weights_overdue(beat(2), 3, t0 + 3.9 * gap)
    assert links.weights_overdue(beat(2), 3, t0 + 4 * gap)  # 4 gaps after the broadcast
    links.cycle_ended()  # a broadcast starts over
    assert links.weights_overdue(beat(3), 4, links.published_at + gap)
