"""The actor side over real sockets: GymActor / ActorClient against a fake learner.

The fake learner is a ROUTER / PULL / XPUB triple bound by the test and spoken to with
:mod:`zmq_rl.wire.protocol` only, so these tests pin the wire behaviour of the actor:
registration, ordered tagged fragments, the staleness valve, weight loading, shutdown.
Ports the reference's ``actor_thread_sends_ordered_experiences_and_loads_broadcasts``.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
import zmq

from tests.conftest import STUB_ENV_ID
from tests.helpers import NO_TOKEN as TOKEN
from tests.helpers import Background, FakeLearnerSockets, slot_rows
from tests.stub_env import StubEnv
from zmq_rl.actor.client import ActorClient, LearnerRefused, LearnerUnreachable
from zmq_rl.actor.gym_actor import GymActor, SpaceMismatch
from zmq_rl.config import ActorConfig, PolicyConfig
from zmq_rl.rl.policy import build_policy, export_weights
from zmq_rl.wire.protocol import (
    Bye,
    Fragment,
    Hello,
    Message,
    Refuse,
    RunSettings,
    Shutdown,
    Weights,
    Welcome,
    decode,
    encode,
    space_from_spec,
    space_spec,
)

torch.set_num_threads(1)

TIMEOUT = 20.0
RUN_ID = "run-fake"
# Not orthogonal init: the policy head is not ~0, so two policies' log-probs differ.
POLICY_CFG = PolicyConfig(hidden_sizes=(8,), ortho_init=False)
OBS_SPACE, ACT_SPACE = StubEnv.observation_space, StubEnv.action_space


def make_policy(seed: int):
    torch.manual_seed(seed)
    return build_policy(OBS_SPACE, ACT_SPACE, POLICY_CFG)


def welcome_config(**changes: Any) -> dict[str, Any]:
    """The welcome's config map (RunSettings on the wire) for the stub env."""
    policy = dataclasses.asdict(POLICY_CFG)
    policy["hidden_sizes"] = list(POLICY_CFG.hidden_sizes)
    config = {
        "env_id": STUB_ENV_ID,
        "observation_space": space_spec(OBS_SPACE),
        "action_space": space_spec(ACT_SPACE),
        "policy": policy,
        "num_steps": 40,
        "broadcast_every": 1,
        "steps_per_broadcast": 40,
        "max_lead_steps": 40,
        "fragment_length": 6,
        "num_envs": 1,
        "seed": 0,
        "heartbeat_interval": 1.0,
        "state_size": 0,
        "max_weights_bytes": 1 << 20,
        "max_fragment_bytes": 1 << 20,
    }
    config.update(changes)
    return config


