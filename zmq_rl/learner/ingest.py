"""The learner's receiving side: sockets, decode, membership, slot queues, control.

:class:`Ingest` binds the learner's three sockets, reads fragments into the per-slot
queues (every check in :meth:`~zmq_rl.learner.membership.Membership.admit`), serves hello,
heartbeat and bye on the control socket, sends heartbeats, evicts silent actors,
welcomes, publishes weights and shuts the actors down. Its
:class:`~zmq_rl.learner.links.Links` measures each actor's link from the heartbeats
(round trip, valve share, the lead advice). It holds no RL object: the
:class:`~zmq_rl.learner.loop.Learner` asks it for rollouts' rows and tells it the policy
version (a callable) and what to forget when an actor leaves.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import zmq

from ..config import LearnerConfig
from ..rl.rollout import Rollout, SlotKey
from ..sparse_log import log_sparsely
from ..wire.protocol import (
    Bye,
    Fragment,
    Heartbeat,
    Hello,
    ProtocolError,
    Refuse,
    RunSettings,
    Shutdown,
    Weights,
    Welcome,
    decode,
    encode,
    largest_fragment_bytes,
    policy_weights_frames,
)
from ..wire.spaces import space_spec
from ..wire.transport import LearnerSockets, bind_learner_sockets, tcp_endpoint
from ..wire.valve import slot_cap
from .evictions import PENDING_SILENCE_INTERVALS, Evictions
from .links import Links
from .membership import (
    ActorRecord,
    FragmentRejected,
    Membership,
    MembershipLimits,
    check_hello,
    control_refusal,
)
from .queues import SlotQueues
from .report import LearnerReport
from .serve_thread import ServingThread
from .serve_thread import wake_pair as wake_pair  # importable here as before

__all__ = ["Ingest", "IngestObserver", "RankPart"]

log = logging.getLogger("zmq_rl.ingest")

T = TypeVar("T")

DRAIN_S = 0.005
"""Longest one socket is read in one go (fairness under floods)."""
POLL_MS = 50
"""Longest a poll blocks, so timers (heartbeats, timeouts) run on time."""
SHUTDOWN_GRACE_S = 3.0
"""How long the learner waits for every actor's bye after asking them to stop."""
PENDING_SILENCE_INTERVALS = PENDING_SILENCE_INTERVALS  # re-exported (defined in evictions)


CONTROL_SLACK_BYTES = 128 * 1024
"""Room in the control message limit beyond the spaces and the per-slot lists: ids,
host and env names, a bye's stats (a legitimate one is under 2 KB)."""


def largest_control_bytes(observation_space: Any, action_space: Any, max_envs: int) -> int:
    """The learner's control message limit (ROUTER ``ZMQ_MAXMSGSIZE``): twice what
    a legitimate hello (both space specs, up to ``max_envs`` per-slot integers) or bye
    can be for the run's spaces, plus :data:`CONTROL_SLACK_BYTES`. A hello of other
    spaces larger than that costs its sender the connection instead of a
    ``space_mismatch`` refusal; anything bigger is never legitimate."""
    import msgpack

    specs = len(msgpack.packb([space_spec(observation_space), space_spec(action_space)]))
    return 2 * (specs + 9 * max_envs) + CONTROL_SLACK_BYTES


def fragment_limit(cfg: LearnerConfig, observation_space: Any, action_space: Any) -> int:
    """The largest experience message the learner takes (its PULL's ``ZMQ_MAXMSGSIZE``,
    the welcome's ``max_fragment_bytes``): ``max_message_bytes``, or by default what a
    fragment of ``fragment_length`` rows of these spaces can be."""
    return cfg.max_message_bytes or largest_fragment_bytes(
        observation_space, action_space, cfg.fragment_length
    )


def bind_ingest_sockets(
    cfg: LearnerConfig,
    observation_space: Any,
    action_space: Any,
    context: zmq.Context | None = None,
) -> LearnerSockets:
    """Bind the sockets of rank 0's :class:`Ingest` for a run of these spaces, with its
    message limits (:func:`fragment_limit`, :func:`largest_control_bytes`). Imports no
    torch: ``zmq-rl run`` binds here and starts its actors before the learner imports
    torch and builds its trainer (docs/design.md §10, "Start-up"), then hands the
    sockets to the :class:`~zmq_rl.learner.loop.Learner`. OSError naming the ports when
    one is taken, as :func:`~zmq_rl.wire.transport.bind_learner_sockets`."""
    limits = (
        fragment_limit(cfg, observation_space, action_space),
        largest_control_bytes(observation_space, action_space, cfg.max_envs_per_actor),
    )
    return _own_sockets(None, context, cfg, limits, rank=0)


