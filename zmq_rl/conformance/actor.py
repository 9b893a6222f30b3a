"""``zmq-rl conformance actor -- CMD ARGS...``: drive an actor command through the
clauses of docs/protocol.md (section 11.2).

The learner here is zmq_rl's own receiving side (:class:`~zmq_rl.learner.ingest.Ingest`: the
real sockets, decode, membership and fragment checks, heartbeats, welcomes) with a
*scripted* training loop instead of PPO: it takes a rollout whenever every member
slot holds ``num_steps`` rows and publishes the next version (the same tensors),
except when the scenario holds the broadcasts back. An actor whose hello announces
``grants`` is paced with grants (docs/protocol.md section 5.4.1): the welcome's grant
and, after each broadcast, a heartbeat's larger one, as large as the ``S``/``L``
budget, except in the valve phase, where the version comes first and the grant after
it. Every frame the actor sends is also decoded and recorded here, so each clause is
judged on what actually crossed the sockets. The scenario: registration; steady
broadcasts; a pause of the broadcasts (the valve must hold the actor at exactly its
budget) and a release; a learner restart on the same ports with a new run id; a
shutdown. Then the command runs once more against a learner that answers in protocol
1.

The actor command gets the learner's address as ``ZMQ_RL_LEARNER=HOST:PORT`` in its
environment, and every ``{learner}`` in its arguments is replaced by it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import subprocess
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import zmq

from ..config import LearnerConfig, PolicyConfig
from ..learner.ingest import Ingest
from ..learner.membership import ActorRecord
from ..learner.report import LearnerReport
from ..learner.settings import run_settings
from ..rl.masking import mask_key
from ..wire.ports import free_port_block
from ..wire.protocol import (
    FEATURE_GRANTS,
    FEATURE_POLICIES,
    Bye,
    Fragment,
    Heartbeat,
    Hello,
    Shutdown,
    Weights,
    encode,
)
from ..wire.spaces import leaves, map_value
from ..wire.transport import SocketOptions, make_socket, tcp_endpoint
from .report import Clause, Report

__all__ = ["ActorCheckOptions", "CLAUSES", "check_actor"]

log = logging.getLogger(__name__)

LEARNER_ENV = "ZMQ_RL_LEARNER"
"""The environment variable that hands the actor under test the learner's address."""
PUMP_MS = 20
TURN_HELD_ROWS = 2
"""Rows per slot of a turn-based game chosen before a release that may arrive after it
(each seat's held move, and the round the pause interrupted)."""
CONFIRM_QUIET = 3
"""A pause short of the valve budget fails an actor only once it lasted this many
times ``quiet``: a pause that ends the check early costs ``quiet``, a failing one
is confirmed."""

CLAUSES = {
    c.id: c
    for c in (
        Clause("registration", "5.1", "MUST", "a protocol-2 hello is answered with a welcome"),
        Clause(
            "heartbeats",
            "5.5",
            "MUST",
            "a heartbeat with the token at least every heartbeat_interval, also while paused",
        ),
        Clause(
            "fragment-rows",
            "4.1",
            "MUST",
            "every fragment decodes and fits the run, the registration and the spaces",
        ),
        Clause("contiguity", "4.1.1", "MUST", "a slot's rows continue from its last next_obs"),
        Clause("truncation", "4.1.1", "MUST", "truncated, non-terminated cells carry final_obs"),
        Clause("seq", "4.1.2", "MUST", "seq is 0, 1, 2, ... in every registration"),
        Clause("version", "4.1.2", "MUST", "fragments carry a published version, never lower"),
        Clause("weights-pickup", "5.2", "MUST", "a new version is acting within N steps per slot"),
        Clause(
            "weights-nonblocking",
            "5.2",
            "MUST",
            "without new weights the actor steps on to its valve budget",
        ),
        Clause(
            "valve-holds", "5.4", "MUST", "no slot runs past max(0, v - b) * S + L (or its grant)"
        ),
        Clause("valve-flush", "5.4", "MUST", "a paused actor has sent every row it recorded"),
        Clause(
            "valve-resume",
            "5.4",
            "MUST",
            "a new version (under grants: a larger grant) releases the paused actor, acting "
            "on the new version",
        ),
        Clause(
            "restart",
            "5.6",
            "MUST",
            "after a learner restart: a new registration, streaming under the new token",
        ),
        Clause("rejoin-run-id", "4.3", "SHOULD", "the new hello names the old run"),
        Clause("shutdown-bye", "5.7", "MUST", "shutdown is answered with a bye"),
        Clause(
            "bye-last-seq",
            "4.8",
            "MUST",
            "bye.last_seq is the last fragment sent; every one arrived; none follows",
        ),
        Clause("exit", "5.7", "SHOULD", "the actor stops (its process ends) after its bye"),
        Clause("version-mismatch", "4.5", "MUST", "a reply in protocol 1 stops the actor for good"),
        Clause(
            "valid-rows",
            "4.1.4",
            "MUST",
            "multi-agent: a row that is not valid follows its slot's ended agent, also across "
            "fragments (SKIP for a single-agent env, or if no such row occurred)",
        ),
        Clause(
            "action-masks",
            "7.2",
            "MUST",
            "masked actions: every valid row's action is one its own action_mask allows "
            "(SKIP for an env without masks)",
        ),
        Clause(
            "grants",
            "5.4.1",
            "MUST",
            "an actor that announces 'grants' follows them: a new version does not release "
            "it from its grant, a larger grant does (SKIP: it does not announce 'grants')",
        ),
        Clause(
            "policies-feature",
            "4.9",
            "MUST",
            "several policies: the hello announces 'policies' (SKIP for a run of one policy)",
        ),
    )
}


