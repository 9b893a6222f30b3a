"""Membership: who is registered, whose slots are in the rollout, and checks of what
registered actors send. Pure bookkeeping: the learner does the sockets.

An actor that registers before training starts (or when no member is left) joins
the rollout being filled: its slots are consumed from the current version on. A
later one joins at the next broadcast, so its ``base_version`` is ``version + 1``:
version ``v`` then proves ``(v - base_version) * steps_per_broadcast`` steps
consumed from each of its slots, which keeps its staleness valve exact.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from .protocol import Fragment, Hello, space_from_spec, spaces_equal
from .rollout import SlotKey


@dataclass
class ActorRecord:
    """What the learner knows of one registered actor."""

    actor_id: int
    routing_id: bytes
    num_envs: int
    host: str
    pid: int
    base_version: int
    member: bool
    last_seen: float
    registered_at: float
    next_seq: list[int | None] = field(default_factory=list)
    last_fragment: float = 0.0
    key: str = ""  # the CURVE public key it registered with (empty without CURVE)
    fragments_received: int = 0
    steps_received: int = 0
    steps_consumed: int = 0
    said_bye: bool = False
    bye_stats: dict[str, float] = field(default_factory=dict)
    bye_last_seq: list[int] = field(default_factory=list)

    def slots(self) -> list[SlotKey]:
        """The ``(actor_id, slot)`` keys of this actor."""
        return [(self.actor_id, s) for s in range(self.num_envs)]

    def caught_up(self) -> bool:
        """Whether every fragment the bye says was sent has arrived."""
        return all(
            (nxt if nxt is not None else 0) > last
            for nxt, last in zip(self.next_seq, self.bye_last_seq, strict=False)
        )

    def summary(self) -> dict[str, Any]:
        """The actor's line in the report."""
        return {
            "actor_id": self.actor_id,
            "host": self.host,
            "pid": self.pid,
            "num_envs": self.num_envs,
            "said_bye": self.said_bye,
            "fragments_received": self.fragments_received,
            "steps_received": self.steps_received,
            "steps_consumed": self.steps_consumed,
            **{f"actor/{k}": v for k, v in self.bye_stats.items()},
        }


class Membership:
    """The registered actors, by id and by ZeroMQ routing id."""

    def __init__(self) -> None:
        self.actors: dict[int, ActorRecord] = {}
        self.by_routing: dict[bytes, int] = {}

    def __len__(self) -> int:
        return len(self.actors)

    def __iter__(self) -> Iterator[ActorRecord]:
        return iter(list(self.actors.values()))

    def get(self, actor_id: int) -> ActorRecord | None:
        """The record of ``actor_id``, if registered."""
        return self.actors.get(actor_id)

    def sender(self, routing_id: bytes, actor_id: int) -> ActorRecord | None:
        """The record of a control message's sender, if it is who it says it is."""
        known = self.by_routing.get(routing_id)
        return self.actors.get(known) if known == actor_id else None

    def member_slots(self) -> list[SlotKey]:
        """Every slot the rollout being filled needs rows from."""
        return [key for rec in self.actors.values() if rec.member for key in rec.slots()]

    def register(
        self,
        routing_id: bytes,
        hello: Hello,
        *,
        version: int,
        started: bool,
        default_envs: int,
        now: float,
    ) -> tuple[ActorRecord, list[ActorRecord]]:
        """Record an accepted hello; return the new record and the records it
        replaces (an earlier registration of this peer or of this id)."""
        replaced = [
            self.remove(old)
            for old in {self.by_routing.get(routing_id), hello.actor_id}
            if old is not None and old in self.actors
        ]
        actor_id = hello.actor_id
        if actor_id < 0:
            actor_id = next(i for i in range(len(self.actors) + 1) if i not in self.actors)
        joins_now = not started or not self.member_slots()
        num_envs = hello.num_envs or default_envs
        rec = ActorRecord(
            actor_id=actor_id,
            routing_id=routing_id,
            num_envs=num_envs,
            host=hello.host,
            pid=hello.pid,
            base_version=version if joins_now else version + 1,
            member=joins_now,
            last_seen=now,
            last_fragment=now,
            registered_at=now,
            next_seq=list(hello.next_seq) if len(hello.next_seq) == num_envs else [None] * num_envs,
        )
        self.actors[actor_id] = rec
        self.by_routing[routing_id] = actor_id
        return rec, replaced

    def remove(self, actor_id: int) -> ActorRecord:
        """Forget ``actor_id``; return its record."""
        rec = self.actors.pop(actor_id)
        self.by_routing.pop(rec.routing_id, None)
        return rec

    def pending(self) -> list[ActorRecord]:
        """Registered actors waiting to join the rollout."""
        return [r for r in self.actors.values() if not r.member and not r.said_bye]

    def live_count(self) -> int:
        """Registered actors that have not said bye."""
        return sum(1 for r in self.actors.values() if not r.said_bye)

    def admit_pending(self) -> list[ActorRecord]:
        """Make every registered non-member (that has not left) a member."""
        admitted = self.pending()
        for rec in admitted:
            rec.member = True
        return admitted

    def silent(
        self, now: float, timeout: float, short_since: dict[int, float] | None = None
    ) -> list[ActorRecord]:
        """Actors that have not said bye and were last heard more than ``timeout`` ago,
        and members whose slots the rollout has waited on (``short_since``: actor id
        -> when it first fell short) for ``timeout`` without a fragment from them:
        heartbeats alone do not hold a rollout. (A member paused by its valve while
        the learner waited on someone else becomes short only when that rollout is
        taken, and resumes at once.)"""
        short_since = short_since or {}
        return [
            r
            for r in self.actors.values()
            if not r.said_bye
            and (
                now - r.last_seen > timeout
                or (
                    r.member
                    and r.actor_id in short_since
                    and now - max(short_since[r.actor_id], r.last_fragment) > timeout
                )
            )
        ]


