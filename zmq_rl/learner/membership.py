"""Membership: who is registered, whose slots are in the rollout, and every check of
what registered actors send (:meth:`Membership.admit`, :func:`check_hello`). Pure
bookkeeping: the learner does the sockets.

An actor that registers before training starts (or when no member is left) joins
the rollout being filled: its slots are consumed from the current version on. A
later one joins at the next broadcast, so its ``base_version`` is ``version + 1``:
version ``v`` then proves ``(v - base_version) * steps_per_broadcast`` steps
consumed from each of its slots, which keeps its staleness valve exact.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from ..rl.masking import masked_action_problem
from ..rl.rollout import SlotKey
from ..wire.codec import MAX_ABS_VALUE as MAX_ABS_VALUE  # re-exported (it was defined here)
from ..wire.codec import (
    PROTOCOL_VERSION,
    ProtocolError,
    ProtocolVersionMismatch,
    magnitude_problem,
    unpack_map,
)
from ..wire.protocol import FEATURE_POLICIES, MAX_SEQ_GAP, TOKEN_BYTES, Fragment, Hello, Refuse
from ..wire.spaces import space_from_spec, value_problem
from .silence import GapEstimate

RunSpaces = tuple[gym.Space, gym.Space]
"""The run's ``(observation_space, action_space)`` (gymnasium spaces)."""
HEARTBEATS, FRAGMENTS = "heartbeats", "fragments"
"""The two kinds of silence a :data:`SilenceLimit` is asked about."""
SilenceLimit = Callable[["ActorRecord", str], float]
"""``limit(record, kind)``: the seconds of silence (no message at all for
:data:`HEARTBEATS`; no fragment while the rollout waits on it for :data:`FRAGMENTS`)
after which that actor is declared dead."""

RTT_GAIN = 0.125
"""Weight of a new round-trip sample in the smoothed round trip (TCP's SRTT gain)."""
SHARE_GAIN = 0.1
"""Weight of a new heartbeat's ``paused`` share (and step-rate window): about the
last ten heartbeats, ten seconds by default."""
MAX_RTT_S = 60.0
"""Round-trip samples outside [0, MAX_RTT_S] are ignored (a peer's clock is not ours)."""
RTT_FLOOR_SAMPLES = 8
"""Round-trip samples whose minimum is the link's floor (:attr:`LinkEstimate.rtt_floor`):
what the path costs, which one transient stall (a 1 s link cut) does not raise."""


