"""Rows and hellos that break docs/protocol.md, sent to the real ``zmq-learner``
process (issue 44 section 3: "real processes for items 1-4").

tests/test_refused_rows.py checks each refusal against a learner running in a thread
of the test. Here the console script runs as its own process on 127.0.0.1, on a
masked multi-agent env (``tests.agent_envs:coming_and_going`` with ``mask=True``:
four agents per env copy, a ``Dict`` observation holding an ``action_mask``), and a
hostile, unauthenticated peer of the test (raw ZeroMQ sockets) sends

* a hello whose ``features`` is the string ``"policies"``: ``refuse bad_hello`` naming
  the field (section 4.3), counted ``rejected/control/bad_field``;
* a hello whose ``num_envs`` (3) is not a multiple of the run's ``agents_per_env``
  (4): ``refuse bad_hello`` naming both, counted ``refused/bad_hello``;
* then, registered properly (4 slots), two well-formed fragments whose valid rows
  break their own mask: one row took an action its mask forbids, one row's mask
  allows nothing. Both are rejected whole, ``rejected/experience/masked_action``
  (section 7.2), and never reach training.

A real ``zmq-actor`` then spends the run's budget. The learner must end with "budget
spent" and exit 0, its ``report.json`` count exactly these refusals and nothing of the
hostile peer's as received, its ledger add up (``received/steps == consumed/steps +
discarded/steps/*``), and every update in ``metrics.jsonl`` have finite losses and run
all its epochs under ``--target-kl 0.05`` (the issue: forbidden rows made
``approx_kl`` infinite and stopped each update's epochs early).

The hostile peer stays registered for the whole run (heartbeating, and answering the
shutdown with a bye), so a learner that queued its rows would train on them. Only the
first reject of each reason is logged: the fragments go out on one PUSH socket, so a
marker fragment of another run sent after them (``other_run``, logged) tells the test
that the learner has read the masked ones. Every wait is bounded and on an
observable event; the processes are killed if the test fails.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

from tests.helpers import RegisteredPeer, pack, raw_socket, recv_message, stub_hello
from tests.test_faults import (
    RUN_S,
    START_S,
    Procs,
    actor_argv,
    check_accounting,
    learner_argv,
    metrics_rows,
    read_report,
    wait_line,
    wait_until,
)
from zmq_rl.conformance.vectors import synthetic_fragment
from zmq_rl.envs import env_shape
from zmq_rl.wire.codec import PROTOCOL_VERSION
from zmq_rl.wire.protocol import Fragment, Heartbeat, Hello, Refuse, encode
from zmq_rl.wire.spaces import space_spec

ENV_ID = "tests.agent_envs:coming_and_going"
ENV_KWARGS = {"mask": True}
AGENTS_PER_ENV = 4
BUDGET = 600
"""Agent steps of the run (about 17 updates of the real actor's rows)."""
EPOCHS = 2
ANSWER_S = 30.0
"""Bound on the learner's answer to one hello."""
BEAT_S = 0.5
"""The hostile peer's heartbeat period (the learner's silence limits are seconds)."""
OTHER_RUN = "0123456789ab"


class HostilePeer(RegisteredPeer):
    """A registered raw peer that also heartbeats (so it stays a member however long
    the run takes) and answers the shutdown with a bye."""

    def __init__(self, ctx: zmq.Context, port: int) -> None:
        shape = env_shape(ENV_ID, ENV_KWARGS)
        self.spaces = shape.observation_space, shape.action_space
        super().__init__(ctx, port, hello_of(num_envs=AGENTS_PER_ENV))
        self.beat_at = 0.0

    def rows(self, seed: int, **changes: Any) -> Fragment:
        """A valid fragment of 8 rows of all 4 slots (each row's mask allows its
        action), numbered with the next seq."""
        fragment = synthetic_fragment(
            *self.spaces,
            seed=seed,
            length=8,
            width=AGENTS_PER_ENV,
            truncated_cells=(),
            actor_id=self.actor_id,
            version=0,
            seq=self.seq,
            run_id=self.run_id,
            token=self.token,
        )
        return dataclasses.replace(fragment, **changes)

    def tick(self) -> None:
        """Answer the learner's control messages; heartbeat every ``BEAT_S`` until the bye."""
        self.serve_control()
        if not self.said_bye and time.monotonic() - self.beat_at >= BEAT_S:
            beat = Heartbeat(
                actor_id=self.actor_id, token=self.token, run_id=self.run_id, version=0
            )
            self.dealer.send(encode(beat))
            self.beat_at = time.monotonic()


def hello_of(**changes: Any) -> Hello:
    """A hello with the masked env's spaces (its agents'), as a 4-slot actor sends it."""
    shape = env_shape(ENV_ID, ENV_KWARGS)
    return stub_hello(
        env_id=ENV_ID,
        observation_space=space_spec(shape.observation_space),
        action_space=space_spec(shape.action_space),
        **{"num_envs": AGENTS_PER_ENV, **changes},
    )


def refusal_of(dealer: zmq.Socket, changes: dict[str, Any]) -> Refuse:
    """Send a hello with ``changes`` (raw values, whatever their type) and return the answer."""
    dealer.send(
        pack({**hello_of().to_map(), **changes, "proto": PROTOCOL_VERSION, "type": "hello"})
    )
    answer = recv_message(dealer, ANSWER_S)
    assert isinstance(answer, Refuse), f"hello with {changes} answered {answer.TYPE}, not refuse"
    return answer


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    """The processes of the test; every one is killed and reaped at the end."""
    registry = Procs(tmp_path)
    try:
        yield registry
    finally:
        registry.close()


@pytest.mark.timeout(180)
def test_the_real_learner_refuses_and_counts_rows_and_hellos_that_break_the_spec(
    procs, tmp_path, ctx, learner_port
):
    """See the module docstring: (c) and (b) answered ``refuse bad_hello``, (a) rejected
    ``masked_action``; a real actor then spends the budget and the report, the ledger
    and every update's losses show none of it was trained on."""
    run_dir = tmp_path / "run"
    learner = procs.start(
        "learner",
        learner_argv(
            learner_port, run_dir, actors=1, budget_updates=1,
            env=ENV_ID, env_kwargs=json.dumps(ENV_KWARGS), total_env_steps=BUDGET,
            num_epochs=EPOCHS, target_kl=0.05,
        ),
    )  # fmt: skip
    wait_line(learner, r"learner listening on tcp://", START_S, procs)

    # (c) features a str, (b) num_envs not a whole number of env copies.
    dealer = raw_socket(ctx, zmq.DEALER, f"tcp://127.0.0.1:{learner_port}")
    refused = refusal_of(dealer, {"features": "policies"})
    assert refused.code == "bad_hello" and "hello.features: expected a list" in refused.reason
    refused = refusal_of(dealer, {"num_envs": 3})
    assert refused.code == "bad_hello", refused
    assert f"not a multiple of this run's agents_per_env {AGENTS_PER_ENV}" in refused.reason
    dealer.close()

    # (a) registered properly, then rows that break their own action_mask.
    peer = HostilePeer(ctx, learner_port)
    try:
        forbidden = peer.rows(seed=1)
        mask = forbidden.obs["action_mask"]
        mask[3, 1] = 1
        mask[3, 1, int(forbidden.actions[3, 1])] = 0  # the others still allowed
        nothing = peer.rows(seed=2)
        nothing.obs["action_mask"][5, 0] = 0
        marker = peer.rows(seed=3, run_id=OTHER_RUN)  # read after the two above
        for fragment in (forbidden, nothing, marker):
            peer.send(fragment)
        for reason in ("masked_action", "other_run"):
            wait_until(
                lambda reason=reason: peer.tick() or learner.find(
                    rf"rejected experience message #1 \({reason}\)"
                ),
                ANSWER_S, f"the {reason} reject in the learner's log", procs, [learner],
            )  # fmt: skip

        # A real actor spends the budget while the hostile peer stays a member.
        actor = procs.start("actor", actor_argv(f"127.0.0.1:{learner_port}", env=""))
        wait_until(  # (an actor that fails ends the wait: its rc is checked below)
            lambda: peer.tick() or not learner.alive() or actor.popen.poll() not in (None, 0),
            START_S + RUN_S, "the run's end", procs,
        )  # fmt: skip
        assert actor.wait(30) == 0, actor.tail()
        assert learner.wait(30) == 0, procs.logs()
        assert peer.said_bye, "the learner never asked the hostile peer to shut down"
    finally:
        peer.close()

    report = read_report(run_dir)
    assert report["stop_reason"] == "budget spent", report["stop_reason"]
    assert report["env_steps_consumed"] == BUDGET
    counters = report["counters"]
    refusals = {k: v for k, v in counters.items() if k.startswith(("rejected/", "refused/"))}
    assert refusals == {
        "rejected/control/bad_field": 1,  # (c)
        "refused/bad_hello": 1,  # (b)
        "rejected/experience/masked_action": 2,  # (a)
        "rejected/experience/other_run": 1,  # the marker
    }, counters
    assert counters["registered"] == 2, counters
    assert not report["dead_actors"] and "actors/dropped_silent" not in counters, report
    assert "experience/seq_gaps" not in counters, counters  # a reject takes no seq
    hostile = report["actor_stats"][str(peer.actor_id)]
    assert hostile["steps_received"] == 0 == hostile["fragments_received"], hostile
    discarded = check_accounting(report)  # received == consumed + discarded/steps/*
    assert discarded.get("not_valid", 0) > 0, counters  # rows of slots without an agent

    rows = metrics_rows(run_dir)
    assert rows and rows[-1]["env_steps"] == BUDGET, rows[-1:]
    for row in rows:
        losses = {k: v for k, v in row.items() if k.startswith("losses/")}
        assert all(math.isfinite(v) for v in losses.values()), row
        assert row["losses/epochs_run"] == EPOCHS, row  # target_kl never tripped
    assert np.isfinite(report["final_stats"]["losses/approx_kl"]), report["final_stats"]
