"""The cluster launchers against ``zmq-rl run``, on this machine (docs/clusters.md).

Three runs of the same job (CartPole-v1, 2 actors x 4 envs, a fixed budget, no
evaluation): ``zmq-rl run``; ``zmq-rl slurm`` on a one-node Slurm cluster that this
script starts (munged, slurmctld, slurmd; needs root and Debian's slurm-wlm + munge);
``zmq-rl ray`` on a local Ray head that it starts. For each:

* **submit -> first update**: from starting the command (``zmq-rl slurm`` includes
  sbatch and the scheduler) to the first row of ``metrics.jsonl``;
* **steps/s**: env steps consumed per second between update 3 and the kill, from
  ``metrics.jsonl`` (the learner's clock);
* **kill -> replacement collecting**: ``kill -9`` of one actor at 40 % of the budget
  (``zmq-rl run`` and Slurm: the zmq-actor process; Ray: the Ray worker process, as a
  lost node would) until the replacement's ``collecting on`` line appears in its log
  (polled every 20 ms). Its first fragment follows ``fragment_length`` (32) steps later;
  the report's ``actor_stats`` confirms the replacement delivered experience.

Usage: ``python bench/clusters.py [--budget 20480] [--only local,slurm,ray]``
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _util  # (puts the repository on sys.path)
import psutil

from tests.ray_head import RayHead
from tests.ray_head import skip_reason as ray_skip_reason
from tests.slurm_cluster import SlurmCluster
from tests.slurm_cluster import skip_reason as slurm_skip_reason

free_port_block = _util.free_port_block  # honours --port

ZMQ_RL = [sys.executable, "-m", "zmq_rl.cli.main"]
POLL_S = 0.02
TIMEOUT_S = 300.0


def rows(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                break
            if "eval/mean_return" not in row:  # update rows only, not evaluations
                out.append(row)
    return out


def wait_for(predicate: Any, what: str, timeout: float = TIMEOUT_S) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(POLL_S)
    raise TimeoutError(f"no {what} within {timeout:g}s")


def collecting_count(log: Path) -> int:
    return log.read_text(errors="replace").count("collecting on") if log.exists() else 0


def zmq_actor_pids(port: int) -> list[int]:
    pids = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        joined = " ".join(cmd)
        if any(c.endswith(("zmq-actor", "zmq_rl.cli.actor")) for c in cmd[:3]) and (
            f":{port} " in joined + " "
        ):
            pids.append(proc.pid)
    return sorted(pids)


def measure(
    name: str,
    start: Any,
    run_dir: Path,
    port: int,
    budget: int,
    kill: Any,
    done: Any,
) -> dict[str, Any]:
    """Start a run (``start()``), time its first update, kill an actor at 40 % of the
    budget (``kill()`` returns the log of the killed actor), time the replacement,
    wait for the end (``done()``); the figures."""
    t0 = time.monotonic()
    start()
    wait_for(lambda: rows(run_dir), f"{name}: first update")
    first_update = time.monotonic() - t0
    wait_for(lambda: len(zmq_actor_pids(port)) == 2, f"{name}: two actors")
    wait_for(lambda: rows(run_dir)[-1]["env_steps"] >= 0.4 * budget, f"{name}: 40 %")
    before = rows(run_dir)
    log = kill()
    seen = collecting_count(log)
    killed = time.monotonic()
    wait_for(lambda: collecting_count(log) > seen, f"{name}: replacement collecting")
    replaced = time.monotonic() - killed
    done()
    report = json.loads((run_dir / "report.json").read_text())
    a, b = before[2], before[-1]
    sps = (b["env_steps"] - a["env_steps"]) / (b["wall_seconds"] - a["wall_seconds"])
    result = {
        "launcher": name,
        "submit_to_first_update_s": round(first_update, 2),
        "steps_per_s": round(sps, 1),
        "kill_to_replacement_collecting_s": round(replaced, 2),
        "env_steps_consumed": report["env_steps_consumed"],
        "stop_reason": report["stop_reason"],
        "actors_delivering_at_end": sum(
            1 for s in report["actor_stats"].values() if s["steps_consumed"] > 0
        ),
    }
    print(json.dumps(result), flush=True)
    return result


def common_flags(run_dir: Path, port: int, budget: int) -> list[str]:
    return [
        "--env", "CartPole-v1", "--actors", "2", "--run-dir", str(run_dir), "--port", str(port),
        "--total-env-steps", str(budget), "--target-return", "inf", "--eval-every", "0",
        "--actor-timeout", "10", "--starvation-timeout", "300",
    ]  # fmt: skip


def bench_local(root: Path, budget: int) -> dict[str, Any]:
    run_dir, port = root / "local", free_port_block(3)
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        cmd = [*ZMQ_RL, "run", *common_flags(run_dir, port, budget), "--no-plot"]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def kill() -> Path:
        os.kill(zmq_actor_pids(port)[0], signal.SIGKILL)
        return run_dir / "logs" / "actor-0.log"  # the lower pid: actor 0, started first

    try:
        return measure("zmq-rl run", start, run_dir, port, budget, kill, lambda: procs[0].wait(300))
    finally:
        if procs and procs[0].poll() is None:
            procs[0].terminate()  # SIGTERM: the run stops and stops its actors
            try:
                procs[0].wait(60)
            except subprocess.TimeoutExpired:
                procs[0].kill()
                procs[0].wait(60)


def bench_slurm(root: Path, budget: int) -> dict[str, Any]:
    cluster = SlurmCluster(root / "slurm-cluster")
    run_dir, port = root / "slurm", free_port_block(3)
    job: list[str] = []
    try:
        cluster.start()

        def start() -> None:
            out = subprocess.run(
                [*ZMQ_RL, "slurm", *common_flags(run_dir, port, budget)],
                capture_output=True, text=True, env=cluster.env, timeout=60, check=True,
            )  # fmt: skip
            job.append(re.search(r"submitted job (\d+)", out.stdout).group(1))

        def kill() -> Path:
            pid = zmq_actor_pids(port)[0]
            task = next(
                i for i in (0, 1)
                if f"--actor-id {i}" in " ".join(psutil.Process(pid).cmdline())
            )  # fmt: skip
            os.kill(pid, signal.SIGKILL)
            return run_dir / "logs" / f"actor-{task}.log"

        def done() -> None:
            fields = cluster.wait_state(job[0], ("COMPLETED", "FAILED", "CANCELLED"), TIMEOUT_S)
            assert fields["JobState"] == "COMPLETED", fields

        return measure("zmq-rl slurm", start, run_dir, port, budget, kill, done)
    finally:
        cluster.stop()


def bench_ray(root: Path, budget: int) -> dict[str, Any]:
    head = RayHead(root / "ray-head.log")
    run_dir, port = root / "ray", free_port_block(3)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        address = head.start()

        def start() -> None:
            cmd = [*ZMQ_RL, "ray", "--address", address, "--learner-address", "127.0.0.1",
                   *common_flags(run_dir, port, budget)]  # fmt: skip
            procs.append(
                subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            )

        def kill() -> Path:
            log = run_dir / "logs" / "actor-0.log"
            worker = re.findall(r"worker pid (\d+)", log.read_text())[-1]
            os.kill(int(worker), signal.SIGKILL)
            return log

        def done() -> None:
            assert procs[0].wait(TIMEOUT_S) == 0

        return measure("zmq-rl ray", start, run_dir, port, budget, kill, done)
    finally:
        if procs and procs[0].poll() is None:
            procs[0].terminate()
            try:
                procs[0].wait(60)
            except subprocess.TimeoutExpired:
                procs[0].kill()
                procs[0].wait(60)
        head.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget", type=int, default=20480, help="env steps per run")
    parser.add_argument("--only", default="local,slurm,ray", help="which launchers, in order")
    parser.add_argument(
        "--out", default=str(_util.RESULTS / "clusters.json"), help="the JSON to write"
    )
    _util.add_port_flag(parser)
    args = parser.parse_args()
    results = []
    benches = {"local": bench_local, "slurm": bench_slurm, "ray": bench_ray}
    skips = {"slurm": slurm_skip_reason(), "ray": ray_skip_reason()}
    with tempfile.TemporaryDirectory(prefix="zmq-rl-clusters-") as tmp:
        for name in args.only.split(","):
            if skips.get(name):
                print(f"{name}: skipped: {skips[name]}")
                continue
            results.append(benches[name](Path(tmp), args.budget))
    out = {"budget": args.budget, "load_avg": os.getloadavg(), "results": results}
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
