"""docs/first-hour.md cannot rot: every command on the page is run here.

The page's ``bash`` blocks run line by line in one temporary directory, in order,
after the ``python`` blocks marked ``<!-- first-hour: file NAME -->`` were written
there. What the page says ("How this page is tested") is what this file does:
small-budget flags appended to every ``zmq-rl run`` / ``zmq-learner``, port 5555
(the default) replaced by a free one, ``pip install`` as a dry run, ``tensorboard`` until it
prints its address (a test of its own, skipped when tensorboard is not installed),
``--video`` dropped without moviepy.
"""

from __future__ import annotations

import configparser
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.ports import free_port_block

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "first-hour.md"
BIN = Path(sys.executable).parent
BUDGET = ["--total-env-steps", "256", "--num-epochs", "1", "--eval-episodes", "2"]
COMMAND_TIMEOUT = 300  # a bound only
SERVER_WAIT_S = 60


def blocks(text: str) -> list[tuple[str, str, str]]:
    """``(language, file name or "", body)`` of every fenced block, in page order."""
    pattern = re.compile(r"(?:<!-- first-hour: file (\S+) -->\n)?```(\w*)\n(.*?)```", re.S)
    return [(m.group(2), m.group(1) or "", m.group(3)) for m in pattern.finditer(text)]


def commands(body: str) -> list[str]:
    return [line.strip() for line in body.splitlines() if line.strip() and line[0] != "#"]


def extras(line: str) -> list[str]:
    found = re.search(r"\[([a-z0-9_,]+)\]", line)
    return found.group(1).split(",") if found else []


def adapt(line: str, port: int) -> list[str] | None:
    """The command this test runs for a page line (None: the page's ``wait``)."""
    words = shlex.split(line.replace("5555", str(port)))
    if words[-1] == "&":
        words = words[:-1]
    if words == ["wait"]:
        return None
    program = words[0]
    if program == "pip":
        return [sys.executable, "-m", "pip", *words[1:], "--dry-run", "--no-deps", "--no-index",
                "--no-build-isolation"]  # fmt: skip
    if words[:2] == ["zmq-rl", "run"]:
        words += [*BUDGET, "--port", str(port), "--no-plot", "--starvation-timeout", "180"]
    elif program == "zmq-learner":
        words += [*BUDGET, "--starvation-timeout", "180", "--port", str(port)]
    elif words[:2] == ["zmq-rl", "eval"] and importlib.util.find_spec("moviepy") is None:
        i = words.index("--video")
        words = words[:i] + words[i + 2 :]
    if program == "python":
        return [sys.executable, *words[1:]]
    return [str(BIN / program), *words[1:]]


def test_every_command_of_the_first_hour_page(tmp_path: Path) -> None:
    page = PAGE.read_text()
    found = blocks(page)
    assert [lang for lang, _, _ in found].count("bash") >= 7, "the page lost a step"
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    known_extras = set(cfg["options.extras_require"])
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "WANDB_MODE": "offline"}
    port = free_port_block()
    ran: list[str] = []
    for lang, name, body in found:
        if name:
            (tmp_path / name).write_text(body)
            continue
        if lang != "bash":
            continue
        background: list[subprocess.Popen[str]] = []
        for line in commands(body):
            command = adapt(line, port)
            if command is None:
                for proc in background:
                    out, err = proc.communicate(timeout=COMMAND_TIMEOUT)
                    assert proc.returncode == 0, f"{line}: {err[-2000:]}"
                background.clear()
                continue
            if line.startswith("pip"):
                assert set(extras(line)) <= known_extras, f"{line}: unknown extra"
                done = subprocess.run(
                    command, cwd=ROOT, env=env, capture_output=True, text=True,
                    timeout=COMMAND_TIMEOUT, check=False,
                )  # fmt: skip
                assert done.returncode == 0, f"{line}: {done.stderr[-2000:]}"
            elif command[0].endswith("tensorboard"):
                continue  # test_first_hour_tensorboard runs it (when installed)
            elif line.endswith("&"):
                background.append(
                    subprocess.Popen(
                        command,
                        cwd=tmp_path,
                        env=env,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        text=True,
                    )  # fmt: skip
                )
            else:
                done = subprocess.run(
                    command, cwd=tmp_path, env=env, capture_output=True, text=True,
                    timeout=COMMAND_TIMEOUT, check=False,
                )  # fmt: skip
                assert done.returncode == 0, f"{line}: {done.stderr[-2000:]}"
            ran.append(line)
        assert not background, "a block started background commands without 'wait'"
    assert (tmp_path / "runs" / "cartpole" / "policy.pt").is_file()
    assert (tmp_path / "runs" / "heater" / "report.json").is_file()
    assert (tmp_path / "cartpole.onnx").is_file()
    assert (tmp_path / "runs" / "two-machines" / "report.json").is_file()
    assert len(ran) >= 8


def test_first_hour_tensorboard(tmp_path: Path) -> None:
    """The page's ``tensorboard`` command, until it prints its address."""
    lines = [
        line
        for lang, name, body in blocks(PAGE.read_text())
        if lang == "bash" and not name
        for line in commands(body)
        if line.startswith("tensorboard")
    ]
    assert lines, "the page lost its TensorBoard step"
    if shutil.which("tensorboard", path=str(BIN)) is None:
        pytest.skip("tensorboard is not installed (pip install 'zmq_rl[tensorboard]')")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    (tmp_path / "runs").mkdir()
    for line in lines:
        run_until_address(adapt(line, free_port_block()), tmp_path, env, line)


def run_until_address(command: list[str], cwd: Path, env: dict, line: str) -> None:
    """Start a server, wait until it prints an http:// address, stop it."""
    proc = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.monotonic() + SERVER_WAIT_S
    try:
        assert proc.stdout is not None
        for out in proc.stdout:
            if "http://" in out:
                return
            assert time.monotonic() < deadline, f"{line}: no address within {SERVER_WAIT_S}s"
        pytest.fail(f"{line}: exited ({proc.wait()}) without printing an address")
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
