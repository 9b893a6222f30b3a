"""ActorClient: the socket side of any actor, built-in or embedded in a simulator.

The built-in gymnasium actor (:mod:`zmq_rl.actor`) is written on this API alone;
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

No RL here: the client moves arrays and counts steps; it never looks inside them.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket as pysocket
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from .config import ActorThrottle
from .protocol import (
    PROTOCOL_VERSION,
    Bye,
    Fragment,
    Heartbeat,
    Hello,
    ProtocolError,
    ProtocolVersionMismatch,
    Refuse,
    Shutdown,
    Weights,
    Welcome,
    decode,
    encode,
    space_from_spec,
    space_spec,
)
from .transport import (
    ACTOR_PUSH_LINGER_MS,
    EXPERIENCE_HWM,
    WEIGHTS_HWM,
    CurveClientKeys,
    SocketOptions,
    apply_curve_client,
    make_socket,
    parse_learner_address,
    readable,
    tcp_endpoint,
)

log = logging.getLogger(__name__)

DEFAULT_MAX_RECEIVE_BYTES = 256 * 1024 * 1024
"""Largest weights/welcome message an actor accepts (ZMQ_MAXMSGSIZE)."""


class LearnerRefused(RuntimeError):
    """The learner refused this actor's registration; ``code`` says why."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(f"learner refused registration ({code}): {reason}")
        self.code = code
        self.reason = reason


class LearnerUnreachable(TimeoutError):
    """No answer from the learner within the allowed time."""


class LearnerLost(TimeoutError):
    """The learner has been silent for longer than ``learner_timeout``."""


