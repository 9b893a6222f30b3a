"""The learner's receiving side: sockets, decode, membership, slot queues, control.

:class:`Ingest` binds the learner's three sockets, reads fragments into the per-slot
queues (every check in :meth:`~zmq_rl.membership.Membership.admit`), serves hello,
heartbeat and bye on the control socket, sends heartbeats, evicts silent actors,
welcomes, publishes weights and shuts the actors down. It holds no RL object: the
:class:`~zmq_rl.learner.Learner` asks it for rollouts' rows and tells it the policy
version (a callable) and what to forget when an actor leaves.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

import zmq

from .config import LearnerConfig
from .membership import (
    ActorRecord,
    FragmentRejected,
    Membership,
    MembershipLimits,
    check_hello,
)
from .protocol import (
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
    largest_fragment_bytes,
)
from .report import LearnerReport
from .rollout import SlotKey, SlotQueues
from .transport import bind_learner_sockets, tcp_endpoint

__all__ = ["Ingest"]

log = logging.getLogger(__name__)

DRAIN_S = 0.005
"""Longest one socket is read in one go (fairness under floods)."""
POLL_MS = 50
"""Longest a poll blocks, so timers (heartbeats, timeouts) run on time."""
SHUTDOWN_GRACE_S = 3.0
"""How long the learner waits for every actor's bye after asking them to stop."""


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
    ) -> None:
        self.cfg = cfg
        self.settings = settings
        self.spaces = (settings.observation_space, settings.action_space)
        self.run_id = run_id
        self.report = report
        self.counters = counters
        self.version = version
        self.forget_slots = forget_slots
        self.max_message_bytes = cfg.max_message_bytes or largest_fragment_bytes(
            *self.spaces, cfg.fragment_length
        )
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
        self.sockets = bind_learner_sockets(
            context or zmq.Context.instance(), cfg, self.max_message_bytes
        )
        self.control, self.experience = self.sockets.control, self.sockets.experience
        self.poller = zmq.Poller()
        self.poller.register(self.control, zmq.POLLIN)
        self.poller.register(self.experience, zmq.POLLIN)
        log.info("learner %s: run id %s", tcp_endpoint(cfg.host, cfg.port), run_id)

    def close(self) -> None:
        """Close every socket (linger 0)."""
        self.sockets.close()

    def publish(self, weights: Weights, send: bool = True) -> None:
        """Make ``weights`` what welcomes carry and, with ``send``, PUBlish them."""
        self.current_weights = weights
        if send:
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
            if all(rec.said_bye and rec.caught_up() for rec in self.members):
                break
            self.pump(POLL_MS)
        missing = [rec.actor_id for rec in self.members if not rec.said_bye]
        if missing:
            log.warning("no bye from actor(s) %s within %.1fs", missing, SHUTDOWN_GRACE_S)

    def pump(self, timeout_ms: int) -> None:
        """Handle every message that arrives within ``timeout_ms``.

        Each socket is drained for at most :data:`DRAIN_S`, so a flood on one of them
        can neither starve the other nor delay the rollout check. Silent actors are
        evicted only after what arrived was read: while the learner was busy (a long
        update, an evaluation), live actors' heartbeats queued up and must count.
        """
        self._maybe_heartbeat()
        while self._exited:
            self._declare_exited(self._exited.popleft())
        events = dict(self.poller.poll(timeout_ms))
        if self.control in events:
            self._drain(
                lambda: self.control.recv_multipart(zmq.NOBLOCK, copy=False), self._on_control
            )
        if self.experience in events:
            self._drain(lambda: self.experience.recv(zmq.NOBLOCK, copy=False), self._on_experience)
        self._evict_silent_actors()

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
            assert isinstance(fragment, Fragment)
            rec, gap = self.members.admit(
                fragment,
                self._sender_key(frame),
                run_id=self.run_id,
                version=self.version(),
                spaces=self.spaces,
                queued_rows=self.queues.rows((fragment.actor_id, fragment.slot)),
                slot_cap=self._slot_cap,
                now=time.monotonic(),
            )
        except (ProtocolError, FragmentRejected) as exc:
            self._reject("experience", exc.reason, str(exc))
            return
        if gap:
            self.counters["experience/seq_gaps"] += gap
        self.counters["received/fragments"] += 1
        self.counters["received/steps"] += fragment.length
        if rec.said_bye and not self.shutting_down:
            self.counters["discarded/steps/actor_left"] += fragment.length
            self.counters["discarded/fragments/actor_left"] += 1
            return
        self.queues.push(fragment)

    def _on_control(self, frames: list[zmq.Frame]) -> None:
        if len(frames) != 2:
            self._reject("control", "bad_frames", f"{len(frames)} frames")
            return
        routing_id, frame = frames[0].bytes, frames[1]
        try:
            message = decode(frame.buffer, (Hello, Heartbeat, Bye), self.max_message_bytes)
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
        rec = self.members.sender(routing_id, message.actor_id)
        if rec is None:
            self._reject("control", "unknown_actor", f"{message.TYPE} from unregistered peer")
            reason = f"actor {message.actor_id} is not registered in run {self.run_id}"
            self._send_control(routing_id, Refuse("reregister", f"{reason}; say hello again"))
            return
        rec.last_seen = time.monotonic()
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
        for old in replaced:
            self._forget(old, "re-registered")
        self.counters["registered"] += 1
        log.info(
            "actor %d registered from %s pid %d with %d env(s); base version %d",
            rec.actor_id,
            hello.host,
            hello.pid,
            rec.num_envs,
            rec.base_version,
        )
        self._send_control(routing_id, self._welcome(rec))

    def _welcome(self, rec: ActorRecord) -> Welcome:
        cfg = self.cfg
        return Welcome(
            actor_id=rec.actor_id,
            run_id=self.run_id,
            base_version=rec.base_version,
            experience_port=cfg.experience_port(),
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
        now = time.monotonic()
        if now - self._last_heartbeat < self.settings.heartbeat_interval:
            return
        self._last_heartbeat = now
        beat = Heartbeat(actor_id=-1, run_id=self.run_id, version=self.version())
        for rec in self.members:
            if not rec.said_bye:
                self._send_control(rec.routing_id, beat)

    def _evict_silent_actors(self) -> None:
        """Declare dead every actor silent for ``actor_timeout``: its slots leave the
        rollout being filled and what it had queued is discarded (counted)."""
        if self.shutting_down:
            return
        now, timeout = time.monotonic(), self.cfg.actor_timeout
        short = self.queues.short_slots(self.members.member_slots(), self.cfg.num_steps)
        for rec, why in self.members.evict_silent(now, timeout, {a for a, _ in short}):
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

    def _forget(self, rec: ActorRecord, reason: str) -> None:
        """Discard (and count) what a removed actor had queued; keep its report line."""
        self.forget_slots(rec.slots())  # its unfinished episodes lost rows
        fragments, rows = self.queues.drop_actor(rec.actor_id)
        if rows:
            self.counters[f"discarded/steps/{reason}"] += rows
            self.counters[f"discarded/fragments/{reason}"] += fragments
        self.report.departed_actors.append({**rec.summary(), "left_because": reason})
