"""The supervisor of ``zmq-rl run``: local actor processes that are started, watched,
restarted when they die and always stopped; and a learner resumed from its newest
checkpoint when it crashes.

Actors. Each actor is ``python -m zmq_rl.cli.actor --learner 127.0.0.1:PORT ...``
in a process group of its own (so a Ctrl-C at the terminal reaches only the parent,
which then stops the actors in order) but in the parent's session, so that where Linux
shares the CPU between sessions ("autogroup") the run's processes share it among
themselves as equals, with ``--parent-pid`` so that an actor also exits by
itself if the parent dies without cleaning up. Its output goes to
``RUN_DIR/logs/actor-<i>.log`` (appended to, one header line per start).

An actor that dies while the learner trains is logged with its exit code and the
end of its log, and started again after a backoff (``restart_backoff`` seconds,
doubling with every consecutive failure up to :data:`MAX_BACKOFF_S`), at most
``max_restarts`` times per actor. The new process registers as any late joiner
does (without ``--actor-id``: the dead one's id stays taken until the learner
declares it dead after ``actor_timeout``) and gets the current weights in its
welcome. What is not restarted, because a restart would run the same command into
the same error:

* an exit with code 2 (:data:`ACTOR_CONFIG_EXIT`: the actor's own
  configuration error, e.g. a ``--factory`` it cannot load);
* an exit with an error (code > 0) before the actor ever started collecting (a
  start-up failure: the learner's env or policy cannot be built on this host).

Those stop the run at once (``Learner.request_stop``), as does an actor whose
restarts are exhausted, or the last actor leaving; the command then fails (exit 1)
with a message naming the actor, its exit and the end of its log, unless the
learner's report says that the run succeeded (its budget spent or its target
reached before the stop took effect: exit 0, the summary, the failure logged and
kept in ``report.json``). An actor that exits 0 or 130 (it was told to stop, or
interrupted on purpose) is not restarted either, and the run goes on without it.
Every restart and exit is listed in :meth:`LocalActors.summary` (``report.json``'s
``supervisor`` section).

The run's end is not a failure: once the learner has a stop reason (it sets it
before it tells its actors to shut down), no exit is restarted or counted against
the run, whatever its code (an actor still waiting for its welcome when the
learner stopped exits 1).

Stopping: wait for the actors to exit after the learner's shutdown, then SIGTERM,
wait, SIGKILL, wait: no orphans. SIGINT, SIGTERM and SIGHUP are ignored meanwhile.

Learner. :class:`ResumingLearner` (``zmq-rl run --resume-on-crash``) runs the
learner; when its ``run()`` raises, it logs the traceback, closes it and continues
from the newest checkpoint with :meth:`~zmq_rl.learner.loop.Learner.resume` on the same
ports, while the actor processes keep running: they see the new run id and
register again.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from ..config import LearnerConfig
from ..learner.report import LearnerReport, succeeded
from .common import CliFailure
from .fleet import FleetLearner

if TYPE_CHECKING:
    from ..learner.loop import Learner

log = logging.getLogger("zmq_rl.cli.local")

__all__ = [
    "RESUME_CHANGEABLE",
    "LocalActors",
    "ResumingLearner",
    "connect_host",
    "describe_exit",
    "resume_configs",
    "summary_lines",
    "write_supervisor_report",
]

NATURAL_EXIT_S = 15.0
"""How long actors get to exit by themselves after the learner's shutdown."""
TERMINATE_WAIT_S = 5.0
"""How long actors get to exit after SIGTERM before SIGKILL."""
POLL_S = 0.2
LOG_TAIL_LINES = 15
MAX_BACKOFF_S = 30.0
"""The longest wait before restarting an actor, however often it failed in a row."""
HEALTHY_AFTER_S = 60.0
"""An actor that ran this long before it died starts its backoff from the beginning."""
READY_PATTERN = re.compile(r"actor \d+ collecting on ")
"""The actor's log line once it registered and built its envs and policy: from then
on, a failure is not a start-up failure."""
READY_AFTER_S = 30.0
"""Without that line (an actor log level above info), an actor that has run this
long counts as started."""
READY_FILE_FLAG = "--ready-file"
"""Without a log to read (no run dir), each actor is given a file to create once it
collects (``zmq-actor``'s hidden flag): a failure after it is not a start-up failure."""
LOG_HEADER = "=== zmq-rl run: "
"""Start of the line written into an actor's log before each start of its process."""
CLEAN_EXITS = (0, 130)
"""Exit codes of an actor that stopped on purpose (not restarted): done, or interrupted
(the actor command's :data:`~zmq_rl.cli.exits.EXIT_INTERRUPTED`)."""
ACTOR_CONFIG_EXIT = 2
"""The exit code of an actor command that stopped on its own configuration error
(:data:`~zmq_rl.cli.exits.EXIT_CONFIG`): not restarted, the same command would fail
the same way."""
STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)
"""Ignored while the actors are being stopped, so that stopping always completes."""


