"""Data-parallel learner ranks in real processes (``--num-learners 2``, gloo on CPU):
``zmq-rl run`` trains CartPole to 475 with two ranks, an actor killed with ``kill -9``
is survived (its rank trains on without rows until the replacement is sent to it),
and ``--resume`` continues a two-rank run.

Parameter equality is checked by the run itself after every update (each rank's
digest in the report collective; a difference stops the run with an error), and
exactly in tests/test_data_parallel.py."""

from __future__ import annotations

import os
import re
import signal
import sys

import psutil
import pytest

from tests.conftest import free_port_block
from tests.test_faults import (
    LEARNER,
    START_S,
    ZMQ_RL,
    Procs,
    actor_argv,
    assert_bye_accounting,
    check_accounting,
    checkpoints,
    learner_argv,
    metrics_rows,
    read_report,
    wait_until,
    wait_update,
)
from tests.test_supervisor import actor_children, run_argv

RUN_S = 240
RANK_OF = re.compile(r"actor (\d+) registered from \S+ pid (\d+) .*learner rank (\d+)")


def ports(ranks: int = 2) -> int:
    """A block for control, experience, weights, the other ranks' experience ports and
    the rendezvous."""
    return free_port_block(3 + ranks)


def ranks_of(text: str) -> dict[int, int]:
    """actor pid -> learner rank, from the learner's registration lines."""
    return {int(m.group(2)): int(m.group(3)) for m in RANK_OF.finditer(text)}


@pytest.mark.timeout(RUN_S + 60)
def test_two_learner_ranks_train_cartpole_to_475(tmp_path):
    run_dir = tmp_path / "run"
    procs = Procs(tmp_path)
    try:
        run = procs.start(
            "zmq-rl-run",
            [
                *ZMQ_RL,
                "run",
                "--env",
                "CartPole-v1",
                "--actors",
                "2",
                "--num-learners",
                "2",
                "--port",
                str(ports()),
                "--run-dir",
                str(run_dir),
                "--no-plot",
                "--log-level",
                "info",
            ],
        )
        assert run.wait(RUN_S) == 0, procs.logs()
        text = run.text()
    finally:
        procs.close()
    report = read_report(run_dir)
    best = report["best_evaluation"]
    assert best["mean_return"] >= 475, best
    rows = metrics_rows(run_dir)
    assert rows and all(r["learner/ranks"] == 2 for r in rows)
    # One actor per rank, each of which said bye with everything it sent received.
    stats = report["actor_stats"].values()
    assert sorted(s["learner_rank"] for s in stats) == [0, 1], stats
    for s in stats:
        assert_bye_accounting(s)
    check_accounting(report)
    assert sorted(ranks_of(text).values()) == [0, 1], text[-3000:]


def rank_1_trains_again(run_dir) -> list[dict] | None:
    """The metrics rows once an update ran with rank 1 short of rows and a later one
    with rows on every rank again (None before)."""
    rows = metrics_rows(run_dir)
    flags = [r["learner/ranks_without_rows"] for r in rows]
    if 1 in flags and 0 in flags[flags.index(1) :]:
        return rows
    return None


@pytest.mark.timeout(RUN_S + 60)
def test_kill_9_of_the_only_actor_of_rank_1_is_survived(tmp_path):
    """The run goes on without rows on rank 1, the replacement is sent to rank 1 and
    its rows are trained on; then the test ends the run with SIGINT. (A budget big
    enough for the replacement on a loaded machine would take a minute: the stub
    env's steps are spent at hundreds of updates a second.)

    The restart backoff (5 s) outlasts ``actor_timeout`` (3 s), so rank 1 has given up
    on the dead actor and has no member left when the replacement registers: a rank
    that received only while it waited on a member never saw the replacement's rows,
    and the replacement never joined (a CI failure on a loaded machine)."""
    run_dir = tmp_path / "run"
    procs = Procs(tmp_path)
    port = ports()
    try:
        run = procs.start(
            "zmq-rl-run",
            run_argv(
                port,
                run_dir,
                actors=2,
                budget_updates=100_000,
                eval_every=0,
                actor_timeout=3,
                num_learners=2,
            )
            + ["--no-plot", "--actor-restart-backoff", "5"],
        )
        wait_update(run_dir, 20, START_S, procs, [run])
        ranks = ranks_of(run.text())
        children = actor_children(run.pid)
        (victim,) = [c for c in children.values() if ranks.get(c.pid) == 1]
        victim.kill()
        wait_until(
            lambda: rank_1_trains_again(run_dir),
            RUN_S - START_S,
            "rank 1 training on its replacement actor's rows",
            procs,
            [run],
        )
        os.killpg(run.pid, signal.SIGINT)
        assert run.wait(60) == 130, procs.logs()
        text = run.text()
    finally:
        procs.close()
    report = read_report(run_dir)
    assert report["stop_reason"] == "interrupted (SIGINT)"
    assert victim.pid in [d["pid"] for d in report["dead_actors"]]
    (restart,) = report["supervisor"]["restarts"]
    assert restart["pid"] == victim.pid and restart["new_pid"]
    # The rank that lost its actor gets the replacement (the fewest live slots).
    assert ranks_of(text)[restart["new_pid"]] == 1, text[-3000:]
    replacement = [s for s in report["actor_stats"].values() if s["pid"] == restart["new_pid"]]
    assert replacement and replacement[0]["steps_consumed"] > 0, report["actor_stats"]
    assert replacement[0]["learner_rank"] == 1
    check_accounting(report)
    rows = metrics_rows(run_dir)
    assert all(r["learner/ranks"] == 2 for r in rows)
    # Between the death and the replacement's first rows, rank 1 had no actor: the
    # updates went on with its weight 0 (it did not hold the run up).
    assert any(r["learner/ranks_without_rows"] == 1 for r in rows)


