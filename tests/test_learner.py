"""The real Learner over tcp on 127.0.0.1, with GymActor threads or raw DEALER peers.

Ports the reference's learner tests: ``learner_loop_runs_updates_and_broadcasts``,
``learner_loop_vtrace_on_policy_matches_gae``, ``learner_loop_vtrace_stale_completes``
and ``vtrace_target_log_probs_differ_from_behavior_when_policy_updated``, plus the
registration and failure behaviour a socket learner adds (starvation, refusals).
"""

from __future__ import annotations

import math
import re
import time
from typing import Any

import gymnasium as gym
import msgpack
import numpy as np
import pytest
import torch
import zmq

from tests.conftest import STUB_ENV_ID
from tests.helpers import Background, stub_learner_config
from tests.stub_env import StubEnv
from zmq_rl.actor.gym_actor import GymActor
from zmq_rl.config import ActorConfig, LearnerConfig, PolicyConfig, PPOConfig
from zmq_rl.learner.loop import Learner, LearnerReport, LearnerStarved
from zmq_rl.rl.policy import build_policy
from zmq_rl.rl.ppo import PPOTrainer
from zmq_rl.rl.rollout import Rollout
from zmq_rl.rl.targets import TargetSettings, rollout_to_batch
from zmq_rl.wire.protocol import (
    PROTOCOL_VERSION,
    Bye,
    Hello,
    Message,
    Refuse,
    Shutdown,
    Welcome,
    decode,
    encode,
    space_spec,
)

TIMEOUT = 30.0
TINY = PolicyConfig(hidden_sizes=(8,))
OBS_SPACE, ACT_SPACE = StubEnv.observation_space, StubEnv.action_space


def learner_config(port: int, **changes: Any) -> LearnerConfig:
    """Two actors of one stub slot. Every slot's rollout (``batch_mode`` ``slots``):
    these tests pin its exact per-slot accounting; rows batches have their own
    (tests/test_fleet_batches.py)."""
    base = dict(
        batch_mode="slots",
        num_actors=2,
        fragment_length=4,
        total_env_steps=8 * 2 * 3,
        gamma=0.99,
        gae_lambda=0.95,
        checkpoint_every=LearnerConfig.checkpoint_every,
    )
    return stub_learner_config(port, **{**base, **changes})


def run_with_actors(
    ctx, cfg: LearnerConfig, ppo: PPOConfig, policy: PolicyConfig = TINY
) -> tuple[LearnerReport, list[dict[str, float]]]:
    """The learner in this thread, ``cfg.num_actors`` GymActors in threads."""
    learner = Learner(cfg, ppo, policy, context=ctx)
    try:
        actors = [
            Background(
                lambda i=i: GymActor(
                    ActorConfig(
                        learner=f"127.0.0.1:{cfg.port}",
                        env_id=STUB_ENV_ID,
                        actor_id=i,
                        register_timeout=TIMEOUT,
                    ),
                    context=ctx,
                ).run()
            )
            for i in range(cfg.num_actors)
        ]
        report = learner.run()
    finally:
        learner.close()
    stats = []
    for actor in actors:
        stats.append(actor.join())
        assert actor.error is None, repr(actor.error)
    return report, stats


def assert_finite_stats(stats: dict[str, float] | None) -> None:
    assert stats is not None
    for key in ("losses/policy_loss", "losses/value_loss", "losses/entropy"):
        assert math.isfinite(stats[key]), f"{key} = {stats[key]}"


# -- the reference's learner tests -------------------------------------------------------


