"""The learner: binds the sockets, keeps membership, assembles rollouts, trains.

One thread, one loop (the reference's ``learner_loop`` lifted onto sockets):

1. **Fill**: poll PULL (fragments) and ROUTER (hello, heartbeat, bye) until every
   member slot holds ``num_steps`` rows. Rows beyond the quota stay queued.
2. **Train**: take the ``[num_steps, slots]`` rollout, compute GAE or V-trace
   targets (:mod:`zmq_rl.targets`) and run one PPO update (:mod:`zmq_rl.ppo`).
3. **Broadcast**: every ``broadcast_every`` updates, version += 1 and PUBlish the
   weights; actors that registered during the last cycle become members now.

The run ends when the env-step budget is spent (or an evaluation reaches
``target_return``); then every actor is told to shut down and its ``bye`` (with its
stats) is collected for the report. Socket code stays here; RL math does not.
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import zmq

from .checkpoint import (
    atomic_torch_save,
    atomic_write_bytes,
    checkpoint_configs,
    config_dict,
    newest_checkpoint,
    read_checkpoint,
    write_checkpoint,
)
from .config import LearnerConfig, PolicyConfig, PPOConfig
from .evaluation import evaluate_policy
from .membership import ActorRecord, Membership, check_fragment, check_hello
from .normalization import RewardScaler
from .policy import build_policy, export_weights
from .ppo import PPOTrainer
from .protocol import (
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
    space_spec,
)
from .report import LearnerReport
from .rollout import SlotKey, SlotQueues
from .targets import TargetSettings, rollout_to_batch
from .transport import (
    EXPERIENCE_BUFFER_BYTES,
    EXPERIENCE_HWM,
    WEIGHTS_HWM,
    CurveServerKeys,
    SocketOptions,
    apply_curve_server,
    load_secret_certificate,
    make_socket,
    start_authenticator,
    tcp_endpoint,
)

__all__ = ["Learner", "LearnerReport", "LearnerStarved", "StopRequested"]

log = logging.getLogger(__name__)

EPISODE_REWARDS_KEPT = 10_000
"""The report keeps the returns of (at least) the most recent this many episodes, so a
long run's memory stays flat; ``episodes_completed`` counts them all."""
DRAIN_S = 0.005
"""Longest one socket is read in one go (fairness under floods)."""
POLL_MS = 50
"""Longest a poll blocks, so timers (heartbeats, timeouts) run on time."""
SHUTDOWN_GRACE_S = 3.0
"""How long the learner waits for every actor's bye after asking them to stop."""
HEARTBEAT_INTERVAL_S = 1.0


def largest_fragment_bytes(observation_space: Any, action_space: Any, fragment_length: int) -> int:
    """Twice the encoded size of the largest legitimate fragment, plus 64 KB: the
    default message limit of the learner's receiving sockets."""
    obs = int(np.prod(observation_space.shape)) * observation_space.dtype.itemsize
    act = 8 * max(1, int(np.prod(action_space.shape or (1,))))
    row = 2 * obs + act + 4 + 1 + 1 + 4 + 4  # obs (+ a final obs), action, r, done x2, v, logp
    return 2 * (fragment_length * row + obs) + 64 * 1024


class LearnerStarved(RuntimeError):
    """No rollout could be completed within ``starvation_timeout``."""


class StopRequested(Exception):
    """Raised inside the loop when :meth:`Learner.request_stop` was called."""