@dataclass
class LinkEstimate:
    """What the learner measures of one actor's link from its heartbeats
    (docs/protocol.md section 4.6): the smoothed round trip, the smoothed share of time
    its staleness valve holds it paused, and its step rate while it runs."""

    rtt: float | None = None
    """Smoothed round trip, seconds (None before the first sample)."""
    rtt_samples: int = 0
    paused_share: float | None = None
    """Smoothed share of wall time the valve held the actor paused, in [0, 1]."""
    paused_samples: int = 0
    step_rate: float | None = None
    """Steps per second per slot while the valve did not hold the actor (None until a
    window with running time was seen)."""
    suggested_max_lead_steps: int | None = None
    """The lead that would cover its round trip (set by the learner's Ingest)."""
    recent_rtts: deque[float] = field(default_factory=lambda: deque(maxlen=RTT_FLOOR_SAMPLES))
    """The newest raw round-trip samples (seconds), for :attr:`rtt_floor`."""
    last_at: float | None = None
    last_steps: int = 0
    window_steps: float = 0.0
    window_running: float = 0.0

    def add_rtt(self, sample: float) -> None:
        """A round-trip sample in seconds (ignored outside [0, MAX_RTT_S])."""
        if not 0.0 <= sample <= MAX_RTT_S:
            return
        self.rtt = sample if self.rtt is None else self.rtt + RTT_GAIN * (sample - self.rtt)
        self.rtt_samples += 1
        self.recent_rtts.append(sample)

    @property
    def rtt_floor(self) -> float | None:
        """The smallest of the last :data:`RTT_FLOOR_SAMPLES` round trips (None before
        one): the link's own delay, without the stalls the smoothed ``rtt`` still holds."""
        return min(self.recent_rtts) if self.recent_rtts else None

    def add_paused(self, now: float, paused: float, steps_received: int, num_envs: int) -> None:
        """A heartbeat's ``paused`` share, read at ``now``, when the learner had received
        ``steps_received`` steps from the actor in all: updates the smoothed share and
        the step rate over the time it ran (``now`` minus the previous heartbeat's time,
        times ``1 - paused``)."""
        share = self.paused_share
        self.paused_share = paused if share is None else share + SHARE_GAIN * (paused - share)
        self.paused_samples += 1
        if self.last_at is not None and now > self.last_at:
            steps = (steps_received - self.last_steps) / max(1, num_envs)
            running = (now - self.last_at) * (1.0 - paused)
            self.window_steps += SHARE_GAIN * (steps - self.window_steps)
            self.window_running += SHARE_GAIN * (running - self.window_running)
            if self.window_running > 1e-3:
                self.step_rate = self.window_steps / self.window_running
        self.last_at, self.last_steps = now, steps_received

    def summary(self) -> dict[str, Any]:
        """The measured figures for the actor's report line (only those measured)."""
        out: dict[str, Any] = {}
        if self.rtt is not None:
            out["rtt_ms"] = round(1e3 * self.rtt, 2)
        if self.paused_share is not None:
            out["valve_paused_share"] = round(self.paused_share, 4)
        if self.step_rate is not None:
            out["running_steps_per_s_per_slot"] = round(self.step_rate, 1)
        if self.suggested_max_lead_steps is not None:
            out["suggested_max_lead_steps"] = self.suggested_max_lead_steps
        return out


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
    token: bytes = b""  # the session token of this registration (welcome, every message)
    next_seq: int = 0  # the seq its next fragment must carry
    last_fragment: float = 0.0
    key: str = ""  # the CURVE public key it registered with (empty without CURVE)
    rank: int = 0  # the learner rank its experience goes to (num_learners > 1)
    fragments_received: int = 0
    steps_received: int = 0
    steps_consumed: int = 0
    said_bye: bool = False
    bye_stats: dict[str, float] = field(default_factory=dict)
    bye_last_seq: int = -1
    peer_sent_at: float | None = None  # sent_at of its newest heartbeat (echoed back)
    peer_heard_at: float = 0.0  # when the learner read that heartbeat
    grant: int | None = None  # steps per slot it may have recorded (None: S/L valve)
    link: LinkEstimate = field(default_factory=LinkEstimate)
    beats: GapEstimate = field(default_factory=GapEstimate)  # its heartbeats' gaps
    fragment_gaps: GapEstimate = field(default_factory=GapEstimate)  # its fragments'

    def slots(self) -> list[SlotKey]:
        """The ``(actor_id, slot)`` keys of this actor."""
        return [(self.actor_id, s) for s in range(self.num_envs)]

    def caught_up(self) -> bool:
        """Whether every fragment the bye says was sent has arrived."""
        return self.next_seq > self.bye_last_seq

    def death_line(self, now: float, updates: int, version: int) -> dict[str, Any]:
        """The actor's entry in the report's ``dead_actors``."""
        return {
            "actor_id": self.actor_id,
            "host": self.host,
            "pid": self.pid,
            "silent_seconds": round(now - self.last_seen, 3),
            "at_update": updates,
            "at_version": version,
        }

    def _gaps(self) -> dict[str, float]:
        """The longest gaps between its heartbeats and between its fragments (seconds;
        only those measured): what its silence limit adapted to (learner/silence.py)."""
        gaps = {"longest_heartbeat_gap_s": self.beats, "longest_fragment_gap_s": self.fragment_gaps}
        return {k: round(g.longest, 3) for k, g in gaps.items() if g.mean is not None}

    def summary(self) -> dict[str, Any]:
        """The actor's line in the report."""
        return {
            "actor_id": self.actor_id,
            "host": self.host,
            "pid": self.pid,
            "num_envs": self.num_envs,
            "learner_rank": self.rank,
            "said_bye": self.said_bye,
            "fragments_received": self.fragments_received,
            "steps_received": self.steps_received,
            "steps_consumed": self.steps_consumed,
            **self.link.summary(),
            **self._gaps(),
            **{f"actor/{k}": v for k, v in self.bye_stats.items()},
        }


