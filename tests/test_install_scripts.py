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
    found = re.fullmatch(r"\.(?:\[([\w,-]+)\])?", target)
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
    """Issue 44 section 4: ``--extra multi_agent`` (the README's spelling before) is
    installed under the name pip 23 (Python 3.11's) matches against the metadata,
    ``multi-agent``: pip does not normalise a requested extra's name, and installed
    nothing."""
    args = ("--extra", "multi_agent", "--env", "pettingzoo.sisl.pursuit_v5")
    assert _installs(_script(repo, "train", *args)) == [
        "torch==2.13.0",
        ".[learner]",
        ".[multi-agent]",
    ]
    assert (repo / ".venv" / ".zmq_rl-extra-multi-agent").is_file()
    log = (repo / "shim.log").read_text()
    assert "zmq-rl run --env CartPole-v1 --env pettingzoo.sisl.pursuit_v5" in log
    assert "--extra" not in log.split("zmq-rl run", 1)[1]
    assert _installs(_script(repo, "train", *args)) == []  # done: not again


def _failing(repo: Path, name: str, *args: str, env: dict[str, str] | None = None):
    """Run bin/NAME in ``repo``, expecting it to fail; (result, the shim's log lines)."""
    log = repo / "shim.log"
    log.write_text("")
    result = subprocess.run(
        [str(repo / "bin" / name), *args],
        cwd=repo,
        env={**os.environ, "SHIM_LOG": str(log), **(env or {})},
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert result.returncode != 0, result
    return result, log.read_text().splitlines()


def test_an_extra_setup_cfg_lacks_stops_before_pip_and_names_the_extras(repo) -> None:
    result, lines = _failing(repo, "train", "--extra", "multi_agnet", "--env", "X")
    assert result.returncode == 2
    assert "--extra multi_agnet: not an extra of zmq_rl" in result.stderr
    assert "multi-agent" in result.stderr and "box2d" in result.stderr
    assert not [ln for ln in lines if "[" in ln] and "zmq-rl run" not in "\n".join(lines)
    assert not list((repo / ".venv").glob(".zmq_rl-extra-*"))


PIP_WARNS = """#!/usr/bin/env bash
echo "$(basename "$0") $*" >>"$SHIM_LOG"
case "$*" in *"[multi-agent]"*)
    echo "WARNING: zmq-rl 0.1.0 does not provide the extra 'multi-agent'" >&2 ;;
esac
exit 0
"""


def test_pip_installing_nothing_for_an_extra_fails_without_a_stamp(repo) -> None:
    """pip exits 0 when the package lacks the extra asked for, with a warning: that
    was the stamp written and the run started on an env that then did not exist."""
    (repo / ".venv" / "bin" / "python").write_text(PIP_WARNS)
    result, lines = _failing(repo, "train", "--extra", "multi-agent")
    assert "pip installed nothing for zmq_rl[multi-agent]" in result.stderr
    assert "does not provide the extra" in result.stderr
    assert "zmq-rl run" not in "\n".join(lines)
    assert not (repo / ".venv" / ".zmq_rl-extra-multi-agent").exists()


FRESH_VENV_TIMEOUT_S = 240


def _overlay(site: Path, into: Path, leave_out: tuple[str, ...]) -> Path:
    """A folder of links to everything in ``site`` (this environment's site-packages)
    but the distributions named in ``leave_out``: what a fresh venv reuses, so that
    installing an extra there fetches only the extra's own packages."""
    into.mkdir()
    for entry in site.iterdir():
        stem = canonicalize_name(re.split(r"-\d|\.(?:dist|egg)-info$|\.pth$", entry.name)[0])
        plain = canonicalize_name(entry.name.split(".")[0])
        if entry.suffix == ".pth" or {stem, plain} & set(leave_out):
            continue
        if entry.name.startswith(("__editable__", "__pycache__")) or "zmq_rl" in entry.name:
            continue
        (into / entry.name).symlink_to(entry)
    return into


@pytest.mark.timeout(FRESH_VENV_TIMEOUT_S)
def test_the_readme_multi_agent_command_installs_pettingzoo_into_a_fresh_venv(tmp_path) -> None:
    """Issue 44 section 4: the README's ``bin/train --extra multi_agent ...`` on a fresh clone
    installed nothing (pip 23: "zmq-rl 0.1.0 does not provide the extra
    'multi_agent'"), wrote its stamp, and the run failed with ``NameNotFound``.

    The README's command runs for real in a copy of the checkout whose ``.venv`` is a
    fresh venv of this Python (its bundled pip), which reuses this environment's
    packages through a ``.pth`` file, all but PettingZoo and pygame (so only the
    extra's own wheels are installed, from the local wheel cache or the index).
    The run's ``--policy-map`` maps no agent of pursuit: it stops at once with the
    env's agents in its error, so pursuit was built from the fresh venv."""
    import sysconfig

    site = Path(sysconfig.get_paths()["purelib"])
    if not (site / "pettingzoo").is_dir():
        pytest.skip("this environment has no PettingZoo to compare with (pip install -e '.[test]')")
    repo = tmp_path / "clone"
    repo.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, repo / name)
    for name in ("bin", "zmq_rl"):
        shutil.copytree(ROOT / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    venv = repo / ".venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    found = list((venv / "lib").glob("python3*/site-packages"))
    overlay = _overlay(site, tmp_path / "overlay", ("pettingzoo", "pygame", "pygame-ce"))
    # The runtime bin/train would install first is reused too (its stamp says so).
    (found[0] / "reuse.pth").write_text(f"{overlay}\n{repo}\n")
    (venv / ".zmq_rl-installed").write_text("train\n")
    readme = (ROOT / "README.md").read_text()
    command = re.search(r"^bin/train --extra \S+ --env pettingzoo\.sisl\.pursuit.*$", readme, re.M)
    assert command, "the README's multi-agent quick start"
    result = subprocess.run(
        [*command.group(0).split(), "--policy-map", "nobody=x", "--run-dir", ""],
        cwd=repo,
        env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
        capture_output=True,
        text=True,
        timeout=FRESH_VENV_TIMEOUT_S - 30,
    )
    out = result.stdout + result.stderr
    if result.returncode != 2 and re.search(
        r"No matching distribution|Could not find a version|Failed to establish|"
        r"Temporary failure in name resolution|Network is unreachable",
        out,
    ):
        pytest.skip(f"no wheels for the extra here (no index or network): {out[-500:]}")
    assert "does not provide the extra" not in out, out[-3000:]
    assert result.returncode == 2, out[-3000:]
    assert "of pettingzoo.sisl.pursuit_v5 has no policy (its agents: pursuer_0" in out, out
    assert (venv / ".zmq_rl-extra-multi-agent").is_file()
    python = venv / "bin" / "python"
    probe = "import pettingzoo, pygame, sys; print(pettingzoo.__file__)"
    where = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=60)
    assert str(venv) in where.stdout, where  # installed into the fresh venv, not reused


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