class FakeLearner(FakeLearnerSockets):
    """ROUTER on port, PULL on port + 1, XPUB (a PUB that reports subscriptions) on +2."""

    def recv_control(self, kind: type[Message], timeout: float = TIMEOUT) -> tuple[bytes, Any]:
        """The next control message of type ``kind`` (heartbeats are skipped)."""
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            if self.router.poll(int(remaining * 1000) + 1):
                routing_id, frame = self.router.recv_multipart()
                message = decode(frame)
                if isinstance(message, kind):
                    return routing_id, message
        pytest.fail(f"no {kind.__name__} on the control socket within {timeout}s")

    def recv_fragment(self, timeout: float = TIMEOUT) -> Fragment:
        assert self.pull.poll(int(timeout * 1000)), f"no fragment within {timeout}s"
        message = decode(self.pull.recv(), expected=(Fragment,))
        assert isinstance(message, Fragment) and message.num_slots == 1
        return slot_rows(message)

    def fragments_until_bye(
        self, seen_seq: int, timeout: float = TIMEOUT
    ) -> tuple[list[Fragment], Bye]:
        """Take fragments after ``seen_seq`` (the newest one received so far) as they
        come while waiting for the bye, then up to its ``last_seq``, as a learner does:
        an actor that ran unthrottled has a PUSH and a PULL queue of them, and its close
        lingers only ``ACTOR_PUSH_LINGER_MS`` (reading them after joining it lost the
        tail when the join took that long)."""
        frames: list[bytes] = []
        bye: Bye | None = None
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self.pull, zmq.POLLIN)
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            ready = dict(poller.poll(int(remaining * 1000) + 1))
            while self.pull.poll(0):
                frames.append(self.pull.recv())  # raw: decoding waits until the end
            if self.router in ready:
                message = decode(self.router.recv_multipart()[1])
                bye = message if isinstance(message, Bye) else bye
            if bye is not None and (decode(frames[-1]).seq if frames else seen_seq) >= bye.last_seq:
                return [slot_rows(decode(f, expected=(Fragment,))) for f in frames], bye
        pytest.fail(
            f"no bye and fragments up to its last_seq within {timeout}s (bye: {bye}; "
            f"{len(frames)} fragments after seq {seen_seq})"
        )

    def welcome(self, routing_id: bytes, actor_id: int, weights: Weights, **config: Any) -> None:
        message = Welcome(
            actor_id=actor_id,
            token=TOKEN,
            run_id=RUN_ID,
            base_version=0,
            experience_port=self.port + 1,
            weights_port=self.port + 2,
            settings=RunSettings.from_map(welcome_config(**config)),
            weights=weights,
        )
        self.router.send_multipart([routing_id, encode(message)])

    def send(self, routing_id: bytes, message: Message) -> None:
        self.router.send_multipart([routing_id, encode(message)])

    def wait_subscribers(self, n: int, timeout: float = TIMEOUT) -> None:
        for _ in range(n):
            assert self.pub.poll(int(timeout * 1000)), "no SUB subscribed in time"
            assert self.pub.recv() == b"\x01"


def weights_of(policy, version: int) -> Weights:
    return Weights(version=version, run_id=RUN_ID, tensors=export_weights(policy))


def assert_acted_with(policy, fragment: Fragment) -> None:
    """The fragment's behaviour log-probs and values are ``policy``'s."""
    with torch.no_grad():
        lp, _, values = policy.evaluate_actions(
            torch.from_numpy(np.array(fragment.obs)), torch.from_numpy(np.array(fragment.actions))
        )
    np.testing.assert_allclose(fragment.log_probs, lp.numpy(), atol=1e-5)
    np.testing.assert_allclose(fragment.values, values.numpy(), atol=1e-5)


def acted_with(policy, fragment: Fragment, row: int) -> bool:
    """Whether row ``row`` of the fragment carries ``policy``'s log-prob and value."""
    with torch.no_grad():
        lp, _, value = policy.evaluate_actions(
            torch.from_numpy(np.array(fragment.obs[row : row + 1])),
            torch.from_numpy(np.array(fragment.actions[row : row + 1])),
        )
    return bool(
        abs(lp.item() - fragment.log_probs[row]) < 1e-5
        and abs(value.item() - fragment.values[row]) < 1e-5
    )


def stub_rows(start: int, n: int) -> np.ndarray:
    t = (np.arange(start, start + n) % 5).astype(np.float32)
    return np.stack([t, t], axis=1)


