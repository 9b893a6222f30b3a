"""Fault injection with real OS processes: the console scripts on 127.0.0.1.

Every test starts ``zmq-learner`` / ``zmq-actor`` / ``zmq-rl run`` as processes (in
their own sessions, so a signal reaches exactly whom the test means), injects one
fault (``kill -9``, SIGTERM, SIGINT to a process group, a learner that never comes
back) and checks what the failure model (docs/failure-model.md) promises: who is
declared dead, who re-registers, what the report counts, how fast everything
stops. Waits are on observable events only (a log line, a ``metrics.jsonl`` row,
a checkpoint file, an exit), each in a bounded polling loop. Measured times are
printed (``pytest -s`` shows them) as ``FAULT-TIMING name: seconds``.

The stub env (``tests.stub_env:Stub-v0``) and a 16-unit network keep the runs
cheap: learning is not the point here.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest

from tests.conftest import STUB_ENV_ID, free_port_block
from tests.netns import SLOW_ENV_ID
from zmq_rl.learner.metrics import is_evaluation_row

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
POLL_S = 0.05
"""Period of every polling loop (not a synchronisation sleep: each loop has a deadline)."""
START_S = 60.0
"""Bound on a process starting up far enough to log (importing torch on a busy 2-core box)."""
RUN_S = 60.0
"""Bound on a run (or what is left of it) reaching its end."""
STOP_S = 5.0
"""Everything stops within this long of SIGINT / SIGTERM."""
TIMING_TAG = "FAULT-TIMING"

T = TypeVar("T")


def _command(script: str, module: str) -> list[str]:
    """The console script next to this interpreter, else ``python -m module``."""
    exe = BIN / script
    return [str(exe)] if exe.is_file() else [sys.executable, "-m", module]


LEARNER = _command("zmq-learner", "zmq_rl.cli.learner")
ACTOR = _command("zmq-actor", "zmq_rl.cli.actor")
ZMQ_RL = _command("zmq-rl", "zmq_rl")
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def report_timing(name: str, seconds: float) -> None:
    """Print one measured figure in a greppable form."""
    print(f"{TIMING_TAG} {name}: {seconds:.2f}s", flush=True)


# -- processes ------------------------------------------------------------------------


class Proc:
    """One process of a test: stdout and stderr into ``log_dir/name.log``, own session."""

    def __init__(
        self, name: str, argv: Sequence[str], log_dir: Path, prefix: Sequence[str] = ()
    ) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self.argv = [*prefix, *argv]
        with open(self.log_path, "wb") as out:
            self.popen = subprocess.Popen(
                self.argv,
                cwd=ROOT,
                env=ENV,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pid = self.popen.pid
        self.started = time.monotonic()

    def text(self) -> str:
        """Everything the process wrote so far."""
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.popen.poll() is None

    def find(self, pattern: str, start: int = 0) -> re.Match[str] | None:
        """The first match of ``pattern`` in the log after character ``start``."""
        return re.compile(pattern, re.M).search(self.text(), start)

    def signal(self, sig: int) -> None:
        self.popen.send_signal(sig)

    def wait(self, timeout: float) -> int:
        """The exit code; fails the test (with the log) if not exited within ``timeout``."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"{self.name} (pid {self.pid}) still running after {timeout:.0f}s:\n{self.tail()}"
            )

    def tail(self, lines: int = 40) -> str:
        body = "\n".join(self.text().splitlines()[-lines:])
        return f"--- {self.name} (pid {self.pid}, rc {self.popen.poll()}) ---\n{body}"

    def stop(self) -> None:
        """Kill the whole session of the process (cleanup after a failed test)."""
        if self.popen.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.popen.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(10)


class Procs:
    """The processes of one test; every one is killed and reaped at the end."""

    def __init__(self, log_dir: Path, prefix: Sequence[str] = ()) -> None:
        self.log_dir = log_dir
        self.prefix = list(prefix)
        self.all: list[Proc] = []

    def start(self, name: str, argv: Sequence[str], prefix: Sequence[str] | None = None) -> Proc:
        proc = Proc(name, argv, self.log_dir, self.prefix if prefix is None else prefix)
        self.all.append(proc)
        return proc

    def logs(self) -> str:
        """The tails of every log, for assertion messages."""
        return "\n".join(p.tail() for p in self.all)

    def close(self) -> None:
        for proc in self.all:
            proc.stop()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    """A :class:`Procs` whose processes cannot outlive the test."""
    registry = Procs(tmp_path)
    try:
        yield registry
    finally:
        registry.close()


