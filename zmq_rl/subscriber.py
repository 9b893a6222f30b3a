"""The actor's weights subscription: the SUB socket, newest weights win.

:class:`WeightsSubscriber` drains every weights frame that arrived and decodes them
newest first, so only the newest valid blob of the actor's run costs a full decode.
Frames of another run tell the client that the learner restarted. No RL here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import zmq

from .protocol import ProtocolError, Weights, decode
from .transport import readable

__all__ = ["WeightsSubscriber"]


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

    def start(self, socket: zmq.Socket) -> None:
        """Read from ``socket`` (subscribed and connected) from now on; the old one closes."""
        self.close(linger=0)
        self.socket = socket

    def close(self, linger: int | None = None) -> None:
        """Close the SUB socket."""
        if self.socket is not None:
            self.socket.close(linger=linger)
            self.socket = None

    def pending(self) -> bool:
        """Whether a weights frame can be read now (never blocks)."""
        return self.socket is not None and readable(self.socket)

    def newest(self, run_id: str) -> Weights | None:
        """Drain every queued frame; return the newest valid weights of ``run_id``
        (whatever their version), or None. Frames of another run are counted
        (``weights:other_run``) and set :attr:`saw_other_run` until the next call."""
        self.saw_other_run = False
        frames = []
        while self.pending():
            assert self.socket is not None
            frames.append(self.socket.recv(copy=False).buffer)
        for frame in reversed(frames):
            try:
                weights = decode(frame, (Weights,), self.max_message_bytes)
            except ProtocolError as exc:
                self.reject("weights", exc)
                continue
            assert isinstance(weights, Weights)
            if weights.run_id != run_id:
                self.rejects["weights:other_run"] += 1
                self.saw_other_run = True
                continue
            return weights
        return None
