"""Helpers shared by the socket tests: a small learner config on the stub env, threads,
and (for the hostile-peer tests, ``tests/test_hostile_*.py``) raw sockets, hand-made
messages, a registered raw peer and the base of the fuzzers."""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq

from tests.stub_env import StubEnv
from zmq_rl.actor.client import ActorClient
from zmq_rl.actor.gym_actor import GymActor
from zmq_rl.config import ActorConfig, LearnerConfig, PolicyConfig
from zmq_rl.wire.protocol import (
    PROTOCOL_VERSION,
    Bye,
    Fragment,
    Hello,
    Message,
    Shutdown,
    Welcome,
    decode,
    encode,
    space_spec,
)

STUB_ENV_ID = "tests.stub_env:Stub-v0"
JOIN_TIMEOUT = 30.0
STARVATION_TIMEOUT = 30.0
TIMEOUT = 30.0
NO_TOKEN = bytes(16)
"""A session token no registration has (learners hand out random ones)."""
"""Bound of every wait in the hostile tests (a send, an answer, a condition)."""
STUB_POLICY = PolicyConfig(hidden_sizes=(8,), ortho_init=False)
OBS_SPACE, ACT_SPACE = StubEnv.observation_space, StubEnv.action_space


def stub_learner_config(port: int, **changes: Any) -> LearnerConfig:
    """A small learner on the stub env, bound at ``port``: one actor with one slot,
    8-step rollouts sent as one fragment, 10 updates, a one-episode evaluation, seed 0,
    no periodic checkpoints. ``changes`` override any field."""
    base: dict[str, Any] = dict(
        env_id=STUB_ENV_ID,
        port=port,
        num_actors=1,
        num_envs=1,
        num_steps=8,
        fragment_length=8,
        total_env_steps=8 * 10,
        eval_episodes=1,
        seed=0,
        starvation_timeout=STARVATION_TIMEOUT,
        checkpoint_every=0,
    )
    return LearnerConfig(**{**base, **changes})


class Background:
    """Run ``fn`` in a daemon thread; keep its result or exception (``error``)."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None

        def target() -> None:
            try:
                self.result = fn()
            except BaseException as exc:  # noqa: BLE001 - inspected by the test
                self.error = exc

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()

    def alive(self) -> bool:
        return self.thread.is_alive()

    def join(self, timeout: float = JOIN_TIMEOUT) -> Any:
        """Wait (bounded) for the thread; fail if it is still running."""
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"thread still running after {timeout}s"
        return self.result


class CheckedBackground(Background):
    """A :class:`Background` whose ``join`` re-raises the thread's exception."""

    def join(self, timeout: float = JOIN_TIMEOUT) -> Any:
        result = super().join(timeout)
        if self.error is not None:
            raise self.error
        return result


# ----------------------------------------------------------------------------- hostile peers


def gym_actor(ctx: zmq.Context, port: int, **changes: Any) -> CheckedBackground:
    """The built-in actor on the stub env (unless ``env_id`` says otherwise), running
    in a thread against the learner at ``port``; ``changes`` override its config."""
    config = ActorConfig(
        **{
            "learner": f"127.0.0.1:{port}",
            "env_id": STUB_ENV_ID,
            "register_timeout": TIMEOUT,
            **changes,
        }
    )
    return CheckedBackground(lambda: GymActor(config, context=ctx).run())


def stub_client(ctx: zmq.Context, port: int, register_timeout: float) -> ActorClient:
    """An ActorClient on the stub env's spaces for the learner at ``port`` (not registered)."""
    return ActorClient(
        f"127.0.0.1:{port}",
        env_id=STUB_ENV_ID,
        observation_space=OBS_SPACE,
        action_space=ACT_SPACE,
        context=ctx,
        register_timeout=register_timeout,
    )


def register_while_pumping(learner: Any, client: ActorClient, timeout: float) -> None:
    """Register ``client`` in a background thread while ``learner`` (not running its
    loop) pumps its sockets; bounded by ``timeout``, a failed registration raises."""
    registering = CheckedBackground(client.register)
    deadline = time.monotonic() + timeout
    while registering.alive() and time.monotonic() < deadline:
        learner.pump(10)
    registering.join()


def pack(body: Any) -> bytes:
    return msgpack.packb(body, use_bin_type=True)


def body_of(message: Message) -> dict[str, Any]:
    """The msgpack map ``encode(message)`` would send, as a mutable dict."""
    body = message.to_map()
    body["proto"] = PROTOCOL_VERSION
    body["type"] = message.TYPE
    return body