def wait_until(
    check: Callable[[], T | None],
    timeout: float,
    what: str,
    procs: Procs | None = None,
    must_live: Sequence[Proc] = (),
) -> T:
    """Poll ``check`` until it returns something truthy; fail after ``timeout`` seconds
    (or as soon as a process of ``must_live`` exits), with every log in the message."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        dead = [p for p in must_live if not p.alive()]
        if dead or time.monotonic() > deadline:
            why = f"{dead[0].name} exited" if dead else f"not within {timeout:.0f}s"
            logs = procs.logs() if procs is not None else ""
            pytest.fail(f"waiting for {what}: {why}\n{logs}")
        time.sleep(POLL_S)


def wait_line(
    proc: Proc,
    pattern: str,
    timeout: float,
    procs: Procs | None = None,
    start: int = 0,
    must_live: Sequence[Proc] | None = None,
) -> re.Match[str]:
    """Wait for ``pattern`` in ``proc``'s log (after character ``start``)."""
    return wait_until(
        lambda: proc.find(pattern, start),
        timeout,
        f"{pattern!r} in {proc.name}'s log",
        procs,
        [proc] if must_live is None else must_live,
    )


# -- run directory --------------------------------------------------------------------


def metrics_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The complete update rows of ``metrics.jsonl`` so far (evaluations have rows of
    their own there, :func:`zmq_rl.learner.metrics.is_evaluation_row`)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines(keepends=True):
        if line.endswith("\n") and not is_evaluation_row(row := json.loads(line)):
            rows.append(row)
    return rows


def wait_update(
    run_dir: Path, update: int, timeout: float, procs: Procs, must_live: Sequence[Proc]
) -> dict[str, Any]:
    """Wait for a metrics row with ``update >= update``; return the newest row."""

    def check() -> dict[str, Any] | None:
        rows = metrics_rows(run_dir)
        return rows[-1] if rows and rows[-1]["update"] >= update else None

    return wait_until(check, timeout, f"update {update} in metrics.jsonl", procs, must_live)


def wait_both_actors_trained(run_dir: Path, procs: Procs, must_live: Sequence[Proc]) -> None:
    """Wait for an update whose batch held both actors' rows: rows mode takes the oldest
    rows, whoever sent them, so an actor that registered late (a loaded box) may not
    have fed the first updates, and its ``steps_consumed`` would still be 0."""
    wait_until(
        lambda: any(r.get("batch/actors", 0) >= 2 for r in metrics_rows(run_dir)),
        START_S, "an update that used both actors' rows", procs, must_live,
    )  # fmt: skip


def read_report(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "report.json").read_text())


def checkpoints(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "checkpoints").glob("ckpt-*.pt"))


def rows_queued_in(checkpoint: Path) -> int:
    """Rows the learner held (received, neither consumed nor discarded) when it wrote
    ``checkpoint``."""
    import torch

    state = torch.load(checkpoint, weights_only=True)
    counters = json.loads(state["counters"])
    consumed = json.loads(state["report"])["env_steps_consumed"]
    discarded = sum(v for k, v in counters.items() if k.startswith("discarded/steps/"))
    return counters.get("received/steps", 0) - consumed - discarded


def learner_argv(
    port: int, run_dir: Path, *, actors: int, budget_updates: int, **flags: Any
) -> list[str]:
    """``zmq-learner`` flags for a small stub-env run of about ``budget_updates`` updates
    at full membership (one env per actor, 16 rows per slot and update). ``flags``
    override or add settings (``actor_timeout=3`` -> ``--actor-timeout 3``)."""
    settings: dict[str, Any] = {
        "env": STUB_ENV_ID,
        "port": port,
        "num_actors": actors,
        "num_envs": 1,
        "num_steps": 16,
        "fragment_length": 8,
        "total_env_steps": 16 * actors * budget_updates,
        "hidden_sizes": 16,
        "num_epochs": 2,
        "minibatch_size": 16,
        "eval_episodes": 1,
        "run_dir": run_dir,
        "log_level": "info",
        "starvation_timeout": 60,
        **flags,
    }
    argv = []
    for key, value in settings.items():
        argv += ["--" + key.replace("_", "-"), str(value)]
    return [*LEARNER, *argv, "--no-tensorboard"]


