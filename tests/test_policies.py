"""Several policies in one run (``policy_map``): the mapping and its errors, the
learner's per-policy trainers, per-policy weights on their own PUB topics, actors
that act each slot by its agent's policy, and a real run in which two policies learn
two roles that one shared policy cannot."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import zmq

pytest.importorskip("pettingzoo")

from tests.helpers import TIMEOUT, CheckedBackground, wait_for  # noqa: E402
from zmq_rl.config import (  # noqa: E402
    ConfigError,
    LearnerConfig,
    PolicyConfig,
    PPOConfig,
    parse_policy_map,
    resolve_policy_map,
)

ROLES_ENV = "tests.agent_envs:coming_and_going"
AGENTS = ["agent_0", "agent_1", "agent_2", "agent_3"]
ROLE_MAP = "agent_[01]=red,agent_[23]=blue"


def _roles_config(port: int, **changes) -> LearnerConfig:
    base = dict(
        env_id=ROLES_ENV,
        env_kwargs="roles=true",
        policy_map=ROLE_MAP,
        num_actors=1,
        num_envs=2,
        num_steps=16,
        fragment_length=8,
        total_env_steps=4000,
        port=port,
        eval_every=0,
        eval_episodes=2,
        checkpoint_every=0,
        starvation_timeout=TIMEOUT,
    )
    return LearnerConfig(**{**base, **changes})


# ----------------------------------------------------------------------------- the mapping


def test_patterns_map_agents_first_match_wins():
    entries = parse_policy_map("agent_0=solo, agent_*=team")
    assert resolve_policy_map(entries, AGENTS, "env") == ["solo", "team", "team", "team"]


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("agent_0", "'agent_0' is not AGENT=POLICY"),
        ("agent_0=a,agent_0=b", "agent 'agent_0' is mapped twice"),
        ("agent_0=bad id", "policy id 'bad id'"),
    ],
)
def test_a_malformed_policy_map_names_the_entry(text, named):
    with pytest.raises(ConfigError, match="policy_map") as err:
        LearnerConfig(policy_map=text).validate()
    assert named in str(err.value)


def test_an_unmapped_agent_or_an_entry_without_agents_is_named():
    with pytest.raises(ConfigError, match="agent 'agent_3' of env has no policy"):
        resolve_policy_map(parse_policy_map("agent_[0-2]=a"), AGENTS, "env")
    with pytest.raises(ConfigError, match="entry ghost=b matches no agent of env"):
        resolve_policy_map(parse_policy_map("agent_*=a,ghost=b"), AGENTS, "env")


def test_hidden_sizes_of_an_unknown_policy_are_refused():
    cfg = LearnerConfig(policy_map="agent_*=a", policy_hidden_sizes="a=32;b=64,64")
    with pytest.raises(ConfigError, match="unknown policy id 'b'"):
        cfg.validate()


def test_the_policy_map_is_a_toml_table_too(tmp_path):
    from zmq_rl.cli.learner import LEARNER_SECTIONS
    from zmq_rl.config_toml import load_toml

    path = tmp_path / "run.toml"
    path.write_text(
        '[learner.policy_map]\nagent_0 = "red"\n"agent_*" = "blue"\n'
        "[learner.policy_hidden_sizes]\nblue = [32, 32]\n"
    )
    values = load_toml(path, LEARNER_SECTIONS)
    assert "agent_0=red,agent_*=blue" in values.values(), values
    assert "blue=32,32" in values.values(), values


def test_a_map_error_is_one_line_before_any_process_starts(capsys):
    from zmq_rl.cli import main as main_cli

    argv = ["run", "--env", ROLES_ENV, "--policy-map", "agent_0=a,agent_1=b", "--no-plot"]
    assert main_cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: policy_map=") and "'agent_2'" in err[-1], err
    assert not any("actor" in line and "start" in line for line in err), err


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        (
            {
                "env_id": "pettingzoo.classic.connect_four_v3",
                "env_kwargs": "",
                "policy_map": "player_0=a,player_1=b",
                "opponent_pool": 2,
            },
            "opponent_pool",
        ),
        ({"env_id": "CartPole-v1", "env_kwargs": ""}, "policy_map"),
    ],
)
def test_what_several_policies_cannot_combine_with_is_refused(changes, field, learner_port):
    from zmq_rl.learner.loop import Learner

    with pytest.raises(ConfigError) as err:
        Learner(_roles_config(learner_port, **changes), PPOConfig(num_epochs=1))
    assert err.value.field == field
    assert "policy_map" in str(err.value) or "single-agent" in str(err.value)


# ----------------------------------------------------------------------------- the learner


def _roles_rollout(num_slots: int = 8, steps: int = 6, seed: int = 0):
    """A rollout of one actor's ``num_slots`` slots (two env copies of four agents)."""
    from zmq_rl.rl.rollout import Rollout

    rng = np.random.default_rng(seed)
    obs = np.eye(3, dtype=np.float32)[rng.integers(0, 3, (steps, num_slots))]
    done = rng.random((steps, num_slots)) < 0.2
    return Rollout(
        obs=obs,
        actions=rng.integers(0, 3, (steps, num_slots)),
        rewards=rng.random((steps, num_slots)).astype(np.float32),
        terminated=done,
        truncated=np.zeros_like(done),
        values=np.zeros((steps, num_slots), np.float32),
        log_probs=np.full((steps, num_slots), -np.log(3.0), np.float32),
        slots=[(0, s) for s in range(num_slots)],
        versions=np.zeros((steps, num_slots), np.int64),
        bootstrap_obs=obs[-1],
        final_t=np.zeros(0, np.int64),
        final_b=np.zeros(0, np.int64),
        final_obs=np.zeros((0, 3), np.float32),
    )