class ActorClient:
    """Register with a learner, send experience, receive weights and control.

    ``num_envs`` slots step in lockstep through :meth:`step` (0: as many as the
    learner's welcome says); :meth:`send_fragment` sends any T >= 1 steps of one
    slot directly. Counters for the ``bye`` message
    are kept in :attr:`stats`.
    """

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
        max_message_bytes: int = DEFAULT_MAX_RECEIVE_BYTES,
        curve: CurveClientKeys | None = None,
    ) -> None:
        self.host, self.control_port = parse_learner_address(learner)
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
        self._monitor: zmq.Socket | None = None
        self._version_before = 0
        self.max_message_bytes = int(max_message_bytes)
        self._ctx = context or zmq.Context.instance()
        self._control: zmq.Socket | None = None
        self._experience: zmq.Socket | None = None
        self._weights: zmq.Socket | None = None
        self.welcome: Welcome | None = None
        self.actor_id = -1
        self.run_id = ""
        self.version = 0
        self.config: dict[str, Any] = {}
        self.throttle = ActorThrottle.disabled()
        self.fragment_length = 1
        self.heartbeat_interval = 1.0
        self.shutdown_requested = False
        self.shutdown_reason = ""
        self.rejects: Counter[str] = Counter()
        self.stats: dict[str, float] = {
            "steps_sent": 0,
            "fragments_sent": 0,
            "episodes_completed": 0,
            "policy_updates_received": 0,
            "last_policy_version": 0,
        }
        self._slot_steps = np.zeros(self.num_envs, np.int64)  # since the welcome
        self._seq = np.zeros(self.num_envs, np.int64)
        self._buffer: _LockstepBuffer | None = None
        self._last_heartbeat = 0.0
        self.last_heard = time.monotonic()

    # ------------------------------------------------------------------ lifecycle

    def register(self, timeout: float | None = None) -> Welcome:
        """Say hello and wait for the welcome; connect the data sockets.

        Returns the :class:`Welcome` (its ``weights`` are the current policy).
        Raises :class:`LearnerRefused` when the learner says no (wrong protocol
        version, mismatched env spaces, an id in use) and
        :class:`LearnerUnreachable` when nothing answers within ``timeout``.
        """
        timeout = self.register_timeout if timeout is None else timeout
        if self._control is None:
            self._control = self._socket(
                zmq.DEALER, SocketOptions(linger_ms=500, max_message_bytes=self.max_message_bytes)
            )
            self._monitor = self._control.get_monitor_socket(
                zmq.EVENT_HANDSHAKE_FAILED_AUTH
                | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
            )
            self._control.connect(tcp_endpoint(self.host, self.control_port))
        hello = Hello(
            actor_id=self.requested_id if self.actor_id < 0 else self.actor_id,
            env_id=self.env_id,
            observation_space=(
                space_spec(self.observation_space) if self.observation_space is not None else {}
            ),
            action_space=space_spec(self.action_space) if self.action_space is not None else {},
            num_envs=self.num_envs,
            host=pysocket.gethostname()[:200],
            pid=os.getpid(),
            rejoin_run_id=self.run_id,
            next_seq=[int(s) for s in self._seq],
        )
        self._control.send(encode(hello))
        deadline = time.monotonic() + timeout
        poller = zmq.Poller()
        poller.register(self._control, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        while True:
            remaining = deadline - time.monotonic()
            events = dict(poller.poll(int(remaining * 1000) + 1)) if remaining > 0 else {}
            if self._monitor in events:
                self._raise_handshake_failure()
            if self._control not in events:
                if time.monotonic() < deadline:
                    continue
                raise LearnerUnreachable(
                    f"no welcome from learner at {tcp_endpoint(self.host, self.control_port)} "
                    f"within {timeout:.1f}s"
                )
            try:
                message = decode(self._control.recv(), max_bytes=self.max_message_bytes)
            except ProtocolVersionMismatch as exc:
                raise LearnerRefused(
                    "version_mismatch",
                    f"the learner answered in protocol {exc.theirs!r}; "
                    f"this actor speaks {PROTOCOL_VERSION}",
                ) from None
            except ProtocolError as exc:
                self._reject("control", exc)
                continue
            if isinstance(message, Refuse) and message.code != "reregister":
                raise LearnerRefused(message.code, message.reason)
            if isinstance(message, Welcome):
                self._accept(message)
                return message
            # Heartbeats, a stale shutdown, or a "reregister" answering an earlier
            # heartbeat: this hello is already the answer to those.

    def _socket(self, kind: int, options: SocketOptions) -> zmq.Socket:
        sock = make_socket(self._ctx, kind, options)
        if self.curve is not None:
            apply_curve_client(sock, self.curve)
        return sock

    def _raise_handshake_failure(self) -> None:
        assert self._monitor is not None
        event = recv_monitor_message(self._monitor)
        detail = {
            zmq.EVENT_HANDSHAKE_FAILED_AUTH: "the learner refused this actor's CURVE key",
            zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "security mismatch (one side uses CURVE, "
            "the other not, or the learner's public key is wrong)",
        }.get(event["event"], "the security handshake failed (wrong learner key?)")
        raise LearnerRefused(
            "auth_failed",
            f"{detail} at {tcp_endpoint(self.host, self.control_port)} "
            f"(handshake event {event['event']}, value {event['value']})",
        )

    def _accept(self, welcome: Welcome) -> None:
        self.welcome = welcome
        self.registrations += 1
        self.needs_reregister = False
        if self.registrations > 1:
            self.stats["reregistrations"] = self.registrations - 1
        self.actor_id = welcome.actor_id
        self.run_id = welcome.run_id
        self.config = dict(welcome.config)
        if self.observation_space is None and "observation_space" in self.config:
            self.observation_space = space_from_spec(self.config["observation_space"])
            self.action_space = space_from_spec(self.config["action_space"])
        self.version = welcome.weights.version
        self.throttle = ActorThrottle(
            steps_per_broadcast=int(self.config.get("steps_per_broadcast", 0)),
            max_lead_steps=int(self.config.get("max_lead_steps", 0)),
            base_version=welcome.base_version,
        )
        self.fragment_length = max(1, int(self.config.get("fragment_length", 1)))
        if int(self.config.get("num_envs", self.num_envs)) != self.num_envs:
            self.num_envs = int(self.config["num_envs"])
            self._seq = np.zeros(self.num_envs, np.int64)
        self._slot_steps = np.zeros(self.num_envs, np.int64)
        self.heartbeat_interval = float(self.config.get("heartbeat_interval", 1.0))
        self._buffer = None
        self.last_heard = time.monotonic()
        for sock in (self._experience, self._weights):
            if sock is not None:
                sock.close(linger=0)
        self._experience = self._socket(
            zmq.PUSH, SocketOptions(linger_ms=ACTOR_PUSH_LINGER_MS, sndhwm=EXPERIENCE_HWM)
        )
        self._experience.connect(tcp_endpoint(self.host, welcome.experience_port))
        self._weights = self._socket(
            zmq.SUB, SocketOptions(rcvhwm=WEIGHTS_HWM, max_message_bytes=self.max_message_bytes)
        )
        self._weights.setsockopt(zmq.SUBSCRIBE, b"")
        self._weights.connect(tcp_endpoint(self.host, welcome.weights_port))
        log.info(
            "registered as actor %d of run %s (version %d, base version %d)",
            self.actor_id,
            self.run_id,
            self.version,
            welcome.base_version,
        )

    def close(self, extra_stats: Mapping[str, float] | None = None) -> None:
        """Say bye with the counters (plus ``extra_stats``) and close every socket."""
        if self._control is not None and self.actor_id >= 0:
            stats = {
                k: float(v)
                for k, v in {**self.stats, **(extra_stats or {})}.items()
                if isinstance(v, (int, float)) and math.isfinite(v)
            }
            bye = Bye(actor_id=self.actor_id, stats=stats, last_seq=[int(s) - 1 for s in self._seq])
            try:
                self._control.send(encode(bye), zmq.NOBLOCK)
            except zmq.ZMQError:
                log.warning("could not send bye to the learner")
        if self._control is not None:
            self._control.disable_monitor()
        for sock in (self._experience, self._weights, self._control, self._monitor):
            if sock is not None:
                sock.close()
        self._experience = self._weights = self._control = self._monitor = None

    def __enter__(self) -> ActorClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ receiving

    def poll(self) -> Weights | None:
        """Handle control messages and return the newest unseen weights, if any.

        Never blocks while the learner is there. When several weight blobs are
        queued only the newest is decoded and returned; the caller must load it
        before its next step (the client tags later fragments with its version).

        When the learner restarted (a new run id, or it no longer knows this
        actor) the client registers again, blocking up to ``register_timeout``,
        and returns the new welcome's weights. Raises :class:`LearnerLost` when
        the learner has been silent for ``learner_timeout`` seconds.
        """
        self._poll_control()
        if self.needs_reregister:
            log.warning("learner restarted or forgot this actor; registering again")
            return self.register().weights
        silent = time.monotonic() - self.last_heard
        if silent > self.learner_timeout:
            raise LearnerLost(
                f"no message from the learner at {tcp_endpoint(self.host, self.control_port)} "
                f"for {silent:.0f}s (learner_timeout={self.learner_timeout:g}s)"
            )
        self._maybe_heartbeat()
        if self._weights is None or not readable(self._weights):
            return None
        frames = []
        while readable(self._weights):
            frames.append(self._weights.recv(copy=False).buffer)
        return self._newest_weights(frames)

    def wait_for_weights(self, timeout: float) -> Weights | None:
        """Block up to ``timeout`` seconds for new weights (or a control message)."""
        if self._weights is None or self._control is None:
            raise RuntimeError("register() first")
        poller = zmq.Poller()
        poller.register(self._weights, zmq.POLLIN)
        poller.register(self._control, zmq.POLLIN)
        poller.poll(int(timeout * 1000))
        return self.poll()

    def _newest_weights(self, frames: list[memoryview]) -> Weights | None:
        for frame in reversed(frames):
            try:
                weights = decode(frame, (Weights,), self.max_message_bytes)
            except ProtocolError as exc:
                self._reject("weights", exc)
                continue
            assert isinstance(weights, Weights)
            if weights.run_id != self.run_id:
                self.rejects["weights:other_run"] += 1
                self.needs_reregister = True
                continue
            self.last_heard = time.monotonic()
            if weights.version <= self.version:
                return None
            self.flush()  # rows collected under the old version leave tagged with it
            self._version_before = self.version
            self.version = weights.version
            self.stats["policy_updates_received"] += 1
            self.stats["last_policy_version"] = weights.version
            return weights
        return None

    def reject_weights(self, weights: Weights, error: Exception) -> None:
        """Undo accepting ``weights`` the policy could not load (wrong tensors): the
        client goes back to the version it had, counts and logs the rejection."""
        if self.version == weights.version:
            self.version = self._version_before
            self.stats["policy_updates_received"] -= 1
            self.stats["last_policy_version"] = self.version
        self._reject("weights", ProtocolError("wrong_tensors", str(error)))

    def _poll_control(self) -> None:
        sock = self._control
        while sock is not None and readable(sock):
            try:
                message = decode(sock.recv(), max_bytes=self.max_message_bytes)
            except ProtocolError as exc:
                self._reject("control", exc)
                continue
            if isinstance(message, Shutdown):
                if message.run_id in ("", self.run_id):
                    self.shutdown_requested = True
                    self.shutdown_reason = message.reason
                    log.info("learner requested shutdown: %s", message.reason)
            elif isinstance(message, Heartbeat):
                self.last_heard = time.monotonic()
                if message.run_id != self.run_id:
                    self.needs_reregister = True
            elif isinstance(message, Refuse) and message.code == "reregister":
                self.last_heard = time.monotonic()
                self.needs_reregister = True
            else:
                self.rejects["control:unexpected_type"] += 1

    def _maybe_heartbeat(self) -> None:
        now = time.monotonic()
        if self._control is None or now - self._last_heartbeat < self.heartbeat_interval:
            return
        self._last_heartbeat = now
        beat = Heartbeat(actor_id=self.actor_id, run_id=self.run_id, version=self.version)
        with contextlib.suppress(zmq.Again):  # a full queue already tells the learner enough
            self._control.send(encode(beat), zmq.NOBLOCK)

    def _reject(self, where: str, exc: ProtocolError) -> None:
        self.rejects[f"{where}:{exc.reason}"] += 1
        if self.rejects[f"{where}:{exc.reason}"] in (1, 10, 100, 1000, 10000):
            log.warning("rejected a %s message (%s): %s", where, exc.reason, exc)

    # ------------------------------------------------------------------ sending

    def should_pause(self) -> bool:
        """Whether the staleness valve says: wait for newer weights.

        Counts the steps of the least-advanced slot, so a slot that lags can
        always catch up (the learner never waits on a paused slot). A pausing
        client first flushes its partly filled fragments: the learner may need
        those rows before it can publish the version that lets the actor go on.
        """
        paused = self.throttle.should_pause(int(self._slot_steps.min()), self.version)
        if paused:
            self.flush()
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
    ) -> None:
        """Record one step of every slot (arrays with leading dim ``num_envs``).

        ``obs`` is what the actions were taken in; ``next_obs`` what the envs
        returned (the reset observation where an episode ended). ``final_obs``
        maps each slot whose episode was truncated (not terminated) to the true
        last observation of that episode. A full fragment of every slot is sent
        once ``fragment_length`` steps are buffered.
        """
        if self._buffer is None:
            self._buffer = _LockstepBuffer(
                self.fragment_length, self.num_envs, np.asarray(obs), np.asarray(actions)
            )
        buffer = self._buffer
        buffer.add(obs, actions, rewards, terminated, truncated, values, log_probs, final_obs)
        buffer.next_obs[...] = next_obs
        done = np.asarray(terminated) | np.asarray(truncated)
        self.stats["episodes_completed"] += int(done.sum())
        self._slot_steps += 1
        if buffer.size == self.fragment_length:
            self.flush()

    def flush(self) -> None:
        """Send whatever :meth:`step` has buffered as one fragment per slot."""
        buffer = self._buffer
        if buffer is None or buffer.size == 0:
            return
        n = buffer.size
        for slot in range(self.num_envs):
            final = buffer.final_for(slot)
            self._send(
                slot,
                buffer.obs[:n, slot],
                buffer.actions[:n, slot],
                buffer.rewards[:n, slot],
                buffer.terminated[:n, slot],
                buffer.truncated[:n, slot],
                buffer.values[:n, slot],
                buffer.log_probs[:n, slot],
                buffer.next_obs[slot],
                final,
            )
        buffer.reset()

    def send_fragment(
        self,
        slot: int,
        obs: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        values: np.ndarray,
        log_probs: np.ndarray,
        next_obs: np.ndarray,
        final_obs: Mapping[int, np.ndarray] | None = None,
    ) -> None:
        """Send T >= 1 consecutive steps of one slot now (rows are time).

        ``final_obs`` maps row numbers of truncated, non-terminated rows to the
        episode's true last observation. Use either this or :meth:`step` for a
        slot, not both.
        """
        terminated = np.asarray(terminated, bool)
        truncated = np.asarray(truncated, bool)
        self.stats["episodes_completed"] += int((terminated | truncated).sum())
        self._slot_steps[slot] += len(terminated)
        self._send(
            slot,
            obs,
            actions,
            rewards,
            terminated,
            truncated,
            values,
            log_probs,
            next_obs,
            final_obs or {},
        )

    def _send(
        self,
        slot,
        obs,
        actions,
        rewards,
        terminated,
        truncated,
        values,
        log_probs,
        next_obs,
        final: Mapping[int, np.ndarray],
    ) -> None:
        if self._experience is None:
            raise RuntimeError("register() first")
        rows = sorted(final)
        obs = np.asarray(obs)
        self._check_outgoing(slot, obs, terminated, truncated, rows)
        fragment = Fragment(
            actor_id=self.actor_id,
            slot=slot,
            version=self.version,
            seq=int(self._seq[slot]),
            run_id=self.run_id,
            obs=obs,
            actions=np.asarray(actions),
            rewards=np.asarray(rewards, np.float32),
            terminated=np.asarray(terminated, bool),
            truncated=np.asarray(truncated, bool),
            values=np.asarray(values, np.float32),
            log_probs=np.asarray(log_probs, np.float32),
            next_obs=np.asarray(next_obs, obs.dtype),
            final_obs_index=np.asarray(rows, np.int32),
            final_obs=(
                np.stack([np.asarray(final[r], obs.dtype) for r in rows])
                if rows
                else np.zeros((0, *obs.shape[1:]), obs.dtype)
            ),
            sent_at=time.time(),
        )
        if not self._send_experience(encode(fragment)):
            return
        self._seq[slot] += 1
        self.stats["steps_sent"] += fragment.length
        self.stats["fragments_sent"] += 1

    def _check_outgoing(
        self,
        slot: int,
        obs: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        final_rows: list[int],
    ) -> None:
        """Catch here, with a clear error, what the learner would reject silently."""
        space = self.observation_space
        if space is not None and (obs.shape[1:] != space.shape or obs.dtype != space.dtype):
            raise ValueError(
                f"slot {slot}: observations {obs.shape[1:]} {obs.dtype} do not match the "
                f"observation space {space.shape} {space.dtype} (the learner would reject them)"
            )
        needs = np.flatnonzero(np.asarray(truncated) & ~np.asarray(terminated)).tolist()
        if needs != final_rows:
            raise ValueError(
                f"slot {slot}: rows {needs} are truncated (not terminated) and need a final "
                f"observation each; got final_obs for rows {final_rows}"
            )

    def _send_experience(self, frame: bytes) -> bool:
        """Send a fragment, waiting while PUSH is at its HWM (never dropping it).

        Gives up (False) only when the learner asked for shutdown or restarted.
        """
        sock = self._experience
        assert sock is not None
        while True:
            try:
                sock.send(frame, zmq.NOBLOCK, copy=len(frame) < 65536)
                return True
            except zmq.Again:
                pass
            self._poll_control()
            if self.shutdown_requested or self.needs_reregister:
                self.rejects[
                    "unsent:" + ("shutdown" if self.shutdown_requested else "restart")
                ] += 1
                return False
            silent = time.monotonic() - self.last_heard
            if silent > self.learner_timeout:
                raise LearnerLost(
                    f"experience undeliverable and the learner silent for {silent:.0f}s"
                )
            self._maybe_heartbeat()
            sock.poll(100, zmq.POLLOUT)


