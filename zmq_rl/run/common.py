"""Pieces every run shares: the failure it raises, hangups, env ids, run dirs.

A run raises (:class:`CliFailure`, :class:`~zmq_rl.config.ConfigError`,
:class:`KeyboardInterrupt`); the command line maps that to exit codes
(:mod:`zmq_rl.cli.exits`).
"""

from __future__ import annotations

import errno
import os
import re
import signal
import socket
import sys
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

from zmq_rl.config import ConfigError

from .._moved import moved_attribute

__all__ = [
    "STOP_SIGNALS",
    "SUPPORTED_SPACES",
    "LEARNER_MODULES",
    "CliFailure",
    "check_bind_host",
    "check_env",
    "check_learner_host",
    "check_spaces",
    "default_run_dir",
    "ensure_env_importable",
    "format_duration",
    "note_hangup",
    "require_learner_install",
    "release_run_dir",
]


def __getattr__(name: str) -> Any:
    """The exit codes, ``guard`` and the stderr logging, now in :mod:`zmq_rl.cli.exits`,
    with a DeprecationWarning (:func:`zmq_rl._moved.moved_attribute`)."""
    return moved_attribute(__name__, name)


STOP_SIGNALS: tuple[signal.Signals, ...] = (
    signal.SIGINT,
    signal.SIGTERM,
    *((signal.SIGHUP,) if hasattr(signal, "SIGHUP") else ()),
)
"""The signals that stop a command cleanly (exit 130, everything written)."""


