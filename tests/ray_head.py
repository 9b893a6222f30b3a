"""A local Ray head for tests and benchmarks: ``ray start --head --block`` in its own
process group and temp dir, CPU only, no dashboard. Stopped by signalling that group and
its descendants, never with ``ray stop`` (which stops every Ray on the machine)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from tests.ports import free_port_block

RAY = Path(sys.executable).parent / "ray"
HEAD_TIMEOUT_S = 180.0
# SIGTERM's grace: Ray's daemons take ~30 s to leave on SIGTERM (measured: none had
# exited after 3 s, all after 33 s), and nothing of a test head outlives SIGKILL (its
# temp dir is removed; /dev/shm keeps nothing), so they get a short one.
STOP_GRACE_S = 3.0
STOP_TIMEOUT_S = 20.0


def skip_reason() -> str | None:
    """Why a Ray head cannot be started here (None: it can)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return "Ray is not installed (pip install 'zmq_rl[ray]'; the test extra has it)"
    if not RAY.exists():
        return f"{RAY} not found (pip install 'zmq_rl[ray]')"
    return None


def _kill(pid: int, sig: int, group: bool) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


class RayHead:
    """``start()`` returns the head's address (``127.0.0.1:PORT``); ``stop()``."""

    def __init__(self, log_path: Path, num_cpus: int = 2) -> None:
        self.log_path = log_path
        self.num_cpus = num_cpus
        self.env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
        # Ray's socket paths must stay short: a temp dir under /tmp.
        self.temp = Path(tempfile.mkdtemp(prefix="zr", dir="/tmp"))
        self.proc: subprocess.Popen[bytes] | None = None
        self.address = ""

    def start(self, attempts: int = 3) -> str:
        """Start the head (again after a failed start: on a loaded machine Ray's own
        start-up can time out); its address."""
        for attempt in range(attempts):
            try:
                return self._start()
            except (RuntimeError, TimeoutError):
                self._stop_processes()
                if attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    def _start(self) -> str:
        """Start the head and wait until ``ray status`` sees its CPUs (bounded by
        :data:`HEAD_TIMEOUT_S`); on failure the caller still has to :meth:`stop`."""
        port = free_port_block(1)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    str(RAY),
                    "start",
                    "--head",
                    "--block",
                    f"--num-cpus={self.num_cpus}",
                    "--disable-usage-stats",
                    "--include-dashboard=false",
                    f"--port={port}",
                    f"--temp-dir={self.temp}",
                    "--node-ip-address=127.0.0.1",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        self.address = f"127.0.0.1:{port}"
        deadline = time.monotonic() + HEAD_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ray start exited: {self.log_path.read_text()[-3000:]}")
            try:
                out = subprocess.run(
                    [str(RAY), "status", f"--address={self.address}"],
                    capture_output=True,
                    text=True,
                    timeout=30,
                    env=self.env,
                )
            except subprocess.TimeoutExpired:  # a slow answer on a loaded machine: ask again
                continue
            if out.returncode == 0 and "CPU" in out.stdout:
                return self.address
            time.sleep(1.0)
        raise TimeoutError(f"no Ray head within {HEAD_TIMEOUT_S:g}s")

    def stop(self) -> None:
        """SIGTERM the head's group, wait, SIGKILL what is left; remove the temp dir."""
        self._stop_processes()
        shutil.rmtree(self.temp, ignore_errors=True)

    def _stop_processes(self) -> None:
        if self.proc is not None:
            try:
                family = psutil.Process(self.proc.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                family = []
            _kill(self.proc.pid, signal.SIGTERM, group=True)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(STOP_GRACE_S)
            _, alive = psutil.wait_procs(family, timeout=STOP_GRACE_S)
            for proc in alive:
                _kill(proc.pid, signal.SIGKILL, group=False)
            # whatever of the group is left (Ray daemons outlive a failed `ray start`)
            _kill(self.proc.pid, signal.SIGKILL, group=True)
            self.proc.wait(STOP_TIMEOUT_S)
            _, alive = psutil.wait_procs(alive, timeout=STOP_TIMEOUT_S)
            if alive:
                raise RuntimeError(f"Ray processes outlived SIGKILL: {alive}")
            self.proc = None
