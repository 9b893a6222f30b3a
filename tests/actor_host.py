"""An actor host's install, made for real (issue 46): zmq_rl's wheel built from this tree,
a fresh venv, and ``pip install`` of the wheel with no extras -- what ``pip install
zmq_rl`` gives a simulator machine, without torch. tests/test_torch_free_host.py runs
actors from it; bench/torch_free.py measures it.

The wheel is built by the running interpreter's setuptools without build isolation
(seconds), else with it; the dependencies come from wherever this machine's pip finds
wheels (its cache, local indexes), as any pip install would. Nothing here is by hand:
the venv is made anew by every caller.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_FILES = ("setup.cfg", "pyproject.toml", "README.md")
OWN = ("pip", "setuptools", "_distutils_hack", "distutils-precedence.pth", "pkg_resources")
"""What ``python -m venv`` puts in site-packages before anything is installed."""
PIP_TIMEOUT_S = 600


def own_env() -> dict[str, str]:
    """This process's environment less ``PYTHONPATH``: a tree on it (this checkout, with
    its ``zmq_rl.egg-info``) would make the venv's pip see zmq_rl as installed already."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _pip(python: Path | str, *args: str) -> None:
    subprocess.run(
        [str(python), "-m", "pip", *args, "--quiet", "--disable-pip-version-check"],
        env=own_env(),
        check=True,
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT_S,
    )


def build_wheel(out: Path, python: str = sys.executable) -> Path:
    """zmq_rl's wheel in ``out``, built from a copy of the package's files (the build's
    ``build/`` and ``*.egg-info`` stay out of the worktree)."""
    source = out / "src"
    source.mkdir(parents=True)
    for name in PACKAGE_FILES:
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "zmq_rl", source / "zmq_rl", ignore=shutil.ignore_patterns("__pycache__")
    )
    (source / "bin").mkdir()
    shutil.copy2(ROOT / "bin" / "zmq-rl-tmux", source / "bin" / "zmq-rl-tmux")
    args = ("wheel", "--no-deps", "--wheel-dir", str(out), str(source))
    try:
        _pip(python, *args, "--no-build-isolation")
    except subprocess.CalledProcessError:  # no setuptools >= 64 here: pip fetches one
        _pip(python, *args)
    return next(out.glob("zmq_rl-*.whl"))


def megabytes(path: Path) -> float:
    """Bytes on disk under ``path`` (files, not links), in MB."""
    return (
        sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink()) / 1e6
    )


@dataclass
class ActorHost:
    """A venv with zmq_rl installed as an actor host installs it."""

    venv: Path
    venv_s: float
    """Seconds to create the venv (``python -m venv``)."""
    install_s: float
    """Seconds of ``pip install`` of the wheel and its dependencies."""
    venv_mb: float
    installed_mb: float
    """What the install added to site-packages (less the venv's own pip and setuptools)."""
    packages: list[str] = field(default_factory=list)

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def script(self, name: str) -> Path:
        """A console script of the venv (``zmq-actor``, ``zmq-rl``, ``zmq-learner``)."""
        return self.venv / "bin" / name

    def site_packages(self) -> Path:
        return next((self.venv / "lib").glob("python3*/site-packages"))

    def install(self, *requirements: str) -> float:
        """``pip install`` more (a simulator's own packages); the seconds it took."""
        start = time.perf_counter()
        _pip(self.python, "install", *requirements)
        return time.perf_counter() - start


def make_actor_host(where: Path) -> ActorHost:
    """Build the wheel and a fresh venv under ``where``, install the wheel (no extras)."""
    wheel = build_wheel(where / "wheel")
    venv = where / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    start = time.perf_counter()
    subprocess.run([base, "-m", "venv", str(venv)], check=True, timeout=PIP_TIMEOUT_S)
    made = time.perf_counter()
    _pip(venv / "bin" / "python", "install", str(wheel))
    done = time.perf_counter()
    site = next((venv / "lib").glob("python3*/site-packages"))
    own = sum(
        megabytes(p) if p.is_dir() else p.stat().st_size / 1e6
        for p in site.iterdir()
        if p.name.split("-")[0] in OWN or p.name in OWN
    )
    listing = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "list", "--format", "freeze",
         "--disable-pip-version-check"],
        capture_output=True, text=True, check=True, timeout=PIP_TIMEOUT_S, env=own_env(),
    ).stdout.split()  # fmt: skip
    return ActorHost(
        venv, made - start, done - made, megabytes(venv), megabytes(site) - own, listing
    )
