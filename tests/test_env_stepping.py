"""Envs whose steps wait are stepped together (issue 43, item 3): zmq_rl.envs.stepping's
EnvStepper in the built-in actor and the evaluator, and the StepDelay wrapper.

Concurrency is shown without timing: BarrierEnv's step waits until every env of its
group is inside a step, which only threads can satisfy (a sequential loop breaks the
barrier after its timeout).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from zmq_rl.config import ConfigError, PolicyConfig
from zmq_rl.envs import EnvStepper, StepDelay, make_env
from zmq_rl.learner.evaluation import evaluate_policy
from zmq_rl.rl.policy import build_policy

REPO = Path(__file__).resolve().parents[1]
BARRIER_TIMEOUT_S = 5.0


class BarrierEnv(gym.Env):
    """A one-step-at-a-time counter whose ``step`` meets the other envs of its group at a
    barrier: it returns only once all of them are stepping."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, barrier: threading.Barrier) -> None:
        self.barrier, self.t = barrier, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.barrier.wait(BARRIER_TIMEOUT_S)
        self.t += 1
        return np.full(1, self.t, np.float32), float(action), self.t % 3 == 0, False, {}


def test_threads_step_every_env_at_once_and_return_in_order():
    barrier = threading.Barrier(4)
    envs = [BarrierEnv(barrier) for _ in range(4)]
    for env in envs:
        env.reset()
    with EnvStepper(envs, "threads") as stepper:
        for _ in range(3):
            out = stepper.step([0, 1, 0, 1])
            assert [float(r) for _, r, *_ in out] == [0.0, 1.0, 0.0, 1.0]
        # An episode's end resets the env and hands back its last observation.
        obs, _, terminated, _, last = out[0]
        assert terminated and last.tolist() == [3.0] and obs.tolist() == [0.0]


def test_a_sequential_loop_cannot_pass_the_barrier():
    """The premise of the test above: stepped one after another, the envs never meet."""
    barrier = threading.Barrier(2)
    envs = [BarrierEnv(barrier) for _ in range(2)]
    for env in envs:
        env.reset()
    with pytest.raises(threading.BrokenBarrierError):
        EnvStepper(envs, "sequential").step([0, 0])


def test_auto_takes_threads_for_envs_that_wait_and_keeps_cpu_bound_ones_sequential():
    delay = ["zmq_rl.envs:StepDelay(seconds=0.002)"]
    waiting = [make_env("CartPole-v1", {}, delay) for _ in range(4)]
    busy = [make_env("CartPole-v1", {}, []) for _ in range(4)]
    for group in (waiting, busy):
        for i, env in enumerate(group):
            env.reset(seed=i)
    slow, fast = EnvStepper(waiting), EnvStepper(busy)
    for _ in range(20):
        slow.step([0] * 4)
        fast.step([0] * 4)
    assert (slow.mode, fast.mode) == ("threads", "sequential")
    slow.close()


def test_a_busy_cpu_is_not_a_simulator_that_waits():
    """On 2 busy cores (2 actors, a learner, an evaluator) 8 LunarLander envs took
    1.0-1.2 ms of wall time a step for 0.32 ms of CPU: the process waited for a core, and
    the old rule (wall > 2 x CPU) stepped them in threads, 23 % fewer env steps/s. A
    simulator's wait is counted per env: a millisecond or more each."""
    from zmq_rl.envs.stepping import waited

    probe = 16  # steps of 8 envs
    assert not waited(1.2e-3 * probe, 0.32e-3 * probe, probe * 8)  # a busy CPU
    assert waited(16.5e-3 * probe, 0.4e-3 * probe, probe * 8)  # 8 envs that wait 2 ms
    assert not waited(0.3e-3 * probe, 0.28e-3 * probe, probe * 8)  # an idle CPU