@dataclass(frozen=True)
class ActorCheckOptions:
    """The scenario's sizes and timeouts (each a ``zmq-rl conformance actor`` flag)."""

    env_id: str = "CartPole-v1"
    env_kwargs: str = ""  # keyword arguments of the env (--env-kwargs), in the welcome too
    policy_map: str = ""  # several policies (--policy-map AGENT=POLICY,...): docs 4.9
    host: str = "127.0.0.1"
    port: int = 0  # 0: a free block of three ports
    num_steps: int = 8
    fragment_length: int = 3
    max_lead_steps: int = 20
    heartbeat_interval: float = 0.5
    heartbeat_slack: float = 1.0
    steady_versions: int = 2
    pickup_steps: int = 0  # 0: max_lead_steps + fragment_length
    register_timeout: float = 60.0
    phase_timeout: float = 20.0
    quiet: float = 1.5
    shutdown_timeout: float = 5.0
    exit_timeout: float = 5.0
    mismatch_timeout: float = 10.0
    output: str = ""  # file for the actor's stdout/stderr ("": a temporary file)

    @property
    def pickup(self) -> int:
        """Rows per slot of an older version allowed after a broadcast."""
        return self.pickup_steps or self.max_lead_steps + self.fragment_length


@dataclass
class Registration:
    """What one welcome started, and what the actor sent under its token."""

    token: bytes
    actor_id: int
    base_version: int
    num_envs: int
    welcomed_at: float
    run_id: str
    hello: Hello
    next_seq: int = 0  # the learner's expectation (accepted fragments)
    wire_seq: int = 0  # the next seq the actor should put on the wire
    seq_problems: list[str] = field(default_factory=list)
    last_version: int = 0
    rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    last_next: dict[int, Any] = field(default_factory=dict)
    open_end: dict[int, bool] = field(default_factory=dict)  # slot -> last row valid, not ended
    heartbeats: list[float] = field(default_factory=list)
    fragments: int = 0
    last_fragment_at: float = 0.0
    max_seq: int = -1
    bye: Bye | None = None
    bye_at: float = 0.0
    after_bye: int = 0
    grant: int | None = None  # the largest grant sent (None: the S/L valve)

    def __post_init__(self) -> None:
        self.rows = np.zeros(self.num_envs, np.int64)


class Observer:
    """Every frame the actor sent, judged as it arrives (the clause evidence)."""

    def __init__(self, options: ActorCheckOptions) -> None:
        self.options = options
        self.registrations: list[Registration] = []
        self.by_token: dict[bytes, Registration] = {}
        self.problems: dict[str, list[str]] = {}
        self.hellos: list[tuple[float, Hello]] = []
        self.published: list[tuple[float, int]] = []  # (time, version)
        self.version = 0
        self.truncated_cells = 0
        self.max_over_budget = 0
        self.stale_rows: dict[int, Counter[int]] = {}  # publish version -> rows per slot
        self.first_version_after: dict[int, int] = {}  # publish version -> first version seen
        self.fragment_count = 0
        self.quiet_since = time.monotonic()
        self.run_id = ""  # the learner's current run
        self.stale_run_fragments = 0
        self.not_valid_rows = 0
        self.valid_rows = 0

    def problem(self, clause: str, text: str) -> None:
        """Note evidence against ``clause`` (the first few are reported)."""
        self.problems.setdefault(clause, []).append(text)

    @property
    def current(self) -> Registration | None:
        """The newest registration."""
        return self.registrations[-1] if self.registrations else None

    def budget(self, reg: Registration) -> int:
        """The valve budget of ``reg``: its grant, or ``max(0, v - b) * S + L`` under the
        newest published version."""
        if reg.grant is not None:
            return reg.grant
        opt = self.options
        return max(0, self.version - reg.base_version) * opt.num_steps + opt.max_lead_steps

    def on_fragment(self, fragment: Fragment | None, reason: str | None, now: float) -> None:
        """A frame on PULL: decoded (or None) and the learner's reject reason (or None)."""
        self.fragment_count += 1
        self.quiet_since = now
        if fragment is None:
            self.problem("fragment-rows", f"undecodable fragment ({reason})")
            return
        reg = self.by_token.get(fragment.token)
        if reg is None:
            self.problem("fragment-rows", f"fragment with an unknown token ({reason})")
            return
        if reg.bye is not None:
            reg.after_bye += 1
        if reason in ("old_seq", "seq_jump"):
            # Judged on the wire below: with a gap-free numbering these only follow
            # earlier rejects (the learner's expectation stays behind).
            pass
        elif reason == "bad_version":
            self.problem("version", f"version {fragment.version} > published {self.version}")
        elif reason == "over_lead":
            self.problem("valve-holds", "a fragment was rejected as over_lead")
        elif reason == "masked_action":
            self.problem("action-masks", f"seq {fragment.seq} rejected: masked_action")
        elif reason in ("other_run", "unknown_actor") and reg.run_id != self.run_id:
            # Sent to the previous run before the actor learned of the restart: lost, as
            # the page says (its queue reconnected to the new learner).
            self.stale_run_fragments += 1
        elif reason is not None:
            self.problem("fragment-rows", f"seq {fragment.seq} rejected: {reason}")
        if reg.run_id == self.run_id:  # (to another run, fragments may be lost in flight)
            if fragment.seq != reg.wire_seq:
                reg.seq_problems.append(f"seq {fragment.seq} where {reg.wire_seq} was due")
            reg.wire_seq = fragment.seq + 1
        if reason is None:
            reg.next_seq = fragment.seq + 1
        reg.max_seq = max(reg.max_seq, fragment.seq)
        reg.fragments += 1
        reg.last_fragment_at = now
        if fragment.version < reg.last_version:
            self.problem("version", f"version {fragment.version} after {reg.last_version}")
        reg.last_version = max(reg.last_version, fragment.version)
        length = fragment.length
        for b, slot in enumerate(fragment.slots.tolist()):
            if slot >= reg.num_envs:
                continue
            last = reg.last_next.get(slot)
            first = map_value(lambda a, b=b: a[0, b], fragment.obs)
            if reason is not None:
                reg.last_next.pop(slot, None)  # lost rows: the next accepted ones start afresh
            else:
                stand_in = fragment.valid is not None and not fragment.valid[0, b]  # (4.1.4)
                if (
                    last is not None
                    and not stand_in
                    and not all(
                        np.array_equal(x, y)
                        for x, y in zip(leaves(first), leaves(last), strict=False)
                    )
                ):
                    self.problem("contiguity", f"slot {slot}: seq {fragment.seq} does not continue")
                reg.last_next[slot] = map_value(lambda a, b=b: np.array(a[b]), fragment.next_obs)
                self.judge_valid(reg, fragment, b, slot)
            reg.rows[slot] += length
        self.truncated_cells += int(fragment.final_obs_index.shape[0])
        over = int(reg.rows.max()) - self.budget(reg) if reg.rows.size else 0
        if over > 0 and reg is self.current:
            self.max_over_budget = max(self.max_over_budget, over)
        for published, counts in self.stale_rows.items():
            if fragment.version < published:
                for slot in fragment.slots.tolist():
                    counts[slot] += length
            self.first_version_after.setdefault(published, fragment.version)

    def judge_valid(self, reg: Registration, fragment: Fragment, b: int, slot: int) -> None:
        """Section 4.1.4 across fragments (decoding checked it within one): a row that
        is not valid never follows a valid row of its slot that did not end."""
        valid = fragment.valid
        column = np.ones(fragment.length, bool) if valid is None else valid[:, b]
        ended = fragment.terminated[:, b] | fragment.truncated[:, b]
        if not column[0] and reg.open_end.get(slot, False):
            self.problem(
                "valid-rows",
                f"slot {slot}: seq {fragment.seq} opens with a row that is not valid after "
                "a valid row that did not end its episode (in the fragment before)",
            )
        self.not_valid_rows += int((~column).sum())
        self.valid_rows += int(column.sum())
        reg.open_end[slot] = bool(column[-1] and not ended[-1])

    def on_publish(self, version: int, now: float) -> None:
        """The learner broadcast ``version``."""
        self.version = version
        self.published.append((now, version))
        self.stale_rows[version] = Counter()


