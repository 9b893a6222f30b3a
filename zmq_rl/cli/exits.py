"""How a command ends: its exit code, its error line, and its log on stderr.

The engine below (:mod:`zmq_rl.run`) raises; this module maps what it raises to the
exit codes of every command: 0 done, 1 failed at run time (learner unreachable or
refused, starved, an actor crashed), 2 bad configuration or usage (argparse's own
code), 130 interrupted (Ctrl-C, SIGTERM, or SIGHUP: the terminal or ssh session
closed, ``tmux kill-session``).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TextIO

from ..config import ConfigError
from ..config_toml import ConfigFileError
from ..rl.installs import TorchMissing
from ..run.common import STOP_SIGNALS, CliFailure, note_hangup

__all__ = [
    "EXIT_CONFIG",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "error",
    "guard",
    "setup_logging",
    "sigterm_as_interrupt",
]

EXIT_FAILED = 1
EXIT_CONFIG = 2
EXIT_INTERRUPTED = 130

_HANGUP = getattr(signal, "SIGHUP", None)


class _StderrHandler(logging.StreamHandler):
    """A handler that writes to whatever ``sys.stderr`` is *now*.

    The live progress display swaps ``sys.stderr`` for a proxy that prints above
    the progress line; a handler bound to the original stream would garble it.
    """

    @property  # type: ignore[override]
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass


@contextmanager
def _own_log_handlers() -> Iterator[None]:
    """Remove the handlers :func:`setup_logging` added once the command is done (so an
    in-process call, as in the tests, leaves the root logger as it found it)."""
    try:
        yield
    finally:
        root = logging.getLogger()
        for handler in list(root.handlers):
            if isinstance(handler, _StderrHandler):
                root.removeHandler(handler)


def setup_logging(level: str) -> None:
    """Send log records of ``level`` and above to stderr, one line each."""
    handler = _StderrHandler()
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S")
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        if isinstance(old, _StderrHandler):  # ours, from an earlier call
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


def error(message: str) -> None:
    """Print ``error: message`` to stderr."""
    print(f"error: {message}", file=sys.stderr, flush=True)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    if signum == _HANGUP and not note_hangup():
        return
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise :class:`KeyboardInterrupt` like
    Ctrl-C, so all three exit cleanly (a repeated SIGHUP is ignored, see
    :func:`~zmq_rl.run.common.note_hangup`); the previous handlers are restored afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {
        sig: signal.signal(sig, _raise_interrupt) for sig in STOP_SIGNALS if sig != signal.SIGINT
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def _no_traceback_on_interrupt() -> Iterator[None]:
    """Swallow a second Ctrl-C while the first one is being cleaned up after."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def guard(body: Callable[[], int], on_interrupt: Callable[[], None] | None = None) -> int:
    """Run a command body and turn its expected failures into messages and exit codes.

    :class:`ConfigError` and :class:`ConfigFileError` print ``error: ...`` and give
    2; :class:`CliFailure` gives its code; :class:`~zmq_rl.rl.installs.TorchMissing`
    (what this host without torch was asked for needs it) prints its line and gives
    2; :class:`KeyboardInterrupt` (Ctrl-C, SIGTERM or SIGHUP, which raise it while
    the body runs) calls ``on_interrupt`` and gives 130. Anything else is a bug and
    keeps its traceback.
    """
    try:
        with sigterm_as_interrupt(), _own_log_handlers():
            return body()
    except (ConfigError, ConfigFileError) as exc:
        error(str(exc))
        return EXIT_CONFIG
    except CliFailure as exc:
        error(str(exc))
        return exc.code
    except TorchMissing as exc:  # e.g. a custom network on an actor host without torch
        error(str(exc))
        return EXIT_CONFIG
    except KeyboardInterrupt:
        with _no_traceback_on_interrupt():
            if on_interrupt is not None:
                on_interrupt()
            print("interrupted", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