def connect_host(bind_host: str) -> str:
    """The address a local actor uses to reach a learner bound to ``bind_host``."""
    if bind_host in ("", "*", "0.0.0.0"):
        return "127.0.0.1"
    if bind_host in ("::", "[::]"):
        return "::1"
    return bind_host


def describe_exit(code: int) -> str:
    """``-9`` -> ``"killed by SIGKILL"``, ``1`` -> ``"exit code 1"``."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


@dataclass
class _Slot:
    """One local actor (index ``index``) across its restarts."""

    index: int
    proc: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = None
    starts: int = 0
    restarts: int = 0
    consecutive_failures: int = 0
    started_at: float = 0.0
    log_offset: int = 0
    """Where this process's output starts in the log file."""
    ready: bool = False
    ready_scan: int = 0
    ready_file: Path | None = None
    """The file this process creates once it collects (no run dir: no log to read)."""
    restart_at: float | None = None
    """When a pending restart is due (None: none pending)."""
    pending: dict[str, Any] | None = None
    """The restart record that the pending restart completes."""
    gone: bool = False
    """Exited on purpose; not restarted."""
    last_exit: str = ""
    pids: list[int] = field(default_factory=list)


class LocalActors:
    """A context manager that runs and supervises ``count`` actor processes for ``learner``.

    ``log_dir``: each actor's stdout and stderr go to ``log_dir/actor-<i>.log``
    (None: its log to this process's stderr, its final stats line nowhere).
    ``extra_args`` are passed to every actor. ``max_restarts``: how often each
    actor may be restarted after it died; ``restart_backoff``: seconds before the
    first restart, doubled with each consecutive failure (see the module doc).
    After ``__exit__``, :attr:`exit_codes` holds each actor's last exit code, and
    :meth:`summary` every restart and exit; with a run dir, that summary is also
    added to ``report.json`` as ``supervisor``.
    """

    def __init__(
        self,
        learner: FleetLearner,
        count: int,
        *,
        log_dir: Path | None = None,
        log_level: str = "info",
        extra_args: Sequence[str] = (),
        max_restarts: int = 3,
        restart_backoff: float = 1.0,
    ) -> None:
        if max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
        if restart_backoff < 0:
            raise ValueError(f"restart_backoff must be >= 0, got {restart_backoff}")
        self.learner = learner
        self.count = count
        self.log_dir = log_dir
        self.log_level = log_level
        self.extra_args = list(extra_args)
        self.max_restarts = max_restarts
        self.restart_backoff = restart_backoff
        self.slots = [_Slot(i) for i in range(count)]
        self.exit_codes: list[int | None] = []
        self.restarts: list[dict[str, Any]] = []
        """One record per restart: actor index, old pid, exit, when, restart number,
        delay and the new pid."""
        self.exits: list[dict[str, Any]] = []
        """Exits during training that were not restarted (clean exits, failures)."""
        self.failure = ""
        self._t0 = time.monotonic()
        self._stop = threading.Event()
        self._monitor: threading.Thread | None = None
        self._ready_dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def procs(self) -> list[subprocess.Popen[bytes]]:
        """The current (or last) process of every actor."""
        return [slot.proc for slot in self.slots if slot.proc is not None]

    def command(self, actor_id: int, *, fixed_id: bool = True) -> list[str]:
        """The command line of actor ``actor_id`` (``fixed_id``: with ``--actor-id``)."""
        cfg = self.learner.cfg
        host = connect_host(cfg.host)
        address = f"[{host}]:{cfg.port}" if ":" in host else f"{host}:{cfg.port}"
        return [
            sys.executable,
            "-m",
            "zmq_rl.cli.actor",
            "--learner",
            address,
            *(["--actor-id", str(actor_id)] if fixed_id else []),
            "--log-level",
            self.log_level,
            "--parent-pid",
            str(os.getpid()),
            *self.extra_args,
        ]

    def log_path(self, actor_id: int) -> Path | None:
        """Where actor ``actor_id`` logs (None: inherited stderr)."""
        return None if self.log_dir is None else self.log_dir / f"actor-{actor_id}.log"

    # ------------------------------------------------------------------ starting

    def __enter__(self) -> LocalActors:
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        else:
            self._ready_dir = tempfile.TemporaryDirectory(prefix="zmq_rl-ready-")
        try:
            for slot in self.slots:
                self._spawn(slot)
        except BaseException:
            self._stop_all(natural=False)
            raise
        self._monitor = threading.Thread(target=self._watch, name="actor-monitor", daemon=True)
        self._monitor.start()
        return self

    def _spawn(self, slot: _Slot) -> None:
        """Start (or restart) the process of ``slot``."""
        path = self.log_path(slot.index)
        if slot.log is not None:
            slot.log.close()
            slot.log = None
        if path is not None:
            slot.log = open(path, "ab")  # noqa: SIM115 (closed at the next start or in __exit__)
            slot.log_offset = slot.log.tell()
            what = "start" if slot.starts == 0 else f"restart {slot.restarts}"
            stamp = time.strftime("%H:%M:%S")
            header = f"{LOG_HEADER}actor {slot.index}, {what}, {stamp} ===\n"
            slot.log.write(header.encode())
            slot.log.flush()
        log_file = slot.log
        slot.ready_file = None
        if self._ready_dir is not None:  # its log is not read: a file says it collects
            slot.ready_file = Path(self._ready_dir.name) / f"actor-{slot.index}-{slot.starts}"
        slot.proc = subprocess.Popen(
            self.command(slot.index, fixed_id=slot.starts == 0)
            + ([READY_FILE_FLAG, str(slot.ready_file)] if slot.ready_file else []),
            stdin=subprocess.DEVNULL,
            stdout=log_file if log_file else subprocess.DEVNULL,
            stderr=subprocess.STDOUT if log_file else None,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            # Not a session of its own: an autogroup per actor would give each actor
            # as much CPU as the learner and its evaluator together (docs/benchmarks.md
            # §23: on two cores evaluations then reported 5-15 updates late, not 3-6).
            process_group=0,
        )
        slot.starts += 1
        slot.started_at = time.monotonic()
        slot.ready = False
        slot.ready_scan = slot.log_offset
        slot.pids.append(slot.proc.pid)

    # ------------------------------------------------------------------ watching

    def _ending(self) -> bool:
        """Whether the run is over or ending (actors exiting is then expected)."""
        return self._stop.is_set() or bool(self.learner.report.stop_reason)

    def _watch(self) -> None:
        """Poll the actors: restart the dead ones, or stop the run (see the module doc)."""
        try:
            while not self._stop.wait(POLL_S):
                if self._ending():
                    continue
                for slot in self.slots:
                    if not self._check(slot):
                        return
                if not any(s.restart_at is not None or not s.gone for s in self.slots):
                    exits = "; ".join(f"actor {s.index}: {s.last_exit}" for s in self.slots)
                    self._fail(f"no actor is left ({exits})", "no actor left")
                    return
        except Exception as exc:  # noqa: BLE001 - an unsupervised run must not go on silently
            log.exception("the actor supervisor failed")
            self._fail(f"the actor supervisor failed: {exc!r}", "actor supervisor failed")

    def _check(self, slot: _Slot) -> bool:
        """Handle one actor; False once the run must fail."""
        now = time.monotonic()
        if slot.restart_at is not None:
            if now >= slot.restart_at:
                slot.restart_at = None
                try:
                    self._spawn(slot)
                except OSError as exc:
                    self._fail(
                        f"cannot restart actor {slot.index}: {exc}", f"actor {slot.index} lost"
                    )
                    return False
                assert slot.proc is not None and slot.pending is not None
                slot.pending["new_pid"] = slot.proc.pid
                log.info(
                    "actor %d restarted as pid %d (restart %d of %d)",
                    slot.index,
                    slot.proc.pid,
                    slot.restarts,
                    self.max_restarts,
                )
            return True
        if slot.gone or slot.proc is None:
            return True
        code = slot.proc.poll()
        if code is None:
            self._update_ready(slot, now)
            return True
        return self._on_exit(slot, code, now)

    def _update_ready(self, slot: _Slot, now: float) -> None:
        if slot.ready:
            return
        if now - slot.started_at >= READY_AFTER_S:
            slot.ready = True
            return
        path = self.log_path(slot.index)
        if path is None:
            slot.ready = slot.ready_file is not None and slot.ready_file.exists()
            return
        try:
            with open(path, "rb") as f:
                f.seek(slot.ready_scan)
                chunk = f.read()
        except OSError:
            return
        text = chunk.decode(errors="replace")
        if READY_PATTERN.search(text):
            slot.ready = True
        elif "\n" in text:  # rescan only the unfinished last line next time
            slot.ready_scan += len(chunk) - len(chunk.rsplit(b"\n", 1)[-1])

    def _on_exit(self, slot: _Slot, code: int, now: float) -> bool:
        self._update_ready(slot, now)  # the line may have come just before the exit
        assert slot.proc is not None
        pid = slot.proc.pid
        self.learner.actor_exited(pid)  # its registration is dead now, not after actor_timeout
        uptime = now - slot.started_at
        why = describe_exit(code)
        slot.last_exit = f"pid {pid} {why}"
        tail = self._log_tail(slot)
        record = {
            "actor": slot.index,
            "pid": pid,
            "exit_code": code,
            "exit": why,
            "uptime_s": round(uptime, 2),
            "at_s": round(now - self._t0, 2),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        who = f"actor {slot.index} (pid {pid})"
        if code in CLEAN_EXITS:
            slot.gone = True
            log.warning(
                "%s exited with %s while the learner was training; not restarted "
                "(it stopped on purpose)",
                who,
                why,
            )
            self.exits.append({**record, "action": "not restarted: stopped on purpose"})
            return True
        if code == ACTOR_CONFIG_EXIT:
            reason = "a configuration error, not restarted"
        elif code > 0 and not slot.ready:
            reason = (
                f"a start-up failure after {uptime:.1f}s, before it started collecting; "
                "not restarted: the same command would fail the same way"
            )
        elif slot.restarts >= self.max_restarts:
            reason = f"restarts exhausted ({slot.restarts} of --actor-restarts {self.max_restarts})"
        else:
            slot.consecutive_failures = (
                0 if uptime >= HEALTHY_AFTER_S else slot.consecutive_failures
            )
            delay = min(
                self.restart_backoff * 2**slot.consecutive_failures,
                max(MAX_BACKOFF_S, self.restart_backoff),
            )
            slot.consecutive_failures += 1
            slot.restarts += 1
            log.warning(
                "%s %s after %.1fs while the learner was training; restarting it in %.1fs "
                "(restart %d of %d)%s",
                who,
                why,
                uptime,
                delay,
                slot.restarts,
                self.max_restarts,
                tail,
            )
            slot.pending = {**record, "restart": slot.restarts, "delay_s": delay, "new_pid": None}
            self.restarts.append(slot.pending)
            slot.restart_at = now + delay
            return True
        self.exits.append({**record, "action": f"run stopped: {reason}"})
        self._fail(f"{who} {why} ({reason}){tail}", f"actor {slot.index} {why}")
        return False

    def _fail(self, message: str, stop_reason: str) -> None:
        self.failure = message
        log.debug("%s", message)  # the command prints it as its error
        log.warning("stopping the run: %s", stop_reason)  # when, with a timestamp
        self.learner.request_stop(stop_reason)

    def _log_tail(self, slot: _Slot) -> str:
        path = self.log_path(slot.index)
        if path is None or not path.is_file():
            return ""
        with open(path, "rb") as f:
            f.seek(slot.log_offset)
            lines = f.read().decode(errors="replace").splitlines()
        lines = [line for line in lines if not line.startswith(LOG_HEADER)]
        lines = lines[-LOG_TAIL_LINES:]
        body = "\n".join(f"    {line}" for line in lines)
        return f"; end of {path}:\n{body}" if lines else f"; {path} is empty"

    # ------------------------------------------------------------------ stopping

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._stop.set()
        if self._monitor is not None:
            self._monitor.join()
        natural = exc_type is None and bool(self.learner.report.stop_reason)
        # Finish stopping the actors whatever arrives meanwhile.
        previous = {s: signal.signal(s, signal.SIG_IGN) for s in STOP_SIGNALS}
        try:
            self._stop_all(natural)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        self._write_report()
        if self._ready_dir is not None:
            self._ready_dir.cleanup()
            self._ready_dir = None
        if self.failure and exc_type in (None, KeyboardInterrupt):
            if not succeeded(self.learner.report.stop_reason):
                raise CliFailure(self.failure)
            # The learner ended the run as meant before the failure could stop it: the
            # run succeeded (exit 0, its summary); the failure stays in report.json.
            log.warning(
                "after the run ended (%s): %s", self.learner.report.stop_reason, self.failure
            )

    def _stop_all(self, natural: bool) -> None:
        """Wait (if the run ended) then terminate, then kill; reap every actor."""
        procs = self.procs
        if natural:
            _wait_all(procs, NATURAL_EXIT_S)
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        _wait_all(procs, TERMINATE_WAIT_S)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        for proc in procs:
            proc.wait()
        self.exit_codes = [slot.proc.returncode if slot.proc else None for slot in self.slots]
        for slot in self.slots:
            if slot.log is not None:
                slot.log.close()
                slot.log = None

    def summary(self) -> dict[str, Any]:
        """What the supervisor did: its settings, every restart, every exit during
        training that was not restarted, the failure (if any), and the learner's
        restarts when the learner is a :class:`ResumingLearner`."""
        out: dict[str, Any] = {
            "actors": self.count,
            "actor_restarts": self.max_restarts,
            "actor_restart_backoff": self.restart_backoff,
            "restarts": self.restarts,
            "exits": self.exits,
            "actor_pids": {str(s.index): s.pids for s in self.slots},
            "failure": self.failure,
        }
        if self.learner.learner_restarts is not None:
            out["learner_restarts"] = self.learner.learner_restarts
        return out

    def _write_report(self) -> None:
        run_dir = self.learner.cfg.run_dir
        if run_dir:
            write_supervisor_report(Path(run_dir), self.summary())


def write_supervisor_report(run_dir: Path, section: Mapping[str, Any]) -> bool:
    """Add ``section`` to ``run_dir/report.json`` as ``"supervisor"`` (atomically).

    The learner writes ``report.json`` when its run ends; the supervisor's part
    is added afterwards by the CLI. Returns False when there is no report to add
    to (an aborted run).
    """
    path = run_dir / "report.json"
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    report["supervisor"] = dict(section)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=2, default=float))
    os.replace(tmp, path)
    return True


