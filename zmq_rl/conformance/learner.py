"""``zmq-rl conformance learner HOST:PORT``: a well-behaved actor and misbehaving ones
played against a running learner of any language (docs/protocol.md section 11.2).

The learner must be fresh and wait for one actor (``zmq-learner --num-actors 1``): the
well-behaved actor registers first, so its slots are consumed from the welcome's
version. It streams valid rows until the learner is one row short of its next
broadcast (a learner of every-slot rollouts: ``S - 1`` rows of every slot; of rows
batches, ``config.batch_rows``: ``broadcast_every * batch_rows - 1`` rows in all), then
sends every invalid fragment (the mutations of the golden vectors, applied to a
fragment of the live run) and, to a learner that paces it with a grant, a fragment
past the grant: a learner that accepted one would have the row it lacks and publish.
Then the missing valid row must make it publish, and its grant must rise. The
refusals, the session check of heartbeats and the learner's heartbeats are checked on
the way; the shutdown at the end of the run last.
"""

from __future__ import annotations

import os
import re
import socket as pysocket
import time
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import zmq

from ..wire.codec import PROTOCOL_VERSION
from ..wire.protocol import (
    FEATURE_GRANTS,
    FEATURE_POLICIES,
    Fragment,
    Heartbeat,
    Hello,
    ProtocolError,
    Refuse,
    Shutdown,
    Weights,
    Welcome,
    decode,
    decode_policy_weights,
    encode,
    weights_topic,
)
from ..wire.spaces import space_spec
from ..wire.transport import SocketOptions, make_socket, parse_learner_address, tcp_endpoint
from . import vectors as V
from .report import Clause, Report

__all__ = ["CLAUSES", "LearnerCheckOptions", "check_learner"]

CLAUSES = {
    c.id: c
    for c in (
        Clause(
            "refuse-version",
            "4.5",
            "MUST",
            "a v1 hello is refused version_mismatch (in proto 2), naming both versions",
        ),
        Clause(
            "refuse-space", "4.5", "MUST", "a hello with other spaces is refused space_mismatch"
        ),
        Clause("refuse-bad-hello", "4.5", "MUST", "a hello with one space is refused bad_hello"),
        Clause(
            "refuse-invalid-hello",
            "4.5",
            "MUST",
            "a hello with a field out of range (num_envs 5000) is refused bad_hello, not ignored",
        ),
        Clause(
            "welcome", "4.4", "MUST", "a hello is welcomed: token, ports, every setting, weights"
        ),
        Clause(
            "refuse-reregister",
            "4.6",
            "MUST",
            "a heartbeat with a wrong token is refused reregister",
        ),
        Clause(
            "learner-heartbeats",
            "5.5",
            "MUST",
            "learner heartbeats (actor_id -1, run id, no token) every heartbeat_interval",
        ),
        Clause(
            "invalid-fragments",
            "7",
            "MUST",
            "every invalid fragment vector, adapted to the run, is rejected",
        ),
        Clause(
            "weights-broadcast",
            "4.2",
            "MUST",
            "the rows of a broadcast cycle (S per slot; a learner of rows batches: "
            "broadcast_every * batch_rows in all) make the next version: version + 1, the "
            "run id, the tensors",
        ),
        Clause(
            "grants",
            "5.4.1",
            "MUST",
            "a learner that paces the actor with grants: the welcome's grant lets it "
            "deliver a broadcast cycle, a fragment past the grant is refused (over_lead), "
            "every heartbeat carries the grant, which never falls and rises once its rows "
            "were used; SKIP for a learner whose welcome has no grant",
        ),
        Clause(
            "refuse-part-env-copy",
            "4.3",
            "MUST",
            "a learner of a multi-agent env refuses a hello whose num_envs is not a multiple "
            "of agents_per_env (bad_hello); SKIP for a single-agent learner",
        ),
        Clause(
            "refuse-missing-feature",
            "4.9",
            "MUST",
            "a learner of several policies refuses a hello without the 'policies' feature "
            "(bad_hello, naming it); SKIP for a learner of one policy",
        ),
        Clause(
            "policy-topics",
            "4.9",
            "MUST",
            "a learner of several policies publishes every policy at each new version, each "
            "as [its topic, weights of that policy]; SKIP for a learner of one policy",
        ),
        Clause("shutdown", "5.7", "MUST", "the end of the run is a shutdown to the actor"),
    )
}


