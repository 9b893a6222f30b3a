"""Issue 20, the command-line layer: what an operator and a newcomer run into.

* SIGHUP (a closed terminal or ssh session, ``tmux kill-session``) stops
  ``zmq-learner``, ``zmq-rl run`` and ``zmq-actor`` exactly like SIGTERM: report,
  checkpoint and policy written, the actors told to stop, exit 130. Real processes,
  a real pseudo-terminal that is closed under the learner, and a real tmux session.
* Run dirs: one that cannot be created, or that holds a run already, is one
  ``error:`` line and exit 2; default run dirs are unique even within a second.
* Per-env presets say so in the first line of output.
* Small items: no prefix matching of flags, one-line usage errors, a learner host
  that does not resolve, ``zmq-rl eval`` of files that are not policies, the tmux
  launcher installed by pip, unsupported spaces refused in one line, and
  ``zmq-actor --help`` without importing torch.

Every wait is bounded; processes are polled, never slept on.
"""

from __future__ import annotations

import configparser
import contextlib
import fcntl
import importlib.metadata
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import termios
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from tests.conftest import STUB_ENV_ID
from zmq_rl.cli import actor as actor_cli
from zmq_rl.cli import learner as learner_cli
from zmq_rl.cli import main as main_cli
from zmq_rl.cli.flags import CliParser
from zmq_rl.run import common

ROOT = Path(__file__).resolve().parents[1]
PROCESS_TIMEOUT_S = 120.0
"""Bound on each process wait: Python processes importing torch on a busy 2-core box."""
POLL_S = 0.05


# -- processes ------------------------------------------------------------------------


def _module(name: str) -> list[str]:
    return [sys.executable, "-m", f"zmq_rl.cli.{name}"]