class Membership:
    """The registered actors, by id and by ZeroMQ routing id."""

    def __init__(self) -> None:
        self.actors: dict[int, ActorRecord] = {}
        self.by_routing: dict[bytes, int] = {}
        self._short_since: dict[int, float] = {}  # member -> since when the rollout waits on it

    def __len__(self) -> int:
        return len(self.actors)

    def __iter__(self) -> Iterator[ActorRecord]:
        return iter(list(self.actors.values()))

    def get(self, actor_id: int) -> ActorRecord | None:
        """The record of ``actor_id``, if registered."""
        return self.actors.get(actor_id)

    def sender(self, routing_id: bytes, actor_id: int, token: bytes | None) -> ActorRecord | None:
        """The record of a control message's sender, if it is who it says it is: the
        connection it registered on, and its registration's session token."""
        known = self.by_routing.get(routing_id)
        rec = self.actors.get(known) if known == actor_id else None
        if rec is None or token is None or not hmac.compare_digest(rec.token, token):
            return None
        return rec

    def member_slots(self) -> list[SlotKey]:
        """Every slot the rollout being filled needs rows from, in key order (actor id,
        then slot): the rollout's column order, so it must not depend on which actor
        happened to register first (a fixed seed trains the same weights every time)."""
        return sorted(key for rec in self.actors.values() if rec.member for key in rec.slots())

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
            token=secrets.token_bytes(TOKEN_BYTES),
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

    def admit_pending(
        self, ready: Callable[[ActorRecord], bool] | None = None
    ) -> list[ActorRecord]:
        """Make registered non-members (that have not left) members: every one, or
        with ``ready`` only those for which ``ready(record)`` holds."""
        admitted = [r for r in self.pending() if ready is None or ready(r)]
        for rec in admitted:
            rec.member = True
        return admitted

    def drop_silent_pending(
        self,
        now: float,
        silence: float,
        limit: SilenceLimit | None = None,
        members_too: bool = False,
    ) -> list[ActorRecord]:
        """Remove and return the registrations that never joined the rollout and have
        sent nothing (no heartbeat, no fragment) for ``silence`` seconds (or, with
        ``limit``, ``limit(record, HEARTBEATS)``): a hello alone holds a place in
        ``max_actors`` only that long. ``members_too``: also members that sent nothing
        at all since their hello (rows batches admit at the hello: such a member is a
        hello alone all the same, not an actor that died)."""
        unproven = [
            r
            for r in self.actors.values()
            if r.member and not r.said_bye and not r.fragments_received and r.beats.last is None
        ]
        dropped = [
            r
            for r in self.pending() + (unproven if members_too else [])
            if now - r.last_seen > (silence if limit is None else limit(r, HEARTBEATS))
        ]
        return [self.remove(r.actor_id) for r in dropped]

    def silent(
        self,
        now: float,
        timeout: float,
        short_since: dict[int, float] | None = None,
        heard: bool = True,
        limit: SilenceLimit | None = None,
    ) -> list[ActorRecord]:
        """Actors that have not said bye and were last heard more than ``timeout`` ago,
        and members whose slots the rollout has waited on (``short_since``: actor id
        -> when it first fell short) for ``timeout`` without a fragment from them:
        heartbeats alone do not hold a rollout. (A member paused by its valve while
        the learner waited on someone else becomes short only when that rollout is
        taken, and resumes at once.) ``heard=False``: only the second rule (a learner
        rank that receives no heartbeats). ``limit(record, kind)``, when given, is
        each actor's own timeout for :data:`HEARTBEATS` and :data:`FRAGMENTS`
        (:mod:`zmq_rl.learner.silence`) instead of ``timeout``."""
        return [r for r, _ in self._silent(now, timeout, short_since or {}, heard, limit)]

    def _silent(
        self,
        now: float,
        timeout: float,
        short_since: dict[int, float],
        heard: bool,
        limit: SilenceLimit | None,
    ) -> list[tuple[ActorRecord, str]]:
        """:meth:`silent`'s actors, each with why (the rule and its limit)."""
        allowed = limit or (lambda rec, kind: timeout)
        found = []
        for r in list(self.actors.values()):
            if r.said_bye:
                continue
            quiet = now - r.last_seen
            if heard and quiet > (most := allowed(r, HEARTBEATS)):
                found.append((r, f"silent for {quiet:.1f}s > {_limit(most, timeout)}"))
                continue
            if r.member and r.actor_id in short_since:
                waited = now - max(short_since[r.actor_id], r.last_fragment)
                if waited > (most := allowed(r, FRAGMENTS)):
                    why = f"no fragment for {waited:.1f}s while the rollout waited on it"
                    found.append((r, f"{why} > {_limit(most, timeout)}"))
        return found

    def evict_silent(
        self,
        now: float,
        timeout: float,
        short: set[int],
        heard: bool = True,
        limit: SilenceLimit | None = None,
    ) -> list[tuple[ActorRecord, str]]:
        """Remove and return every actor that is dead by :meth:`silent`, each with why.

        ``short`` are the members whose slots the rollout being filled still waits
        on; how long each has been waited on is tracked here, from when it first
        fell short (a member paused by its valve while the learner waited on someone
        else becomes short only when that rollout is taken, and resumes at once).
        """
        self._short_since = {a: self._short_since.get(a, now) for a in short}
        dead = self._silent(now, timeout, self._short_since, heard, limit)
        return [(self.remove(rec.actor_id), why) for rec, why in dead]

    def describe_waiting(self, short: list[SlotKey], dead: list[dict[str, Any]]) -> str:
        """Who a starved rollout waits on (for the LearnerStarved message): the actors
        owning the ``short`` slots with how long each has been silent, else that no
        actor is left (naming the last ones declared ``dead``)."""
        now = time.monotonic()
        recs = [self.actors.get(a) for a in sorted({actor_id for actor_id, _ in short})]
        described = ", ".join(
            f"actor {rec.actor_id} ({rec.host} pid {rec.pid}, "
            f"silent for {now - rec.last_seen:.1f}s)"
            for rec in recs
            if rec is not None
        )
        if described:
            return described
        gone = ", ".join(f"actor {d['actor_id']} ({d['host']} pid {d['pid']})" for d in dead[-8:])
        return "no live actor" + (f" (declared dead: {gone})" if gone else "")

    def admit(
        self,
        fragment: Fragment,
        sender_key: str,
        *,
        run_id: str,
        version: int,
        spaces: RunSpaces,
        queued_rows: Callable[[SlotKey], int],
        slot_cap: int,
        now: float,
        state_size: int | None = None,
        received_rows: Callable[[SlotKey], int] | None = None,
        sent_cap: Callable[[ActorRecord], int] | None = None,
        agents_per_env: int | None = None,
    ) -> tuple[ActorRecord, int]:
        """Every check of a decoded fragment against the run and its sender, in one place.

        The fragment must be of this run, of a version the learner published, from a
        registered actor with its registration's session token, through the CURVE
        key it registered with (``sender_key``, empty without CURVE), for its slots,
        fit the run's ``spaces``, carry the next ``seq`` (not an earlier one, and not
        more than :data:`~zmq_rl.wire.protocol.MAX_SEQ_GAP` beyond), and not push any of
        its slots' queues (``queued_rows(key)`` already there) past ``slot_cap`` (an
        actor that follows the staleness valve never does) or, with ``sent_cap`` (a
        learner of rows batches), its slots' rows in this registration
        (``received_rows(key)``) past ``sent_cap(rec)``, what its valve lets it record
        (its grant, or the ``S``/``L`` budget of the learner's version), and carry a
        recurrent ``state`` exactly when ``state_size`` > 0 (None: not checked), and mark
        rows not valid only in a multi-agent run (``agents_per_env`` > 1; None: not
        checked). Every valid row's action must be one its ``action_mask`` allows (a
        masked run, :func:`~zmq_rl.rl.masking.masked_action_problem`). Raises
        :class:`FragmentRejected`, touching no record; on success records the
        fragment (next ``seq``, last seen, counts) and returns the record and the
        number of sequence numbers skipped before it (lost fragments).
        """
        if fragment.run_id != run_id:
            raise FragmentRejected("other_run", f"run_id {fragment.run_id!r} is not {run_id!r}")
        rec = self.actors.get(fragment.actor_id)
        if rec is None or not hmac.compare_digest(rec.token, fragment.token):
            raise FragmentRejected(
                "unknown_actor",
                f"actor_id {fragment.actor_id} with this token is not registered",
            )
        if fragment.version > version:
            raise FragmentRejected(
                "bad_version", f"version {fragment.version} > the learner's {version}"
            )
        problem = _fit_problem(fragment, rec, spaces, agents_per_env) or _state_problem(
            fragment, state_size
        )
        if problem:
            raise FragmentRejected(*problem)
        if rec.key != sender_key:
            raise FragmentRejected(
                "wrong_sender", f"fragment for actor {rec.actor_id} sent with another CURVE key"
            )
        expected = rec.next_seq
        if fragment.seq < expected:
            raise FragmentRejected(
                "old_seq", f"actor {rec.actor_id} seq {fragment.seq} < expected {expected}"
            )
        if fragment.seq > expected + MAX_SEQ_GAP:
            raise FragmentRejected(
                "seq_jump",
                f"actor {rec.actor_id} seq {fragment.seq} is more than {MAX_SEQ_GAP} "
                f"beyond the expected {expected}",
            )
        length = fragment.length
        for slot in fragment.slots.tolist():
            key = (rec.actor_id, slot)
            have, cap, what = (
                (received_rows(key), sent_cap(rec), "have sent")
                if sent_cap is not None and received_rows is not None
                else (queued_rows(key), slot_cap, "queue")
            )
            if have + length > cap:
                raise FragmentRejected(
                    "over_lead",
                    f"actor {rec.actor_id} slot {slot} would {what} {have + length} rows "
                    f"> {cap}: it ignores the staleness valve",
                )
        rec.next_seq = fragment.seq + 1
        rec.last_seen = rec.last_fragment = now
        rec.fragment_gaps.add(now)
        rec.fragments_received += 1
        rec.steps_received += length * fragment.num_slots
        return rec, fragment.seq - expected


