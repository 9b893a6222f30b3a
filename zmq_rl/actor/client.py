"""ActorClient: the socket side of any actor, built-in or embedded in a simulator.

The built-in gymnasium actor (:mod:`zmq_rl.actor.gym_actor`) is written on this API alone;
a simulator with its own main loop uses it the same way::

    client = ActorClient("learner-host:5555", env_id="MySim", observation_space=obs_space,
                         action_space=act_space, num_envs=1)
    welcome = client.register()               # blocks (bounded) until welcome or refusal
    policy.load(welcome.weights)
    while not client.shutdown_requested:
        if (weights := client.poll()) is not None:   # never blocks
            policy.load(weights)
        if client.should_pause():                    # staleness valve
            if (weights := client.wait_for_weights(0.05)) is not None:
                policy.load(weights)
            continue
        ... act, step the simulation ...
        client.step(obs, actions, rewards, terminated, truncated, values, log_probs, next_obs)
    client.close(stats)

The client is the connection (register, control, heartbeats, the weights version);
its :attr:`ActorClient.sender` (:class:`~zmq_rl.actor.sender.ExperienceSender`) is the
experience side (lockstep buffer, fragments, back-pressure, the staleness valve) and
its :attr:`ActorClient.subscriber` (:class:`~zmq_rl.actor.subscriber.WeightsSubscriber`)
reads the weights broadcast, newest first.
No RL here: the client moves arrays and counts steps; it never looks inside them.

**Link checks** (toward a learner whose heartbeats carry ``sent_at``; docs/protocol.md
sections 4.6 and 5.5): the client answers every learner heartbeat and *pauses for the
link* (:meth:`ActorClient.should_pause` says True, nothing new is sent) when the learner
may have lost it; :class:`~zmq_rl.actor.link.LinkHealth` (:mod:`zmq_rl.actor.link`)
decides when. In a run of several policies, :class:`~zmq_rl.actor.subscriber.PolicyVersions`
follows each policy's version.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket as pysocket
import time
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Self

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from ..sparse_log import log_sparsely
from ..wire.codec import (
    MAX_ABS_VALUE,
    finite_problem,
    first_bad_row,
    magnitude_problem,
    named_leaves,
)
from ..wire.protocol import (
    FEATURE_GRANTS,
    PROTOCOL_VERSION,
    Bye,
    Heartbeat,
    Hello,
    Message,
    ProtocolError,
    ProtocolVersionMismatch,
    Refuse,
    RunSettings,
    Shutdown,
    StepArrays,
    Weights,
    Welcome,
    decode,
    encode,
    space_spec,
    weights_topic,
)
from ..wire.transport import (
    ACTOR_PUSH_LINGER_MS,
    EXPERIENCE_HWM,
    HANDSHAKE_FAILED_EVENTS,
    WEIGHTS_HWM,
    CurveClientKeys,
    SocketOptions,
    apply_curve_client,
    handshake_failure,
    make_socket,
    parse_learner_address,
    readable,
    tcp_endpoint,
)
from .keepalive import KeepAlive
from .link import LINK_SILENCE_INTERVALS as LINK_SILENCE_INTERVALS  # importable here as before
from .link import LinkHealth
from .sender import ExperienceSender
from .subscriber import PolicyVersions, WeightsSubscriber, named

log = logging.getLogger("zmq_rl.client")

DEFAULT_MAX_RECEIVE_BYTES = 256 * 1024 * 1024
"""The weights SUB's limit (ZMQ_MAXMSGSIZE) when the learner announces none (a
protocol-v1 welcome) and the client was given no ``max_message_bytes``."""
UNLIMITED_DECODE_BYTES = 1 << 40
"""What ``decode`` allows on the control socket when the client has no limit."""
STALE_WEIGHTS_INTERVALS = 5.0
"""Heartbeat intervals the learner may announce a newer version than the loaded one
before the actor subscribes to the weights again (WeightsSubscriber.check)."""


class LearnerRefused(RuntimeError):
    """The learner refused this actor's registration; ``code`` says why."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(f"learner refused registration ({code}): {reason}")
        self.code = code
        self.reason = reason


def _plainly_sendable(steps: StepArrays, next_obs: Any) -> bool:
    """The per-step fast path of the send-side check: True when ``steps`` and
    ``next_obs`` are plain arrays whose values the learner accepts (finite, rewards,
    values and log-probs within ``MAX_ABS_VALUE``); False sends the step through the
    full check (:meth:`ActorClient._check_sendable`), which names what is wrong."""
    for array in (steps.rewards, steps.values, steps.log_probs):
        if type(array) is not np.ndarray or not np.abs(array).max(initial=0) <= MAX_ABS_VALUE:
            return False  # NaN compares False
    for array in (steps.obs, steps.actions, next_obs):
        if type(array) is not np.ndarray:
            return False
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            return False
    return True