def total(counter: Counter | dict, prefix: str) -> int:
    """Sum of the counters whose key starts with ``prefix``; safe while another thread
    adds keys (``dict(counter)`` copies in one step under the GIL)."""
    return sum(v for k, v in dict(counter).items() if k.startswith(prefix))


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` (every 2 ms) until it holds; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.002)


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, poll: float = 0.1) -> Any:
    """Poll ``predicate`` until it returns something truthy and return that (bounded:
    TimeoutError naming ``what`` after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise TimeoutError(f"no {what} within {timeout:g}s")


def raw_socket(ctx: zmq.Context, kind: int, endpoint: str) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDTIMEO, int(TIMEOUT * 1000))
    sock.connect(endpoint)
    return sock


def recv_message(sock: zmq.Socket, timeout: float = 5.0) -> Message:
    assert sock.poll(int(timeout * 1000)), f"no answer within {timeout}s"
    return decode(sock.recv())


def stub_hello(**changes: Any) -> Hello:
    fields = dict(
        actor_id=-1,
        env_id=STUB_ENV_ID,
        observation_space=space_spec(OBS_SPACE),
        action_space=space_spec(ACT_SPACE),
        num_envs=1,
        host="test",
        pid=1,
    )
    fields.update(changes)
    return Hello(**fields)


def cartpole_fragment(
    rng: np.random.Generator,
    run_id: str,
    actor_id: int = 0,
    slot: int = 0,
    seq: int = 0,
    length: int = 4,
    **changes: Any,
) -> Fragment:
    """A well-formed CartPole-v1 fragment (decodes and passes the learner's checks)."""
    fields = dict(
        actor_id=actor_id,
        version=0,
        seq=seq,
        run_id=run_id,
        token=NO_TOKEN,
        obs=rng.uniform(-0.05, 0.05, (length, 4)).astype(np.float32),
        actions=rng.integers(0, 2, length).astype(np.int64),
        rewards=np.ones(length, np.float32),
        terminated=np.zeros(length, bool),
        truncated=np.zeros(length, bool),
        values=rng.standard_normal(length).astype(np.float32),
        log_probs=np.full(length, -0.69, np.float32),
        next_obs=rng.uniform(-0.05, 0.05, 4).astype(np.float32),
    )
    fields.update(changes)
    return Fragment.for_slot(slot, **fields)


def huge_length_headers(r: random.Random) -> bytes:
    """msgpack headers that declare ~4 GB (bin/str/array/map 32) but carry a few bytes."""
    return r.choice(
        [
            b"\xc6\xff\xff\xff\xff" + b"abc",  # bin 32
            b"\xdb\xff\xff\xff\xff" + b"abc",  # str 32
            b"\xdd\xff\xff\xff\xff" + b"\x01",  # array 32
            b"\xdf\xff\xff\xff\xff" + b"\xa1a\x01",  # map 32
            b"\x82\xa5proto\x01\xa4type\xc6\x7f\xff\xff\xff",  # a field claiming 2 GB
        ]
    )


class Fuzzer:
    """Base of the fuzzers: malformed messages for one receiving socket, one class at a
    time. A subclass names its classes (methods returning the parts of one message) in
    :attr:`CLASSES`, the values its ``not_a_map`` packs in :attr:`NOT_MAPS`, and may
    check what it made in :meth:`check`."""

    CLASSES: tuple[str, ...] = ()
    NOT_MAPS: tuple[Any, ...] = ()

    def __init__(self, seed: int) -> None:
        self.r = random.Random(seed)
        self.rng = np.random.default_rng(seed)

    def random_bytes(self) -> list[bytes]:
        return [self.rng.bytes(self.r.randint(0, 300))]

    def not_a_map(self) -> list[bytes]:
        return [pack(self.r.choice(self.NOT_MAPS))]

    def cut(self, frame: bytes) -> list[bytes]:
        """``frame`` cut short at a random byte (at least one byte kept, one cut)."""
        return [frame[: self.r.randint(1, len(frame) - 1)]]

    def set_one(self, body: dict[str, Any], key: str, values: Sequence[Any]) -> list[bytes]:
        """``body`` with ``key`` set to one of ``values``, packed."""
        body[key] = self.r.choice(values)
        return [pack(body)]

    def huge_length(self) -> list[bytes]:
        return [huge_length_headers(self.r)]

    def one_of(self, messages: Sequence[Message]) -> list[bytes]:
        """One of ``messages``, encoded (valid, but not for this socket)."""
        return [encode(self.r.choice(messages))]

    def several(
        self, makers: Sequence[Callable[[], list[bytes]]], low: int, high: int
    ) -> list[bytes]:
        """The first part of each of ``low`` to ``high`` messages of the classes ``makers``."""
        return [self.r.choice(makers)()[0] for _ in range(self.r.randint(low, high))]

    def check(self, name: str, parts: list[bytes]) -> None:
        """What the parts of class ``name`` must be (nothing, unless a subclass says)."""

    def generate(self, index: int) -> tuple[str, list[bytes]]:
        name = self.CLASSES[index % len(self.CLASSES)]
        parts = getattr(self, name)()
        self.check(name, parts)
        return name, parts


class RegisteredPeer:
    """A raw DEALER + PUSH that registers properly (by default on the stub env, one
    slot; or with ``hello``) and then sends whatever fragments a test makes; it
    answers Shutdown with a bye."""

    def __init__(self, ctx: zmq.Context, port: int, hello: Hello | None = None) -> None:
        self.dealer = raw_socket(ctx, zmq.DEALER, f"tcp://127.0.0.1:{port}")
        self.push = raw_socket(ctx, zmq.PUSH, f"tcp://127.0.0.1:{port + 1}")
        self.dealer.send(encode(hello or stub_hello()))
        welcome = recv_message(self.dealer, TIMEOUT)
        assert isinstance(welcome, Welcome), welcome
        self.actor_id, self.run_id = welcome.actor_id, welcome.run_id
        self.token = welcome.token
        self.seq = 0
        self.rng = np.random.default_rng(0)
        self.said_bye = False

    def fragment(self, length: int, **changes: Any) -> Fragment:
        t = (np.arange(self.seq * length, (self.seq + 1) * length) % 5).astype(np.float32)
        fields = dict(
            actor_id=self.actor_id,
            version=0,
            seq=self.seq,
            run_id=self.run_id,
            token=self.token,
            obs=np.stack([t, t], axis=1),
            actions=self.rng.integers(0, 2, length),
            rewards=np.ones(length, np.float32),
            terminated=(t == 4),
            truncated=np.zeros(length, bool),
            values=np.zeros(length, np.float32),
            log_probs=np.full(length, -0.69, np.float32),
            next_obs=np.full(2, (t[-1] + 1) % 5, np.float32),
        )
        fields.update(changes)
        self.seq += 1
        return Fragment.for_slot(0, **fields)

    def send(self, fragment: Fragment) -> None:
        self.push.send(encode(fragment))

    def serve_control(self) -> None:
        """Answer a Shutdown with a bye (heartbeats are read and dropped)."""
        while self.dealer.poll(0):
            message = decode(self.dealer.recv())
            if isinstance(message, Shutdown) and not self.said_bye:
                bye = Bye(actor_id=self.actor_id, token=self.token, stats={}, last_seq=self.seq - 1)
                self.dealer.send(encode(bye))
                self.said_bye = True

    def close(self) -> None:
        self.dealer.close()
        self.push.close()


@dataclasses.dataclass
class SlotRows:
    """One column of a v2 fragment as ``[T]`` rows (what a v1 fragment of one slot was):
    the tests of single-slot actors read these."""

    actor_id: int
    slot: int
    seq: int
    version: int
    run_id: str
    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    values: np.ndarray
    log_probs: np.ndarray
    next_obs: np.ndarray
    final_obs_index: np.ndarray
    final_obs: np.ndarray
    state: np.ndarray | None

    @property
    def length(self) -> int:
        return int(self.rewards.shape[0])


def slot_rows(fragment: Fragment, column: int = 0) -> SlotRows:
    """Column ``column`` of ``fragment`` as :class:`SlotRows` (final rows by row number)."""
    width = fragment.num_slots
    rows, cols = np.divmod(fragment.final_obs_index.astype(np.int64), width)
    mine = cols == column
    return SlotRows(
        actor_id=fragment.actor_id,
        slot=int(fragment.slots[column]),
        seq=fragment.seq,
        version=fragment.version,
        run_id=fragment.run_id,
        **{name: getattr(fragment, name)[:, column] for name in Fragment.STEP_FIELDS},
        next_obs=fragment.next_obs[column],
        final_obs_index=rows[mine],
        final_obs=fragment.final_obs[mine],
        state=None if fragment.state is None else fragment.state[column],
    )


def zmq_rl_command(*args: str, cwd: Any, timeout: float = 180.0) -> Any:
    """``python -m zmq_rl ARGS`` run in ``cwd`` with this checkout first on the path;
    the completed process (its output captured as text)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    return subprocess.run(
        [sys.executable, "-m", "zmq_rl", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class FakeLearnerSockets:
    """A fake learner's sockets, bound by a test on 127.0.0.1: ROUTER on ``port``, PULL
    on ``port + 1`` (unless ``bind_pull`` is False), XPUB (a PUB that reports
    subscriptions) on ``port + 2``; linger 0. Enough of a learner to welcome a real
    actor, send it whatever a test wants and read what it sends."""

    def __init__(self, ctx: zmq.Context, port: int, bind_pull: bool = True) -> None:
        self.port = port
        self.router = ctx.socket(zmq.ROUTER)
        self.pull = ctx.socket(zmq.PULL)
        self.pub = ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.XPUB_VERBOSE, 1)
        for sock in (self.router, self.pull, self.pub):
            sock.setsockopt(zmq.LINGER, 0)
        self.router.bind(f"tcp://127.0.0.1:{port}")
        if bind_pull:
            self.pull.bind(f"tcp://127.0.0.1:{port + 1}")
        self.pub.bind(f"tcp://127.0.0.1:{port + 2}")