@dataclass(frozen=True)
class MembershipLimits:
    """The most actors, slots per actor and slots in total a learner registers
    (``LearnerConfig.max_actors``, ``max_envs_per_actor``, ``max_total_envs``)."""

    max_actors: int
    max_envs_per_actor: int
    max_total_envs: int


def check_hello(
    membership: Membership,
    routing_id: bytes,
    hello: Hello,
    env_id: str,
    observation_space: gym.Space,
    action_space: gym.Space,
    limits: MembershipLimits | None = None,
    default_envs: int = 1,
    policy_map: list[str] | None = None,
    agents_per_env: int = 1,
) -> tuple[str, str] | None:
    """Why a hello must be refused, as (refuse code, message naming both sides or the
    limit), or None when it is acceptable. ``policy_map``: a run of several policies
    refuses an actor that does not announce it can run them (docs/protocol.md 4.9).
    ``agents_per_env``: a multi-agent run refuses a ``num_envs`` that is not a whole
    number of env copies (docs/protocol.md 4.3)."""
    if hello.observation_space or hello.action_space:
        try:
            theirs_obs = space_from_spec(hello.observation_space, "hello.observation_space")
            theirs_act = space_from_spec(hello.action_space, "hello.action_space")
        except Exception as exc:  # noqa: BLE001 - a peer's input must never stop the run
            return "bad_hello", f"unusable space in hello: {exc}"
        if theirs_obs != observation_space or theirs_act != action_space:
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
    if hello.num_envs % agents_per_env:
        return "bad_hello", (
            f"num_envs {hello.num_envs} is not a multiple of this run's agents_per_env "
            f"{agents_per_env} (slots per env copy: one per possible agent)"
        )
    if policy_map and FEATURE_POLICIES not in hello.features:
        return "bad_hello", (
            f"this run trains several policies (policy_map {policy_map}); an actor must "
            f"announce the {FEATURE_POLICIES!r} feature in its hello"
        )
    if limits is not None:
        return _over_limits(membership, routing_id, hello, limits, default_envs)
    return None