def _own_sockets(
    sockets: LearnerSockets | None,
    context: zmq.Context | None,
    cfg: LearnerConfig,
    limits: tuple[int, int],
    rank: int,
) -> LearnerSockets:
    """An :class:`Ingest`'s sockets: ``sockets`` when they were bound before it
    (:func:`bind_ingest_sockets`; ValueError when they take other message sizes than
    its run's ``limits`` = (experience, control) bytes: they were bound for another
    config), else bound now."""
    if sockets is None:
        fragments, control = limits
        ctx = context or zmq.Context.instance()
        return bind_learner_sockets(ctx, cfg, fragments, control_max_bytes=control, rank=rank)
    control_sock = sockets.control
    bound = (
        sockets.experience.getsockopt(zmq.MAXMSGSIZE),
        None if control_sock is None else control_sock.getsockopt(zmq.MAXMSGSIZE),
    )
    if bound != limits:
        raise ValueError(
            f"sockets bound with message limits {bound} (experience, control); this "
            f"run's are {limits}"
        )
    return sockets


class RankPart(Protocol):
    """What :class:`Ingest` asks of its part of the learner-ranks protocol when there
    are several learner ranks (:class:`zmq_rl.learner.ranks.RankRouting`)."""

    def assign_rank(self, members: Membership, new: ActorRecord) -> int:
        """Rank 0: the learner rank a new registration's experience goes to."""
        ...

    def delivered_elsewhere(self, rec: ActorRecord) -> bool:
        """Rank 0: whether another rank's actor delivered every slot (its last report)."""
        ...

    def hold(self, fragment: Fragment, key: str, size: int, held_before: bool) -> bool:
        """Rank > 0: keep a fragment of an actor not planned yet; False: reject it."""
        ...


