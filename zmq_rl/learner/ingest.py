"""The learner's receiving side: sockets, decode, membership, slot queues, control.

:class:`Ingest` binds the learner's three sockets, reads fragments into the per-slot
queues (every check in :meth:`~zmq_rl.learner.membership.Membership.admit`), serves hello,
heartbeat and bye on the control socket, sends heartbeats, evicts silent actors,
welcomes, publishes weights and shuts the actors down. It also measures each actor's
link from the heartbeats (round trip, the share of time its staleness valve holds it
paused, :meth:`Ingest.link_stats`) and says once per actor which ``max_lead_steps``
would fit its round trip when the valve holds it too often. It holds no RL object: the
:class:`~zmq_rl.learner.loop.Learner` asks it for rollouts' rows and tells it the policy
version (a callable) and what to forget when an actor leaves.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import socket
import statistics
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any, TypeVar

import zmq

from ..config import LearnerConfig
from ..report import LearnerReport
from ..rl.rollout import Rollout, SlotKey, SlotQueues
from ..wire.protocol import (
    Bye,
    Fragment,
    Heartbeat,
    Hello,
    ProtocolError,
    ProtocolVersionMismatch,
    Refuse,
    RunSettings,
    Shutdown,
    Weights,
    Welcome,
    decode,
    encode,
)
from ..wire.spaces import space_spec
from ..wire.transport import bind_learner_sockets, tcp_endpoint
from ..wire.valve import fitting_max_lead_steps
from .membership import (
    ActorRecord,
    FragmentRejected,
    Membership,
    MembershipLimits,
    check_hello,
)

__all__ = ["Ingest"]

log = logging.getLogger("zmq_rl.ingest")

T = TypeVar("T")

DRAIN_S = 0.005
"""Longest one socket is read in one go (fairness under floods)."""
POLL_MS = 50
"""Longest a poll blocks, so timers (heartbeats, timeouts) run on time."""
SHUTDOWN_GRACE_S = 3.0
"""How long the learner waits for every actor's bye after asking them to stop."""
BUSY_GAP_S = 0.005
"""A pause between two pumps longer than this is busy time (an update, an evaluation);
a round trip read in the pump right after one is not measured (its answer may have
waited in the socket). So round trips are measured while the learner waits for rows,
with an error of at most about this much; a learner that never waits measures none."""
PAUSED_ADVICE_SHARE = 0.30
"""An actor held paused by its valve more than this share of the time gets the
``max_lead_steps`` advice (logged once per actor)."""
ADVICE_MIN_SAMPLES = 5
"""Heartbeats (with ``paused``, after training started) before the advice is given."""
ADVICE_WARNINGS = 5
"""Actors whose ``max_lead_steps`` advice is a WARNING; the rest is logged at INFO (256
actors on one slow learner would otherwise print 256 near-identical warnings)."""
PENDING_SILENCE_INTERVALS = 5.0
"""Heartbeat intervals a registration that has not joined the rollout may stay
silent (no heartbeat, no fragment) before it is dropped; a live actor heartbeats
every interval."""
CYCLE_WINDOW = 16
"""Broadcast cycles over which the learner's busy time per cycle is the median."""


HOLD_MAX_BYTES = 64 * 1024 * 1024
"""Learner ranks > 0: fragments of actors that rank 0 registered after the last plan
are held (decoded, not yet checked) until the next plan names them, up to this many
bytes (what new actors send in one update, bounded by their staleness valves); beyond
it they are rejected as ``unknown_actor``."""

PLAN_FIELDS = (
    "actor_id", "token", "num_envs", "base_version", "member", "said_bye",
    "bye_last_seq", "key", "host", "pid", "rank",
)  # fmt: skip
"""What the plan of learner ranks carries of each registration (:meth:`Ingest.plan_actors`)."""
PLAN_UPDATED = ("base_version", "member", "said_bye", "bye_last_seq")
"""The fields a rank > 0 takes from every plan for a registration it already has."""

CONTROL_SLACK_BYTES = 128 * 1024
"""Room in the control message limit beyond the spaces and the per-slot lists: ids,
host and env names, a bye's stats (a legitimate one is under 2 KB)."""


def wake_pair(ctx: zmq.Context, name: str) -> tuple[zmq.Socket, zmq.Socket]:
    """An inproc PAIR (receiving end, sending end) that wakes a thread blocked in a
    poll; HWM 1 each (one pending wake is enough), linger 0."""
    ends = []
    for _ in range(2):
        sock = ctx.socket(zmq.PAIR)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 1)
        sock.setsockopt(zmq.RCVHWM, 1)
        ends.append(sock)
    ends[0].bind(f"inproc://{name}")
    ends[1].connect(f"inproc://{name}")
    return ends[0], ends[1]


