"""What one actor process costs to start and to keep: ``zmq-actor`` against a real
``zmq-learner`` (CartPole-v1, the plain MLP), per tree measured.

For each round and tree it launches a learner (one actor, a short budget, no
target) and then ``python -m zmq_rl.cli.actor`` with that tree's code, and reads
from the actor's ``/proc/PID``:

* ``ready_s``: seconds from the actor's launch (once the learner is bound) to its
  "collecting on" log line (imports, registration, the network built, the envs made);
* ``ready_cpu_s``: the CPU seconds (user + system) it had used by then;
* ``peak_rss_mb``: its peak resident memory (``VmHWM``) near the end of the run;
* ``torch_loaded``: whether torch's library was mapped into it.

Rounds alternate the trees' order. Run on an otherwise idle machine: the figures
are start-up CPU, which any other load stretches.

    python bench/actor_footprint.py --base-tree DIR     # this tree against DIR
    python bench/actor_footprint.py --smoke             # one round, this tree
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _util  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(tree: Path, steps: int, timeout: float = 120.0) -> dict[str, Any]:
    """One learner and one actor of ``tree``'s code; the actor's figures."""
    port = _util.free_port_block(3)
    env = {**os.environ, "PYTHONPATH": _util.python_path(tree)}
    run_dir = tempfile.mkdtemp(prefix="footprint-")
    learner = subprocess.Popen(
        [sys.executable, "-m", "zmq_rl.cli.learner", "--env", "CartPole-v1",
         "--num-actors", "1", "--total-env-steps", str(steps), "--port", str(port),
         "--run-dir", run_dir, "--target-return", "inf", "--eval-every", "0"],
        cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    assert learner.stdout is not None
    # The actor starts once the learner is bound, so that its figures are its own.
    for line in learner.stdout:
        if line.startswith(b"waiting for"):
            break
    else:
        raise RuntimeError("the learner exited before it bound its sockets")
    threading.Thread(target=learner.stdout.read, daemon=True).start()  # keep it drained
    log = Path(run_dir) / "actor.log"
    started = time.monotonic()
    with log.open("wb") as sink:
        actor = subprocess.Popen(
            [sys.executable, "-m", "zmq_rl.cli.actor", "--learner", f"127.0.0.1:{port}",
             "--env", "CartPole-v1"],
            cwd=tree, env=env, stdout=sink, stderr=subprocess.STDOUT,
        )  # fmt: skip
    row: dict[str, Any] = {}
    try:
        deadline = started + timeout
        while b"collecting on" not in log.read_bytes():
            if actor.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the actor did not start: {log.read_text()[-2000:]}")
            time.sleep(0.005)
        row["ready_s"] = time.monotonic() - started
        row["ready_cpu_s"] = _cpu_s(actor.pid)
        maps = Path(f"/proc/{actor.pid}/maps").read_text()
        row["torch_loaded"] = "libtorch" in maps
        peak = 0.0
        while actor.poll() is None and time.monotonic() < deadline:
            try:
                peak = max(peak, _peak_rss_mb(actor.pid))
            except OSError:  # it exited between the poll and the read
                break
            time.sleep(0.05)
        row["peak_rss_mb"] = peak
        if actor.wait(timeout=max(deadline - time.monotonic(), 1.0)) != 0:
            raise RuntimeError(f"the actor failed: {log.read_text()[-2000:]}")
        learner.wait(timeout=60)
    finally:
        for proc in (actor, learner):
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _util.add_common_flags(parser)
    _util.add_base_flags(parser)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30_000, help="the run's env-step budget")
    args = parser.parse_args()
    rounds, steps = (1, 2_048) if args.smoke else (args.rounds, args.steps)
    rows: list[dict[str, Any]] = []
    with _util.revision_trees(args.base, args.base_tree) as trees:
        names = list(trees)
        for r in range(rounds):
            for name in _util.round_order(names, r):
                row = {"code": name, "round": r, **measure(trees[name], steps)}
                rows.append(row)
                print(
                    f"{name}: ready {row['ready_s']:.2f} s, {row['ready_cpu_s']:.2f} s CPU, "
                    f"peak RSS {row['peak_rss_mb']:.0f} MB, torch {row['torch_loaded']}",
                    flush=True,
                )
    table = []
    for name in names:
        mine = [row for row in rows if row["code"] == name]
        table.append(
            [
                name,
                len(mine),
                f"{_util.median([row['ready_s'] for row in mine]):.2f}",
                f"{_util.median([row['ready_cpu_s'] for row in mine]):.2f}",
                f"{_util.median([row['peak_rss_mb'] for row in mine]):.0f}",
                "yes" if any(row["torch_loaded"] for row in mine) else "no",
            ]
        )
    print()
    _util.print_table(
        ["code", "rounds", "ready s (median)", "CPU s to ready", "peak RSS MB", "torch"], table
    )
    _util.write_result("actor_footprint", args, {"steps": steps, "rows": rows})


if __name__ == "__main__":
    main()
