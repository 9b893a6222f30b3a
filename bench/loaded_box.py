"""Loaded-box drill (issue 44 §1): ``zmq-rl run`` beside CPU hogs on two cores.

A run of CartPole with a GRU policy (a learner and two actor processes; the actors
build a torch network after their welcome, as the runs that failed in the issue did) and ``--hogs``
busy processes are pinned to the same ``--cores`` CPUs, so the box is as loaded as a
laptop running other trainings (8 hogs on 2 cores: load ~10). A healthy run must
spend its budget with no actor declared dead, dropped or restarted, exit 0 and print
its summary. The figures: each of those counts, the longest gap between one actor's
heartbeats the learner saw, the wall time and the load average.

``--base REV`` runs the same drill on an earlier revision too (a git worktree), for
the figure before the fix.

Usage::

    python bench/loaded_box.py                      # 8 hogs on 2 cores, 8192 steps
    python bench/loaded_box.py --base 294567a       # and the revision before issue 44
    python bench/loaded_box.py --smoke              # a short run, 4 hogs
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _util  # noqa: E402

ENV_ID = "CartPole-v1"
RUN_ARGS = ("--policy-type", "gru", "--num-epochs", "4", "--eval-every", "0",
            "--eval-episodes", "2")  # fmt: skip
"""A recurrent policy: the actors' network is a torch module, built (torch imported:
8 s beside 8 hogs on 2 cores) after their welcome, as in the issue's failing runs (a
plain MLP runs in numpy without torch); 4 epochs and one evaluation at the end, so
that a drill takes a minute or two, not ten."""
OUTPUT_TAIL = 4000
Spawn = Callable[..., "subprocess.Popen[bytes]"]
"""Starts a child in a session of its own: ``spawn(argv, **popen_kwargs)``."""


def pinned(cpus: set[int]) -> Any:
    """A ``preexec_fn`` that pins the child (and all it starts) to ``cpus``."""
    return lambda: os.sched_setaffinity(0, cpus)


HOG = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    pass\n"
"""A busy loop that ends when the process that started it is gone (however it ended)."""


def new_session(argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen`` in a session (process group) of its own."""
    return subprocess.Popen(argv, start_new_session=True, **kwargs)