def _wait_all(procs: Sequence[subprocess.Popen[bytes]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for proc in procs:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        try:
            proc.wait(remaining)
        except subprocess.TimeoutExpired:
            return


# -- the learner ------------------------------------------------------------------------

REBIND_S = 10.0
"""How long a resumed learner retries binding the ports its crashed predecessor held."""


class ResumingLearner:
    """Runs a :class:`~zmq_rl.learner.loop.Learner`; when ``run()`` raises, resumes it from
    the newest checkpoint in its run dir (on the same ports, with the same settings)
    and runs again, at most ``max_restarts`` times.

    Not restarted: :class:`~zmq_rl.learner.loop.LearnerStarved` (the actors are missing,
    a new learner would starve too), a crash after :meth:`request_stop`, and a crash
    before the first checkpoint (nothing to resume from). Those, and a crash once the
    restarts are spent, end the command with an error naming the crash. ``cfg`` and
    ``report`` are the current learner's: it is a :class:`~zmq_rl.run.fleet.RunLearner`,
    all a fleet and the engine use. :attr:`learner_restarts` lists each restart.
    """

    def __init__(self, learner: Learner, max_restarts: int) -> None:
        self.current = learner
        self.max_restarts = max_restarts
        self.learner_restarts: list[dict[str, Any]] = []
        self.started = time.monotonic()
        self.session_seconds = 0.0
        self._stop_reason = ""

    @property
    def cfg(self) -> LearnerConfig:
        """The current learner's settings."""
        return self.current.cfg

    @property
    def report(self) -> LearnerReport:
        """The current learner's report."""
        return self.current.report

    def request_stop(self, reason: str) -> None:
        """Ask the current learner to stop; a learner resumed later stops as well."""
        self._stop_reason = reason
        self.current.request_stop(reason)

    def actor_exited(self, pid: int) -> None:
        """Tell the current learner that an actor process exited."""
        self.current.actor_exited(pid)

    def close(self) -> None:
        """Close the current learner's sockets."""
        self.current.close()

    def run(self) -> LearnerReport:
        """Run the learner to the end, resuming it after each crash; its report."""
        from zmq_rl.learner.loop import LearnerStarved

        try:
            while True:
                try:
                    return self.current.run()
                except LearnerStarved:
                    raise
                except Exception as exc:  # noqa: BLE001 - any crash of the learner
                    self._recover(exc)
        finally:
            self.session_seconds = time.monotonic() - self.started

    def _recover(self, exc: Exception) -> None:
        """Log the crash and replace :attr:`current` with a resumed learner, or raise."""
        from zmq_rl.learner.checkpoint import newest_checkpoint

        old = self.current
        crash = f"{type(exc).__name__}: {exc}"
        log.error("the learner crashed: %s", crash, exc_info=exc)
        if self._stop_reason:
            raise CliFailure(f"the learner crashed while stopping: {crash}") from exc
        if len(self.learner_restarts) >= self.max_restarts:
            raise CliFailure(
                f"the learner crashed {len(self.learner_restarts) + 1} times "
                f"(--resume-on-crash {self.max_restarts}); last crash: {crash}"
            ) from exc
        try:
            checkpoint = newest_checkpoint(old.cfg.run_dir) if old.cfg.run_dir else None
        except FileNotFoundError:
            checkpoint = None
        if checkpoint is None:
            raise CliFailure(
                f"the learner crashed before its first checkpoint, nothing to resume from: {crash}"
            ) from exc
        record = {
            "restart": len(self.learner_restarts) + 1,
            "error": crash,
            "at_s": round(time.monotonic() - self.started, 2),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "updates_completed_at_crash": old.report.updates_completed,
            "resumed_from": str(checkpoint),
        }
        log.warning(
            "resuming the learner from %s (restart %d of %d); the actors keep running",
            checkpoint,
            record["restart"],
            self.max_restarts,
        )
        old.close()
        self.current = self._resume(old)
        record["resumed_at_update"] = self.current.report.updates_completed
        self.learner_restarts.append(record)
        if self._stop_reason:
            self.current.request_stop(self._stop_reason)

    @staticmethod
    def _resume(old: Learner) -> Learner:
        """``Learner.resume`` of ``old``'s run dir with ``old``'s settings, retrying the
        bind while the closed sockets release the ports (bounded)."""
        import zmq

        from zmq_rl.learner.loop import Learner

        overrides = dataclasses.asdict(old.cfg)
        run_dir = overrides.pop("run_dir")
        deadline = time.monotonic() + REBIND_S
        while True:
            try:
                return Learner.resume(
                    run_dir,
                    on_update=old.on_update,
                    on_evaluation=old.on_evaluation,
                    **overrides,
                )
            except OSError as exc:
                if not isinstance(exc.__cause__, zmq.ZMQError) or time.monotonic() > deadline:
                    raise
                time.sleep(POLL_S)


SUMMARY_RESTARTS = 5
"""Restarts listed one by one in the summary (all of them are in report.json)."""


def summary_lines(actors: LocalActors | None, learner: ResumingLearner | None) -> dict[str, str]:
    """The end-of-run summary's lines on actor and learner restarts."""
    lines: dict[str, str] = {}
    if actors is not None:
        restarts = actors.restarts
        text = ", ".join(
            f"actor {r['actor']} (pid {r['pid']}, {r['exit']}) at {r['at_s']:.1f}s"
            + (f" -> pid {r['new_pid']}" if r["new_pid"] else " (not started: the run ended)")
            for r in restarts[:SUMMARY_RESTARTS]
        )
        more = f", ... ({len(restarts)} in all)" if len(restarts) > SUMMARY_RESTARTS else ""
        lines["actor restarts"] = f"{len(restarts)}: {text}{more}" if restarts else "none"
    if learner is not None:
        lines["learner restarts"] = (
            ", ".join(
                f"at {r['at_s']:.1f}s ({r['error']}) from update {r['resumed_at_update']}"
                for r in learner.learner_restarts
            )
            or "none"
        )
    return lines


# -- zmq-rl run --resume ----------------------------------------------------------------

RESUME_CHANGEABLE = (
    "total_env_steps",
    "host",
    "port",
    "num_actors",
    "eval_every",
    "eval_episodes",
    "target_return",
    "checkpoint_every",
    "keep_checkpoint_every",
    "starvation_timeout",
    "actor_timeout",
    "device",
    "num_learners",
)
"""Learner settings that ``zmq-rl run --resume`` may change: the budget, where to
listen, how many local actors, evaluation, checkpointing, timeouts, the device
(a run checkpointed on a GPU continues on a CPU-only machine) and the number of
learner ranks (a checkpoint is rank 0's whole state, whatever N wrote it). Every
other learner, PPO and policy setting comes from the checkpoint."""


def resume_configs(
    run_dir: str,
    args: Any,
    defaults: Mapping[str, Any],
    sections: Sequence[Any],
) -> tuple[Any, Any, Any, dict[str, Any]]:
    """The configs to resume ``run_dir`` with, and the overrides for ``Learner.resume``.

    ``args`` are the parsed ``zmq-rl run`` flags, ``defaults`` their parser defaults
    by dest, ``sections`` the config :class:`~zmq_rl.cli.flags.Section` list. A flag
    whose value differs from its default counts as given (a flag given with its
    default value cannot be told apart and is taken as not given). A given value
    that differs from the run's must be one of :data:`RESUME_CHANGEABLE`; any other
    raises :class:`~zmq_rl.config.ConfigError` naming the field (exit 2).
    """
    from zmq_rl.config import ConfigError
    from zmq_rl.learner.checkpoint import load_resume_configs

    if getattr(args, "config", None) is not None:
        raise ConfigError(
            "config",
            str(args.config),
            "cannot be combined with --resume (a resumed run keeps its checkpoint's settings)",
        )
    # A device given now applies from the first read: the checkpoint's own (cuda)
    # may not exist on this machine.
    device = getattr(args, "learner.device", None)
    early = {} if device is None or device == defaults.get("learner.device") else {"device": device}
    try:
        configs = load_resume_configs(run_dir, **early)
    except (OSError, ValueError) as exc:
        raise CliFailure(f"cannot resume {run_dir}: {exc}") from None
    current: dict[str, Any] = {}
    for cfg in configs:
        current.update({f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)})
    overrides: dict[str, Any] = dict(early)
    for section in sections:
        for f in section.fields():
            dest = section.dest(f.name)
            value = getattr(args, dest, None)
            if value is None or value == defaults.get(dest):
                continue
            if f.name == "run_dir":
                if Path(value).resolve() != Path(run_dir).resolve():
                    raise ConfigError("run_dir", value, f"--resume {run_dir} runs in {run_dir}")
                continue
            if value == current[f.name]:
                continue
            if section.name != "learner" or f.name not in RESUME_CHANGEABLE:
                raise ConfigError(
                    f.name,
                    value,
                    f"cannot change on --resume (the run has {current[f.name]!r}); only "
                    + ", ".join(RESUME_CHANGEABLE)
                    + " may",
                )
            overrides[f.name] = value
    try:
        cfg, ppo, policy = load_resume_configs(run_dir, **overrides)
    except (OSError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise CliFailure(f"cannot resume {run_dir}: {exc}") from None
    return cfg, ppo, policy, overrides
