"""Hostile peers on the learner's PULL (experience): oversized frames, registered peers
that break the rules, and floods.

* A frame over ``max_message_bytes`` costs its sender the connection.
* A registered peer that ignores the staleness valve is capped (``over_lead``); one
  that sends huge finite values cannot poison the policy.
* Floods (a learner in its own process, ``bench/flood.py`` in another): a junk flood
  keeps the learner's RSS bounded, every frame is counted and the good actors keep a
  fair share of throughput; a stalled learner buffers bounded memory.

The experience fuzz (malformed fragments of every class, during training) is in
``test_hostile_learner_fuzz.py``. Figures are printed; run with ``-s`` to see them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import zmq
import zmq.utils.monitor

from tests.helpers import (
    TIMEOUT,
    RegisteredPeer,
    gym_actor,
    raw_socket,
    stub_hello,
    stub_learner_config,
    total,
    wait_until,
)
from tests.ports import free_port_block
from zmq_rl.wire.protocol import FEATURE_GRANTS

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parent.parent


def test_oversized_frame_costs_the_sender_its_connection(ctx, learner_port, start_learner):
    """A frame over ``max_message_bytes`` (ZMQ_MAXMSGSIZE) never reaches the learner's
    code: libzmq drops the sender's connection as soon as the frame header announces the
    size (the sender's monitor sees the disconnect), so it is not counted anywhere. The
    learner keeps serving other peers (a later garbage frame is counted)."""
    cfg = stub_learner_config(learner_port, max_message_bytes=64 * 1024)
    learner, run = start_learner(cfg)
    big = raw_socket(ctx, zmq.PUSH, f"tcp://127.0.0.1:{cfg.experience_port()}")
    monitor = big.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
    big.send(b"\x00" * (cfg.max_message_bytes + 1))
    events = []
    deadline = time.monotonic() + 10.0
    while zmq.EVENT_DISCONNECTED not in events:
        assert time.monotonic() < deadline, f"no disconnect, only {events}"
        if monitor.poll(100):
            events.append(zmq.utils.monitor.recv_monitor_message(monitor)["event"])
    small = raw_socket(ctx, zmq.PUSH, f"tcp://127.0.0.1:{cfg.experience_port()}")
    small.send(b"\xc1")
    wait_until(lambda: total(learner.counters, "rejected/") >= 1, 10.0, "the small frame")
    counters = dict(learner.counters)
    assert run.alive()
    learner.request_stop("test over")
    run.join()
    big.disable_monitor()
    for sock in (monitor, big, small):
        sock.close()
    assert counters == {"rejected/experience/not_msgpack": 1}, counters


@pytest.mark.parametrize("batch_mode", ["slots", "rows"])
def test_registered_peer_ignoring_the_staleness_valve_is_capped(
    ctx, learner_port, start_learner, batch_mode
):
    """A registered peer that sends far beyond its valve (bursts of 80 rows per update)
    gets ``rejected/experience/over_lead``: with every slot's rollout the rows queued for
    its slot never exceed the cap of 28 rows; with rows batches (it announces grants)
    the rows it got accepted never exceed the grant the learner sent it. Every fragment
    it sent is either received or rejected (none lost, none counted twice), and the good
    actor next to it trains through the budget losing nothing."""
    cfg = stub_learner_config(
        learner_port,
        num_actors=2,
        fragment_length=4,
        total_env_steps=8 * 2 * 15,
        batch_mode=batch_mode,
    )
    cap = cfg.effective_max_lead_steps() + cfg.steps_per_broadcast() + cfg.fragment_length
    learner, run = start_learner(cfg)
    good = gym_actor(ctx, learner_port)
    hello = stub_hello(features=[FEATURE_GRANTS]) if batch_mode == "rows" else None
    peer = RegisteredPeer(ctx, learner_port, hello)
    sent = confirmed = max_queued = 0

    def accounted() -> bool:
        rec = learner.members.get(peer.actor_id)
        received = rec.fragments_received if rec else 0
        return received + learner.counters["rejected/experience/over_lead"] >= sent

    while run.alive():
        for _ in range(20):
            peer.send(peer.fragment(4))
            sent += 1
        wait_until(lambda: accounted() or not run.alive(), TIMEOUT, "the burst counted")
        if accounted():
            confirmed = sent  # (a burst sent as the run ends may never be read)
        rec = learner.members.get(peer.actor_id)
        held = (
            learner.queues.received((peer.actor_id, 0)) - (rec.grant if rec else 0)
            if batch_mode == "rows"
            else learner.queues.rows((peer.actor_id, 0)) - cap
        )
        max_queued = max(max_queued, held)  # rows past the cap: never above 0
        updates = learner.report.updates_completed
        wait_until(
            lambda n=updates: (
                learner.report.updates_completed > n or not run.alive() or peer.dealer.poll(0)
            ),
            TIMEOUT,
            "the next update",
        )
        peer.serve_control()
    report = run.join()
    stats = good.join()
    peer.close()
    counters = report.counters
    summary = report.actor_stats[str(peer.actor_id)]
    print(
        f"\nover_lead: sent {sent} fragments ({sent * 4} rows); received "
        f"{summary['fragments_received']}, rejected over_lead "
        f"{counters['rejected/experience/over_lead']}; most rows past the cap {max_queued}"
    )
    assert report.stop_reason == "budget spent"
    assert counters["rejected/experience/over_lead"] > sent // 2
    counted = summary["fragments_received"] + counters["rejected/experience/over_lead"]
    # Nothing the learner read was lost or counted twice; at most the last burst, sent
    # while the learner was finishing, went unread.
    assert sent - 20 <= confirmed <= counted <= sent
    assert max_queued <= 0
    good_summary = next(s for a, s in report.actor_stats.items() if a != str(peer.actor_id))
    assert good_summary["steps_received"] == good_summary["actor/steps_sent"] == stats["steps_sent"]


@pytest.mark.parametrize("field", ["rewards", "values"])
def test_registered_peer_cannot_poison_the_policy_with_huge_finite_values(
    ctx, learner_port, field, start_learner
):
    """The only actor of a run is a registered peer that follows the valve but whose
    ``field`` holds 3e38: such fragments are rejected (``out_of_range``), the learner
    keeps running, and its policy stays finite. (A minibatch that still turns out
    non-finite is skipped by PPOTrainer: tests/test_ppo.py.)"""
    cfg = stub_learner_config(learner_port)
    learner, run = start_learner(cfg)
    peer = RegisteredPeer(ctx, learner_port)
    for _ in range(3):
        fragment = peer.fragment(8)
        peer.send(dataclasses.replace(fragment, **{field: np.full((8, 1), 3e38, np.float32)}))
    wait_until(
        lambda: learner.counters["rejected/experience/out_of_range"] >= 3,
        TIMEOUT,
        "the poisoned fragments to be rejected",
    )
    assert run.alive()
    learner.request_stop("test over")
    peer.serve_control()
    report = run.join()
    peer.close()
    assert report.counters["rejected/experience/out_of_range"] == 3
    assert report.env_steps_consumed == 0
    assert all(torch.isfinite(p).all() for p in learner.policy.parameters())


def test_a_forged_fragment_can_neither_stall_the_run_nor_evict_a_live_actor(
    ctx, learner_port, start_learner
):
    """Issue 19, finding 4, under protocol v2: a fragment as the live actor with a
    guessed session token and ``seq`` 10^9 is ``unknown_actor``; one with the real token
    (the worst case: a leaked token) but ``seq`` 10^9 is ``seq_jump``. Neither moves the
    actor's expected ``seq`` or counts gaps: its own next fragments are accepted, the
    run consumes its budget, and nobody is declared dead."""
    cfg = stub_learner_config(learner_port, total_env_steps=32)
    learner, run = start_learner(cfg)
    peer = RegisteredPeer(ctx, learner_port)
    real = peer.fragment(8)
    forged = [
        dataclasses.replace(real, seq=10**9, token=bytes(16)),
        dataclasses.replace(real, seq=10**9),
    ]
    for fragment in forged:
        peer.send(fragment)
    wait_until(
        lambda: total(learner.counters, "rejected/experience/") >= 2,
        TIMEOUT,
        "the forged fragments to be rejected",
    )
    peer.send(real)  # seq 0: still what the learner expects
    for sent in range(1, 4):
        # within the staleness valve (3 fragments of lead), as a real actor would be
        wait_until(lambda: learner.version >= sent, TIMEOUT, f"update {sent}")  # noqa: B023
        peer.send(peer.fragment(8))
    wait_until(lambda: not run.alive(), TIMEOUT, "the run to consume its budget")
    peer.serve_control()
    report = run.join()
    peer.close()
    counters = report.counters
    assert counters["rejected/experience/unknown_actor"] == 1
    assert counters["rejected/experience/seq_jump"] == 1
    assert counters.get("experience/seq_gaps", 0) == 0
    assert counters.get("rejected/experience/old_seq", 0) == 0
    assert counters.get("actors/declared_dead", 0) == 0
    assert report.env_steps_consumed == 32 and report.stop_reason == "budget spent"


# ----------------------------------------------------------------------------- floods

FLOOD_LEARNER = textwrap.dedent(
    """
    import json, signal, sys, time
    from zmq_rl.config import LearnerConfig, PolicyConfig, PPOConfig
    from zmq_rl.learner.loop import Learner

    port, progress_path = int(sys.argv[1]), sys.argv[2]
    cfg = LearnerConfig(
        env_id="CartPole-v1", port=port, num_actors=2, num_envs=4, num_steps=32,
        total_env_steps=50_000_000, fragment_length=16, eval_episodes=1, seed=0,
        starvation_timeout=60.0, checkpoint_every=0,
    )
    progress = open(progress_path, "a")

    def on_update(row):
        counters = learner.counters
        rejected = sum(v for k, v in counters.items() if k.startswith("rejected/"))
        line = {"t": time.monotonic(), "steps": row["env_steps"], "rejected": rejected}
        progress.write(json.dumps(line) + "\\n")
        progress.flush()

    learner = Learner(cfg, PPOConfig(num_epochs=10), PolicyConfig(), on_update=on_update)
    signal.signal(signal.SIGTERM, lambda *_: learner.request_stop("SIGTERM from the test"))
    try:
        report = learner.run()
    finally:
        learner.close()
    out = {"counters": report.counters, "actor_stats": report.actor_stats,
           "stop_reason": report.stop_reason}
    print("REPORT " + json.dumps(out), flush=True)
    """
)
FLOOD_BASELINE_S = 4.0
FLOOD_S = 8.0
FLOOD_RSS_BOUND = 200e6
"""Learner RSS may grow by less than this while a peer floods PULL with junk fragments.
Measured: +4.6 MB (335 -> 340 MB) over an 8 s flood of ~88,000 1.7 KB frames."""
FLOOD_THROUGHPUT_FRACTION = 0.3
"""Good actors must keep >= this fraction of their steps/s during a flood. Measured: 0.03
(13,400 -> 430 steps/s) with a learner whose PULL drain was unbounded; 0.81 with the drain
bounded to ~5 ms per poll."""


def child_env() -> dict[str, str]:
    """The environment of a child process: this checkout importable, one OpenMP thread."""
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def tagged_json(text: str, tag: str) -> dict[str, Any]:
    lines = [line for line in text.splitlines() if line.startswith(tag + " ")]
    assert len(lines) == 1, f"expected one {tag} line in:\n{text[-3000:]}"
    return json.loads(lines[0][len(tag) + 1 :])


def read_progress(path: Path) -> list[dict[str, float]]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.endswith("}")]


def steps_per_second(progress: list[dict[str, float]], start: float, end: float) -> float:
    """Consumed env steps per second between the first and last update in [start, end]."""
    inside = [p for p in progress if start <= p["t"] <= end]
    assert len(inside) >= 2, f"fewer than two updates in a {end - start:.1f}s window"
    first, last = inside[0], inside[-1]
    return (last["steps"] - first["steps"]) / (last["t"] - first["t"])


def rss(pid: int) -> int:
    """Resident set size of a process in bytes (psutil, else /proc)."""
    try:
        import psutil  # noqa: PLC0415 - optional
    except ImportError:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise
    return psutil.Process(pid).memory_info().rss


def sample_rss_until(pid: int, done: Callable[[], bool], timeout: float) -> int:
    """The largest RSS of ``pid`` seen (every 50 ms) until ``done()``; bounded."""
    peak = rss(pid)
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"still running after {timeout}s"
        peak = max(peak, rss(pid))
        time.sleep(0.05)  # the sampling period of a measurement, not a synchronisation
    return max(peak, rss(pid))


def sample_rss_for(pid: int, seconds: float) -> int:
    end = time.monotonic() + seconds
    return sample_rss_until(pid, lambda: time.monotonic() >= end, seconds + 5.0)


def run_flood(flood_args: list[str], timeout: float) -> tuple[subprocess.Popen, Callable]:
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "bench" / "flood.py"), *flood_args],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )

    def result() -> dict[str, Any]:
        out, _ = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, out
        return tagged_json(out, "FLOOD")

    return proc, result


@pytest.fixture(scope="module")
def junk_flood(tmp_path_factory) -> dict[str, Any]:
    """One run, measured: a learner process training CartPole-v1 with two GymActor
    threads (this process); a FLOOD_BASELINE_S window without flood, then bench/flood.py
    (its own process) sending junk fragments to PULL as fast as it can for FLOOD_S."""
    tmp = tmp_path_factory.mktemp("flood")
    port = free_port_block(3)
    progress_path = tmp / "progress.jsonl"
    log_path = tmp / "learner.log"
    context = zmq.Context()
    with open(log_path, "w") as log_file:
        learner = subprocess.Popen(
            [sys.executable, "-c", FLOOD_LEARNER, str(port), str(progress_path)],
            cwd=REPO,
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=log_file,
            text=True,
        )
    actors = []
    try:
        actors = [
            gym_actor(context, port, env_id="CartPole-v1", register_timeout=60.0) for _ in range(2)
        ]
        wait_until(
            lambda: (p := read_progress(progress_path)) and p[-1]["steps"] >= 3000,
            90.0,
            "the learner to train its first 3000 steps",
        )
        base_start = time.monotonic()
        rss_before = sample_rss_for(learner.pid, FLOOD_BASELINE_S)
        base_end = time.monotonic()
        flood, flood_result = run_flood(
            [f"tcp://127.0.0.1:{port + 1}", "--seconds", str(FLOOD_S), "--kind", "junk"],
            timeout=FLOOD_S + 30,
        )
        rss_peak = sample_rss_until(learner.pid, lambda: flood.poll() is not None, FLOOD_S + 30)
        figures = flood_result()
        wait_until(
            lambda: read_progress(progress_path)[-1]["rejected"] >= figures["sent"],
            30.0,
            "the learner to count every junk frame",
        )
        rss_after = rss(learner.pid)
        progress = read_progress(progress_path)
        learner.send_signal(signal.SIGTERM)
        out, _ = learner.communicate(timeout=60)
        report = tagged_json(out, "REPORT")
        stats = [a.join(30) for a in actors]
    finally:
        if learner.poll() is None:
            learner.kill()
            learner.wait(10)
        context.destroy(linger=0)
    baseline = steps_per_second(progress, base_start, base_end)
    during = steps_per_second(progress, figures["started_at"], figures["ended_at"])
    figures.update(
        baseline_steps_per_s=round(baseline),
        flood_steps_per_s=round(during),
        throughput_fraction=round(during / baseline, 3),
        rss_before_mb=round(rss_before / 1e6, 1),
        rss_peak_mb=round(rss_peak / 1e6, 1),
        rss_after_mb=round(rss_after / 1e6, 1),
        report=report,
        actor_stats=stats,
    )
    summary = {k: v for k, v in figures.items() if k not in ("report", "actor_stats")}
    print("\njunk flood:", json.dumps(summary))
    print("junk flood learner counters:", json.dumps(report["counters"]))
    return figures


def test_junk_flood_on_pull_keeps_memory_bounded_and_counts_every_frame(junk_flood):
    """Learner RSS (its own process) grows by less than FLOOD_RSS_BOUND during the
    flood; every junk frame is rejected and counted (PUSH blocks at its HWM, nothing is
    dropped); the good actors lose nothing (bye: steps_sent == steps_received)."""
    figures, report = junk_flood, junk_flood["report"]
    assert figures["sent"] > 1000, "the flood hardly sent anything"
    assert (figures["rss_peak_mb"] - figures["rss_before_mb"]) * 1e6 < FLOOD_RSS_BOUND
    assert total(report["counters"], "rejected/") == figures["sent"]
    assert report["counters"]["rejected/experience/other_run"] == figures["sent"]
    assert report["stop_reason"] == "SIGTERM from the test"
    assert len(report["actor_stats"]) == 2
    for summary in report["actor_stats"].values():
        assert summary["said_bye"]
        assert summary["steps_received"] == summary["actor/steps_sent"] > 0


def test_junk_flood_leaves_good_actors_a_fair_share(junk_flood):
    """During the flood the good actors keep >= FLOOD_THROUGHPUT_FRACTION of the
    consumed-steps throughput they had in the baseline window just before it."""
    assert junk_flood["throughput_fraction"] >= FLOOD_THROUGHPUT_FRACTION


STALL_ROWS = 8192
STALL_RSS_BOUND = 100e6
"""What a stalled learner may buffer from one flooding peer. Measured: ~+330 MB for
~310 KB frames (PULL RCVHWM of 1000 frames, whatever their size)."""

STALLED_LEARNER = textwrap.dedent(
    """
    import sys
    from zmq_rl.config import LearnerConfig
    from zmq_rl.learner.loop import Learner

    learner = Learner(LearnerConfig(env_id="CartPole-v1", port=int(sys.argv[1])))
    print("BOUND", flush=True)
    sys.stdin.read()  # busy elsewhere (a long update, evaluation, checkpoint): not reading
    learner.close()
    """
)


def test_stalled_learner_buffers_bounded_memory_from_a_flooding_peer(learner_port):
    """While the learner is not reading (here: bound, never run; in a run: a long update,
    evaluation or checkpoint), a peer pushing ~310 KB junk frames for 3 s must not make
    it buffer more than STALL_RSS_BOUND."""
    learner = subprocess.Popen(
        [sys.executable, "-c", STALLED_LEARNER, str(learner_port)],
        cwd=REPO,
        env=child_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert learner.stdout.readline().strip() == "BOUND"
        before = rss(learner.pid)
        flood, flood_result = run_flood(
            [
                f"tcp://127.0.0.1:{learner_port + 1}",
                "--seconds",
                "3",
                "--rows",
                str(STALL_ROWS),
                "--linger-ms",
                "0",
            ],
            timeout=40,
        )
        peak = sample_rss_until(learner.pid, lambda: flood.poll() is not None, 40)
        figures = flood_result()
    finally:
        learner.kill()
        learner.wait(10)
    print(
        f"\nstalled learner: {figures['sent']} frames of {figures['frame_bytes'][0]} bytes "
        f"sent; RSS {before / 1e6:.0f} -> {peak / 1e6:.0f} MB"
    )
    assert peak - before < STALL_RSS_BOUND