@contextlib.contextmanager
def busy_processes(
    count: int, cpus: set[int], spawn: Spawn = new_session
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``count`` busy Python processes pinned to ``cpus``, each in a process group of
    its own (``spawn``), killed on the way out (and ending by themselves should this
    process die first)."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(count):
            procs.append(spawn([sys.executable, "-c", HOG], preexec_fn=pinned(cpus)))
        yield procs
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in procs:
            proc.wait()


def drill(
    run_dir: Path,
    *,
    port: int,
    hogs: int = 8,
    cpus: set[int] | None = None,
    total_env_steps: int = 8192,
    actor_timeout: float = 10.0,
    timeout: float = 600.0,
    tree: Path = _util.ROOT,
    actors: int = 2,
    spawn: Spawn = new_session,
) -> dict[str, Any]:
    """One ``zmq-rl run`` of ``tree``'s code beside ``hogs`` busy processes, all pinned
    to ``cpus`` (default: the first two this process may use); its figures. ``spawn``
    starts each child in a session of its own (a test passes one whose children die
    with it)."""
    cpus = cpus or set(sorted(os.sched_getaffinity(0))[:2])
    argv = [
        sys.executable, "-m", "zmq_rl", "run",
        "--env", ENV_ID,
        *RUN_ARGS,
        "--actors", str(actors),
        "--total-env-steps", str(total_env_steps),
        "--actor-timeout", str(actor_timeout),
        "--port", str(port),
        "--run-dir", str(run_dir),
        "--no-plot",
        "--no-tensorboard",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": _util.python_path(tree), "OMP_NUM_THREADS": "1"}
    log_path = run_dir.parent / f"{run_dir.name}.log"
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with busy_processes(hogs, cpus, spawn), open(log_path, "wb") as log:
        started = time.monotonic()
        proc = spawn(  # its group is killed on a timeout (its actors follow: --parent-pid)
            argv,
            cwd=tree,  # `python -m` puts the working directory first on the path
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=pinned(cpus),
        )
        try:
            rc = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
        wall = time.monotonic() - started
        load = os.getloadavg()[0]
    output = log_path.read_text(errors="replace")
    return {**figures(run_dir), "rc": rc, "process_wall_s": round(wall, 2),
            "load_avg_1min": round(load, 2), "hogs": hogs, "cores": sorted(cpus),
            "actor_timeout": actor_timeout, "output_tail": output[-OUTPUT_TAIL:]}  # fmt: skip


def figures(run_dir: Path) -> dict[str, Any]:
    """What the run's ``report.json`` says of its actors' fate (empty figures when the
    run wrote none)."""
    try:
        report = json.loads((run_dir / "report.json").read_text())
    except (OSError, ValueError):
        return {"stop_reason": None, "declared_dead": None, "dead_actors": None,
                "dropped_silent": None, "actor_restarts": None}  # fmt: skip
    counters = report.get("counters", {})
    lines = [*report.get("actor_stats", {}).values(), *report.get("departed_actors", [])]
    gaps = [line["longest_heartbeat_gap_s"] for line in lines if "longest_heartbeat_gap_s" in line]
    supervisor = report.get("supervisor", {})
    return {
        "stop_reason": report.get("stop_reason"),
        "env_steps": report.get("env_steps_consumed"),
        "wall_s": round(report.get("wall_seconds", 0.0), 2),
        "declared_dead": counters.get("actors/declared_dead", 0),
        "dead_actors": report.get("dead_actors", []),
        "dropped_silent": counters.get("actors/dropped_silent", 0),
        "rejected_unknown_actor": counters.get("rejected/experience/unknown_actor", 0)
        + counters.get("rejected/control/unknown_actor", 0),
        "reregistrations": int(sum(line.get("actor/reregistrations", 0) for line in lines)),
        "actor_restarts": len(supervisor.get("restarts", [])),
        "longest_heartbeat_gap_s": max(gaps, default=None),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _util.add_common_flags(parser)
    _util.add_base_flags(parser)
    parser.add_argument("--hogs", type=int, default=8, help="busy processes beside the run")
    parser.add_argument("--cores", type=int, default=2, help="CPUs the run and hogs share")
    parser.add_argument("--total-env-steps", type=int, default=8192)
    parser.add_argument("--actor-timeout", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    parser.add_argument("--keep", default="", help="keep the run dirs in this folder")
    args = parser.parse_args(argv)
    if args.smoke:
        args.hogs, args.total_env_steps, args.rounds = 4, 1024, 1
    cpus = set(sorted(os.sched_getaffinity(0))[: args.cores])
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="loaded-box-"))
    rows = []
    with _util.revision_trees(args.base, args.base_tree) as trees:
        for r in range(args.rounds):
            for name, tree in _util.round_order(list(trees.items()), r):
                port = args.port or _util.free_port_block(3)
                row = drill(
                    work / f"{name.replace(' ', '-')}-{r}",
                    port=port, hogs=args.hogs, cpus=cpus,
                    total_env_steps=args.total_env_steps, actor_timeout=args.actor_timeout,
                    timeout=args.timeout, tree=tree,
                )  # fmt: skip
                row = {"tree": name, "round": r, **row}
                rows.append(row)
                print(
                    f"{name} round {r}: rc {row['rc']}, {row['stop_reason']}, "
                    f"{row['declared_dead']} declared dead, {row['dropped_silent']} dropped, "
                    f"{row['reregistrations']} re-registrations, {row['actor_restarts']} actor "
                    f"restarts, longest heartbeat gap {row.get('longest_heartbeat_gap_s')} s, "
                    f"{row['process_wall_s']:.0f} s at load {row['load_avg_1min']}",
                    flush=True,
                )
    _util.write_result(
        "loaded_box",
        args,
        {
            "config": {
                "env": ENV_ID,
                "run_args": " ".join(RUN_ARGS),
                "actors": 2,
                "hogs": args.hogs,
                "cores": sorted(cpus),
                "total_env_steps": args.total_env_steps,
                "actor_timeout": args.actor_timeout,
            },  # fmt: skip
            "rows": [{k: v for k, v in row.items() if k != "output_tail"} for row in rows],
        },
    )
    failed = [r for r in rows if r["tree"] == "this tree" and (r["rc"] or r["declared_dead"])]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