def test_actor_sends_ordered_fragments_pauses_and_loads_broadcasts(ctx, learner_port):
    pause_at = 40
    fake = FakeLearner(ctx, learner_port)
    policy_v0, policy_v7 = make_policy(7), make_policy(99)
    cfg = ActorConfig(
        learner=f"127.0.0.1:{learner_port}",
        env_id=STUB_ENV_ID,
        num_envs=1,
        actor_id=3,
        seed=123,
        register_timeout=TIMEOUT,
    )
    actor = Background(lambda: GymActor(cfg, context=ctx).run())

    routing_id, hello = fake.recv_control(Hello)
    assert (hello.actor_id, hello.env_id, hello.num_envs) == (3, STUB_ENV_ID, 1)
    assert space_from_spec(hello.observation_space) == OBS_SPACE
    assert space_from_spec(hello.action_space) == ACT_SPACE
    # steps_per_broadcast = max_lead_steps = 40: at version 0 the actor pauses after
    # exactly 40 steps. 40 is not a multiple of fragment_length 6, so the pausing actor
    # must flush a partial fragment of 4 rows for the learner to reach its quota.
    fake.welcome(routing_id, 3, weights_of(policy_v0, 0), fragment_length=6)

    received: list[Fragment] = []
    while sum(f.length for f in received) < pause_at:
        received.append(fake.recv_fragment())
    assert [f.length for f in received] == [6, 6, 6, 6, 6, 6, 4]
    for k, fragment in enumerate(received):
        assert (fragment.actor_id, fragment.slot, fragment.seq) == (3, 0, k)
        assert fragment.version == 0
        assert fragment.run_id == RUN_ID
    obs = np.concatenate([f.obs for f in received])
    np.testing.assert_array_equal(obs, stub_rows(0, pause_at), err_msg="steps out of order")
    terminated = np.concatenate([f.terminated for f in received])
    assert terminated.tolist() == [(i + 1) % 5 == 0 for i in range(pause_at)]
    assert not np.concatenate([f.truncated for f in received]).any()
    assert np.concatenate([f.rewards for f in received]).tolist() == [1.0] * pause_at
    for fragment in received:
        assert set(fragment.actions.tolist()) <= {0, 1}
        assert_acted_with(policy_v0, fragment)
        assert fragment.final_obs_index.size == 0
    # next_obs continues the stream (the reset observation after a termination).
    for a, b in zip(received, received[1:], strict=False):
        np.testing.assert_array_equal(a.next_obs, b.obs[0])

    # The actor is paused at its budget: nothing more may arrive without new weights.
    assert not fake.pull.poll(300), "the actor ran past max_lead_steps on version 0"

    # Version 7 raises the budget to 7 * 40 + 40: the actor resumes iff it loads it.
    # (PUB/SUB may drop messages sent before the SUB joined, so publish until it resumes.)
    deadline = time.monotonic() + TIMEOUT
    while not fake.pull.poll(50):
        assert time.monotonic() < deadline, "the actor never resumed after a broadcast"
        fake.pub.send(encode(weights_of(policy_v7, 7)))
    resumed = fake.recv_fragment()
    assert (resumed.seq, resumed.version) == (len(received), 7)
    np.testing.assert_array_equal(resumed.obs, stub_rows(pause_at, resumed.length))
    np.testing.assert_array_equal(received[-1].next_obs, resumed.obs[0])
    assert_acted_with(policy_v7, resumed)
    with pytest.raises(AssertionError):  # the check above discriminates the two policies
        assert_acted_with(policy_v0, resumed)

    fake.send(routing_id, Shutdown(reason="test over", run_id=RUN_ID))
    _, bye = fake.recv_control(Bye)
    stats = actor.join()
    assert actor.error is None, repr(actor.error)
    assert bye.actor_id == 3
    assert bye.stats == {k: float(v) for k, v in stats.items()}
    assert stats["steps_sent"] > pause_at
    assert stats["episodes_completed"] >= pause_at // 5
    # Re-published copies of version 7 are not loaded again.
    assert stats["policy_updates_received"] == 1
    assert stats["last_policy_version"] == 7

    # Every fragment the bye accounts for arrives, and nothing else.
    fragments = [*received, resumed]
    while fragments[-1].seq < bye.last_seq:
        fragments.append(fake.recv_fragment())
    assert [f.seq for f in fragments] == list(range(len(fragments)))
    assert bye.last_seq == fragments[-1].seq
    assert sum(f.length for f in fragments) == stats["steps_sent"]
    assert stats["fragments_sent"] == len(fragments)
    assert all(f.version == 7 for f in fragments[len(received) :])
    assert not fake.pull.poll(100)


