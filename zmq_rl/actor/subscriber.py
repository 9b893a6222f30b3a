"""The actor's weights subscription: the SUB socket, newest weights win.

:class:`WeightsSubscriber` drains every weights frame that arrived and decodes them
newest first, so only the newest valid blob of the actor's run costs a full decode.
Frames of another run tell the client that the learner restarted. No RL here.

It also keeps the subscription alive. libzmq drops a SUB's connection for good when
a frame exceeds the socket's ``ZMQ_MAXMSGSIZE`` (it does not reconnect, and says
nothing but a ``DISCONNECTED`` monitor event); a subscriber that stopped receiving
would leave the actor acting on stale weights forever. So the subscriber watches that
event and re-creates the SUB, and :meth:`WeightsSubscriber.check` does the same when
the learner's heartbeats announce a version newer than the loaded one for too long.

In a run of several policies, :class:`PolicyVersions` keeps each policy's loaded
version and adopts, from each reading, the weights that are new and fit.

"Newest wins" holds among the weights that can be loaded (docs/protocol.md sections
4.2 and 5.3): each reading's candidates are tried newest first, and the first that
is newer than the loaded version and fits is adopted (:func:`first_fit`). Weights
refused on the way (forged, say at version 10**12) cost nothing but their check:
good weights read with them are still adopted, and no version moves for them.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence

import zmq

from ..sparse_log import log_sparsely
from ..wire.protocol import ProtocolError, Weights, decode, decode_policy_weights
from ..wire.transport import readable

__all__ = ["PolicyVersions", "WeightsSubscriber", "first_fit", "named"]

log = logging.getLogger("zmq_rl.subscriber")


def named(weights: Weights) -> str:
    """How errors name ``weights``: ``weights version 7`` (``of policy 'red'``)."""
    policy = f" of policy {weights.policy!r}" if weights.policy else ""
    return f"weights version {weights.version}{policy}"


def first_fit(
    candidates: Iterable[Weights], loaded: int, fits: Callable[[Weights], bool] | None = None
) -> Weights | None:
    """The first of ``candidates`` (newest first) newer than ``loaded`` that ``fits``
    accepts (None: any), or None. ``fits`` runs only on those newer than ``loaded``,
    and no candidate after the one returned is looked at (nor decoded, when
    ``candidates`` decodes lazily)."""
    return next((w for w in candidates if w.version > loaded and (fits is None or fits(w))), None)


class WeightsSubscriber:
    """Newest-wins reader of the learner's PUB; ``reject(where, error)`` counts and
    logs a frame that does not decode."""

    def __init__(
        self,
        rejects: Counter[str],
        reject: Callable[[str, ProtocolError], None],
        max_message_bytes: int,
    ) -> None:
        self.rejects = rejects
        self.reject = reject
        self.max_message_bytes = max_message_bytes
        self.socket: zmq.Socket | None = None
        self.saw_other_run = False
        self.resubscriptions = 0
        """How often the SUB was re-created (a dropped connection, weights behind)."""
        self._connect: Callable[[], zmq.Socket] | None = None
        self._monitor: zmq.Socket | None = None
        self._behind_since: float | None = None

    def start(self, socket: zmq.Socket, connect: Callable[[], zmq.Socket] | None = None) -> None:
        """Read from ``socket`` (subscribed and connected) from now on; the old one
        closes. ``connect()`` makes a new such socket: with it, a dropped connection
        is noticed and the subscription made again (:meth:`check`)."""
        self.close(linger=0)
        self.socket = socket
        self._connect = connect
        self._behind_since = None
        if connect is not None:
            self._monitor = socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)

    def close(self, linger: int | None = None) -> None:
        """Close the SUB socket (and its monitor)."""
        if self.socket is not None:
            if self._monitor is not None:
                with contextlib.suppress(zmq.ZMQError):
                    self.socket.disable_monitor()
                self._monitor.close(linger=0)
                self._monitor = None
            self.socket.close(linger=linger)
            self.socket = None

    def pending(self) -> bool:
        """Whether a weights frame can be read now (never blocks)."""
        return self.socket is not None and readable(self.socket)

    def check(self, loaded: int, announced: int, stale_after: float) -> bool:
        """Re-create the SUB when libzmq dropped its connection (a frame over
        ``max_message_bytes``, which libzmq does not size, or the learner's PUB went
        away), or when the learner has announced (heartbeat ``version``) a version
        newer than the ``loaded`` one for ``stale_after`` seconds. Returns whether it
        did; each time is logged (rate-limited) and counted in ``rejects``
        (``weights:connection_dropped``, ``weights:behind``)."""
        if self.socket is None or self._connect is None:
            return False
        now = time.monotonic()
        if self._monitor is not None and readable(self._monitor):
            while readable(self._monitor):
                self._monitor.recv_multipart()
            self._resubscribe(
                "connection_dropped",
                "libzmq dropped the weights connection: a frame over this actor's limit "
                f"of {self.max_message_bytes:,} bytes (libzmq does not report its size), "
                "or the learner's PUB closed",
            )
            return True
        if announced <= loaded:
            self._behind_since = None
            return False
        if self._behind_since is None:
            self._behind_since = now
            return False
        if now - self._behind_since < stale_after:
            return False
        self._resubscribe(
            "behind",
            f"the learner announced version {announced} but no weights newer than "
            f"{loaded} arrived for {now - self._behind_since:.1f}s",
        )
        return True

    def _resubscribe(self, reason: str, why: str) -> None:
        assert self._connect is not None
        self.resubscriptions += 1
        self.rejects[f"weights:{reason}"] += 1
        log_sparsely(
            log,
            self.resubscriptions,
            logging.WARNING,
            "%s; subscribing to the weights again (re-subscription %d)",
            why,
            self.resubscriptions,
            quiet=logging.DEBUG,
        )
        self.start(self._connect(), self._connect)

    def newest_each(self, run_id: str) -> list[list[Weights]]:
        """Several policies: drain every queued ``[topic, weights]`` message and return
        each policy's valid weights of ``run_id``, newest first (by version; of equal
        versions, the later to arrive first), one list per policy (in arrival order of
        their policies' first message): the candidates of
        :meth:`PolicyVersions.adopt`. Messages of another run, frames that do not
        decode and topics that do not match their weights are counted as
        :meth:`newest` counts them."""
        self.saw_other_run = False
        arrived: dict[str, list[Weights]] = {}
        while self.pending():
            assert self.socket is not None
            frames = [f.buffer for f in self.socket.recv_multipart(copy=False)]
            try:
                weights = decode_policy_weights(frames, self.max_message_bytes)
            except ProtocolError as exc:
                size = sum(len(f) for f in frames)
                self.reject("weights", ProtocolError(exc.reason, f"{exc} ({size:,} bytes)"))
                continue
            if weights.run_id != run_id:
                self.rejects["weights:other_run"] += 1
                self.saw_other_run = True
                continue
            arrived.setdefault(weights.policy, []).append(weights)
        # sorted() is stable: of equal versions, the later to arrive stays first.
        return [sorted(reversed(each), key=lambda w: -w.version) for each in arrived.values()]

    def newest(
        self, run_id: str, loaded: int = -1, fits: Callable[[Weights], bool] | None = None
    ) -> Weights | None:
        """One policy: drain every queued frame; return the newest valid weights of
        ``run_id`` (the last to arrive first) that are newer than ``loaded`` and that
        ``fits`` accepts (:func:`first_fit`; by default: the newest, whatever its
        version), or None. Frames are decoded newest first, only as far as needed.
        Frames of another run are counted (``weights:other_run``) and set
        :attr:`saw_other_run` until the next call. A frame that does not decode is
        counted and logged with its size; weights that name a policy (which a run of
        one policy never sends, docs/protocol.md section 4.2) are counted as
        ``weights:bad_field`` and logged naming the policy and the version."""
        self.saw_other_run = False
        frames = []
        while self.pending():
            assert self.socket is not None
            frames.append(self.socket.recv(copy=False).buffer)
        return first_fit(self._decoded(reversed(frames), run_id), loaded, fits)

    def _decoded(self, frames: Iterable[memoryview], run_id: str) -> Iterator[Weights]:
        """The weights of ``run_id`` among one policy's ``frames``, decoded one by one
        as they are asked for; what is refused is counted (:meth:`newest`)."""
        for frame in frames:
            try:
                weights = decode(frame, (Weights,), self.max_message_bytes)
            except ProtocolError as exc:
                self.reject("weights", ProtocolError(exc.reason, f"{exc} ({len(frame):,} bytes)"))
                continue
            assert isinstance(weights, Weights)
            if weights.run_id != run_id:
                self.rejects["weights:other_run"] += 1
                self.saw_other_run = True
            elif weights.policy:
                why = "a run of one policy, where weights name none (docs/protocol.md 4.2)"
                self.reject("weights", ProtocolError("bad_field", f"{named(weights)}: {why}"))
            else:
                yield weights


class PolicyVersions:
    """Several policies: each policy's loaded version, and the weights adopted from one
    reading that the client has not handed out yet (one policy's weights per
    :meth:`~zmq_rl.actor.client.LearnerConnection.poll`). Empty in a run of one policy."""

    def __init__(self) -> None:
        self.versions: dict[str, int] = {}
        self.before: dict[str, int] = {}  # each policy's version before it last moved
        self.fresh: deque[Weights] = deque()  # adopted, not yet handed out

    @property
    def several(self) -> bool:
        """Whether the run has several policies (its welcome named them)."""
        return bool(self.versions)

    def start(self, welcome_weights: Iterable[Weights]) -> None:
        """A welcome adopted: its weights of each policy are loaded, nothing is held."""
        self.before, self.versions = self.versions, {w.policy: w.version for w in welcome_weights}
        self.fresh.clear()

    def newest(self, default: int) -> int:
        """The newest version loaded of any policy (``default`` with one policy)."""
        return max(self.versions.values(), default=default)

    def oldest(self, default: int = 0) -> int:
        """The oldest version loaded of the policies (``default`` with one policy): no
        row is tagged newer than its policy when the client's version is this one."""
        return min(self.versions.values(), default=default)

    def adopt(
        self, candidates: Iterable[Sequence[Weights]], fits: Callable[[Weights], bool]
    ) -> Weights | None:
        """Take, of each policy's ``candidates`` (newest first,
        :meth:`WeightsSubscriber.newest_each`), the first that is newer than its loaded
        version and that ``fits`` accepts (:func:`first_fit`: weights refused on the way
        move nothing); return the first taken and hold the others (:meth:`take`).
        None: nothing new. Weights of a policy not loaded here are ignored."""
        taken = []
        for each in candidates:
            policy = each[0].policy
            if policy in self.versions:
                weights = first_fit(each, self.versions[policy], fits)
                if weights is not None:
                    self.before[policy] = self.versions[policy]
                    self.versions[policy] = weights.version
                    taken.append(weights)
        self.hold(taken[1:])
        return taken[0] if taken else None

    def undo(self, weights: Weights) -> None:
        """``weights`` could not be loaded after all: their policy goes back to the
        older version it had (when it is still at theirs)."""
        policy, version = weights.policy, weights.version
        if self.versions.get(policy) == version and self.before.get(policy, version) < version:
            self.versions[policy] = self.before[policy]

    def hold(self, weights: Iterable[Weights]) -> None:
        """Hand ``weights`` out on the next calls of :meth:`take`."""
        self.fresh.extend(weights)

    def take(self) -> Weights | None:
        """The next adopted weights not handed out yet, or None."""
        return self.fresh.popleft() if self.fresh else None
