"""Rows and hellos that break docs/protocol.md in a masked or multi-agent run are refused
and counted, and the counters' ledger stays exact (issue 44 section 3; issue 45 N5-N9,
G8, E7). Real ZeroMQ over tcp to a real learner running in a thread; the peers are raw
sockets that register properly and then send what a test makes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch
import zmq

from tests.helpers import (
    TIMEOUT,
    CheckedBackground,
    RegisteredPeer,
    raw_socket,
    recv_message,
    stub_hello,
    stub_learner_config,
    total,
    wait_until,
)
from tests.ports import free_port_block
from zmq_rl.config import PPOConfig
from zmq_rl.conformance.vectors import pack, synthetic_fragment
from zmq_rl.envs import env_shape
from zmq_rl.learner.loop import Learner
from zmq_rl.wire.codec import PROTOCOL_VERSION
from zmq_rl.wire.protocol import Fragment, Heartbeat, Hello, Refuse, encode
from zmq_rl.wire.spaces import space_spec

torch.set_num_threads(1)

MASKED_ENV = "tests.space_envs:MaskedBandit-v0"
AGENTS_ENV = "tests.agent_envs:coming_and_going"


def hello_for(env_id: str, num_envs: int, **changes: Any) -> Hello:
    """A hello with the spaces of ``env_id`` (its shared agent's, for a multi-agent env)."""
    shape = env_shape(env_id)
    return stub_hello(
        env_id=env_id,
        observation_space=space_spec(shape.observation_space),
        action_space=space_spec(shape.action_space),
        num_envs=num_envs,
        **changes,
    )


def rows_of(peer: RegisteredPeer, env_id: str, seed: int, width: int, **changes: Any) -> Fragment:
    """A valid fragment of 8 rows of ``width`` slots of ``env_id``'s spaces (each row's
    mask allowing its action), numbered with the peer's next seq."""
    shape = env_shape(env_id)
    fragment = synthetic_fragment(
        shape.observation_space,
        shape.action_space,
        seed=seed,
        length=8,
        width=width,
        truncated_cells=(),
        actor_id=peer.actor_id,
        version=0,
        seq=peer.seq,
        run_id=peer.run_id,
        token=peer.token,
    )
    return dataclasses.replace(fragment, **changes)


def ledger(counters: dict[str, int]) -> tuple[int, int]:
    """(received/steps, consumed/steps + every discarded/steps/<why>)."""
    return counters.get("received/steps", 0), counters.get("consumed/steps", 0) + total(
        counters, "discarded/steps/"
    )


def stream_until_shutdown(peer: RegisteredPeer, learner: Learner, run: Any, make: Any) -> Any:
    """Send ``make()`` fragments of 8 rows within the staleness valve's budget (section
    5.4) until the run ends; its report."""
    cfg = learner.cfg
    while run.alive():
        peer.serve_control()
        budget = learner.version * cfg.steps_per_broadcast() + cfg.effective_max_lead_steps()
        if 8 * (peer.seq + 1) <= budget and not peer.said_bye:
            peer.send(make())
            peer.seq += 1
        zmq.Poller().poll(20)  # (bounded by the run: it ends at its budget)
    return run.join()


def test_rows_that_break_their_own_action_mask_are_refused_and_counted(ctx, start_learner):
    """Issue 44 section 3, issue 45 N6: a 2-slot peer's well-formed fragment with a row
    whose action its own mask forbids, and one with a row whose mask allows nothing, are
    rejected whole as ``masked_action`` (section 7.2) and never trained on: the
    update's KL is finite and the ledger exact."""
    cfg = stub_learner_config(
        free_port_block(), env_id=MASKED_ENV, num_envs=2, total_env_steps=8 * 2 * 2
    )
    learner, run = start_learner(cfg)
    peer = RegisteredPeer(ctx, cfg.port, hello_for(MASKED_ENV, 2))
    forbidden = rows_of(peer, MASKED_ENV, seed=1, width=2)
    forbidden.obs["action_mask"][3, 1] = 1
    forbidden.obs["action_mask"][3, 1, int(forbidden.actions[3, 1])] = 0
    peer.send(forbidden)
    nothing = rows_of(peer, MASKED_ENV, seed=2, width=2)
    nothing.obs["action_mask"][5, 0] = 0
    peer.send(nothing)
    wait_until(
        lambda: learner.counters["rejected/experience/masked_action"] == 2, TIMEOUT, "the rejects"
    )

    def good() -> Fragment:
        return rows_of(peer, MASKED_ENV, seed=10 + peer.seq, width=2)

    report = stream_until_shutdown(peer, learner, run, good)  # (a reject took no seq)
    counters = report.counters
    assert counters["rejected/experience/masked_action"] == 2, counters
    assert "experience/seq_gaps" not in counters
    assert np.isfinite(report.final_stats["losses/approx_kl"]), report.final_stats
    received, accounted = ledger(counters)
    assert received == accounted > 0, counters
    peer.close()


def test_rows_marked_not_valid_in_a_single_agent_run_are_refused(ctx, start_learner):
    """Issue 45 N9: a learner whose welcome has no agents_per_env rejects a fragment that
    marks rows not valid (``bad_valid``) instead of leaving them out of training."""
    cfg = stub_learner_config(free_port_block())
    learner, run = start_learner(cfg)
    peer = RegisteredPeer(ctx, cfg.port)
    fragment = peer.fragment(8)
    fragment.terminated[:] = False
    fragment.terminated[3, 0] = True
    fragment.rewards[4:] = 0.0
    fragment.valid = np.ones((8, 1), bool)
    fragment.valid[4:] = False
    peer.send(fragment)
    wait_until(lambda: learner.counters["rejected/experience/bad_valid"] == 1, TIMEOUT, "a reject")
    assert learner.counters["received/steps"] == 0
    learner.request_stop("test over")
    run.join()
    peer.close()


def test_not_valid_rows_are_discarded_so_the_ledger_adds_up(ctx, start_learner):
    """Issue 44 section 3, issue 45 N7: rows of a slot without a live agent are received
    (``received/steps`` counts every row) but never trained on: counted
    ``discarded/steps/not_valid`` when their rollout is taken, so ``received/steps ==
    consumed/steps + discarded/steps/*``, and ``consumed/steps`` counts env steps only."""
    cfg = stub_learner_config(free_port_block(), env_id=AGENTS_ENV, total_env_steps=8 * 3 * 2)
    learner, run = start_learner(cfg)
    peer = RegisteredPeer(ctx, cfg.port, hello_for(AGENTS_ENV, 4))

    def agent_3_never_came() -> Fragment:
        fragment = rows_of(peer, AGENTS_ENV, seed=peer.seq, width=4)
        fragment.rewards[:, 3] = 0.0
        fragment.valid = np.ones((8, 4), bool)
        fragment.valid[:, 3] = False
        return fragment

    report = stream_until_shutdown(peer, learner, run, agent_3_never_came)
    counters = report.counters
    received, accounted = ledger(counters)
    assert received == accounted, counters
    rows = report.actor_stats["0"]["steps_consumed"]  # rows of every slot
    # Slot 3's rows, wherever the batches cut the fragments (rows batches take the
    # oldest rows, not always every slot's alike).
    assert 0 < counters["discarded/steps/not_valid"] == rows - counters["consumed/steps"]
    assert counters["consumed/steps"] == report.env_steps_consumed
    peer.close()


@pytest.mark.parametrize(
    ("env_id", "changes", "why"),
    [
        (AGENTS_ENV, {"num_envs": 3}, "not a multiple of this run's agents_per_env 4"),
        ("", {"features": "policies"}, "hello.features: expected a list"),
    ],
    ids=["num_envs-not-a-multiple", "features-a-string"],
)
def test_hellos_the_spec_forbids_are_refused_bad_hello(ctx, start_learner, env_id, changes, why):
    """Issue 44 section 3, issue 45 N5: a hello whose num_envs is not a whole number of
    env copies, or whose features is a str, is answered ``refuse bad_hello`` naming why
    (section 4.3); a hello of a whole number is welcomed."""
    cfg = stub_learner_config(free_port_block(), **({"env_id": env_id} if env_id else {}))
    learner, run = start_learner(cfg)
    dealer = raw_socket(ctx, zmq.DEALER, f"tcp://127.0.0.1:{cfg.port}")
    hello = hello_for(env_id, 4) if env_id else stub_hello()
    body = {**hello.to_map(), **changes, "proto": PROTOCOL_VERSION, "type": "hello"}
    dealer.send(pack(body))
    refusal = recv_message(dealer, TIMEOUT)
    assert isinstance(refusal, Refuse) and refusal.code == "bad_hello", refusal
    assert why in refusal.reason, refusal.reason
    dealer.send(encode(hello))
    assert recv_message(dealer, TIMEOUT).TYPE == "welcome"
    learner.request_stop("test over")
    run.join()
    dealer.close()


def test_a_heartbeat_of_an_earlier_run_is_answered_and_not_a_reject(ctx, start_learner):
    """Issue 45 G8: heartbeats an actor queued while its learner was down reach the
    learner restarted on the same ports; they are answered ``refuse reregister`` (the
    actor registers again) and counted ``control/other_run``, not as rejects, so a
    conforming actor shows no reject across a restart. One of this run with a wrong
    token still is one (``unknown_actor``)."""
    cfg = stub_learner_config(free_port_block())
    learner, run = start_learner(cfg)
    dealer = raw_socket(ctx, zmq.DEALER, f"tcp://127.0.0.1:{cfg.port}")
    for run_id in ("0123456789ab", learner.run_id):
        dealer.send(encode(Heartbeat(actor_id=0, token=bytes(16), run_id=run_id, version=3)))
        answer = recv_message(dealer, TIMEOUT)
        assert isinstance(answer, Refuse) and answer.code == "reregister", answer
    counters = dict(learner.counters)
    learner.request_stop("test over")
    run.join()
    dealer.close()
    assert counters == {"control/other_run": 1, "rejected/control/unknown_actor": 1}, counters


def test_a_resumed_run_starts_every_registration_as_a_new_stream(ctx, tmp_path):
    """Issue 45 E7: after ``--resume`` an actor that continued its running episodes
    registers again with its id; its slots' rows are a new stream (section 5.6). The
    checkpoint's unfinished episode return of that slot (and its reward-scaling return,
    which scales training rows) must not be added to the new registration's first
    episode: the return recorded is the new rows' alone."""
    first = stub_learner_config(free_port_block(), run_dir=str(tmp_path), normalize_reward=True)
    learner = Learner(first, PPOConfig(num_epochs=1), context=ctx)
    try:  # a slot in the middle of an episode when the checkpoint was taken
        learner.trainer.running_return[(0, 0)] = 300.0
        learner.trainer.reward_scaler.returns[(0, 0)] = 50.0
        learner.checkpoint()
    finally:
        learner.close()
    resumed = Learner.resume(tmp_path, context=ctx, port=free_port_block(), total_env_steps=8)
    try:
        assert not resumed.trainer.running_return and not resumed.trainer.reward_scaler.returns
        run = CheckedBackground(resumed.run)
        peer = RegisteredPeer(ctx, resumed.cfg.port, stub_hello(actor_id=0, rejoin_run_id="x"))
        assert peer.actor_id == 0
        rows = peer.fragment(8)  # steps 0..7 of the stub: an episode ends at row 4
        peer.send(rows)
        while run.alive():
            peer.serve_control()
            zmq.Poller().poll(20)
        report = run.join()
        assert report.episode_rewards == [5.0], report.episode_rewards
        peer.close()
    finally:
        resumed.close()
