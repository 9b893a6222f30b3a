"""The ingest's serving thread: the learner's sockets are served while its main thread
works (a PPO update with ``ingest_thread``, an evaluation in the loop, a collective
of several learner ranks), so actors keep being heard and answered.

:class:`ServingThread` belongs to one :class:`~zmq_rl.learner.ingest.Ingest`
(:meth:`Ingest.serve_during <zmq_rl.learner.ingest.Ingest.serve_during>` is its
door). Its thread pumps the ingest's receiving sockets and a wake socket, so the
work's end stops it at once instead of after a poll timeout.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

import zmq

from .links import Links

__all__ = ["ServedIngest", "ServingThread", "wake_pair"]

T = TypeVar("T")


class ServedIngest(Protocol):
    """What :class:`ServingThread` uses of its :class:`~zmq_rl.learner.ingest.Ingest`."""

    control: zmq.Socket | None
    experience: zmq.Socket
    links: Links

    def pump(self, timeout_ms: int, poller: zmq.Poller | None = None) -> None:
        """Handle what arrives within ``timeout_ms`` on ``poller``'s sockets."""
        ...

    def defer_forgetting(self) -> None:
        """Hold ``forget_slots`` calls until :meth:`forget_deferred`."""
        ...

    def forget_deferred(self) -> None:
        """Apply the held ``forget_slots`` calls."""
        ...


def wake_pair(ctx: zmq.Context, name: str) -> tuple[zmq.Socket, zmq.Socket]:
    """An inproc PAIR (receiving end, sending end) that wakes a thread blocked in a
    poll; HWM 1 each (one pending wake is enough), linger 0."""
    ends = []
    for _ in range(2):
        sock = ctx.socket(zmq.PAIR)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 1)
        sock.setsockopt(zmq.RCVHWM, 1)
        ends.append(sock)
    ends[0].bind(f"inproc://{name}")
    ends[1].connect(f"inproc://{name}")
    return ends[0], ends[1]


class ServingThread:
    """Serves ``ingest``'s receiving sockets on a thread while work runs on the
    caller's (:meth:`during`). ``by_default``: whether work is served so when the
    caller does not say (``ingest_thread``; always on rank 0 of several learner
    ranks, which waits in collectives). The wake sockets are made the first time a
    thread is needed. The thread's polls block ``poll_ms`` at most."""

    def __init__(self, ingest: ServedIngest, by_default: bool, poll_ms: int) -> None:
        self.ingest = ingest
        self.by_default = by_default
        self.poll_ms = poll_ms
        self.poller: zmq.Poller | None = None
        self._wake: zmq.Socket | None = None
        self._waker: zmq.Socket | None = None
        if by_default:
            self._open()

    def _open(self) -> zmq.Poller:
        """The thread's poller: the receiving sockets and the wake socket."""
        if self.poller is None:
            ingest = self.ingest
            self._wake, self._waker = wake_pair(
                ingest.experience.context, f"zmq-rl-ingest-{id(ingest)}"
            )
            self.poller = zmq.Poller()
            for sock in (ingest.control, ingest.experience, self._wake):
                if sock is not None:
                    self.poller.register(sock, zmq.POLLIN)
        return self.poller

    def close(self) -> None:
        """Close the wake sockets (linger 0)."""
        for sock in (self._wake, self._waker):
            if sock is not None:
                sock.close(linger=0)
        self._wake = self._waker = None
        self.poller = None

    def during(self, work: Callable[[], T], thread: bool | None = None) -> T:
        """Run ``work()`` here while a thread serves the sockets (``thread``; None: as
        :attr:`by_default` says; False: just ``work()``). See
        :meth:`Ingest.serve_during <zmq_rl.learner.ingest.Ingest.serve_during>`."""
        if not (self.by_default if thread is None else thread):
            return work()
        ingest = self.ingest
        poller = self._open()
        wake, waker = self._wake, self._waker
        assert wake is not None and waker is not None
        stop = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            try:
                while not stop.is_set():
                    ingest.pump(self.poll_ms, poller)
                    while wake.poll(0):
                        wake.recv()
            except BaseException as exc:  # re-raised on the caller's thread
                failure.append(exc)

        ingest.defer_forgetting()
        busy, start = ingest.links.busy, time.monotonic()
        serving = threading.Thread(target=serve, name="zmq-rl-ingest", daemon=True)
        serving.start()
        try:
            return work()
        finally:
            stop.set()
            with contextlib.suppress(zmq.Again):  # a wake is already waiting
                waker.send(b"", zmq.NOBLOCK)
            serving.join()
            ingest.forget_deferred()
            ingest.links.worked(busy, start, time.monotonic())
            if failure:
                raise failure[0]
