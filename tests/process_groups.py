"""Children that die with the test (issue 44 §2): a bench smoke test that timed out
left its ``zmq-rl serve`` running for 21 minutes, because only the script it started
was killed, not the script's own children.

:class:`ProcessGroups` starts each child in a session (process group) of its own and
kills whole groups: in :meth:`ProcessGroups.close` (a fixture's teardown, a
``finally``) and, should the test process itself die first (killed by a timeout or
SIGKILL, so that no teardown runs), from a small reaper process that holds a pipe
from the test process and kills every group still registered when that pipe closes.
A group is unregistered once it was killed and reaped here, so the reaper never
signals a process group id that may have been reused since.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["REAP_WAIT_S", "ProcessGroups", "kill_group", "run_in_group"]

REAP_WAIT_S = 10.0
"""How long :meth:`ProcessGroups.close` waits for a killed child to be reaped."""

_REAPER = r"""
import os, signal, sys
groups = set()
for line in sys.stdin:  # the test process holds the other end: EOF when it is gone
    word = line.strip()
    if word == "done":
        sys.exit(0)
    pgid = int(word)
    if pgid > 0:
        groups.add(pgid)
    else:
        groups.discard(-pgid)
for pgid in groups:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
"""


def kill_group(proc: subprocess.Popen[Any], sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to the whole process group led by ``proc`` (started in a session of
    its own), even when ``proc`` itself has exited and its children have not."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


class ProcessGroups:
    """Start children in sessions of their own; kill every one's group at the end,
    whatever ends the test (see the module docstring). A context manager."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[Any]] = []
        self._reaper = subprocess.Popen(
            [sys.executable, "-c", _REAPER],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # a signal to the test's own group spares it
            text=True,
        )

    def _tell(self, word: str) -> None:
        stdin = self._reaper.stdin
        assert stdin is not None
        with contextlib.suppress(BrokenPipeError, ValueError):
            stdin.write(word + "\n")
            stdin.flush()

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """``subprocess.Popen(argv, **kwargs)`` in a new session, registered here."""
        proc = subprocess.Popen(list(argv), start_new_session=True, **kwargs)
        self.procs.append(proc)
        self._tell(str(proc.pid))
        return proc

    def kill(self, proc: subprocess.Popen[Any]) -> None:
        """Kill ``proc``'s group now and reap ``proc`` (bounded)."""
        kill_group(proc)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(REAP_WAIT_S)
        self._tell(str(-proc.pid))

    def close(self) -> None:
        """Kill every group started here, reap the children, let the reaper go."""
        for proc in self.procs:
            self.kill(proc)
        self._tell("done")
        with contextlib.suppress(OSError):
            assert self._reaper.stdin is not None
            self._reaper.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._reaper.wait(REAP_WAIT_S)

    def __enter__(self) -> ProcessGroups:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def run_in_group(
    argv: Sequence[str], timeout: float, **kwargs: Any
) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run(argv, timeout=timeout, capture_output=True, **kwargs)`` whose
    child dies with its own children: on the timeout (or anything else that ends the
    wait) its whole group is killed, then ``TimeoutExpired`` is raised as by
    ``subprocess.run``."""
    with ProcessGroups() as groups:
        proc = groups.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            groups.kill(proc)
            proc.communicate()
            raise
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