def test_unthrottled_actor_loads_weights_between_steps(ctx, learner_port):
    """max_lead_steps 0 disables the valve: the actor never pauses, so new weights are
    picked up by the poll on its running path, and every later fragment uses them."""
    fake = FakeLearner(ctx, learner_port)
    policy_v0, policy_v1 = make_policy(11), make_policy(12)
    cfg = ActorConfig(
        learner=f"127.0.0.1:{learner_port}",
        env_id=STUB_ENV_ID,
        num_envs=1,
        register_timeout=TIMEOUT,
    )
    actor = Background(lambda: GymActor(cfg, context=ctx).run())
    routing_id, _ = fake.recv_control(Hello)
    fake.welcome(routing_id, 0, weights_of(policy_v0, 0), max_lead_steps=0, fragment_length=8)
    fragments = [fake.recv_fragment()]
    assert_acted_with(policy_v0, fragments[0])
    deadline = time.monotonic() + TIMEOUT
    while fragments[-1].version == 0:
        assert time.monotonic() < deadline, "the running actor never loaded version 1"
        fake.pub.send(encode(weights_of(policy_v1, 1)))
        fragments.append(fake.recv_fragment())
    switched = len(fragments) - 1
    assert fragments[switched].version == 1
    # Loading new weights flushes the rows acted by v0 first, so every row of a
    # fragment was acted by the fragment's version (the last v0 one may be short).
    fake.send(routing_id, Shutdown(reason="test over", run_id=RUN_ID))
    tail, bye = fake.fragments_until_bye(fragments[-1].seq)
    fragments += tail
    stats = actor.join()
    assert actor.error is None, repr(actor.error)
    assert fragments[-1].seq == bye.last_seq
    assert [f.seq for f in fragments] == list(range(len(fragments)))
    assert [f.version for f in fragments] == [0] * switched + [1] * (len(fragments) - switched)
    for fragment in fragments[:switched]:
        assert_acted_with(policy_v0, fragment)
    for fragment in fragments[switched:]:
        assert_acted_with(policy_v1, fragment)
    obs = np.concatenate([f.obs for f in fragments])
    np.testing.assert_array_equal(obs, stub_rows(0, len(obs)))
    assert stats["steps_sent"] == len(obs)
    assert stats["policy_updates_received"] == 1
    assert stats["last_policy_version"] == 1


def test_actor_refuses_to_run_an_env_whose_spaces_differ_from_the_learners(ctx, learner_port):
    fake = FakeLearner(ctx, learner_port)
    cfg = ActorConfig(
        learner=f"127.0.0.1:{learner_port}",
        env_id=STUB_ENV_ID,
        num_envs=1,
        register_timeout=TIMEOUT,
    )
    actor = Background(lambda: GymActor(cfg, context=ctx).run())
    routing_id, _ = fake.recv_control(Hello)
    cartpole = gym.make("CartPole-v1")
    torch.manual_seed(0)
    policy = build_policy(cartpole.observation_space, cartpole.action_space, POLICY_CFG)
    fake.welcome(
        routing_id,
        0,
        weights_of(policy, 0),
        env_id="CartPole-v1",
        observation_space=space_spec(cartpole.observation_space),
        action_space=space_spec(cartpole.action_space),
    )
    cartpole.close()
    _, bye = fake.recv_control(Bye)
    actor.join()
    assert isinstance(actor.error, SpaceMismatch), repr(actor.error)
    message = str(actor.error)
    assert str(OBS_SPACE) in message and "(4,)" in message
    assert bye.stats["steps_sent"] == 0
    assert not fake.pull.poll(100)


def make_client(ctx, port: int, **kwargs) -> ActorClient:
    return ActorClient(
        f"127.0.0.1:{port}",
        env_id=STUB_ENV_ID,
        observation_space=OBS_SPACE,
        action_space=ACT_SPACE,
        num_envs=1,
        context=ctx,
        **kwargs,
    )


