"""CURVE: only authorised actors get anything in or out of a learner.

Keys are made with pyzmq's ``zmq.auth.create_certificates`` (what ``zmq-rl keys``
writes): ``NAME.key`` (public) and ``NAME.key_secret`` (both halves). The learner gets
its secret certificate and a folder holding the authorised actors' public ones; an
actor gets its secret certificate and the learner's public one.

Checked: an authorised actor trains normally; a stranger (a key not in the folder) is
refused with ``LearnerRefused(code="auth_failed")`` in well under 5 s and gets nothing
through any socket -- not a registration on ROUTER, not a fragment on PULL (even one
forged to look like the authorised actor's), not a weights blob from PUB -- while the
authorised actor's traffic flows; a plain-tcp actor and an actor holding the wrong
learner key are refused as fast, with messages that say what is wrong; and the config
errors name the field or the file.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq
import zmq.auth

from tests.conftest import STUB_ENV_ID
from tests.helpers import CheckedBackground as Background
from tests.helpers import stub_learner_config
from tests.stub_env import StubEnv
from zmq_rl.actor.client import ActorClient, LearnerRefused
from zmq_rl.actor.gym_actor import GymActor, curve_client_keys
from zmq_rl.config import ActorConfig, ConfigError, LearnerConfig, PolicyConfig, PPOConfig
from zmq_rl.learner.loop import Learner
from zmq_rl.wire.protocol import (
    Bye,
    Fragment,
    Hello,
    Shutdown,
    Welcome,
    decode,
    encode,
    space_spec,
)
from zmq_rl.wire.transport import CurveClientKeys

TIMEOUT = 30.0
REFUSED_WITHIN_S = 5.0
TINY = PolicyConfig(hidden_sizes=(8,))
OBS_SPACE, ACT_SPACE = StubEnv.observation_space, StubEnv.action_space


@dataclass(frozen=True)
class Keys:
    """Certificate files: the learner's, an authorised actor's, a stranger's, and the
    folder of authorised public keys (holding only the actor's)."""

    learner_public: str
    learner_secret: str
    actor_public: str
    actor_secret: str
    stranger_public: str
    stranger_secret: str
    impostor_public: str  # a second key pair posing as the learner
    impostor_secret: str
    authorized: str


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    made = {}
    for name in ("learner", "actor", "stranger", "impostor"):
        folder = tmp_path / name
        folder.mkdir()
        made[name] = zmq.auth.create_certificates(str(folder), name)
    authorized = tmp_path / "authorized"
    authorized.mkdir()
    shutil.copy(made["actor"][0], authorized)
    return Keys(
        *made["learner"],
        *made["actor"],
        *made["stranger"],
        *made["impostor"],
        authorized=str(authorized),
    )


def learner_config(port: int, keys: Keys | None, **changes: Any) -> LearnerConfig:
    base: dict[str, Any] = dict(fragment_length=4, total_env_steps=8 * 60)
    if keys is not None:
        base.update(curve_secret_key=keys.learner_secret, curve_authorized_keys=keys.authorized)
    return stub_learner_config(port, **{**base, **changes})


def actor_config(port: int, secret: str = "", server: str = "", **changes: Any) -> ActorConfig:
    return ActorConfig(
        learner=f"127.0.0.1:{port}",
        env_id=STUB_ENV_ID,
        register_timeout=TIMEOUT,
        curve_secret_key=secret,
        curve_server_key=server,
        **changes,
    )


def refused(ctx: zmq.Context, cfg: ActorConfig) -> tuple[LearnerRefused, float]:
    """Run a GymActor that must be refused; (the refusal, seconds it took)."""
    start = time.monotonic()
    with pytest.raises(LearnerRefused) as info:
        GymActor(cfg, context=ctx).run()
    return info.value, time.monotonic() - start


def raw_curve_socket(
    ctx: zmq.Context, kind: int, endpoint: str, secret_file: str | None, server_file: str
) -> zmq.Socket:
    """A raw socket; a CURVE client with the keys of ``secret_file`` (plain when None)."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    if secret_file is not None:
        public, secret = zmq.auth.load_certificate(secret_file)
        server, _ = zmq.auth.load_certificate(server_file)
        sock.curve_secretkey, sock.curve_publickey, sock.curve_serverkey = secret, public, server
    sock.connect(endpoint)
    return sock


def forged_fragment(run_id: str, seq: int, token: bytes = bytes(16)) -> bytes:
    """A fragment the learner would accept from the authorised actor 0: right run id,
    registered actor id, a sequence number ahead of the real one (and, given
    ``token``, its session token: the worst case, an insider who learned it)."""
    t = np.zeros((4, 2), np.float32)
    return encode(
        Fragment.for_slot(
            0,
            actor_id=0,
            token=token,
            version=0,
            seq=seq,
            run_id=run_id,
            obs=t,
            actions=np.zeros(4, np.int64),
            rewards=np.full(4, 1e3, np.float32),
            terminated=np.zeros(4, bool),
            truncated=np.zeros(4, bool),
            values=np.zeros(4, np.float32),
            log_probs=np.full(4, -0.69, np.float32),
            next_obs=np.zeros(2, np.float32),
        )
    )


def test_authorised_actor_trains_and_a_stranger_gets_nothing_through(ctx, learner_port, keys):
    """With CURVE on, the authorised actor trains the whole budget. A stranger's
    GymActor is refused with auth_failed in < 5 s; then, for as long as the run lasts,
    the stranger's raw DEALER says hello, its raw PUSH sends fragments forged as the
    authorised actor's (so any leak would show in the counters), a plain-tcp PUSH does
    the same, and the stranger's raw SUB listens on the weights port. Nothing gets
    through: one registration, ``received/fragments`` equal to what the authorised
    actor sent, no reject at all (nothing foreign even reached a decoder), and no
    weights on the stranger's SUB while the learner published and the authorised actor
    received updates."""
    cfg = learner_config(learner_port, keys, total_env_steps=8 * 300)
    learner = Learner(cfg, PPOConfig(num_epochs=1), TINY, context=ctx)
    try:
        run = Background(learner.run)
        refusal, elapsed = refused(
            ctx, actor_config(learner_port, keys.stranger_secret, keys.learner_public)
        )

        control = f"tcp://127.0.0.1:{learner_port}"
        experience = f"tcp://127.0.0.1:{cfg.experience_port()}"
        weights = f"tcp://127.0.0.1:{cfg.weights_port()}"
        sub = raw_curve_socket(ctx, zmq.SUB, weights, keys.stranger_secret, keys.learner_public)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        # The control: the same raw SUB with the authorised key does receive weights.
        authorised_sub = raw_curve_socket(
            ctx, zmq.SUB, weights, keys.actor_secret, keys.learner_public
        )
        authorised_sub.setsockopt(zmq.SUBSCRIBE, b"")
        push = raw_curve_socket(
            ctx, zmq.PUSH, experience, keys.stranger_secret, keys.learner_public
        )
        plain_push = raw_curve_socket(ctx, zmq.PUSH, experience, None, keys.learner_public)
        dealer = raw_curve_socket(
            ctx, zmq.DEALER, control, keys.stranger_secret, keys.learner_public
        )
        hello = encode(
            Hello(
                actor_id=-1,
                env_id=STUB_ENV_ID,
                observation_space=space_spec(OBS_SPACE),
                action_space=space_spec(ACT_SPACE),
                num_envs=1,
                host="stranger",
            )
        )
        broadcasts_before = learner.report.broadcasts_sent
        actor = Background(
            lambda: GymActor(
                actor_config(learner_port, keys.actor_secret, keys.learner_public), context=ctx
            ).run()
        )
        tries: dict[str, int] = {"hello": 0, "fragment": 0, "plain_fragment": 0}
        received_on_sub = received_authorised = 0
        seq = 10**6
        while run.alive():
            for name, sock, frame in (
                ("hello", dealer, hello),
                ("fragment", push, forged_fragment(learner.run_id, seq)),
                ("plain_fragment", plain_push, forged_fragment(learner.run_id, seq)),
            ):
                with contextlib.suppress(zmq.Again):  # no connection to queue on
                    sock.send(frame, zmq.NOBLOCK)
                tries[name] += 1
            seq += 1
            if sub.poll(10):  # also paces this loop
                sub.recv()
                received_on_sub += 1
            while authorised_sub.poll(0):
                authorised_sub.recv()
                received_authorised += 1
        broadcasts = learner.report.broadcasts_sent - broadcasts_before
        report = run.join()
        stats = actor.join()
        for sock in (sub, authorised_sub, push, plain_push, dealer):
            sock.close()
    finally:
        learner.close()

    counters = report.counters
    print(f"\nstranger refused in {elapsed * 1000:.0f} ms: {refusal}")
    print(
        f"stranger tries during the run: {tries}; weights received on its SUB: "
        f"{received_on_sub} of {broadcasts} broadcasts (an authorised raw SUB: "
        f"{received_authorised}); learner counters: {counters}"
    )
    assert refusal.code == "auth_failed" and elapsed < REFUSED_WITHIN_S
    assert "CURVE key" in str(refusal)
    # The authorised actor trained the whole budget.
    assert report.stop_reason == "budget spent"
    assert report.env_steps_consumed == cfg.total_env_steps
    assert list(report.actor_stats) == ["0"]
    summary = report.actor_stats["0"]
    assert summary["steps_consumed"] == cfg.total_env_steps
    assert summary["steps_received"] == stats["steps_sent"] == summary["actor/steps_sent"]
    # Nothing of the stranger's got in...
    assert min(tries.values()) >= 20
    assert counters["registered"] == 1
    assert counters["received/fragments"] == stats["fragments_sent"]
    assert not [k for k in counters if k.startswith(("rejected/", "refused/"))], counters
    assert "experience/seq_gaps" not in counters
    # ...nor out: weights flowed to the authorised actor, none to the stranger.
    assert broadcasts > 0 and stats["policy_updates_received"] > 0
    assert received_authorised > 0
    assert received_on_sub == 0


@pytest.fixture
def curve_learner(ctx, learner_port, keys):
    """A CURVE learner, bound but not running: the handshake (and ZAP's verdict) needs
    no learner loop, so refusals are tested without one."""
    learner = Learner(
        learner_config(learner_port, keys), PPOConfig(num_epochs=1), TINY, context=ctx
    )
    yield learner
    learner.close()


def test_plain_tcp_actor_is_refused_quickly_with_a_clear_message(ctx, learner_port, curve_learner):
    refusal, elapsed = refused(ctx, actor_config(learner_port))
    print(f"\nplain-tcp actor refused in {elapsed * 1000:.0f} ms: {refusal}")
    assert refusal.code == "auth_failed" and elapsed < REFUSED_WITHIN_S
    assert "CURVE" in str(refusal) and "security mismatch" in str(refusal)


def test_actor_holding_the_wrong_learner_key_is_refused_quickly(
    ctx, learner_port, keys, curve_learner
):
    """An authorised actor that was given another key as the learner's (an impostor's)
    never talks to the real learner."""
    refusal, elapsed = refused(
        ctx, actor_config(learner_port, keys.actor_secret, keys.impostor_public)
    )
    print(f"\nwrong learner key refused in {elapsed * 1000:.0f} ms: {refusal}")
    assert refusal.code == "auth_failed" and elapsed < REFUSED_WITHIN_S
    assert "learner" in str(refusal) and "key" in str(refusal)


def test_curve_actor_against_a_plain_tcp_learner_is_refused_quickly(ctx, learner_port, keys):
    """The other way round: an actor that insists on CURVE does not fall back to
    plain tcp when the learner has no keys."""
    learner = Learner(
        learner_config(learner_port, None), PPOConfig(num_epochs=1), TINY, context=ctx
    )
    try:
        refusal, elapsed = refused(
            ctx, actor_config(learner_port, keys.actor_secret, keys.learner_public)
        )
    finally:
        learner.close()
    print(f"\nCURVE actor vs plain learner refused in {elapsed * 1000:.0f} ms: {refusal}")
    assert refusal.code == "auth_failed" and elapsed < REFUSED_WITHIN_S
    assert "security mismatch" in str(refusal)


def test_embedding_client_with_curve_keys_trains(ctx, learner_port, keys):
    """The ActorClient API takes the same keys (CurveClientKeys) as the built-in actor
    (curve_client_keys): an embedding simulator registers and is welcomed."""
    learner = Learner(
        learner_config(learner_port, keys), PPOConfig(num_epochs=1), TINY, context=ctx
    )
    try:
        run = Background(learner.run)
        curve = curve_client_keys(
            actor_config(learner_port, keys.actor_secret, keys.learner_public)
        )
        assert isinstance(curve, CurveClientKeys)
        client = ActorClient(
            f"127.0.0.1:{learner_port}",
            env_id=STUB_ENV_ID,
            observation_space=OBS_SPACE,
            action_space=ACT_SPACE,
            context=ctx,
            register_timeout=10.0,
            curve=curve,
        )
        welcome = client.register()
        assert welcome.run_id == learner.run_id
        client.close()
        learner.request_stop("test over")
        report = run.join()
    finally:
        learner.close()
    assert report.counters["registered"] == 1


# ----------------------------------------------------------------------------- config errors


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"curve_secret_key": "learner.key_secret"}, "curve_authorized_keys"),
        ({"curve_authorized_keys": "authorized"}, "curve_secret_key"),
    ],
)
def test_learner_curve_settings_go_together(changes, field):
    with pytest.raises(ConfigError) as info:
        LearnerConfig(**changes).validate()
    assert info.value.field == field and field in str(info.value)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"curve_secret_key": "actor.key_secret"}, "curve_server_key"),
        ({"curve_server_key": "learner.key"}, "curve_secret_key"),
    ],
)
def test_actor_curve_settings_go_together(changes, field):
    with pytest.raises(ConfigError) as info:
        ActorConfig(**changes).validate()
    assert info.value.field == field and field in str(info.value)


def test_learner_certificate_errors_name_the_field_and_the_path(ctx, learner_port, keys, tmp_path):
    missing = str(tmp_path / "nowhere" / "learner.key_secret")
    cases = [
        (missing, keys.authorized, ["curve_secret_key", missing]),
        (
            keys.learner_public,
            keys.authorized,  # the public half has no secret key
            ["curve_secret_key", keys.learner_public, "secret"],
        ),
        (
            keys.learner_secret,
            str(tmp_path / "no-such-dir"),
            ["curve_authorized_keys", str(tmp_path / "no-such-dir")],
        ),
    ]
    for secret, authorized, words in cases:
        cfg = learner_config(
            learner_port, None, curve_secret_key=secret, curve_authorized_keys=authorized
        )
        with pytest.raises(ValueError) as info:
            Learner(cfg, context=ctx)
        for word in words:
            assert word in str(info.value), (word, str(info.value))
    # Nothing stays bound after the failures: a correct learner takes the ports.
    Learner(learner_config(learner_port, keys), context=ctx).close()


def test_actor_certificate_errors_name_the_field_and_the_path(keys, tmp_path):
    missing = str(tmp_path / "actor.key_secret")
    with pytest.raises(ValueError) as info:
        curve_client_keys(
            ActorConfig(curve_secret_key=missing, curve_server_key=keys.learner_public)
        )
    assert "curve_secret_key" in str(info.value) and missing in str(info.value)
    missing_server = str(tmp_path / "learner.key")
    with pytest.raises(ValueError) as info:
        curve_client_keys(
            ActorConfig(curve_secret_key=keys.actor_secret, curve_server_key=missing_server)
        )
    assert "curve_server_key" in str(info.value) and missing_server in str(info.value)


def test_authorised_peer_cannot_push_fragments_as_another_actor(ctx, learner_port, keys, tmp_path):
    """Two authorised keys. ``actor`` registers (raw DEALER) as actor 0 and pushes its
    fragment seq 0; ``insider`` pushes a fragment forged as actor 0's seq 1; then actor 0
    pushes its real seq 1. The learner must take actor 0's fragments only from the key
    that registered actor 0: the forged one is rejected, the real seq 1 is received."""
    insider_dir = tmp_path / "insider"
    insider_dir.mkdir()
    insider_public, insider_secret = zmq.auth.create_certificates(str(insider_dir), "insider")
    shutil.copy(insider_public, keys.authorized)
    cfg = learner_config(learner_port, keys)
    learner = Learner(cfg, PPOConfig(num_epochs=1), TINY, context=ctx)
    experience = f"tcp://127.0.0.1:{cfg.experience_port()}"
    try:
        run = Background(learner.run)
        dealer = raw_curve_socket(
            ctx,
            zmq.DEALER,
            f"tcp://127.0.0.1:{learner_port}",
            keys.actor_secret,
            keys.learner_public,
        )
        dealer.send(
            encode(
                Hello(
                    actor_id=-1,
                    env_id=STUB_ENV_ID,
                    observation_space=space_spec(OBS_SPACE),
                    action_space=space_spec(ACT_SPACE),
                    num_envs=1,
                )
            )
        )
        assert dealer.poll(10_000), "no welcome"
        welcome = decode(dealer.recv())
        assert isinstance(welcome, Welcome) and welcome.actor_id == 0
        victim = raw_curve_socket(ctx, zmq.PUSH, experience, keys.actor_secret, keys.learner_public)
        insider = raw_curve_socket(ctx, zmq.PUSH, experience, insider_secret, keys.learner_public)

        def handled(n: int) -> bool:
            counters = dict(learner.counters)
            done = counters.get("received/fragments", 0) + sum(
                v for k, v in counters.items() if k.startswith("rejected/")
            )
            return done >= n

        for n, (sock, seq) in enumerate([(victim, 0), (insider, 1), (victim, 1)], start=1):
            sock.send(forged_fragment(learner.run_id, seq, welcome.token))
            deadline = time.monotonic() + 10.0
            while not handled(n):
                assert time.monotonic() < deadline, f"fragment {n} never handled"
                sock.poll(5, zmq.POLLOUT)  # a bounded wait between checks
        counters = dict(learner.counters)
        learner.request_stop("test over")
        deadline = time.monotonic() + 10.0
        while not isinstance(decode(dealer.recv()) if dealer.poll(100) else None, Shutdown):
            assert time.monotonic() < deadline, "no shutdown"
        dealer.send(encode(Bye(actor_id=0, token=welcome.token, stats={}, last_seq=1)))
        run.join()
        for sock in (dealer, victim, insider):
            sock.close()
    finally:
        learner.close()
    print(f"\ninsider forgery: learner counters {counters}")
    assert counters.get("rejected/experience/old_seq", 0) == 0, "actor 0's real seq 1 dropped"
    assert counters["received/fragments"] == 2
    assert sum(v for k, v in counters.items() if k.startswith("rejected/")) == 1


@pytest.mark.parametrize("command", ["learner", "actor"])
def test_public_key_file_given_as_secret_key_is_one_error_line_exit_2(command, keys, learner_port):
    """The classic mistake (the ``.key`` file where the ``.key_secret`` belongs) is one
    ``error:`` line naming the flag's field and the file, exit 2, no traceback."""
    import subprocess
    import sys

    if command == "learner":
        argv = ["-m", "zmq_rl.cli.learner", "--env-id", "CartPole-v1", "--port", str(learner_port)]
        argv += ["--curve-secret-key", keys.learner_public]
        argv += ["--curve-authorized-keys", keys.authorized, "--no-tensorboard"]
        public = keys.learner_public
    else:
        argv = ["-m", "zmq_rl.cli.actor", "--learner", f"127.0.0.1:{learner_port}"]
        argv += ["--curve-secret-key", keys.actor_public]
        argv += ["--curve-server-key", keys.learner_public]
        public = keys.actor_public
    proc = subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, timeout=60, check=False
    )
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(errors) == 1 and "curve_secret_key" in errors[0] and public in errors[0], errors


