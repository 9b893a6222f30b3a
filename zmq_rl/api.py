"""The Python API: train from a script or a notebook, hook into training, start
learners and actors, load and export trained policies.

Everything here is re-exported by :mod:`zmq_rl` (``zmq_rl.train(...)``); the
console scripts (``zmq-rl run``, ``zmq-learner``, ``zmq-actor``) are thin layers
over the same functions. See docs/api.md.

Settings are the fields of :class:`~zmq_rl.config.LearnerConfig`,
:class:`~zmq_rl.config.PPOConfig` and :class:`~zmq_rl.config.PolicyConfig`, given
as keyword arguments by field name (``learning_rate=3e-4``, ``num_actors=4``,
``env_kwargs={"gravity": -5.0}``, ``wrappers=["mymod:MyWrapper"]``); as on the
command line, an env with a shipped preset (CartPole-v1, LunarLander-v3, ...)
takes its tuned defaults from it unless ``preset=False``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .config import ActorConfig, ConfigError, LearnerConfig, PolicyConfig, PPOConfig

if TYPE_CHECKING:
    from .deploy import DeployedPolicy
    from .learner.loop import Learner
    from .report import LearnerReport
    from .run.fleet import FleetLearner, RunLearner

__all__ = [
    "ActorProcesses",
    "Callback",
    "TrainResult",
    "make_configs",
    "run_actor",
    "run_learner",
    "start_actors",
    "train",
]

log = logging.getLogger(__name__)

STOP_WAIT_S = 15.0
"""How long :meth:`ActorProcesses.stop` waits for actors to exit after SIGTERM."""


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

    ``report`` is the learner's :class:`~zmq_rl.report.LearnerReport` (None when
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
        from .deploy import PolicyFileError, load_policy

        if self.policy_path is None:
            raise PolicyFileError(f"{self.run_dir}: the run wrote no policy.pt")
        return load_policy(self.policy_path)


# -- configs ----------------------------------------------------------------------------


def make_configs(
    env: str | None = None,
    *,
    preset: bool = True,
    config: str | os.PathLike[str] | None = None,
    **settings: Any,
) -> tuple[LearnerConfig, PPOConfig, PolicyConfig]:
    """Validated configs from keyword settings, as ``zmq-rl run`` builds them from flags.

    Precedence: ``settings`` > ``config`` (a TOML file, or ``"preset:NAME"``) > the
    env's shipped preset (when ``preset`` and no ``config``) > the dataclass
    defaults. ``env`` is ``env_id``. Each setting is a field name of
    :class:`LearnerConfig`, :class:`PPOConfig` or :class:`PolicyConfig`; an
    unknown name is a :class:`ConfigError` naming it (with a suggestion).
    """
    import difflib

    from .cli.flags import load_toml, preset_for
    from .cli.learner import LEARNER_SECTIONS
    from .presets import resolve_config_source

    if env is not None:
        settings["env_id"] = env
    owner = {f.name: s for s in LEARNER_SECTIONS for f in s.fields()}
    for name in settings:
        if name not in owner:
            close = difflib.get_close_matches(name, list(owner), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(name, settings[name], f"unknown setting{hint}")
    values: dict[str, dict[str, Any]] = {s.name: {} for s in LEARNER_SECTIONS}
    source = None
    if config is not None:
        source = resolve_config_source(str(config))
    elif preset:
        source = preset_for(str(settings.get("env_id", LearnerConfig.env_id)))
    if source is not None:
        for dest, value in load_toml(Path(source), LEARNER_SECTIONS).items():
            section, name = dest.split(".", 1)
            values[section][name] = value
    for name, value in settings.items():
        values[owner[name].name][name] = value
    built = [s.cls(**values[s.name]).validate() for s in LEARNER_SECTIONS]
    return built[0], built[1], built[2]


def _resolve_run_dir(cfg: LearnerConfig, run_dir: str | os.PathLike[str] | None) -> LearnerConfig:
    """``run_dir`` None -> a new ``runs/<env>-<timestamp>``; ``""`` -> no run dir."""
    from .run.session import resolve_run_dir

    return resolve_run_dir(cfg, None if run_dir is None else str(run_dir))


def _preset_name(env_id: str, preset: bool, config: Any) -> str | None:
    from .cli.flags import preset_for

    return env_id if preset and config is None and preset_for(env_id) is not None else None


# -- callbacks --------------------------------------------------------------------------


class _Hooks:
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


# -- training ---------------------------------------------------------------------------


def _console(verbose: bool) -> Any:
    from rich.console import Console

    return Console(soft_wrap=True, highlight=False, quiet=not verbose)


def train(
    env: str | None = None,
    *,
    run_dir: str | os.PathLike[str] | None = None,
    callbacks: Sequence[Callback] = (),
    preset: bool = True,
    config: str | os.PathLike[str] | None = None,
    actor_restarts: int = 3,
    actor_restart_backoff: float = 1.0,
    actor_log_level: str | None = None,
    tensorboard: bool | None = None,
    wandb_project: str | None = None,
    verbose: bool = True,
    **settings: Any,
) -> TrainResult:
    """Train with a learner in this process and ``num_actors`` local actor processes
    (what ``zmq-rl run`` does), and return the :class:`TrainResult`.

    ``env``: a gymnasium id, ``"module:Id"``, or your own ``"module.path:EnvClass"`` /
    ``"module.path:make_fn"`` (default CartPole-v1). ``settings``: config fields by
    name (see :func:`make_configs`; ``total_env_steps``, ``num_actors``, ``seed``,
    ``env_kwargs``, ``wrappers``, ``target_return``, ...). ``run_dir``: where the run
    writes its files; None = a new ``runs/<env>-<timestamp>``, ``""`` = none.
    ``callbacks``: :class:`Callback` objects (any hook returning False stops the run).
    Dead actors are restarted up to ``actor_restarts`` times each. ``tensorboard``
    and ``wandb_project`` as the ``--tensorboard`` / ``--wandb-project`` flags;
    ``verbose=False`` prints nothing (the run still logs through :mod:`logging`).

    Raises :class:`ConfigError` (a bad setting, an env that cannot be built:
    :class:`~zmq_rl.envs.EnvBuildError`) before anything starts, and
    :class:`~zmq_rl.run.common.CliFailure` for run-time failures (port in use,
    starved learner, a lost learner rank, an actor that cannot start). Ctrl-C stops
    the run cleanly (the result's ``interrupted`` is set).
    """
    _Hooks(callbacks)  # a wrong callback fails before anything starts
    cfg, ppo, policy = make_configs(env, preset=preset, config=config, **settings)
    cfg = _resolve_run_dir(cfg, run_dir)
    return _train_configs(
        cfg,
        ppo,
        policy,
        callbacks=callbacks,
        local_actors=True,
        actor_restarts=actor_restarts,
        actor_restart_backoff=actor_restart_backoff,
        actor_log_level=actor_log_level or ("info" if cfg.run_dir else "warning"),
        tensorboard=tensorboard,
        wandb_project=wandb_project,
        console=_console(verbose),
        preset=_preset_name(cfg.env_id, preset, config),
        command="zmq_rl.train",
    )[0]


def run_learner(
    env: str | None = None,
    *,
    run_dir: str | os.PathLike[str] | None = None,
    callbacks: Sequence[Callback] = (),
    preset: bool = True,
    config: str | os.PathLike[str] | None = None,
    tensorboard: bool | None = None,
    wandb_project: str | None = None,
    verbose: bool = True,
    **settings: Any,
) -> TrainResult:
    """Run a learner alone (what ``zmq-learner`` does): bind ``host:port`` (settings
    ``host="0.0.0.0"`` for other machines, ``port``), wait for ``num_actors`` actors
    started elsewhere (``zmq-actor --learner HOST:PORT`` or :func:`start_actors`),
    train, and return the :class:`TrainResult`. Arguments as :func:`train`."""
    _Hooks(callbacks)  # a wrong callback fails before anything starts
    cfg, ppo, policy = make_configs(env, preset=preset, config=config, **settings)
    cfg = _resolve_run_dir(cfg, run_dir)
    return _train_configs(
        cfg,
        ppo,
        policy,
        callbacks=callbacks,
        local_actors=False,
        tensorboard=tensorboard,
        wandb_project=wandb_project,
        console=_console(verbose),
        preset=_preset_name(cfg.env_id, preset, config),
        command="zmq_rl.run_learner",
    )[0]


def _train_configs(
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
    plot: bool = False,
) -> tuple[TrainResult, Any, dict[str, str]]:
    """The engine of :func:`train`, :func:`run_learner`, ``zmq-rl run`` and
    ``zmq-learner``: returns the result, the CLI's training outcome (for its
    summary) and the summary's extra lines. ``cfg.run_dir`` is final here."""
    from .run.local_actors import LocalActors, ResumingLearner, summary_lines
    from .run.session import train as run_training

    hooks = _Hooks(callbacks)
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
        )
        return supervised["actors"]

    outcome = run_training(
        cfg,
        ppo,
        policy,
        console if console is not None else _console(True),
        tensorboard=tensorboard,
        around_run=around_run if local_actors else None,
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
    if cfg.run_dir and plot and (Path(cfg.run_dir) / "metrics.jsonl").is_file():
        from .cli.plot import CURVE_NAME, plot_runs

        extra["learning curve"] = str(plot_runs([cfg.run_dir], Path(cfg.run_dir) / CURVE_NAME))
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


# -- actors -----------------------------------------------------------------------------


def _actor_config(learner: str, settings: Mapping[str, Any]) -> ActorConfig:
    import difflib

    names = {f.name for f in dataclasses.fields(ActorConfig)}
    for name in settings:
        if name not in names:
            close = difflib.get_close_matches(name, sorted(names), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(name, settings[name], f"unknown actor setting{hint}")
    return ActorConfig(learner=learner, **settings).validate()


def run_actor(learner: str = "127.0.0.1:5555", **settings: Any) -> dict[str, float]:
    """Run one actor in this process (what ``zmq-actor`` does) until the learner at
    ``learner`` (``HOST[:PORT]``) shuts the run down; return its stats.
    ``settings``: :class:`~zmq_rl.config.ActorConfig` fields (``num_envs``,
    ``seed``, ``register_timeout``, ...). Raises
    :class:`~zmq_rl.actor.client.LearnerRefused` / ``LearnerUnreachable`` /
    ``LearnerLost`` when the learner refuses, never answers or goes silent."""
    from .actor.gym_actor import GymActor

    return GymActor(_actor_config(learner, settings)).run()


class ActorProcesses:
    """Actor processes started by :func:`start_actors` (a context manager: leaving
    it stops those still running). ``procs`` are their :class:`subprocess.Popen`."""

    def __init__(self, commands: list[list[str]], log_dir: Path | None) -> None:
        self.commands = commands
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[Any] = []

    def start(self) -> ActorProcesses:
        """Start every process (done by :func:`start_actors`)."""
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        for i, command in enumerate(self.commands):
            out = None
            if self.log_dir is not None:
                out = open(self.log_dir / f"actor-{i}.log", "ab")  # noqa: SIM115 (closed in stop)
                self._logs.append(out)
            self.procs.append(
                subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT if out else None)
            )
        return self

    def wait(self, timeout: float | None = None) -> list[int]:
        """Wait for every actor to exit (they do when the learner ends the run);
        return their exit codes. :class:`subprocess.TimeoutExpired` after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        codes = []
        for proc in self.procs:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            codes.append(proc.wait(left))
        return codes

    def stop(self) -> list[int | None]:
        """SIGTERM the actors still running (they leave cleanly), SIGKILL those that
        do not exit within :data:`STOP_WAIT_S`; return the exit codes."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + STOP_WAIT_S
        for proc in self.procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for out in self._logs:
            out.close()
        self._logs.clear()
        return [proc.returncode for proc in self.procs]

    def __enter__(self) -> ActorProcesses:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_actors(
    learner: str = "127.0.0.1:5555",
    count: int = 1,
    *,
    log_dir: str | os.PathLike[str] | None = None,
    log_level: str = "info",
    **settings: Any,
) -> ActorProcesses:
    """Start ``count`` ``zmq-actor`` processes for the learner at ``learner``
    (``HOST[:PORT]``) and return them (:class:`ActorProcesses`; use it as a context
    manager, or call :meth:`~ActorProcesses.wait` / :meth:`~ActorProcesses.stop`).
    ``settings``: :class:`~zmq_rl.config.ActorConfig` fields for every actor,
    validated here. ``log_dir``: each actor's output goes to
    ``log_dir/actor-<i>.log`` (default: this process's stdout/stderr)."""
    if count < 1:
        raise ConfigError("count", count, "must be an integer >= 1")
    cfg = _actor_config(learner, settings)
    from .cli.flags import flag_name

    defaults = ActorConfig()
    args: list[str] = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if value != getattr(defaults, f.name) or f.name == "learner":
            args += [flag_name(f.name), str(value)]
    command = [sys.executable, "-m", "zmq_rl.cli.actor", *args, "--log-level", log_level]
    commands = [list(command) for _ in range(count)]
    return ActorProcesses(commands, Path(log_dir) if log_dir is not None else None).start()
