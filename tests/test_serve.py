"""``zmq-rl serve``: remote inference (docs/inference.md).

* Python simulators (``zmq_rl.actor.inference.InferenceClient``, no torch) step CartPole with
  a 10-step time limit through a server in this process against a real learner: the
  run consumes its budget from them, every simulator is a member that said bye, the
  final observations of truncated episodes are accepted, the simulators hear the
  shutdown and the server then exits by itself;
* every refusal is an ``error`` reply naming the field (a stub-env learner).
"""

from __future__ import annotations

import threading
import time

import gymnasium as gym
import msgpack
import numpy as np
import pytest
import torch
import zmq

from tests.helpers import STUB_ENV_ID, CheckedBackground, stub_learner_config
from zmq_rl.actor.inference import InferenceClient, InferenceError, RunOver
from zmq_rl.config import LearnerConfig, ServeConfig
from zmq_rl.serving.serve import InferenceServer
from zmq_rl.wire.protocol import encode

TIMEOUT = 120.0
"""Bound of every wait (a run takes about 10 s on an idle 2-core machine, 70 s under load)."""


def start_server(ctx: zmq.Context, learner_port: int) -> tuple[InferenceServer, CheckedBackground]:
    server = InferenceServer(
        ServeConfig(learner=f"127.0.0.1:{learner_port}", bind="tcp://127.0.0.1:*"), ctx
    )
    return server, CheckedBackground(server.run)


def run_sim(endpoint: str, ctx: zmq.Context, seed: int, out: dict) -> None:
    """CartPole with a 10-step limit, two slots, until the run is over."""
    client = InferenceClient(endpoint, ctx, timeout=TIMEOUT)
    envs = [gym.make("CartPole-v1", max_episode_steps=10) for _ in range(2)]
    attached = client.attach(2, env_id="CartPole-v1")
    assert attached["action_space"] == envs[0].action_space
    obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)])
    outcome: tuple = (None, None, None, None)
    steps = truncations = 0
    try:
        while True:
            actions = client.infer(obs, *outcome)
            assert actions.dtype == np.int64 and actions.shape == (2,)
            rewards, term, trunc, final, nxt = np.zeros(2), [], [], {}, []
            for j, env in enumerate(envs):
                o, rewards[j], te, tr, _ = env.step(actions[j].item())
                term.append(te), trunc.append(tr)
                if te or tr:
                    if tr and not te:
                        final[j], truncations = o, truncations + 1
                    o, _ = env.reset()
                nxt.append(o)
            obs, outcome, steps = np.stack(nxt), (rewards, term, trunc, final), steps + 1
    except RunOver as exc:
        out[seed] = (steps, truncations, str(exc))
    finally:
        client.close()


@pytest.mark.timeout(TIMEOUT + 60)
def test_python_simulators_train_through_the_server(ctx, start_learner, learner_port):
    cfg = LearnerConfig(
        env_id="CartPole-v1", port=learner_port, num_actors=2, num_envs=2, num_steps=16,
        fragment_length=8, total_env_steps=2 * 2 * 16 * 6, eval_episodes=1,
        starvation_timeout=TIMEOUT, checkpoint_every=0,
    )  # fmt: skip
    _, run = start_learner(cfg)
    server, serving = start_server(ctx, learner_port)
    out: dict = {}
    sims = [
        threading.Thread(target=run_sim, args=(server.endpoint, ctx, seed, out), daemon=True)
        for seed in (10, 20)
    ]
    for sim in sims:
        sim.start()
    report = run.join(TIMEOUT)
    stats = serving.join(TIMEOUT)  # exits by itself: the run is over, the simulators gone
    for sim in sims:
        sim.join(TIMEOUT)
    assert sorted(out) == [10, 20], out  # both heard the shutdown
    assert all(truncations > 0 for _, truncations, _ in out.values())

    assert report.stop_reason == "budget spent"
    assert report.env_steps_consumed == cfg.total_env_steps
    assert len(report.actor_stats) == 2
    assert sum(a["steps_consumed"] for a in report.actor_stats.values()) == cfg.total_env_steps
    for actor in report.actor_stats.values():
        assert actor["said_bye"] and actor["num_envs"] == 2
        assert actor["steps_consumed"] > 0  # rows batches: the oldest rows of either
        assert actor["actor/serve/requests"] >= actor["steps_consumed"] // 2
    assert not any(k.startswith("rejected/") for k in report.counters), report.counters
    assert stats["attached"] == 2 and stats["errors"] == 0
    assert stats["requests"] == sum(steps + 1 for steps, _, _ in out.values())
    assert stats["batches"] <= stats["requests"]