class IngestObserver(Protocol):
    """Public hooks for a tool that watches what the learner receives (the conformance
    tool, :mod:`zmq_rl.conformance.actor`): called after each message is handled."""

    def on_experience(self, fragment: Fragment | None, rejected: str | None) -> None:
        """An experience frame: the fragment (None: it did not decode) and the reason
        it was rejected (None: it was queued or held)."""
        ...

    def on_control(self, message: Hello | Heartbeat | Bye, rec: ActorRecord | None) -> None:
        """A decoded control message: a hello with the record it registered (None:
        refused), or a heartbeat or bye with its sender's record (None: unknown)."""
        ...


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
        ranks: RankPart | None = None,
        sockets: LearnerSockets | None = None,
    ) -> None:
        self.cfg = cfg
        # Data-parallel learner ranks (num_learners): rank 0 serves control and
        # registers every actor; rank r > 0 only receives its actors' fragments.
        # ``ranks`` is this ingest's part of their protocol (learner/ranks.py).
        if (world_size > 1) != (ranks is not None):
            raise ValueError(f"world_size={world_size} needs a ranks part exactly when > 1")
        self.rank, self.world_size, self.ranks = rank, world_size, ranks
        self.observer: IngestObserver | None = None  # public hooks (conformance tool)
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
        self._slot_cap = slot_cap(settings)  # past it, a peer ignores its staleness valve
        self.started = False  # training started: later joiners wait for a broadcast
        # Rows batches (learner/batches.py): every registration's rows count at once,
        # and actors that announced grants get one (welcome, heartbeats).
        self.admit_at_once = False
        self.grant_for: Callable[[ActorRecord, Hello], int | None] | None = None
        self.sent_cap: Callable[[ActorRecord], int] | None = None  # the over_lead rule
        self.on_publish: Callable[[], None] | None = None  # after each broadcast
        self.shutting_down = False
        self.current_weights: Weights | None = None
        self.sent_weights: tuple[Weights, list[Weights]] | None = None  # last on PUB
        self.current_policy_weights: list[Weights] = []  # several policies: each one's
        self._last_heartbeat = 0.0
        self.evictions = Evictions(self)  # silent, dropped and exited actors
        self.links = Links(settings, lambda: self.started)  # round trips, the lead advice
        # While serve_during runs its work, forget_slots calls wait here: the work (a
        # PPO update) owns the trainer's per-slot state until it returns.
        self._deferred_forget: list[list[SlotKey]] | None = None
        limits = (self.max_message_bytes, self.control_max_bytes)
        self.sockets = _own_sockets(sockets, context, cfg, limits, rank)
        self.control, self.experience = self.sockets.control, self.sockets.experience
        receiving = [s for s in (self.control, self.experience) if s is not None]
        self.poller = zmq.Poller()
        for sock in receiving:
            self.poller.register(sock, zmq.POLLIN)
        # serve_during's thread: on by default with ingest_thread, and always on rank 0
        # of several learner ranks, which waits in collectives.
        by_default = cfg.ingest_thread or (world_size > 1 and rank == 0)
        self.serving = ServingThread(self, by_default, POLL_MS)
        log.info("learner %s: run id %s", tcp_endpoint(cfg.host, cfg.port), run_id)

    def close(self) -> None:
        """Close every socket (linger 0)."""
        self.serving.close()
        self.sockets.close()

    def serve_during(self, work: Callable[[], T], thread: bool | None = None) -> T:
        """Run ``work()`` on this thread while a thread of the ingest serves both
        receiving sockets (fragments, hellos, heartbeats, byes, evictions), so
        receiving never stops while PPO trains (``thread``, by default
        ``ingest_thread``; off: just ``work()``; :class:`~zmq_rl.learner.serve_thread.
        ServingThread`). The caller must not touch the sockets, the queues or the
        membership inside ``work``: the thread owns them until it is joined, which
        happens before this returns (the handover is the join, so what the thread
        queued is seen whole). ``forget_slots`` calls made meanwhile are applied after
        the join, because ``work`` owns the trainer's per-slot state. The queues the
        thread fills stay bounded: an actor that obeys its staleness valve has at most
        :func:`~zmq_rl.wire.valve.slot_cap` rows queued per slot (the ``over_lead``
        cap refuses more), and the version that moves the valve changes only outside
        ``work``.

        The time ``work`` takes counts as the learner's busy time (the valve's lead
        advice), as without the thread: rows arrive, but the version does not move."""
        return self.serving.during(work, thread)

    @property
    def serve_thread(self) -> bool:
        """Whether :meth:`serve_during` serves on a thread unless told (``ingest_thread``)."""
        return self.serving.by_default

    def defer_forgetting(self) -> None:
        """From now on ``forget_slots`` calls wait (the serving thread's work owns the
        trainer's per-slot state) until :meth:`forget_deferred`."""
        self._deferred_forget = []

    def forget_deferred(self) -> None:
        """Apply the ``forget_slots`` calls that waited since :meth:`defer_forgetting`."""
        deferred, self._deferred_forget = self._deferred_forget or [], None
        for keys in deferred:
            self.forget_slots(keys)

    def publish(self, weights: Weights | list[Weights], send: bool = True) -> None:
        """Make ``weights`` what welcomes carry and, with ``send``, PUBlish them (a list
        of several policies' weights: each on its own topic, docs/protocol.md 4.9)."""
        several = weights if isinstance(weights, list) and len(weights) > 1 else []
        self.current_weights = first = weights[0] if isinstance(weights, list) else weights
        self.current_policy_weights = several
        if send:
            self.links.cycle_ended()
            send_weights(self.sockets.weights, first, several)
            self.sent_weights = (first, several)
            self.report.broadcasts_sent += 1
            self.report.last_policy_version = first.version
            if self.on_publish is not None:
                self.on_publish()

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
            self.send_control(rec.routing_id, message)
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
        update, an evaluation), live actors' heartbeats queued up and must count (a
        backlog longer than one drain is read by the next pumps first; under a flood
        that never drains, evictions still run once a heartbeat interval).
        """
        self.links.pump_started(time.monotonic())
        self.evictions.declare_exited()
        events = dict((poller or self.poller).poll(timeout_ms))
        read_all = True  # every socket drained: nothing that arrived is left unread
        if self.control in events:
            read_all &= _drain(
                lambda: self.control.recv_multipart(zmq.NOBLOCK, copy=False), self._on_control
            )
        if self.experience in events:
            read_all &= _drain(
                lambda: self.experience.recv(zmq.NOBLOCK, copy=False), self._on_experience
            )
        # After reading: a heartbeat echoes the newest one each actor sent (an actor
        # paused for the link resumes on that echo), also right after a long update.
        self._maybe_heartbeat()
        self.evictions.evict_silent(read_all)
        if self.sockets.handshakes is not None:  # counted by its thread, copied here
            for kind, count in list(self.sockets.handshakes.failures.items()):
                self.counters[f"auth/handshake_failed/{kind}"] = count
        self.links.pump_ended(time.monotonic())

    def _reject(self, where: str, reason: str, detail: str, token: bytes | None = None) -> None:
        """Count a rejected message and log it sparsely; one of a registration the
        evictions removed (its ``token``, told to register again) at DEBUG only."""
        key = f"rejected/{where}/{reason}"
        self.counters[key] += 1
        count = self.counters[key]
        forgotten = reason == "unknown_actor" and self.evictions.forgotten(token) is not None
        level = logging.DEBUG if forgotten else logging.WARNING
        log_sparsely(log, count, level, "rejected %s message #%d (%s): %s",
                     where, count, reason, detail)  # fmt: skip

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
            if self.observer is not None:
                self.observer.on_experience(None, exc.reason)
            return
        assert isinstance(fragment, Fragment)
        rejected = self.admit_fragment(
            fragment, self._sender_key(frame), len(frame.buffer), held_before=False
        )
        if self.observer is not None:
            self.observer.on_experience(fragment, rejected)

    def admit_fragment(
        self, fragment: Fragment, key: str, size: int, held_before: bool | None
    ) -> str | None:
        """Check a decoded fragment (:meth:`Membership.admit`) and queue it; return the
        reason it was rejected (None: queued or held). On a learner rank > 0, one of an
        actor not planned yet is held (``held_before`` says whether it was held through
        a plan already; None: never hold)."""
        try:
            rec, gap = self.members.admit(
                fragment,
                key,
                run_id=self.run_id,
                version=self.version(),
                spaces=self.spaces,
                queued_rows=self.queues.rows,
                slot_cap=self._slot_cap,
                received_rows=self.queues.received,
                sent_cap=self.sent_cap,
                now=time.monotonic(),
                state_size=self.settings.state_size,
                agents_per_env=self.settings.agents_per_env,
            )
        except FragmentRejected as exc:
            if (
                held_before is not None
                and exc.reason == "unknown_actor"
                and self.ranks is not None
                and self.ranks.hold(fragment, key, size, held_before)
            ):
                return None
            self._reject("experience", exc.reason, str(exc), fragment.token)
            return exc.reason
        self._queue(rec, fragment, gap)
        return None

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
        except ProtocolError as exc:  # another version, or a hello that waits: say why
            self._reject("control", exc.reason, str(exc))
            if refusal := control_refusal(frame.buffer, exc, self.control_max_bytes):
                self.send_control(routing_id, refusal)
            return
        if isinstance(message, Hello):
            rec = self._on_hello(routing_id, message, self._sender_key(frame))
            if self.observer is not None:
                self.observer.on_control(message, rec)
            return
        rec = self.members.sender(routing_id, message.actor_id, message.token)
        if self.observer is not None:
            self.observer.on_control(message, rec)
        if rec is None:
            if isinstance(message, Heartbeat) and message.run_id != self.run_id:
                self.counters["control/other_run"] += 1  # left in flight by a restart (5.6)
            else:
                detail = f"{message.TYPE} from unregistered peer"
                self._reject("control", "unknown_actor", detail, message.token)
            reason = f"actor {message.actor_id} is not registered in run {self.run_id}"
            self.send_control(routing_id, Refuse("reregister", f"{reason}; say hello again"))
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

    def _on_hello(self, routing_id: bytes, hello: Hello, key: str = "") -> ActorRecord | None:
        """Register and welcome the sender of ``hello`` (its record), or refuse it (None)."""
        problem = check_hello(
            self.members,
            routing_id,
            hello,
            self.cfg.env_id,
            *self.spaces,
            limits=self.limits,
            default_envs=self.settings.num_envs,
            policy_map=self.settings.policy_map,
            agents_per_env=self.settings.agents_per_env,
        )
        if problem:
            code, reason = problem
            self.counters[f"refused/{code}"] += 1
            log.warning("refused actor from %s pid %d: %s", hello.host, hello.pid, reason)
            self.send_control(routing_id, Refuse(code, reason))
            return None
        rec, replaced = self.members.register(
            routing_id,
            hello,
            version=self.version(),
            started=self.started and not self.admit_at_once,
            default_envs=self.settings.num_envs,
            now=time.monotonic(),
        )
        rec.grant = None if self.grant_for is None else self.grant_for(rec, hello)
        rec.key = key  # with CURVE, only this key may send this actor's fragments
        rec.rank = self.ranks.assign_rank(self.members, rec) if self.ranks is not None else 0
        for old in replaced:
            self.forget_actor(old, "re-registered")
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
        self.send_control(routing_id, self._welcome(rec))
        if self.admit_at_once and self.started:  # rows batches: no broadcast to wait for
            log.info("actor %d joins the rollout at version %d", rec.actor_id, self.version())
        return rec

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
            policy_weights=self.current_policy_weights,
            grant=rec.grant,
        )

    def send_control(self, routing_id: bytes, message: Any) -> bool:
        """Send ``message`` to one peer's control socket now; False if it cannot go."""
        try:
            self.control.send_multipart([routing_id, encode(message)], zmq.NOBLOCK)
            return True
        except zmq.ZMQError:  # EHOSTUNREACH (peer gone) or EAGAIN (its queue is full)
            self.counters["control/undeliverable"] += 1
            return False

    def send_heartbeat(self, rec: ActorRecord) -> None:
        """Send ``rec`` a heartbeat now (a grant that rose goes out at once)."""
        self.send_control(rec.routing_id, self._heartbeat(rec, time.monotonic()))

    def _maybe_heartbeat(self) -> None:
        if self.control is None:  # a learner rank > 0: rank 0 heartbeats
            return
        now = time.monotonic()
        if now - self._last_heartbeat < self.settings.heartbeat_interval:
            return
        self._last_heartbeat = now
        for rec in self.members:
            if not rec.said_bye:
                self.send_control(rec.routing_id, self._heartbeat(rec, now))

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
            grant=rec.grant,
        )
        return Heartbeat(**fields)

    # ------------------------------------------------------------------ joining

    def delivered(self, rec: ActorRecord) -> bool:
        """Whether every slot of ``rec`` has rows queued (it may join the rollout);
        for another rank's actor, whether that rank said so in its last report."""
        if rec.rank != self.rank:
            return self.ranks is not None and self.ranks.delivered_elsewhere(rec)
        return all(self.queues.rows(key) > 0 for key in rec.slots())

    def take_rollout(
        self, slots: list[SlotKey], num_steps: int, lengths: list[int] | None = None
    ) -> Rollout:
        """Take ``num_steps`` rows (or ``lengths[b]`` for column ``b``) of every slot in
        ``slots`` (all queued) as one rollout and count them consumed for their actors
        (when taken: an actor may leave while the update runs)."""
        lengths = lengths or [num_steps] * len(slots)
        rollout = self.queues.take(slots, num_steps, lengths)
        not_valid = sum(lengths) - rollout.env_steps  # the padding was never received
        if not_valid:  # received, never trained on (the ledger of protocol 7.3)
            self.counters["discarded/steps/not_valid"] += not_valid
        for b, (actor_id, _) in enumerate(rollout.slots):
            self.members.get(actor_id).steps_consumed += lengths[b]
        return rollout

    def local_member_slots(self) -> list[SlotKey]:
        """The member slots whose rows this learner rank receives."""
        return [
            key
            for rec in self.members
            if rec.member and rec.rank == self.rank
            for key in rec.slots()
        ]

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
            self.send_control(rec.routing_id, self._heartbeat(rec, now))
        return admitted

    # ------------------------------------------------------------------ links

    def _on_heartbeat(self, rec: ActorRecord, beat: Heartbeat, now: float) -> None:
        """An actor's heartbeat: keep its ``sent_at`` to echo; the link measures the
        rest (:meth:`Links.on_heartbeat <zmq_rl.learner.links.Links.on_heartbeat>`)."""
        if beat.sent_at is not None:
            rec.peer_sent_at, rec.peer_heard_at = beat.sent_at, now
        rec.beats.add(now if beat.sent_at is None else beat.sent_at)  # its silence limit
        self.links.on_heartbeat(rec, beat, now)
        sent = self.sent_weights  # never weights made current without a send
        if sent is not None and self.links.weights_overdue(beat, sent[0].version, now):
            send_weights(self.sockets.weights, *sent)
            self.counters["weights/republished"] += 1

    def actor_exited(self, pid: int) -> None:
        """A supervisor saw the process ``pid`` (on this host) exit: its registration
        is declared dead at the next pump instead of after ``actor_timeout``. Safe to
        call from any thread."""
        self.evictions.exited.append(pid)

    def forget_actor(self, rec: ActorRecord, reason: str) -> None:
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


def _drain(receive: Callable[[], Any], handle: Callable[[Any], None]) -> bool:
    """Handle what ``receive`` returns until it raises zmq.Again (True: all read) or
    DRAIN_S passed (False: more may wait)."""
    end = time.monotonic() + DRAIN_S
    while time.monotonic() < end:
        try:
            message = receive()
        except zmq.Again:
            return True
        handle(message)
    return False


def send_weights(socket: zmq.Socket, weights: Weights, several: list[Weights]) -> None:
    """PUBlish ``weights`` (or, in a run of several policies, each of ``several`` on
    its own topic, docs/protocol.md 4.9)."""
    for frames in [policy_weights_frames(w) for w in several] or [[encode(weights)]]:
        socket.send_multipart(frames, copy=False)