def actor_argv(address: str, **flags: Any) -> list[str]:
    """``zmq-actor`` flags (the stub env, info logging, generous registration)."""
    settings: dict[str, Any] = {
        "learner": address,
        "env": STUB_ENV_ID,
        "log_level": "info",
        "register_timeout": 60,
        "learner_timeout": 30,
        **flags,
    }
    argv = []
    for key, value in settings.items():
        argv += ["--" + key.replace("_", "-"), str(value)]
    return [*ACTOR, *argv]


REGISTERED = r"registered as actor (\d+) of run (\w+) \(version (\d+), base version (\d+)\)"
"""The actor's log line on every welcome."""


def registered(proc: Proc, start: int = 0) -> re.Match[str] | None:
    return proc.find(REGISTERED, start)


def check_accounting(report: dict[str, Any]) -> dict[str, int]:
    """Every step the learner accepted was consumed or discarded for a named reason:
    ``received/steps == consumed/steps + sum(discarded/steps/<reason>)``. Returns the
    discards by reason."""
    counters = report["counters"]
    discarded = {
        key.removeprefix("discarded/steps/"): value
        for key, value in counters.items()
        if key.startswith("discarded/steps/")
    }
    assert counters["consumed/steps"] == report["env_steps_consumed"]
    assert counters["received/steps"] == counters["consumed/steps"] + sum(discarded.values()), (
        counters
    )
    return discarded


def assert_bye_accounting(stats: dict[str, Any]) -> None:
    """An actor that said bye: the learner received every step it says it sent."""
    assert stats["said_bye"] is True, stats
    assert stats["steps_received"] == stats["actor/steps_sent"], stats
    assert stats["steps_consumed"] > 0, stats
    assert stats["actor/fragments_sent"] == stats["fragments_received"], stats


def wait_exits(procs: Sequence[Proc], since: float, timeout: float) -> dict[str, float]:
    """Wait (bounded) until every process exited; return each one's exit time after
    ``since`` (polled, so each figure is late by at most one poll period)."""
    exited: dict[str, float] = {}
    deadline = since + timeout
    while len(exited) < len(procs) and time.monotonic() < deadline:
        for proc in procs:
            if proc.name not in exited and not proc.alive():
                exited[proc.name] = time.monotonic() - since
        time.sleep(POLL_S)
    late = [p.tail() for p in procs if p.name not in exited]
    assert not late, f"still running {timeout:.0f}s after the signal:\n" + "\n".join(late)
    return exited


def still_running(pids: Sequence[int]) -> list[int]:
    """The pids of ``pids`` that are live processes (neither gone nor zombies)."""
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def process_tree(pid: int) -> list[int]:
    """``pid`` and every descendant."""
    root = psutil.Process(pid)
    return [pid, *(child.pid for child in root.children(recursive=True))]


# -- 1. an actor is killed -----------------------------------------------------------

ACTOR_TIMEOUT_S = 3.0


