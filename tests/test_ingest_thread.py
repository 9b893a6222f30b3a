"""The learner's ingest thread (issue 12, item 2): ``Ingest.serve_during`` serves the
sockets while the PPO update runs, over real tcp sockets on 127.0.0.1.

What a plausible bug would break: a hello not welcomed while the learner trains; a
fragment not queued until the update ends; an actor's slots forgotten while the
update still owns the trainer's per-slot state; a failure in the work lost or the
thread left running; the loop's accounting off (checked end to end by the real runs of
test_learner.py and test_faults.py, which run with the thread on, the default).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest
import zmq

from tests.helpers import STUB_POLICY, RegisteredPeer, stub_learner_config, wait_until
from zmq_rl.config import PPOConfig
from zmq_rl.learner.loop import Learner

TIMEOUT = 10.0


@pytest.fixture
def learner(ctx: zmq.Context, learner_port: int) -> Iterator[Learner]:
    cfg = stub_learner_config(learner_port, actor_timeout=0.5, ingest_thread=True)
    with Learner(cfg, PPOConfig(num_epochs=1), STUB_POLICY, context=ctx) as built:
        yield built


def ingest_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "zmq-rl-ingest"]


def test_a_hello_is_welcomed_and_a_fragment_queued_while_the_work_runs(ctx, learner):
    port = learner.cfg.port
    # The peer waits for its welcome inside the work: only the thread can answer it.
    peer = learner.ingest.serve_during(lambda: RegisteredPeer(ctx, port))
    try:
        assert learner.members.get(peer.actor_id) is not None

        def work() -> str:
            peer.send(peer.fragment(8))
            wait_until(lambda: learner.queues.total_rows() == 8, TIMEOUT, "rows queued")
            return "done"

        assert learner.ingest.serve_during(work) == "done"
        assert learner.counters["received/steps"] == 8
        assert not ingest_threads()  # joined before serve_during returned
    finally:
        peer.close()


def test_an_evicted_actor_is_forgotten_after_the_work_not_during_it(ctx, learner):
    peer = learner.ingest.serve_during(lambda: RegisteredPeer(ctx, learner.cfg.port))
    forgotten: list[list[tuple[int, int]]] = []
    learner.ingest.forget_slots = forgotten.append
    try:

        def prove() -> None:  # one fragment: a hello alone would be dropped, not dead
            peer.send(peer.fragment(8))
            wait_until(lambda: learner.counters["received/steps"] == 8, TIMEOUT, "a fragment")

        learner.ingest.serve_during(prove)

        def work() -> None:
            # The peer goes silent: the thread declares it dead after actor_timeout.
            wait_until(lambda: learner.members.get(peer.actor_id) is None, TIMEOUT, "eviction")
            assert forgotten == []  # the work still owns the trainer's slot state

        learner.ingest.serve_during(work)
        assert forgotten == [[(peer.actor_id, 0)]]
        assert learner.counters["actors/declared_dead"] == 1
    finally:
        peer.close()


def test_a_failing_work_raises_and_leaves_no_thread(learner):
    def work() -> None:
        raise ValueError("update failed")

    with pytest.raises(ValueError, match="update failed"):
        learner.ingest.serve_during(work)
    assert not ingest_threads()
    assert learner.ingest.serve_during(lambda: 7) == 7  # usable again


def test_with_the_thread_off_the_work_runs_alone(ctx, learner_port):
    cfg = stub_learner_config(learner_port)  # off by default
    assert not cfg.ingest_thread
    with Learner(cfg, PPOConfig(num_epochs=1), STUB_POLICY, context=ctx) as learner:
        seen: list[int] = []
        learner.ingest.serve_during(lambda: seen.append(len(ingest_threads())))
        assert seen == [0]


def test_the_work_time_counts_as_busy_time(learner):
    """The valve's lead advice (the learner's busy time per broadcast cycle) needs the
    update's duration even though rows arrive meanwhile: the version does not move
    until the broadcast."""
    done = threading.Event()
    learner.publish_weights()  # a cycle starts
    for _ in range(2):  # two cycles of 0.2 s of work each (the median is over cycles)
        learner.ingest.serve_during(lambda: done.wait(0.2))
        learner.publish_weights()
    assert learner.ingest.links.cycle_time() >= 0.2


@pytest.mark.timeout(300)
def test_a_real_run_with_the_thread_on_learns_and_loses_nothing(tmp_path, capsys):
    """``zmq-rl run --ingest-thread``: the learner and two actor processes on CartPole
    (its preset), the thread serving the sockets during every update and evaluation.
    The accounting is exact (every step received was consumed or discarded for a named
    reason, every actor's sent = received) and the run learns (random play: ~22)."""
    from tests.conftest import free_port_block
    from tests.test_faults import assert_bye_accounting, check_accounting
    from zmq_rl.cli import main as main_cli

    run_dir = tmp_path / "run"
    argv = ["run", "--env", "CartPole-v1", "--ingest-thread", "--total-env-steps", "25600"]
    argv += ["--target-return", "inf", "--port", str(free_port_block()), "--run-dir", str(run_dir)]
    assert main_cli.main([*argv, "--no-plot"]) == 0, capsys.readouterr().err
    report = json.loads((run_dir / "report.json").read_text())
    assert report["stop_reason"] == "budget spent"
    check_accounting(report)
    for stats in report["actor_stats"].values():
        assert_bye_accounting(stats)
    assert report["evaluations"][-1]["mean_return"] >= 100.0, report["evaluations"]