def registered_client(ctx, fake: FakeLearner, **config: Any) -> tuple[ActorClient, bytes]:
    client = make_client(ctx, fake.port)
    registering = Background(lambda: client.register(timeout=TIMEOUT))
    routing_id, _ = fake.recv_control(Hello)
    fake.welcome(routing_id, 0, weights_of(make_policy(0), 0), **config)
    welcome = registering.join()
    assert registering.error is None, repr(registering.error)
    assert isinstance(welcome, Welcome) and client.actor_id == 0 and client.version == 0
    return client, routing_id


def test_register_raises_learner_refused_on_refuse(ctx, learner_port):
    fake = FakeLearner(ctx, learner_port)
    client = make_client(ctx, learner_port)
    registering = Background(lambda: client.register(timeout=TIMEOUT))
    routing_id, hello = fake.recv_control(Hello)
    assert hello.pid > 0
    fake.send(routing_id, Refuse(code="space_mismatch", reason="spaces differ: A vs B"))
    registering.join()
    assert isinstance(registering.error, LearnerRefused), repr(registering.error)
    assert registering.error.code == "space_mismatch"
    assert registering.error.reason == "spaces differ: A vs B"
    assert client.actor_id == -1
    client.close()


def test_register_raises_learner_unreachable_when_nothing_answers(ctx, learner_port):
    client = make_client(ctx, learner_port)  # nothing is bound there
    start = time.monotonic()
    with pytest.raises(LearnerUnreachable):
        client.register(timeout=0.3)
    assert 0.25 <= time.monotonic() - start < 5.0
    client.close()


def test_poll_drains_queued_weights_and_loads_only_the_newest(ctx, learner_port):
    fake = FakeLearner(ctx, learner_port)
    client, _ = registered_client(ctx, fake)
    observer = ctx.socket(zmq.SUB)
    observer.setsockopt(zmq.LINGER, 0)
    observer.setsockopt(zmq.SUBSCRIBE, b"")
    observer.connect(f"tcp://127.0.0.1:{learner_port + 2}")
    fake.wait_subscribers(2)  # the client's SUB and the observer
    policy = make_policy(5)
    for version in (1, 2, 3):
        fake.pub.send(encode(weights_of(policy, version)))
    # Once the observer has all three, so has the client's SUB (same PUB, same host).
    for version in (1, 2, 3):
        assert observer.poll(int(TIMEOUT * 1000))
        assert decode(observer.recv()).version == version
    weights = client.wait_for_weights(TIMEOUT)
    assert isinstance(weights, Weights)
    assert weights.version == 3
    assert client.version == 3
    assert client.stats["policy_updates_received"] == 1
    assert client.stats["last_policy_version"] == 3
    assert client.poll() is None  # v1 and v2 were drained, not left for later
    assert client.stats["policy_updates_received"] == 1
    # An older version published later is ignored.
    fake.pub.send(encode(weights_of(policy, 2)))
    assert observer.poll(int(TIMEOUT * 1000)) and observer.recv()
    assert client.wait_for_weights(TIMEOUT) is None
    assert client.version == 3
    # Fragments sent from now on carry the loaded version.
    client.send_fragment(
        0,
        stub_rows(0, 2),
        np.array([0, 1]),
        [1.0, 1.0],
        [False, False],
        [False, False],
        [0.5, 0.5],
        [-0.7, -0.7],
        stub_rows(2, 1)[0],
    )
    fragment = fake.recv_fragment()
    assert (fragment.version, fragment.seq, fragment.length) == (3, 0, 2)
    client.close()


