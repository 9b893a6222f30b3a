"""Evaluation off the training path: snapshots evaluated in a separate process.

Over real sockets with the built-in actor on the stub env (every episode returns 5).
The speed this buys is measured in ``bench/eval_overhead.py``, not here.
"""

from __future__ import annotations

import json

import psutil
import pytest
import zmq

from tests.conftest import free_port_block
from tests.helpers import STUB_POLICY, Background, gym_actor, stub_learner_config
from zmq_rl.config import PolicyConfig, PPOConfig
from zmq_rl.learner.loop import Learner

SMALL_PPO = PPOConfig(num_epochs=1, minibatch_size=8)


def run(cfg, ppo=SMALL_PPO, policy=STUB_POLICY, **actor) -> tuple[Learner, object]:
    """Train ``cfg`` with one built-in actor (``actor``: its config changes); the
    learner and its report."""
    ctx = zmq.Context()
    learner = Learner(cfg, ppo, policy, context=ctx)
    actor = gym_actor(ctx, cfg.port, **actor)
    job = Background(learner.run)
    job.join(120)
    actor.join()
    learner.close()
    ctx.destroy(linger=0)
    assert job.error is None, repr(job.error)
    return learner, job.result


def evaluator_processes() -> list[psutil.Process]:
    """Live spawned children (multiprocessing's resource tracker is not one)."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.is_running() and "spawn_main" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


def test_background_evaluations_are_tagged_with_their_snapshot_and_can_stop_the_run():
    cfg = stub_learner_config(
        free_port_block(), eval_every=1, target_return=5.0, total_env_steps=8 * 2000
    )
    learner, report = run(cfg)
    assert report.stop_reason == "evaluation reached target_return 5"
    assert report.updates_completed < 2000  # stopped early, on a result that came back
    periodic = [e for e in report.evaluations if "reported_at_update" in e]
    assert periodic, report.evaluations
    for evaluation in periodic:
        # Each result is of the snapshot taken at its update, reported then or later.
        assert evaluation["updates"] <= evaluation["reported_at_update"]
        assert evaluation["env_steps"] == 8 * evaluation["updates"]
        assert evaluation["mean_return"] == 5.0
    assert report.evaluations[-1]["updates"] == report.updates_completed  # the final one
    assert not evaluator_processes(), "the evaluator process outlived the learner"


def test_evaluation_in_the_loop_when_background_is_off():
    cfg = stub_learner_config(
        free_port_block(), eval_every=2, eval_in_background=False, total_env_steps=8 * 6
    )
    _, report = run(cfg)
    assert [e["updates"] for e in report.evaluations] == [2, 4, 6]
    assert all("reported_at_update" not in e for e in report.evaluations)
    assert not evaluator_processes()


@pytest.mark.parametrize("background", [True, False], ids=["background", "in-loop"])
def test_the_best_evaluated_policy_is_kept_as_policy_best(tmp_path, background):
    """policy.pt is the final policy; policy-best.pt the one whose evaluation was best,
    byte for byte what was evaluated: evaluating it again (same seed, deterministic)
    gives that evaluation's mean exactly. CartPole-v1, so evaluations differ."""
    from zmq_rl.deploy import load_policy
    from zmq_rl.learner.evaluation import evaluate_policy
    from zmq_rl.learner.runlog import EVAL_SEED_OFFSET

    cfg = stub_learner_config(
        free_port_block(),
        env_id="CartPole-v1",
        num_envs=4,
        num_steps=16,
        fragment_length=16,
        eval_every=1,
        eval_episodes=3,
        eval_in_background=background,
        total_env_steps=16 * 4 * 12,
        run_dir=str(tmp_path / "run"),
    )
    ppo = PPOConfig(num_epochs=8, minibatch_size=32, learning_rate=0.01)  # moves fast
    policy_cfg = PolicyConfig(hidden_sizes=(32,))
    _, report = run(cfg, ppo, policy_cfg, env_id="CartPole-v1", num_envs=4)
    best = report.best_evaluation
    means = [e["mean_return"] for e in report.evaluations]
    assert len(set(means)) > 1, means  # the check below must pick one of several
    assert best is not None and best["mean_return"] == max(means)
    assert best["file"] == "policy-best.pt" and best["updates"] <= report.updates_completed
    saved = json.loads((tmp_path / "run" / "report.json").read_text())["best_evaluation"]
    assert saved == best
    policy = load_policy(tmp_path / "run" / "policy-best.pt")
    mean, _ = evaluate_policy(policy.network, "CartPole-v1", 3, cfg.seed + EVAL_SEED_OFFSET)
    assert policy.version == best["version"]
    assert mean == best["mean_return"]
