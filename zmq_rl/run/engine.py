"""The engine of one training run: one :func:`train` for ``zmq_rl.train``,
``zmq_rl.run_learner``, ``zmq-rl run`` and ``zmq-learner``.

:func:`train` wires a run together: the user's :class:`Callback` objects (through
:class:`Hooks`), a learner that resumes after a crash (``resume_on_crash``:
:class:`~zmq_rl.run.local_actors.ResumingLearner`), the local actor processes
(:class:`~zmq_rl.run.local_actors.LocalActors`) and the session that runs the learner
(:func:`zmq_rl.run.session.train`: run dir, config.toml, signals, metric sinks,
progress), and returns a :class:`TrainResult`. The Python API (:mod:`zmq_rl.api`) and
the command line (:mod:`zmq_rl.cli`) parse their arguments and call it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import LearnerConfig, PolicyConfig, PPOConfig

if TYPE_CHECKING:
    from ..learner.loop import Learner
    from ..learner.report import LearnerReport
    from ..serving.deploy import DeployedPolicy
    from .fleet import ActorFleet, FleetLearner, RunLearner

__all__ = ["Callback", "Hooks", "TrainResult", "console_for", "train"]

# The callbacks' messages keep the logger name they had in zmq_rl/api.py.
log = logging.getLogger("zmq_rl.api")


class Callback:
    """Hooks called by :func:`train` and :func:`run_learner` as the run goes.

    Subclass it and override what you need. ``on_update``, ``on_evaluation`` and
    ``on_checkpoint`` may return ``False`` to stop the run: the learner then ends
    as if its budget were spent (actors shut down, checkpoint, report and
    ``policy.pt`` written) with the stop reason ``"callback <Name> stopped the run"``.
    Any other return value (``None``, ``True``) lets it continue. Hooks run in the
    learner's thread, between updates: a slow hook slows training.
    """

    def on_training_start(self, learner: Any) -> None:
        """Once the learner has bound its sockets, before any actor registers.
        ``learner`` is the :class:`~zmq_rl.learner.loop.Learner` (``learner.cfg``,
        ``learner.policy``, ``learner.report``)."""

    def on_update(self, row: Mapping[str, Any]) -> bool | None:
        """After every PPO update, with its metrics row (``update``, ``env_steps``,
        ``charts/mean_return``, ``losses/...``: the keys of ``metrics.jsonl``)."""
        return None

    def on_evaluation(self, result: Mapping[str, Any]) -> bool | None:
        """After each evaluation is reported (``mean_return``, ``std_return``,
        ``env_steps``, ``updates``). The final evaluation at the end of the run is
        reported too; returning False there changes nothing."""
        return None

    def on_checkpoint(self, path: Path) -> bool | None:
        """After a checkpoint was written to ``path`` (``RUN_DIR/checkpoints/ckpt-N.pt``)."""
        return None

    def on_training_end(self, result: TrainResult) -> None:
        """Once the run is over (also when it was stopped or interrupted)."""


@dataclass
class TrainResult:
    """What a training run produced.

    ``report`` is the learner's :class:`~zmq_rl.learner.report.LearnerReport` (None when
    the run was aborted by a second Ctrl-C); ``run_dir`` holds config.toml,
    metrics, report.json, policy.pt and checkpoints (None without a run dir).
    """

    report: LearnerReport | None
    run_dir: Path | None
    interrupted: bool = False
    supervisor: dict[str, Any] = field(default_factory=dict)
    """Actor restarts and exits (``zmq_rl.train`` only; also in report.json)."""

    @property
    def stop_reason(self) -> str:
        """Why the run ended (``"budget spent"``, ``"evaluation reached target_return
        475"``, ``"callback X stopped the run"``, ...); ``"interrupted"`` without a report."""
        return self.report.stop_reason if self.report is not None else "interrupted"

    @property
    def last_evaluation(self) -> dict[str, float] | None:
        """The newest evaluation (``mean_return``, ``std_return``, ``env_steps``), if any."""
        if self.report is None or not self.report.evaluations:
            return None
        return dict(self.report.evaluations[-1])

    @property
    def policy_path(self) -> Path | None:
        """``RUN_DIR/policy.pt`` when it was written."""
        if self.run_dir is None or not (self.run_dir / "policy.pt").is_file():
            return None
        return self.run_dir / "policy.pt"

    def load_policy(self) -> DeployedPolicy:
        """The trained policy (:func:`zmq_rl.load_policy` of ``policy.pt``)."""
        from ..serving.deploy import PolicyFileError, load_policy

        if self.policy_path is None:
            raise PolicyFileError(f"{self.run_dir}: the run wrote no policy.pt")
        return load_policy(self.policy_path)


class Hooks:
    """Runs the callbacks of one run and turns a ``False`` into ``request_stop``."""

    def __init__(self, callbacks: Iterable[Callback]) -> None:
        self.callbacks = list(callbacks)
        for cb in self.callbacks:
            if not isinstance(cb, Callback):
                raise TypeError(
                    f"callbacks: {cb!r} is not a zmq_rl.Callback (subclass it and "
                    "override on_update / on_evaluation / on_checkpoint)"
                )
        self.learner: Any = None
        self.evaluations_seen = 0

    def attach(self, learner: Any) -> Any:
        self.learner = learner
        self.evaluations_seen = len(learner.report.evaluations)
        learner.on_checkpoint = self.on_checkpoint
        for cb in self.callbacks:
            cb.on_training_start(learner)
        return learner

    def _fire(self, hook: str, arg: Any) -> None:
        for cb in self.callbacks:
            if getattr(cb, hook)(arg) is False and self.learner is not None:
                name = type(cb).__name__
                log.info("callback %s asked to stop the run (%s)", name, hook)
                self.learner.request_stop(f"callback {name} stopped the run")

    def on_update(self, row: Mapping[str, Any]) -> None:
        self._fire("on_update", row)
        self.new_evaluations()

    def new_evaluations(self) -> None:
        if self.learner is None:
            return
        evaluations = self.learner.report.evaluations
        while self.evaluations_seen < len(evaluations):
            self._fire("on_evaluation", dict(evaluations[self.evaluations_seen]))
            self.evaluations_seen += 1

    def on_checkpoint(self, path: Path) -> None:
        self._fire("on_checkpoint", Path(path))

    def end(self, result: TrainResult) -> None:
        self.new_evaluations()
        for cb in self.callbacks:
            cb.on_training_end(result)


def console_for(verbose: bool) -> Any:
    """The rich console of a run: the progress and the summary, or nothing (quiet)."""
    from rich.console import Console

    return Console(soft_wrap=True, highlight=False, quiet=not verbose)


def train(
    cfg: LearnerConfig,
    ppo: PPOConfig,
    policy: PolicyConfig,
    *,
    callbacks: Sequence[Callback] = (),
    local_actors: bool = True,
    actor_restarts: int = 3,
    actor_restart_backoff: float = 1.0,
    actor_log_level: str = "info",
    tensorboard: bool | None = None,
    wandb_project: str | None = None,
    console: Any = None,
    preset: str | None = None,
    command: str = "zmq_rl.train",
    resume: tuple[str, Mapping[str, Any]] | None = None,
    resume_on_crash: int = 0,
    resume_command: str = "zmq-rl run --resume",
    plot: Callable[[Path], Path] | None = None,
    fleet: Callable[[FleetLearner], ActorFleet] | None = None,
    actor_args: Sequence[str] = (),
) -> tuple[TrainResult, Any, dict[str, str]]:
    """The engine of :func:`zmq_rl.train`, :func:`zmq_rl.run_learner`, ``zmq-rl run``
    and ``zmq-learner``: returns the result, the session's training outcome (for the
    summary) and the summary's extra lines. ``cfg.run_dir`` is final here.
    ``plot(run_dir)``, when given, draws the run's learning curve and returns its file
    (the command line's ``--plot``). ``fleet(learner)``: the actor fleet to run
    instead of local actor processes, with ``local_actors=False`` (``zmq-rl ray``'s
    Ray actors). ``actor_args``: flags every local actor process gets (``zmq-rl run
    --actor-learner-timeout S`` gives ``--learner-timeout S``)."""
    from .local_actors import LocalActors, ResumingLearner, summary_lines
    from .session import train as run_training

    hooks = Hooks(callbacks)
    log_dir = Path(cfg.run_dir) / "logs" if cfg.run_dir else None
    supervised: dict[str, Any] = {}

    def wrap_learner(learner: Learner) -> RunLearner:
        hooks.attach(learner)
        if resume_on_crash:
            learner = ResumingLearner(learner, resume_on_crash)
            supervised["learner"] = learner
        return learner

    def around_run(learner: FleetLearner) -> LocalActors:
        supervised["actors"] = LocalActors(
            learner,
            cfg.num_actors,
            log_dir=log_dir,
            log_level=actor_log_level,
            max_restarts=actor_restarts,
            restart_backoff=actor_restart_backoff,
            extra_args=actor_args,
        )
        return supervised["actors"]

    outcome = run_training(
        cfg,
        ppo,
        policy,
        console if console is not None else console_for(True),
        tensorboard=tensorboard,
        around_run=around_run if local_actors else fleet,
        command=command,
        resume=resume,
        wrap_learner=wrap_learner,
        preset=preset,
        resume_command=resume_command,
        on_update=hooks.on_update,
        wandb_project=wandb_project,
    )
    extra = summary_lines(supervised.get("actors"), supervised.get("learner"))
    if "learner" in supervised and supervised["learner"].learner_restarts:
        outcome.session_seconds = supervised["learner"].session_seconds
    if cfg.run_dir and plot is not None and (Path(cfg.run_dir) / "metrics.jsonl").is_file():
        extra["learning curve"] = str(plot(Path(cfg.run_dir)))
    if log_dir is not None and local_actors:
        extra["actor logs"] = str(log_dir)
    actors = supervised.get("actors")
    result = TrainResult(
        report=outcome.report,
        run_dir=Path(cfg.run_dir) if cfg.run_dir else None,
        interrupted=outcome.interrupted,
        supervisor=actors.summary() if actors is not None else {},
    )
    hooks.end(result)
    return result, outcome, extra