def test_failed_handshakes_are_logged_with_the_peer_address_rate_limited(
    ctx, learner_port, keys, curve_learner, caplog
):
    """A stranger's key (ZAP refuses it) leaves a line naming 127.0.0.1, the socket and
    the reason; 10 more strangers from the same host, a plain-tcp peer and a client
    holding the wrong learner key are counted but add at most one line (one per host
    per HANDSHAKE_LOG_EVERY_S; a local peer whose handshake fails within a millisecond
    is logged as host "unknown", libzmq having closed it before its address was read)."""
    import logging

    from zmq_rl.wire.transport import HANDSHAKE_LOG_EVERY_S

    assert HANDSHAKE_LOG_EVERY_S >= 5
    caplog.set_level(logging.WARNING, logger="zmq_rl.transport")
    control = f"tcp://127.0.0.1:{learner_port}"
    watch = curve_learner.ingest.sockets.handshakes
    peers = []

    def failures() -> int:
        return sum(watch.failures.values())

    def wait_for(key_refused: int, bad_handshake: int = 0) -> None:
        def done() -> bool:
            got = watch.failures
            return (
                got.get("key_refused", 0) >= key_refused
                and got.get("bad_handshake", 0) >= bad_handshake
            )

        deadline = time.monotonic() + 10
        while not done() and time.monotonic() < deadline:
            curve_learner.pump(20)
        assert done(), watch.failures

    peers.append(
        raw_curve_socket(ctx, zmq.DEALER, control, keys.stranger_secret, keys.learner_public)
    )
    wait_for(1)
    lines = [r.getMessage() for r in caplog.records if "refused a connection" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "from 127.0.0.1" in lines[0] and "not authorised" in lines[0], lines
    assert str(zmq.auth.load_certificate(keys.stranger_public)[0].decode()) in lines[0]
    # More failures from the same host within the interval: counted, not logged.
    for _ in range(10):
        peers.append(
            raw_curve_socket(ctx, zmq.DEALER, control, keys.stranger_secret, keys.learner_public)
        )
    peers.append(raw_curve_socket(ctx, zmq.DEALER, control, None, keys.learner_public))
    peers.append(
        raw_curve_socket(ctx, zmq.DEALER, control, keys.actor_secret, keys.impostor_public)
    )
    wait_for(11, 2)
    curve_learner.pump(0)
    lines = [r.getMessage() for r in caplog.records if "refused a connection" in r.getMessage()]
    print(f"\n{failures()} failed handshakes, {len(lines)} log line(s): {lines}")
    assert len(lines) <= 2 and all("unknown" in line for line in lines[1:]), lines
    counters = curve_learner.counters
    assert counters["auth/handshake_failed/key_refused"] >= 11
    assert counters["auth/handshake_failed/bad_handshake"] >= 2
    for sock in peers:
        sock.close()