MAX_ABS_VALUE = 1e9
"""Rewards, values and log-probs beyond this magnitude are rejected: finite but
absurd numbers would otherwise overflow the loss."""


def check_hello(
    membership: Membership,
    routing_id: bytes,
    hello: Hello,
    env_id: str,
    observation_space: Any,
    action_space: Any,
) -> tuple[str, str] | None:
    """Why a hello must be refused, as (refuse code, message naming both sides),
    or None when it is acceptable."""
    if hello.observation_space or hello.action_space:
        try:
            theirs_obs = space_from_spec(hello.observation_space, "hello.observation_space")
            theirs_act = space_from_spec(hello.action_space, "hello.action_space")
        except Exception as exc:  # noqa: BLE001 - a peer's input must never stop the run
            return "bad_hello", f"unusable space in hello: {exc}"
        if not (
            spaces_equal(theirs_obs, observation_space) and spaces_equal(theirs_act, action_space)
        ):
            return "space_mismatch", (
                f"env spaces differ: actor ({hello.env_id}) has observation {theirs_obs} "
                f"and action {theirs_act}; learner ({env_id}) has observation "
                f"{observation_space} and action {action_space}"
            )
    rec = membership.get(hello.actor_id)
    same_process = rec is not None and (rec.host, rec.pid) == (hello.host, hello.pid)
    if rec is not None and not rec.said_bye and rec.routing_id != routing_id and not same_process:
        # (The same process on a new connection is a reconnect, not a duplicate.)
        return "duplicate_id", (
            f"actor id {hello.actor_id} is already taken by a live actor on "
            f"{rec.host} pid {rec.pid}; pass another --actor-id or -1"
        )
    return None


def check_fragment(
    fragment: Fragment,
    membership: Membership,
    run_id: str,
    version: int,
    observation_space: Any,
    action_space: Any,
) -> tuple[str, str] | None:
    """Check a decoded fragment against the run; (reject reason, detail) when it
    must go, None when it fits."""
    if fragment.run_id != run_id:
        return "other_run", f"run_id {fragment.run_id!r} is not {run_id!r}"
    if fragment.version > version:
        return "bad_version", f"version {fragment.version} > the learner's {version}"
    rec = membership.get(fragment.actor_id)
    if rec is None:
        return "unknown_actor", f"actor_id {fragment.actor_id} is not registered"
    if fragment.slot >= rec.num_envs:
        return "bad_slot", f"slot {fragment.slot} >= actor's num_envs {rec.num_envs}"
    if fragment.obs.shape[1:] != observation_space.shape or (
        fragment.obs.dtype != observation_space.dtype
    ):
        return "bad_obs", (
            f"obs rows {fragment.obs.shape[1:]} {fragment.obs.dtype}, "
            f"expected {observation_space.shape} {observation_space.dtype}"
        )
    for name in ("rewards", "values", "log_probs"):
        array = getattr(fragment, name)
        if array.size and float(np.abs(array).max()) > MAX_ABS_VALUE:
            return "out_of_range", f"|{name}| exceeds {MAX_ABS_VALUE:g}"
    actions = fragment.actions
    if isinstance(action_space, gym.spaces.Discrete):
        n = int(action_space.n)
        if actions.ndim != 1 or actions.dtype.kind != "i":
            return "bad_actions", f"discrete actions must be int [T], got {actions.dtype}"
        if actions.size and (actions.min() < 0 or actions.max() >= n):
            return "bad_actions", f"discrete actions outside [0, {n})"
    else:
        shape = (actions.shape[0], *action_space.shape)
        if actions.shape != shape or actions.dtype.kind != "f":
            return "bad_actions", f"actions {actions.shape} {actions.dtype}, expected {shape}"
    return None
