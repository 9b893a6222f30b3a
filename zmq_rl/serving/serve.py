"""Remote inference: ``zmq-rl serve``, the policy for simulators that cannot run torch.

The server itself needs no torch either (``pip install zmq_rl``): every shipped
network acts in numpy (:mod:`zmq_rl.rl.numpy_nets`). A run whose network is a custom
factory, which only torch builds, is answered ``error`` ``needs_torch`` on a host
without torch, and the server stops with that one line (exit 2).

A simulator (any language with ZeroMQ and msgpack: ``examples/c_actor/``) connects a
DEALER or REQ socket to the server's ROUTER, ``attach``-es with its number of env
slots, then sends one ``infer`` per step: the observations of all its slots plus the
reward, terminated and truncated flags (and final observations) of the previous step;
the server answers ``action`` with the env actions. docs/inference.md specifies the
messages.

For each attached simulator the server holds one registration with the learner (an
:class:`~zmq_rl.actor.client.ActorClient` whose ``num_envs`` are the simulator's slots): it
records the simulator's experience and pushes the fragments on its behalf, sends its
heartbeats, and obeys its staleness valve (a paused simulator's request waits; the
others are served). One copy of the learner's network (:class:`~zmq_rl.actor.agent.
PolicyRunner`, always the newest weights any registration received) answers the
requests of every simulator waiting at that moment in one batched forward.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np
import zmq

from ..actor.agent import PolicyRunner
from ..actor.client import (
    ActorClient,
    BadExperience,
    LearnerLost,
    LearnerRefused,
    LearnerUnreachable,
)
from ..config import ServeConfig
from ..rl.device import set_compute_threads
from ..rl.installs import TorchMissing
from ..rl.masking import ActionMaskError, check_observation_mask
from ..sparse_log import log_sparsely
from ..wire.codec import (
    DEFAULT_MAX_MESSAGE_BYTES,
    MAX_ENVS_PER_ACTOR,
    PROTOCOL_VERSION,
    ProtocolError,
    decode_array,
    finite_problem,
    first_bad_row,
    magnitude_problem,
    named_leaves,
    unpack_map,
)
from ..wire.protocol import Weights
from ..wire.spaces import (
    Value,
    decode_value,
    encode_value,
    env_actions,
    map_value,
    space_from_spec,
    space_spec,
    value_problem,
)
from ..wire.transport import SocketOptions, make_socket

__all__ = ["InferenceServer", "RequestError", "decode_request", "pack", "serve"]

log = logging.getLogger("zmq_rl.serve")

SERVER_HWM = 10_000
"""Queued messages per simulator connection (a simulator has one request in flight)."""
IDLE_WAIT_MS = 100
"""Longest wait for a request while nothing is deferred (heartbeats are due each second)."""
PAUSED_WAIT_MS = 10
"""Wait while some request is held by its staleness valve: re-checked this often."""
LEARNER_POLL_S = 0.01
"""Every registration's control, heartbeats and weights are served this often (not on
every request: with 64 simulators that would cost milliseconds per batch)."""
REQUEST_TYPES = ("attach", "infer", "detach")


class RequestError(ValueError):
    """A simulator's request cannot be served; ``code`` is the ``error`` reply's code."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def pack(kind: str, **fields: Any) -> bytes:
    """One message of the inference protocol (a msgpack map with ``proto`` and ``type``)."""
    return msgpack.packb({"proto": PROTOCOL_VERSION, "type": kind, **fields}, use_bin_type=True)