class IngestWatch:
    """Hands what the learner's receiving side handled to an :class:`Observer`, through
    the ingest's public hooks (:class:`~zmq_rl.learner.ingest.IngestObserver`)."""

    def __init__(self, ingest: Ingest, observer: Observer) -> None:
        self.ingest, self.observer = ingest, observer

    def on_experience(self, fragment: Fragment | None, rejected: str | None) -> None:
        """A fragment (None: it did not decode) and why it was rejected (None: queued)."""
        self.observer.on_fragment(fragment, rejected, time.monotonic())

    def on_control(self, message: Hello | Heartbeat | Bye, rec: ActorRecord | None) -> None:
        """A hello (with the record it registered) or a heartbeat or bye."""
        now, obs = time.monotonic(), self.observer
        if isinstance(message, Hello):
            obs.hellos.append((now, message))
            if rec is not None:
                reg = Registration(
                    token=rec.token,
                    actor_id=rec.actor_id,
                    base_version=rec.base_version,
                    num_envs=rec.num_envs,
                    welcomed_at=now,
                    run_id=self.ingest.run_id,
                    hello=message,
                    grant=rec.grant,
                )
                obs.registrations.append(reg)
                obs.by_token[rec.token] = reg
        elif message.token in obs.by_token:
            reg = obs.by_token[message.token]
            if isinstance(message, Heartbeat):
                reg.heartbeats.append(now)
            elif reg.bye is None:
                reg.bye, reg.bye_at = message, now


