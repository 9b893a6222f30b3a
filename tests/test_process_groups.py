"""A test's children die with it (issue 44 §2; tests/process_groups.py): the bench smoke
tests start their scripts through :class:`~tests.process_groups.ProcessGroups`, which
kills a script's whole process group (its own children too) at the end, and every
group still running when the test process itself is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import wait_until
from tests.process_groups import ProcessGroups, run_in_group

ROOT = Path(__file__).resolve().parents[1]
WAIT_S = 20.0

# A child that starts a grandchild (in the child's group, as a bench script's `zmq-rl
# serve`), prints the grandchild's pid (and writes it to argv[2] if given), then exits
# ("leave") or stays ("stay") as told.
PARENT = textwrap.dedent(
    """
    import subprocess, sys, time
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    if len(sys.argv) > 2:
        open(sys.argv[2], "w").write(str(grandchild.pid))
    print(grandchild.pid, flush=True)
    if sys.argv[1] == "stay":
        time.sleep(600)
    """
)


def alive(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(*pids: int) -> None:
    """Wait (bounded) until none of ``pids`` runs any more."""
    wait_until(lambda: not any(alive(p) for p in pids), WAIT_S, f"pids {pids} to exit")


pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")


@pytest.mark.timeout(60)
def test_a_group_is_killed_with_the_children_its_leader_left():
    """The leader exited; its child (same group) still runs: killing the group ends it."""
    with ProcessGroups() as groups:
        proc = groups.popen([sys.executable, "-c", PARENT, "leave"], stdout=subprocess.PIPE)
        grandchild = int(proc.stdout.readline())
        assert proc.wait(WAIT_S) == 0
        assert alive(grandchild)
    wait_gone(grandchild)


@pytest.mark.timeout(60)
def test_run_in_group_kills_the_grandchildren_on_a_timeout(tmp_path):
    pid_file = tmp_path / "pid"
    with pytest.raises(subprocess.TimeoutExpired):
        run_in_group([sys.executable, "-c", PARENT, "stay", str(pid_file)], timeout=5.0)
    wait_gone(int(pid_file.read_text()))


@pytest.mark.timeout(90)
def test_every_group_dies_when_the_test_process_is_killed(tmp_path):
    """What a timed-out test leaves when its process dies without a teardown (SIGKILL):
    the reaper kills every group it had registered."""
    owner = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from tests.process_groups import ProcessGroups
        import subprocess, time
        groups = ProcessGroups()
        proc = groups.popen([sys.executable, "-c", {PARENT!r}, "stay"], stdout=subprocess.PIPE)
        print(proc.pid, proc.stdout.readline().decode().strip(), flush=True)
        time.sleep(600)
        """
    )
    test_process = subprocess.Popen(
        [sys.executable, "-c", owner], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        child, grandchild = (int(x) for x in test_process.stdout.readline().split())
        assert alive(child) and alive(grandchild)
        os.kill(test_process.pid, signal.SIGKILL)  # no teardown, no finally
        test_process.wait(WAIT_S)
        wait_gone(child, grandchild)
    finally:
        if test_process.poll() is None:
            os.killpg(test_process.pid, signal.SIGKILL)
            test_process.wait(WAIT_S)