def test_each_policy_trains_on_its_agents_columns_only():
    """A PolicyTrainers update equals two separate trainers, each updated on the
    columns of its agents (slot s is agent s % 4): the same parameters, bit for bit.
    A split by the wrong rule (e.g. by column halves) gives other parameters."""
    from dataclasses import replace

    import gymnasium as gym

    from zmq_rl.rl.policy_set import PolicyTrainers
    from zmq_rl.rl.trainer import Trainer

    cfg = LearnerConfig(num_actors=1, num_envs=2, num_steps=6, total_env_steps=48)
    ppo = PPOConfig(num_epochs=2, minibatch_size=8)
    spaces = (gym.spaces.Box(0.0, 1.0, (3,), np.float32), gym.spaces.Discrete(3))
    configs = {"red": PolicyConfig(hidden_sizes=(8,)), "blue": PolicyConfig(hidden_sizes=(16,))}
    agents = ["red", "red", "blue", "blue"]
    several = PolicyTrainers(cfg, ppo, configs, *spaces, agents)
    result = several.update(_roles_rollout(), 0.0)

    alone = {
        "red": Trainer(cfg, ppo, configs["red"], *spaces),
        "blue": Trainer(replace(cfg, seed=1), ppo, configs["blue"], *spaces),
    }
    columns = {"red": np.array([0, 1, 4, 5]), "blue": np.array([2, 3, 6, 7])}
    for pid, trainer in alone.items():
        trainer.update(_roles_rollout().columns(columns[pid]), 0.0)
        theirs = dict(several.trainers[pid].weights())
        for name, tensor in trainer.weights():
            np.testing.assert_array_equal(np.asarray(tensor), np.asarray(theirs[name]), name)
    assert {"policy/red/losses/policy_loss", "policy/blue/losses/policy_loss"} <= set(
        result.metrics
    )
    episodes = several.summary()
    done = _roles_rollout().terminated
    assert episodes["red"]["episodes_completed"] == int(done[:, columns["red"]].sum())
    assert episodes["blue"]["episodes_completed"] == int(done[:, columns["blue"]].sum())

    wrong = Trainer(cfg, ppo, configs["red"], *spaces)
    wrong.update(_roles_rollout().columns(np.arange(4)), 0.0)
    assert any(
        not np.array_equal(np.asarray(a), np.asarray(dict(several.trainers["red"].weights())[n]))
        for n, a in wrong.weights()
    )