MAX_REFUSE_REASON = 4096
"""The longest ``refuse.reason`` (docs/protocol.md section 4.5)."""


def control_refusal(
    frame: bytes | memoryview, error: ProtocolError, max_bytes: int
) -> Refuse | None:
    """The refusal that answers a control frame which failed to decode with ``error``:
    ``version_mismatch`` for a peer of another protocol version, whatever it sent,
    ``bad_hello`` for a protocol-2 hello (:func:`invalid_hello_refusal`), else None
    (docs/protocol.md section 4.5)."""
    if isinstance(error, ProtocolVersionMismatch):
        return Refuse("version_mismatch", str(error))
    return invalid_hello_refusal(frame, error, max_bytes)


def invalid_hello_refusal(
    frame: bytes | memoryview, error: ProtocolError, max_bytes: int
) -> Refuse | None:
    """The ``refuse bad_hello`` that answers a control frame which failed to decode
    with ``error`` but is a protocol-2 ``hello`` (a map whose ``proto`` is 2 and
    ``type`` is ``"hello"``: a field missing, of the wrong type or out of range), so
    that the actor reads why instead of waiting out its registration timeout
    (docs/protocol.md section 4.5); None for any other frame (still rejected in
    silence: only a hello waits for an answer)."""
    try:
        body = unpack_map(frame, max_bytes)
    except ProtocolError:
        return None
    proto = body.get("proto")
    if body.get("type") != "hello" or type(proto) is not int or proto != PROTOCOL_VERSION:
        return None
    reason = f"invalid hello ({error.reason}): {error}"
    return Refuse("bad_hello", reason[:MAX_REFUSE_REASON])