@pytest.mark.timeout(180)
def test_kill_9_actor_is_declared_dead_and_the_run_finishes(procs, tmp_path, learner_port):
    run_dir = tmp_path / "run"
    address = f"127.0.0.1:{learner_port}"
    learner = procs.start(
        "learner",
        # Rows batches do not wait for a dead actor, so the run must outlast its
        # actor_timeout: envs that take 20 ms a step (two survivors: ~2 updates a
        # second, ~10 s after the kill).
        learner_argv(
            learner_port, run_dir, actors=3, budget_updates=25, actor_timeout=ACTOR_TIMEOUT_S,
            env=SLOW_ENV_ID,
        ),
    )
    actors = [procs.start(f"actor{i}", actor_argv(address, env=SLOW_ENV_ID)) for i in range(3)]
    wait_update(run_dir, 3, START_S, procs, [learner, *actors])
    victim, survivors = actors[1], [actors[0], actors[2]]
    victim_id = int(wait_until(lambda: registered(victim), 5, "the victim's id", procs).group(1))
    log_mark = len(learner.text())
    victim.signal(signal.SIGKILL)
    killed_at = time.monotonic()
    assert victim.wait(10) == -signal.SIGKILL
    wait_line(
        learner, rf"actor {victim_id} .*declared dead", ACTOR_TIMEOUT_S + 30, procs, start=log_mark
    )
    detection = time.monotonic() - killed_at
    report_timing("actor kill -9 -> declared dead (actor_timeout 3 s)", detection)

    assert learner.wait(RUN_S) == 0, procs.logs()
    for actor in survivors:
        assert actor.wait(30) == 0, actor.tail()
    report = read_report(run_dir)
    assert report["stop_reason"] == "budget spent"
    dead = report["dead_actors"]
    assert [(d["actor_id"], d["pid"]) for d in dead] == [(victim_id, victim.pid)], dead
    assert ACTOR_TIMEOUT_S <= dead[0]["silent_seconds"] < ACTOR_TIMEOUT_S + 5
    # actor_timeout after the victim's last message (it heartbeats every second, so
    # that is about a second before the kill at most), plus the learner's 50 ms poll.
    assert detection <= ACTOR_TIMEOUT_S + 10
    counters = report["counters"]
    assert counters["actors/declared_dead"] == 1
    assert counters.get("experience/seq_gaps", 0) == 0
    (victim_line,) = report["departed_actors"]
    assert (victim_line["actor_id"], victim_line["pid"]) == (victim_id, victim.pid)
    assert victim_line["said_bye"] is False and victim_line["left_because"] == "actor_dead"
    stats = {**report["actor_stats"], "departed": victim_line}
    for actor in survivors:
        (summary,) = [s for s in stats.values() if s["pid"] == actor.pid]
        assert_bye_accounting(summary)
    discarded = check_accounting(report)
    assert set(discarded) <= {"actor_dead", "run_ended"}, discarded
    # Per actor too: every accepted step is in exactly one actor's steps_received.
    assert sum(s["steps_received"] for s in stats.values()) == counters["received/steps"]
    print(f"discarded steps by reason: {discarded}")


# -- 2. a replacement joins mid-run ---------------------------------------------------


@pytest.mark.timeout(180)
def test_replacement_actor_starts_from_the_current_version(procs, tmp_path, learner_port):
    """A late joiner's welcome carries the learner's current weights and version, so
    its very first fragment is tagged with that version, not 0. To keep the run from
    ending while the replacement starts (importing torch takes seconds), one member
    is frozen (SIGSTOP; a long actor_timeout keeps it a member): with every slot's
    rollout (``--batch-mode slots``, whose admission at a broadcast this checks) the
    learner waits on its rows, so its version stands still until the member is thawed."""
    run_dir = tmp_path / "run"
    address = f"127.0.0.1:{learner_port}"
    learner = procs.start(
        "learner",
        # The slots of every member, of which the frozen one holds the rollout still.
        learner_argv(
            learner_port, run_dir, actors=2, budget_updates=100, actor_timeout=60,
            batch_mode="slots",
        ),
    )
    actors = [procs.start(f"actor{i}", actor_argv(address)) for i in range(2)]
    wait_update(run_dir, 3, START_S, procs, [learner, *actors])
    frozen = actors[1]
    frozen.signal(signal.SIGSTOP)
    try:
        version_before = metrics_rows(run_dir)[-1]["version"]
        replacement = procs.start("replacement", actor_argv(address))
        started_at = time.monotonic()
        welcome = wait_line(replacement, REGISTERED, START_S, procs)
        report_timing("replacement start -> registered", time.monotonic() - started_at)
        version_now = metrics_rows(run_dir)[-1]["version"]
    finally:
        frozen.signal(signal.SIGCONT)
    new_id, version, base = int(welcome.group(1)), int(welcome.group(3)), int(welcome.group(4))
    assert version_before > 0
    assert version >= version_before, "the welcome's weights are older than the learner's"
    assert version >= version_now
    # It joins the rollout at a broadcast once it delivers (protocol v2: the learner
    # moves its base version on until then): consumption starts at version + 1 or later.
    assert base == version + 1
    joined = wait_line(learner, rf"actor {new_id} joins the rollout at version (\d+)", RUN_S, procs)
    assert int(joined.group(1)) >= base

    assert learner.wait(RUN_S) == 0, procs.logs()
    for actor in [*actors, replacement]:
        assert actor.wait(30) == 0, actor.tail()
    report = read_report(run_dir)
    summary = report["actor_stats"][str(new_id)]
    assert summary["pid"] == replacement.pid
    assert_bye_accounting(summary)
    assert report["dead_actors"] == []
    check_accounting(report)