class Learner:
    """Owns the sockets, the policy, the optimiser and the run's bookkeeping."""

    def __init__(
        self,
        cfg: LearnerConfig,
        ppo: PPOConfig | None = None,
        policy_cfg: PolicyConfig | None = None,
        context: zmq.Context | None = None,
        on_update: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        """Bind the sockets and build the policy; ``on_update(row)`` is called after
        every update with the metrics row (for progress displays)."""
        self.cfg = cfg.validate()
        self.on_update = on_update
        self.ppo_cfg = (ppo or PPOConfig()).validate()
        self.policy_cfg = (policy_cfg or PolicyConfig()).validate()
        torch.manual_seed(cfg.seed)
        torch.set_num_threads(cfg.torch_threads)
        probe = gym.make(cfg.env_id)
        self.observation_space = probe.observation_space
        self.action_space = probe.action_space
        probe.close()
        self.max_message_bytes = cfg.max_message_bytes or largest_fragment_bytes(
            self.observation_space, self.action_space, cfg.fragment_length
        )
        self.policy = build_policy(self.observation_space, self.action_space, self.policy_cfg)
        self.trainer = PPOTrainer(self.policy, self.ppo_cfg, seed=cfg.seed)
        self.targets = TargetSettings(
            gamma=cfg.gamma,
            gae_lambda=cfg.gae_lambda,
            use_vtrace=cfg.use_vtrace,
            rho_bar=cfg.vtrace_rho_bar,
            c_bar=cfg.vtrace_c_bar,
            vtrace_lambda=cfg.vtrace_lambda,
            vtrace_weight_advantages=cfg.vtrace_weight_advantages,
        )
        self.reward_scaler = RewardScaler(cfg.gamma) if cfg.normalize_reward else None
        self.run_id = uuid.uuid4().hex[:12]
        self.version = 0
        self.report = LearnerReport(run_id=self.run_id)
        self.counters: Counter[str] = Counter()
        self.members = Membership()
        self.queues = SlotQueues()
        # An actor that follows the staleness valve never has more than its lead
        # queued per slot; anything past this (with slack) is a misbehaving peer.
        self._slot_cap = (
            cfg.effective_max_lead_steps() + cfg.steps_per_broadcast() + cfg.fragment_length
        )
        self.running_reward: dict[SlotKey, float] = {}
        self._short_since: dict[int, float] = {}  # member -> since when the rollout waits on it
        self.started = False
        self.shutting_down = False
        self._stop_reason = ""
        self._last_heartbeat = 0.0
        self._ctx = context or zmq.Context.instance()
        self._bind()
        self.publish_weights(publish=False)
        self._metrics_file = None
        if cfg.run_dir:
            Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
            self._metrics_file = open(Path(cfg.run_dir) / "metrics.jsonl", "a")  # noqa: SIM115

    # ------------------------------------------------------------------ sockets

    def _bind(self) -> None:
        cfg = self.cfg
        receive = SocketOptions(max_message_bytes=self.max_message_bytes)
        self.control = make_socket(self._ctx, zmq.ROUTER, receive)
        # HWMs count frames, not bytes: bound what a stalled learner buffers per
        # peer to about EXPERIENCE_BUFFER_BYTES (senders block; nothing is dropped).
        self.experience = make_socket(
            self._ctx,
            zmq.PULL,
            SocketOptions(
                rcvhwm=max(
                    4, min(EXPERIENCE_HWM, EXPERIENCE_BUFFER_BYTES // self.max_message_bytes)
                ),
                max_message_bytes=self.max_message_bytes,
            ),
        )
        self.weights = make_socket(self._ctx, zmq.PUB, SocketOptions(sndhwm=WEIGHTS_HWM))
        self._auth = None
        if cfg.curve_secret_key:
            public, secret = load_secret_certificate(cfg.curve_secret_key, "curve_secret_key")
            keys = CurveServerKeys(public, secret, cfg.curve_authorized_keys)
            self._auth = start_authenticator(self._ctx, keys)
            for sock in (self.control, self.experience, self.weights):
                apply_curve_server(sock, keys)
            log.info("CURVE on: accepting actors whose keys are in %s", cfg.curve_authorized_keys)
        try:
            self.control.bind(tcp_endpoint(cfg.host, cfg.port))
            self.experience.bind(tcp_endpoint(cfg.host, cfg.experience_port()))
            self.weights.bind(tcp_endpoint(cfg.host, cfg.weights_port()))
        except zmq.ZMQError as exc:
            self.close()
            raise OSError(
                f"cannot bind {cfg.host} ports {cfg.port}-{cfg.port + 2}: {exc} "
                "(choose another --port or stop the other learner)"
            ) from exc
        self.poller = zmq.Poller()
        self.poller.register(self.control, zmq.POLLIN)
        self.poller.register(self.experience, zmq.POLLIN)
        log.info(
            "learner %s listening on %s (control), %d (experience), %d (weights)",
            self.run_id,
            tcp_endpoint(cfg.host, cfg.port),
            cfg.experience_port(),
            cfg.weights_port(),
        )

    def close(self) -> None:
        """Close every socket (linger 0) and the metrics file."""
        for name in ("control", "experience", "weights"):
            sock = getattr(self, name, None)
            if sock is not None:
                sock.close(linger=0)
        if getattr(self, "_auth", None) is not None:
            self._auth.stop()
            self._auth = None
        if getattr(self, "_metrics_file", None):
            self._metrics_file.close()
            self._metrics_file = None

    def __enter__(self) -> Learner:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ the run

    def run(self) -> LearnerReport:
        """Train until the budget is spent (or a stop is requested); shut the actors
        down; write the final checkpoint and report; return the report."""
        cfg = self.cfg
        start = time.monotonic()
        stop_reason = "budget spent"
        try:
            self.wait_for_actors(start)
            while not self._budget_spent():
                metrics = self._one_update()
                solved = self._maybe_evaluate(start, metrics)
                self._log_progress(start, metrics)
                if (
                    cfg.checkpoint_every
                    and self.report.updates_completed % cfg.checkpoint_every == 0
                ):
                    self.checkpoint()
                if solved:
                    stop_reason = f"evaluation reached target_return {cfg.target_return:g}"
                    break
                if self._stop_reason:
                    raise StopRequested(self._stop_reason)
            if not self.report.evaluations or (
                self.report.evaluations[-1]["updates"] != self.report.updates_completed
            ):
                self._evaluate(start)
        except StopRequested as stop:
            stop_reason = str(stop)
            log.warning("stopping: %s", stop_reason)
        self.report.stop_reason = stop_reason
        self.shutdown_actors(stop_reason)
        self.report.wall_seconds = time.monotonic() - start
        self._finish()
        return self.report

    def request_stop(self, reason: str) -> None:
        """Ask the run to end soon (safe from a signal handler): the current wait or
        update finishes, actors are shut down, a checkpoint and report are written."""
        self._stop_reason = reason

    def _budget_spent(self) -> bool:
        """As the reference: no update that would overrun ``total_env_steps`` starts
        (but at least one update runs)."""
        rows = self.cfg.num_steps * max(1, len(self.members.member_slots()))
        return self.report.updates_completed > 0 and (
            self.report.env_steps_consumed + rows > self.cfg.total_env_steps
        )

    def _one_update(self) -> dict[str, float]:
        """Fill, take the rollout, compute targets, run PPO, maybe broadcast."""
        cfg = self.cfg
        self._fill()
        slots = self.members.member_slots()
        rollout = self.queues.take(slots, cfg.num_steps)
        self._account(rollout)
        if hasattr(self.policy, "update_obs_stats"):
            self.policy.update_obs_stats(rollout.obs)
        if self.reward_scaler is not None:
            rollout.rewards = self.reward_scaler.scale(
                rollout.rewards, rollout.terminated | rollout.truncated, rollout.slots
            )
        progress = min(1.0, self.report.env_steps_consumed / cfg.total_env_steps)
        batch, diagnostics = rollout_to_batch(rollout, self.policy, self.targets)
        self.report.env_steps_consumed += rollout.num_steps * rollout.num_slots
        metrics = self.trainer.update(batch, progress)
        self.report.updates_completed += 1
        metrics.update(diagnostics)
        metrics["charts/policy_lag_mean"] = float(self.version - rollout.versions.mean())
        metrics["charts/policy_lag_max"] = float(self.version - rollout.versions.min())
        if self.report.updates_completed % cfg.broadcast_every == 0:
            self.version += 1
            self.publish_weights()
            self._admit_new_actors()
        self.report.final_stats = metrics
        return metrics

    def wait_for_actors(self, start: float) -> None:
        cfg = self.cfg
        log.info("waiting for %d actor(s) to register", cfg.num_actors)
        while self.members.live_count() < cfg.num_actors:
            if self._stop_reason:
                raise StopRequested(self._stop_reason)
            if time.monotonic() - start > cfg.starvation_timeout:
                raise LearnerStarved(
                    f"only {self.members.live_count()} of num_actors={cfg.num_actors} actors "
                    f"registered within starvation_timeout={cfg.starvation_timeout}s"
                )
            self.pump(POLL_MS)
        self.started = True
        log.info("%d actor(s) registered; training starts", len(self.members))

    def _fill(self) -> None:
        """Receive until every member slot holds ``num_steps`` rows."""
        cfg = self.cfg
        deadline = time.monotonic() + cfg.starvation_timeout
        self.pump(0)  # control and heartbeats are served even when data is backlogged
        while True:
            slots = self.members.member_slots()
            if slots and self.queues.ready(slots, cfg.num_steps):
                return
            if not slots and self.members.pending():
                # No member left: the waiting actors join now. A fresh version
                # (same weights) starts their accounting from here, so their
                # valve, which counts from base_version = version + 1, stays exact.
                self.version += 1
                self.publish_weights()
                self._admit_new_actors()
            if self._stop_reason:
                raise StopRequested(self._stop_reason)
            if time.monotonic() > deadline:
                raise LearnerStarved(self._starvation_message(slots))
            self.pump(POLL_MS)

    def _starvation_message(self, slots: list[SlotKey]) -> str:
        short = self.queues.short_slots(slots, self.cfg.num_steps)
        silent = [self.members.get(a) for a in sorted({actor_id for actor_id, _ in short})]
        now = time.monotonic()
        described = ", ".join(
            f"actor {rec.actor_id} ({rec.host} pid {rec.pid}, "
            f"silent for {now - rec.last_seen:.1f}s)"
            for rec in silent
            if rec is not None
        )
        if not described:
            dead = ", ".join(
                f"actor {d['actor_id']} ({d['host']} pid {d['pid']})"
                for d in self.report.dead_actors[-8:]
            )
            described = "no live actor" + (f" (declared dead: {dead})" if dead else "")
        return (
            f"learner starved: no rollout completed within "
            f"starvation_timeout={self.cfg.starvation_timeout}s; waiting on {described}"
        )

    def _account(self, rollout: Any) -> None:
        """Episode bookkeeping in consumption order (as the reference)."""
        done = rollout.terminated | rollout.truncated
        for b, key in enumerate(rollout.slots):
            running = self.running_reward.get(key, 0.0)
            for t in range(rollout.num_steps):
                running += float(rollout.rewards[t, b])
                if done[t, b]:
                    self.report.episode_rewards.append(running)
                    if len(self.report.episode_rewards) > 2 * EPISODE_REWARDS_KEPT:
                        del self.report.episode_rewards[:-EPISODE_REWARDS_KEPT]
                    self.report.episodes_completed += 1
                    running = 0.0
            self.running_reward[key] = running
            self.members.get(key[0]).steps_consumed += rollout.num_steps

    # ------------------------------------------------------------------ receiving

    def pump(self, timeout_ms: int) -> None:
        """Handle every message that arrives within ``timeout_ms``.

        Silent actors are evicted only after what arrived was read: while the
        learner was busy (a long update, an evaluation), live actors' heartbeats
        queued up and must count before anyone is declared dead.
        """
        self._maybe_heartbeat()
        events = dict(self.poller.poll(timeout_ms))
        # Each socket is drained for at most DRAIN_S, so a flood on one of them
        # can neither starve the other nor delay the rollout check.
        if self.control in events:
            end = time.monotonic() + DRAIN_S
            while time.monotonic() < end:
                try:
                    frames = self.control.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                self._on_control(frames)
        if self.experience in events:
            end = time.monotonic() + DRAIN_S
            while time.monotonic() < end:
                try:
                    frame = self.experience.recv(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                self._on_experience(frame)
        self._evict_silent_actors()

    def _reject(self, where: str, reason: str, detail: str) -> None:
        key = f"rejected/{where}/{reason}"
        self.counters[key] += 1
        if self.counters[key] in (1, 10, 100, 1000, 10000, 100000):
            log.warning(
                "rejected %s message #%d (%s): %s", where, self.counters[key], reason, detail
            )

    def _sender_key(self, frame: zmq.Frame) -> str:
        """The CURVE public key (z85) that sent ``frame``; empty without CURVE."""
        if self._auth is None:
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
        problem = check_fragment(
            fragment,
            self.members,
            self.run_id,
            self.version,
            self.observation_space,
            self.action_space,
        )
        if problem:
            self._reject("experience", *problem)
            return
        rec = self.members.get(fragment.actor_id)
        assert rec is not None
        if rec.key != self._sender_key(frame):
            self._reject(
                "experience",
                "wrong_sender",
                f"fragment for actor {rec.actor_id} sent with another CURVE key",
            )
            return
        expected = rec.next_seq[fragment.slot]
        if expected is not None and fragment.seq < expected:
            self._reject(
                "experience",
                "old_seq",
                f"actor {rec.actor_id} slot {fragment.slot} seq {fragment.seq} "
                f"< expected {expected}",
            )
            return
        if expected is not None and fragment.seq > expected:
            self.counters["experience/seq_gaps"] += fragment.seq - expected
        queued = self.queues.rows((rec.actor_id, fragment.slot))
        if queued + fragment.length > self._slot_cap:
            self._reject(
                "experience",
                "over_lead",
                f"actor {rec.actor_id} slot {fragment.slot} would queue "
                f"{queued + fragment.length} rows > {self._slot_cap}: it ignores the "
                "staleness valve",
            )
            return
        rec.next_seq[fragment.slot] = fragment.seq + 1
        rec.last_seen = rec.last_fragment = time.monotonic()
        rec.fragments_received += 1
        rec.steps_received += fragment.length
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
            self._send_control(
                routing_id,
                Refuse(
                    "reregister",
                    f"actor {message.actor_id} is not registered "
                    f"in run {self.run_id}; say hello again",
                ),
            )
            return
        actor_id = rec.actor_id
        rec.last_seen = time.monotonic()
        if isinstance(message, Bye):
            rec.said_bye = True
            rec.bye_stats = message.stats
            rec.bye_last_seq = message.last_seq
            log.info("actor %d said bye: %s", actor_id, message.stats)
            if not self.shutting_down:
                rec.member = False
                fragments, rows = self.queues.drop_actor(actor_id)
                self.counters["discarded/steps/actor_left"] += rows
                self.counters["discarded/fragments/actor_left"] += fragments

    def _on_hello(self, routing_id: bytes, hello: Hello, key: str = "") -> None:
        problem = check_hello(
            self.members,
            routing_id,
            hello,
            self.cfg.env_id,
            self.observation_space,
            self.action_space,
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
            version=self.version,
            started=self.started,
            default_envs=self.cfg.envs_per_actor,
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
        config = {
            "env_id": cfg.env_id,
            "observation_space": space_spec(self.observation_space),
            "action_space": space_spec(self.action_space),
            "policy": config_dict(self.policy_cfg),
            "num_steps": cfg.num_steps,
            "broadcast_every": cfg.broadcast_every,
            "steps_per_broadcast": cfg.steps_per_broadcast(),
            "max_lead_steps": cfg.effective_max_lead_steps(),
            "fragment_length": cfg.fragment_length,
            "num_envs": rec.num_envs,
            "seed": cfg.seed,
            "heartbeat_interval": HEARTBEAT_INTERVAL_S,
        }
        return Welcome(
            actor_id=rec.actor_id,
            run_id=self.run_id,
            base_version=rec.base_version,
            experience_port=cfg.experience_port(),
            weights_port=cfg.weights_port(),
            config=config,
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
        if now - self._last_heartbeat < HEARTBEAT_INTERVAL_S:
            return
        self._last_heartbeat = now
        beat = Heartbeat(actor_id=-1, run_id=self.run_id, version=self.version)
        for rec in self.members:
            if not rec.said_bye:
                self._send_control(rec.routing_id, beat)

    def _evict_silent_actors(self) -> None:
        """Declare dead every actor silent for ``actor_timeout``: its slots leave the
        rollout being filled and what it had queued is discarded (counted)."""
        if self.shutting_down:
            return
        now = time.monotonic()
        slots = self.members.member_slots()
        short = {a for a, _ in self.queues.short_slots(slots, self.cfg.num_steps)}
        for actor_id in list(self._short_since):
            if actor_id not in short:
                del self._short_since[actor_id]
        for actor_id in short:
            self._short_since.setdefault(actor_id, now)
        for rec in self.members.silent(now, self.cfg.actor_timeout, self._short_since):
            silent = now - rec.last_seen
            log.warning(
                "actor %d (%s pid %d) silent for %.1fs > actor_timeout=%gs: declared dead",
                rec.actor_id,
                rec.host,
                rec.pid,
                silent,
                self.cfg.actor_timeout,
            )
            self.report.dead_actors.append(
                {
                    "actor_id": rec.actor_id,
                    "host": rec.host,
                    "pid": rec.pid,
                    "silent_seconds": round(silent, 3),
                    "at_update": self.report.updates_completed,
                    "at_version": self.version,
                }
            )
            self.counters["actors/declared_dead"] += 1
            self._forget(self.members.remove(rec.actor_id), "actor_dead")

    def _forget(self, rec: ActorRecord, reason: str) -> None:
        """Discard (and count) what a removed actor had queued; keep its report line."""
        for key in rec.slots():  # its unfinished episodes lost rows: start afresh
            self.running_reward.pop(key, None)
        fragments, rows = self.queues.drop_actor(rec.actor_id)
        if rows:
            self.counters[f"discarded/steps/{reason}"] += rows
            self.counters[f"discarded/fragments/{reason}"] += fragments
        self.report.departed_actors.append({**rec.summary(), "left_because": reason})

    def _admit_new_actors(self) -> None:
        for rec in self.members.admit_pending():
            log.info("actor %d joins the rollout at version %d", rec.actor_id, self.version)

    # ------------------------------------------------------------------ weights

    def publish_weights(self, publish: bool = True) -> None:
        self.current_weights = Weights(
            version=self.version, run_id=self.run_id, tensors=export_weights(self.policy)
        )
        if publish:
            self.weights.send(encode(self.current_weights), copy=False)
            self.report.broadcasts_sent += 1
            self.report.last_policy_version = self.version

    # ------------------------------------------------------------------ evaluation & output

    def _maybe_evaluate(self, start: float, metrics: dict[str, float]) -> bool:
        every = self.cfg.eval_every
        if every and self.report.updates_completed % every == 0:
            result = self._evaluate(start)
            metrics["eval/mean_return"] = result["mean_return"]
            return result["mean_return"] >= self.cfg.target_return
        return False

    def _evaluate(self, start: float) -> dict[str, float]:
        mean, std = evaluate_policy(
            self.policy, self.cfg.env_id, self.cfg.eval_episodes, seed=self.cfg.seed + 10_000
        )
        result = {
            "updates": self.report.updates_completed,
            "env_steps": self.report.env_steps_consumed,
            "wall_seconds": time.monotonic() - start,
            "mean_return": mean,
            "std_return": std,
        }
        self.report.evaluations.append(result)
        log.info(
            "evaluation after %d steps: %.1f ± %.1f over %d episodes",
            result["env_steps"],
            mean,
            std,
            self.cfg.eval_episodes,
        )
        return result

    def _log_progress(self, start: float, metrics: dict[str, float]) -> None:
        elapsed = time.monotonic() - start
        report = self.report
        row = {
            "update": report.updates_completed,
            "env_steps": report.env_steps_consumed,
            "wall_seconds": elapsed,
            "version": self.version,
            "charts/SPS": report.env_steps_consumed / max(elapsed, 1e-9),
            "charts/mean_return": report.mean_recent_episode_reward(100),
            "charts/episodes": report.episodes_completed,
            "charts/actors": sum(1 for r in self.members if r.member),
            **metrics,
        }
        if self._metrics_file is not None:
            self._metrics_file.write(json.dumps(row) + "\n")
            self._metrics_file.flush()
        if self.on_update is not None:
            self.on_update(row)
        log.info(
            "update %d/%d  steps %d  %.0f steps/s  return %.1f  actors %d  lag %.2f  "
            "loss %.3f  entropy %.3f",
            report.updates_completed,
            self.cfg.num_updates(),
            report.env_steps_consumed,
            row["charts/SPS"],
            row["charts/mean_return"],
            row["charts/actors"],
            metrics["charts/policy_lag_mean"],
            metrics.get("losses/policy_loss", math.nan),
            metrics.get("losses/entropy", math.nan),
        )

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

    def _finish(self) -> None:
        for rec in self.members:
            self.report.actor_stats[str(rec.actor_id)] = rec.summary()
        self.counters["consumed/steps"] = self.report.env_steps_consumed
        queued = self.queues.total_rows()
        if queued:
            self.counters["discarded/steps/run_ended"] += queued
            self.queues = SlotQueues()  # counted; the final checkpoint holds none
        self.report.counters = dict(self.counters)
        if self.cfg.run_dir:
            run_dir = Path(self.cfg.run_dir)
            self.checkpoint()
            atomic_write_bytes(run_dir / "report.json", self.report.to_json().encode())
            self.save_policy(run_dir / "policy.pt")

    def save_policy(self, path: Path) -> None:
        """Save the policy (tensors + the config needed to rebuild it), atomically."""
        state = {
            "policy": self.policy.state_dict(),
            "policy_config": json.dumps(config_dict(self.policy_cfg)),
            "env_id": self.cfg.env_id,
            "version": self.version,
        }
        atomic_torch_save(state, path)

    # ------------------------------------------------------------------ checkpoints

    def checkpoint(self) -> Path | None:
        """Write a checkpoint into ``run_dir/checkpoints`` atomically (temp + rename):
        policy, optimiser, version, counters, report, configs and RNG states. Keeps
        the newest :data:`CHECKPOINTS_KEPT`. Returns the path (None without run_dir)."""
        if not self.cfg.run_dir:
            return None
        report = asdict(self.report)
        state = {
            "trainer": self.trainer.state_dict(),
            "version": self.version,
            "learner_config": json.dumps(config_dict(self.cfg)),
            "ppo_config": json.dumps(config_dict(self.ppo_cfg)),
            "policy_config": json.dumps(config_dict(self.policy_cfg)),
            "report": json.dumps(report, default=float),
            "counters": json.dumps(dict(self.counters)),
            "queued": json.dumps([self.queues.total_rows(), self.queues.total_fragments()]),
            "running_reward": json.dumps([[a, b, r] for (a, b), r in self.running_reward.items()]),
            "torch_rng": torch.get_rng_state(),
            "reward_scaler": json.dumps(self.reward_scaler.state() if self.reward_scaler else None),
        }
        path = write_checkpoint(
            Path(self.cfg.run_dir) / "checkpoints",
            f"ckpt-{self.report.updates_completed:08d}.pt",
            state,
        )
        log.info("checkpoint %s (version %d)", path, self.version)
        return path

    @classmethod
    def resume(
        cls,
        run_dir: str | Path,
        context: zmq.Context | None = None,
        on_update: Callable[[dict[str, Any]], None] | None = None,
        **learner_overrides: Any,
    ) -> Learner:
        """A learner continuing the newest checkpoint in ``run_dir``: same configs
        (``learner_overrides`` may change e.g. host, port or the budget), same
        policy, optimiser, counters and report; version numbering continues. A new
        run id tells the actors that the learner restarted, so they re-register."""
        path = newest_checkpoint(run_dir)
        state = read_checkpoint(path)
        cfg, ppo, policy_cfg = checkpoint_configs(state, path, run_dir, **learner_overrides)
        learner = cls(cfg, ppo, policy_cfg, context=context, on_update=on_update)
        learner.trainer.load_state_dict(state["trainer"])
        learner.version = int(state["version"])
        report = json.loads(state["report"])
        for key, value in report.items():
            if key not in ("run_id", "actor_stats"):
                setattr(learner.report, key, value)
        learner.report.resumed_from = str(path)
        learner.counters.update(json.loads(state["counters"]))
        learner.counters["learner/resumes"] += 1
        # Rows that were received but still queued when the checkpoint was written
        # died with the old learner: count them, so received = consumed + discarded.
        rows, fragments = json.loads(state.get("queued", "[0, 0]"))
        if rows:
            learner.counters["discarded/steps/learner_restart"] += rows
            learner.counters["discarded/fragments/learner_restart"] += fragments
        learner.running_reward = {
            (int(a), int(b)): float(r) for a, b, r in json.loads(state["running_reward"])
        }
        torch.set_rng_state(state["torch_rng"])
        scaler_state = json.loads(state.get("reward_scaler", "null"))
        if learner.reward_scaler is not None and scaler_state:
            learner.reward_scaler.load(scaler_state)
        learner.publish_weights(publish=False)
        log.info(
            "resumed %s at update %d, version %d, %d env steps consumed",
            path,
            learner.report.updates_completed,
            learner.version,
            learner.report.env_steps_consumed,
        )
        return learner