def test_learner_runs_updates_and_broadcasts(ctx, learner_port):
    cfg = learner_config(learner_port, max_lead_steps=16)
    report, actor_results = run_with_actors(
        ctx, cfg, PPOConfig(num_epochs=1, minibatch_size=8, target_kl=1.0)
    )
    assert report.updates_completed == 3
    assert report.env_steps_consumed == 8 * 2 * 3
    assert report.broadcasts_sent == 3
    assert report.last_policy_version == 3
    # The stub env ends an episode every 5 steps: 24 consumed steps per slot hold
    # exactly 4 whole episodes of return 5, reported in consumption order.
    assert report.episodes_completed == 8 >= cfg.num_actors
    assert report.episode_rewards == [5.0] * 8
    assert_finite_stats(report.final_stats)
    assert report.stop_reason == "budget spent"
    assert report.counters["consumed/steps"] == 48
    assert not [k for k in report.counters if k.startswith("rejected/")], report.counters
    assert sorted(report.actor_stats) == ["0", "1"]
    for actor_id, summary in report.actor_stats.items():
        result = actor_results[int(actor_id)]
        assert summary["said_bye"] is True
        assert summary["steps_consumed"] == 24
        # At version 0 the valve allows 16 steps; the third update needs 24 from
        # every actor, so each actor must have loaded a broadcast.
        assert summary["actor/policy_updates_received"] >= 1
        assert summary["actor/last_policy_version"] >= 1
        assert summary["actor/steps_sent"] == result["steps_sent"]
        # Every fragment an actor sent arrived before the report was written.
        assert summary["steps_received"] == result["steps_sent"]
        assert summary["steps_received"] >= summary["steps_consumed"]
        assert result["policy_updates_received"] >= 1


def run_one_update(ctx, port: int, use_vtrace: bool, gae_lambda: float = 1.0, **extra) -> dict:
    """One full-batch, single-epoch update from a fixed seed: the single actor is never
    stale and the stub env is deterministic, so runs differ only in the estimator."""
    cfg = learner_config(
        port,
        num_actors=1,
        total_env_steps=8,
        max_lead_steps=16,
        use_vtrace=use_vtrace,
        gae_lambda=gae_lambda,
        **extra,
    )
    ppo = PPOConfig(num_epochs=1, minibatch_size=8, target_kl=0.0)
    report, _ = run_with_actors(ctx, cfg, ppo)
    assert report.updates_completed == 1
    assert_finite_stats(report.final_stats)
    return report.final_stats


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-6)


