"""``bench/fleet.py --hosts``: the learner on one network-namespace host and every actor
on a host of its own, each link limited to ``rate_mbit`` (``tc tbf`` on every host's
``eth0``) and delayed to a round trip of ``rtt_ms``, CURVE on.

The delay is ``tc netem`` on every host's ``eth0`` where the kernel has netem, else the
user-space delay line of tests/netns.py on a host of its own, through which the actors
reach the learner (half the round trip each way). Keys come from ``zmq-rl keys``: the
learner authorises every actor's public key. One run: ``zmq-learner`` (the env's preset,
``--num-actors N``, the target) and N ``zmq-actor`` processes, timed from the learner's
launch to its progress line at the score, then SIGINT; the figures are
``bench/scaling.py``'s :func:`run_figures`. Needs root and iproute2.
"""

from __future__ import annotations

import contextlib
import math
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _util  # noqa: E402
from scaling import BUDGET, run_figures  # noqa: E402
from time_to_solve import _zmq_solved  # noqa: E402

from tests.netns import Topology, netem_unavailable  # noqa: E402

BIN = Path(sys.executable).parent
STOP_S = 30.0
"""Bound on the learner and actors leaving after the SIGINT."""


def _exe(name: str, module: str) -> list[str]:
    exe = BIN / name
    return [str(exe)] if exe.is_file() else [sys.executable, "-m", module]


def _tc(topo: Topology, host: str, *args: str) -> None:
    done = subprocess.run(
        [*topo.prefix(host), "tc", "qdisc", "replace", "dev", "eth0", "root", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if done.returncode != 0:
        raise RuntimeError(f"tc {' '.join(args)} on {host}: {done.stderr.strip()}")


def run_on_hosts(
    tree: Path,
    env: str,
    actors: int,
    seed: int,
    target: float,
    cap: float,
    flags: list[str],
    *,
    rtt_ms: float,
    rate_mbit: float,
) -> dict[str, Any]:
    """One run of ``tree`` on hosts of their own (see the module); the figures of
    :func:`~scaling.run_figures` plus how the link was made."""
    work = Path(tempfile.mkdtemp(prefix="fleet-hosts-"))
    names = ["l", "wan", *(f"a{i}" for i in range(actors))]
    topo = Topology(names, tag=f"fl{os.getpid() % 1000}")
    procs: list[subprocess.Popen[str]] = []
    env_vars = {**os.environ, "PYTHONPATH": _util.python_path(tree), "OMP_NUM_THREADS": "1",
                "PYTHONUNBUFFERED": "1"}  # fmt: skip

    def start(host: str, argv: list[str], log: Path | None) -> subprocess.Popen[str]:
        out = subprocess.PIPE if log is None else open(log, "w")  # noqa: SIM115
        proc = subprocess.Popen(
            [*topo.prefix(host), *argv], cwd=_util.ROOT, env=env_vars, text=True,
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        procs.append(proc)
        return proc

    try:
        topo.up()
        netem = not netem_unavailable()
        for host in names:
            rate = f"{rate_mbit:g}mbit"
            if netem and host != "wan":
                _tc(topo, host, "netem", "delay", f"{rtt_ms / 2:g}ms", "rate", rate)
            elif host != "wan":
                _tc(topo, host, "tbf", "rate", rate, "burst", "64kb", "latency", "400ms")
        keys = work / "keys"
        for name in ["learner", *(f"actor{i}" for i in range(actors))]:
            subprocess.run([*_exe("zmq-rl", "zmq_rl.cli.main"), "keys", str(keys / name),
                            "--name", name], check=True, capture_output=True, env=env_vars,
                           timeout=60)  # fmt: skip
        authorized = work / "authorized"
        authorized.mkdir()
        for i in range(actors):
            (authorized / f"actor{i}.key").write_bytes(
                (keys / f"actor{i}" / f"actor{i}.key").read_bytes()
            )
        port = _util.free_port_block(3)
        run_dir = work / "run"
        learner_argv = [
            *_exe("zmq-learner", "zmq_rl.cli.learner"), "--env", env,
            "--num-actors", str(actors), "--seed", str(seed), "--target-return", str(target),
            "--total-env-steps", str(BUDGET), "--host", topo.address("l"), "--port", str(port),
            "--run-dir", str(run_dir), "--log-level", "warning", "--no-tensorboard",
            "--curve-secret-key", str(keys / "learner" / "learner.key_secret"),
            "--curve-authorized-keys", str(authorized), *flags,
        ]  # fmt: skip
        launched = time.monotonic()
        learner = start("l", learner_argv, None)
        address = topo.address("l")
        if not netem:  # the actors reach the learner through the delay line
            address = topo.address("wan")
            line = [sys.executable, "-m", "tests.netns", "delay-line", topo.address("wan"),
                    topo.address("l"), str(rtt_ms / 2000), str(cap + 60),
                    *map(str, range(port, port + 3))]  # fmt: skip
            start("wan", line, work / "line.log")
        for i in range(actors):
            start(f"a{i}", [
                *_exe("zmq-actor", "zmq_rl.cli.actor"), "--learner", f"{address}:{port}",
                "--log-level", "warning", "--register-timeout", str(cap),
                "--curve-secret-key", str(keys / f"actor{i}" / f"actor{i}.key_secret"),
                "--curve-server-key", str(keys / "learner" / "learner.key"),
            ], work / f"actor{i}.log")  # fmt: skip
        lines = _read_until_solved(learner, launched, _zmq_solved(target), cap)
        if learner.poll() is None:
            learner.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            learner.wait(STOP_S)
        code = learner.poll()
        row = run_figures(run_dir, lines, _zmq_solved(target), target, actors, seed, code or 0)
        row["link"] = (
            f"tc netem {rtt_ms:g} ms + {rate_mbit:g} Mbit/s"
            if netem
            else f"delay line {rtt_ms:g} ms round trip + tc tbf {rate_mbit:g} Mbit/s"
        )
        return row
    finally:
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        topo.close()


def _read_until_solved(
    proc: subprocess.Popen[str], launched: float, solved: Any, cap: float
) -> list[tuple[float, str]]:
    """``proc``'s output lines with their time since ``launched``, until a line is
    ``solved``, the process ends or ``cap`` seconds passed."""
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    out: list[tuple[float, str]] = []
    deadline = launched + cap
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=min(left, 1.0))
        except queue.Empty:
            continue
        if line is None:
            break
        out.append((time.monotonic() - launched, line))
        if solved(line):
            break
    return out if out else [(math.inf, "")]
