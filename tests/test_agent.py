"""``zmq_rl.Agent``: the three-call embedding API.

* an out-of-process simulator loop (a ``python -c`` script on gymnasium envs with a
  20-step time limit, so truncations and final observations travel) trains with a
  real learner in this process;
* env actions vs recorded actions, and observation dtypes (Pendulum's clipped box);
* the recurrent path with a tiny fake recurrent policy (the state each slot acted
  from is recorded, rows of ended episodes restart from zeros);
* the act/observe order is enforced.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.helpers import STUB_ENV_ID, stub_learner_config
from zmq_rl import Agent
from zmq_rl.config import LearnerConfig, PolicyConfig

ROOT = Path(__file__).resolve().parents[1]
PROCESS_TIMEOUT = 90.0

AGENT_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import gymnasium as gym
    import numpy as np
    from zmq_rl import Agent

    envs = [gym.make("CartPole-v1", max_episode_steps=20) for _ in range(3)]
    space = envs[0].observation_space, envs[0].action_space
    truncations = 0
    with Agent(f"127.0.0.1:{sys.argv[1]}", *space, num_envs=3, env_id="CartPole-v1",
               register_timeout=60.0) as agent:
        obs = np.stack([e.reset(seed=agent.seed + i)[0] for i, e in enumerate(envs)])
        while not agent.shutdown_requested:
            actions = agent.act(obs)
            rewards, term, trunc, final, nxt = np.zeros(3), [], [], {}, []
            for j, env in enumerate(envs):
                o, rewards[j], te, tr, _ = env.step(actions[j].item())
                term.append(te), trunc.append(tr)
                if te or tr:
                    if tr and not te:
                        final[j] = o
                        truncations += 1
                    o, _ = env.reset()
                nxt.append(o)
            obs = np.stack(nxt).astype(np.float64)  # the agent casts to the space's float32
            agent.observe(rewards, term, trunc, obs, final)
        stats = dict(agent.stats)
    print("STATS " + json.dumps({**stats, "truncations": truncations}), flush=True)
    """
)


def capture_steps(agent: Agent) -> list[dict[str, Any]]:
    """Record what the agent hands its client (instead of sending it)."""
    names = ("obs", "actions", "rewards", "terminated", "truncated", "values", "log_probs")
    calls: list[dict[str, Any]] = []

    def step(*args: Any) -> None:
        calls.append(dict(zip((*names, "next_obs", "final_obs", "state"), args, strict=True)))

    agent.client.step = step  # type: ignore[method-assign]
    return calls