def raw_request(sock: zmq.Socket, body: dict) -> dict:
    sock.send(msgpack.packb(body))
    assert sock.poll(int(TIMEOUT * 1000)), f"no answer to {body}"
    return msgpack.unpackb(sock.recv())


@pytest.mark.timeout(TIMEOUT + 30)
def test_refusals_are_error_replies_naming_the_field(ctx, start_learner, learner_port):
    learner, run = start_learner(stub_learner_config(learner_port, num_actors=1, num_envs=2))
    server, serving = start_server(ctx, learner_port)
    client = InferenceClient(server.endpoint, ctx, timeout=TIMEOUT)
    raw = ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(server.endpoint)
    try:
        obs = np.zeros((2, 2), np.float32)

        def refused(code: str, match: str, **call) -> None:
            with pytest.raises(InferenceError, match=match) as info:
                client.infer(**call) if "obs" in call else client.attach(**call)
            assert info.value.code == code

        refused("not_attached", "attach first", obs=obs)
        assert raw_request(raw, {"proto": 1, "type": "infer"})["code"] == "version_mismatch"
        assert raw_request(raw, {"proto": 2, "type": "hello"})["code"] == "unknown_type"
        assert raw_request(raw, [1, 2])["code"] == "bad_message"
        refused("bad_field", "attach.num_envs", num_envs=0)
        box3 = gym.spaces.Box(0.0, 1.0, (3,), np.float32)
        refused("bad_field", "give both or neither", num_envs=2, observation_space=box3)
        refused(
            "learner_refused",
            "space_mismatch",
            num_envs=2,
            observation_space=box3,
            action_space=gym.spaces.Discrete(2),
        )
        attached = client.attach(2, env_id=STUB_ENV_ID)
        assert attached["num_envs"] == 2 and attached["actor_id"] == 0
        refused("bad_field", r"infer\.obs: leading dims \[3\] != \[2\]", obs=np.zeros((3, 2)))
        refused(
            "bad_field", r"infer\.obs: \[2\] float64, expected \[2\] float32", obs=obs.astype(float)
        )
        refused("bad_field", "no action is outstanding", obs=obs, reward=[0, 0],
                terminated=[0, 0], truncated=[0, 0])  # fmt: skip
        assert client.infer(obs).shape == (2,)
        refused("bad_field", "infer.reward: missing", obs=obs)
        refused("bad_field", r"final_obs_index: missing; slots \[1\] are truncated", obs=obs,
                reward=[0, 0], terminated=[False, False], truncated=[False, True])  # fmt: skip
        # A refused infer changes nothing: the same step is accepted when well formed.
        client.infer(obs, [1, 1], [False, False], [False, True], {1: obs[1]})
        client.detach({"custom": 3.0})
        refused("not_attached", "attach first", obs=obs)
    finally:
        client.close()
        raw.close()
        server.stop()
        serving.join(TIMEOUT)
        learner.request_stop("test over")
    report = run.join(TIMEOUT)
    (actor,) = report.actor_stats.values()
    assert actor["said_bye"] and actor["actor/custom"] == 3.0
    assert actor["actor/steps_sent"] == 2  # the one step recorded (2 slots), flushed at detach
    assert actor["actor/serve/requests"] == 7  # every infer of the attachment, refused or not
    assert server.stats["errors"] == 13  # every refused call above


def run_steps(client: InferenceClient, obs: np.ndarray, steps: int) -> None:
    """``steps`` well-formed steps of a stub simulator (reward 1, no episode end) from
    ``obs`` (its first infer already answered), then detach."""
    for _ in range(steps):
        obs = obs + 1.0
        client.infer(obs, [1.0, 1.0], [False, False], [False, False])
    client.detach()