class Procs:
    """Processes of one test, their output in files; whatever is left is killed."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        if "stdout" not in kwargs:
            out = open(self.folder / f"{name}.log", "wb")  # noqa: SIM115 (closed by Popen's owner)
            kwargs.update(stdout=out, stderr=subprocess.STDOUT)
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        proc = subprocess.Popen(argv, cwd=ROOT, **kwargs)
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        path = self.folder / f"{name}.log"
        return path.read_text(errors="replace") if path.is_file() else ""

    def logs(self) -> str:
        return "\n".join(f"--- {n} ---\n{self.log(n)[-3000:]}" for n in self.procs)

    def wait(self, name: str, timeout: float = PROCESS_TIMEOUT_S) -> int:
        try:
            return self.procs[name].wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{name} still running after {timeout:.0f}s\n{self.logs()}")

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    owner = Procs(tmp_path)
    try:
        yield owner
    finally:
        owner.close()


def wait_for(
    ready: Callable[[], bool], what: str, procs: Procs | None = None, timeout: float = 90.0
) -> None:
    """Poll ``ready`` until it holds; fail naming ``what`` (and the logs) after ``timeout``
    or as soon as one of ``procs`` has exited."""
    deadline = time.monotonic() + timeout
    while not ready():
        if procs is not None:
            gone = [n for n, p in procs.procs.items() if p.poll() is not None]
            if gone:
                pytest.fail(f"{gone} exited while waiting for {what}\n{procs.logs()}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout:.0f}s\n{procs.logs() if procs else ''}")
        time.sleep(POLL_S)


def has_update(run_dir: Path) -> bool:
    path = run_dir / "metrics.jsonl"
    return path.is_file() and path.stat().st_size > 0


def learner_flags(port: int, run_dir: Path, actors: int = 1) -> list[str]:
    """A stub-env learner that would train for a very long time."""
    return [
        "--env", STUB_ENV_ID,
        "--port", str(port),
        "--num-actors", str(actors),
        "--envs-per-actor", "1",
        "--num-steps", "16",
        "--fragment-length", "8",
        "--total-env-steps", "100000000",
        "--hidden-sizes", "16",
        "--num-epochs", "1",
        "--minibatch-size", "16",
        "--eval-episodes", "1",
        "--starvation-timeout", "120",
        "--run-dir", str(run_dir),
        "--no-tensorboard",
        "--log-level", "info",
    ]  # fmt: skip


def actor_flags(port: int) -> list[str]:
    return [
        "--learner", f"127.0.0.1:{port}",
        "--register-timeout", "90",
        "--learner-timeout", "90",
        "--log-level", "info",
    ]  # fmt: skip


def assert_stopped_cleanly(run_dir: Path, signame: str) -> dict[str, Any]:
    """The learner wrote everything a stopped run leaves, and says why it stopped."""
    for name in ("report.json", "policy.pt", "config.toml", "metrics.jsonl"):
        assert (run_dir / name).is_file(), name
    assert list((run_dir / "checkpoints").glob("ckpt-*.pt"))
    report = json.loads((run_dir / "report.json").read_text())
    assert report["stop_reason"] == f"interrupted ({signame})", report["stop_reason"]
    assert report["updates_completed"] >= 1
    return report


# -- 1. SIGHUP as SIGTERM -------------------------------------------------------------


@pytest.mark.timeout(PROCESS_TIMEOUT_S * 3)
@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM], ids=["SIGHUP", "SIGTERM"])
def test_learner_stop_signal_writes_everything(sig, procs, tmp_path, learner_port) -> None:
    """SIGHUP is sent twice (a closing terminal can send several): the second one
    must not turn the clean stop into an abort."""
    run_dir = tmp_path / "run"
    learner = procs.start("learner", [*_module("learner"), *learner_flags(learner_port, run_dir)])
    procs.start("actor", [*_module("actor"), *actor_flags(learner_port)])
    wait_for(lambda: has_update(run_dir), "first update", procs)
    learner.send_signal(sig)
    if sig == signal.SIGHUP:
        learner.send_signal(sig)
    assert procs.wait("learner") == 130, procs.logs()
    assert_stopped_cleanly(run_dir, sig.name)
    # The actor was told to stop (it did not wait for --learner-timeout): exit 0.
    assert procs.wait("actor") == 0, procs.logs()
    assert "learner requested shutdown" in procs.log("actor")
    assert "Traceback" not in procs.log("learner") + procs.log("actor")


@pytest.mark.timeout(PROCESS_TIMEOUT_S * 3)
def test_zmq_rl_run_sighup_stops_everything(procs, tmp_path, learner_port) -> None:
    run_dir = tmp_path / "run"
    flags = learner_flags(learner_port, run_dir, actors=2)
    run = procs.start("run", [*_module("main"), "run", *flags, "--no-plot"])
    wait_for(lambda: has_update(run_dir), "first update", procs)
    run.send_signal(signal.SIGHUP)
    assert procs.wait("run") == 130, procs.logs()
    report = assert_stopped_cleanly(run_dir, "SIGHUP")
    pids = [int(stats["pid"]) for stats in report["actor_stats"].values()]
    assert len(pids) == 2
    alive = [p for p in pids if psutil.pid_exists(p)]
    assert not [p for p in alive if psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    for i in range(2):  # each local actor heard the shutdown and exited by itself
        assert "learner requested shutdown" in (run_dir / "logs" / f"actor-{i}.log").read_text()
    assert "Traceback" not in procs.log("run")


@pytest.mark.timeout(PROCESS_TIMEOUT_S * 3)
def test_actor_sighup_exits_130_after_its_bye(procs, tmp_path, learner_port) -> None:
    run_dir = tmp_path / "run"
    learner = procs.start("learner", [*_module("learner"), *learner_flags(learner_port, run_dir)])
    actor = procs.start("actor", [*_module("actor"), *actor_flags(learner_port)])
    wait_for(lambda: has_update(run_dir), "first update", procs)
    actor.send_signal(signal.SIGHUP)
    assert procs.wait("actor") == 130, procs.logs()
    assert "Traceback" not in procs.log("actor")
    # The learner got the bye: the actor leaves the run at once, not after a timeout.
    wait_for(lambda: "said bye" in procs.log("learner"), "the learner logging the bye", timeout=60)
    learner.send_signal(signal.SIGTERM)
    assert procs.wait("learner") == 130, procs.logs()


class Pty:
    """A pseudo-terminal whose output is drained by a thread until it is hung up."""

    def __init__(self) -> None:
        self.master, self.slave = os.openpty()
        self.output = bytearray()
        self._stop = threading.Event()
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self.master], [], [], POLL_S)
            if ready:
                try:
                    self.output += os.read(self.master, 65536)
                except OSError:  # EIO: nobody holds the slave side any more
                    return

    def make_controlling(self) -> None:
        """In the child (preexec_fn): a new session with this pty as its terminal."""
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    def hang_up(self) -> None:
        """Close the terminal: the kernel sends SIGHUP to its session's processes."""
        self._stop.set()
        self._reader.join(5)
        os.close(self.master)