class ScriptedLearner:
    """A learner run made of the learner's :class:`~zmq_rl.learner.ingest.Ingest`
    (watched by an :class:`IngestWatch`) and a scripted update loop."""

    def __init__(self, options: ActorCheckOptions, observer: Observer, port: int) -> None:
        from ..envs import env_shape
        from ..learner.settings import policy_plan
        from ..rl.numpy_mlp import rng_of
        from ..rl.numpy_nets import fresh_weights

        self.options, self.observer = options, observer
        self.cfg = LearnerConfig(
            env_id=options.env_id,
            env_kwargs=options.env_kwargs,
            policy_map=options.policy_map,
            host=options.host,
            port=port,
            num_actors=1,
            num_steps=options.num_steps,
            fragment_length=options.fragment_length,
            max_lead_steps=options.max_lead_steps,
            actor_timeout=600.0,
            starvation_timeout=600.0,
        ).validate()
        # A gymnasium env or a multi-agent (PettingZoo) one: its agents' shared spaces,
        # agents_per_env slots per env copy (docs/protocol.md 4.1.4).
        self.shape = shape = env_shape(options.env_id, options.env_kwargs)
        spaces = (shape.observation_space, shape.action_space)
        policy_cfg = PolicyConfig().validate()
        self.plan = plan = policy_plan(self.cfg, policy_cfg, shape)
        self.tensors = {  # each policy's ("": the one policy's)
            pid: fresh_weights(*spaces, config, rng_of(i))  # (numpy: no torch on this host)
            for i, (pid, config) in enumerate(
                (plan.configs if plan.several else {"": policy_cfg}).items()
            )
        }
        self.version = 0
        self.run_id = "x" * 12  # (for the weights' size; start() gives each run its own)
        largest = max(len(encode(w)) for w in self._weights())
        settings = run_settings(
            self.cfg,
            *spaces,
            policy_cfg,
            weights_bytes=largest,
            agents_per_env=shape.agents_per_env,
            plan=plan,
        )
        self.settings = dataclasses.replace(settings, heartbeat_interval=options.heartbeat_interval)
        self.counters: Counter[str] = Counter()
        self.ingest: Ingest | None = None

    def start(self, bind_timeout: float = 5.0) -> None:
        """Bind a fresh run (a new run id) on the configured ports (retrying while the
        previous run's sockets are still being closed, at most ``bind_timeout``)."""
        self.run_id = uuid.uuid4().hex[:12]
        deadline = time.monotonic() + bind_timeout
        while True:
            try:
                ingest = Ingest(
                    self.cfg,
                    self.settings,
                    run_id=self.run_id,
                    report=LearnerReport(run_id=self.run_id),
                    counters=self.counters,
                    version=lambda: self.version,
                    forget_slots=lambda keys: None,
                    context=zmq.Context.instance(),
                )
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                zmq.Poller().poll(50)  # the old listener is still closing
        ingest.observer = IngestWatch(ingest, self.observer)
        ingest.grant_for = self.first_grant
        self.observer.run_id = self.run_id
        ingest.publish(self._weights(), send=False)
        self.ingest = ingest

    def stop(self) -> None:
        """Close every socket (the learner is gone)."""
        if self.ingest is not None:
            self.ingest.close()
            self.ingest = None

    def current_weights(self) -> list[Weights]:
        """The current version's weights under the current run id (one per policy)."""
        return self._weights()

    def _weights(self) -> list[Weights]:
        return [
            Weights(version=self.version, run_id=self.run_id, tensors=tensors, policy=pid)
            for pid, tensors in self.tensors.items()
        ]

    def pump(self, train: bool) -> None:
        """Serve the sockets once; with ``train``, take a rollout and broadcast when one
        is ready."""
        ingest = self.ingest
        assert ingest is not None
        ingest.pump(PUMP_MS)
        if train:
            self.update()

    def update(self, regrant: bool = True) -> bool:
        """Take a rollout if every member slot has one; publish version + 1; then (with
        ``regrant``) raise the grants the rollout used."""
        ingest = self.ingest
        assert ingest is not None
        slots = ingest.members.member_slots()
        if not slots or not ingest.queues.ready(slots, self.cfg.num_steps):
            return False
        ingest.queues.take(slots, self.cfg.num_steps)
        self.version += 1
        ingest.publish(self._weights())
        ingest.members.admit_pending()
        self.observer.on_publish(self.version, time.monotonic())
        if regrant:
            self.regrant()
        return True

    def granted(self, rec: ActorRecord) -> int:
        """The grant of ``rec`` now: the ``S``/``L`` budget of the newest version (the
        rows of its slots every rollout since its base version used, plus the lead)."""
        settings = self.settings
        proven = max(0, self.version - rec.base_version) * settings.steps_per_broadcast
        return proven + settings.max_lead_steps

    def first_grant(self, rec: ActorRecord, hello: Hello) -> int | None:
        """The welcome's grant of an actor that announced ``grants`` (None: S and L)."""
        return self.granted(rec) if FEATURE_GRANTS in hello.features else None

    def regrant(self) -> None:
        """Raise each grant to :meth:`granted` and tell its actor in a heartbeat at once."""
        ingest = self.ingest
        assert ingest is not None
        for rec in ingest.members:
            grant = self.granted(rec)
            if rec.grant is None or rec.said_bye or grant <= rec.grant:
                continue
            rec.grant = grant
            reg = self.observer.by_token.get(rec.token)
            if reg is not None:
                reg.grant = grant
            ingest.send_heartbeat(rec)

    def shutdown(self) -> None:
        """Send ``shutdown`` to every registration (and keep serving)."""
        ingest = self.ingest
        assert ingest is not None
        ingest.shutting_down = True
        for rec in ingest.members:
            ingest.send_control(rec.routing_id, Shutdown("conformance run over", self.run_id))


