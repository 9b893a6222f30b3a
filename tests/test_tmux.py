"""bin/zmq-rl-tmux: a real tiny run in a detached session on a private tmux server."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import psutil
import pytest

from tests.conftest import STUB_ENV_ID

pytestmark = pytest.mark.skipif(
    shutil.which("tmux") is None, reason="tmux is not on PATH (bin/zmq-rl-tmux needs it)"
)

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bin" / "zmq-rl-tmux"
REPORT_TIMEOUT_S = 90.0
"""Bound on the whole run: three Python processes importing torch on a busy machine."""
EXIT_LINE_TIMEOUT_S = 20.0


def _cli_commands() -> tuple[str, str]:
    """The learner and actor commands, with this interpreter (the venv's)."""
    return (f"{sys.executable} -m zmq_rl.cli.learner", f"{sys.executable} -m zmq_rl.cli.actor")


class TmuxServer:
    """A private tmux server (``tmux -L NAME``), so a user's sessions are never touched.

    Its socket lives in a temporary ``TMUX_TMPDIR`` (short, for the socket path
    limit), removed afterwards with the socket.
    """

    def __init__(self, socket_dir: str) -> None:
        self.name = f"zmq-rl-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.env = {**os.environ, "TMUX_TMPDIR": socket_dir}
        self.env.pop("TMUX", None)  # even when the tests run inside tmux

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["tmux", "-L", self.name, *args],
            capture_output=True,
            text=True,
            timeout=10,
            env=self.env,
        )

    def panes(self, session: str) -> list[tuple[str, int]]:
        out = self.run("list-panes", "-s", "-t", session, "-F", "#{window_name} #{pane_index}")
        assert out.returncode == 0, out.stderr
        return [(w, int(i)) for w, i in (line.split() for line in out.stdout.splitlines())]

    def capture(self, target: str) -> str:
        """The pane's text, wrapped lines joined, scrollback included."""
        return self.run("capture-pane", "-p", "-J", "-S", "-200", "-t", target).stdout

    def everything(self, session: str) -> str:
        """Every pane's text, for failure messages."""
        try:
            panes = self.panes(session)
        except AssertionError as exc:
            return f"(no panes: {exc})"
        return "\n".join(
            f"--- {w}.{i} ---\n{self.capture(f'{session}:{w}.{i}').strip()}" for w, i in panes
        )

    def wait_for_text(self, target: str, text: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            screen = self.capture(target)
            if text in screen or time.monotonic() > deadline:
                return screen
            time.sleep(0.2)

    def kill(self) -> None:
        self.run("kill-server")


@pytest.fixture
def tmux_server():
    socket_dir = tempfile.mkdtemp(prefix="zmq-rl-tmux-")
    server = TmuxServer(socket_dir)
    try:
        yield server
    finally:
        server.kill()
        shutil.rmtree(socket_dir, ignore_errors=True)


def launch(server: TmuxServer, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """Run the launcher on the private server with ``env`` (plus the server's TMUX_TMPDIR)."""
    return subprocess.run(
        [str(SCRIPT), "-L", server.name, *args],
        cwd=ROOT,
        env={**env, "TMUX_TMPDIR": server.env["TMUX_TMPDIR"]},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_help_lists_every_option():
    out = subprocess.run([str(SCRIPT), "--help"], capture_output=True, text=True, timeout=10)
    assert out.returncode == 0
    for option in (
        "-s NAME",
        "-n N",
        "-H FILE",
        "-a ADDR",
        "-p PORT",
        "-A FLAGS",
        "-L SOCKET",
        "-r N",
        "-b SECONDS",
        "-d",
        "ZMQ_RL_LEARNER_CMD",
        "ZMQ_RL_ACTOR_CMD",
        "kill-session",
    ):
        assert option in out.stdout


@pytest.mark.timeout(REPORT_TIMEOUT_S + 60)  # a backstop: every wait below is bounded
def test_tiny_run_in_a_detached_session(tmp_path, learner_port, tmux_server):
    run_dir = tmp_path / "run"
    learner_cmd, actor_cmd = _cli_commands()
    env = {
        **os.environ,
        "ZMQ_RL_LEARNER_CMD": learner_cmd,
        "ZMQ_RL_ACTOR_CMD": actor_cmd,
        "PYTHONPATH": str(ROOT),
    }
    session = "run"
    started = launch(
        tmux_server,
        env,
        "-s",
        session,
        "-d",
        "-n",
        "2",
        "-p",
        str(learner_port),
        "--",
        "--env-id",
        STUB_ENV_ID,
        "--num-steps",
        "8",
        "--num-envs",
        "2",
        "--fragment-length",
        "8",
        "--total-env-steps",
        "256",
        "--eval-episodes",
        "2",
        "--run-dir",
        str(run_dir),
    )
    assert started.returncode == 0, started.stderr
    assert f"kill-session -t {session}" in started.stdout
    assert f"attach -t {session}" in started.stdout
    try:
        # Panes stay (exit status on screen) after their command ends.
        assert Counter(w for w, _ in tmux_server.panes(session)) == {"learner": 1, "actors": 2}

        report_path = run_dir / "report.json"
        deadline = time.monotonic() + REPORT_TIMEOUT_S
        while not report_path.exists():
            assert time.monotonic() < deadline, (
                f"no report.json within {REPORT_TIMEOUT_S}s\n{tmux_server.everything(session)}"
            )
            time.sleep(0.25)
        report = json.loads(report_path.read_text())
        assert report["updates_completed"] >= 1
        assert report["env_steps_consumed"] >= 256 - 8 * 4
        actors = report["actor_stats"]
        assert len(actors) == 2, actors
        assert all(a["said_bye"] and a["steps_consumed"] > 0 for a in actors.values()), actors

        screen = tmux_server.wait_for_text(
            f"{session}:learner", "learner exited with status", EXIT_LINE_TIMEOUT_S
        )
        assert "learner exited with status 0" in screen, tmux_server.everything(session)
    finally:
        tmux_server.run("kill-session", "-t", session)


FAKE_SSH = """#!/bin/sh
# A stand-in for ssh: drop the options, print the host, run the command here.
while [ "${1#-}" != "$1" ]; do shift; done
host=$1; shift
echo "ssh-to $host: $*"
exec sh -c "$*"
"""


def test_hosts_file_gives_one_ssh_pane_per_host(tmp_path, tmux_server):
    fake_ssh = tmp_path / "fake-ssh"
    fake_ssh.write_text(FAKE_SSH)
    fake_ssh.chmod(0o755)
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("# the actor machines\nnode-a\n\n   node-b --num-envs 8  # the big one\n")
    env = {
        **os.environ,
        "ZMQ_RL_LEARNER_CMD": "echo LEARNER",
        "ZMQ_RL_ACTOR_CMD": "echo ACTOR",
        "ZMQ_RL_SSH": f"{fake_ssh} -t",
    }
    started = launch(
        tmux_server,
        env,
        "-s",
        "hosts",
        "-d",
        "-H",
        str(hosts),
        "-a",
        "10.1.2.3",
        "-p",
        "7000",
        "-A",
        "--seed 5",
        "--",
        "--env-id",
        "CartPole-v1",
    )
    assert started.returncode == 0, started.stderr
    assert Counter(w for w, _ in tmux_server.panes("hosts")) == {"learner": 1, "actors": 2}

    learner = tmux_server.wait_for_text("hosts:learner", "exited with status", 10)
    assert "LEARNER --env-id CartPole-v1 --port 7000 --host 0.0.0.0 --num-actors 2" in learner
    a = tmux_server.wait_for_text("hosts:actors.0", "exited with status", 10)
    b = tmux_server.wait_for_text("hosts:actors.1", "exited with status", 10)
    assert "ssh-to node-a: echo ACTOR --learner '10.1.2.3:7000' --seed 5" in a
    assert "ACTOR --learner 10.1.2.3:7000 --seed 5\n" in a
    assert "ACTOR --learner 10.1.2.3:7000 --seed 5 --num-envs 8" in b
    assert "actor 1 on node-b exited with status 0" in b


def test_refuses_an_existing_session_and_unknown_options(tmux_server):
    env = {**os.environ, "ZMQ_RL_LEARNER_CMD": "echo L", "ZMQ_RL_ACTOR_CMD": "echo A"}
    assert launch(tmux_server, env, "-s", "twice", "-d", "-n", "1").returncode == 0
    again = launch(tmux_server, env, "-s", "twice", "-d", "-n", "1")
    assert again.returncode == 2
    assert "exists already" in again.stderr
    unknown = launch(tmux_server, env, "--port", "1")
    assert unknown.returncode == 2
    assert "learner flags go after '--'" in unknown.stderr


# -- the actor panes' restart loop ------------------------------------------------------

FAKE_ACTOR = """#!/bin/sh
# fake-actor MODE PIDFILE [actor flags...]: record the pid, then exit with MODE's
# status (exitN) or sleep until killed (sleep).
echo $$ >> "$2"
case "$1" in
    exit*) echo "fake actor exits ${1#exit}"; exit "${1#exit}" ;;
    sleep) echo "fake actor runs"; exec sleep 60 ;;
esac
"""


def fake_actor_session(
    server: TmuxServer, tmp_path: Path, mode: str, *flags: str
) -> tuple[str, Path]:
    """One local actor pane running the fake actor in ``mode``; (its target, pid file)."""
    fake = tmp_path / "fake-actor"
    fake.write_text(FAKE_ACTOR)
    fake.chmod(0o755)
    pids = tmp_path / "pids"
    env = {
        **os.environ,
        "ZMQ_RL_LEARNER_CMD": "echo LEARNER",
        "ZMQ_RL_ACTOR_CMD": f"{fake} {mode} {pids}",
    }
    started = launch(server, env, "-s", "loop", "-d", "-n", "1", *flags)
    assert started.returncode == 0, started.stderr
    return "loop:actors.0", pids


def started_pids(pids: Path) -> list[int]:
    return [int(line) for line in pids.read_text().split()] if pids.is_file() else []


def test_a_failing_actor_pane_is_restarted_with_backoff_up_to_the_cap(tmp_path, tmux_server):
    target, pids = fake_actor_session(tmux_server, tmp_path, "exit1", "-r", "2", "-b", "0.2")
    screen = tmux_server.wait_for_text(target, "press Enter to close", EXIT_LINE_TIMEOUT_S)
    assert "actor 0 exited with status 1; restart 1 of 2 in 0.2s" in screen, screen
    assert "actor 0 exited with status 1; restart 2 of 2 in 0.4s" in screen, screen
    assert "actor 0: exit status 1; restarts exhausted (2 of -r 2)" in screen, screen
    assert "actor 0 exited with status 1 (press Enter to close)" in screen
    assert len(started_pids(pids)) == 3


@pytest.mark.parametrize(
    ("mode", "line"),
    [
        ("exit2", "actor 0: exit status 2 (a configuration error): not restarted"),
        ("exit0", "actor 0 exited with status 0 (press Enter to close)"),
        ("exit130", "actor 0 exited with status 130 (press Enter to close)"),
    ],
)
def test_an_actor_pane_is_not_restarted_after_a_clean_exit_or_a_config_error(
    tmp_path, tmux_server, mode, line
):
    target, pids = fake_actor_session(tmux_server, tmp_path, mode, "-b", "0.1")
    screen = tmux_server.wait_for_text(target, "press Enter to close", EXIT_LINE_TIMEOUT_S)
    assert line in screen, screen
    assert "restart 1" not in screen
    assert len(started_pids(pids)) == 1


def test_a_killed_actor_comes_back_in_its_pane(tmp_path, tmux_server):
    """kill -9 of the actor process inside the session: the pane starts it again."""
    target, pids = fake_actor_session(tmux_server, tmp_path, "sleep", "-b", "0.1")
    deadline = time.monotonic() + EXIT_LINE_TIMEOUT_S
    while not started_pids(pids):
        assert time.monotonic() < deadline, tmux_server.capture(target)
        time.sleep(0.1)
    (first,) = started_pids(pids)
    os.kill(first, 9)
    while len(started_pids(pids)) < 2:
        assert time.monotonic() < deadline, tmux_server.capture(target)
        time.sleep(0.1)
    second = started_pids(pids)[1]
    assert second != first
    screen = tmux_server.wait_for_text(target, "restart 1 of 3", EXIT_LINE_TIMEOUT_S)
    assert "actor 0 exited with status 137; restart 1 of 3 in 0.1s" in screen, screen
    tmux_server.run("kill-session", "-t", "loop")
    deadline = time.monotonic() + EXIT_LINE_TIMEOUT_S
    while psutil.pid_exists(second) and psutil.Process(second).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the actor outlived its session"
        time.sleep(0.1)


def test_refuses_bad_restart_options(tmux_server):
    env = {**os.environ, "ZMQ_RL_LEARNER_CMD": "echo L", "ZMQ_RL_ACTOR_CMD": "echo A"}
    for flags, message in ((["-r", "x"], "-r needs a number"), (["-b", "-1"], "-b needs")):
        out = launch(tmux_server, env, "-s", "bad", "-d", *flags)
        assert out.returncode == 2 and message in out.stderr, out.stderr