class CliFailure(RuntimeError):
    """A run-time failure to report as ``error: <message>``; the command line exits
    with ``code`` (1, :data:`~zmq_rl.cli.exits.EXIT_FAILED`, unless the raiser says
    otherwise)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


_hangups = 0


LEARNER_MODULES = ("torch", "rich", "matplotlib")
"""What a learner host installs beyond an actor host's ``pip install zmq_rl``: the
``learner`` extra (setup.cfg; docs/multi-host.md)."""


def require_learner_install(
    what: str = "the learner", modules: tuple[str, ...] = LEARNER_MODULES
) -> None:
    """Raise :class:`CliFailure` (exit 2, one line naming the install) when a module of
    ``modules`` is not installed: a host that has zmq_rl's actor install alone
    (``pip install zmq_rl``, no torch) was asked for ``what`` (the learner, an export, a
    plot). Until issue 46 ``pip install zmq_rl`` installed torch: this is the line a
    learner host installed that way before gets from now on."""
    from zmq_rl.rl.installs import LEARNER_INSTALL, module_installed

    missing = [m for m in modules if not module_installed(m)]
    if missing:
        names = ", ".join(missing[:-1]) + (" and " if len(missing) > 1 else "") + missing[-1]
        raise CliFailure(f"{what} needs {names}: {LEARNER_INSTALL}", 2)


def _is_terminal(fd: int) -> bool:
    """Whether ``fd`` is a terminal, or was one and has hung up (its writes then fail)."""
    try:
        import termios

        termios.tcgetattr(fd)
    except ImportError:
        return False
    except termios.error as exc:
        return bool(exc.args) and exc.args[0] == errno.EIO
    except (OSError, ValueError):
        return False
    return True


def note_hangup() -> bool:
    """Record a SIGHUP; True for the first one of this process.

    The first hangup points stdout and stderr at ``/dev/null`` where they are a
    terminal: the terminal is gone (or going), and a write to a hung-up terminal
    fails, which would break the clean stop in the middle. Files and pipes are
    left alone. Later hangups (a closing terminal can send several) are news to
    nobody, so the signal handlers ignore them.
    """
    global _hangups
    _hangups += 1
    if _hangups > 1:
        return False
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return True
    try:
        for fd in (1, 2):
            if _is_terminal(fd):
                os.dup2(devnull, fd)
    finally:
        os.close(devnull)
    return True


def ensure_env_importable(env_id: str) -> None:
    """Let a ``module:EnvName-v0`` id import ``module`` from the working directory.

    ``python -m ...`` puts the working directory on ``sys.path``; an installed
    console script does not. The directory is appended (lowest priority), and only
    for ids that name a module.
    """
    if ":" in env_id:
        cwd = os.getcwd()
        if cwd not in sys.path and "" not in sys.path:
            sys.path.append(cwd)


SUPPORTED_SPACES = (
    "observations Box, Discrete, MultiDiscrete, MultiBinary or a Dict/Tuple of those; "
    "actions Discrete, MultiDiscrete, MultiBinary or Box"
)
"""What the built-in policy and the wire protocol take, for error messages."""


def check_spaces(env_id: str, observation_space: Any, action_space: Any, factory: str = "") -> None:
    """Raise :class:`ConfigError` (naming the env and the space) for spaces zmq_rl
    cannot train on. ``factory``: a custom policy factory is given (it sees the same
    spaces; the wire still limits what can travel)."""
    from gymnasium import spaces

    from zmq_rl.wire.codec import ProtocolError
    from zmq_rl.wire.spaces import space_from_spec, space_spec

    problem = ""
    try:
        space_from_spec(space_spec(observation_space))
    except (TypeError, ProtocolError):
        problem = f"observation space {observation_space}"
    if not problem:
        leaf_action = isinstance(
            action_space, (spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary, spaces.Box)
        )
        if not leaf_action:
            problem = f"action space {action_space}"
    if problem:
        raise ConfigError("env_id", env_id, f"unsupported {problem}; supported: {SUPPORTED_SPACES}")


def check_env(
    env_id: str,
    factory: str = "",
    env_kwargs: Any = None,
    wrappers: Any = (),
) -> Any:
    """Make (and close) the env once, as every process of the run will
    (:func:`zmq_rl.envs.env_shape` with ``env_kwargs`` and ``wrappers``), so a bad id
    or an unsupported space fails as a config error up front (see
    :func:`check_spaces` for ``factory``); returns its :class:`~zmq_rl.envs.EnvShape`."""
    from zmq_rl.envs import env_shape

    shape = env_shape(env_id, env_kwargs, wrappers)  # EnvBuildError, a ConfigError
    check_spaces(env_id, shape.observation_space, shape.action_space, factory)
    return shape


def check_learner_host(address: str) -> None:
    """Resolve the host of ``--learner`` now, so a name that does not resolve says so
    (exit 2) instead of looking like a learner that does not answer. A temporary
    resolver failure is a :class:`CliFailure` (exit 1)."""
    from zmq_rl.wire.transport import parse_learner_address

    try:
        host, port = parse_learner_address(address)
    except ValueError as exc:
        raise ConfigError("learner", address, str(exc)) from None
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        if exc.errno == getattr(socket, "EAI_AGAIN", None):
            raise CliFailure(
                f"cannot resolve the learner host {host!r} now ({exc.strerror}): "
                "is the name server reachable?"
            ) from None
        raise ConfigError(
            "learner",
            address,
            f"the host name {host!r} does not resolve ({exc.strerror}): check the "
            "spelling, or give the learner's IP address",
        ) from None


def check_bind_host(host: str) -> None:
    """:class:`ConfigError` naming ``host`` when the learner's ``--host`` is a name that
    does not resolve (libzmq's bind said "No such device", and the learner advised
    another ``--port``). Wildcards and addresses pass; whether an address is this
    machine's is for the bind to say."""
    if host in ("", "*", "0.0.0.0", "::", "[::]"):
        return
    try:
        socket.getaddrinfo(host.strip("[]"), None, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ConfigError(
            "host",
            host,
            f"does not resolve ({exc.strerror}): give an address or name of this machine "
            "(0.0.0.0 binds all of its interfaces)",
        ) from None


_reserved_run_dirs: set[str] = set()


def default_run_dir(env_id: str, root: str = "runs") -> str:
    """``runs/<env>-<YYYYmmdd-HHMMSS>`` (made unique with ``-2``, ``-3``... if taken).

    The directory is created here, exclusively, so two runs started in the same
    second (even by two processes) never get the same one; :func:`release_run_dir`
    removes it again if the command fails before it writes anything.
    """
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", env_id.split(":")[-1]).strip("_") or "run"
    base = Path(root) / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    candidate, n = base, 1
    while True:
        try:
            candidate.mkdir(parents=True)
        except FileExistsError:
            n += 1
            candidate = base.with_name(f"{base.name}-{n}")
            continue
        except OSError as exc:
            raise ConfigError(
                "run_dir", str(candidate), f"cannot create it: {exc.strerror or exc}"
            ) from None
        _reserved_run_dirs.add(str(candidate))
        return str(candidate)


def release_run_dir(run_dir: str) -> None:
    """Remove ``run_dir`` if :func:`default_run_dir` made it and it is still empty."""
    if run_dir in _reserved_run_dirs:
        _reserved_run_dirs.discard(run_dir)
        with suppress(OSError):  # not empty (or gone): keep it
            Path(run_dir).rmdir()


def format_duration(seconds: float) -> str:
    """``75.3`` -> ``"1m15s"``; under a minute ``"12.3s"``."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s"
