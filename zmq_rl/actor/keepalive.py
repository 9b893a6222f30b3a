"""An actor is alive from its welcome on: heartbeats while it builds.

Between its welcome and its first step an actor builds what the welcome describes:
its envs, its policy (importing torch for some networks), an opponent pool. On a
busy host that took 6-16 s without a heartbeat, longer than the learner lets a
registration be silent (5 heartbeat intervals before it joins, ``actor_timeout``
after), so the learner threw the registration away and the actor, once built, sent
rows it refused. docs/protocol.md §5.5 says an actor heartbeats "while registered";
:class:`KeepAlive` does so on a thread while the owner's thread builds, and stops
(joined, so the connection is the owner's alone again) before the first step.

The thread only serves the control channel (:meth:`LearnerConnection.serve_control
<zmq_rl.actor.client.LearnerConnection.serve_control>`): it answers learner heartbeats,
sends its own, and notes a shutdown or a ``refuse reregister``; weights wait on SUB
and a registration again waits for the owner's next poll.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Self

__all__ = ["KEEPALIVE_POLL_S", "KeepAlive"]

log = logging.getLogger("zmq_rl.client")

KEEPALIVE_POLL_S = 0.05
"""How long the thread waits for a control message at a time: how soon :meth:`KeepAlive.stop`
returns, and how late a due heartbeat can be."""


class KeepAlive:
    """Calls ``serve(KEEPALIVE_POLL_S)`` on a thread (serve waits that long for a control
    message, handles what came and sends a heartbeat when one is due) from
    :meth:`start` until :meth:`stop`. A context manager. While it runs, the owner must
    not use the connection ``serve`` belongs to; :meth:`stop` joins the thread (the
    handover) and re-raises what the thread raised."""

    def __init__(self, serve: Callable[[float], None], name: str = "zmq-rl-keepalive") -> None:
        self._serve = serve
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.error: BaseException | None = None
        """What the thread raised (it then stopped serving), re-raised by :meth:`stop`."""
        self.rounds = 0
        """Times ``serve`` returned (how long it kept the connection alive)."""

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._serve(KEEPALIVE_POLL_S)
                self.rounds += 1
        except BaseException as exc:  # re-raised by stop(), on the owner's thread
            self.error = exc

    @property
    def running(self) -> bool:
        """Whether the thread is still serving."""
        return self._thread.is_alive()

    def start(self) -> Self:
        """Start serving on the thread; returns self."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and join the thread (within one ``serve`` call, about
        :data:`KEEPALIVE_POLL_S`); re-raise what it raised. Idempotent."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join()
        error, self.error = self.error, None
        if error is not None:
            raise error

    def __enter__(self) -> Self:
        return self.start() if self._thread.ident is None else self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