@pytest.mark.timeout(RUN_S + 60)
def test_resume_of_a_two_rank_run_with_three_ranks_finishes_the_budget(tmp_path):
    """A checkpoint is rank 0's whole state: the run continues with another number of
    ranks (here 3 for 2 actors, so one rank trains without rows)."""
    run_dir = tmp_path / "run"
    procs = Procs(tmp_path)
    port = ports(3)
    try:
        first = procs.start(
            "first",
            run_argv(
                port,
                run_dir,
                actors=2,
                budget_updates=150,
                eval_every=0,
                checkpoint_every=5,
                num_learners=2,
            )
            + ["--no-plot"],
        )
        wait_update(run_dir, 20, START_S, procs, [first])
        wait_until(lambda: checkpoints(run_dir), 10, "a checkpoint", procs)
        os.killpg(first.pid, signal.SIGINT)
        assert first.wait(60) == 130, procs.logs()
        interrupted = read_report(run_dir)
        rows_before = len(metrics_rows(run_dir))
        second = procs.start(
            "second",
            [*ZMQ_RL, "run", "--resume", str(run_dir), "--port", str(port)]
            + ["--total-env-steps", str(16 * 2 * 200), "--num-learners", "3"]
            + ["--log-level", "info"],
        )
        assert second.wait(RUN_S) == 0, procs.logs()
    finally:
        procs.close()
    assert interrupted["stop_reason"] == "interrupted (SIGINT)"
    report = read_report(run_dir)
    assert report["stop_reason"] == "budget spent"
    assert report["counters"]["learner/resumes"] == 1
    rows = metrics_rows(run_dir)
    assert rows[rows_before]["update"] == interrupted["updates_completed"] + 1
    assert all(r["learner/ranks"] == 2 for r in rows[:rows_before])
    assert all(r["learner/ranks"] == 3 for r in rows[rows_before:])
    assert all(r["learner/ranks_without_rows"] >= 1 for r in rows[rows_before:])
    check_accounting(report)


@pytest.mark.timeout(RUN_S + 60)
def test_a_lost_learner_rank_stops_the_run_with_its_name_and_a_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    procs = Procs(tmp_path)
    try:
        run = procs.start(
            "zmq-rl-run",
            run_argv(
                ports(), run_dir, actors=2, budget_updates=100_000, eval_every=0, num_learners=2
            )
            + ["--no-plot"],
        )
        wait_update(run_dir, 10, START_S, procs, [run])
        (rank1,) = [
            c
            for c in psutil.Process(run.pid).children()
            if any("spawn_main" in part for part in c.cmdline())
        ]
        rank1.kill()
        assert run.wait(60) == 1, procs.logs()
        text = run.text()
    finally:
        procs.close()
    assert f"a learner rank was lost: zmq-rl-learner-rank-1 (pid {rank1.pid})" in text, text
    report = read_report(run_dir)
    assert report["stop_reason"].startswith("a learner rank was lost")
    assert all(s["said_bye"] for s in report["actor_stats"].values())  # shut down cleanly
    assert checkpoints(run_dir)  # rank 0's final checkpoint: --resume continues from it


@pytest.mark.timeout(RUN_S + 60)
def test_torchrun_starts_the_ranks_of_zmq_learner(tmp_path):
    """``torchrun --nproc-per-node 2 -m zmq_rl.cli.learner ... --num-learners 2``:
    each process takes its rank from RANK; actors connect to rank 0 as always."""
    run_dir = tmp_path / "run"
    procs = Procs(tmp_path)
    port = ports()
    argv = learner_argv(port, run_dir, actors=2, budget_updates=60, eval_every=0)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    try:
        learner = procs.start(
            "torchrun",
            [*torchrun, "--nproc-per-node", "2", "-m", "zmq_rl.cli.learner", *argv[len(LEARNER) :]]
            + ["--num-learners", "2"],
        )
        actors = [procs.start(f"actor-{i}", actor_argv(f"127.0.0.1:{port}")) for i in range(2)]
        assert learner.wait(RUN_S) == 0, procs.logs()
        for actor in actors:
            assert actor.wait(30) == 0, procs.logs()
    finally:
        procs.close()
    report = read_report(run_dir)
    assert report["stop_reason"] == "budget spent"
    assert sorted(s["learner_rank"] for s in report["actor_stats"].values()) == [0, 1]
    for stats in report["actor_stats"].values():
        assert_bye_accounting(stats)
    check_accounting(report)
    assert all(r["learner/ranks"] == 2 for r in metrics_rows(run_dir))
