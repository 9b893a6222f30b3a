"""Separate hosts on one machine: the learner and two actors, each in its own network
namespace, on one bridge (tests/netns.py). A fault is a cable pull: the bridge port
of one actor goes down for a while and comes back.

* a cut longer than the learner's ``--actor-timeout``: the learner declares the actor
  dead and trains on; once the link is back, the same actor process hears that it
  was forgotten, registers again, rejoins the rollout, and the run completes. The
  actor paused for the link during the cut, so it wastes no work after the link is
  back: the steps it sent that the learner rejected are those it had made before it
  paused (within its valve's lead), and at most one fragment per slot after.
* a cut shorter than the timeout: TCP retransmits, nothing is lost, nobody dies.

The actors' ``--learner-timeout`` (30 s) and the learner's ``--starvation-timeout``
(60 s) are well above the cuts, so neither side gives up. Skipped, with the reason,
without root, without iproute2, or where ``ip netns add`` is refused. Every
namespace (and every process in one) is removed at the end, even on failure.
Measured times print as ``FAULT-TIMING ...`` (``pytest -s``).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import free_port_block
from tests.netns import SLOW_ENV_ID, SLOW_STEP_S, Topology, unavailable
from tests.test_faults import (
    REGISTERED,
    RUN_S,
    START_S,
    Procs,
    actor_argv,
    assert_bye_accounting,
    check_accounting,
    learner_argv,
    metrics_rows,
    read_report,
    report_timing,
    wait_line,
    wait_until,
    wait_update,
)

HOSTS = ["l", "a1", "a2"]
FRAGMENT_LENGTH = 8
"""learner_argv's fragment_length: rows per fragment of each actor's one slot."""


def _topology(tag: str) -> Topology:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    try:
        return Topology(HOSTS, tag=f"{os.getpid()}{tag}").up()
    except RuntimeError as exc:
        pytest.skip(f"cannot build the test network: {exc}")


class Net:
    """The topology plus the processes on it; :meth:`close` removes both."""

    def __init__(self, tmp: Path, tag: str) -> None:
        self.topo = _topology(tag)
        self.procs = Procs(tmp)
        self.port = free_port_block(3)

    def start(self, host: str, name: str, argv: list[str]):
        return self.procs.start(name, argv, prefix=self.topo.prefix(host))

    def learner_address(self) -> str:
        return f"{self.topo.address('l')}:{self.port}"

    def close(self) -> None:
        try:
            self.procs.close()
        finally:
            self.topo.close()


def _run(tmp: Path, tag: str, body) -> dict[str, Any]:
    net = Net(tmp, tag)
    try:
        return body(net)
    finally:
        net.close()


# -- a. a cut longer than actor_timeout ----------------------------------------------

LONG_CUT_S = 6.0
LONG_CUT_ACTOR_TIMEOUT_S = 3.0


def _long_cut(net: Net, tmp: Path) -> dict[str, Any]:
    run_dir = tmp / "run"
    # SlowStub-v0 bounds the run's speed (50 steps/s per env), so that the budget
    # outlasts the cut and the re-registration on any CPU: ~5 updates before the cut,
    # room for 40 with a2 alone (>= 12.8 s; about 15 are used), then both again.
    learner = net.start(
        "l",
        "learner",
        learner_argv(
            net.port,
            run_dir,
            actors=2,
            budget_updates=1,
            total_env_steps=16 * (2 * 5 + 40 + 2 * 5),
            env=SLOW_ENV_ID,
            host=net.topo.address("l"),
            actor_timeout=LONG_CUT_ACTOR_TIMEOUT_S,
        ),
    )
    a1 = net.start("a1", "a1", actor_argv(net.learner_address(), env=SLOW_ENV_ID))
    a2 = net.start("a2", "a2", actor_argv(net.learner_address(), env=SLOW_ENV_ID))
    everyone = [learner, a1, a2]
    procs = net.procs
    wait_update(run_dir, 3, START_S, procs, everyone)
    a1_id = int(wait_line(a1, REGISTERED, 5, procs).group(1))
    learner_mark, a1_mark = len(learner.text()), len(a1.text())

    net.topo.cut("a1")
    cut_at = time.monotonic()
    dead = wait_line(
        learner,
        rf"actor {a1_id} .*declared dead",
        LONG_CUT_S,
        procs,
        start=learner_mark,
        must_live=everyone,
    )
    declared_at = time.monotonic()
    # The fault itself: the cable stays out for LONG_CUT_S in all.
    time.sleep(max(0.0, cut_at + LONG_CUT_S - time.monotonic()))
    net.topo.restore("a1")
    restored_at = time.monotonic()
    wait_line(a1, r"registering again", 30, procs, start=a1_mark, must_live=everyone)
    again = wait_line(a1, REGISTERED, 30, procs, start=a1_mark, must_live=everyone)
    reregistered_at = time.monotonic()
    wait_line(learner, rf"actor {a1_id} joins the rollout", RUN_S, procs, start=learner_mark)
    rejoined_at = time.monotonic()
    report_timing("netns cut -> declared dead (actor_timeout 3 s)", declared_at - cut_at)
    report_timing("netns restore -> actor registered again", reregistered_at - restored_at)
    report_timing("netns restore -> actor back in the rollout", rejoined_at - restored_at)
    codes = {p.name: p.wait(RUN_S) for p in everyone}
    return {
        "a1": a1,
        "a1_id": a1_id,
        "dead_line": dead.group(0),
        "again": again,
        "codes": codes,
        "logs": procs.logs(),
        "a1_log": a1.text()[a1_mark:],
        "report": read_report(run_dir),
    }


WASTE = (
    r"registering again \((\d+) steps per slot sent since the welcome"
    r"(?:; (\d+) steps sent since the link pause ([\d.]+)s ago)?\)"
)
"""The actor's log line when it registers again: what it had sent in the registration
that ended, and how much of it after it paused for the link."""


def cut_waste(run: dict[str, Any]) -> dict[str, Any]:
    """What the cut cost the returning actor (one env, so per slot): the steps it sent
    that the learner never accepted (``rejected``: its bye's ``steps_sent`` minus the
    steps received over all its registrations), and of them, those sent after it paused
    for the link (from its log and its ``steps_sent_in_link_pause``)."""
    report, a1_id = run["report"], run["a1_id"]
    lines = [report["actor_stats"][str(a1_id)]] + [
        line for line in report["departed_actors"] if line["actor_id"] == a1_id
    ]
    sent = report["actor_stats"][str(a1_id)]["actor/steps_sent"]
    waste = re.search(WASTE, run["a1_log"])
    counters = report["counters"]
    return {
        "sent": int(sent),
        "received": sum(line["steps_received"] for line in lines),
        "rejected": int(sent) - sum(line["steps_received"] for line in lines),
        "rejected_fragments": counters.get("rejected/experience/unknown_actor", 0)
        + counters.get("rejected/experience/old_seq", 0),
        "after_pause": int(waste.group(2)) if waste and waste.group(2) else None,
        "paused_for_s": float(waste.group(3)) if waste and waste.group(3) else None,
        "sent_in_link_pause": int(
            report["actor_stats"][str(a1_id)].get("actor/steps_sent_in_link_pause", 0)
        ),
        "link_pauses": int(report["actor_stats"][str(a1_id)].get("actor/link_pauses", 0)),
    }


@pytest.fixture(scope="module")
def long_cut(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("long_cut")
    yield _run(tmp, "a", lambda net: _long_cut(net, tmp))


@pytest.mark.timeout(240)
def test_cut_longer_than_actor_timeout_actor_dies_then_rejoins(long_cut):
    run = long_cut
    assert run["codes"] == {"learner": 0, "a1": 0, "a2": 0}, run["logs"]
    report = run["report"]
    a1, a1_id = run["a1"], run["a1_id"]
    assert report["stop_reason"] == "budget spent"
    dead = report["dead_actors"]
    assert [(d["actor_id"], d["pid"]) for d in dead] == [(a1_id, a1.pid)], dead
    assert report["counters"]["actors/declared_dead"] == 1
    # The same process, the same id, a later version; it trained again.
    assert int(run["again"].group(1)) == a1_id
    assert int(run["again"].group(3)) > 0
    summary = report["actor_stats"][str(a1_id)]
    assert summary["pid"] == a1.pid
    assert summary["said_bye"] and summary["steps_consumed"] > 0
    assert summary["actor/reregistrations"] == 1
    discarded = check_accounting(report)
    print(f"discarded steps by reason: {discarded}; counters: {report['counters']}")


@pytest.mark.timeout(240)
def test_cut_longer_than_actor_timeout_wastes_at_most_a_fragment_after_the_pause(long_cut):
    """The drill of docs/failure-model.md: a 6 s cut at actor_timeout 3. The actor
    paused for the link during the cut and registered again before sending anything
    new: of its steps, only the ones made before it paused (at most its valve's lead,
    max_lead_steps = 2 * 16, plus one fragment in flight) and at most one fragment per
    slot after the pause (its partial fragment, flushed when weights arrived) were
    rejected."""
    waste = cut_waste(long_cut)
    print(
        f"FAULT-WASTE 6 s cut, actor_timeout 3: {waste['rejected']} of {waste['sent']} steps "
        f"rejected ({100 * waste['rejected'] / max(1, waste['sent']):.1f} %; "
        f"{waste['rejected_fragments']} fragments), {waste['after_pause']} of them sent after "
        f"the link pause ({waste['paused_for_s']} s long); {waste}",
        flush=True,
    )
    assert waste["link_pauses"] >= 1, "the actor never paused for the link"
    assert waste["after_pause"] is not None, long_cut["a1_log"]
    assert waste["after_pause"] <= FRAGMENT_LENGTH, waste
    assert waste["sent_in_link_pause"] <= FRAGMENT_LENGTH, waste
    assert 0 <= waste["rejected"] <= 2 * 16 + FRAGMENT_LENGTH + FRAGMENT_LENGTH, waste


@pytest.mark.timeout(240)
def test_report_keeps_every_registration_of_an_actor(long_cut):
    report = long_cut["report"]
    lines = [*report["actor_stats"].values(), *report["departed_actors"]]
    assert any(line["left_because"] == "actor_dead" for line in report["departed_actors"])
    assert sum(s["steps_received"] for s in lines) == report["counters"]["received/steps"]


# -- b. a cut shorter than actor_timeout ---------------------------------------------

SHORT_CUT_S = 1.0


def _short_cut(net: Net, tmp: Path) -> dict[str, Any]:
    run_dir = tmp / "run"
    learner = net.start(
        "l",
        "learner",
        learner_argv(
            net.port,
            run_dir,
            actors=2,
            budget_updates=100,
            host=net.topo.address("l"),
            actor_timeout=8,
            # Every slot's rollout: the learner waits for the cut actor's rows (what
            # the stall below checks); rows batches train on with the other actor.
            batch_mode="slots",
        ),
    )
    actors = [net.start(h, h, actor_argv(net.learner_address())) for h in ("a1", "a2")]
    everyone = [learner, *actors]
    procs = net.procs
    wait_update(run_dir, 3, START_S, procs, everyone)
    net.topo.cut("a1")
    # The fault itself: the cable is out for SHORT_CUT_S.
    time.sleep(SHORT_CUT_S)
    rows_at_restore = len(metrics_rows(run_dir))
    net.topo.restore("a1")
    restored_at = time.monotonic()
    wait_until(
        lambda: len(metrics_rows(run_dir)) > rows_at_restore + 1,
        RUN_S,
        "updates after the restore",
        procs,
        everyone,
    )
    report_timing("netns 1 s cut: restore -> updates again", time.monotonic() - restored_at)
    codes = {p.name: p.wait(RUN_S) for p in everyone}
    rows = metrics_rows(run_dir)
    stall = max(b["wall_seconds"] - a["wall_seconds"] for a, b in zip(rows, rows[1:], strict=False))
    report_timing("netns 1 s cut: longest gap between updates", stall)
    return {"codes": codes, "logs": procs.logs(), "report": read_report(run_dir), "stall": stall}


@pytest.mark.timeout(240)
def test_cut_shorter_than_actor_timeout_loses_nothing(tmp_path):
    run = _run(tmp_path, "b", lambda net: _short_cut(net, tmp_path))
    assert run["codes"] == {"learner": 0, "a1": 0, "a2": 0}, run["logs"]
    report = run["report"]
    counters = report["counters"]
    assert report["dead_actors"] == []
    assert "actors/declared_dead" not in counters
    assert counters.get("experience/seq_gaps", 0) == 0
    assert not [k for k in counters if k.startswith("rejected/")], counters
    assert len(report["actor_stats"]) == 2
    for summary in report["actor_stats"].values():
        assert_bye_accounting(summary)
        assert "actor/reregistrations" not in summary
    assert set(check_accounting(report)) <= {"run_ended"}
    assert run["stall"] >= SHORT_CUT_S * 0.9  # the learner did wait for a1's rows


def test_slow_env_bounds_the_speed():
    """The premise of test a: SlowStub-v0 cannot step faster than 1 / SLOW_STEP_S."""
    import gymnasium as gym

    import tests.netns  # noqa: F401  (registers the env)

    env = gym.make(SLOW_ENV_ID)
    env.reset()
    start = time.monotonic()
    for _ in range(5):
        env.step(0)
    assert time.monotonic() - start >= 5 * SLOW_STEP_S