class BadExperience(ValueError):
    """A step holds a value the learner would refuse the whole fragment for (NaN or
    inf anywhere, a reward, value or log-prob past ``MAX_ABS_VALUE``: its
    ``not_finite`` / ``out_of_range``). Raised by :meth:`ActorClient.step` and
    :meth:`ActorClient.send_fragment` before anything is buffered; ``field``,
    ``slot`` and ``step`` (the slot's step since the welcome, from 1) say where."""

    def __init__(self, field: str, slot: int, step: int, problem: str) -> None:
        super().__init__(
            f"slot {slot}, step {step} since the welcome: {problem}; the learner would "
            f"refuse the whole fragment (not_finite / out_of_range), so it is not sent"
        )
        self.field = field
        self.slot = slot
        self.step = step


class LearnerUnreachable(TimeoutError):
    """No answer from the learner within the allowed time."""


class InvalidWelcome(LearnerUnreachable):
    """The learner answered, but no answer was a valid welcome of this hello within the
    allowed time; the message says what was wrong with the last one."""


class LearnerLost(TimeoutError):
    """The learner has been silent for longer than ``learner_timeout``."""


class Handshake:
    """A registration's wait on the control channel: send the hello, read the answers
    until its welcome comes, within a deadline.

    ``control`` is the connected DEALER and ``monitor`` its monitor of failed CURVE
    handshakes; ``where`` names the learner in errors; ``max_bytes`` limits an answer;
    ``reject(where, error)`` counts and logs an answer that does not decode or fit.
    """

    def __init__(
        self,
        control: zmq.Socket,
        monitor: zmq.Socket,
        where: str,
        max_bytes: int,
        reject: Callable[[str, ProtocolError], None],
    ) -> None:
        self.control = control
        self.monitor = monitor
        self.where = where
        self.max_bytes = max_bytes
        self._reject = reject
        self.invalid = ""
        """Why the last answer refused during this handshake was invalid ("" if none)."""

    def reject(self, where: str, error: ProtocolError) -> None:
        """Count and log an answer that does not decode or fit, and remember why: a
        handshake that then times out says so (:class:`InvalidWelcome`)."""
        self.invalid = str(error)
        self._reject(where, error)

    def await_welcome(self, hello: Hello, timeout: float, any_id: bool) -> Welcome:
        """Send ``hello`` and wait up to ``timeout`` seconds for its welcome
        (:meth:`_welcome_for`). ``any_id``: the caller asked for no id, so an id in
        ``hello`` is one an earlier welcome gave; when the learner has given it away,
        say hello again with any id. Raises :class:`LearnerRefused` (a refusal, a
        failed CURVE handshake, another protocol version) and
        :class:`LearnerUnreachable`."""
        frame, unsent = encode(hello), True
        deadline = time.monotonic() + timeout
        poller = zmq.Poller()
        poller.register(self.control, zmq.POLLIN)
        poller.register(self.monitor, zmq.POLLIN)
        while True:
            if unsent:
                unsent = not self._send_now(frame)
            events = self._wait(poller, deadline, unsent)
            if self.monitor in events:
                event = recv_monitor_message(self.monitor)
                raise LearnerRefused("auth_failed", handshake_failure(event, self.where))
            if self.control not in events:
                if time.monotonic() < deadline:
                    continue
                if self.invalid:
                    raise InvalidWelcome(
                        f"no valid welcome from learner at {self.where} within {timeout:.1f}s: "
                        f"it answered, but not as this actor's protocol says ({self.invalid})"
                    )
                raise LearnerUnreachable(
                    f"no welcome from learner at {self.where} within {timeout:.1f}s"
                )
            answer = self._read(self.control.recv())
            if self._id_given_away(answer, hello, any_id):
                log.info("actor id %d was given away: registering with any free id", hello.actor_id)
                hello.actor_id = -1
                frame, unsent = encode(hello), True
            elif (welcome := self._welcome_for(hello, answer)) is not None:
                return welcome

    def _send_now(self, frame: bytes) -> bool:
        """Whether the control socket took ``frame`` now. Never blocks: a refused
        CURVE handshake leaves no pipe to queue it on."""
        try:
            self.control.send(frame, zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    @staticmethod
    def _wait(poller: zmq.Poller, deadline: float, unsent: bool) -> dict[Any, int]:
        """The sockets of ``poller`` readable within the time left until ``deadline``
        (50 ms at most while the hello waits to leave); none once it has passed."""
        remaining = deadline - time.monotonic()
        wait_ms = int(remaining * 1000) + 1 if not unsent else min(50, int(remaining * 1000) + 1)
        return dict(poller.poll(wait_ms)) if remaining > 0 else {}

    def _read(self, frame: bytes) -> Message | None:
        """An answer read from the control socket; None (counted and logged) when it
        does not decode. Raises :class:`LearnerRefused` when it speaks another protocol."""
        try:
            return decode(frame, max_bytes=self.max_bytes)
        except ProtocolVersionMismatch as exc:
            raise LearnerRefused(
                "version_mismatch",
                f"the learner answered in protocol {exc.theirs!r}; "
                f"this actor speaks {PROTOCOL_VERSION}",
            ) from None
        except ProtocolError as exc:
            self.reject("control", exc)
            return None

    @staticmethod
    def _id_given_away(answer: Message | None, hello: Hello, any_id: bool) -> bool:
        """Whether ``answer`` refuses ``hello``'s id as in use while that id came from an
        earlier welcome (``any_id``): the actor was declared dead meanwhile and the
        learner gave its id to someone else."""
        return (
            any_id
            and isinstance(answer, Refuse)
            and answer.code == "duplicate_id"
            and hello.actor_id >= 0
        )

    def _welcome_for(self, hello: Hello, answer: Message | None) -> Welcome | None:
        """``answer`` if it is the welcome of ``hello``: one giving exactly the slots
        asked for (docs/protocol.md 4.3; another number is counted as
        ``control:bad_field`` and ignored). Raises :class:`LearnerRefused` for a
        refusal; None for the rest (heartbeats, a stale shutdown, a ``reregister``
        answering an earlier heartbeat: this hello already answers those)."""
        if isinstance(answer, Refuse) and answer.code != "reregister":
            raise LearnerRefused(answer.code, answer.reason)
        if not isinstance(answer, Welcome):
            return None
        slots = answer.settings.num_envs
        if hello.num_envs and slots != hello.num_envs:
            self.reject(
                "control",
                ProtocolError(
                    "bad_field",
                    f"welcome.config.num_envs: {slots}, the hello asked for "
                    f"{hello.num_envs} (a learner gives exactly that or refuses)",
                ),
            )
            return None
        return answer


class LearnerConnection:
    """The control side of an actor: register, serve control and heartbeats, follow
    the weights version. :class:`ActorClient` adds the experience API on top."""

    def __init__(
        self,
        learner: str,
        *,
        env_id: str,
        observation_space: Any,
        action_space: Any,
        num_envs: int = 1,
        actor_id: int = -1,
        context: zmq.Context | None = None,
        register_timeout: float = 30.0,
        learner_timeout: float = 60.0,
        max_message_bytes: int = 0,
        curve: CurveClientKeys | None = None,
        weights_check: Callable[[Weights], None] | None = None,
        features: Sequence[str] = (),
    ) -> None:
        self.host, self.control_port = parse_learner_address(learner)
        self.features = list(dict.fromkeys([*features, FEATURE_GRANTS]))
        """What this actor can do beyond protocol 2's core, said in its hello
        (``"policies"``: it runs several policies; ``"grants"``, always: its valve
        follows a learner's grants; docs/protocol.md)."""
        self.policies = PolicyVersions()
        self.env_id = env_id
        self.observation_space = observation_space
        self.action_space = action_space
        self.num_envs = int(num_envs)
        self.requested_id = int(actor_id)
        self.register_timeout = float(register_timeout)
        self.learner_timeout = float(learner_timeout)
        self.needs_reregister = False
        self.registrations = 0
        self.curve = curve
        self.weights_check = weights_check
        """Called with weights of this run before the client adopts their version (a
        broadcast, or the welcome of a registration again into the same run); raising
        (``WeightsMismatch``, ``ValueError``) refuses them: counted as
        ``weights:wrong_tensors``, logged, and the version does not move. The
        :class:`~zmq_rl.actor.agent.Agent` and the inference server check against their
        network (:func:`zmq_rl.rl.policy.check_weights`)."""
        self._welcome_refused = False
        self._monitor: zmq.Socket | None = None
        self._version_before = 0
        self.max_message_bytes = int(max_message_bytes)
        self._ctx = context or zmq.Context.instance()
        self._control: zmq.Socket | None = None
        self.welcome: Welcome | None = None
        self.actor_id = -1
        self.run_id = ""
        self.version = 0
        self.learner_version = 0  # the newest version the learner's heartbeats announced
        self._announced = 0  # the same, from this registration's heartbeats only
        self.settings: RunSettings | None = None
        self._open: np.ndarray | None = None  # slots whose last row was valid, not ended
        self.heartbeat_interval = 1.0
        self.shutdown_requested = False
        self.shutdown_reason = ""
        self.rejects: Counter[str] = Counter()
        self.stats: dict[str, float] = {"policy_updates_received": 0, "last_policy_version": 0}
        self.sender = ExperienceSender(self.stats, self.rejects, self._wait_for_room, self.num_envs)
        self.subscriber = WeightsSubscriber(
            self.rejects, self._reject, self.max_message_bytes or DEFAULT_MAX_RECEIVE_BYTES
        )
        self.last_heard = time.monotonic()
        self.link = LinkHealth(self.stats, self.sender, self.last_heard)

    @property
    def link_paused_since(self) -> float | None:
        """Monotonic time the client paused for the link; None while it is not paused."""
        return self.link.paused_since

    @property
    def config(self) -> dict[str, Any]:
        """Deprecated: the welcome's settings as an untyped map; use :attr:`settings`."""
        warnings.warn(
            "ActorClient.config is deprecated; use ActorClient.settings (a RunSettings)",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.settings.to_map() if self.settings is not None else {}

    @property
    def fragment_length(self) -> int:
        """Steps per fragment, as the welcome said (1 before registration)."""
        return self.sender.fragment_length

    # ------------------------------------------------------------------ lifecycle

    def register(self, timeout: float | None = None) -> Welcome:
        """Say hello and wait for the welcome; connect the data sockets.

        Returns the :class:`Welcome` (its ``weights`` are the current policy).
        Raises :class:`LearnerRefused` when the learner says no (wrong protocol
        version, mismatched env spaces, an id in use) and
        :class:`LearnerUnreachable` when nothing answers within ``timeout``
        (:class:`InvalidWelcome`, a subclass, when answers came and none was a valid
        welcome: the message says what was wrong).
        """
        timeout = self.register_timeout if timeout is None else timeout
        where = tcp_endpoint(self.host, self.control_port)
        if self._control is None:
            options = SocketOptions(linger_ms=500, max_message_bytes=self.max_message_bytes or -1)
            self._control = self._socket(zmq.DEALER, options)
            self._monitor = self._control.get_monitor_socket(HANDSHAKE_FAILED_EVENTS)
            self._control.connect(where)
        handshake = Handshake(
            self._control, self._monitor, where, self._control_limit(), self._reject
        )
        welcome = handshake.await_welcome(self._hello(), timeout, any_id=self.requested_id < 0)
        self._accept(welcome)
        return welcome

    def _hello(self) -> Hello:
        """What this actor says to register: its id (the one it has, else the one it
        asks for), env, spaces and slots, and the run it was in (``rejoin_run_id``)."""
        spaces = [
            {} if s is None else space_spec(s) for s in (self.observation_space, self.action_space)
        ]
        return Hello(
            actor_id=self.requested_id if self.actor_id < 0 else self.actor_id,
            env_id=self.env_id,
            observation_space=spaces[0],
            action_space=spaces[1],
            num_envs=self.num_envs,
            host=pysocket.gethostname()[:200],
            pid=os.getpid(),
            rejoin_run_id=self.run_id,
            features=self.features,
        )

    def _socket(self, kind: int, options: SocketOptions) -> zmq.Socket:
        sock = make_socket(self._ctx, kind, options)
        if self.curve is not None:
            apply_curve_client(sock, self.curve)
        return sock

    def _accept(self, welcome: Welcome) -> None:
        # A welcome back into the same run whose weights do not fit: registered, but
        # the loaded weights and their version stay (as for a refused broadcast).
        self._welcome_refused = (
            self.registrations > 0
            and welcome.run_id == self.run_id
            and not all(self._weights_fit(w) for w in welcome.policy_weights or [welcome.weights])
        )
        self.welcome = welcome
        self.registrations += 1
        self.needs_reregister = False
        if self.registrations > 1:
            self.stats["reregistrations"] = self.registrations - 1
        self.actor_id = welcome.actor_id
        self.run_id = welcome.run_id
        settings = self.settings = welcome.settings
        self._open = None
        if self.observation_space is None:
            self.observation_space = settings.observation_space
            self.action_space = settings.action_space
        if not self._welcome_refused:
            self._version_before = self.version
            self.version = welcome.weights.version
            self.policies.start(welcome.policy_weights)
        self.num_envs = settings.num_envs
        self.heartbeat_interval = settings.heartbeat_interval
        self.last_heard = time.monotonic()
        self.link.restart(self.last_heard)
        push = self._socket(
            zmq.PUSH, SocketOptions(linger_ms=ACTOR_PUSH_LINGER_MS, sndhwm=EXPERIENCE_HWM)
        )
        push.connect(tcp_endpoint(self.host, welcome.experience_port))
        self.sender.start(
            push,
            settings,
            actor_id=self.actor_id,
            run_id=self.run_id,
            token=welcome.token,
            base_version=welcome.base_version,
            observation_space=self.observation_space,
            action_space=self.action_space,
            grant=welcome.grant,
        )
        self.learner_version, self._announced = self.version, 0
        self.subscriber.max_message_bytes = self._weights_limit(settings)
        endpoint = tcp_endpoint(self.host, welcome.weights_port)
        self.subscriber.start(
            self._weights_socket(endpoint), lambda: self._weights_socket(endpoint)
        )
        log.info(
            "registered as actor %d of run %s (version %d, base version %d)",
            *(self.actor_id, self.run_id, self.version, welcome.base_version),
        )

    def _control_limit(self) -> int:
        return self.max_message_bytes or UNLIMITED_DECODE_BYTES

    def _weights_limit(self, settings: RunSettings) -> int:
        """The weights SUB's message limit: the largest weights frame the learner
        announced (``max_weights_bytes``, protocol v2), capped by an explicit
        ``max_message_bytes`` (with a warning when that is too small to receive them);
        256 MiB when neither says."""
        announced = int(getattr(settings, "max_weights_bytes", 0) or 0)
        if self.max_message_bytes:
            if announced > self.max_message_bytes:
                log.warning(
                    "the learner publishes weights of up to %d bytes, over this actor's "
                    "max_message_bytes=%d: broadcasts that large will not arrive (each "
                    "one costs the weights connection; leave max_message_bytes at 0 to "
                    "follow the learner)",
                    announced,
                    self.max_message_bytes,
                )
            return self.max_message_bytes
        return announced or DEFAULT_MAX_RECEIVE_BYTES

    def _weights_socket(self, endpoint: str) -> zmq.Socket:
        """A SUB connected to the learner's weights ``endpoint``, subscribed to all
        (several policies: to the topic of each policy of the run), taking frames up
        to the subscriber's limit (:meth:`_weights_limit`)."""
        sub = self._socket(
            zmq.SUB,
            SocketOptions(rcvhwm=WEIGHTS_HWM, max_message_bytes=self.subscriber.max_message_bytes),
        )
        policies = self.settings.policy_ids if self.settings is not None else []
        for topic in [weights_topic(pid) for pid in policies] or [b""]:
            sub.setsockopt(zmq.SUBSCRIBE, topic)  # several policies: each one run here
        sub.connect(endpoint)
        return sub

    def close(self, extra_stats: Mapping[str, float] | None = None) -> None:
        """Say bye with the counters (plus ``extra_stats``) and close every socket."""
        if self._control is not None and self.actor_id >= 0:
            stats = {
                k: float(v)
                for k, v in {**self.stats, **(extra_stats or {})}.items()
                if isinstance(v, (int, float)) and math.isfinite(v)
            }
            bye = Bye(
                actor_id=self.actor_id,
                token=self.sender.token,
                stats=stats,
                last_seq=self.sender.last_seq,
            )
            try:
                self._control.send(encode(bye), zmq.NOBLOCK)
            except zmq.ZMQError:
                log.warning("could not send bye to the learner")
        if self._control is not None:
            self._control.disable_monitor()
        self.sender.close()
        self.subscriber.close()
        for sock in (self._control, self._monitor):
            if sock is not None:
                sock.close()
        self._control = self._monitor = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ receiving

    def weights_ready(self) -> bool:
        """Whether :meth:`poll` holds more weights to return without reading a socket
        (several policies: the other policies' weights of the same reading)."""
        return bool(self.policies.fresh)

    def poll(self) -> Weights | None:
        """Handle control messages and return the newest unseen weights, if any.

        Never blocks while the learner is there. When several weight blobs are
        queued the newest that is newer than the loaded version and fits
        (:attr:`weights_check`) is returned, decoded and checked newest first,
        only as far as needed (refused ones move nothing); the caller must load it
        before its next step (the client tags later fragments with its version).
        In a run of several policies each call returns one policy's weights: call
        again while :meth:`weights_ready` (the client's version is the oldest of
        the policies' versions, so no row is tagged newer than its policy).

        When the learner restarted (a new run id, or it no longer knows this
        actor) the client registers again, blocking up to ``register_timeout``,
        and returns the new welcome's weights. Raises :class:`LearnerLost` when
        the learner has been silent for ``learner_timeout`` seconds.
        """
        if (held := self.policies.take()) is not None:
            return held
        self._poll_control()
        if self.needs_reregister:
            self.link.log_reregister()
            self.sender.close(linger=0)  # what it queued can only be refused (protocol 5.6)
            welcome = self.register()
            if self._welcome_refused:
                return None
            self.policies.hold(welcome.policy_weights[1:])
            return welcome.weights
        self.link.check_silence(time.monotonic(), self.heartbeat_interval)
        self._check_learner_alive("no message from the learner")
        self._maybe_heartbeat()
        stale_after = STALE_WEIGHTS_INTERVALS * self.heartbeat_interval
        if self.subscriber.check(self.version, self.learner_version, stale_after):
            self.stats["weights_resubscriptions"] = self.subscriber.resubscriptions
        if not self.subscriber.pending():
            return None
        if self.policies.several:
            return self._adopt_policies(self.subscriber.newest_each(self.run_id))
        weights = self.subscriber.newest(self.run_id, self.version, self._weights_fit)
        if self.subscriber.saw_other_run:
            self.needs_reregister = True
        if weights is None:
            return None
        self.last_heard = time.monotonic()
        self._adopt_version(weights.version)
        return weights

    def _adopt_policies(self, candidates: list[list[Weights]]) -> Weights | None:
        """Several policies: take each policy's newest weights that are new and fit;
        the client's version becomes the oldest policy's. Returns the first of them
        (the others wait in :meth:`weights_ready`)."""
        if self.subscriber.saw_other_run:
            self.needs_reregister = True
        first = self.policies.adopt(candidates, self._weights_fit)
        if first is None:
            return None
        self.last_heard = time.monotonic()
        oldest = self.policies.oldest()
        if oldest > self.version:
            self._adopt_version(oldest)
        return first

    def _adopt_version(self, weights_version: int) -> None:
        """Weights of ``weights_version`` are what the actor acts with from now on."""
        self.link.check_weights(weights_version)
        self.flush()  # rows collected under the old version leave tagged with it
        self._version_before = self.version
        self.version = weights_version
        self.stats["policy_updates_received"] += 1
        self.stats["last_policy_version"] = weights_version

    def wait_for_weights(self, timeout: float) -> Weights | None:
        """Block up to ``timeout`` seconds for new weights (or a control message)."""
        if self.subscriber.socket is None or self._control is None:
            raise RuntimeError("register() first")
        poller = zmq.Poller()
        poller.register(self.subscriber.socket, zmq.POLLIN)
        poller.register(self._control, zmq.POLLIN)
        poller.poll(int(timeout * 1000))
        return self.poll()

    def serve_control(self, timeout: float = 0.0) -> None:
        """Wait up to ``timeout`` seconds for a control message, handle what came (a
        learner heartbeat, a shutdown, a ``refuse reregister``: noted for the next
        :meth:`poll`) and send a heartbeat when one is due. Reads no weights and never
        registers again: what a long pause (building envs) needs to stay alive."""
        if self._control is None:
            raise RuntimeError("register() first")
        if timeout > 0:
            self._control.poll(int(timeout * 1000))
        self._poll_control()
        self._maybe_heartbeat()

    def reject_weights(self, weights: Weights, error: Exception) -> None:
        """Undo accepting ``weights`` the policy could not load (wrong tensors): the
        client (and their policy's version) goes back to the older version it had,
        counts and logs the rejection naming the version. (A client given a
        ``weights_check`` refuses such weights before it adopts them.)"""
        self.policies.undo(weights)
        back = self.policies.oldest(default=self._version_before)
        if self.version == weights.version and back < self.version:
            self.version = back
            self.stats["policy_updates_received"] -= 1
            self.stats["last_policy_version"] = self.version
            self.learner_version = min(self.learner_version, max(self.version, self._announced))
        self._reject("weights", ProtocolError("wrong_tensors", f"{named(weights)}: {error}"))

    def _weights_fit(self, weights: Weights) -> bool:
        """Run :attr:`weights_check` on ``weights``; False (counted and logged as
        ``weights:wrong_tensors``, naming the version) when it refuses them."""
        if self.weights_check is None:
            return True
        try:
            self.weights_check(weights)
        except (ValueError, TypeError) as exc:  # WeightsMismatch is a ValueError
            self._reject("weights", ProtocolError("wrong_tensors", f"{named(weights)}: {exc}"))
            return False
        return True

    def _poll_control(self) -> None:
        sock = self._control
        while sock is not None and readable(sock):
            try:
                message = decode(sock.recv(), max_bytes=self._control_limit())
            except ProtocolError as exc:
                self._reject("control", exc)
                continue
            if isinstance(message, Shutdown):
                if message.run_id in ("", self.run_id):
                    self.link.heard(time.monotonic())
                    self.shutdown_requested = True
                    self.shutdown_reason = message.reason
                    log.info("learner requested shutdown: %s", message.reason)
            elif isinstance(message, Heartbeat):
                self._on_heartbeat(message)
            elif isinstance(message, Refuse) and message.code == "reregister":
                self.last_heard = time.monotonic()
                self.link.heard(self.last_heard)
                self.needs_reregister = True
            else:
                self.rejects["control:unexpected_type"] += 1

    def _on_heartbeat(self, message: Heartbeat) -> None:
        """A learner heartbeat: liveness, a new run, the version it announces, the
        actor's base version, the link fields (:meth:`LinkHealth.on_heartbeat`)."""
        now = time.monotonic()
        self.last_heard = now
        if message.run_id != self.run_id:
            self.needs_reregister = True
            return
        self.learner_version = max(self.learner_version, message.version)
        self._announced = max(self._announced, message.version)
        if message.base_version is not None:
            self.sender.rebase(message.base_version)
        if message.grant is not None:
            self.sender.regrant(message.grant)
        self.link.on_heartbeat(message, now)

    def _maybe_heartbeat(self) -> None:
        """Send a heartbeat when one is due (:meth:`LinkHealth.heartbeat_due`)."""
        now = time.monotonic()
        if self._control is None or not self.link.heartbeat_due(now, self.heartbeat_interval):
            return
        beat = Heartbeat(
            actor_id=self.actor_id,
            token=self.sender.token,
            run_id=self.run_id,
            version=self.version,
            **self.link.heartbeat_fields(now),
        )
        with contextlib.suppress(zmq.Again):  # a full queue already tells the learner enough
            self._control.send(encode(beat), zmq.NOBLOCK)

    def _reject(self, where: str, exc: ProtocolError) -> None:
        self.rejects[f"{where}:{exc.reason}"] += 1
        count = self.rejects[f"{where}:{exc.reason}"]
        log_sparsely(log, count, logging.WARNING, "rejected a %s message (%s): %s",
                     where, exc.reason, exc)  # fmt: skip


class ActorClient(LearnerConnection):
    """Register with a learner, send experience, receive weights and control.

    ``num_envs`` slots step in lockstep through :meth:`step` (0: as many as the
    learner's welcome says); :meth:`send_fragment` sends any T >= 1 steps of one
    slot directly. Counters for the ``bye`` message are kept in :attr:`stats`;
    :attr:`settings` holds the welcome's :class:`~zmq_rl.wire.protocol.RunSettings`.
    The experience side is :attr:`sender` (:class:`~zmq_rl.actor.sender.ExperienceSender`).
    """

    def keepalive(self) -> KeepAlive:
        """A :class:`~zmq_rl.actor.keepalive.KeepAlive` that runs :meth:`serve_control`
        on a thread once started: ``with client.keepalive(): build_the_sim()`` keeps a
        registration alive while the caller's thread is busy (use nothing of the
        client inside; docs/protocol.md §5.5: heartbeats from the welcome on)."""
        return KeepAlive(self.serve_control)

    def should_pause(self) -> bool:
        """Whether to wait instead of stepping: the staleness valve says wait for newer
        weights (see :meth:`ExperienceSender.should_pause`; a pausing client flushes
        first), the client is paused for the link (see the module's "Link checks"),
        or it must register again (the next :meth:`poll` does)."""
        now = time.monotonic()
        if self.needs_reregister or self.link_paused_since is not None:
            self.link.valve.note(False, now)
            return True
        # Several policies: each one's version v proves the same consumption, so the
        # newest loaded counts (a dropped publication of one must not hold the actor).
        proven = self.policies.newest(default=self.version)
        paused = self.sender.should_pause(max(proven, self.version))
        self.link.valve.note(paused, now)
        return paused

    def step(
        self,
        obs: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        values: np.ndarray,
        log_probs: np.ndarray,
        next_obs: np.ndarray,
        final_obs: Mapping[int, np.ndarray] | None = None,
        state: np.ndarray | None = None,
        version: int | None = None,
        valid: np.ndarray | None = None,
    ) -> None:
        """Record one step of every slot (arrays with leading dim ``num_envs``).

        ``obs`` is what the actions were taken in (a dict/tuple of such arrays for a
        structured observation space); ``next_obs`` what the envs returned (the reset
        observation where an episode ended). ``final_obs`` maps each slot whose
        episode was truncated (not terminated) to the true last observation of that
        episode. ``state`` (recurrent policies only: ``[num_envs, state_size]``) is
        the policy state each slot acted from. The buffered rows of every slot are
        sent once ``fragment_length`` steps are buffered. ``version`` is the policy
        version that chose ``actions`` when that is older than the loaded one (weights
        arrived between acting and recording, as in ``zmq-rl serve``): the step is then
        sent at once, tagged with it, since a row's version is never newer than the
        weights that acted (docs/protocol.md section 4.1.2). ``valid`` (multi-agent
        slots, ``[num_envs]`` bool; None: all) is False for a slot that held no live
        agent in this step: its row has reward 0 and ends nothing, and the slot's
        previous row, if valid, ended its episode (section 4.1.4); ValueError
        otherwise, naming the slot.
        """
        # Not coerced: the sender's buffer converts each row as it stores it.
        steps = StepArrays(obs, actions, rewards, terminated, truncated, values, log_probs)
        valid = self._rows_valid(valid, steps)
        if not _plainly_sendable(steps, next_obs):
            self._check_sendable(steps, next_obs, self._slot_step)
        for slot, last in (final_obs or {}).items():
            self._check_sendable(None, last, lambda _, s=int(slot): self._slot_step(s), True)
        if version is not None and version < self.version:
            self.sender.flush(self.version)
            self.sender.step(steps, next_obs, final_obs, version, state, valid)
            self.sender.flush(version)
            return
        self.sender.step(steps, next_obs, final_obs, self.version, state, valid)

    def _rows_valid(self, valid: Any, steps: StepArrays) -> np.ndarray | None:
        """``valid`` as ``[num_envs]`` bool (None: every slot valid), checked against
        the rules of docs/protocol.md section 4.1.4."""
        if valid is None:  # single-agent callers: nothing to check, nothing to keep
            self._open = None
            return None
        ended = np.asarray(steps.terminated, bool) | np.asarray(steps.truncated, bool)
        valid = np.asarray(valid, bool).reshape(-1)
        if valid.shape != ended.shape:
            raise ValueError(f"valid: shape {list(valid.shape)}, expected [{ended.shape[0]}]")
        if self.settings is not None and self.settings.agents_per_env == 1 and not valid.all():
            raise ValueError(
                "valid: rows that are not valid need a learner that reads them (its welcome "
                "says agents_per_env > 1, docs/protocol.md section 4.1.4); this one does not"
            )
        rewards = np.asarray(steps.rewards)
        open_before = self._open if self._open is not None else np.zeros_like(valid)
        for slot in np.flatnonzero(~valid):
            if rewards[slot] != 0 or ended[slot]:
                raise ValueError(
                    f"slot {slot}: a row that is not valid must have reward 0 and end nothing "
                    f"(reward {float(rewards[slot])}, ended {bool(ended[slot])})"
                )
            if open_before[slot]:
                raise ValueError(
                    f"slot {slot}: its previous row did not end its episode, so this row must "
                    "be valid (an agent's last valid row carries terminated or truncated)"
                )
        self._open = valid & ~ended
        return valid

    def flush(self) -> None:
        """Send whatever :meth:`step` has buffered now (a partial fragment)."""
        self.sender.flush(self.version)

    def send_fragment(
        self,
        slot: int,
        *arrays: np.ndarray,
        final_obs: Mapping[int, np.ndarray] | None = None,
        state: np.ndarray | None = None,
        **named: np.ndarray,
    ) -> None:
        """Send T >= 1 consecutive steps of one slot now (rows are time).

        The arrays are :meth:`step`'s, in its order or by its names (``obs, actions,
        rewards, terminated, truncated, values, log_probs, next_obs``), each with a
        leading dimension T instead of ``num_envs``; ``next_obs`` is the one
        observation after the last row. ``final_obs`` maps row numbers of truncated,
        non-terminated rows to the episode's true last observation; ``state``
        (recurrent policies only) is the policy state the slot acted from at row 0.
        Use either this or :meth:`step` for a slot, not both.
        """
        names = (*StepArrays.STEP_FIELDS, "next_obs")
        given = dict(zip(names, arrays, strict=False)) | named
        if len(arrays) > len(names) or set(given) != set(names):
            raise TypeError(f"send_fragment takes slot and the arrays {', '.join(names)}")
        steps = StepArrays.coerce(*(given[name] for name in StepArrays.STEP_FIELDS))
        base = int(self.sender.slot_steps[slot]) + 1 if self.sender.slot_steps.size > slot else 1
        self._check_sendable(steps, None, lambda row: (slot, base + row))
        self._check_sendable(None, given["next_obs"], lambda _: (slot, base + steps.length), False)
        for row, last in (final_obs or {}).items():
            self._check_sendable(None, last, lambda _, r=int(row): (slot, base + r), True)
        self.sender.send_fragment(slot, steps, given["next_obs"], final_obs, self.version, state)

    def _slot_step(self, slot: int) -> tuple[int, int]:
        """``(slot, the number of the step being recorded on it since the welcome)``."""
        done = self.sender.slot_steps
        return slot, int(done[slot]) + 1 if 0 <= slot < done.size else 0

    @staticmethod
    def _check_sendable(
        steps: StepArrays | None,
        next_obs: Any,
        where: Callable[[int], tuple[int, int]],
        single: bool = False,
    ) -> None:
        """Raise :class:`BadExperience` when a value would make the learner refuse the
        fragment (the learner's own limits, :mod:`zmq_rl.wire.codec`): ``where(row)`` gives
        the slot and step of a bad row; ``single``: ``next_obs`` is one observation
        (a final observation), not rows."""
        fields: list[tuple[str, Any, bool]] = []
        if steps is not None:
            fields += [("obs", steps.obs, False), ("actions", steps.actions, False)]
            fields += [(n, getattr(steps, n), True) for n in ("rewards", "values", "log_probs")]
        if next_obs is not None:
            fields.append(("final_obs" if single else "next_obs", next_obs, False))
        for field, value, magnitude in fields:
            for name, leaf in named_leaves(value, field):
                if leaf.dtype.kind != "f":
                    continue
                rows = leaf[None] if single else leaf
                problem = finite_problem(rows, name) or (
                    magnitude_problem(rows, name) if magnitude else None
                )
                if problem:
                    row = max(0, first_bad_row(rows, magnitude))
                    slot, step = where(row)
                    shown = np.asarray(rows[row]).ravel()[:8].tolist()
                    raise BadExperience(field, slot, step, f"{problem} ({shown})")

    def _wait_for_room(self) -> bool:
        """While PUSH is full: serve control and heartbeats; False (give up on the
        fragment) once the learner asked for shutdown or restarted; LearnerLost
        when it has been silent for ``learner_timeout``."""
        self._poll_control()
        if self.shutdown_requested or self.needs_reregister:
            self.rejects["unsent:" + ("shutdown" if self.shutdown_requested else "restart")] += 1
            return False
        self._check_learner_alive("experience undeliverable; no message from the learner")
        self._maybe_heartbeat()
        return True

    def _check_learner_alive(self, what: str) -> None:
        """Raise :class:`LearnerLost` once the learner was silent for ``learner_timeout``."""
        silent = time.monotonic() - self.last_heard
        if silent > self.learner_timeout:
            raise LearnerLost(
                f"{what} at {tcp_endpoint(self.host, self.control_port)} for {silent:.0f}s "
                f"(learner_timeout={self.learner_timeout:g}s)"
            )