# -- 3. the learner is killed and resumed --------------------------------------------

RESUMED = r"resumed (\S+) at update (\d+), version (\d+)"


@pytest.fixture(scope="module")
def learner_restart(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """kill -9 the learner of a 2-actor run after a checkpoint, restart it with
    ``zmq-learner --resume RUN_DIR --port P``; the run's facts for the tests below."""
    tmp = tmp_path_factory.mktemp("learner_restart")
    port = free_port_block(3)
    run_dir = tmp / "run"
    address = f"127.0.0.1:{port}"
    procs = Procs(tmp)
    try:
        first = procs.start(
            "learner",
            # Heavy updates and a lead of two rollouts: the actors run ahead, so rows
            # are queued when a checkpoint is written (what a restart loses).
            learner_argv(
                port,
                run_dir,
                actors=2,
                budget_updates=60,
                checkpoint_every=5,
                num_epochs=10,
                max_lead_steps=64,
            ),
        )
        actors = [procs.start(f"actor{i}", actor_argv(address)) for i in range(2)]
        wait_update(run_dir, 8, START_S, procs, [first, *actors])
        wait_until(lambda: checkpoints(run_dir), 10, "a checkpoint", procs)
        first.signal(signal.SIGKILL)
        killed_at = time.monotonic()
        assert first.wait(10) == -signal.SIGKILL
        rows_before = len(metrics_rows(run_dir))
        marks = [len(a.text()) for a in actors]
        queued_at_checkpoint = rows_queued_in(checkpoints(run_dir)[-1])

        second = procs.start(
            "learner-resumed",
            [*LEARNER, "--resume", str(run_dir), "--port", str(port), "--log-level", "info"],
        )
        restarted_at = time.monotonic()
        resumed = wait_line(second, RESUMED, START_S, procs)
        resumed_at = time.monotonic()
        reregistered = []
        for actor, mark in zip(actors, marks, strict=True):
            wait_line(actor, r"registering again", 30, procs, start=mark)
            reregistered.append(actor.alive())
        first_new = wait_until(
            lambda: metrics_rows(run_dir)[rows_before:][:1],
            RUN_S,
            "an update after the resume",
            procs,
            [second, *actors],
        )[0]
        recovered_at = time.monotonic()
        report_timing("learner restart -> first update after resume", recovered_at - restarted_at)
        report_timing("resumed learner bound -> first update", recovered_at - resumed_at)
        report_timing("learner kill -9 -> first update after resume", recovered_at - killed_at)
        codes = {p.name: p.wait(RUN_S) for p in (second, *actors)}
        yield {
            "run_dir": run_dir,
            "actors": actors,
            "codes": codes,
            "logs": procs.logs(),
            "reregistered_alive": reregistered,
            "ckpt_update": int(resumed.group(2)),
            "ckpt_version": int(resumed.group(3)),
            "first_new": first_new,
            "report": read_report(run_dir),
            "queued_at_checkpoint": queued_at_checkpoint,
        }
    finally:
        procs.close()


@pytest.mark.timeout(180)
def test_kill_9_learner_then_resume_keeps_the_same_actors(learner_restart):
    run = learner_restart
    assert all(run["reregistered_alive"]), "an actor died instead of registering again"
    assert run["codes"] == {"learner-resumed": 0, "actor0": 0, "actor1": 0}, run["logs"]
    first_new = run["first_new"]
    assert first_new["update"] == run["ckpt_update"] + 1
    assert first_new["version"] > run["ckpt_version"]
    report = run["report"]
    assert report["resumed_from"].endswith(f"ckpt-{run['ckpt_update']:08d}.pt")
    assert report["last_policy_version"] >= first_new["version"]
    assert report["stop_reason"] == "budget spent"
    assert report["counters"]["learner/resumes"] == 1
    assert report["dead_actors"] == []
    for actor in run["actors"]:
        (summary,) = [s for s in report["actor_stats"].values() if s["pid"] == actor.pid]
        assert summary["said_bye"] and summary["steps_consumed"] > 0
        assert summary["actor/reregistrations"] == 1


@pytest.mark.timeout(180)
def test_counters_add_up_after_a_learner_restart(learner_restart):
    if not learner_restart["queued_at_checkpoint"]:
        pytest.skip("no rows were queued when the checkpoint resumed from was written")
    check_accounting(learner_restart["report"])


# -- 4. SIGTERM / SIGINT on the learner ----------------------------------------------


@pytest.mark.timeout(180)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_learner_signal_stops_everything_cleanly(procs, tmp_path, learner_port, sig):
    run_dir = tmp_path / "run"
    address = f"127.0.0.1:{learner_port}"
    learner = procs.start(
        "learner", learner_argv(learner_port, run_dir, actors=2, budget_updates=100_000)
    )
    actors = [procs.start(f"actor{i}", actor_argv(address)) for i in range(2)]
    wait_update(run_dir, 3, START_S, procs, [learner, *actors])
    wait_both_actors_trained(run_dir, procs, [learner, *actors])
    pids = [pid for p in (learner, *actors) for pid in process_tree(p.pid)]
    learner.signal(sig)
    signalled_at = time.monotonic()
    exits = wait_exits([learner, *actors], signalled_at, 30)
    name = signal.Signals(sig).name
    report_timing(f"learner {name} -> every process exited", max(exits.values()))
    assert max(exits.values()) <= STOP_S, exits
    assert learner.popen.returncode == 130, learner.tail()
    for actor in actors:
        assert actor.popen.returncode == 0, actor.tail()
        assert f"learner requested shutdown: interrupted ({name})" in actor.text()
    assert still_running(pids) == [], "orphans"
    report = read_report(run_dir)
    assert report["stop_reason"] == f"interrupted ({name})"
    assert checkpoints(run_dir)[-1].name == f"ckpt-{report['updates_completed']:08d}.pt"
    assert (run_dir / "policy.pt").is_file()
    for actor in actors:
        (summary,) = [s for s in report["actor_stats"].values() if s["pid"] == actor.pid]
        assert_bye_accounting(summary)
    assert report["counters"].get("experience/seq_gaps", 0) == 0
    check_accounting(report)


# -- 5. Ctrl-C on zmq-rl run -------------------------------------------------------


@pytest.mark.timeout(180)
@pytest.mark.parametrize("plot", ["--no-plot", "--plot"])
def test_ctrl_c_on_zmq_rl_run_stops_the_whole_tree(procs, tmp_path, learner_port, plot):
    run_dir = tmp_path / "run"
    argv = learner_argv(learner_port, run_dir, actors=2, budget_updates=100_000, eval_every=0)
    run = procs.start("zmq-rl-run", [*ZMQ_RL, "run", *argv[len(LEARNER) :], plot])
    wait_update(run_dir, 3, START_S, procs, [run])
    wait_both_actors_trained(run_dir, procs, [run])
    tree = wait_until(
        lambda: (tree := process_tree(run.pid))[2:] and tree, 10, "two actor processes", procs
    )
    os.killpg(run.pid, signal.SIGINT)  # what a terminal does on Ctrl-C: the foreground group
    signalled_at = time.monotonic()
    actors_gone = wait_until(
        lambda: not still_running(tree[1:]) and time.monotonic(), 30, "the actors to exit", procs
    )
    rc = run.wait(30)
    stopped = time.monotonic() - signalled_at
    report_timing(f"zmq-rl run {plot}: Ctrl-C -> actors exited", actors_gone - signalled_at)
    report_timing(f"zmq-rl run {plot}: Ctrl-C -> whole tree exited", stopped)
    assert still_running(tree) == [], "orphans"
    assert rc == 130, run.tail()
    assert "Traceback" not in run.text()
    report = read_report(run_dir)
    assert report["stop_reason"] == "interrupted (SIGINT)"
    assert len(report["actor_stats"]) == 2
    for summary in report["actor_stats"].values():
        assert_bye_accounting(summary)
    if plot == "--no-plot":
        assert stopped <= STOP_S
    else:  # drawing learning_curve.png (matplotlib) comes on top, after everything stopped
        assert actors_gone - signalled_at <= STOP_S
        assert stopped <= STOP_S + 10


# -- 6. the learner never comes back -------------------------------------------------

LEARNER_TIMEOUT_S = 3.0


@pytest.fixture(scope="module")
def learner_gone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A 1-actor run whose learner is killed for good; the actor's exit."""
    tmp = tmp_path_factory.mktemp("learner_gone")
    port = free_port_block(3)
    run_dir = tmp / "run"
    procs = Procs(tmp)
    try:
        learner = procs.start(
            "learner", learner_argv(port, run_dir, actors=1, budget_updates=100_000)
        )
        actor = procs.start(
            "actor", actor_argv(f"127.0.0.1:{port}", learner_timeout=LEARNER_TIMEOUT_S)
        )
        wait_update(run_dir, 2, START_S, procs, [learner, actor])
        learner.signal(signal.SIGKILL)
        killed_at = time.monotonic()
        rc = actor.wait(LEARNER_TIMEOUT_S + 30)
        elapsed = time.monotonic() - killed_at
        report_timing("learner gone -> actor exits (learner_timeout 3 s)", elapsed)
        yield {"rc": rc, "elapsed": elapsed, "text": actor.text()}
    finally:
        procs.close()


@pytest.mark.timeout(120)
def test_actor_gives_up_after_learner_timeout(learner_gone):
    assert learner_gone["rc"] == 1, learner_gone["text"]
    assert LEARNER_TIMEOUT_S - 1 <= learner_gone["elapsed"] <= LEARNER_TIMEOUT_S + 10
    assert "learner_timeout=3s" in learner_gone["text"]


@pytest.mark.timeout(120)
def test_actor_says_why_it_gave_up_without_a_traceback(learner_gone):
    text = learner_gone["text"]
    assert re.search(r"^error: no message from the learner .*learner_timeout=3s", text, re.M)
    assert "Traceback" not in text


# -- 7. accounting at a clean shutdown -----------------------------------------------


@pytest.mark.timeout(180)
def test_clean_shutdown_accounts_for_every_step(procs, tmp_path, learner_port):
    run_dir = tmp_path / "run"
    address = f"127.0.0.1:{learner_port}"
    learner = procs.start(
        "learner",
        learner_argv(learner_port, run_dir, actors=2, budget_updates=40, num_envs=2),
    )
    actors = [procs.start(f"actor{i}", actor_argv(address)) for i in range(2)]
    assert learner.wait(RUN_S + START_S) == 0, procs.logs()
    for actor in actors:
        assert actor.wait(30) == 0, actor.tail()
    report = read_report(run_dir)
    counters = report["counters"]
    assert report["stop_reason"] == "budget spent"
    assert counters.get("experience/seq_gaps", 0) == 0
    assert not [k for k in counters if k.startswith(("rejected/", "actors/"))], counters
    stats = report["actor_stats"]
    assert sorted(s["pid"] for s in stats.values()) == sorted(a.pid for a in actors)
    for summary in stats.values():
        assert summary["num_envs"] == 2
        assert_bye_accounting(summary)
    assert sum(s["steps_received"] for s in stats.values()) == counters["received/steps"]
    assert set(check_accounting(report)) <= {"run_ended"}


# -- the learner's own stall -------------------------------------------------------


@pytest.mark.timeout(180)
def test_a_long_update_does_not_declare_live_actors_dead(procs, tmp_path, learner_port):
    """Actors heartbeat every second while the learner computes; an update longer than
    actor_timeout is the learner's silence, not theirs: the heartbeats that queued
    meanwhile must be read before anyone is judged silent."""
    timeout = 2.0
    run_dir = tmp_path / "run"
    address = f"127.0.0.1:{learner_port}"
    learner = procs.start(
        "learner",
        learner_argv(
            learner_port,
            run_dir,
            actors=2,
            budget_updates=3,
            actor_timeout=timeout,
            num_epochs=1500,
        ),
    )
    actors = [procs.start(f"actor{i}", actor_argv(address)) for i in range(2)]
    assert learner.wait(RUN_S + START_S) == 0, procs.logs()
    for actor in actors:
        assert actor.wait(30) == 0, actor.tail()
    rows = metrics_rows(run_dir)
    longest = max(
        b["wall_seconds"] - a["wall_seconds"] for a, b in zip(rows, rows[1:], strict=False)
    )
    report_timing("longest update (actor_timeout 2 s)", longest)
    if longest <= timeout + 1:
        pytest.skip(f"updates took at most {longest:.1f}s here: not longer than actor_timeout")
    report = read_report(run_dir)
    assert report["dead_actors"] == [], report["dead_actors"]