def decode_request(frame: bytes, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> dict[str, Any]:
    """Parse a simulator's frame: a map with ``proto`` 2 and a request ``type``; raises
    :class:`RequestError` (``bad_message``, ``version_mismatch``, ``unknown_type``)."""
    try:
        body = unpack_map(frame, max_bytes)
    except ProtocolError as exc:
        raise RequestError("bad_message", str(exc)) from None
    proto = body.get("proto")
    if type(proto) is not int or proto != PROTOCOL_VERSION:
        raise RequestError(
            "version_mismatch",
            f"protocol version mismatch: the simulator speaks {proto!r}, "
            f"the server speaks {PROTOCOL_VERSION}",
        )
    if body.get("type") not in REQUEST_TYPES:
        raise RequestError(
            "unknown_type", f"type {body.get('type')!r} is not one of {', '.join(REQUEST_TYPES)}"
        )
    return body


def _observations(body: dict[str, Any], name: str, n: int, space: Any, context: str = "") -> Value:
    """``body[name]``: ``n`` observations of ``space``; RequestError ``bad_field`` naming
    ``infer.<name>`` (and ``context``) when it cannot be decoded or does not fit."""
    field = f"infer.{name}"
    try:
        value = decode_value(body.get(name), field, (n,))
    except ProtocolError as exc:
        raise RequestError("bad_field", str(exc)) from None
    problem = value_problem(space, value, field, 1)
    if problem:
        raise RequestError("bad_field", problem + context)
    _refuse_unsendable(value, field)
    return value


def _refuse_unsendable(value: Value, where: str, magnitude: bool = False) -> None:
    """RequestError ``not_finite`` (and, with ``magnitude``, ``out_of_range``) naming
    the field and the first slot, when a leaf of ``value`` (rows are slots) holds what
    the learner would refuse a whole fragment for: its own limits
    (:func:`zmq_rl.wire.codec.finite_problem`, :func:`~zmq_rl.wire.codec.magnitude_problem`),
    checked before anything is recorded, so that no good row travels with it."""
    for name, leaf in named_leaves(value, where):
        for code, check in (("not_finite", finite_problem), ("out_of_range", magnitude_problem)):
            problem = check(leaf, name) if magnitude or code == "not_finite" else None
            if problem:
                slot = first_bad_row(leaf, magnitude=code == "out_of_range")
                raise RequestError(code, f"{problem} (slot {slot}: {leaf[slot].tolist()})")


def _field_array(body: dict[str, Any], name: str, dtypes: tuple[str, ...], shape: tuple) -> Any:
    try:
        array = decode_array(body.get(name), f"infer.{name}")
    except ProtocolError as exc:
        raise RequestError("bad_field", str(exc)) from None
    if array.dtype.name not in dtypes or array.shape != shape:
        raise RequestError(
            "bad_field",
            f"infer.{name}: {array.dtype.name} {list(array.shape)}, expected "
            f"{'/'.join(dtypes)} {list(shape)}",
        )
    return array


@dataclass
class Session:
    """One attached simulator: its ROUTER address, its learner registration, the
    step it is waiting to hear the outcome of, and its recurrent state."""

    address: list[bytes]  # routing id + envelope frames (REQ's empty delimiter)
    client: ActorClient
    state: np.ndarray
    last_seen: float
    pending: tuple[Value, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
    acted_version: int = 0  # the version of the weights that chose the pending actions
    request: Value | None = None  # observations of a request not answered yet
    requests: int = 0
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def num_envs(self) -> int:
        """The simulator's env slots."""
        return self.client.num_envs


class InferenceServer:
    """The ``zmq-rl serve`` loop (see the module docstring): :meth:`run` until the
    learner shut the run down and every simulator is gone (or :meth:`stop`)."""

    def __init__(self, cfg: ServeConfig, context: zmq.Context | None = None) -> None:
        self.cfg = cfg.validate()
        self.ctx = context or zmq.Context.instance()
        self.sessions: dict[bytes, Session] = {}
        self.runner: PolicyRunner | None = None
        self.stats: dict[str, float] = {
            "attached": 0,
            "requests": 0,
            "batches": 0,
            "errors": 0,
            "deferred": 0,
        }
        self.shutdown_seen = False
        self._stop = False
        self._error_counts: Counter[str] = Counter()
        self.socket = make_socket(
            self.ctx,
            zmq.ROUTER,
            SocketOptions(
                linger_ms=500,
                sndhwm=SERVER_HWM,
                rcvhwm=SERVER_HWM,
                max_message_bytes=DEFAULT_MAX_MESSAGE_BYTES,
            ),
        )
        self.socket.bind(cfg.bind)
        self.endpoint = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        log.info("serving inference on %s for the learner at %s", self.endpoint, cfg.learner)

    # ------------------------------------------------------------------ loop

    def stop(self) -> None:
        """Ask :meth:`run` to return at its next turn (from the same thread, or a
        signal handler)."""
        self._stop = True

    def run(self) -> dict[str, float]:
        """Serve until the run is over (see the class docstring); return the counters."""
        next_learner_poll = 0.0
        try:
            while not self._stop:
                if self.shutdown_seen and not self.sessions and not self.cfg.keep_serving:
                    log.info("the learner shut the run down and every simulator is gone")
                    break
                deferred = any(s.request is not None for s in self.sessions.values())
                if self.socket.poll(PAUSED_WAIT_MS if deferred else IDLE_WAIT_MS):
                    self._receive()
                now = time.monotonic()
                if now >= next_learner_poll:
                    self._poll_learner()
                    self._expire(now)
                    next_learner_poll = now + LEARNER_POLL_S
                self._serve_waiting()
        finally:
            self.close()
        return dict(self.stats)

    def close(self) -> None:
        """Detach every simulator (bye to the learner) and close the ROUTER."""
        for key in list(self.sessions):
            self._end(key, "server closing")
        self.socket.close()

    def _receive(self) -> None:
        """Take every request queued now (up to ``max_batch`` infers)."""
        infers = 0
        while self.socket.poll(0) and (not self.cfg.max_batch or infers < self.cfg.max_batch):
            frames = self.socket.recv_multipart()
            address, frame = frames[:-1], frames[-1]
            try:
                body = decode_request(frame)
                kind = body["type"]
                if kind == "infer":
                    infers += 1
                    self._on_infer(address, body)
                elif kind == "attach":
                    self._on_attach(address, body)
                else:
                    self._on_detach(address, body)
            except RequestError as exc:
                self.stats["errors"] += 1
                self._error_counts[exc.code] += 1
                count = self._error_counts[exc.code]  # each code logged sparsely
                log_sparsely(
                    log,
                    count,
                    logging.WARNING,
                    "request refused (%s): %s",
                    exc.code,
                    exc.reason,
                    quiet=logging.DEBUG,
                )
                self._send(address, pack("error", code=exc.code, reason=exc.reason))

    def _send(self, address: list[bytes], frame: bytes) -> None:
        try:
            self.socket.send_multipart([*address, frame], zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # gone (ROUTER_MANDATORY) or its queue is full
            log.debug("could not answer a simulator: %s", exc)

    # ------------------------------------------------------------------ requests

    def _on_attach(self, address: list[bytes], body: dict[str, Any]) -> None:
        key = address[0]
        if key in self.sessions:
            self._end(key, "attached again")
        num_envs = body.get("num_envs")
        if type(num_envs) is not int or not 1 <= num_envs <= MAX_ENVS_PER_ACTOR:
            raise RequestError(
                "bad_field", f"attach.num_envs: {num_envs!r} is not an int in [1, 4096]"
            )
        spaces = []
        for name in ("observation_space", "action_space"):
            spec = body.get(name, {})
            try:
                spaces.append(space_from_spec(spec, f"attach.{name}") if spec else None)
            except ProtocolError as exc:
                raise RequestError("bad_field", str(exc)) from None
        if (spaces[0] is None) != (spaces[1] is None):
            raise RequestError(
                "bad_field",
                "attach.observation_space, attach.action_space: give both or neither "
                "(neither: the learner's)",
            )
        env_id, actor_id = body.get("env_id", ""), body.get("actor_id", -1)
        if not isinstance(env_id, str) or type(actor_id) is not int:
            raise RequestError("bad_field", "attach.env_id must be a str, attach.actor_id an int")
        client = ActorClient(
            self.cfg.learner,
            env_id=env_id[:256],
            observation_space=spaces[0],
            action_space=spaces[1],
            num_envs=num_envs,
            actor_id=actor_id,
            context=self.ctx,
            register_timeout=self.cfg.register_timeout,
            learner_timeout=self.cfg.learner_timeout,
            weights_check=self._check_weights,
        )
        try:
            welcome = client.register()
            runner = self._runner_for(client)
        except LearnerRefused as exc:
            client.close()
            raise RequestError("learner_refused", f"{exc.code}: {exc.reason}") from None
        except LearnerUnreachable as exc:
            client.close()
            raise RequestError("learner_unreachable", str(exc)) from None
        except TorchMissing as exc:  # a custom network on a host without torch: no run
            client.close()  # (its bye: the learner does not wait for this registration)
            self._send(address, pack("error", code="needs_torch", reason=str(exc)))
            raise  # zmq-rl serve stops with its one line (exit 2)
        session = Session(address, client, runner.initial_state(num_envs), time.monotonic())
        self.sessions[key] = session
        self.stats["attached"] += 1
        settings = welcome.settings
        log.info("simulator attached as actor %d (%d slots)", client.actor_id, num_envs)
        self._send(
            address,
            pack(
                "attached",
                actor_id=client.actor_id,
                run_id=client.run_id,
                num_envs=num_envs,
                observation_space=space_spec(settings.observation_space),
                action_space=space_spec(settings.action_space),
                version=runner.version,
            ),
        )

    def _runner_for(self, client: ActorClient) -> PolicyRunner:
        """The network for ``client``'s run: built from its welcome for a new run."""
        welcome = client.welcome
        assert welcome is not None
        if self.runner is None or self.runner.run_id != welcome.run_id:
            seed = self.cfg.seed
            if seed < 0:  # as an actor: the run's seed + 1 + its (first) actor id
                seed = welcome.settings.seed + 1 + client.actor_id
            with client.keepalive():  # building it may import torch: heartbeat meanwhile
                self.runner = PolicyRunner(welcome, seed)
            self.shutdown_seen = False
        elif not self.runner.load(welcome.weights):
            client.reject_weights(welcome.weights, ValueError("weights do not fit the network"))
        return self.runner

    def _check_weights(self, weights: Weights) -> None:
        """Every registration's ``weights_check``: weights of the shared network's run
        must fit it exactly, else they are refused before the version moves."""
        runner = self.runner
        if runner is not None and weights.run_id == runner.run_id:
            runner.check(weights.tensors)

    def _on_detach(self, address: list[bytes], body: dict[str, Any]) -> None:
        session = self.sessions.get(address[0])
        if session is None:
            raise RequestError("not_attached", "detach: this connection is not attached")
        stats = body.get("stats", {})
        if isinstance(stats, dict):
            session.extra = {
                str(k): float(v)
                for k, v in stats.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            }
        session.client.flush()  # the rows of its last steps still count
        self._end(address[0], "detached")
        self._send(address, pack("detached"))

    def _on_infer(self, address: list[bytes], body: dict[str, Any]) -> None:
        session = self.sessions.get(address[0])
        if session is None:
            raise RequestError("not_attached", "infer: attach first")
        session.requests += 1
        self.stats["requests"] += 1
        if session.request is not None:
            raise RequestError("bad_message", "infer: the previous request is not answered yet")
        session.last_seen = time.monotonic()
        session.address = address
        if session.client.shutdown_requested:
            self._say_shutdown(address[0])
            return
        space = session.client.settings.observation_space
        n = session.num_envs
        obs = _observations(body, "obs", n, space, f" (observation space {space})")
        try:  # an env error: refused before anything is sampled or recorded
            check_observation_mask(space, session.client.settings.action_space, obs, "infer.obs")
        except ActionMaskError as exc:
            raise RequestError("bad_field", str(exc)) from None
        if session.pending is not None:
            self._record(session, body, obs, space)
        elif "reward" in body:
            raise RequestError(
                "bad_field", "infer.reward: no action is outstanding (first request after attach)"
            )
        session.request = obs

    def _record(self, session: Session, body: dict[str, Any], obs: Value, space: Any) -> None:
        """Hand the previous step of ``session`` (its outcome in ``body``) to its client."""
        n = session.num_envs
        if "reward" not in body:
            raise RequestError("bad_field", "infer.reward: missing (the previous step's outcome)")
        rewards = _field_array(body, "reward", ("float32", "float64"), (n,))
        with np.errstate(over="ignore"):  # float64 past float32's range: inf, refused
            rewards = rewards.astype(np.float32)
        _refuse_unsendable(rewards, "infer.reward", magnitude=True)
        terminated = _field_array(body, "terminated", ("bool",), (n,))
        truncated = _field_array(body, "truncated", ("bool",), (n,))
        needs = np.flatnonzero(truncated & ~terminated)
        final_obs: dict[int, Value] = {}
        if needs.size and "final_obs_index" not in body:
            raise RequestError(
                "bad_field",
                f"infer.final_obs_index: missing; slots {needs.tolist()} are truncated and not "
                "terminated and need their final observations",
            )
        if needs.size or "final_obs_index" in body:
            k = int(needs.size)
            index = _field_array(body, "final_obs_index", ("int32", "int64"), (k,))
            if not np.array_equal(index, needs):
                raise RequestError(
                    "bad_field",
                    f"infer.final_obs_index: {index.tolist()}, expected the slots truncated "
                    f"and not terminated {needs.tolist()}",
                )
            finals = _observations(body, "final_obs", k, space)
            final_obs = {
                int(s): map_value(lambda a, i=i: a[i], finals) for i, s in enumerate(index)
            }
        prev_obs, actions, values, log_probs, state = session.pending
        # The row's version: the weights that chose its actions, or this registration's
        # loaded version when that is older (never newer than what acted, §4.1.2).
        acted = session.acted_version
        older = {"version": acted} if acted < session.client.version else {}
        ended = terminated | truncated
        if session.state.shape[1]:
            session.state[ended] = 0.0
        try:
            session.client.step(
                prev_obs,
                actions,
                rewards,
                terminated,
                truncated,
                values,
                log_probs,
                obs,
                final_obs,
                state if session.state.shape[1] else None,
                **older,
            )
        except BadExperience as exc:  # the network's own values / log-probs: never sent
            code = "out_of_range" if "exceeds" in str(exc) else "not_finite"
            raise RequestError(code, f"{exc.field} of the server's policy: {exc}") from None
        session.pending = None

    def _say_shutdown(self, key: bytes) -> None:
        session = self.sessions[key]
        reason = session.client.shutdown_reason or "the learner shut the run down"
        self._send(session.address, pack("shutdown", reason=reason))
        self._end(key, "run over")

    # ------------------------------------------------------------------ learner side

    def _poll_learner(self) -> None:
        """Control, heartbeats and weights of every registration; the newest weights
        go into the shared network."""
        for key, session in list(self.sessions.items()):
            client = session.client
            try:
                weights = client.poll()
            except (LearnerLost, LearnerUnreachable, LearnerRefused) as exc:
                log.warning("actor %d lost its learner: %s", client.actor_id, exc)
                self._send(session.address, pack("error", code="learner_lost", reason=str(exc)))
                self._end(key, "learner lost", bye=False)
                continue
            if client.shutdown_requested:
                self.shutdown_seen = True
                if session.request is not None:
                    self._say_shutdown(key)
                continue
            if weights is None:
                continue
            runner = self.runner
            if runner is None or weights.run_id != runner.run_id:
                runner = self._runner_for(client)  # registered again with a new run
                session.state = runner.initial_state(session.num_envs)
            elif not runner.load(weights):
                client.reject_weights(weights, ValueError("weights do not fit the network"))

    def _serve_waiting(self) -> None:
        """One batched forward for every request whose valve lets it through."""
        runner = self.runner
        ready = []
        for session in self.sessions.values():
            if session.request is None:
                continue
            if session.client.should_pause():
                self.stats["deferred"] += 1
                continue
            ready.append(session)
        if not ready or runner is None:
            return
        obs = map_value(lambda *xs: np.concatenate(xs), *(s.request for s in ready))
        state = np.concatenate([s.state for s in ready]) if runner.state_size else None
        actions, log_probs, values, next_state = runner.act(obs, state)
        self.stats["batches"] += 1
        action_space = runner.action_space
        start = 0
        for session in ready:
            rows = slice(start, start + session.num_envs)
            start = rows.stop
            mine = actions[rows]
            session.pending = (session.request, mine, values[rows], log_probs[rows], session.state)
            session.acted_version = runner.version
            if next_state is not None:
                session.state = next_state[rows].copy()
            session.request = None
            self._send(
                session.address,
                pack(
                    "action",
                    actions=encode_value(env_actions(action_space, mine)),
                    version=runner.version,
                ),
            )

    def _expire(self, now: float) -> None:
        for key, session in list(self.sessions.items()):
            if session.request is None and now - session.last_seen > self.cfg.sim_timeout:
                log.warning(
                    "simulator of actor %d silent for %.0fs: detached",
                    session.client.actor_id,
                    now - session.last_seen,
                )
                self._end(key, "simulator silent")

    def _end(self, key: bytes, why: str, bye: bool = True) -> None:
        session = self.sessions.pop(key)
        log.info("actor %d detached (%s)", session.client.actor_id, why)
        extra = {"serve/requests": float(session.requests), **session.extra}
        if bye:
            session.client.close(extra)
        else:
            session.client.actor_id = -1  # no bye: the learner is gone
            session.client.close()


def serve(cfg: ServeConfig) -> int:
    """``zmq-rl serve``: run an :class:`InferenceServer` until the run is over (or
    Ctrl-C / SIGTERM, which the CLI turns into KeyboardInterrupt); print its counters."""
    set_compute_threads(cfg.torch_threads)
    server = InferenceServer(cfg)
    print(f"serving inference on {server.endpoint} for the learner at {cfg.learner}", flush=True)
    stats = server.run()
    print("serve done: " + ", ".join(f"{k} {v:g}" for k, v in stats.items()), flush=True)
    return 0