class _LockstepBuffer:
    """Preallocated ``[T, num_envs]`` arrays that :meth:`ActorClient.step` fills."""

    def __init__(self, length: int, num_envs: int, obs: np.ndarray, actions: np.ndarray) -> None:
        self.obs = np.empty((length, *obs.shape), obs.dtype)
        self.actions = np.empty((length, *actions.shape), actions.dtype)
        self.rewards = np.empty((length, num_envs), np.float32)
        self.terminated = np.empty((length, num_envs), bool)
        self.truncated = np.empty((length, num_envs), bool)
        self.values = np.empty((length, num_envs), np.float32)
        self.log_probs = np.empty((length, num_envs), np.float32)
        self.next_obs = np.empty_like(obs)
        self.final: list[dict[int, np.ndarray]] = [{} for _ in range(num_envs)]
        self.size = 0

    def add(self, obs, actions, rewards, terminated, truncated, values, log_probs, final_obs):
        t = self.size
        self.obs[t] = obs
        self.actions[t] = actions
        self.rewards[t] = rewards
        self.terminated[t] = terminated
        self.truncated[t] = truncated
        self.values[t] = values
        self.log_probs[t] = log_probs
        if final_obs:
            for slot, last in final_obs.items():
                if self.truncated[t, slot] and not self.terminated[t, slot]:
                    self.final[slot][t] = np.array(last)
        self.size = t + 1

    def final_for(self, slot: int) -> dict[int, np.ndarray]:
        return self.final[slot]

    def reset(self) -> None:
        self.size = 0
        for entry in self.final:
            entry.clear()