def test_vtrace_on_fresh_data_matches_gae_lambda_one_through_the_learner(ctx):
    from tests.conftest import free_port_block

    gae = run_one_update(ctx, free_port_block(), use_vtrace=False)
    vtrace = run_one_update(ctx, free_port_block(), use_vtrace=True)
    assert rel(gae["losses/value_loss"], vtrace["losses/value_loss"]) < 1e-2, (gae, vtrace)
    assert abs(gae["losses/policy_loss"] - vtrace["losses/policy_loss"]) < 1e-3
    assert vtrace["charts/importance_ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    # The comparison discriminates: another estimator moves the value loss.
    other = run_one_update(ctx, free_port_block(), use_vtrace=False, gae_lambda=0.3)
    assert rel(gae["losses/value_loss"], other["losses/value_loss"]) > 1e-2, (gae, other)
    # vtrace_lambda reaches the estimator: with it equal to GAE's lambda, the same again.
    traced = run_one_update(ctx, free_port_block(), use_vtrace=True, vtrace_lambda=0.3)
    assert rel(other["losses/value_loss"], traced["losses/value_loss"]) < 1e-2, (other, traced)
    assert abs(other["losses/policy_loss"] - traced["losses/policy_loss"]) < 1e-3


def test_vtrace_under_staleness_completes_with_finite_stats(ctx, learner_port):
    cfg = learner_config(
        learner_port,
        total_env_steps=8 * 2 * 5,
        broadcast_every=3,
        max_lead_steps=6 * 8,
        use_vtrace=True,
    )
    report, _ = run_with_actors(ctx, cfg, PPOConfig(num_epochs=1, minibatch_size=8, target_kl=1.0))
    assert report.updates_completed == 5
    assert report.broadcasts_sent == 1 and report.last_policy_version == 1
    assert_finite_stats(report.final_stats)
    assert math.isfinite(report.final_stats["charts/importance_ratio_mean"])
    assert all(math.isfinite(r) for r in report.episode_rewards)
    assert report.episode_rewards == [5.0] * 16


def test_target_log_probs_differ_from_behaviour_after_an_update():
    torch.manual_seed(0)
    policy = build_policy(OBS_SPACE, ACT_SPACE, TINY)
    T, B = 8, 2
    t = (np.arange(T) % 5).astype(np.float32)
    obs = np.repeat(np.stack([t, t], axis=1)[:, None], B, axis=1)  # stub observations
    with torch.no_grad():
        actions, behaviour_lp, values = policy.act(
            torch.from_numpy(obs.reshape(T * B, 2)), torch.Generator().manual_seed(1)
        )
    terminated = np.zeros((T, B), bool)
    terminated[4] = True
    rollout = Rollout(
        slots=[(0, 0), (1, 0)],
        obs=obs,
        actions=actions.numpy().reshape(T, B),
        rewards=np.ones((T, B), np.float32),
        terminated=terminated,
        truncated=np.zeros((T, B), bool),
        values=values.numpy().reshape(T, B),
        log_probs=behaviour_lp.numpy().reshape(T, B),
        versions=np.zeros((T, B), np.int64),
        bootstrap_obs=np.full((B, 2), 3.0, np.float32),
        final_t=np.zeros(0, np.int64),
        final_b=np.zeros(0, np.int64),
        final_obs=np.zeros((0, 2), np.float32),
    )
    settings = TargetSettings(gamma=0.99, gae_lambda=0.95, use_vtrace=True)
    fresh, diagnostics = rollout_to_batch(rollout, policy, settings)
    np.testing.assert_allclose(fresh.old_log_probs.numpy(), rollout.log_probs.ravel(), atol=1e-5)
    assert diagnostics["charts/importance_ratio_mean"] == pytest.approx(1.0, abs=1e-5)

    trainer = PPOTrainer(policy, PPOConfig(learning_rate=1e-2, num_epochs=4, minibatch_size=8))
    trainer.update(fresh)
    stale, diagnostics = rollout_to_batch(rollout, policy, settings)
    with torch.no_grad():
        target = policy.evaluate_actions(stale.obs, stale.actions)[0].numpy()
    behaviour = rollout.log_probs.ravel()
    assert np.abs(target - behaviour).max() > 1e-3, (target, behaviour)
    assert diagnostics["charts/importance_ratio_mean"] != pytest.approx(1.0, abs=1e-4)


# -- registration and failure ------------------------------------------------------------


def hello(actor_id: int = -1, obs_space=OBS_SPACE, act_space=ACT_SPACE, **kw: Any) -> Hello:
    fields = dict(
        actor_id=actor_id,
        env_id=STUB_ENV_ID,
        observation_space=space_spec(obs_space),
        action_space=space_spec(act_space),
        num_envs=1,
        host="test-host",
        pid=4242,
    )
    return Hello(**{**fields, **kw})


def dealer(ctx, port: int) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"tcp://127.0.0.1:{port}")
    return sock


