"""Issue 29 item 13: small things a first hour trips over (output a user reads)."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from zmq_rl.run import session as training

ROOT = Path(__file__).resolve().parents[1]
RUN_TIMEOUT_S = 240


QUIET_RUN = """
import zmq_rl

class Stop(zmq_rl.Callback):
    def on_update(self, row):
        return row["update"] < 2

result = zmq_rl.train("CartPole-v1", total_env_steps=8192, num_actors=1, eval_episodes=1,
                      verbose=False, callbacks=[Stop()])
assert result.report.stop_reason == "callback Stop stopped the run", result.report.stop_reason
"""


def test_verbose_false_prints_nothing_when_a_callback_stops_the_run(tmp_path) -> None:
    """``verbose=False`` printed ``stopping: callback Stop stopped the run``: a warning
    that Python's last-resort handler writes when logging is not configured."""
    done = subprocess.run(
        [sys.executable, "-c", QUIET_RUN],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (done.stdout, done.stderr) == ("", "")


class _FakeLearner:
    def __init__(self) -> None:
        self.reasons: list[str] = []

    def request_stop(self, reason: str) -> None:
        self.reasons.append(reason)


@pytest.mark.parametrize("quiet", [False, True])
def test_the_stop_line_of_a_signal_is_left_out_when_quiet(quiet: bool, capsys) -> None:
    learner = _FakeLearner()
    outcome = training.TrainingOutcome(training.LearnerConfig())
    with training._graceful_stop(learner, outcome, quiet=quiet):
        signal.raise_signal(signal.SIGTERM)
    assert learner.reasons == ["interrupted (SIGTERM)"] and outcome.interrupted
    err = capsys.readouterr().err
    assert ("stopping after the current update" in err) is not quiet


def _lines(
    rows: list[dict], steps_at_start: int = 0, total: int = 10, budget: int = 0
) -> list[str]:
    from rich.console import Console

    from zmq_rl.run.progress import TrainingProgress

    out = io.StringIO()
    progress = TrainingProgress(
        total, Console(file=out, width=200), live=False, total_env_steps=budget
    )
    progress.steps_at_start = steps_at_start
    with progress:
        for row in rows:
            progress.update(row)
    return out.getvalue().splitlines()


def _row(update: int, steps: int, wall: float, episodes: int, mean: float) -> dict:
    return {
        "update": update,
        "env_steps": steps,
        "wall_seconds": wall,
        "charts/SPS": steps / wall,  # as the learner computes it: the run's total steps
        "charts/mean_return": mean,
        "charts/episodes": episodes,
        "charts/actors": 2,
        "charts/policy_lag_mean": 0.0,
    }


def test_no_return_is_shown_before_an_episode_ended() -> None:
    """Pong's returns are -21..21: a ``return 0.0`` before any episode ended reads as one."""
    first, second = _lines([_row(1, 1024, 1.0, 0, 0.0), _row(2, 2048, 2.0, 3, -20.3)])
    assert "return -  " in first and "return 0.0" not in first
    assert "return -20.3  " in second


def test_the_update_total_follows_the_steps_updates_really_consume() -> None:
    """A connect-four run printed ``update 444/366``: its total assumed a row per slot
    and step, while only the player to move makes one. The total is estimated again
    from the steps each update consumed (the learner starts no update that would
    overrun the budget: 30,000 at 6,000 a step is 5 updates, 29,000 is 4)."""
    rows = [_row(u, 6_000 * u, float(u), 1, 0.0) for u in (1, 2, 3)]
    lines = _lines(rows, total=3, budget=30_000)
    assert [line.split()[1] for line in lines] == ["1/5", "2/5", "3/5"]
    assert _lines(rows[:1], total=3, budget=29_000)[0].split()[1] == "1/4"
    # a resumed run: only this session's updates and steps count
    (line,) = _lines([_row(11, 66_000, 1.0, 1, 0.0)], steps_at_start=60_000, budget=90_000)
    assert line.split()[1] == "11/15"
    # without a budget the first estimate stays
    assert _lines(rows[:1], total=3)[0].split()[1] == "1/3"


def test_the_learners_log_line_estimates_its_update_total_as_the_bar_does() -> None:
    """A multi-agent run logged ``update 10/9 ... 17/9``: the learner's line kept the
    budget over the batch's rows, while a batch holds rows that are no env steps. Its
    total is estimated again from the env steps this session's updates consumed."""
    from zmq_rl.config import LearnerConfig
    from zmq_rl.learner.report import LearnerReport
    from zmq_rl.learner.runlog import RunLog

    report = LearnerReport()
    runlog = RunLog(LearnerConfig(total_env_steps=30_000, run_dir=""), report)
    runlog.updates_budget = 3  # the plan's figure: budget over rows per update
    assert runlog.updates_total() == 3  # nothing consumed yet
    report.updates_completed, report.env_steps_consumed = 2, 12_000
    assert runlog.updates_total() == 5  # 6,000 env steps an update: 18,000 left buy 3
    report.updates_completed, report.env_steps_consumed = 5, 30_000
    assert runlog.updates_total() == 5


def test_a_resumed_runs_speed_counts_only_this_sessions_steps() -> None:
    """A resume at 830,000 steps showed 83,893 steps/s: the run's total over this
    session's 10 s. 9,930 steps in those 10 s are 993 steps/s."""
    (line,) = _lines([_row(1, 839_930, 10.0, 5, 1.0)], steps_at_start=830_000)
    assert " 993 steps/s " in line and "83,993" not in line
    (line,) = _lines([_row(1, 9_930, 10.0, 5, 1.0)])
    assert " 993 steps/s " in line


def test_the_summary_shows_no_mean_return_without_an_episode() -> None:
    from rich.console import Console

    from zmq_rl.learner.report import LearnerReport

    outcome = training.TrainingOutcome(training.LearnerConfig())
    outcome.report = LearnerReport()
    out = io.StringIO()
    training.print_summary(Console(file=out, width=200), outcome)
    assert "mean return of the last 100: - (no episode ended)" in out.getvalue()


RENDER = """
import gymnasium as gym
from zmq_rl.cli.evaluate import headless_sdl

with headless_sdl():
    env = gym.make("CartPole-v1", render_mode="rgb_array")
    env.reset(seed=0)
    print(env.render().shape)
    import pygame
    pygame.init()  # what SDL complained in: audio without a runtime dir
    env.close()
    pygame.quit()
"""


def test_rendering_for_a_video_prints_no_sdl_errors_without_a_desktop(tmp_path) -> None:
    """``zmq-rl eval --video`` wrote a good video, then SDL printed ``error:
    XDG_RUNTIME_DIR is invalid or not set`` and ALSA errors (issue 29 item 13)."""
    pytest.importorskip("pygame")
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "SDL_AUDIODRIVER")}
    done = subprocess.run(
        [sys.executable, "-c", RENDER],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("(400, 600, 3)")
    assert "XDG_RUNTIME_DIR" not in done.stderr and "ALSA" not in done.stderr, done.stderr


def test_headless_sdl_restores_the_environment(monkeypatch) -> None:
    from zmq_rl.cli.evaluate import headless_sdl

    monkeypatch.delenv("SDL_AUDIODRIVER", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/nonexistent/xdg")
    with headless_sdl():
        lent = os.environ["XDG_RUNTIME_DIR"]
        assert os.path.isdir(lent) and os.stat(lent).st_mode & 0o777 == 0o700
        assert os.environ["SDL_AUDIODRIVER"] == "dummy"
    assert not os.path.exists(lent)
    assert os.environ["XDG_RUNTIME_DIR"] == "/nonexistent/xdg"
    assert "SDL_AUDIODRIVER" not in os.environ


def _actor_pids(port: int) -> list[int]:
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = proc.info["cmdline"] or []
        alive = proc.info["status"] != psutil.STATUS_ZOMBIE
        if alive and "zmq_rl.cli.actor" in cmdline and f"127.0.0.1:{port}" in cmdline:
            found.append(proc.pid)
    return found


def test_actors_of_a_killed_run_say_why_and_exit_at_once(tmp_path) -> None:
    """``kill -9`` of ``zmq-rl run``: its actors lingered 10 s and exited without a word
    (issue 29 item 13). Each logs that the run (its learner) is gone and exits within
    a few seconds."""
    from tests.ports import free_port_block

    port = free_port_block()
    run_dir = tmp_path / "run"
    run = subprocess.Popen(
        [sys.executable, "-m", "zmq_rl.cli.main", "run", "--env", "CartPole-v1"]
        + ["--total-env-steps", "100000000", "--target-return", "inf", "--actors", "2"]
        + ["--port", str(port), "--run-dir", str(run_dir), "--no-plot"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    logs = [run_dir / "logs" / f"actor-{i}.log" for i in range(2)]
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not all(p.is_file() and "collecting" in p.read_text() for p in logs):
            assert run.poll() is None and time.monotonic() < deadline, "actors never collected"
            time.sleep(0.2)
        assert len(_actor_pids(port)) == 2
    finally:
        run.kill()
        run.wait(timeout=30)
    deadline = time.monotonic() + 6.0  # PARENT_POLL_S, then a clean interrupt
    while _actor_pids(port):
        assert time.monotonic() < deadline, "actors still running 6 s after the kill"
        time.sleep(0.1)
    for path in logs:
        assert f"(pid {run.pid}, its learner) is gone: exiting" in path.read_text(), path


def test_the_learners_log_line_and_sps_are_this_sessions(caplog) -> None:
    """The learner's own log line says ``return -`` until an episode ended, and its
    ``charts/SPS`` counts only the steps taken since the (resumed) run loop started."""
    import logging

    from zmq_rl.config import LearnerConfig
    from zmq_rl.learner.report import LearnerReport
    from zmq_rl.learner.runlog import RunLog

    report = LearnerReport()
    report.env_steps_consumed = 1_000_000  # a resumed run's earlier steps
    runlog = RunLog(LearnerConfig(eval_every=0), report)
    runlog.restart_clock()
    runlog.start -= 10.0  # ten seconds of this session
    report.env_steps_consumed += 5_000
    rows = []
    runlog.on_update = rows.append
    with caplog.at_level(logging.INFO, logger="zmq_rl.runlog"):
        runlog.record({"charts/policy_lag_mean": 0.0}, version=1, actors=1)
    assert rows[0]["charts/SPS"] == pytest.approx(500.0, rel=0.05)
    assert "return -  " in caplog.text and "return 0.0" not in caplog.text