@pytest.mark.timeout(PROCESS_TIMEOUT_S * 3)
def test_learner_on_a_terminal_that_closes(procs, tmp_path, learner_port) -> None:
    """The issue's case: the terminal running the learner is closed. The learner gets
    SIGHUP from the kernel and every later write to its terminal fails (EIO); it
    still stops cleanly, with everything written and the actor told to stop."""
    run_dir = tmp_path / "run"
    terminal = Pty()
    try:
        learner = procs.start(
            "learner",
            [*_module("learner"), *learner_flags(learner_port, run_dir)],
            stdin=terminal.slave,
            stdout=terminal.slave,
            stderr=terminal.slave,
            preexec_fn=terminal.make_controlling,
        )
    finally:
        os.close(terminal.slave)
    procs.start("actor", [*_module("actor"), *actor_flags(learner_port)])
    wait_for(lambda: has_update(run_dir), "first update", procs)
    terminal.hang_up()
    assert procs.wait("learner") == 130, bytes(terminal.output[-3000:]).decode(errors="replace")
    assert_stopped_cleanly(run_dir, "SIGHUP")
    assert procs.wait("actor") == 0, procs.logs()
    assert b"Traceback" not in terminal.output
    del learner


class Tmux:
    """A private tmux server (``tmux -L``), its socket in a short temporary folder."""

    def __init__(self, socket_dir: str) -> None:
        self.name = f"zmq-rl-op-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.env = {**os.environ, "TMUX_TMPDIR": socket_dir}
        self.env.pop("TMUX", None)

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["tmux", "-L", self.name, *args],
            capture_output=True,
            text=True,
            timeout=20,
            env=self.env,
        )

    def pane_processes(self, session: str) -> list[psutil.Process]:
        """The panes' processes and all their descendants."""
        out = self.run("list-panes", "-s", "-t", session, "-F", "#{pane_pid}")
        assert out.returncode == 0, out.stderr
        found = []
        for pid in map(int, out.stdout.split()):
            with contextlib.suppress(psutil.NoSuchProcess):
                pane = psutil.Process(pid)
                found += [pane, *pane.children(recursive=True)]
        return found


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
@pytest.mark.timeout(PROCESS_TIMEOUT_S * 3)
def test_tmux_kill_session_ends_the_learner_cleanly(tmp_path, learner_port) -> None:
    """docs/multi-host.md's stop for a zmq-rl-tmux run, ``tmux kill-session``, hangs up
    the panes' terminals: the learner stops as on SIGTERM."""
    run_dir = tmp_path / "run"
    socket_dir = tempfile_dir()
    tmux = Tmux(socket_dir)
    env = {
        **tmux.env,
        "ZMQ_RL_LEARNER_CMD": " ".join(_module("learner")),
        "ZMQ_RL_ACTOR_CMD": " ".join(_module("actor")),
    }
    flags = learner_flags(learner_port, run_dir)
    flags = flags[: flags.index("--port")] + flags[flags.index("--port") + 2 :]
    flags = flags[: flags.index("--num-actors")] + flags[flags.index("--num-actors") + 2 :]
    try:
        started = subprocess.run(
            [str(ROOT / "bin" / "zmq-rl-tmux"), "-L", tmux.name, "-s", "op", "-d", "-n", "1"]
            + ["-p", str(learner_port), "--", *flags],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert started.returncode == 0, started.stderr
        deadline = time.monotonic() + 90
        while not has_update(run_dir):
            screen = tmux.run("capture-pane", "-p", "-t", "op:learner").stdout
            assert "exited with status" not in screen, screen
            assert time.monotonic() < deadline, f"no update within 90 s:\n{screen}"
            time.sleep(POLL_S)
        processes = tmux.pane_processes("op")
        assert any("zmq_rl.cli.learner" in " ".join(p.cmdline()) for p in processes)
        killed = tmux.run("kill-session", "-t", "op")
        assert killed.returncode == 0, killed.stderr
        _, alive = psutil.wait_procs(processes, timeout=90)
        assert not alive, [p.cmdline() for p in alive]
        assert_stopped_cleanly(run_dir, "SIGHUP")
    finally:
        tmux.run("kill-server")
        shutil.rmtree(socket_dir, ignore_errors=True)


def tempfile_dir() -> str:
    """A short folder for a tmux socket (socket paths are limited to ~100 bytes)."""
    import tempfile

    return tempfile.mkdtemp(prefix="tmx-", dir="/tmp")


# -- 2, 3. run dirs ---------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_uncreatable_run_dir_is_one_error_line() -> None:
    result = subprocess.run(
        [*_module("learner"), "--env", STUB_ENV_ID, "--run-dir", "/proc/x"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: run_dir='/proc/x': cannot create it: "), result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr


@pytest.mark.parametrize("marker", ["config.toml", "metrics.jsonl", "report.json"])
@pytest.mark.parametrize("command", ["zmq-learner", "zmq-rl run"])
def test_run_dir_holding_a_run_is_refused(command, marker, tmp_path, capsys) -> None:
    run_dir = tmp_path / "old"
    run_dir.mkdir()
    (run_dir / marker).write_text("{}\n")
    argv = ["--env", STUB_ENV_ID, "--run-dir", str(run_dir)]
    code = learner_cli.main(argv) if command == "zmq-learner" else main_cli.main(["run", *argv])
    assert code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"error: run_dir='{run_dir}': holds a run already ({marker})"), err
    assert f"--resume {run_dir}" in err and "another --run-dir" in err
    assert sorted(p.name for p in run_dir.iterdir()) == [marker]  # nothing written


def test_an_empty_existing_run_dir_is_fine(tmp_path, capsys) -> None:
    """Only a dir holding a run is refused: here the next check (the env) speaks."""
    run_dir = tmp_path / "empty"
    run_dir.mkdir()
    assert learner_cli.main(["--env", "NoSuchEnv-v9", "--run-dir", str(run_dir)]) == 2
    assert "env_id='NoSuchEnv-v9'" in capsys.readouterr().err


def test_default_run_dirs_are_unique_within_a_second(tmp_path, monkeypatch) -> None:
    """Runs started in the same second (by threads here, by processes in practice)
    get different directories: each is created exclusively when it is chosen."""
    monkeypatch.setattr(common.time, "strftime", lambda fmt: "20250101-120000")
    chosen: list[str] = []
    barrier = threading.Barrier(6)

    def pick() -> None:
        barrier.wait(10)
        chosen.append(common.default_run_dir("CartPole-v1", root=str(tmp_path / "runs")))

    threads = [threading.Thread(target=pick) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(chosen) == len(set(chosen)) == 6, chosen
    assert all(Path(c).is_dir() for c in chosen)
    assert str(tmp_path / "runs" / "CartPole-v1-20250101-120000") in chosen


def test_a_failed_start_leaves_no_default_run_dir(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert learner_cli.main(["--env", "NoSuchEnv-v9"]) == 2
    assert main_cli.main(["run", "--env", "tests.space_envs:TextObs-v0"]) == 2  # unsupported space
    capsys.readouterr()
    assert not list((tmp_path / "runs").glob("*"))


# -- 4. presets announce themselves -----------------------------------------------------


@pytest.mark.parametrize("command", ["zmq-learner", "zmq-rl run"])
def test_first_line_names_the_preset(command, tmp_path, capsys) -> None:
    argv = ["--env", "Acrobot-v1", "--run-dir", "/proc/x"]  # stops at the run dir
    code = learner_cli.main(argv) if command == "zmq-learner" else main_cli.main(["run", *argv])
    assert code == 2
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("using preset Acrobot-v1 (zmq_rl/presets/Acrobot-v1.toml"), first
    assert "target return -85" in first and "--no-preset" in first
    code = (
        learner_cli.main([*argv, "--no-preset"])
        if command == "zmq-learner"
        else main_cli.main(["run", *argv, "--no-preset"])
    )
    assert code == 2 and "preset" not in capsys.readouterr().out


# -- 5. small items ---------------------------------------------------------------------


def _parsers() -> Iterator[tuple[str, Any]]:
    yield "zmq-learner", learner_cli.build_parser()
    yield "zmq-learner --resume", learner_cli.build_resume_parser()
    yield "zmq-actor", actor_cli.build_parser()
    top = main_cli.build_parser()
    yield "zmq-rl", top
    for name in main_cli.SUBCOMMANDS:
        yield f"zmq-rl {name}", main_cli.subparser(top, name)


def test_no_parser_matches_prefixes() -> None:
    for name, parser in _parsers():
        assert isinstance(parser, CliParser), name
        assert parser.allow_abbrev is False, name


@pytest.mark.parametrize(
    ("main", "argv", "prog"),
    [
        (learner_cli.main, ["--learning-rat", "0.1"], "zmq-learner"),
        (main_cli.main, ["run", "--learning-rat", "0.1"], "zmq-rl run"),
        (actor_cli.main, ["--num-env", "2"], "zmq-actor"),
        (main_cli.main, ["eval", "x", "--episode", "2"], "zmq-rl eval"),
    ],
)
def test_an_abbreviated_flag_is_an_error(main, argv, prog, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    flag = argv[-2]
    assert lines[0].startswith(f"error: unrecognized arguments: {flag} "), lines
    assert "did you mean --" in lines[0]
    assert lines[1:] == [f"try '{prog} --help'"], lines


@pytest.mark.parametrize(
    ("main", "argv", "line"),
    [
        (learner_cli.main, ["--num-epochs", "abc"], "error: num_epochs='abc': not an integer"),
        (main_cli.main, ["run", "--num-epochs", "abc"], "error: num_epochs='abc': not an integer"),
        (main_cli.main, ["run", "--gamma", "high"], "error: gamma='high': not a number"),
        (actor_cli.main, ["--num-envs", "x"], "error: num_envs='x': not an integer"),
        (main_cli.main, ["eval", "x", "--episodes", "y"], "error: episodes='y': not an integer"),
        (
            learner_cli.main,
            ["--activation", "sigmoid"],
            "error: activation='sigmoid': must be one of tanh, relu",
        ),
    ],
)
def test_a_type_error_is_one_line(main, argv, line, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == line and len(lines) == 2 and lines[1].endswith(" --help'"), lines


@pytest.mark.timeout(60)
def test_an_unresolvable_learner_host_says_so() -> None:
    result = subprocess.run(
        [*_module("actor"), "--learner", "no-such-host.invalid:5555", "--register-timeout", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert "Traceback" not in result.stderr
    assert "no welcome" not in result.stderr  # not the "learner not answering" message
    if "does not resolve" in result.stderr:  # the resolver says the name does not exist
        assert result.returncode == 2
        assert result.stderr.startswith(
            "error: learner='no-such-host.invalid:5555': the host name "
            "'no-such-host.invalid' does not resolve"
        ), result.stderr
    else:  # no resolver reachable from this machine
        assert result.returncode == 1 and "cannot resolve the learner host" in result.stderr


@pytest.mark.parametrize(
    ("code", "exit_code", "needle"),
    [(socket.EAI_NONAME, 2, "does not resolve"), (socket.EAI_AGAIN, 1, "cannot resolve")],
)
def test_resolver_failures(code, exit_code, needle, monkeypatch, capsys) -> None:
    def fail(*args: Any, **kwargs: Any) -> None:
        raise socket.gaierror(code, os.strerror(1))

    monkeypatch.setattr(common.socket, "getaddrinfo", fail)
    assert actor_cli.main(["--learner", "box:5555"]) == exit_code
    err = capsys.readouterr().err
    assert needle in err and "'box'" in err and len(err.splitlines()) == 1, err


class Opaque:
    """A pickled object that ``torch.load(weights_only=True)`` refuses."""


def _not_a_policy(folder: Path) -> list[Path]:
    folder.mkdir()
    files = [folder / "text.pt", folder / "object.pt", folder / "tensors.pt", folder / "cut.pt"]
    files[0].write_text("not torch at all\n")
    torch.save({"thing": Opaque()}, files[1])
    torch.save({"weights": torch.zeros(3)}, files[2])
    files[3].write_bytes(files[2].read_bytes()[:200])
    return files


def test_eval_of_a_file_that_is_not_a_policy_is_one_line(tmp_path, capsys) -> None:
    for path in _not_a_policy(tmp_path / "files"):
        assert main_cli.main(["eval", str(path)]) == 1, path
        err = capsys.readouterr().err
        assert err.startswith(f"error: {path}: not a policy.pt or checkpoint"), err
        assert len(err.splitlines()) == 1, err
        assert "file an issue" not in err and "weights_only" not in err, err


def test_zmq_rl_tmux_is_installed_with_the_package() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    assert "bin/zmq-rl-tmux" in cfg["options"]["scripts"].split()
    try:
        dist = importlib.metadata.distribution("zmq_rl")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("zmq_rl is not installed (run from the source tree)")
    scripts = [f for f in dist.files or () if Path(str(f)).name == "zmq-rl-tmux"]
    if not scripts:
        pytest.skip("installed before the launcher was added to setup.cfg: reinstall")
    assert any(Path(str(dist.locate_file(f))).is_file() for f in scripts)


@pytest.mark.parametrize(
    ("env", "space"),
    [("tests.space_envs:TextObs-v0", "observation space Text(1, 8, charset=")],
)
@pytest.mark.parametrize("command", ["zmq-learner", "zmq-rl run", "zmq-actor"])
def test_unsupported_spaces_are_refused_in_one_line(command, env, space, capsys) -> None:
    argv = ["--env", env]
    if command == "zmq-learner":
        code = learner_cli.main([*argv, "--run-dir", ""])
    elif command == "zmq-rl run":
        code = main_cli.main(["run", *argv, "--run-dir", ""])
    else:
        code = actor_cli.main([*argv, "--learner", "127.0.0.1:5555"])
    assert code == 2
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"error: env_id='{env}': unsupported {space}"), err
    assert lines[0].endswith(
        "supported: observations Box, Discrete, MultiDiscrete, MultiBinary or a Dict/Tuple "
        "of those; actions Discrete, MultiDiscrete, MultiBinary or Box"
    ), err


@pytest.mark.timeout(120)
def test_actor_help_imports_neither_torch_nor_gymnasium() -> None:
    probe = (
        "import sys\n"
        "from zmq_rl.cli import actor\n"
        "try:\n"
        "    actor.main(['--help'])\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 0\n"
        "heavy = ('torch', 'gymnasium', 'zmq', 'zmq_rl.actor.gym_actor', 'zmq_rl.actor.client')\n"
        "print('HEAVY', sorted(m for m in heavy if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=100
    )
    assert result.returncode == 0, result.stderr
    assert "--learner" in result.stdout
    assert result.stdout.splitlines()[-1] == "HEAVY []", result.stdout[-500:]


def test_readme_names_what_a_newcomer_needs() -> None:
    text = (ROOT / "README.md").read_text()
    for needle in (
        "module:Id",
        "zmq_rl.envs:AtariPong-v0",
        "zmq-rl keys",
        "zmq-learner --resume RUN_DIR",
        "--no-preset",
        "SIGHUP",
        "zmq-rl-tmux",
    ):
        assert needle in text, needle
