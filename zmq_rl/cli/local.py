"""Local actor processes for ``zmq-rl run``: start, watch, and always stop them.

Each actor is ``python -m zmq_rl.cli.actor --learner 127.0.0.1:PORT ...`` in its
own session (so a Ctrl-C at the terminal reaches only the parent, which then stops
the actors in order), with ``--parent-pid`` so that an actor also exits by itself
if the parent dies without cleaning up. Stopping: wait for the actors to exit
after the learner's shutdown, then SIGTERM, wait, SIGKILL, wait: no orphans.

An actor that exits with an error while the learner is still training stops the
run (``Learner.request_stop``, instead of leaving the learner to starve), and the
command then fails with an error that names the actor and shows the end of its log.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from .common import CliFailure

__all__ = ["LocalActors", "connect_host"]

NATURAL_EXIT_S = 15.0
"""How long actors get to exit by themselves after the learner's shutdown."""
TERMINATE_WAIT_S = 5.0
"""How long actors get to exit after SIGTERM before SIGKILL."""
POLL_S = 0.2
LOG_TAIL_LINES = 15


def connect_host(bind_host: str) -> str:
    """The address a local actor uses to reach a learner bound to ``bind_host``."""
    if bind_host in ("", "*", "0.0.0.0"):
        return "127.0.0.1"
    if bind_host in ("::", "[::]"):
        return "::1"
    return bind_host


class LocalActors:
    """A context manager that runs ``count`` actor processes for ``learner``.

    ``log_dir``: each actor's stdout and stderr go to ``log_dir/actor-<i>.log``
    (None: its log to this process's stderr, its final stats line nowhere).
    ``extra_args`` are passed to every actor.
    After ``__exit__``, :attr:`exit_codes` holds each actor's exit code.
    """

    def __init__(
        self,
        learner: Any,
        count: int,
        *,
        log_dir: Path | None = None,
        log_level: str = "info",
        extra_args: Sequence[str] = (),
    ) -> None:
        self.learner = learner
        self.count = count
        self.log_dir = log_dir
        self.log_level = log_level
        self.extra_args = list(extra_args)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[IO[bytes] | None] = []
        self.exit_codes: list[int | None] = []
        self.failure = ""
        self._stop = threading.Event()
        self._monitor: threading.Thread | None = None

    def command(self, actor_id: int) -> list[str]:
        """The command line of actor ``actor_id``."""
        cfg = self.learner.cfg
        host = connect_host(cfg.host)
        address = f"[{host}]:{cfg.port}" if ":" in host else f"{host}:{cfg.port}"
        return [
            sys.executable,
            "-m",
            "zmq_rl.cli.actor",
            "--learner",
            address,
            "--actor-id",
            str(actor_id),
            "--log-level",
            self.log_level,
            "--parent-pid",
            str(os.getpid()),
            *self.extra_args,
        ]

    def log_path(self, actor_id: int) -> Path | None:
        """Where actor ``actor_id`` logs (None: inherited stderr)."""
        return None if self.log_dir is None else self.log_dir / f"actor-{actor_id}.log"

    def __enter__(self) -> LocalActors:
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        try:
            for i in range(self.count):
                path = self.log_path(i)
                log = open(path, "wb") if path else None  # noqa: SIM115 (closed in __exit__)
                self.logs.append(log)
                self.procs.append(
                    subprocess.Popen(
                        self.command(i),
                        stdin=subprocess.DEVNULL,
                        stdout=log if log else subprocess.DEVNULL,
                        stderr=subprocess.STDOUT if log else None,
                        env=env,
                        start_new_session=True,
                    )
                )
        except BaseException:
            self._stop_all(natural=False)
            raise
        self._monitor = threading.Thread(target=self._watch, name="actor-monitor", daemon=True)
        self._monitor.start()
        return self

    def _watch(self) -> None:
        """Interrupt the main thread when an actor fails while the learner trains."""
        while not self._stop.wait(POLL_S):
            for i, proc in enumerate(self.procs):
                code = proc.poll()
                if code is None or code == 0:
                    continue
                if self.learner.report.stop_reason:  # already shutting down
                    continue
                self.failure = (
                    f"actor {i} (pid {proc.pid}) exited with code {code} while the learner "
                    f"was training{self._log_tail(i)}"
                )
                self.learner.request_stop(f"actor {i} exited with code {code}")
                return

    def _log_tail(self, actor_id: int) -> str:
        path = self.log_path(actor_id)
        if path is None or not path.is_file():
            return ""
        lines = path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        body = "\n".join(f"    {line}" for line in lines)
        return f"; end of {path}:\n{body}" if lines else f"; {path} is empty"

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._stop.set()
        if self._monitor is not None:
            self._monitor.join()
        natural = exc_type is None and bool(self.learner.report.stop_reason)
        # Finish stopping the actors whatever arrives meanwhile.
        previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self._stop_all(natural)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if self.failure and exc_type in (None, KeyboardInterrupt):
            raise CliFailure(self.failure)

    def _stop_all(self, natural: bool) -> None:
        """Wait (if the run ended) then terminate, then kill; reap every actor."""
        if natural:
            _wait_all(self.procs, NATURAL_EXIT_S)
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        _wait_all(self.procs, TERMINATE_WAIT_S)
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            proc.wait()
        self.exit_codes = [proc.returncode for proc in self.procs]
        for log in self.logs:
            if log is not None:
                log.close()


def _wait_all(procs: Sequence[subprocess.Popen[bytes]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for proc in procs:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        try:
            proc.wait(remaining)
        except subprocess.TimeoutExpired:
            return
