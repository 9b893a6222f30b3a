"""Rank 0's bookkeeping of the other learner ranks' actors (RankRouting) and a rank's
fill, against small fakes of the ingest: a rank report about a registration rank 0
has since replaced (a restarted actor took the same id) must not touch the
replacement, and a rank without member slots still receives, so a registration
waiting to join on it can deliver and be admitted. The real-process version of
both is tests/test_learner_ranks.py::test_kill_9_of_the_only_actor_of_rank_1_is_survived."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

from zmq_rl.learner.membership import ActorRecord, Membership
from zmq_rl.learner.ranks import RankRouting, _Rounds


def record(actor_id: int, token: bytes, pid: int, rank: int = 1) -> ActorRecord:
    return ActorRecord(
        actor_id=actor_id, routing_id=token, num_envs=1, host="vm", pid=pid,
        base_version=0, member=True, last_seen=0.0, registered_at=0.0, token=token, rank=rank,
    )  # fmt: skip


class FakeIngest:
    """What RankRouting reads and calls of an ingest."""

    def __init__(self) -> None:
        self.members = Membership()
        self.report = SimpleNamespace(dead_actors=[])
        self.counters: Counter[str] = Counter()
        self.forgotten: list[tuple[int, bytes, str]] = []

    def add(self, rec: ActorRecord) -> None:
        self.members.actors[rec.actor_id] = rec

    def forget_actor(self, rec: ActorRecord, reason: str) -> None:
        self.forgotten.append((rec.actor_id, rec.token, reason))


def death(actor_id: int, pid: int) -> dict:
    return {"actor_id": actor_id, "host": "vm", "pid": pid, "silent_seconds": 3.0,
            "at_update": 24, "at_version": 24}  # fmt: skip


def test_a_death_reported_for_a_replaced_registration_keeps_the_replacement():
    ingest, routing = FakeIngest(), RankRouting(0, 2)
    ingest.add(record(0, b"old", pid=100))
    routing.plan_actors(ingest)  # the round's plan names the old registration
    # While the ranks filled, the old process died (rank 0 saw it exit) and its
    # restart registered with the same actor id.
    ingest.members.remove(0)
    ingest.add(record(0, b"new", pid=200))
    routing.apply_rank_report(
        ingest, {"actors": {0: [16, 1, 16, True]}, "dead": [death(0, pid=100)]}
    )
    rec = ingest.members.get(0)
    assert rec is not None and rec.token == b"new"
    assert ingest.forgotten == [] and ingest.report.dead_actors == []
    assert ingest.counters["actors/declared_dead"] == 0
    # The old registration's counts are not the replacement's.
    assert rec.steps_received == 0 and not routing.delivered_elsewhere(rec)


def test_a_death_reported_for_the_planned_registration_removes_it():
    ingest, routing = FakeIngest(), RankRouting(0, 2)
    ingest.add(record(0, b"tok", pid=100))
    routing.plan_actors(ingest)
    routing.apply_rank_report(
        ingest, {"actors": {0: [32, 2, 16, True]}, "dead": [death(0, pid=100)]}
    )
    assert ingest.members.get(0) is None
    assert ingest.forgotten == [(0, b"tok", "actor_dead")]
    assert [d["pid"] for d in ingest.report.dead_actors] == [100]
    assert ingest.counters["actors/declared_dead"] == 1


def test_the_counts_of_a_planned_registration_are_taken():
    ingest, routing = FakeIngest(), RankRouting(0, 2)
    ingest.add(record(3, b"tok", pid=100))
    routing.plan_actors(ingest)
    routing.apply_rank_report(ingest, {"actors": {3: [48, 3, 32, True]}, "dead": []})
    rec = ingest.members.get(3)
    assert (rec.steps_received, rec.fragments_received, rec.steps_consumed) == (48, 3, 32)
    assert routing.delivered_elsewhere(rec)


class RankIngest:
    """A rank > 0's ingest without member slots: no rows ever, pumps counted."""

    def __init__(self) -> None:
        self.pumps: list[int] = []
        self.queues = SimpleNamespace(ready=lambda slots, need: False)

    def local_member_slots(self) -> list:
        return []

    def pump(self, timeout_ms: int) -> None:
        self.pumps.append(timeout_ms)


def test_a_rank_without_member_slots_still_receives_each_round():
    ingest = RankIngest()
    rounds = _Rounds(SimpleNamespace(num_steps=16), None, None, ingest, RankRouting(1, 2))
    assert rounds._fill() == []
    assert ingest.pumps == [0]


def test_a_restart_that_reuses_the_id_has_delivered_nothing_yet():
    """The old registration delivered (its rank's last report said so); the restart
    with the same id must wait for its own rows before it joins the rollout."""
    ingest, routing = FakeIngest(), RankRouting(0, 2)
    ingest.add(record(1, b"old", pid=100))
    routing.plan_actors(ingest)
    routing.apply_rank_report(ingest, {"actors": {1: [16, 1, 16, True]}, "dead": []})
    assert routing.delivered_elsewhere(ingest.members.get(1))
    ingest.members.remove(1)
    ingest.add(record(1, b"new", pid=200))
    assert not routing.delivered_elsewhere(ingest.members.get(1))