@dataclass(frozen=True)
class LearnerCheckOptions:
    """Timeouts and sizes of ``zmq-rl conformance learner`` (each a flag)."""

    register_timeout: float = 10.0
    reply_timeout: float = 5.0
    reject_wait: float = 1.0
    broadcast_timeout: float = 30.0
    heartbeat_slack: float = 1.0
    shutdown_timeout: float = 30.0
    num_envs: int = 2


class Peer:
    """One actor's sockets (DEALER; PUSH and SUB once welcomed)."""

    def __init__(self, ctx: zmq.Context, host: str, port: int) -> None:
        self.ctx, self.host = ctx, host
        self.control = make_socket(ctx, zmq.DEALER, SocketOptions(linger_ms=0))
        self.control.connect(tcp_endpoint(host, port))
        self.push: zmq.Socket | None = None
        self.sub: zmq.Socket | None = None

    def send(self, body: dict[str, Any]) -> None:
        """Send one control map (as given: any proto)."""
        self.control.send(msgpack.packb(body, use_bin_type=True))

    def reply(self, timeout: float) -> bytes | None:
        """The next control frame within ``timeout`` seconds, or None."""
        if self.control.poll(int(timeout * 1000)):
            return self.control.recv()
        return None

    def connect_data(self, welcome: Welcome) -> None:
        """PUSH and SUB to the welcome's ports."""
        self.push = make_socket(self.ctx, zmq.PUSH, SocketOptions(linger_ms=1000))
        self.push.connect(tcp_endpoint(self.host, welcome.experience_port))
        self.sub = make_socket(self.ctx, zmq.SUB, SocketOptions(linger_ms=0))
        for topic in [weights_topic(p) for p in welcome.settings.policy_ids] or [b""]:
            self.sub.setsockopt(zmq.SUBSCRIBE, topic)  # several policies: each one's topic
        self.sub.connect(tcp_endpoint(self.host, welcome.weights_port))

    def close(self) -> None:
        """Close every socket."""
        for sock in (self.control, self.push, self.sub):
            if sock is not None:
                sock.close(0)


def _hello(**fields: Any) -> dict[str, Any]:
    """A hello map (announcing the ``policies`` and ``grants`` features, which the
    well-behaved actor implements) with ``fields`` changed."""
    body = Hello(
        actor_id=-1,
        env_id="conformance",
        observation_space={},
        action_space={},
        num_envs=2,
        host=pysocket.gethostname()[:200],
        pid=os.getpid(),
        features=[FEATURE_POLICIES, FEATURE_GRANTS],
    ).to_map()
    body.update(fields)
    return {**body, "proto": PROTOCOL_VERSION, "type": "hello"}