@pytest.mark.timeout(TIMEOUT + 30)
def test_rows_the_learner_would_refuse_are_refused_and_no_good_row_is_lost(
    ctx, start_learner, learner_port, caplog
):
    """Issue 29, item 5: NaN / inf observations, a NaN final observation and rewards the
    learner refuses (NaN, 1e30 > MAX_ABS_VALUE) get an ``error`` reply naming the field
    and the slot (codes ``not_finite`` / ``out_of_range``, the learner's own limits) and
    are never forwarded: the learner rejects no fragment, and every row of both
    simulators (the refused step resent well formed, and the other simulator's rows
    batched with them) reaches it."""
    learner, run = start_learner(
        stub_learner_config(learner_port, num_actors=2, num_envs=2, total_env_steps=10**6)
    )
    server, serving = start_server(ctx, learner_port)
    good, bad = (InferenceClient(server.endpoint, ctx, timeout=TIMEOUT) for _ in range(2))
    try:
        obs = np.ones((2, 2), np.float32)
        for sim in (good, bad):
            sim.attach(2, env_id=STUB_ENV_ID)
            sim.infer(obs)
        nan, inf = obs.copy(), obs.copy()
        nan[1, 0], inf[0, 1] = np.nan, np.inf
        ok = ([1.0, 1.0], [False, False], [False, False])
        cases = [
            ("not_finite", r"infer\.obs: holds NaN or inf \(slot 1", (nan, *ok)),
            ("not_finite", r"infer\.obs: holds NaN or inf \(slot 0", (inf, *ok)),
            ("not_finite", r"infer\.reward: holds NaN or inf \(slot 0",
             (obs, [np.nan, 1.0], *ok[1:])),
            ("out_of_range", r"\|infer\.reward\| exceeds 1e\+09 \(slot 1",
             (obs, [1.0, 1e30], *ok[1:])),
            ("not_finite", r"infer\.final_obs: holds NaN or inf \(slot 0",
             (obs, [1.0, 1.0], [False, False], [False, True], {1: nan[1]})),
        ]  # fmt: skip
        for code, match, call in cases:
            with pytest.raises(InferenceError, match=match) as info:
                bad.infer(*call)
            assert info.value.code == code
        # The refused step, well formed, is accepted: nothing of it was recorded.
        bad.infer(obs, [1.0, 1.0], [False, False], [False, True], {1: obs[1]})
        sims = [CheckedBackground(lambda c=c: run_steps(c, obs, 15)) for c in (good, bad)]
        for sim in sims:
            sim.join(TIMEOUT)
    finally:
        good.close()
        bad.close()
        server.stop()
        serving.join(TIMEOUT)
        learner.request_stop("test over")
    report = run.join(TIMEOUT)
    assert not any(k.startswith("rejected/") for k in report.counters), report.counters
    sent = sorted(a["actor/steps_sent"] for a in report.actor_stats.values())
    assert sent == [2 * 15, 2 * 16], report.actor_stats  # the refused step, resent, counts
    for actor in report.actor_stats.values():
        assert actor["steps_received"] == actor["actor/steps_sent"]
    assert server.stats["errors"] == len(cases)
    logged = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    for code in ("not_finite", "out_of_range"):  # the first of each code is logged
        assert any(f"request refused ({code})" in m and "infer." in m for m in logged), logged