def test_rollout_columns_keep_their_final_observations():
    rollout = _roles_rollout()
    rollout.final_t = np.array([1, 3, 4])
    rollout.final_b = np.array([2, 5, 7])
    rollout.final_obs = np.arange(9, dtype=np.float32).reshape(3, 3)
    part = rollout.columns(np.array([1, 5, 7]))
    assert part.slots == [(0, 1), (0, 5), (0, 7)]
    np.testing.assert_array_equal(part.final_b, [1, 2])
    np.testing.assert_array_equal(part.final_t, [3, 4])
    np.testing.assert_array_equal(part.final_obs, rollout.final_obs[1:])
    np.testing.assert_array_equal(part.rewards, rollout.rewards[:, [1, 5, 7]])


# ----------------------------------------------------------------------------- the wire


def test_each_policy_is_published_on_its_own_topic(learner_port, ctx):
    """A SUB subscribed to one policy's topic receives that policy's weights, and
    nothing of the other's (ZeroMQ filters by the topic frame at the publisher)."""
    from zmq_rl.learner.loop import Learner
    from zmq_rl.wire.protocol import decode_policy_weights, weights_topic

    with Learner(_roles_config(learner_port), PPOConfig(num_epochs=1), context=ctx) as learner:
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, weights_topic("blue"))
        sub.connect(f"tcp://127.0.0.1:{learner.cfg.weights_port()}")
        received = []

        def publish_until_received():
            learner.publish_weights()  # a slow joiner misses the first ones
            while sub.poll(20):
                received.append(decode_policy_weights(sub.recv_multipart(), 1 << 26))
            return len(received) >= 3

        wait_for(publish_until_received, TIMEOUT, "blue weights", poll=0.05)
        sub.close()
        blue = dict(learner.trainer.trainers["blue"].weights())
    assert {w.policy for w in received} == {"blue"}
    for name, tensor in received[-1].tensors:
        np.testing.assert_array_equal(tensor, np.asarray(blue[name]))


def test_an_actor_that_cannot_run_several_policies_is_refused_by_name(learner_port, ctx):
    from zmq_rl.actor.client import ActorClient, LearnerRefused
    from zmq_rl.learner.loop import Learner

    with Learner(_roles_config(learner_port), PPOConfig(num_epochs=1), context=ctx) as learner:
        client = ActorClient(
            f"127.0.0.1:{learner_port}", env_id=ROLES_ENV, observation_space=None,
            action_space=None, num_envs=8, context=ctx, register_timeout=TIMEOUT,
        )  # fmt: skip
        registering = CheckedBackground(client.register)
        wait_for(lambda: (learner.pump(10), not registering.alive())[1], TIMEOUT, "refusal", 0)
        client.close()
        with pytest.raises(LearnerRefused, match="'policies' feature"):
            registering.join()