def recv_control(
    sock: zmq.Socket,
    kind: type[Message],
    learner: Background | None = None,
    timeout: float = TIMEOUT,
) -> Any:
    """The next message of type ``kind`` (others, e.g. heartbeats, are skipped)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if learner is not None and not learner.thread.is_alive():
            pytest.fail(f"the learner died: {learner.error!r}")
        if sock.poll(50):
            message = decode(sock.recv())
            if isinstance(message, kind):
                return message
    pytest.fail(f"no {kind.__name__} within {timeout}s")


def stop_learner(learner: Learner, run: Background, peers: dict[zmq.Socket, Welcome]) -> Any:
    """End a learner still waiting for actors; registered peers answer with a bye."""
    learner.request_stop("test over")
    for sock, welcome in peers.items():
        recv_control(sock, Shutdown, run)
        bye = Bye(actor_id=welcome.actor_id, token=welcome.token, stats={"steps_sent": 0})
        sock.send(encode(bye))
    report = run.join()
    assert run.error is None, repr(run.error)
    return report


def test_learner_starves_naming_the_silent_actor(ctx, learner_port):
    cfg = learner_config(
        learner_port, num_actors=1, total_env_steps=8, starvation_timeout=1.0, actor_timeout=30.0
    )
    learner = Learner(cfg, PPOConfig(num_epochs=1), TINY, context=ctx)
    try:
        run = Background(learner.run)
        silent = dealer(ctx, learner_port)
        silent.send(encode(hello(actor_id=5, host="silent-host", pid=31337)))
        welcome = recv_control(silent, Welcome, run)
        assert welcome.actor_id == 5
        start = time.monotonic()
        run.join(timeout=TIMEOUT)
        assert time.monotonic() - start < 10.0
    finally:
        learner.close()
    assert isinstance(run.error, LearnerStarved), repr(run.error)
    message = str(run.error)
    assert "actor 5" in message
    assert "silent-host" in message and "31337" in message


def test_learner_starves_when_too_few_actors_register(ctx, learner_port):
    cfg = learner_config(learner_port, num_actors=2, starvation_timeout=0.5)
    learner = Learner(cfg, PPOConfig(num_epochs=1), TINY, context=ctx)
    try:
        with pytest.raises(LearnerStarved, match=r"only 0 of num_actors=2"):
            learner.run()
    finally:
        learner.close()


def test_hello_with_other_spaces_or_protocol_is_refused(ctx, learner_port):
    cfg = learner_config(learner_port)
    learner = Learner(cfg, PPOConfig(num_epochs=1), TINY, context=ctx)
    try:
        run = Background(learner.run)
        cartpole = gym.make("CartPole-v1")
        mismatched = dealer(ctx, learner_port)
        mismatched.send(
            encode(
                hello(
                    obs_space=cartpole.observation_space,
                    act_space=cartpole.action_space,
                    env_id="CartPole-v1",
                )
            )
        )
        refuse = recv_control(mismatched, Refuse, run)
        assert refuse.code == "space_mismatch"
        assert str(cartpole.observation_space) in refuse.reason
        assert str(OBS_SPACE) in refuse.reason
        cartpole.close()

        future = dealer(ctx, learner_port)
        body = msgpack.unpackb(encode(hello()), raw=False)
        body["proto"] = PROTOCOL_VERSION + 1
        future.send(msgpack.packb(body, use_bin_type=True))
        refuse = recv_control(future, Refuse, run)
        assert refuse.code == "version_mismatch"
        assert re.search(rf"\b{PROTOCOL_VERSION + 1}\b", refuse.reason)
        assert re.search(rf"\b{PROTOCOL_VERSION}\b", refuse.reason)

        report = stop_learner(learner, run, {})
    finally:
        learner.close()
    assert report.actor_stats == {}  # neither of them registered
    assert report.counters["refused/space_mismatch"] == 1
    assert report.updates_completed == 0


def test_duplicate_actor_id_is_refused(ctx, learner_port):
    cfg = learner_config(learner_port)
    learner = Learner(cfg, PPOConfig(num_epochs=1), TINY, context=ctx)
    try:
        run = Background(learner.run)
        first = dealer(ctx, learner_port)
        first.send(encode(hello(actor_id=0, host="first-host", pid=111)))
        first_welcome = recv_control(first, Welcome, run)
        assert first_welcome.actor_id == 0
        second = dealer(ctx, learner_port)
        second.send(encode(hello(actor_id=0, host="second-host", pid=222)))
        refuse = recv_control(second, Refuse, run)
        assert refuse.code == "duplicate_id"
        assert "0" in refuse.reason and "first-host" in refuse.reason
        # A hello asking for any id gets a free one.
        third = dealer(ctx, learner_port)
        third.send(encode(hello(actor_id=-1, host="third-host", pid=333)))
        welcome = recv_control(third, Welcome, run)
        assert welcome.actor_id == 1
        report = stop_learner(learner, run, {first: first_welcome, third: welcome})
    finally:
        learner.close()
    # The first actor kept its id; the refused one never replaced it.
    assert report.actor_stats["0"]["host"] == "first-host"
    assert report.actor_stats["0"]["pid"] == 111
    assert report.actor_stats["1"]["host"] == "third-host"
    assert all(s["said_bye"] for s in report.actor_stats.values())


def test_malformed_space_in_hello_is_refused_not_fatal(ctx, learner_port):
    cfg = learner_config(learner_port)
    learner = Learner(cfg, PPOConfig(num_epochs=1), TINY, context=ctx)
    try:
        run = Background(learner.run)
        peer = dealer(ctx, learner_port)
        bad = hello()
        bad.observation_space = {"kind": "discrete", "n": 2**63}
        peer.send(encode(bad))
        refuse = recv_control(peer, Refuse, run, timeout=10.0)
        assert refuse.code == "bad_hello"
        stop_learner(learner, run, {})
    finally:
        learner.close()
        run.join()