def test_serve_command_help_and_config_errors(capsys):
    from zmq_rl.cli import main as main_cli

    with pytest.raises(SystemExit) as exit_info:
        main_cli.main(["serve", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for flag in ("--learner", "--bind", "--max-batch", "--sim-timeout", "--keep-serving"):
        assert flag in text
    assert main_cli.main(["serve", "--bind", "5600"]) == 2  # a config error names the field
    assert "bind='5600'" in capsys.readouterr().err
    assert main_cli.main(["serve", "--max-batch", "-1"]) == 2
    assert "max_batch=-1" in capsys.readouterr().err


class FakeRecurrentPolicy(torch.nn.Module):
    """state_size 2; next state = state + 1; action 1 where state[:, 0] > 0."""

    state_size = 2

    def initial_state(self, batch: int) -> torch.Tensor:
        return torch.zeros(batch, 2)

    def act_recurrent(self, obs, state, generator=None, deterministic=False):
        zeros = torch.zeros(state.shape[0])
        return (state[:, 0] > 0).long(), zeros, zeros, state + 1


@pytest.mark.timeout(TIMEOUT + 30)
def test_recurrent_state_per_simulator_slot_across_batches(ctx, start_learner, learner_port):
    """Two simulators (1 and 2 slots) share one batched network: each slot keeps its
    own state, the state a row acted from is recorded, an ended episode restarts
    from zeros, and every simulator gets its own rows' actions."""
    learner, run = start_learner(stub_learner_config(learner_port, num_actors=2, num_envs=1))
    server, serving = start_server(ctx, learner_port)
    clients = [InferenceClient(server.endpoint, ctx, timeout=TIMEOUT) for _ in range(2)]
    try:
        for client, n in zip(clients, (1, 2), strict=True):
            client.attach(n, env_id=STUB_ENV_ID)
        assert server.runner is not None
        server.runner.policy, server.runner.state_size = FakeRecurrentPolicy(), 2
        recorded: dict[int, list] = {1: [], 2: []}
        for session in list(server.sessions.values()):
            n = session.num_envs
            session.state = np.zeros((n, 2), np.float32)
            session.client.step = lambda *a, n=n: recorded[n].append(a)  # capture, not send
        obs = {n: np.full((n, 2), n, np.float32) for n in (1, 2)}

        def both(outcomes: dict) -> dict[int, np.ndarray]:
            calls = {
                n: CheckedBackground(lambda c=c, n=n: c.infer(obs[n], *outcomes[n]))
                for c, n in zip(clients, (1, 2), strict=True)
            }
            return {n: call.join(TIMEOUT) for n, call in calls.items()}

        none = {1: (), 2: ()}
        assert {n: a.tolist() for n, a in both(none).items()} == {1: [0], 2: [0, 0]}
        goes_on = (np.zeros(2), [False, False], [False, False])
        outcomes = {1: (np.zeros(1), [True], [False]), 2: goes_on}  # slot 0 of sim 1 ends
        assert {n: a.tolist() for n, a in both(outcomes).items()} == {1: [0], 2: [1, 1]}
        for n in (1, 2):
            (row,) = recorded[n]
            np.testing.assert_array_equal(row[0], obs[n])  # its own observations
            np.testing.assert_array_equal(row[-1], np.zeros((n, 2)))  # acted from zeros
        outcomes = {1: (np.zeros(1), [False], [False]), 2: goes_on}
        assert {n: a.tolist() for n, a in both(outcomes).items()} == {1: [1], 2: [1, 1]}
        np.testing.assert_array_equal(recorded[1][-1][-1], [[0, 0]])  # restarted
        np.testing.assert_array_equal(recorded[2][-1][-1], [[1, 1], [1, 1]])
    finally:
        for client in clients:
            client.close()
        server.stop()
        serving.join(TIMEOUT)
        learner.request_stop("test over")
        run.join(TIMEOUT)


def test_a_row_is_tagged_with_the_weights_that_chose_its_action(ctx, learner_port):
    """Issue 29, item 14: weights v1 arrive between the ``action`` (chosen by v0) and
    the ``infer`` that brings its outcome. The row goes to the learner tagged 0, the
    version that acted (it used to leave tagged 1: newer than the weights that acted,
    against docs/protocol.md section 4.1.2); the next rows carry 1."""
    from tests.test_hostile_actor import FAKE_RUN, FakeLearner, stub_policy, stub_weights
    from zmq_rl.wire.protocol import Bye, Hello

    fake = FakeLearner(ctx, learner_port)
    server, serving = start_server(ctx, learner_port)
    sim = InferenceClient(server.endpoint, ctx, timeout=TIMEOUT)
    try:
        attaching = CheckedBackground(lambda: sim.attach(1, env_id=STUB_ENV_ID))
        routing_id, _ = fake.recv_control(Hello)
        fake.welcome(routing_id, stub_weights(stub_policy(1), 0))
        fake.wait_subscription()
        attaching.join(TIMEOUT)
        obs = np.ones((1, 2), np.float32)
        sim.infer(obs)
        assert sim.version == 0
        session = next(iter(server.sessions.values()))
        deadline = time.monotonic() + TIMEOUT
        while session.client.version < 1:  # PUB drops what nobody takes yet: resend
            assert time.monotonic() < deadline, "the server did not load version 1"
            fake.pub.send(encode(stub_weights(stub_policy(2), 1, FAKE_RUN)))
            time.sleep(0.05)
        sim.infer(obs + 1, [1.0], [False], [False])  # the outcome of v0's action
        assert sim.version == 1
        sim.infer(obs + 2, [1.0], [False], [False])  # the outcome of v1's action
        sim.detach()
        fake.recv_control(Bye)
    finally:
        sim.close()
        server.stop()
        serving.join(TIMEOUT)
        fake.close()
    rows = [(f.version, float(o[0])) for f in fake.fragments for o in f.obs]
    assert rows == [(0, 1.0), (1, 2.0)], rows