@pytest.mark.timeout(PROCESS_TIMEOUT + 60)
def test_agent_in_another_process_trains_with_a_real_learner(start_learner, learner_port):
    cfg = LearnerConfig(
        env_id="CartPole-v1",
        port=learner_port,
        num_actors=1,
        num_envs=3,
        num_steps=16,
        fragment_length=8,
        total_env_steps=3 * 16 * 8,
        eval_episodes=1,
        starvation_timeout=60.0,
        checkpoint_every=0,
    )
    _, run = start_learner(cfg)
    proc = subprocess.run(
        [sys.executable, "-c", AGENT_SCRIPT, str(learner_port)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=PROCESS_TIMEOUT,
        check=False,
    )
    report = run.join(PROCESS_TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("STATS ")]
    stats = json.loads(line[len("STATS ") :])

    assert report.stop_reason == "budget spent"
    assert report.env_steps_consumed == 3 * 16 * 8
    (actor,) = report.actor_stats.values()
    assert actor["said_bye"] and actor["num_envs"] == 3
    assert actor["steps_consumed"] == report.env_steps_consumed
    assert actor["actor/policy_updates_received"] >= 1  # act() loaded broadcast weights
    assert stats["truncations"] > 0  # final observations travelled, and were accepted:
    assert not any(k.startswith("rejected/") for k in report.counters), report.counters


def test_act_returns_env_actions_and_records_the_policys(start_learner, learner_port, ctx):
    """Pendulum's box is [-2, 2]: with a wide Gaussian the policy's samples often fall
    outside; act() returns them clipped (what the env may take) and records them
    unclipped (what the log-probs are of), with float64 observations cast to float32."""
    cfg = LearnerConfig(
        env_id="Pendulum-v1", port=learner_port, num_actors=1, num_envs=4, num_steps=8,
        fragment_length=8, total_env_steps=8 * 4 * 100, eval_episodes=1, checkpoint_every=0,
    )  # fmt: skip
    learner, run = start_learner(cfg, policy=PolicyConfig(hidden_sizes=(8,), log_std_init=1.5))
    agent = Agent(f"127.0.0.1:{learner_port}", num_envs=0, context=ctx, register_timeout=30.0)
    try:
        assert agent.num_envs == 4  # 0: the learner's num_envs
        steps = capture_steps(agent)
        rng = np.random.default_rng(0)
        for _ in range(5):
            obs = rng.uniform(-1, 1, (4, 3))  # float64
            actions = agent.act(obs)
            agent.observe(np.ones(4), np.zeros(4, bool), np.zeros(4, bool), obs)
            recorded = steps[-1]["actions"]
            assert actions.shape == recorded.shape == (4, 1)
            np.testing.assert_array_equal(actions, np.clip(recorded, -2.0, 2.0))
            assert steps[-1]["obs"].dtype == np.float32
            np.testing.assert_array_equal(steps[-1]["obs"], obs.astype(np.float32))
        all_recorded = np.concatenate([s["actions"] for s in steps])
        assert (np.abs(all_recorded) > 2.0).any()  # the clipping above was exercised
    finally:
        agent.close()
        learner.request_stop("test over")
        run.join()


class FakeRecurrentPolicy(torch.nn.Module):
    """state_size 2; the next state is the state + 1, action 1 where state[:, 0] > 0."""

    state_size = 2

    def initial_state(self, batch: int) -> torch.Tensor:
        return torch.zeros(batch, 2)

    def act_recurrent(self, obs, state, generator=None, deterministic=False):
        self.seen = state.clone()
        action = (state[:, 0] > 0).long()
        zeros = torch.zeros(state.shape[0])
        return action, zeros, zeros, state + 1


def test_recurrent_state_is_carried_per_slot_and_reset_where_episodes_end(
    start_learner, learner_port, ctx
):
    learner, run = start_learner(stub_learner_config(learner_port, num_envs=2))
    agent = Agent(f"127.0.0.1:{learner_port}", num_envs=2, env_id=STUB_ENV_ID, context=ctx)
    try:
        policy = FakeRecurrentPolicy()
        agent.runner.policy, agent.runner.state_size = policy, 2
        agent._state = agent.runner.initial_state(2)
        steps = capture_steps(agent)
        obs = np.zeros((2, 2), np.float32)
        with pytest.raises(RuntimeError, match="observe.*without act"):
            agent.observe(np.zeros(2), [False] * 2, [False] * 2, obs)
        np.testing.assert_array_equal(agent.act(obs), [0, 0])
        with pytest.raises(RuntimeError, match="act.*twice"):
            agent.act(obs)
        agent.observe(np.zeros(2), [False, False], [False, False], obs)
        np.testing.assert_array_equal(steps[-1]["state"], [[0, 0], [0, 0]])
        np.testing.assert_array_equal(agent.act(obs), [1, 1])  # acted from state 1
        np.testing.assert_array_equal(policy.seen, [[1, 1], [1, 1]])
        # Slot 0's episode ends (terminated): it restarts from zeros; slot 1 goes on.
        agent.observe(np.zeros(2), [True, False], [False, False], obs)
        np.testing.assert_array_equal(steps[-1]["state"], [[1, 1], [1, 1]])
        np.testing.assert_array_equal(agent.act(obs), [0, 1])
        np.testing.assert_array_equal(policy.seen, [[0, 0], [2, 2]])
        # Truncation resets too (slot 1); the final observation is recorded for it.
        agent.observe(np.zeros(2), [False, False], [False, True], obs, {1: obs[1]})
        assert list(steps[-1]["final_obs"]) == [1]
        agent.act(obs)
        np.testing.assert_array_equal(policy.seen, [[1, 1], [0, 0]])
    finally:
        agent.close()
        learner.request_stop("test over")
        run.join()