def largest_control_bytes(observation_space: Any, action_space: Any, max_envs: int) -> int:
    """The learner's control message limit (ROUTER ``ZMQ_MAXMSGSIZE``): twice what
    a legitimate hello (both space specs, up to ``max_envs`` per-slot integers) or bye
    can be for the run's spaces, plus :data:`CONTROL_SLACK_BYTES`. A hello of other
    spaces larger than that costs its sender the connection instead of a
    ``space_mismatch`` refusal; anything bigger is never legitimate."""
    import msgpack

    specs = len(msgpack.packb([space_spec(observation_space), space_spec(action_space)]))
    return 2 * (specs + 9 * max_envs) + CONTROL_SLACK_BYTES


class Ingest:
    """Sockets, membership and slot queues of one learner run.

    ``version()`` is the newest policy version, ``forget_slots(keys)`` is called
    for the slots of an actor that left (their unfinished episodes lost rows);
    ``report`` and ``counters`` are the run's, shared with the learner.
    """

    def __init__(
        self,
        cfg: LearnerConfig,
        settings: RunSettings,
        *,
        run_id: str,
        report: LearnerReport,
        counters: Counter[str],
        version: Callable[[], int],
        forget_slots: Callable[[list[SlotKey]], None],
        context: zmq.Context | None = None,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        self.cfg = cfg
        # Data-parallel learner ranks (num_learners): rank 0 serves control and
        # registers every actor; rank r > 0 only receives its actors' fragments.
        self.rank, self.world_size = rank, world_size
        self.remote_delivered: set[int] = set()  # rank 0: other ranks' actors that delivered
        # Rank > 0: fragments of actors not planned yet, (fragment, CURVE key, bytes);
        # bounded by HOLD_MAX_BYTES.
        self._held: deque[tuple[Fragment, str, int, bool]] = deque()
        self._held_bytes = 0
        self._reported_dead = 0  # rank > 0: dead_actors already in a rank report
        self.settings = settings
        self.spaces = (settings.observation_space, settings.action_space)
        self.run_id = run_id
        self.report = report
        self.counters = counters
        self.version = version
        self.forget_slots = forget_slots
        self.max_message_bytes = settings.max_fragment_bytes
        self.control_max_bytes = largest_control_bytes(*self.spaces, cfg.max_envs_per_actor)
        self.members = Membership()
        self.limits = MembershipLimits(cfg.max_actors, cfg.max_envs_per_actor, cfg.max_total_envs)
        self.queues = SlotQueues()
        # An actor that follows the staleness valve never has more than its lead
        # queued per slot; anything past this (with slack) is a misbehaving peer.
        self._slot_cap = (
            cfg.effective_max_lead_steps() + cfg.steps_per_broadcast() + cfg.fragment_length
        )
        self.started = False  # training started: later joiners wait for a broadcast
        self.shutting_down = False
        self.current_weights: Weights | None = None
        self._last_heartbeat = 0.0
        # Processes a supervisor saw exit (any thread appends; pump reads). Bounded by
        # what one pump handles: the supervisor reports each exit once.
        self._exited: deque[int] = deque(maxlen=1024)
        self._pump_end = 0.0  # when the previous pump returned
        self._after_busy = True  # this pump follows busy time
        self._busy = 0.0  # seconds outside pump since the last broadcast
        self._cycle_busy: deque[float] = deque(maxlen=CYCLE_WINDOW)
        self._advised: set[int] = set()  # actor ids told which max_lead_steps fits
        self._advice_warnings = 0  # advice given at WARNING (ADVICE_WARNINGS at most)
        # While serve_during runs its work, forget_slots calls wait here: the work (a
        # PPO update) owns the trainer's per-slot state until it returns.
        self._deferred_forget: list[list[SlotKey]] | None = None
        self.sockets = bind_learner_sockets(
            context or zmq.Context.instance(),
            cfg,
            self.max_message_bytes,
            control_max_bytes=self.control_max_bytes,
            rank=rank,
        )
        self.control, self.experience = self.sockets.control, self.sockets.experience
        receiving = [s for s in (self.control, self.experience) if s is not None]
        self.poller = zmq.Poller()
        for sock in receiving:
            self.poller.register(sock, zmq.POLLIN)
        # serve_during's thread also polls a wake socket, so the work's end stops it
        # at once instead of after a poll timeout (made only when the thread is on;
        # always on rank 0 of several learner ranks, which waits in collectives).
        self.serve_thread = cfg.ingest_thread or (world_size > 1 and rank == 0)
        self._wake = self._waker = None
        self._serve_poller = zmq.Poller()
        if self.serve_thread:
            self._wake, self._waker = wake_pair(
                self.experience.context, f"zmq-rl-ingest-{id(self)}"
            )
            for sock in (*receiving, self._wake):
                self._serve_poller.register(sock, zmq.POLLIN)
        log.info("learner %s: run id %s", tcp_endpoint(cfg.host, cfg.port), run_id)

    def close(self) -> None:
        """Close every socket (linger 0)."""
        for sock in (self._wake, self._waker):
            if sock is not None:
                sock.close(linger=0)
        self.sockets.close()

    def serve_during(self, work: Callable[[], T]) -> T:
        """Run ``work()`` on this thread while a thread of the ingest serves both
        receiving sockets (fragments, hellos, heartbeats, byes, evictions), so
        receiving never stops while PPO trains (``ingest_thread``; off: just
        ``work()``). The caller must not touch the sockets, the queues or the
        membership inside ``work``: the thread owns them until it is joined, which
        happens before this returns (the handover is the join, so what the thread
        queued is seen whole). ``forget_slots`` calls made meanwhile are applied after
        the join, because ``work`` owns the trainer's per-slot state. The queues the
        thread fills stay bounded: an actor that obeys its staleness valve has at most
        ``max_lead_steps + steps_per_broadcast + fragment_length`` rows queued per
        slot (the ``over_lead`` cap refuses more), and the version that moves the
        valve changes only outside ``work``.

        The time ``work`` takes counts as the learner's busy time (the valve's lead
        advice), as without the thread: rows arrive, but the version does not move."""
        if not self.serve_thread:
            return work()
        stop = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            try:
                while not stop.is_set():
                    self.pump(POLL_MS, self._serve_poller)
                    while self._wake.poll(0):
                        self._wake.recv()
            except BaseException as exc:  # re-raised on the caller's thread
                failure.append(exc)

        self._deferred_forget = []
        busy, start = self._busy, time.monotonic()
        thread = threading.Thread(target=serve, name="zmq-rl-ingest", daemon=True)
        thread.start()
        try:
            return work()
        finally:
            stop.set()
            with contextlib.suppress(zmq.Again):  # a wake is already waiting
                self._waker.send(b"", zmq.NOBLOCK)
            thread.join()
            deferred, self._deferred_forget = self._deferred_forget, None
            for keys in deferred:
                self.forget_slots(keys)
            end = time.monotonic()
            self._busy = busy + (end - start)
            self._pump_end = end
            if failure:
                raise failure[0]

    def publish(self, weights: Weights, send: bool = True) -> None:
        """Make ``weights`` what welcomes carry and, with ``send``, PUBlish them."""
        self.current_weights = weights
        if send:
            self._cycle_busy.append(self._busy)
            self._busy = 0.0
            self.sockets.weights.send(encode(weights), copy=False)
            self.report.broadcasts_sent += 1
            self.report.last_policy_version = weights.version

    def discard_queued(self, reason: str) -> None:
        """Drop every queued row, counted as ``discarded/steps/<reason>``."""
        queued = self.queues.total_rows()
        if queued:
            self.counters[f"discarded/steps/{reason}"] += queued
            self.queues = SlotQueues()

    def shutdown_actors(self, reason: str) -> None:
        """Tell every actor to stop; collect byes and trailing fragments (bounded)."""
        self.shutting_down = True
        message = Shutdown(reason=reason, run_id=self.run_id)
        for rec in self.members:
            self._send_control(rec.routing_id, message)
        deadline = time.monotonic() + SHUTDOWN_GRACE_S
        while time.monotonic() < deadline:
            # Another rank's actor is caught up there (rank 0 gets only its bye).
            if all(
                rec.said_bye and (rec.rank != self.rank or rec.caught_up()) for rec in self.members
            ):
                break
            self.pump(POLL_MS)
        missing = [rec.actor_id for rec in self.members if not rec.said_bye]
        if missing:
            log.warning("no bye from actor(s) %s within %.1fs", missing, SHUTDOWN_GRACE_S)

    def pump(self, timeout_ms: int, poller: zmq.Poller | None = None) -> None:
        """Handle every message that arrives within ``timeout_ms`` (``poller``: one
        that polls the two receiving sockets and more, :meth:`serve_during`'s).

        Each socket is drained for at most :data:`DRAIN_S`, so a flood on one of them
        can neither starve the other nor delay the rollout check. Silent actors are
        evicted only after what arrived was read: while the learner was busy (a long
        update, an evaluation), live actors' heartbeats queued up and must count.
        """
        start = time.monotonic()
        if self._pump_end:
            self._busy += start - self._pump_end
        self._after_busy = start - self._pump_end > BUSY_GAP_S
        while self._exited:
            self._declare_exited(self._exited.popleft())
        events = dict((poller or self.poller).poll(timeout_ms))
        if self.control in events:
            self._drain(
                lambda: self.control.recv_multipart(zmq.NOBLOCK, copy=False), self._on_control
            )
        if self.experience in events:
            self._drain(lambda: self.experience.recv(zmq.NOBLOCK, copy=False), self._on_experience)
        # After reading: a heartbeat echoes the newest one each actor sent (an actor
        # paused for the link resumes on that echo), also right after a long update.
        self._maybe_heartbeat()
        self._evict_silent_actors()
        if self.sockets.handshakes is not None:  # counted by its thread, copied here
            for kind, count in list(self.sockets.handshakes.failures.items()):
                self.counters[f"auth/handshake_failed/{kind}"] = count
        self._pump_end = time.monotonic()

    @staticmethod
    def _drain(receive: Callable[[], Any], handle: Callable[[Any], None]) -> None:
        """Handle what ``receive`` returns until it raises zmq.Again or DRAIN_S passed."""
        end = time.monotonic() + DRAIN_S
        while time.monotonic() < end:
            try:
                message = receive()
            except zmq.Again:
                return
            handle(message)

    def _reject(self, where: str, reason: str, detail: str) -> None:
        key = f"rejected/{where}/{reason}"
        self.counters[key] += 1
        if self.counters[key] in (1, 10, 100, 1000, 10000, 100000):
            log.warning(
                "rejected %s message #%d (%s): %s", where, self.counters[key], reason, detail
            )

    def _sender_key(self, frame: zmq.Frame) -> str:
        """The CURVE public key (z85) that sent ``frame``; empty without CURVE."""
        if self.sockets.auth is None:
            return ""
        try:
            return frame.get("User-Id") or ""
        except zmq.ZMQError:
            return ""

    def _on_experience(self, frame: zmq.Frame) -> None:
        try:
            fragment = decode(frame.buffer, (Fragment,), self.max_message_bytes)
        except ProtocolError as exc:
            self._reject("experience", exc.reason, str(exc))
            return
        assert isinstance(fragment, Fragment)
        self._admit(fragment, self._sender_key(frame), len(frame.buffer), held_before=False)

    def _admit(self, fragment: Fragment, key: str, size: int, held_before: bool | None) -> None:
        """Check a decoded fragment (:meth:`Membership.admit`) and queue it. On a
        learner rank > 0, one of an actor not planned yet is held (``held_before``
        says whether it was held through a plan already; None: never hold)."""
        try:
            rec, gap = self.members.admit(
                fragment,
                key,
                run_id=self.run_id,
                version=self.version(),
                spaces=self.spaces,
                queued_rows=self.queues.rows,
                slot_cap=self._slot_cap,
                now=time.monotonic(),
                state_size=self.settings.state_size,
            )
        except FragmentRejected as exc:
            if (
                held_before is not None
                and exc.reason == "unknown_actor"
                and self.rank > 0
                and self._held_bytes + size <= HOLD_MAX_BYTES
            ):
                self._held.append((fragment, key, size, held_before))
                self._held_bytes += size
                return
            self._reject("experience", exc.reason, str(exc))
            return
        self._queue(rec, fragment, gap)

    def _queue(self, rec: ActorRecord, fragment: Fragment, gap: int) -> None:
        if gap:
            self.counters["experience/seq_gaps"] += gap
        steps = fragment.length * fragment.num_slots
        self.counters["received/fragments"] += 1
        self.counters["received/steps"] += steps
        if rec.said_bye and not self.shutting_down:
            self.counters["discarded/steps/actor_left"] += steps
            self.counters["discarded/fragments/actor_left"] += 1
            return
        self.queues.push(fragment)

    def _on_control(self, frames: list[zmq.Frame]) -> None:
        if len(frames) != 2:
            self._reject("control", "bad_frames", f"{len(frames)} frames")
            return
        routing_id, frame = frames[0].bytes, frames[1]
        try:
            message = decode(frame.buffer, (Hello, Heartbeat, Bye), self.control_max_bytes)
        except ProtocolVersionMismatch as exc:
            self._reject("control", exc.reason, str(exc))
            self._send_control(routing_id, Refuse("version_mismatch", str(exc)))
            return
        except ProtocolError as exc:
            self._reject("control", exc.reason, str(exc))
            return
        if isinstance(message, Hello):
            self._on_hello(routing_id, message, self._sender_key(frame))
            return
        rec = self.members.sender(routing_id, message.actor_id, message.token)
        if rec is None:
            self._reject("control", "unknown_actor", f"{message.TYPE} from unregistered peer")
            reason = f"actor {message.actor_id} is not registered in run {self.run_id}"
            self._send_control(routing_id, Refuse("reregister", f"{reason}; say hello again"))
            return
        rec.last_seen = time.monotonic()
        if isinstance(message, Heartbeat):
            self._on_heartbeat(rec, message, rec.last_seen)
            return
        if isinstance(message, Bye):
            rec.said_bye = True
            rec.bye_stats = message.stats
            rec.bye_last_seq = message.last_seq
            log.info("actor %d said bye: %s", rec.actor_id, message.stats)
            if not self.shutting_down:
                rec.member = False
                fragments, rows = self.queues.drop_actor(rec.actor_id)
                self.counters["discarded/steps/actor_left"] += rows
                self.counters["discarded/fragments/actor_left"] += fragments

    def _on_hello(self, routing_id: bytes, hello: Hello, key: str = "") -> None:
        problem = check_hello(
            self.members,
            routing_id,
            hello,
            self.cfg.env_id,
            *self.spaces,
            limits=self.limits,
            default_envs=self.settings.num_envs,
        )
        if problem:
            code, reason = problem
            self.counters[f"refused/{code}"] += 1
            log.warning("refused actor from %s pid %d: %s", hello.host, hello.pid, reason)
            self._send_control(routing_id, Refuse(code, reason))
            return
        rec, replaced = self.members.register(
            routing_id,
            hello,
            version=self.version(),
            started=self.started,
            default_envs=self.settings.num_envs,
            now=time.monotonic(),
        )
        rec.key = key  # with CURVE, only this key may send this actor's fragments
        rec.rank = self._assign_rank(rec) if self.world_size > 1 else 0
        for old in replaced:
            self._forget(old, "re-registered")
        self.counters["registered"] += 1
        log.info(
            "actor %d registered from %s pid %d with %d env(s); base version %d%s",
            rec.actor_id,
            hello.host,
            hello.pid,
            rec.num_envs,
            rec.base_version,
            f"; its experience goes to learner rank {rec.rank}" if self.world_size > 1 else "",
        )
        self._send_control(routing_id, self._welcome(rec))

    def _welcome(self, rec: ActorRecord) -> Welcome:
        cfg = self.cfg
        return Welcome(
            actor_id=rec.actor_id,
            run_id=self.run_id,
            token=rec.token,
            base_version=rec.base_version,
            experience_port=cfg.experience_port(rec.rank),
            weights_port=cfg.weights_port(),
            settings=dataclasses.replace(self.settings, num_envs=rec.num_envs),
            weights=self.current_weights,
        )

    def _send_control(self, routing_id: bytes, message: Any) -> bool:
        try:
            self.control.send_multipart([routing_id, encode(message)], zmq.NOBLOCK)
            return True
        except zmq.ZMQError:  # EHOSTUNREACH (peer gone) or EAGAIN (its queue is full)
            self.counters["control/undeliverable"] += 1
            return False

    def _maybe_heartbeat(self) -> None:
        if self.control is None:  # a learner rank > 0: rank 0 heartbeats
            return
        now = time.monotonic()
        if now - self._last_heartbeat < self.settings.heartbeat_interval:
            return
        self._last_heartbeat = now
        for rec in self.members:
            if not rec.said_bye:
                self._send_control(rec.routing_id, self._heartbeat(rec, now))

    def _heartbeat(self, rec: ActorRecord, now: float) -> Heartbeat:
        """The learner's heartbeat to ``rec``: the version, the echo of its newest
        heartbeat and (protocol v2) its base version."""
        echo = rec.peer_sent_at
        fields: dict[str, Any] = dict(
            actor_id=-1,
            run_id=self.run_id,
            version=self.version(),
            sent_at=now,
            echo=echo,
            held=None if echo is None else max(0.0, now - rec.peer_heard_at),
            base_version=rec.base_version,
        )
        return Heartbeat(**fields)

    # ------------------------------------------------------------------ joining

    def delivered(self, rec: ActorRecord) -> bool:
        """Whether every slot of ``rec`` has rows queued (it may join the rollout);
        for another rank's actor, whether that rank said so in its last report."""
        if rec.rank != self.rank:
            return rec.actor_id in self.remote_delivered
        return all(self.queues.rows(key) > 0 for key in rec.slots())

    def take_rollout(self, slots: list[SlotKey], num_steps: int) -> Rollout:
        """Take ``num_steps`` rows of every slot in ``slots`` (all ready) as one rollout
        and count them consumed for their actors (when taken: an actor may leave while
        the update runs)."""
        rollout = self.queues.take(slots, num_steps)
        for actor_id, _ in rollout.slots:
            self.members.get(actor_id).steps_consumed += rollout.num_steps
        return rollout

    def local_member_slots(self) -> list[SlotKey]:
        """The member slots whose rows this learner rank receives."""
        return [
            key
            for rec in self.members
            if rec.member and rec.rank == self.rank
            for key in rec.slots()
        ]

    def _assign_rank(self, new: ActorRecord) -> int:
        """The learner rank with the fewest live slots (the lowest on a tie): where a
        new registration's experience goes, so slots stay spread over the ranks as
        actors join and die."""
        slots = [0] * self.world_size
        for rec in self.members:
            if rec is not new and not rec.said_bye:
                slots[rec.rank] += rec.num_envs
        return min(range(self.world_size), key=lambda r: (slots[r], r))

    def can_admit(self) -> bool:
        """Whether a registration waiting to join may join now (see :meth:`admit_pending`)."""
        return any(self.delivered(r) for r in self.members.pending())

    def admit_pending(self) -> list[ActorRecord]:
        """At a broadcast (the version was just incremented): registrations waiting to
        join become members from this version on: only those that delivered rows for
        every slot (:meth:`delivered`), so a hello that sends nothing
        never makes a rollout wait. Each one left waiting gets ``base_version =
        version + 1`` (the version it can join at), sent at once in a heartbeat, so
        its staleness valve counts from there and stays exact."""
        admitted = self.members.admit_pending(self.delivered)
        now = time.monotonic()
        for rec in self.members.pending():
            rec.base_version = self.version() + 1
            self._send_control(rec.routing_id, self._heartbeat(rec, now))
        return admitted

    # ------------------------------------------------------------------ links

    def _on_heartbeat(self, rec: ActorRecord, beat: Heartbeat, now: float) -> None:
        """An actor's heartbeat: keep its ``sent_at`` to echo, measure the round trip
        (``now - echo - held``, unless busy time came in between) and the valve share."""
        if beat.sent_at is not None:
            rec.peer_sent_at, rec.peer_heard_at = beat.sent_at, now
        if beat.echo is not None and beat.held is not None and not self._after_busy:
            rec.link.add_rtt(now - beat.echo - beat.held)
        if beat.paused is not None and self.started:
            rec.link.add_paused(now, beat.paused, rec.steps_received, rec.num_envs)
            rec.link.suggested_max_lead_steps = self._fitting_lead(rec)
            self._maybe_advise(rec)

    def cycle_time(self) -> float | None:
        """The learner's busy time per broadcast cycle (its updates, and whatever else
        it did outside its receive loop), median over the last cycles; None before the
        first broadcast."""
        return statistics.median(self._cycle_busy) if self._cycle_busy else None

    def _fitting_lead(self, rec: ActorRecord) -> int | None:
        """The ``max_lead_steps`` that covers ``rec``'s round trip, when measured."""
        link, cycle = rec.link, self.cycle_time()
        if link.rtt is None or link.step_rate is None or cycle is None:
            return None
        return fitting_max_lead_steps(
            steps_per_broadcast=self.settings.steps_per_broadcast,
            fragment_length=self.settings.fragment_length,
            step_rate=link.step_rate,
            round_trip=link.rtt,
            cycle_time=cycle,
        )

    def _maybe_advise(self, rec: ActorRecord) -> None:
        """Once per actor: when its valve holds it more than PAUSED_ADVICE_SHARE of the
        time, log which ``max_lead_steps`` would fit its round trip."""
        link, suggested = rec.link, rec.link.suggested_max_lead_steps
        if (
            rec.actor_id in self._advised
            or suggested is None
            or link.paused_samples < ADVICE_MIN_SAMPLES
            or (link.paused_share or 0.0) <= PAUSED_ADVICE_SHARE
        ):
            return
        self._advised.add(rec.actor_id)
        current = self.settings.max_lead_steps
        facts = (
            f"actor {rec.actor_id} ({rec.host} pid {rec.pid}) is held paused by the staleness "
            f"valve {100 * (link.paused_share or 0.0):.0f}% of the time; round trip "
            f"{1e3 * (link.rtt or 0.0):.0f} ms, {link.step_rate or 0.0:,.0f} steps/s per slot "
            f"while running, learner busy {1e3 * (self.cycle_time() or 0.0):.0f} ms per "
            f"broadcast cycle"
        )
        if suggested > current + self.settings.fragment_length:  # more than rounding
            self._advice_warnings += 1
            loud = self._advice_warnings <= ADVICE_WARNINGS
            last = self._advice_warnings == ADVICE_WARNINGS
            (log.warning if loud else log.info)(
                "%s: --max-lead-steps %d would cover its round trip (now %d; "
                "steps_per_broadcast + rate * (round trip + learner busy time), "
                "see docs/multi-host.md 'Long links')%s",
                facts,
                suggested,
                current,
                " [further actors' advice is logged at INFO; the metrics row's "
                "links/suggested_max_lead_steps has the largest]"
                if last
                else "",
            )
        else:
            log.info(
                "%s: --max-lead-steps %d already covers its round trip (%d would do); "
                "the learner, not the link, holds it",
                facts,
                current,
                suggested,
            )

    def link_stats(self) -> dict[str, float]:
        """Aggregate link figures over the registered actors, for the metrics row (only
        the measured ones): ``links/rtt_ms_max``, ``links/rtt_ms_mean``,
        ``links/valve_paused_share_max``, ``links/valve_paused_share_mean`` and
        ``links/suggested_max_lead_steps`` (the largest suggestion)."""
        links = [rec.link for rec in self.members if not rec.said_bye]
        rtts = [1e3 * link.rtt for link in links if link.rtt is not None]
        shares = [link.paused_share for link in links if link.paused_share is not None]
        leads = [
            link.suggested_max_lead_steps
            for link in links
            if link.suggested_max_lead_steps is not None
        ]
        out: dict[str, float] = {}
        if rtts:
            out["links/rtt_ms_max"] = max(rtts)
            out["links/rtt_ms_mean"] = sum(rtts) / len(rtts)
        if shares:
            out["links/valve_paused_share_max"] = max(shares)
            out["links/valve_paused_share_mean"] = sum(shares) / len(shares)
        if leads:
            out["links/suggested_max_lead_steps"] = float(max(leads))
        return out

    def _evict_silent_actors(self) -> None:
        """Declare dead every actor silent for ``actor_timeout``: its slots leave the
        rollout being filled and what it had queued is discarded (counted). Drop
        every registration that has not joined and has sent nothing for
        :data:`PENDING_SILENCE_INTERVALS` heartbeat intervals (one line per pump)."""
        if self.shutting_down:
            return
        now, timeout = time.monotonic(), self.cfg.actor_timeout
        silence = min(timeout, PENDING_SILENCE_INTERVALS * self.settings.heartbeat_interval)
        dropped = self.members.drop_silent_pending(now, silence) if self.rank == 0 else []
        if dropped:
            self.counters["actors/dropped_silent"] += len(dropped)
            ids = [rec.actor_id for rec in dropped]
            log.warning(
                "dropped %d registration(s) that sent nothing for %.1fs and had not joined "
                "the rollout: actor id(s) %s%s",
                *(len(ids), silence, ids[:10], " ..." if len(ids) > 10 else ""),
            )
            for rec in dropped:
                self._forget(rec, "dropped_silent")
        short = self.queues.short_slots(self.local_member_slots(), self.cfg.num_steps)
        short_ids = {a for a, _ in short}
        # A rank > 0 hears no heartbeats: only "no fragment while waited on" applies.
        for rec, why in self.members.evict_silent(now, timeout, short_ids, self.rank == 0):
            log.warning(
                "actor %d (%s pid %d) %s > actor_timeout=%gs: declared dead",
                *(rec.actor_id, rec.host, rec.pid, why, timeout),
            )
            self.report.dead_actors.append(
                rec.death_line(now, self.report.updates_completed, self.version())
            )
            self.counters["actors/declared_dead"] += 1
            self._forget(rec, "actor_dead")

    def actor_exited(self, pid: int) -> None:
        """A supervisor saw the process ``pid`` (on this host) exit: its registration
        is declared dead at the next pump instead of after ``actor_timeout``. Safe to
        call from any thread."""
        self._exited.append(pid)

    def _declare_exited(self, pid: int) -> None:
        host = socket.gethostname()[:200]
        for rec in self.members:
            if rec.pid == pid and rec.host == host and not rec.said_bye:
                log.warning(
                    "actor %d (%s pid %d): its process exited: declared dead",
                    *(rec.actor_id, rec.host, rec.pid),
                )
                self.report.dead_actors.append(
                    rec.death_line(time.monotonic(), self.report.updates_completed, self.version())
                )
                self.counters["actors/declared_dead"] += 1
                self._forget(self.members.remove(rec.actor_id), "actor_dead")

    # ------------------------------------------------------------------ learner ranks

    def plan_actors(self) -> list[list[Any]]:
        """Rank 0: every registration as the plan tells the other ranks: the
        :data:`PLAN_FIELDS` of each record (see :meth:`apply_plan`)."""
        return [[getattr(rec, name) for name in PLAN_FIELDS] for rec in self.members]

    def apply_plan(self, actors: list[list[Any]]) -> None:
        """Rank > 0: make this rank's registrations rank 0's (:meth:`plan_actors`):
        forget those rank 0 no longer has (their queued rows are counted as
        discarded), add the new ones, take membership and base versions; then check
        the fragments held for actors that were not planned yet. A fragment held
        through a whole plan without its actor appearing is rejected (``unknown_actor``)."""
        now = time.monotonic()
        entries = (dict(zip(PLAN_FIELDS, values, strict=True)) for values in actors)
        planned = {e["actor_id"]: e for e in entries if e["rank"] == self.rank}
        for rec in self.members:
            entry = planned.get(rec.actor_id)
            if entry is None or entry["token"] != rec.token:
                self._forget(self.members.remove(rec.actor_id), "actor_left_rank")
        for actor_id, entry in planned.items():
            rec = self.members.get(actor_id)
            if rec is None:
                rec = ActorRecord(
                    **entry, routing_id=b"", last_seen=now, last_fragment=now, registered_at=now
                )
                self.members.actors[actor_id] = rec
            for name in PLAN_UPDATED:
                setattr(rec, name, entry[name])
        held, self._held, self._held_bytes = list(self._held), deque(), 0
        for fragment, key, size, retried in held:
            self._admit(fragment, key, size, held_before=None if retried else True)

    def rank_report(self) -> dict[str, Any]:
        """Rank > 0: what rank 0 needs of this rank's actors after a fill: per actor
        [steps received, fragments received, steps consumed, delivered every slot],
        and the actors this rank declared dead since the last report."""
        dead = self.report.dead_actors[self._reported_dead :]
        self._reported_dead = len(self.report.dead_actors)
        return {
            "actors": {
                r.actor_id: [
                    r.steps_received,
                    r.fragments_received,
                    r.steps_consumed,
                    self.delivered(r),
                ]
                for r in self.members
            },  # fmt: skip
            "dead": dead,
        }

    def apply_rank_report(self, report: dict[str, Any]) -> None:
        """Rank 0: take another rank's :meth:`rank_report`: its actors' counts, which
        waiting ones delivered, and its declared deaths (removed here, so the next plan
        and the heartbeats agree)."""
        for actor_id, (received, fragments, consumed, delivered) in report["actors"].items():
            rec = self.members.get(actor_id)
            if rec is None:
                continue
            rec.steps_received, rec.fragments_received = received, fragments
            rec.steps_consumed = consumed
            (self.remote_delivered.add if delivered else self.remote_delivered.discard)(actor_id)
        for line in report["dead"]:
            rec = self.members.get(line["actor_id"])
            if rec is None:
                continue
            log.warning("actor %d (%s pid %d) declared dead by its learner rank %d",
                        rec.actor_id, rec.host, rec.pid, rec.rank)  # fmt: skip
            self.report.dead_actors.append(line)
            self.counters["actors/declared_dead"] += 1
            self._forget(self.members.remove(rec.actor_id), "actor_dead")

    def _forget(self, rec: ActorRecord, reason: str) -> None:
        """Discard (and count) what a removed actor had queued; keep its report line."""
        if self._deferred_forget is not None:  # serve_during's work owns the trainer
            self._deferred_forget.append(rec.slots())
        else:
            self.forget_slots(rec.slots())  # its unfinished episodes lost rows
        fragments, rows = self.queues.drop_actor(rec.actor_id)
        if rows:
            self.counters[f"discarded/steps/{reason}"] += rows
            self.counters[f"discarded/fragments/{reason}"] += fragments
        self.report.departed_actors.append({**rec.summary(), "left_because": reason})
