"""``zmq-rl ray`` on a real local Ray head (``ray start --head``, CPU only) started by
the test: two Ray actors train CartPole; one actor's worker is killed with SIGKILL,
Ray restarts it, its new zmq-actor registers again and the run spends its budget."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers import wait_for
from tests.ports import free_port_block
from tests.ray_head import RayHead, skip_reason

ZMQ_RL = [sys.executable, "-m", "zmq_rl.cli.main"]
RUN_TIMEOUT_S = 240.0
STOP_TIMEOUT_S = 20.0


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    """A local Ray head (tests/ray_head.py); its address."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    head = RayHead(tmp_path_factory.mktemp("ray") / "head.log")
    try:
        yield head.start()
    finally:
        head.stop()


def worker_pids(log_path: Path) -> list[int]:
    """The Ray worker pids that started actor N, from the headers of its log."""
    if not log_path.exists():
        return []
    return [
        int(m)
        for m in re.findall(r"=== zmq-rl ray: actor \d+, worker pid (\d+)", log_path.read_text())
    ]


def test_ray_actors_train_cartpole_and_a_killed_worker_is_restarted(ray_head, tmp_path):
    run_dir = tmp_path / "run"
    budget = 30720
    stderr_path = tmp_path / "zmq-rl.err"
    t0 = time.monotonic()
    with open(stderr_path, "wb") as err:
        proc = subprocess.Popen(
            [
                *ZMQ_RL,
                "ray",
                "--address",
                ray_head,
                "--learner-address",
                "127.0.0.1",
                "--env",
                "CartPole-v1",
                "--actors",
                "2",
                "--run-dir",
                str(run_dir),
                "--port",
                str(free_port_block(3)),
                "--total-env-steps",
                str(budget),
                "--target-return",
                "inf",
                "--eval-every",
                "0",
                # a zmq-actor killed without a bye leaves after this much silence (the
                # preset's 60 s would stall the run that long)
                "--actor-timeout",
                "10",
                # Ray workers importing torch on a loaded two-core machine can take more
                # than the default 60 s to register
                "--starvation-timeout",
                "300",
            ],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,
        )
    try:
        actor0 = run_dir / "logs" / "actor-0.log"

        def first_update() -> bool:
            path = run_dir / "metrics.jsonl"
            assert proc.poll() is None, stderr_path.read_text()[-3000:]
            return path.exists() and path.read_text().count("\n") >= 1

        wait_for(first_update, RUN_TIMEOUT_S, "first update")
        first = time.monotonic() - t0
        (worker,) = worker_pids(actor0)
        killed_at = time.monotonic()
        os.kill(worker, signal.SIGKILL)
        new_worker = wait_for(lambda: worker_pids(actor0)[1:], 60, "a restarted worker")[0]
        assert new_worker != worker
        restarted = time.monotonic() - killed_at

        def collecting() -> bool:
            text = actor0.read_text()
            after = text[text.rfind(f"worker pid {new_worker}") :]
            return "collecting on" in after

        wait_for(collecting, 60, "the restarted actor collecting", poll=0.05)
        collecting_after = time.monotonic() - killed_at

        # kill -9 of actor 1's zmq-actor itself: its Ray actor exits, Ray restarts it.
        actor1 = run_dir / "logs" / "actor-1.log"
        (worker1,) = worker_pids(actor1)
        (child,) = psutil.Process(worker1).children()
        os.kill(child.pid, signal.SIGKILL)
        new_worker1 = wait_for(lambda: worker_pids(actor1)[1:], 60, "actor 1 restarted")[0]
        assert new_worker1 != worker1
        out, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(STOP_TIMEOUT_S)
    assert proc.returncode == 0, stderr_path.read_text()[-3000:]
    report = json.loads((run_dir / "report.json").read_text())
    assert report["stop_reason"] == "budget spent"
    assert budget - 256 < report["env_steps_consumed"] <= budget
    # Two kills cost rows and time, so 475 at exactly this budget is not guaranteed (seen:
    # 467.6, and 183.7 in one clean-clone CI run); the 475 target is the fault-free
    # test's. Still clearly learning (random ~22; the untrained policy's eval ~9):
    assert report["evaluations"][-1]["mean_return"] >= 100, report["evaluations"]
    assert report["ray"]["restarts"] == 2
    workers1 = report["ray"]["workers"]["1"]
    assert [w["worker_pid"] for w in workers1] == [worker1, new_worker1]
    assert workers1[0]["pid"] == child.pid
    assert [w["worker_pid"] for w in report["ray"]["workers"]["0"]] == [worker, new_worker]
    # The restarted worker's zmq-actor registered and delivered experience.
    new_pid = report["ray"]["workers"]["0"][1]["pid"]
    stats = {s["pid"]: s for s in report["actor_stats"].values()}
    assert stats[new_pid]["steps_consumed"] > 0, report["actor_stats"]
    assert re.search(rf"registered from \S+ pid {new_pid}\b", stderr_path.read_text())
    # ... and so did actor 1's, under a new actor id (its old one was taken until the
    # learner declared the killed process dead)
    stats1 = stats[workers1[1]["pid"]]
    assert stats1["steps_consumed"] > 0 and stats1["actor_id"] not in (0, 1)
    assert "actor restarts" in out and "2 by Ray" in out
    wall = report["wall_seconds"]
    print(
        f"\nray: start -> first update {first:.1f}s; {report['env_steps_consumed']} steps in "
        f"{wall:.1f}s = {report['env_steps_consumed'] / wall:.0f} steps/s; kill -9 worker -> "
        f"new worker {restarted:.2f}s, -> collecting {collecting_after:.2f}s; "
        f"eval {report['evaluations'][-1]['mean_return']:.1f}"
    )


def test_actor_resources_are_parsed_and_bad_ones_name_the_field():
    from zmq_rl.cli.ray_launch import parse_resources
    from zmq_rl.config import ConfigError

    assert parse_resources(["sim_node=1", "big=0.5"]) == {"sim_node": 1.0, "big": 0.5}
    for bad in ("sim_node", "=1", "x=-1", "x=lots"):
        with pytest.raises(ConfigError, match="actor_resources") as info:
            parse_resources([bad])
        assert bad in str(info.value)


def test_ray_refuses_curve_keys_it_cannot_hand_to_actors(tmp_path):
    out = subprocess.run(
        [
            *ZMQ_RL,
            "ray",
            "--address",
            "local",
            "--run-dir",
            str(tmp_path / "r"),
            "--curve-secret-key",
            str(tmp_path / "k.key_secret"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert "curve_secret_key" in out.stderr