class LearnerScenario:
    """The checks, in order, against one learner."""

    def __init__(self, address: str, options: LearnerCheckOptions, report: Report) -> None:
        self.host, self.port = parse_learner_address(address)
        self.options = options
        self.report = report
        self.ctx = zmq.Context.instance()
        self.peers: list[Peer] = []

    def record(self, clause: str, ok: bool | None, seen: str) -> None:
        """Record a clause result."""
        self.report.record(CLAUSES[clause], ok, seen)

    def peer(self) -> Peer:
        """A new connection to the learner's control port."""
        peer = Peer(self.ctx, self.host, self.port)
        self.peers.append(peer)
        return peer

    def run(self) -> None:
        """Every check; the sockets are closed at the end."""
        try:
            self.refusals()
            welcome = self.register()
            if welcome is not None:
                self.part_env_copy_refusal(welcome)
                self.feature_refusal(welcome)
                self.stream(welcome)
        finally:
            for peer in self.peers:
                peer.close()

    # ---------------------------------------------------------------- refusals

    def refuse_check(
        self, clause: str, body: dict[str, Any], code: str, timeout: float = 0.0
    ) -> Refuse | None:
        """Send ``body`` on a new connection; the answer must be ``refuse code``."""
        peer = self.peer()
        peer.send(body)
        timeout = timeout or self.options.reply_timeout
        frame = peer.reply(timeout)
        if frame is None:
            self.record(clause, False, f"no answer within {timeout:g}s")
            return None
        try:
            message = decode(frame)
        except ProtocolError as exc:
            self.record(clause, False, f"the answer does not decode ({exc.reason}): {exc}")
            return None
        if not isinstance(message, Refuse) or message.code != code:
            got = message.code if isinstance(message, Refuse) else message.TYPE
            self.record(clause, False, f"answered {got!r}, expected refuse {code!r}")
            return None
        self.record(clause, True, f"refuse {code}: {message.reason[:120]}")
        return message

    def refusals(self) -> None:
        """v1 hello, mismatched spaces, one space, an unknown heartbeat."""
        v1 = {**_hello(), "proto": 1, "next_seq": []}
        v1.pop("rejoin_run_id")
        # The first probe also waits for the learner to come up.
        refuse = self.refuse_check(
            "refuse-version", v1, "version_mismatch", self.options.register_timeout
        )
        if refuse is not None and not (
            re.search(r"\b1\b", refuse.reason) and re.search(r"\b2\b", refuse.reason)
        ):
            self.record(
                "refuse-version", False, f"the reason does not name 1 and 2: {refuse.reason!r}"
            )
        import gymnasium as gym
        import numpy as np

        odd = space_spec(gym.spaces.Box(-1.0, 1.0, (7, 5, 3), np.float32))
        odd_action = space_spec(gym.spaces.Discrete(97))
        self.refuse_check(
            "refuse-space",
            _hello(observation_space=odd, action_space=odd_action),
            "space_mismatch",
        )
        self.refuse_check("refuse-bad-hello", _hello(observation_space=odd), "bad_hello")
        self.refuse_check("refuse-invalid-hello", _hello(num_envs=5000), "bad_hello")
        beat = Heartbeat(actor_id=0, token=bytes(16), run_id="", version=0)
        self.refuse_check(
            "refuse-reregister",
            {**beat.to_map(), "proto": PROTOCOL_VERSION, "type": "heartbeat"},
            "reregister",
        )

    def part_env_copy_refusal(self, welcome: Welcome) -> None:
        """Multi-agent: a hello of one slot more than a whole number of env copies."""
        agents = welcome.settings.agents_per_env
        if agents == 1:
            self.record("refuse-part-env-copy", None, "the learner's env is single-agent")
            return
        self.refuse_check("refuse-part-env-copy", _hello(num_envs=agents + 1), "bad_hello")

    def feature_refusal(self, welcome: Welcome) -> None:
        """Several policies: a hello without the ``policies`` feature is refused."""
        if not welcome.settings.policies:
            self.record("refuse-missing-feature", None, "the learner runs one policy")
            return
        hello = _hello(num_envs=self.options.num_envs)
        hello.pop("features")
        refuse = self.refuse_check("refuse-missing-feature", hello, "bad_hello")
        if refuse is not None and FEATURE_POLICIES not in refuse.reason:
            self.record(
                "refuse-missing-feature", False, f"the reason does not name it: {refuse.reason!r}"
            )

    # ---------------------------------------------------------------- the actor

    def register(self) -> Welcome | None:
        """The well-behaved actor's hello; the welcome's contents."""
        peer = self.actor = self.peer()
        peer.send(_hello(num_envs=self.options.num_envs))
        deadline = time.monotonic() + self.options.register_timeout
        message: Any = None
        while time.monotonic() < deadline:
            frame = peer.reply(deadline - time.monotonic())
            if frame is None:
                break
            try:
                message = decode(frame)
            except ProtocolError as exc:
                self.record("welcome", False, f"the welcome does not decode: {exc}")
                return None
            if isinstance(message, Welcome):
                break
            if isinstance(message, Refuse):
                self.record("welcome", False, f"refused {message.code}: {message.reason}")
                return None
        else:
            message = None
        if not isinstance(message, Welcome):
            self.record("welcome", False, f"no welcome within {self.options.register_timeout:g}s")
            return None
        s = message.settings
        problems = []
        if s.num_envs != self.options.num_envs:
            problems.append(f"num_envs {s.num_envs}, asked {self.options.num_envs}")
        if len(encode(message.weights)) > s.max_weights_bytes:
            problems.append("its own weights exceed max_weights_bytes")
        self.record(
            "welcome",
            not problems,
            "; ".join(problems)
            or f"actor {message.actor_id}, run {message.run_id}, base version "
            f"{message.base_version}, weights v{message.weights.version} "
            f"({len(message.weights.tensors)} tensors), S={s.steps_per_broadcast}, "
            f"L={s.max_lead_steps}, heartbeat {s.heartbeat_interval:g}s"
            + (f", grant {message.grant}" if message.grant is not None else "")
            + (f", batch_rows {s.batch_rows}" if s.batch_rows else ""),
        )
        peer.connect_data(message)
        return message

    def stream(self, welcome: Welcome) -> None:
        """Valid rows to one short of a broadcast, the invalid fragments (and one past
        the grant), the last row; then rows until the shutdown."""
        s, opt = welcome.settings, self.options
        self.welcome = welcome
        self.seq = 0
        self.version = welcome.weights.version
        self.rows = np.zeros(s.num_envs, np.int64)  # sent per slot, since the welcome
        self.grant = welcome.grant  # the largest grant heard (None: S and L)
        self.grant_problems: list[str] = []
        self.grant_used = self.grant  # the grant one row short of the broadcast
        self.beats: list[float] = []
        self.beat_problems: list[str] = []
        self.last_beat = 0.0
        self.shutdown: Shutdown | None = None
        self.weights: list[Weights] = []
        start = time.monotonic()
        # One row short of a broadcast the learner can only wait in its receive loop, so
        # it must heartbeat: hold it there for two intervals and a half at least.
        hold = max(opt.reject_wait, 2.5 * s.heartbeat_interval + opt.heartbeat_slack)
        cycle = self.cycle()
        if isinstance(cycle, str) and self.grant is not None:
            # A learner MAY raise a grant before it used any row (its lead may follow the
            # fleet it sees): send what the grant allows, and wait for a larger one.
            self.send_until(np.full(s.num_envs, self.budget(), np.int64))
            granted = self.grant
            self.wait(lambda: self.budget() > granted, hold)
            cycle = self.cycle()
        if isinstance(cycle, str):  # (the learner waits for rows this actor may not send)
            if self.grant is not None:
                self.grant_problems.append(f"grant {self.grant}: {cycle}")
            self.send_until(np.full(s.num_envs, self.budget(), np.int64))
            self.serve(hold)
            self.judge_heartbeats(start, time.monotonic())
            self.record("invalid-fragments", None, f"not checked: {cycle}")
            self.record("weights-broadcast", False, f"no broadcast is possible: {cycle}")
            past_grant = cycle
        else:
            target, last = cycle
            self.send_until(target)
            self.serve(hold)
            self.invalid(welcome, [w.version for w in self.weights])
            self.grant_used = self.grant  # (a rise from here on follows the rows' use)
            past_grant = self.past_grant(target)
            beats_until = time.monotonic()
            self.send_valid(1, last)
            self.broadcast(welcome)
            self.judge_heartbeats(start, beats_until)
        # Stream on, under the valve, until the learner ends the run.
        deadline = time.monotonic() + opt.shutdown_timeout
        while self.shutdown is None and time.monotonic() < deadline:
            if self.weights:
                self.version = max(self.version, self.weights[-1].version)
            below = [slot for slot in range(s.num_envs) if self.rows[slot] < self.budget()]
            if below:
                room = min(self.budget() - int(self.rows[slot]) for slot in below)
                self.send_valid(min(s.fragment_length, room), below)
            self.serve(0.01)
        if self.shutdown is None:
            self.record(
                "shutdown",
                None,
                f"no shutdown within {opt.shutdown_timeout:g}s (start the learner with a "
                "small --total-env-steps to check it)",
            )
        else:
            self.record("shutdown", True, f"shutdown: {self.shutdown.reason!r}")
            self.actor.send(
                {
                    "actor_id": welcome.actor_id,
                    "token": welcome.token,
                    "stats": {"steps_sent": float(self.rows.sum())},
                    "last_seq": self.seq - 1,
                    "proto": PROTOCOL_VERSION,
                    "type": "bye",
                }
            )
        self.grant_verdict(past_grant)  # (the heartbeats up to the shutdown included)

    def cycle(self) -> tuple[np.ndarray, list[int]] | str:
        """Where the learner is one row short of its next broadcast: the rows per slot to
        send, and the slots of which one more row each completes the cycle; or why the
        actor cannot get there within its valve. Every-slot rollouts: ``S - 1`` rows of
        every slot, and a row of each. Rows batches (``config.batch_rows``, the actor
        alone): ``broadcast_every * batch_rows - 1`` rows spread evenly, and a row of a
        slot with the fewest."""
        s = self.welcome.settings
        cap, slots = self.budget(), s.num_envs
        need = s.broadcast_every * s.batch_rows if s.batch_rows else s.steps_per_broadcast
        if (slots * cap if s.batch_rows else cap) < need:
            why = (
                f"its valve lets this actor, the learner's only one, send {cap} rows per slot, "
                f"short of the {need} rows {'in all' if s.batch_rows else 'per slot'} of a "
                "broadcast cycle: the learner would wait for rows forever (section 5.3)"
            )
            return why
        if not s.batch_rows:
            return np.full(slots, need - 1, np.int64), list(range(slots))
        target = np.full(slots, (need - 1) // slots, np.int64)
        extra = (need - 1) % slots
        target[:extra] += 1
        return target, [extra]  # (target[extra] is one of the fewest, below cap)

    def send_until(self, target: np.ndarray) -> None:
        """Valid fragments until each slot sent ``target`` rows (every slot behind in one
        fragment, ``fragment_length`` rows at most)."""
        length = self.welcome.settings.fragment_length
        while True:
            behind = [slot for slot in range(len(target)) if self.rows[slot] < target[slot]]
            if not behind:
                return
            room = min(int(target[slot] - self.rows[slot]) for slot in behind)
            self.send_valid(min(length, room), behind)
            self.serve(0.0)

    def broadcast(self, welcome: Welcome) -> None:
        """The missing row was sent: the next version must come (weights-broadcast)."""
        s, opt = welcome.settings, self.options
        ok = self.wait(lambda: any(w.version > self.version for w in self.weights),
                       opt.broadcast_timeout)  # fmt: skip
        sent = f"{int(self.rows.sum())} rows ({self.rows.tolist()} per slot)"
        if not ok:
            cycle = (
                f"batch_rows {s.batch_rows} x broadcast_every {s.broadcast_every}"
                if s.batch_rows
                else f"S = {s.steps_per_broadcast} per slot"
            )
            self.record(
                "weights-broadcast",
                False,
                f"no version after {sent} ({cycle}) within {opt.broadcast_timeout:g}s",
            )
            if self.report.status("invalid-fragments") == "PASS":
                self.record("invalid-fragments", None, "not decided: nothing was published")
            return
        self.policy_topics(welcome)
        newest = self.weights[-1]
        known = {w.policy: w for w in welcome.policy_weights or [welcome.weights]}
        names = [n for n, _ in newest.tensors] == [n for n, _ in known[newest.policy].tensors]
        good = newest.version == self.version + 1 and newest.run_id == welcome.run_id
        self.record(
            "weights-broadcast",
            good and names,
            f"version {newest.version} (from {self.version}) after {sent}; run id "
            f"{'ok' if newest.run_id == welcome.run_id else newest.run_id}; tensors "
            f"{'by the same names' if names else 'NOT the same names'}",
        )
        self.version = max(w.version for w in self.weights)
        if self.grant is not None and self.grant_used is not None:
            # Its rows were used: the grant must rise (at the latest in the first
            # heartbeat after the broadcast, which the learner sends while it waits).
            allowed = s.heartbeat_interval + opt.heartbeat_slack + opt.reply_timeout
            used = self.grant_used
            if not self.wait(lambda: self.budget() > used, allowed):
                self.grant_problems.append(
                    f"no heartbeat raised the grant {used} within {allowed:g}s of version "
                    f"{self.version}, which trained on {sent}"
                )

    def judge_heartbeats(self, start: float, until: float) -> None:
        """Learner heartbeats, judged while the learner could only be waiting for rows (it
        MAY skip heartbeats during an update or an evaluation): from the welcome to the
        last valid row."""
        s, opt = self.welcome.settings, self.options
        limit = 2 * s.heartbeat_interval + opt.heartbeat_slack
        times = [start, *[t for t in self.beats if t <= until], until]
        worst = max(b - a for a, b in zip(times, times[1:], strict=False))
        self.record(
            "learner-heartbeats",
            len(times) > 2 and worst <= limit and not self.beat_problems,
            "; ".join(self.beat_problems[:2])
            or f"{len(times) - 2} heartbeat(s) while it waited for rows, longest gap "
            f"{worst:.2f}s (allowed {limit:.2f}s)",
        )

    def grant_verdict(self, past_grant: str) -> None:
        """The ``grants`` clause, from what the stream saw (``past_grant``: what became
        of the fragment past the grant)."""
        welcome = self.welcome
        if welcome.grant is None:
            self.record(
                "grants",
                False if self.grant_problems else None,
                "; ".join(self.grant_problems[:2])
                or "the learner does not pace this actor with grants (its welcome has no "
                "grant): S and L",
            )
            return
        self.record(
            "grants",
            not self.grant_problems,
            "; ".join(self.grant_problems[:3])
            or f"welcome grant {welcome.grant} ({welcome.settings.num_envs} slots), "
            f"{self.grant_used} one row short of a broadcast; {past_grant}; raised after "
            f"the broadcast ({self.grant} in the end); every heartbeat carried it, never "
            "lower",
        )

    def policy_topics(self, welcome: Welcome) -> None:
        """Several policies: the first new version comes as one publication per policy,
        each under its topic (decode_policy_weights checks the topic), at one version."""
        ids = welcome.settings.policy_ids
        if not ids:
            self.record("policy-topics", None, "the learner runs one policy")
            return

        def published() -> dict[str, int]:
            return {w.policy: w.version for w in self.weights if w.version > self.version}

        self.wait(lambda: len(published()) == len(ids), self.options.reply_timeout)
        seen = published()
        versions = set(seen.values())
        self.record(
            "policy-topics",
            set(seen) == set(ids) and len(versions) == 1,
            f"version(s) {sorted(versions)} of policies {sorted(seen)} (the run's: {ids})",
        )

    def budget(self) -> int:
        """The valve's budget per slot: the largest grant heard (§5.4.1), or under the
        newest version loaded ``max(0, v - b) * S + L`` (§5.4; with no valve, L = 0, the
        well-behaved actor still keeps within one cycle, L = S, so as not to flood)."""
        if self.grant is not None:
            return self.grant
        s = self.welcome.settings
        base, lead = self.welcome.base_version, s.max_lead_steps or s.steps_per_broadcast
        return max(0, self.version - base) * s.steps_per_broadcast + lead

    def base_fragment(self, rows: int, slots: list[int] | None = None) -> Fragment:
        """A valid fragment of the live run: ``rows`` rows of ``slots`` (None: every
        slot), the next seq."""
        w, s = self.welcome, self.welcome.settings
        slots = list(range(s.num_envs)) if slots is None else slots
        fragment = V.synthetic_fragment(
            s.observation_space,
            s.action_space,
            seed=self.seq,
            length=rows,
            width=len(slots),
            truncated_cells=(),
            state_size=s.state_size,
            actor_id=w.actor_id,
            version=self.version,
            seq=self.seq,
            run_id=w.run_id,
            token=w.token,
        )
        fragment.slots = np.array(slots, np.int32)
        return fragment

    def send_valid(self, rows: int, slots: list[int] | None = None) -> None:
        """One valid fragment of ``rows`` rows of ``slots`` (None: every slot)."""
        assert self.actor.push is not None
        fragment = self.base_fragment(rows, slots)
        self.actor.push.send(encode(fragment))
        self.seq += 1
        self.rows[fragment.slots] += rows

    def invalid(self, welcome: Welcome, published: list[int]) -> None:
        """Every invalid fragment; a learner that accepts one publishes early."""
        if published:
            self.record(
                "invalid-fragments",
                None,
                f"not checked: the learner published {published} before the rows of its "
                "broadcast cycle",
            )
            return
        s = welcome.settings
        ctx = V.Context(
            welcome.run_id,
            self.version,
            welcome.actor_id,
            welcome.token,
            s.num_envs,
            self.seq,
            s.state_size,
            s.observation_space,
            s.action_space,
            s.agents_per_env,
        )
        base = {**self.base_fragment(1).to_map(), "proto": PROTOCOL_VERSION, "type": "fragment"}
        good = V.pack(base)
        mutations = [m for m in V.FRAGMENT_MUTATIONS if m.applies(ctx)]
        frames = [
            ("trailing-bytes", good + b"\x00"),
            ("proto-1", V.pack({**base, "proto": 1})),
            ("unknown-type", V.pack({**base, "type": "fragments"})),
            *[(m.name, V.mutated_fragment(base, m, ctx)) for m in mutations],
        ]
        published = self.try_frames(frames)
        if published:
            self.record(
                "invalid-fragments",
                False,
                f"the learner published {', '.join(published)} after {len(frames)} invalid "
                "fragments while one row short of a broadcast: it accepted at least one",
            )
        else:
            self.record(
                "invalid-fragments",
                True,
                f"{len(frames)} invalid fragments sent while one row short of a broadcast; "
                "nothing was published",
            )

    def past_grant(self, target: np.ndarray) -> str:
        """Under a grant, one row short of a broadcast: a valid fragment that takes the
        slot closest to its grant one row past it must be refused (over_lead), or the
        learner has the row it lacks and publishes. What became of it, for the report."""
        if self.grant is None:
            return "no grant"
        if self.weights:
            return "a fragment past the grant not sent: a version was published already"
        slot = int(np.argmax(target))
        rows = self.grant - int(self.rows[slot]) + 1
        fragment = self.base_fragment(rows, [slot])
        frame = encode(fragment)
        if len(frame) > self.welcome.settings.max_fragment_bytes:
            return f"a fragment past the grant not sent: {rows} rows exceed max_fragment_bytes"
        published = self.try_frames([("past-the-grant", frame)])
        if published:
            self.seq += 1  # (it was taken: the learner expects the next seq)
            self.rows[slot] += rows
            self.grant_problems.append(
                f"a fragment taking slot {slot} to {self.grant + 1} rows, past the grant "
                f"{self.grant}, was accepted: the learner published {', '.join(published)}"
            )
        return f"a fragment taking slot {slot} one row past it refused"

    def try_frames(self, frames: list[tuple[str, bytes]]) -> list[str]:
        """Send them all, then wait; the versions published meanwhile (none: every one
        was rejected). Which one was taken is not searched for."""
        assert self.actor.push is not None
        for _, frame in frames:
            self.actor.push.send(frame)
        self.serve(self.options.reject_wait)
        return [f"v{w.version}" for w in self.weights]

    # ---------------------------------------------------------------- serving

    def wait(self, done: Any, timeout: float) -> bool:
        """Serve until ``done()`` or ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.serve(0.02)
            if done():
                return True
        return False

    def serve(self, seconds: float) -> None:
        """Read control and weights for ``seconds``; heartbeat when due."""
        w = self.welcome
        deadline = time.monotonic() + seconds
        poller = zmq.Poller()
        poller.register(self.actor.control, zmq.POLLIN)
        poller.register(self.actor.sub, zmq.POLLIN)
        while True:
            now = time.monotonic()
            if now - self.last_beat >= w.settings.heartbeat_interval:
                beat = Heartbeat(actor_id=w.actor_id, token=w.token, run_id=w.run_id,
                                 version=self.version, sent_at=now)  # fmt: skip
                self.actor.control.send(encode(beat), zmq.NOBLOCK)
                self.last_beat = now
            events = dict(poller.poll(max(0, int((deadline - now) * 1000))))
            if self.actor.control in events:
                self.on_control(self.actor.control.recv())
            if self.actor.sub in events:
                try:
                    frames = self.actor.sub.recv_multipart()
                    if w.settings.policies:
                        weights = decode_policy_weights(frames, 1 << 30)
                    else:
                        weights = decode(frames[0], (Weights,), 1 << 30)
                    assert isinstance(weights, Weights)
                    if weights.run_id == w.run_id:
                        self.weights.append(weights)
                        if len(encode(weights)) > w.settings.max_weights_bytes:
                            self.beat_problems.append("weights larger than max_weights_bytes")
                except ProtocolError as exc:
                    self.beat_problems.append(f"undecodable weights: {exc}")
            if time.monotonic() >= deadline and not events:
                return

    def on_control(self, frame: bytes) -> None:
        """A learner control message to the well-behaved actor."""
        try:
            message = decode(frame)
        except ProtocolError as exc:
            self.beat_problems.append(f"undecodable control frame ({exc.reason})")
            return
        if isinstance(message, Heartbeat):
            if message.actor_id != -1 or message.token is not None:
                self.beat_problems.append("a learner heartbeat with an actor id or a token")
            if message.run_id != self.welcome.run_id:
                self.beat_problems.append(f"a heartbeat of run {message.run_id!r}")
            self.beats.append(time.monotonic())
            if (
                message.base_version is not None
                and message.base_version > self.welcome.base_version
            ):
                self.welcome.base_version = message.base_version
            self.on_grant(message.grant)
        elif isinstance(message, Shutdown):
            if message.run_id in ("", self.welcome.run_id):
                self.shutdown = message
        elif isinstance(message, Refuse):
            self.beat_problems.append(f"refused {message.code}: {message.reason}")

    def on_grant(self, grant: int | None) -> None:
        """A learner heartbeat's ``grant`` (§5.4.1): present in every one to an actor
        welcomed with a grant, absent from every one to another, never lower than the
        grant before it; the actor adopts a larger one."""
        welcomed = self.welcome.grant
        if welcomed is None:
            if grant is not None and not self.grant_problems:
                self.grant_problems.append(
                    f"a heartbeat carries grant {grant}, but the welcome had none"
                )
            return
        if grant is None:
            if not any("without its grant" in p for p in self.grant_problems):
                self.grant_problems.append("a learner heartbeat without its grant")
            return
        assert self.grant is not None
        if grant < self.grant:
            self.grant_problems.append(f"grant {grant} after {self.grant}: it fell")
        else:
            self.grant = grant


def check_learner(address: str, options: LearnerCheckOptions | None = None) -> Report:
    """Play the actors against the learner at ``address``; the report."""
    options = options or LearnerCheckOptions()
    report = Report(subject=f"learner {address}")
    LearnerScenario(address, options, report).run()
    for clause in CLAUSES.values():
        if clause.id not in report.results:
            report.record(clause, None, "not reached")
    report.results = {cid: report.results[cid] for cid in CLAUSES}
    return report