class ActorProcess:
    """The actor command, with the learner address in its environment."""

    def __init__(self, command: Sequence[str], address: str, output: Path) -> None:
        self.output = output
        env = {**os.environ, LEARNER_ENV: address}
        args = [part.replace("{learner}", address) for part in command]
        self.out = open(output, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(args, env=env, stdout=self.out, stderr=subprocess.STDOUT)

    def alive(self) -> bool:
        """Whether the process still runs."""
        return self.proc.poll() is None

    def wait(self, timeout: float) -> int | None:
        """Its exit code, waiting up to ``timeout``; None if it still runs."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> None:
        """Terminate (then kill) it if it still runs; close its output."""
        if self.alive():
            self.proc.terminate()
            if self.wait(5.0) is None:
                self.proc.kill()
                self.proc.wait(5.0)
        self.out.close()

    def tail(self, lines: int = 5) -> str:
        """The last lines of its output (for the report)."""
        self.out.flush()
        text = self.output.read_text(errors="replace").strip().splitlines()
        return " | ".join(text[-lines:])


class Scenario:
    """The scripted run against one actor process."""

    def __init__(self, options: ActorCheckOptions, command: Sequence[str], report: Report):
        self.options = options
        self.command = list(command)
        self.report = report
        self.observer = Observer(options)
        self.port = options.port or free_port_block(host=options.host)
        self.learner = ScriptedLearner(options, self.observer, self.port)
        self.address = f"{options.host}:{self.port}"
        if options.output:
            self.output = Path(options.output)
        else:
            handle, name = tempfile.mkstemp(prefix="zmq-rl-conformance-", suffix=".log")
            os.close(handle)
            self.output = Path(name)
        self.actor: ActorProcess | None = None
        self.down: tuple[float, float] | None = None  # the restart window
        self.shutdown_at: float | None = None

    def record(self, clause: str, ok: bool | None, seen: str) -> None:
        """Record a clause result (see :meth:`Report.record`)."""
        self.report.record(CLAUSES[clause], ok, seen)

    def pump_until(self, done: Callable[[], bool], timeout: float, train: bool) -> bool:
        """Serve the learner until ``done()`` or ``timeout`` seconds; False on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.learner.pump(train)
            if done():
                return True
        return False

    def run(self) -> None:
        """Every phase; the clauses are recorded as they are decided."""
        self.learner.start()
        self.actor = ActorProcess(self.command, self.address, self.output)
        try:
            if self.register():
                self.steady(self.options.steady_versions)
                if self.valve():
                    self.steady(1)
                if self.restart():
                    self.steady(1)
                    self.until_truncation()
                self.shutdown()
            self.judge_stream()
        finally:
            self.actor.stop()
            self.learner.stop()
        self.mismatch()

    # ---------------------------------------------------------------- phases

    def register(self) -> bool:
        """Wait for the first registration."""
        obs, opt = self.observer, self.options
        ok = self.pump_until(
            lambda: bool(obs.registrations) or not self.actor.alive(),
            opt.register_timeout,
            train=False,
        )
        if not obs.registrations:
            why = "the actor exited" if not self.actor.alive() else f"{opt.register_timeout:g}s"
            hellos = len(obs.hellos)
            refused = {k: v for k, v in self.learner.counters.items() if k.startswith("refused/")}
            bad = {k: v for k, v in self.learner.counters.items() if "control" in k}
            self.record(
                "registration",
                False,
                f"no registration ({why}); {hellos} hello(s), {refused or bad or 'no frame'}; "
                f"actor output: {self.actor.tail()}",
            )
            return False
        assert ok
        reg = obs.registrations[0]
        self.learner.ingest.started = True
        self.record(
            "registration",
            True,
            f"hello from {reg.hello.host} pid {reg.hello.pid}: actor {reg.actor_id}, "
            f"{reg.num_envs} slot(s), spaces {'given' if reg.hello.observation_space else '{}'}",
        )
        return True

    def steady(self, versions: int) -> bool:
        """Train on until ``versions`` more broadcasts happened."""
        target = self.learner.version + versions
        ok = self.pump_until(
            lambda: self.learner.version >= target or not self.actor.alive(),
            self.options.phase_timeout,
            train=True,
        )
        if not ok or self.learner.version < target:
            reg = self.observer.current
            rows = reg.rows.tolist() if reg else []
            self.observer.problem(
                "fragment-rows",
                f"the stream stalled: version {self.learner.version} of {target} after "
                f"{self.options.phase_timeout:g}s (rows per slot {rows})",
            )
            return False
        return True

    def until_truncation(self, rows: int = 128) -> None:
        """Train on until a truncated cell arrived (the truncation clause needs one),
        each slot streamed ``rows`` more rows, or the phase timed out: an env whose time
        limit is under ``rows`` steps always shows one, whatever the phases before took."""
        obs, reg = self.observer, self.observer.current
        assert reg is not None
        target = reg.rows + rows
        self.pump_until(
            lambda: (
                obs.truncated_cells > 0
                or bool((reg.rows >= target).all())
                or not self.actor.alive()
            ),
            self.options.phase_timeout,
            train=True,
        )

    def confirmed_quiet(self) -> bool:
        """No frame for ``CONFIRM_QUIET`` x ``quiet`` seconds: the wait that turns a pause
        into a failing verdict (a stall of a loaded machine rarely lasts that long)."""
        return time.monotonic() - self.observer.quiet_since > CONFIRM_QUIET * self.options.quiet

    def valve(self) -> bool:
        """Hold the broadcasts: the actor must step to exactly its budget and stay."""
        obs, opt = self.observer, self.options
        reg = obs.current
        assert reg is not None
        budget = obs.budget(reg)
        near = budget - (opt.fragment_length - 1)

        def settled() -> bool:  # (a pause short of the budget: a confirmed one)
            return int(reg.rows.min()) >= near or self.confirmed_quiet() or not self.actor.alive()

        self.pump_until(settled, opt.phase_timeout, train=False)
        low = int(reg.rows.min())
        if low < near:
            self.record(
                "weights-nonblocking",
                False,
                f"stopped at {low} steps per slot without new weights; its budget at version "
                f"{obs.version} is {budget} (base {reg.base_version})",
            )
            self.record("valve-flush", None, "not reached (the actor did not step to its budget)")
            return False
        self.record(
            "weights-nonblocking", True, f"stepped to {low} of budget {budget} on one version"
        )
        # It must go quiet at exactly its budget, having sent every row it recorded (a
        # pause short of it: a confirmed one); a row past the budget decides it at once
        # (valve-holds fails: no need to wait phase_timeout for a pause that will not come).
        went_quiet = self.pump_until(
            lambda: (
                int(reg.rows.max()) > budget
                or (time.monotonic() - obs.quiet_since > opt.quiet and reg.rows.min() >= budget)
                or self.confirmed_quiet()
            ),
            opt.phase_timeout,
            False,
        )
        low, high = int(reg.rows.min()), int(reg.rows.max())
        if high > budget:
            self.record("valve-flush", None, f"not applicable: {high} rows > budget {budget}")
        elif not went_quiet:
            self.record("valve-flush", False, f"never paused: {low}..{high} rows per slot")
        elif low != budget:
            self.record(
                "valve-flush",
                False,
                f"paused at {low}..{high} rows per slot, budget {budget}: it held back rows",
            )
        else:
            self.record("valve-flush", True, f"paused at exactly {budget} rows per slot")
        # Hold the pause long enough that heartbeats while paused are checked too.
        held = 2 * opt.heartbeat_interval + opt.heartbeat_slack + opt.heartbeat_interval
        paused_at = obs.quiet_since
        self.pump_until(lambda: time.monotonic() - paused_at > held, held, train=False)
        # Release: one more version (and, for an actor paced by grants, a larger grant
        # once the version alone has not released it).
        old_budget = budget
        published_at = time.monotonic()
        if not self.learner.update(regrant=reg.grant is None):
            self.record("valve-resume", False, "the learner could not take a rollout")
            return False
        version = self.learner.version
        if reg.grant is not None:
            self.grant_holds(reg, version)
            published_at = time.monotonic()
            self.learner.regrant()
        ok = self.pump_until(
            lambda: (
                (int(reg.rows.min()) > old_budget and reg.last_version >= version)
                or not self.actor.alive()
            ),
            opt.phase_timeout,
            train=False,
        )
        first = obs.first_version_after.get(version)
        # A turn-based actor holds each seat's move until its outcome is known (docs
        # multi_agent.md): the moves chosen before the release (the seat's held one, and
        # the round the pause interrupted) are recorded after it with their version.
        held = TURN_HELD_ROWS if self.learner.shape.turn_based else 0
        stale = max(obs.stale_rows.get(version, Counter()).values(), default=0)
        waited = time.monotonic() - published_at
        if not ok or int(reg.rows.min()) <= old_budget:
            self.record(
                "valve-resume",
                False,
                f"no row of version {version} past the old budget {old_budget} within "
                f"{opt.phase_timeout:g}s of its broadcast",
            )
            return False
        if obs.max_over_budget:
            released = self.report.status("grants") == "FAIL"  # (by the version alone)
            why = "the version released it past its grant" if released else "it never paused"
            self.record("valve-resume", None, f"not applicable: {why}")
            return True
        if first is not None and first < version and stale > held:
            self.record(
                "valve-resume",
                False,
                f"resumed, but its first rows after version {version} carry version {first}"
                + (f" ({stale} row(s) per slot; a turn-based game holds {held})" if held else ""),
            )
            return True
        self.record(
            "valve-resume",
            True,
            f"{f'grant {reg.grant}' if reg.grant is not None else f'version {version}'} "
            f"released it within {waited:.2f}s; "
            + (f"{stale} held row(s) per slot first" if stale else f"rows carry version {first}"),
        )
        return True

    def grant_holds(self, reg: Registration, version: int) -> None:
        """Section 5.4.1: an actor held at its grant stays there when a new version (here
        ``version``) arrives, ``quiet`` seconds; only a larger grant releases it."""
        grant = reg.grant
        assert grant is not None
        self.pump_until(
            lambda: int(reg.rows.max()) > grant or not self.actor.alive(),
            self.options.quiet,
            train=False,
        )
        high = int(reg.rows.max())
        if high > grant:
            self.record(
                "grants",
                False,
                f"version {version} alone released it: {high} rows on a slot, past its grant "
                f"{grant} (it follows S and L, not its grant)",
            )
        else:
            self.record(
                "grants",
                True,
                f"held at its grant {grant} for {self.options.quiet:g}s after version "
                f"{version} arrived (a larger grant then released it: valve-resume)",
            )

    def restart(self) -> bool:
        """Close the learner and start a new run on the same ports."""
        obs, opt = self.observer, self.options
        old = obs.current
        assert old is not None
        old_run = self.learner.run_id
        down = time.monotonic()
        self.learner.stop()
        self.learner.start()
        count = len(obs.registrations)
        announced = [0.0]

        def registered() -> bool:
            # The new run's weights on PUB, every heartbeat interval: a restart signal
            # (section 5.6) also for an actor that gets no learner heartbeat.
            now = time.monotonic()
            if now - announced[0] > opt.heartbeat_interval:
                announced[0] = now
                self.learner.ingest.publish(self.learner.current_weights())
            return len(obs.registrations) > count or not self.actor.alive()

        self.pump_until(registered, opt.phase_timeout, train=False)
        if len(obs.registrations) == count:
            self.down = (down, time.monotonic())
            self.record(
                "restart",
                False,
                f"no new registration within {opt.phase_timeout:g}s of the restart "
                f"({len(obs.hellos)} hello(s) in all)",
            )
            self.record("rejoin-run-id", None, "no new hello")
            return False
        new = obs.current
        self.down = (down, new.welcomed_at)
        self.learner.ingest.started = True
        rejoin = new.hello.rejoin_run_id
        self.record(
            "rejoin-run-id",
            rejoin == old_run,
            f"rejoin_run_id {rejoin!r} (old run {old_run!r})",
        )
        ok = self.pump_until(
            lambda: new.fragments > 0 or not self.actor.alive(), opt.phase_timeout, train=True
        )
        took = new.welcomed_at - down
        if not ok:
            self.record("restart", False, "registered again but sent no fragment")
            return False
        self.record(
            "restart",
            True,
            f"registered again {took:.2f}s after the restart (actor {new.actor_id}) and "
            f"streams under the new token",
        )
        return True

    def shutdown(self) -> None:
        """Send shutdown; judge the bye, its last_seq, and the process's end."""
        obs, opt = self.observer, self.options
        reg = obs.current
        assert reg is not None
        self.learner.shutdown()
        sent = self.shutdown_at = time.monotonic()
        self.pump_until(
            lambda: reg.bye is not None or not self.actor.alive(), opt.shutdown_timeout, False
        )
        if reg.bye is None:
            # Nothing more can come; let the fragments already in flight arrive.
            self.pump_until(lambda: False, 0.3, train=False)
            self.record(
                "shutdown-bye", False, f"no bye within {opt.shutdown_timeout:g}s of shutdown"
            )
            self.record("bye-last-seq", None, "no bye")
        elif reg.bye_at < sent:
            self.record("shutdown-bye", False, "it said bye on its own before the shutdown")
            self.record("bye-last-seq", None, "not checked (no bye answered the shutdown)")
        else:
            self.record("shutdown-bye", True, f"bye {reg.bye_at - sent:.2f}s after shutdown")
            last = reg.bye.last_seq
            # Every fragment up to last_seq must arrive (accepted or not): wait while
            # they keep coming (a flooding actor leaves a backlog), at most phase_timeout.
            drained = max(opt.quiet, 3.0)
            self.pump_until(
                lambda: reg.wire_seq > last or time.monotonic() - obs.quiet_since > drained,
                opt.phase_timeout,
                train=False,
            )
            self.pump_until(lambda: False, 0.3, train=False)  # anything that follows
            if reg.max_seq > last:
                self.record(
                    "bye-last-seq", False, f"last_seq {last}, but seq {reg.max_seq} arrived"
                )
            elif reg.wire_seq <= last and time.monotonic() - obs.quiet_since <= drained:
                self.record(
                    "bye-last-seq",
                    None,
                    f"not decided: fragments still arriving {opt.phase_timeout:g}s after the "
                    f"bye (seq {reg.wire_seq - 1} of {last})",
                )
            elif reg.wire_seq <= last:
                self.record(
                    "bye-last-seq",
                    False,
                    f"last_seq {last}, but only seqs up to {reg.wire_seq - 1} arrived",
                )
            else:
                self.record("bye-last-seq", True, f"last_seq {last}: every fragment arrived")
        code = self.actor.wait(opt.exit_timeout)
        self.record(
            "exit",
            code is not None,
            f"exited with {code}"
            if code is not None
            else f"still running {opt.exit_timeout:g}s on",
        )

    def mismatch(self) -> None:
        """Run the command again against a learner that answers in protocol 1."""
        opt = self.options
        port = free_port_block(host=opt.host)
        address = f"{opt.host}:{port}"
        ctx = zmq.Context.instance()
        router = make_socket(ctx, zmq.ROUTER, SocketOptions(linger_ms=0))
        router.bind(tcp_endpoint(opt.host, port))
        actor = ActorProcess(self.command, address, self.output)
        try:
            if not router.poll(int(opt.register_timeout * 1000)):
                self.record("version-mismatch", None, "no hello arrived (not checked)")
                return
            routing_id, _ = router.recv_multipart()
            v1 = {
                "proto": 1,
                "type": "refuse",
                "code": "version_mismatch",
                "reason": "protocol version mismatch: peer speaks 2, we speak 1",
            }
            router.send_multipart([routing_id, msgpack.packb(v1, use_bin_type=True)])
            deadline = time.monotonic() + opt.mismatch_timeout
            again = 0
            while time.monotonic() < deadline and actor.alive():
                if router.poll(100):
                    router.recv_multipart()
                    again += 1
            code = actor.wait(0.1)
            if again:
                self.record("version-mismatch", False, f"{again} more frame(s) after the v1 refuse")
            elif code is None:
                self.record(
                    "version-mismatch",
                    True,
                    f"silent for {opt.mismatch_timeout:g}s after the v1 refuse (still running)",
                )
            else:
                self.record(
                    "version-mismatch",
                    True,
                    f"stopped (exit {code}) after the v1 refuse: {actor.tail(1)}",
                )
        finally:
            actor.stop()
            router.close(0)

    # ---------------------------------------------------------------- the stream

    def judge_stream(self) -> None:
        """The clauses judged over the whole stream (heartbeats, fragments, seq, ...)."""
        obs, opt = self.observer, self.options
        regs = obs.registrations
        if not regs:
            return
        self.judge_heartbeats()
        first = {k: v[:3] for k, v in obs.problems.items()}
        fragments = sum(r.fragments for r in regs)
        if not fragments:
            for clause in ("contiguity", "seq", "version", "weights-pickup", "valve-holds"):
                self.record(clause, None, "no fragment arrived")
        for clause in ("fragment-rows", "contiguity", "version"):
            if clause in first:
                self.record(clause, False, "; ".join(first[clause]))
            else:
                stale = obs.stale_run_fragments
                self.record(
                    clause,
                    True,
                    f"{fragments} fragment(s) in {len(regs)} registration(s)"
                    + (f" ({stale} sent to the old run, lost in the restart)" if stale else ""),
                )
        seq = [f"registration {i}: {p}" for i, r in enumerate(regs) for p in r.seq_problems[:2]]
        self.record(
            "seq",
            not seq,
            "; ".join(seq[:3]) or f"0..{regs[-1].max_seq} in the last registration, no gap",
        )
        if obs.truncated_cells:
            self.record("truncation", True, f"{obs.truncated_cells} cell(s) with final_obs")
        else:
            self.record(
                "truncation",
                None,
                "no truncated cell in the run (give the env a shorter time limit: e.g. "
                "--env-kwargs max_episode_steps=20 for a gymnasium id)",
            )
        self.judge_multi_agent(first)
        if obs.max_over_budget or "valve-holds" in first:
            self.record(
                "valve-holds",
                False,
                f"a slot ran {obs.max_over_budget} step(s) past its budget"
                + (f"; {first['valve-holds'][0]}" if "valve-holds" in first else ""),
            )
        else:
            graded = "its grant" if any(r.grant is not None for r in obs.registrations) else ""
            self.record(
                "valve-holds", True, f"no slot ever past {graded or 'max(0, v - b) * S + L'}"
            )
        stale = {v: max(c.values()) for v, c in obs.stale_rows.items() if c}
        worst = max(stale.values(), default=0)
        pickup = opt.pickup
        never = [v for v in obs.stale_rows if v not in obs.first_version_after]
        if obs.max_over_budget:
            self.record(
                "weights-pickup",
                None,
                "not measurable: the actor outran its valve (rows in flight carry old versions)",
            )
            return
        self.record(
            "weights-pickup",
            worst <= pickup,
            f"at most {worst} row(s) per slot of an older version after a broadcast "
            f"(allowed {pickup}); {len(obs.published)} broadcast(s)"
            + (f", versions {never} unseen before the end" if never else ""),
        )

    def judge_multi_agent(self, first: dict[str, list[str]]) -> None:
        """The clauses of multi-agent envs, masked actions and several policies."""
        obs, learner = self.observer, self.learner
        agents = learner.shape.agents_per_env
        if agents == 1:
            self.record("valid-rows", None, "a single-agent env: every row is valid")
        elif "valid-rows" in first:
            self.record("valid-rows", False, "; ".join(first["valid-rows"]))
        else:
            self.record(
                "valid-rows",
                True if obs.not_valid_rows else None,
                f"{obs.not_valid_rows} row(s) not valid of {agents} agents per env copy, "
                "each after its slot's agent ended" if obs.not_valid_rows else
                "no row that is not valid occurred",
            )  # fmt: skip
        settings = learner.settings
        if mask_key(settings.observation_space, settings.action_space) is None:
            self.record("action-masks", None, "the env's actions are not masked")
        elif "action-masks" in first:
            self.record("action-masks", False, "; ".join(first["action-masks"]))
        else:
            self.record("action-masks", True, f"{obs.valid_rows} valid row(s), none masked")
        regs = self.observer.registrations
        if not any(r.grant is not None for r in regs):
            self.record("grants", None, "the actor does not announce 'grants': S and L pace it")
        if not learner.plan.several:
            self.record("policies-feature", None, "a run of one policy")
        else:  # a hello without it is refused: no registration at all
            hellos = [h for _, h in obs.hellos]
            lacking = [h for h in hellos if FEATURE_POLICIES not in h.features]
            self.record(
                "policies-feature",
                bool(hellos) and not lacking,
                f"{len(hellos)} hello(s), {len(lacking)} without 'policies'; "
                f"{len(regs)} registration(s)",
            )

    def judge_heartbeats(self) -> None:
        """Gaps between an actor's heartbeats, per registration, outside the restart."""
        obs, opt = self.observer, self.options
        limit = 2 * opt.heartbeat_interval + opt.heartbeat_slack
        worst, where, count = 0.0, "", 0
        for i, reg in enumerate(obs.registrations):
            end = min(reg.bye_at or math.inf, self.shutdown_at or math.inf, time.monotonic())
            if i + 1 < len(obs.registrations) and self.down is not None:
                end = min(end, self.down[0])
            times = [reg.welcomed_at, *[t for t in reg.heartbeats if t <= end], end]
            count += len(reg.heartbeats)
            for a, b in zip(times, times[1:], strict=False):
                if b - a > worst:
                    worst, where = b - a, f"registration {i}"
        self.record(
            "heartbeats",
            worst <= limit,
            f"{count} heartbeat(s); longest gap {worst:.2f}s ({where}); allowed {limit:.2f}s "
            f"(2 x heartbeat_interval {opt.heartbeat_interval:g}s + {opt.heartbeat_slack:g}s)",
        )


def check_actor(command: Sequence[str], options: ActorCheckOptions | None = None) -> Report:
    """Run the scenario against ``command``; return the report (every clause)."""
    options = options or ActorCheckOptions()
    report = Report(subject=f"actor {' '.join(command)}")
    scenario = Scenario(options, command, report)
    scenario.run()
    for clause in CLAUSES.values():
        if clause.id not in report.results:
            report.record(clause, None, "not reached")
    report.results = {cid: report.results[cid] for cid in CLAUSES}
    report.notes.append(f"actor output: {scenario.output}")
    return report