def _over_limits(
    membership: Membership,
    routing_id: bytes,
    hello: Hello,
    limits: MembershipLimits,
    default_envs: int,
) -> tuple[str, str] | None:
    """A hello that would take the run past its membership limits (a re-registration
    of this connection or id replaces its earlier record, so that one is not counted)."""
    envs = hello.num_envs or default_envs
    if envs > limits.max_envs_per_actor:
        return "too_many_envs", (
            f"num_envs {envs} > max_envs_per_actor={limits.max_envs_per_actor} of this learner"
        )
    replaced = {membership.by_routing.get(routing_id), hello.actor_id}
    others = [r for r in membership if not r.said_bye and r.actor_id not in replaced]
    if len(others) >= limits.max_actors:
        return "full", f"{len(others)} actors registered: max_actors={limits.max_actors}"
    slots = sum(r.num_envs for r in others)
    if slots + envs > limits.max_total_envs:
        return "full", (
            f"{slots} env slots registered; {envs} more would pass "
            f"max_total_envs={limits.max_total_envs}"
        )
    return None


def _limit(seconds: float, timeout: float) -> str:
    """A silence limit as a death line says it: ``actor_timeout``, or what it adapted to."""
    if seconds <= timeout:
        return f"actor_timeout={timeout:g}s"
    return f"{seconds:.1f}s (actor_timeout={timeout:g}s, adapted to the gaps its link showed)"


