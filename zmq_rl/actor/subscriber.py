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
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable

import zmq

from ..sparse_log import log_sparsely
from ..wire.protocol import ProtocolError, Weights, decode, decode_policy_weights
from ..wire.transport import readable

__all__ = ["PolicyVersions", "WeightsSubscriber"]

log = logging.getLogger("zmq_rl.subscriber")


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

    def newest_each(self, run_id: str) -> list[Weights]:
        """Several policies: drain every queued ``[topic, weights]`` message and return
        the newest valid weights of ``run_id`` of each policy (in arrival order of
        their policies' first message). Messages of another run, frames that do not
        decode and topics that do not match their weights are counted as
        :meth:`newest` counts them."""
        self.saw_other_run = False
        newest: dict[str, Weights] = {}
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
            held = newest.get(weights.policy)
            if held is None or weights.version > held.version:
                newest[weights.policy] = weights
        return list(newest.values())

    def newest(self, run_id: str) -> Weights | None:
        """Drain every queued frame; return the newest valid weights of ``run_id``
        (whatever their version), or None. Frames of another run are counted
        (``weights:other_run``) and set :attr:`saw_other_run` until the next call.
        A frame that does not decode is counted and logged with its size."""
        self.saw_other_run = False
        frames = []
        while self.pending():
            assert self.socket is not None
            frames.append(self.socket.recv(copy=False).buffer)
        for frame in reversed(frames):
            try:
                weights = decode(frame, (Weights,), self.max_message_bytes)
            except ProtocolError as exc:
                self.reject("weights", ProtocolError(exc.reason, f"{exc} ({len(frame):,} bytes)"))
                continue
            assert isinstance(weights, Weights)
            if weights.run_id != run_id:
                self.rejects["weights:other_run"] += 1
                self.saw_other_run = True
                continue
            return weights
        return None


class PolicyVersions:
    """Several policies: each policy's loaded version, and the weights adopted from one
    reading that the client has not handed out yet (one policy's weights per
    :meth:`~zmq_rl.actor.client.LearnerConnection.poll`). Empty in a run of one policy."""

    def __init__(self) -> None:
        self.versions: dict[str, int] = {}
        self.fresh: deque[Weights] = deque()  # adopted, not yet handed out

    @property
    def several(self) -> bool:
        """Whether the run has several policies (its welcome named them)."""
        return bool(self.versions)

    def start(self, welcome_weights: Iterable[Weights]) -> None:
        """A welcome adopted: its weights of each policy are loaded, nothing is held."""
        self.versions = {w.policy: w.version for w in welcome_weights}
        self.fresh.clear()

    def newest(self, default: int) -> int:
        """The newest version loaded of any policy (``default`` with one policy)."""
        return max(self.versions.values(), default=default)

    def oldest(self) -> int:
        """The oldest version loaded of the policies: no row is tagged newer than its
        policy when the client's version is this one."""
        return min(self.versions.values())

    def adopt(self, newest: Iterable[Weights], fits: Callable[[Weights], bool]) -> Weights | None:
        """Take each policy's ``newest`` weights (:meth:`WeightsSubscriber.newest_each`)
        that are newer than its loaded version and ``fits`` accepts; return the first
        of them and hold the others (:meth:`take`). None: nothing new."""
        taken = [
            w for w in newest if w.version > self.versions.get(w.policy, w.version) and fits(w)
        ]
        for weights in taken:
            self.versions[weights.policy] = weights.version
        self.hold(taken[1:])
        return taken[0] if taken else None

    def hold(self, weights: Iterable[Weights]) -> None:
        """Hand ``weights`` out on the next calls of :meth:`take`."""
        self.fresh.extend(weights)

    def take(self) -> Weights | None:
        """The next adopted weights not handed out yet, or None."""
        return self.fresh.popleft() if self.fresh else None
