"""bin/train installs the runtime only, bin/test the test extras (issue 29 item 7).

The scripts run for real in a temporary copy of the repository whose ``.venv`` is a
recording shim (``.venv/bin/python`` logs its arguments and installs nothing): what
they would install, and when they skip the installation, is what is checked. The
runtime they install is then checked against what a default CartPole run imports
(in a real run, in this environment) and against the heavy test-only packages.
"""

from __future__ import annotations

import configparser
import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 60
RUN_TIMEOUT_S = 240

TEST_ONLY = {
    "ray",
    "wandb",
    "minatar",
    "ale-py",
    "onnx",
    "onnxruntime",
    "kubernetes-validate",
    "pandas",
    "seaborn",
    "box2d",
    "pytest",
    "hypothesis",
    "ruff",
    "opencv-python-headless",
}
"""Packages the suite needs and a CartPole quick start does not (the 2.2 GB of issue 29)."""

SHIM = """#!/usr/bin/env bash
echo "$(basename "$0") $*" >>"$SHIM_LOG"
exit 0
"""


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A copy of bin/, setup.cfg and pyproject.toml with a recording ``.venv``."""
    for name in ("setup.cfg", "pyproject.toml"):
        shutil.copy2(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "bin", tmp_path / "bin")
    venv_bin = tmp_path / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    for name in ("python", "zmq-rl"):
        (venv_bin / name).write_text(SHIM)
        (venv_bin / name).chmod(0o755)
    for name in ("setup.cfg", "pyproject.toml"):  # older than any stamp written below
        os.utime(tmp_path / name, (1_000_000_000, 1_000_000_000))
    return tmp_path


def _script(repo: Path, name: str, *args: str) -> list[str]:
    """Run bin/NAME in ``repo``; the shim's log lines (what it ran)."""
    log = repo / "shim.log"
    log.write_text("")
    result = subprocess.run(
        [str(repo / "bin" / name), *args],
        cwd=repo,
        env={**os.environ, "SHIM_LOG": str(log)},
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert result.returncode == 0, result.stderr
    return log.read_text().splitlines()


def _installs(lines: list[str]) -> list[str]:
    """The targets of the ``pip install`` lines (``torch==2.13.0``, ``.``, ``.[test]``)."""
    return [line.split()[-1] for line in lines if " -m pip install " in line]


def _extras(target: str) -> set[str]:
    found = re.fullmatch(r"\.(?:\[([\w,]+)\])?", target)
    assert found, target
    return set(found.group(1).split(",")) if found.group(1) else set()


def _requirements(extras: set[str]) -> list[Requirement]:
    """zmq_rl's requirements for ``extras``, read from setup.cfg."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")

    def lines(text: str) -> list[str]:
        return [ln.split("#")[0].strip() for ln in text.splitlines() if ln.split("#")[0].strip()]

    found = [Requirement(x) for x in lines(cfg["options"]["install_requires"])]
    for extra in extras:
        found += [Requirement(x) for x in lines(cfg["options.extras_require"][extra])]
    return found


def _closure(requirements: list[Requirement]) -> set[str]:
    """Every distribution ``requirements`` install, with their dependencies (resolved in
    this environment, which holds the test extras)."""
    seen: set[str] = set()
    todo = [(r, frozenset(r.extras)) for r in requirements]
    while todo:
        req, extras = todo.pop()
        name = canonicalize_name(req.name)
        if req.marker is not None and not any(
            req.marker.evaluate({"extra": e}) for e in (extras or {""})
        ):
            continue
        key = f"{name}[{','.join(sorted(extras))}]"
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            continue
        for text in dist.requires or ():
            sub = Requirement(text)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in extras):
                todo.append((sub, frozenset(sub.extras)))
    return {key.split("[")[0] for key in seen}


def test_train_installs_torch_then_the_runtime_and_test_the_test_extras(repo) -> None:
    train = _installs(_script(repo, "train", "--actors", "1"))
    assert train == ["torch==2.13.0", ".[learner]"]
    assert (repo / ".venv" / ".zmq_rl-installed").read_text().strip() == "train"
    # bin/train ran zmq-rl run with CartPole and the user's arguments
    assert "zmq-rl run --env CartPole-v1 --actors 1" in (repo / "shim.log").read_text()
    # a train-only venv is not test-ready: bin/test installs the test extras
    assert _installs(_script(repo, "test", "-x")) == ["torch==2.13.0", ".[learner,test]"]
    assert (repo / ".venv" / ".zmq_rl-installed").read_text().strip() == "test"
    # a test venv serves both without a new installation
    assert _installs(_script(repo, "train")) == []
    assert _installs(_script(repo, "test")) == []


def test_train_installs_an_extra_once_and_passes_the_rest_on(repo) -> None:
    args = ("--extra", "multi_agent", "--env", "pettingzoo.sisl.pursuit_v5")
    assert _installs(_script(repo, "train", *args)) == [
        "torch==2.13.0",
        ".[learner]",
        ".[multi_agent]",
    ]
    log = (repo / "shim.log").read_text()
    assert "zmq-rl run --env CartPole-v1 --env pettingzoo.sisl.pursuit_v5" in log
    assert "--extra" not in log.split("zmq-rl run", 1)[1]
    assert _installs(_script(repo, "train", *args)) == []  # done: not again


def test_a_train_venv_serves_train_and_an_old_stamp_serves_both(repo) -> None:
    _script(repo, "train")
    assert _installs(_script(repo, "train")) == []
    (repo / ".venv" / ".zmq_rl-installed").write_text("")  # written before levels existed
    assert _installs(_script(repo, "test")) == []
    assert _installs(_script(repo, "train")) == []


def test_a_changed_setup_cfg_reinstalls_a_test_venv_with_its_test_extras(repo) -> None:
    _script(repo, "test")
    os.utime(repo / "setup.cfg")  # now newer than the stamp
    assert _installs(_script(repo, "train")) == ["torch==2.13.0", ".[learner,test]"]
    assert _installs(_script(repo, "test")) == []


def test_what_bin_train_installs_leaves_out_the_test_matrix(repo) -> None:
    train = _closure(_requirements(_extras(_installs(_script(repo, "train"))[-1])))
    assert {"torch", "gymnasium", "pyzmq", "matplotlib"} <= train
    assert not train & TEST_ONLY, sorted(train & TEST_ONLY)
    test = _closure(_requirements(_extras(_installs(_script(repo, "test"))[-1])))
    assert {"ray", "wandb", "minatar", "pytest", "psutil", "onnxruntime"} <= test


PROBE = """
import importlib.metadata as md, json, sys
from zmq_rl.cli.main import main
code = main(sys.argv[1:])
owners = md.packages_distributions()
used = sorted({d for m in list(sys.modules) for d in owners.get(m.split(".")[0], ())})
print(json.dumps({"code": code, "used": used}))
"""


def test_a_default_cartpole_run_imports_nothing_bin_train_leaves_out(repo, tmp_path) -> None:
    """The runtime set is enough: every distribution a short default run (as bin/train
    starts it, plot included) imports in the learner process is in it."""
    train = _closure(_requirements(_extras(_installs(_script(repo, "train"))[-1])))
    argv = ["run", "--env", "CartPole-v1", "--actors", "1", "--total-env-steps", "512"]
    argv += ["--num-epochs", "1", "--eval-episodes", "1", "--run-dir", str(tmp_path / "run")]
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["code"] == 0
    assert (tmp_path / "run" / "learning_curve.png").is_file()
    used = {canonicalize_name(d) for d in report["used"]} - {"zmq-rl"}
    assert used <= train, sorted(used - train)


def test_no_extra_installs_both_pygame_distributions() -> None:
    """pygame and pygame-ce install the same ``pygame`` module over each other (issue 29
    item 13): with gymnasium's extras on pygame-ce, zmq_rl's may not ask for pygame."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    for extra in cfg["options.extras_require"]:
        names = _closure(_requirements({extra}))
        assert not {"pygame", "pygame-ce"} <= names, extra
        assert "pygame" not in {canonicalize_name(r.name) for r in _requirements({extra})}, extra


def test_the_readme_starts_with_the_two_commands_and_says_what_each_installs() -> None:
    text = (ROOT / "README.md").read_text()
    first = text[: text.index("\n## ", 1)]
    assert re.findall(r"```bash\n(.*?)```", first, re.S) == ["bin/train\nbin/test\n"]
    train, test = first.split("`bin/test` installs", 1)
    assert "`pip install -e '.[learner]'`" in train and "runtime only" in train
    assert "`pip install -e '.[learner,test]'`" in test