class FragmentRejected(Exception):
    """A fragment that does not fit the run or its sender; ``reason`` is the reject
    counter's code (``rejected/experience/<reason>``), the message says what exactly."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def _fit_problem(
    fragment: Fragment, rec: ActorRecord, spaces: RunSpaces, agents_per_env: int | None
) -> tuple[str, str] | None:
    """Whether a decoded fragment's arrays fit the run's spaces and the actor's slots,
    its ``valid`` rows the run (``agents_per_env``; None: not checked) and its actions
    their own masks."""
    slots = fragment.slots
    if int(slots.max()) >= rec.num_envs:
        return "bad_slot", f"slot {int(slots.max())} >= actor's num_envs {rec.num_envs}"
    observation_space, action_space = spaces
    problem = value_problem(observation_space, fragment.obs, "obs", 2)
    if problem:
        return "bad_obs", f"{problem} (observation space {observation_space})"
    for name in ("rewards", "values", "log_probs"):
        problem = magnitude_problem(getattr(fragment, name), name)
        if problem:
            return "out_of_range", problem
    problem = action_problem(action_space, fragment.actions)
    if problem:
        return "bad_actions", problem
    if fragment.valid is not None and agents_per_env == 1:
        return "bad_valid", (
            "rows marked not valid, but this run's env is single-agent (its welcome has no "
            "agents_per_env > 1): every row is an env step"
        )
    problem = masked_action_problem(*spaces, fragment.obs, fragment.actions, fragment.valid)
    if problem:
        return "masked_action", problem
    return None


def _state_problem(fragment: Fragment, state_size: int | None) -> tuple[str, str] | None:
    """Whether the fragment's recurrent ``state`` is present exactly when the run's
    policy is recurrent, ``state_size`` wide (docs/protocol.md section 4.1.3)."""
    if state_size is None:
        return None
    state = fragment.state
    if state is None and state_size:
        return "bad_state", f"no state, but the run's state_size is {state_size}"
    if state is not None and state.shape[1] != state_size:
        return "bad_state", f"state {list(state.shape)}, the run's state_size is {state_size}"
    return None


def action_problem(space: gym.Space, actions: np.ndarray) -> str | None:
    """Why ``actions`` (``[T, B, ...]``) are not the policy's actions for ``space``:
    discrete indices in ``[0, n)``, multi-discrete indices in ``[0, nvec)``, 0/1 for
    multi-binary, floats of the box's shape (the actor clips to the bounds when it
    steps the env), or None."""
    element = actions.shape[2:]
    got = f"actions {list(actions.shape)} {actions.dtype}"
    if isinstance(space, gym.spaces.Discrete):
        if element != () or actions.dtype.kind != "i":
            return f"discrete actions must be int [T, B], got {list(actions.shape)} {actions.dtype}"
        if int(actions.min()) < 0 or int(actions.max()) >= int(space.n):
            return f"discrete actions outside [0, {int(space.n)})"
        return None
    if isinstance(space, gym.spaces.MultiDiscrete):
        if element != space.shape or actions.dtype.kind != "i":
            return f"{got}, expected int {list(space.shape)}"
        if (actions < 0).any() or (actions >= space.nvec).any():
            return "multi-discrete actions outside [0, nvec)"
        return None
    if isinstance(space, gym.spaces.MultiBinary):
        if element != space.shape or actions.dtype.kind not in "iub":
            return f"{got}, expected 0/1 {list(space.shape)}"
        if actions.dtype.kind != "b" and (int(actions.min()) < 0 or int(actions.max()) > 1):
            return "multi-binary actions other than 0 and 1"
        return None
    if element != space.shape or actions.dtype.kind != "f":
        return f"{got}, expected float {list(space.shape)}"
    return None
