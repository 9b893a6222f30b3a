"""``zmq-rl ray`` on a real local Ray head (``ray start --head``, CPU only) started by
the test: two Ray actors train CartPole; one actor's worker is killed with SIGKILL,
Ray restarts it, its new zmq-actor registers again and the run spends its budget."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from tests.ports import free_port_block

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'zmq_rl[ray]')")

RAY = Path(sys.executable).parent / "ray"
ZMQ_RL = [sys.executable, "-m", "zmq_rl.cli.main"]
HEAD_TIMEOUT_S = 90.0
RUN_TIMEOUT_S = 240.0
STOP_TIMEOUT_S = 20.0


def wait_for(predicate, timeout: float, what: str, poll: float = 0.1):
    """Poll ``predicate`` until it returns something truthy (bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise TimeoutError(f"no {what} within {timeout:g}s")


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    """A Ray head on this machine (2 CPUs, no dashboard) in its own process group and
    temp dir; its address. Stopped by signalling that group (never ``ray stop``,
    which would stop every Ray on the machine)."""
    if not RAY.exists():
        pytest.skip(f"{RAY} not found (pip install 'zmq_rl[ray]')")
    # Ray's socket paths must stay short: a temp dir under /tmp, not pytest's.
    temp = Path(tempfile.mkdtemp(prefix="zr", dir="/tmp"))
    port = free_port_block(1)
    log = open(tmp_path_factory.mktemp("ray") / "head.log", "wb")  # noqa: SIM115
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    head = subprocess.Popen(
        [
            str(RAY),
            "start",
            "--head",
            "--block",
            "--num-cpus",
            "2",
            "--disable-usage-stats",
            "--include-dashboard=false",
            f"--port={port}",
            f"--temp-dir={temp}",
            "--node-ip-address=127.0.0.1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    address = f"127.0.0.1:{port}"
    try:

        def up() -> bool:
            assert head.poll() is None, Path(log.name).read_text()[-3000:]
            out = subprocess.run(
                [str(RAY), "status", f"--address={address}"],
                capture_output=True,
                text=True,
                timeout=30,
                env=env,
            )
            return out.returncode == 0 and "CPU" in out.stdout

        wait_for(up, HEAD_TIMEOUT_S, "Ray head", poll=1.0)
        yield address
    finally:
        family = [head, *_descendants(head.pid)]
        with_suppress_kill(head.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            head.wait(STOP_TIMEOUT_S)
        _, alive = psutil.wait_procs(
            [p for p in family if isinstance(p, psutil.Process)], timeout=STOP_TIMEOUT_S
        )
        for proc in alive:
            with_suppress_kill(proc.pid, signal.SIGKILL, group=False)
        if head.poll() is None:
            with_suppress_kill(head.pid, signal.SIGKILL)
            head.wait(STOP_TIMEOUT_S)
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def with_suppress_kill(pid: int, sig: int, group: bool = True) -> None:
    try:
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


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
        out, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(STOP_TIMEOUT_S)
    assert proc.returncode == 0, stderr_path.read_text()[-3000:]
    report = json.loads((run_dir / "report.json").read_text())
    assert report["stop_reason"] == "budget spent"
    assert budget - 256 < report["env_steps_consumed"] <= budget
    assert report["evaluations"][-1]["mean_return"] >= 475, report["evaluations"]
    assert report["ray"]["restarts"] == 1
    assert [w["worker_pid"] for w in report["ray"]["workers"]["0"]] == [worker, new_worker]
    # The restarted worker's zmq-actor registered and delivered experience.
    new_pid = report["ray"]["workers"]["0"][1]["pid"]
    stats = {s["pid"]: s for s in report["actor_stats"].values()}
    assert stats[new_pid]["steps_consumed"] > 0, report["actor_stats"]
    assert re.search(rf"registered from \S+ pid {new_pid}\b", stderr_path.read_text())
    assert "actor restarts" in out and "1 by Ray" in out
    wall = report["wall_seconds"]
    print(
        f"\nray: start -> first update {first:.1f}s; {report['env_steps_consumed']} steps in "
        f"{wall:.1f}s = {report['env_steps_consumed'] / wall:.0f} steps/s; kill -9 worker -> "
        f"new worker {restarted:.2f}s, -> collecting {collecting_after:.2f}s; "
        f"eval {report['evaluations'][-1]['mean_return']:.1f}"
    )