def test_an_agent_acts_each_slot_by_its_agents_policy(learner_port, ctx):
    """The Agent builds one network per policy from the welcome (each with the
    learner's weights and its own width), acts slot s by the policy of agent s % 4,
    and needs slots= to decide rows of several policies."""
    from zmq_rl import Agent
    from zmq_rl.learner.loop import Learner

    cfg = _roles_config(learner_port, policy_hidden_sizes="blue=24")
    with Learner(cfg, PPOConfig(num_epochs=1), context=ctx) as learner:
        joining = CheckedBackground(
            lambda: Agent(
                f"127.0.0.1:{learner_port}", None, None, 8, context=ctx, register_timeout=TIMEOUT
            )
        )
        wait_for(lambda: (learner.pump(10), not joining.alive())[1], TIMEOUT, "welcome", 0)
        agent = joining.join()
        try:
            assert set(agent.policies) == {"red", "blue"}
            for pid, policy in agent.policies.items():
                mine = learner.trainer.trainers[pid].policy.state_dict()
                for name, tensor in policy.state_dict().items():
                    torch.testing.assert_close(tensor, mine[name].cpu(), rtol=0, atol=0)
            assert agent.policies["blue"].state_dict()["actor_trunk.0.weight"].shape[0] == 24
            # Make the two policies certain of different actions: red always 0, blue 2.
            for pid, favourite in (("red", 0), ("blue", 2)):
                head = agent.policies[pid].policy_head
                torch.nn.init.zeros_(head.weight)
                with torch.no_grad():
                    head.bias.copy_(torch.tensor([-50.0, -50.0, -50.0]))
                    head.bias[favourite] = 50.0
            obs = np.eye(3, dtype=np.float32)[np.zeros(8, int)]
            actions = agent.act(obs)
            np.testing.assert_array_equal(actions, [0, 0, 2, 2, 0, 0, 2, 2])
            agent.observe(np.zeros(8), np.zeros(8, bool), np.zeros(8, bool), obs)
            with pytest.raises(ValueError, match="slots="):
                agent.decide(obs[:2])
            decision = agent.decide(obs[:3], slots=[2, 5, 7])
            np.testing.assert_array_equal(decision.env_actions, [2, 0, 2])
        finally:
            agent.close()


# ----------------------------------------------------------------------------- a real run


def test_two_policies_learn_two_roles_one_shared_policy_cannot(tmp_path, capsys):
    """``zmq-rl run`` with a learner and two actor processes over tcp on an env whose
    agents 2 and 3 are paid for another answer to the same observation: with a policy
    per role both roles are learnt (a shared policy reaches about half: ~2.2 of 4.7
    in docs/multi_agent.md's run), and the report, metrics and files are per policy."""
    from tests.conftest import free_port_block
    from zmq_rl.cli import main as main_cli

    run_dir = tmp_path / "run"
    argv = ["run", "--env", ROLES_ENV, "--env-kwargs", "roles=true", "--actors", "2"]
    argv += ["--num-envs", "2", "--num-steps", "32", "--total-env-steps", "16000"]
    argv += ["--policy-map", ROLE_MAP, "--policy-hidden-sizes", "blue=32,32"]
    argv += ["--eval-episodes", "20", "--port", str(free_port_block()), "--eval-every", "10"]
    argv += ["--run-dir", str(run_dir), "--no-plot"]
    assert main_cli.main(argv) == 0, capsys.readouterr().err
    report = json.loads((run_dir / "report.json").read_text())
    assert report["stop_reason"] == "budget spent"
    assert set(report["policies"]) == {"red", "blue"}
    assert report["policies"]["red"]["agents"] == ["agent_0", "agent_1"]
    assert report["policies"]["blue"]["agents"] == ["agent_2", "agent_3"]
    for summary in report["policies"].values():
        assert summary["episodes_completed"] > 100 and summary["final_stats"]
    assert report["evaluations"][-1]["mean_return"] >= 3.5, report["evaluations"]
    each = report["evaluations"][-1]["policies"]  # each policy's agents, evaluated apart
    assert set(each) == {"red", "blue"} and min(each.values()) >= 3.0, each
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "losses/policy_loss" in r]
    assert all("policy/red/losses/policy_loss" in r for r in trained)
    assert all("policy/blue/losses/policy_loss" in r for r in trained)
    assert any("eval/policy/blue/mean_return" in r for r in rows)
    for pid, width in (("red", 64), ("blue", 32)):
        saved = torch.load(run_dir / f"policy-{pid}.pt", weights_only=True)
        first = saved["policy"]["actor_trunk.0.weight"]
        assert first.shape[0] == width, (pid, first.shape)
    for stats in report["actor_stats"].values():
        assert stats["actor/last_policy_version"] >= report["last_policy_version"] - 1
    # zmq-rl eval of the run plays every agent by its own policy (policy.pt names them).
    from zmq_rl.cli.evaluate import evaluate, load_policy

    loaded = load_policy(run_dir)
    widths = [p.state_dict()["actor_trunk.0.weight"].shape[0] for p in loaded.agent_policies]
    assert widths == [64, 64, 32, 32]
    assert evaluate(loaded, 20, 10_000)[0] >= 3.5
    assert not load_policy(run_dir / "policy-blue.pt").agent_policies  # one policy's file


