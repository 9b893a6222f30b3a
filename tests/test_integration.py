"""End to end: a learner and two actors as separate OS processes over tcp on 127.0.0.1.

Each process is a plain ``python -c`` running the library (not the CLI), on CartPole-v1.
The run must train its budget, shut down cleanly, leave no process behind, and write a
report whose per-actor bookkeeping agrees with what every actor says it sent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PROCESS_TIMEOUT = 90.0

LEARNER = textwrap.dedent(
    """
    import json
    from zmq_rl.config import LearnerConfig, PolicyConfig, PPOConfig
    from zmq_rl.learner.loop import Learner

    cfg = LearnerConfig(
        env_id="CartPole-v1", port={port}, num_actors=2, num_envs=2, num_steps=32,
        total_env_steps=2048, fragment_length=8, run_dir={run_dir!r}, eval_episodes=2,
        starvation_timeout=60.0, seed=1,
    )
    learner = Learner(cfg, PPOConfig(num_epochs=2, minibatch_size=64),
                      PolicyConfig(hidden_sizes=(8,)))
    try:
        report = learner.run()
    finally:
        learner.close()
    print("REPORT " + json.dumps({{"updates": report.updates_completed}}), flush=True)
    """
)

ACTOR = textwrap.dedent(
    """
    import json
    from zmq_rl.actor.gym_actor import GymActor
    from zmq_rl.config import ActorConfig

    stats = GymActor(ActorConfig(learner="127.0.0.1:{port}", env_id="CartPole-v1",
                                 register_timeout=60.0)).run()
    print("STATS " + json.dumps(stats), flush=True)
    """
)


def tagged_line(text: str, tag: str) -> dict:
    lines = [line for line in text.splitlines() if line.startswith(tag + " ")]
    assert len(lines) == 1, f"expected one {tag} line in:\n{text}"
    return json.loads(lines[0][len(tag) + 1 :])


def process_gone(pid: int) -> bool:
    try:
        import psutil  # noqa: PLC0415 - optional
    except ImportError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False
    return not psutil.pid_exists(pid)


def test_learner_and_two_actor_processes_train_and_shut_down_cleanly(tmp_path, learner_port):
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    scripts = {
        "learner": LEARNER.format(port=learner_port, run_dir=str(run_dir)),
        "actor0": ACTOR.format(port=learner_port),
        "actor1": ACTOR.format(port=learner_port),
    }
    procs: dict[str, subprocess.Popen] = {}
    logs: dict[str, Path] = {}
    try:
        for name, script in scripts.items():
            logs[name] = tmp_path / f"{name}.log"
            with open(logs[name], "w") as out:
                procs[name] = subprocess.Popen(
                    [sys.executable, "-c", script],
                    cwd=REPO,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
        deadline = time.monotonic() + PROCESS_TIMEOUT
        for name, proc in procs.items():
            remaining = max(0.1, deadline - time.monotonic())
            try:
                rc = proc.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                pytest.fail(
                    f"{name} still running after {PROCESS_TIMEOUT}s:\n{logs[name].read_text()}"
                )
            assert rc == 0, f"{name} exited {rc}:\n{logs[name].read_text()}"
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    for name, proc in procs.items():
        assert process_gone(proc.pid), f"{name} (pid {proc.pid}) is still there"

    outputs = {name: path.read_text() for name, path in logs.items()}
    assert tagged_line(outputs["learner"], "REPORT")["updates"] == 2048 // (32 * 2 * 2)
    actor_stats = [tagged_line(outputs[f"actor{i}"], "STATS") for i in (0, 1)]

    report = json.loads((run_dir / "report.json").read_text())
    assert report["updates_completed"] == 16
    assert report["env_steps_consumed"] == 2048
    assert report["broadcasts_sent"] == 16 and report["last_policy_version"] == 16
    assert report["stop_reason"] == "budget spent"
    assert report["episodes_completed"] == len(report["episode_rewards"]) > 0
    assert all(1.0 <= r <= 500.0 for r in report["episode_rewards"])  # CartPole returns
    assert sorted(report["actor_stats"]) == ["0", "1"]
    by_steps = sorted(s["steps_sent"] for s in actor_stats)
    summaries = report["actor_stats"].values()
    assert sorted(s["actor/steps_sent"] for s in summaries) == by_steps
    assert sum(s["steps_consumed"] for s in summaries) == 2048
    for summary in summaries:
        assert summary["said_bye"] is True
        assert summary["num_envs"] == 2
        # Nothing an actor sent was lost on the way, and the learner heard its bye.
        assert summary["steps_received"] == summary["actor/steps_sent"]
        # Rows batches take the oldest rows of either actor: both contribute.
        assert summary["steps_consumed"] > 0
        assert summary["steps_received"] >= summary["steps_consumed"]
        assert summary["actor/policy_updates_received"] >= 1
        assert summary["pid"] in {procs["actor0"].pid, procs["actor1"].pid}
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert sum("eval/mean_return" not in json.loads(line) for line in lines) == 16  # updates
