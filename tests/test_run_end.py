"""The end of a run is not a failure (issue 44 §2).

* the learner lets its actors go (``shutdown``, their byes collected) before its
  final evaluation and before it waits for the background evaluator: a pursuit run's
  20 deterministic evaluation episodes took minutes, its actors gave up on the silent
  learner (``learner_timeout``) and were restarted; a Pendulum run's actors waited 33 s
  for the background evaluation of the last snapshot (up to 120 s on a busy host,
  ``BACKGROUND_FINISH_S``) plus the final one;
* an evaluation the learner runs in its loop (no background evaluator) is served on
  a thread: the actors are answered meanwhile;
* the supervisor restarts no actor once the run ends, and a run whose report says it
  succeeded exits 0 even if an actor failed as it ended.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import STUB_POLICY, TIMEOUT, gym_actor, stub_learner_config, wait_until
from tests.test_supervisor import SELF_KILL, FakeLearner, ScriptedActors, wait_for
from zmq_rl.config import PPOConfig
from zmq_rl.learner.loop import Learner
from zmq_rl.learner.report import LearnerReport, succeeded
from zmq_rl.run.common import CliFailure
from zmq_rl.run.local_actors import LocalActors

ROOT = Path(__file__).resolve().parents[1]
LEARNER_TIMEOUT_S = 2.0
"""The actors' ``--learner-timeout`` in the real-process test: shorter than the final
evaluation there, which waits until every actor process has exited."""


def test_which_stop_reasons_are_a_success():
    assert succeeded("budget spent") and succeeded("evaluation reached target_return 475")
    for reason in ("", "interrupted (SIGINT)", "actor 0 lost", "learner starved: ..."):
        assert not succeeded(reason)
    assert LearnerReport(stop_reason="budget spent").succeeded


@pytest.mark.timeout(60)
def test_an_actor_failure_as_the_run_ends_does_not_fail_a_run_that_succeeded(tmp_path):
    """The supervisor's failure (an actor's restarts exhausted) raced the budget: the
    learner's report says "budget spent", so the command succeeds (exit 0, summary);
    the failure is logged and kept in the supervisor's summary."""
    learner = FakeLearner()
    actors = ScriptedActors(learner, [[SELF_KILL]], log_dir=tmp_path, max_restarts=0)
    with actors:
        wait_for(lambda: actors.failure, 30, "failure")
        learner.report.stop_reason = "budget spent"  # the run ended as the failure came
    assert "restarts exhausted" in actors.summary()["failure"]
    stopped = FakeLearner()
    failing = ScriptedActors(stopped, [[SELF_KILL]], log_dir=tmp_path, max_restarts=0)
    with pytest.raises(CliFailure, match="restarts exhausted"), failing:
        wait_for(lambda: failing.failure, 30, "failure")
        stopped.report.stop_reason = "actor 0 exit code -9"  # the failure stopped it


@pytest.mark.timeout(120)
def test_actors_are_let_go_before_the_final_evaluation(ctx, learner_port, start_learner):
    """Every actor has said bye when the final evaluation starts, and when the
    learner waits for its background evaluator (before, both came first)."""
    cfg = stub_learner_config(learner_port, num_actors=2, eval_every=3)
    learner, run = start_learner(cfg)
    seen: dict[str, list[bool]] = {}

    def byes_said(name: str, original):
        def wrapper(*args, **kwargs):
            seen[name] = [rec.said_bye for rec in learner.members]
            return original(*args, **kwargs)

        return wrapper

    learner.runlog.evaluate = byes_said("evaluate", learner.runlog.evaluate)
    learner.runlog.finish_background = byes_said("finish", learner.runlog.finish_background)
    actors = [gym_actor(ctx, learner_port) for _ in range(2)]
    report = run.join(TIMEOUT)
    for actor in actors:
        actor.join()
    assert report.stop_reason == "budget spent"
    assert seen["finish"] == [True, True], seen
    assert report.evaluations[-1]["updates"] == report.updates_completed
    if "evaluate" in seen:  # (the background evaluator may have measured the last update)
        assert seen["evaluate"] == [True, True], seen


@pytest.mark.timeout(120)
def test_an_evaluation_in_the_loop_is_served_on_a_thread(ctx, learner_port, start_learner):
    """Several policies (or ``eval_in_background`` off) evaluate in the learner's loop:
    the sockets are served meanwhile, so an evaluation longer than the actors'
    learner_timeout loses nobody (before, only with ``ingest_thread``)."""
    cfg = stub_learner_config(
        learner_port, eval_every=2, eval_in_background=False, total_env_steps=8 * 4
    )
    learner, run = start_learner(cfg)
    original, served = learner.runlog.evaluate, []

    def long_evaluation(policy):
        if not served:  # the first periodic evaluation: hold it while the actor is heard
            heard = learner.members.get(0).last_seen
            wait_until(
                lambda: learner.members.get(0).last_seen > heard + 2 * LEARNER_TIMEOUT_S,
                TIMEOUT,
                "heartbeats read during the evaluation",
            )
            served.append(True)
        return original(policy)

    learner.runlog.evaluate = long_evaluation
    actor = gym_actor(ctx, learner_port, learner_timeout=LEARNER_TIMEOUT_S)
    report = run.join(TIMEOUT)
    actor.join()
    assert served and report.stop_reason == "budget spent"
    assert report.dead_actors == []


@pytest.mark.timeout(180)
def test_the_end_of_a_run_restarts_no_actor_however_long_it_takes(learner_port, tmp_path):
    """``zmq-rl run``'s supervisor with real actor processes whose ``--learner-timeout``
    (2 s) is shorter than the learner's final evaluation (it waits until every actor
    process has exited): the actors were let go first, so each exits 0 after its bye,
    none is restarted, and the supervisor reports no failure. (Before, the actors gave
    up on the silent learner, exit 1, and were restarted: ``no welcome``.)"""
    cfg = stub_learner_config(learner_port, num_actors=2, run_dir=str(tmp_path / "run"))
    learner = Learner(cfg, PPOConfig(num_epochs=1), STUB_POLICY)
    supervisor = LocalActors(
        learner,
        2,
        log_dir=tmp_path / "logs",
        extra_args=["--learner-timeout", str(LEARNER_TIMEOUT_S)],
        max_restarts=3,
        restart_backoff=0.1,
    )
    original = learner.runlog.evaluate

    def final_evaluation(policy):
        procs = supervisor.procs
        wait_until(lambda: all(p.poll() is not None for p in procs), 30, "the actors' exit")
        return original(policy)

    learner.runlog.evaluate = final_evaluation
    try:
        with supervisor:
            report = learner.run()
    finally:
        learner.close()
    assert report.stop_reason == "budget spent"
    assert supervisor.exit_codes == [0, 0], [s.last_exit for s in supervisor.slots]
    assert supervisor.restarts == [] and supervisor.exits == [] and not supervisor.failure
    assert all(line["said_bye"] for line in report.actor_stats.values())