def test_a_checkpoint_holds_every_policy():
    """state_dict / load_state_dict carry each policy's network and optimiser; a
    checkpoint without one of the run's policies is refused by name."""
    import gymnasium as gym

    from zmq_rl.rl.policy_set import PolicyTrainers

    cfg = LearnerConfig(num_actors=1, num_envs=2, num_steps=6, total_env_steps=48)
    spaces = (gym.spaces.Box(0.0, 1.0, (3,), np.float32), gym.spaces.Discrete(3))
    configs = {"red": PolicyConfig(hidden_sizes=(8,)), "blue": PolicyConfig(hidden_sizes=(16,))}
    agents = ["red", "red", "blue", "blue"]
    trained = PolicyTrainers(cfg, PPOConfig(num_epochs=1), configs, *spaces, agents)
    trained.update(_roles_rollout(), 0.0)
    trained.next_version()
    fresh = PolicyTrainers(cfg, PPOConfig(num_epochs=1), configs, *spaces, agents)
    fresh.load_state_dict(trained.state_dict())
    assert fresh.version == 1
    for pid in ("red", "blue"):
        mine, theirs = dict(fresh.trainers[pid].weights()), trained.trainers[pid].weights()
        for name, tensor in theirs:
            np.testing.assert_array_equal(np.asarray(mine[name]), np.asarray(tensor))
    other = PolicyTrainers(
        cfg, PPOConfig(num_epochs=1), {"red": configs["red"], "green": configs["red"]}, *spaces,
        ["red", "red", "green", "green"],
    )  # fmt: skip
    with pytest.raises(ValueError, match="no policy 'green'"):
        other.load_state_dict(trained.state_dict())


def test_the_conformance_tool_fails_a_learner_that_publishes_one_policy_only(
    learner_port, ctx, monkeypatch
):
    """``policy-topics`` can fail: a learner whose broadcasts leave out a policy (here
    blue's weights go out under red's topic, so the tool rejects them, as an actor
    must) fails it; the feature refusal still passes."""
    import zmq_rl.learner.ingest as ingest_module
    from zmq_rl.conformance.learner import LearnerCheckOptions, check_learner
    from zmq_rl.learner.loop import Learner
    from zmq_rl.wire.protocol import encode, weights_topic

    monkeypatch.setattr(
        ingest_module, "policy_weights_frames", lambda w: [weights_topic("red"), encode(w)]
    )
    cfg = _roles_config(learner_port, total_env_steps=256, fragment_length=8)
    learner = Learner(cfg, PPOConfig(num_epochs=1), context=ctx)
    run = CheckedBackground(learner.run)
    try:
        options = LearnerCheckOptions(num_envs=4, reply_timeout=2.0, shutdown_timeout=20.0)
        report = check_learner(f"127.0.0.1:{learner_port}", options)
    finally:
        learner.request_stop("test over")
        run.join()
        learner.close()
    statuses = {cid: r.status for cid, r in report.results.items()}
    assert statuses["policy-topics"] == "FAIL", statuses
    assert statuses["refuse-missing-feature"] == "PASS", statuses