def test_unsendable_fragment_at_shutdown_is_not_counted_as_sent(ctx, learner_port):
    """PUSH at its high-water mark (the learner's PULL is not there) while a shutdown
    arrives: the fragment that could not go out must not be counted in steps_sent nor
    claimed by the bye's last_seq, or the learner waits for a fragment that never comes."""
    fake = FakeLearner(ctx, learner_port, bind_pull=False)
    client, routing_id = registered_client(ctx, fake, fragment_length=1)
    fake.send(routing_id, Shutdown(reason="stop", run_id=RUN_ID))
    calls = 0
    while not client.shutdown_requested:
        assert calls < 20_000, "PUSH never reached its high-water mark"
        client.send_fragment(
            0,
            stub_rows(calls, 1),
            np.array([0]),
            [1.0],
            [False],
            [False],
            [0.0],
            [0.0],
            stub_rows(calls + 1, 1)[0],
        )
        calls += 1
    sent = client.stats["steps_sent"]
    assert sent >= calls - 1
    # The queued fragments are delivered once the learner's PULL exists: exactly `sent`.
    fake.pull.bind(f"tcp://127.0.0.1:{learner_port + 1}")
    client.close()
    _, bye = fake.recv_control(Bye)
    assert bye.stats["steps_sent"] == sent
    assert bye.last_seq == sent - 1
    seqs = [fake.recv_fragment().seq for _ in range(int(sent))]
    assert seqs == list(range(int(sent)))
    assert not fake.pull.poll(200)


def test_send_fragment_names_its_arrays_when_called_wrong(ctx):
    """send_fragment takes step()'s arrays positionally or by name; a missing or
    unknown one is a TypeError that lists them, before anything is sent."""
    client = ActorClient(
        "127.0.0.1:1", env_id=STUB_ENV_ID, observation_space=None, action_space=None, context=ctx
    )
    rows = dict(
        obs=stub_rows(0, 2),
        actions=np.array([0, 1]),
        rewards=[1.0, 1.0],
        terminated=[False, False],
        truncated=[False, False],
        values=[0.5, 0.5],
    )
    for kwargs in (rows, {**rows, "log_probs": [0.0, 0.0], "next_obs": stub_rows(2, 1)[0], "x": 1}):
        with pytest.raises(TypeError, match="obs, actions, rewards, .*log_probs, next_obs"):
            client.send_fragment(0, **kwargs)
    with pytest.raises(RuntimeError, match="register"):  # the right arrays, by name
        client.send_fragment(0, **rows, log_probs=[0.0, 0.0], next_obs=stub_rows(2, 1)[0])
    client.close()


def test_what_the_old_registration_queued_never_reaches_the_learner_of_the_new_one(
    ctx, learner_port
):
    """Issue 45 G9: told to register again (a learner restarted on the same ports), the
    client closes its PUSH with linger 0 before its new hello: the fragments it had
    queued for the old learner (whose PULL is gone) can only be refused and must not
    flow to the new PULL while it waits for its welcome (before, the PUSH lingered
    until the welcome and reconnected to it)."""
    fake = FakeLearner(ctx, learner_port, bind_pull=False)  # the old learner's PULL: gone
    client, routing_id = registered_client(ctx, fake)
    for start in range(0, 18, 6):  # queued in PUSH: nothing takes them
        rows = stub_rows(start, 6)
        client.send_fragment(
            0, rows, np.zeros(6, np.int64), np.ones(6, np.float32), np.zeros(6, bool),
            np.zeros(6, bool), np.zeros(6, np.float32), np.zeros(6, np.float32), rows[-1],
        )  # fmt: skip
    fake.send(routing_id, Refuse("reregister", "the learner restarted"))

    def register_again() -> None:  # as an actor's loop: poll until registered again
        deadline = time.monotonic() + TIMEOUT
        while client.registrations < 2 and time.monotonic() < deadline:
            client.wait_for_weights(0.05)  # (blocks in register() once the refuse is read)

    again = Background(register_again)
    routing_id, _ = fake.recv_control(Hello)
    fake.pull.bind(f"tcp://127.0.0.1:{learner_port + 1}")  # the new learner's PULL
    stale = fake.pull.poll(3000)  # (the PUSH reconnects within its 2 s backoff)
    fake.welcome(routing_id, 0, weights_of(make_policy(0), 0))
    again.join()
    assert again.error is None, repr(again.error)
    assert not stale, decode(fake.pull.recv())
    client.close()
