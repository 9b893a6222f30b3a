"""The embedding examples: simulators with their own main loops, trained by a real learner.

The learner runs in a thread of this process (as an embedding user would run it);
each example runs as a separate OS process, exactly as docs/embedding.md says:

* examples/thermostat_sim.py on :class:`zmq_rl.actor.client.ActorClient`;
* examples/raw_protocol_actor.py on raw pyzmq + msgpack (no zmq_rl), the template
  for an actor in another language.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import gymnasium as gym
import pytest
import torch

from zmq_rl.config import LearnerConfig, PolicyConfig
from zmq_rl.envs import build_env
from zmq_rl.learner.evaluation import evaluate_policy
from zmq_rl.learner.loop import Learner, LearnerReport
from zmq_rl.rl.policy import build_policy

ROOT = Path(__file__).resolve().parents[1]
ENV_ID = "examples.thermostat_env:Thermostat-v0"
RUN_TIMEOUT_S = 90.0
"""Bound on one run (importing torch in the example's process dominates)."""
ROOMS = 4
OBS_COURIERS = gym.spaces.Box(-1.0, 1.0, (3,), "float32")


def thermostat_config(port: int, total_env_steps: int) -> LearnerConfig:
    return LearnerConfig(
        env_id=ENV_ID,
        num_actors=1,
        num_envs=ROOMS,
        num_steps=32,
        fragment_length=32,
        total_env_steps=total_env_steps,
        eval_episodes=10,
        port=port,
        starvation_timeout=60.0,
    )


def run_with_example(
    cfg: LearnerConfig, module: str, args: tuple[str, ...] = ("--rooms", str(ROOMS))
) -> tuple[LearnerReport, str]:
    """Train with ``python -m <module> --learner ... *args`` as the only actor; the
    report and its stdout."""
    learner = Learner(cfg)
    outcome: dict[str, object] = {}

    def train() -> None:
        try:
            outcome["report"] = learner.run()
        except BaseException as exc:  # reported below
            outcome["error"] = exc

    thread = threading.Thread(target=train, name="learner", daemon=True)
    thread.start()
    example = subprocess.Popen(
        [sys.executable, "-m", module, "--learner", f"127.0.0.1:{cfg.port}", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while thread.is_alive():
            thread.join(0.2)
            if example.poll() not in (None, 0) or time.monotonic() > deadline:
                break
        if thread.is_alive() or "error" in outcome:
            if example.poll() is None:
                example.kill()
            out, err = example.communicate(timeout=10)
            pytest.fail(
                f"learner did not finish within {RUN_TIMEOUT_S}s or failed "
                f"({outcome.get('error')!r}); {module} rc {example.returncode}:\n{out}\n{err}"
            )
        out, err = example.communicate(timeout=30)  # the learner said shutdown: it exits
    finally:
        if example.poll() is None:
            example.kill()
            example.wait(timeout=10)
        if not thread.is_alive():
            learner.close()
    assert example.returncode == 0, err
    report = outcome["report"]
    assert isinstance(report, LearnerReport)
    return report, out


def untrained_return(cfg: LearnerConfig) -> float:
    """Evaluation return of a freshly initialised policy, evaluated as the learner does."""
    env = gym.make(ENV_ID)
    torch.manual_seed(cfg.seed)
    policy = build_policy(env.observation_space, env.action_space, PolicyConfig())
    env.close()
    mean, _ = evaluate_policy(policy, ENV_ID, cfg.eval_episodes, seed=cfg.seed + 10_000)
    return mean


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)  # a backstop: every wait is bounded
def test_thermostat_sim_learns_through_actor_client(learner_port):
    cfg = thermostat_config(learner_port, total_env_steps=4096)
    before = untrained_return(cfg)
    report, out = run_with_example(cfg, "examples.thermostat_sim")

    assert report.stop_reason == "budget spent"
    assert report.env_steps_consumed == 4096
    (actor,) = report.actor_stats.values()
    assert actor["said_bye"]
    assert actor["num_envs"] == ROOMS
    assert actor["steps_consumed"] == report.env_steps_consumed
    assert actor["actor/steps_sent"] >= actor["steps_consumed"]
    assert actor["actor/sim/minutes"] * ROOMS == actor["actor/steps_sent"]  # nothing unsent
    assert not any(k.startswith("rejected/") for k in report.counters), report.counters
    assert "sim/mean_abs_error=" in out  # the example prints its stats

    after = report.evaluations[-1]["mean_return"]
    # Untrained: about -130 to -650 by seed (a near-constant heater setting); a trained
    # controller holds the target within a degree or so (about -20 to -60).
    assert after > before + 100 and after > -100, (before, after)


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)  # a backstop: every wait is bounded
def test_raw_protocol_actor_is_a_full_member(learner_port):
    report, out = run_with_example(
        thermostat_config(learner_port, total_env_steps=1024), "examples.raw_protocol_actor"
    )
    assert report.stop_reason == "budget spent"
    assert report.env_steps_consumed == 1024
    (actor,) = report.actor_stats.values()
    assert actor["said_bye"], actor
    assert actor["steps_consumed"] == 1024
    assert actor["fragments_received"] == actor["actor/fragments_sent"]
    assert actor["actor/policy_updates_received"] >= 1
    assert not any(k.startswith("rejected/") for k in report.counters), report.counters
    assert "steps_sent=" in out


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)  # a backstop: every wait is bounded
def test_a_multi_agent_simulator_learns_through_agent_with_valid_rows(learner_port):
    """examples/couriers_sim.py: robots that leave on delivery and arrive mid-shift,
    one slot per robot position, trained through ``Agent.observe(..., valid=...)``
    by a learner of the matching PettingZoo env. The learner counts robot moves, not
    rows (rows of empty positions are not env steps), and the robots learn to drive
    to their targets."""
    pytest.importorskip("pettingzoo")
    floors = 4
    cfg = LearnerConfig(
        env_id="examples.couriers_env:couriers",
        num_actors=1,
        num_envs=floors,
        num_steps=32,
        fragment_length=32,
        total_env_steps=12_000,
        eval_episodes=20,
        port=learner_port,
        starvation_timeout=60.0,
    )
    env = build_env(cfg.env_id)
    torch.manual_seed(cfg.seed)
    policy = build_policy(OBS_COURIERS, env.action_space(env.possible_agents[0]), PolicyConfig())
    env.close()
    before, _ = evaluate_policy(policy, cfg.env_id, cfg.eval_episodes, seed=cfg.seed + 10_000)
    report, out = run_with_example(cfg, "examples.couriers_sim", ("--floors", str(floors)))

    assert report.stop_reason == "budget spent"
    (actor,) = report.actor_stats.values()
    assert actor["said_bye"] and actor["num_envs"] == floors * 3
    robot_ticks = int(actor["actor/sim/robot_ticks"])
    rows = int(actor["actor/steps_sent"])
    assert robot_ticks < rows  # some positions were empty: rows that are not valid
    # Every row consumed was sent; of them, only robot moves are env steps.
    assert actor["steps_consumed"] <= rows
    assert report.env_steps_consumed == cfg.total_env_steps <= robot_ticks  # to the move
    assert report.env_steps_consumed < actor["steps_consumed"]
    assert not any(k.startswith("rejected/") for k in report.counters), report.counters
    after = report.evaluations[-1]["mean_return"]
    # Random driving: about -0.1 a robot (an untrained policy's mode drives one way:
    # -0.8 to +0.3 by seed); a trained robot drives straight to its target (+0.8).
    assert after > before + 0.4 and after > 0.6, (before, after)
