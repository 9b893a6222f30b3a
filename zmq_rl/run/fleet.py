"""How a run's actor fleet and its learner meet: two typed protocols.

A fleet (:class:`ActorFleet`: local actor processes, Ray actors) is started after the
learner's sockets are bound, usually while the learner itself is still being built
(:class:`~zmq_rl.run.session.StartingLearner` stands in for it until then), and
stopped after the learner's run ended; what it may call on the learner is
:class:`FleetLearner`. What the run's engine drives is a
:class:`RunLearner`: a :class:`~zmq_rl.learner.loop.Learner`, or a
``ResumingLearner`` that resumes a crashed one from its newest checkpoint.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Protocol

from ..config import LearnerConfig
from ..learner.report import LearnerReport

__all__ = ["ActorFleet", "FleetLearner", "RunLearner"]


class FleetLearner(Protocol):
    """What an actor fleet may use of the learner it serves."""

    @property
    def cfg(self) -> LearnerConfig:
        """The learner's settings (address, ports, run dir, number of actors)."""
        ...

    @property
    def report(self) -> LearnerReport:
        """The run's report so far (updates completed, the fleet's exit lines)."""
        ...

    def request_stop(self, reason: str) -> None:
        """Ask the run to end soon (an actor failed in a way a restart cannot mend)."""
        ...

    def actor_exited(self, pid: int) -> None:
        """An actor process ``pid`` of the fleet exited: its registration is dead now,
        not after ``actor_timeout``."""
        ...

    @property
    def learner_restarts(self) -> list[dict[str, Any]] | None:
        """The learner's restarts after its crashes (``--resume-on-crash``), for the
        fleet's report; None when the learner is not resumed after a crash."""
        ...


class RunLearner(FleetLearner, Protocol):
    """What the engine of a run drives: run it to the end, stop it, close it."""

    def run(self) -> LearnerReport:
        """Train until the budget is spent or a stop is requested; the report."""
        ...

    def close(self) -> None:
        """Close the sockets (and any learner rank processes)."""
        ...


class ActorFleet(Protocol):
    """The actors of one run: a context manager entered once the learner's sockets are
    bound (the learner may still be importing torch and building its trainer) and
    exited once its run ended (it stops every actor it started)."""

    failure: str
    """Why the fleet asked the learner to stop ("" when it did not)."""

    def __enter__(self) -> ActorFleet: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Any: ...

    def summary(self) -> dict[str, Any]:
        """What the fleet did (restarts, exits, pids), for report.json and the summary."""
        ...