def test_threads_give_the_same_episodes_as_a_sequential_loop():
    def trajectory(mode: str) -> list[tuple]:
        envs = [make_env("CartPole-v1", {}, []) for _ in range(3)]
        for i, env in enumerate(envs):
            env.reset(seed=10 + i)
        rng = np.random.default_rng(0)
        seen = []
        with EnvStepper(envs, mode) as stepper:
            for _ in range(60):
                for obs, reward, terminated, truncated, last in stepper.step(
                    rng.integers(2, size=3).tolist()
                ):
                    seen.append((obs.tobytes(), reward, terminated, truncated, last is None))
        return seen

    assert trajectory("threads") == trajectory("sequential")


def test_the_evaluator_scores_waiting_envs_as_it_scores_the_env_itself():
    env = gym.make("CartPole-v1")
    policy = build_policy(env.observation_space, env.action_space, PolicyConfig())
    plain = evaluate_policy(policy, "CartPole-v1", 8, 3)
    waiting = evaluate_policy(
        policy, "CartPole-v1", 8, 3, wrappers=["zmq_rl.envs:StepDelay(seconds=0.001)"]
    )
    assert waiting == plain


def test_step_delay_refuses_a_bad_wait_and_step_envs_a_bad_mode():
    with pytest.raises(ValueError, match="seconds=-1"):
        StepDelay(gym.make("CartPole-v1"), seconds=-1)
    with pytest.raises(ValueError, match="step mode 'many'"):
        EnvStepper([], "many")
    from zmq_rl.config import ActorConfig

    with pytest.raises(ConfigError, match="step_envs"):
        ActorConfig(learner="h:1", step_envs="parallel").validate()


@pytest.mark.timeout(240)
def test_an_actor_of_waiting_envs_steps_them_in_threads(tmp_path, learner_port):
    """``zmq-rl run`` on CartPole whose steps wait 5 ms: the actors say they step their
    envs in threads, and the run spends its budget."""
    run_dir = tmp_path / "run"
    argv = [
        sys.executable, "-m", "zmq_rl", "run", "--env", "CartPole-v1", "--no-preset",
        "--actors", "1", "--num-envs", "4", "--num-steps", "16", "--total-env-steps", "512",
        "--wrapper", "zmq_rl.envs:StepDelay(seconds=0.005)", "--num-epochs", "1",
        "--eval-episodes", "2", "--port", str(learner_port), "--run-dir", str(run_dir),
        "--no-plot", "--log-level", "info",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads((run_dir / "report.json").read_text())["env_steps_consumed"] == 512
    log = (run_dir / "logs" / "actor-0.log").read_text()
    assert "4 env(s): a step takes" in log and "stepping them in threads" in log, log


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("wrappers", "lanes"), [([], 1), (["zmq_rl.envs:StepDelay(seconds=0.02)"], 4)]
)
def test_the_background_evaluator_runs_snapshots_side_by_side_when_steps_wait(wrappers, lanes):
    """On a simulator that waits, four snapshots are evaluated at once (in flight
    together, none left waiting), and the results come back in the order submitted; on
    an env that computes, one at a time."""
    from zmq_rl.learner.evaluation import BackgroundEvaluator
    from zmq_rl.rl.policy import export_weights

    env = gym.make("CartPole-v1")
    policy = build_policy(env.observation_space, env.action_space, PolicyConfig())
    weights = [(name, np.asarray(t)) for name, t in export_weights(policy)]
    evaluator = BackgroundEvaluator("CartPole-v1", 2, 0, PolicyConfig(), wrappers=wrappers)
    try:
        evaluator.submit("first", weights)
        assert [tag for tag, _, _ in evaluator.results(timeout=60)] == ["first"]
        for tag in "abcd":
            evaluator.submit(tag, weights)
        assert evaluator._in_flight == lanes and evaluator.busy()
        assert (evaluator._waiting is None) == (lanes == 4)
        seen: list[str] = []
        while evaluator.busy():
            seen += [tag for tag, _, _ in evaluator.results(timeout=60)]
        assert seen == (list("abcd") if lanes == 4 else ["a", "d"])  # b, c: replaced
    finally:
        evaluator.close()
