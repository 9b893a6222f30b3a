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
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .config import ActorConfig, ConfigError, LearnerConfig, PolicyConfig, PPOConfig
from .run.engine import Callback, Hooks, TrainResult, console_for
from .run.engine import train as run_engine

if TYPE_CHECKING:
    pass

__all__ = [
    "ActorProcesses",
    "Callback",
    "TrainResult",
    "env_name",
    "make_configs",
    "run_actor",
    "run_learner",
    "start_actors",
    "train",
]

log = logging.getLogger(__name__)

STOP_WAIT_S = 15.0
"""How long :meth:`ActorProcesses.stop` waits for actors to exit after SIGTERM."""


# -- configs ----------------------------------------------------------------------------


def env_name(env: Any) -> str:
    """The name every process of a run builds ``env`` from (``env_id``): text as it is
    (a gymnasium id, ``"module:Id"``, ``"module.path:EnvClass"``, a PettingZoo module);
    a class, or a function returning an env, defined at the top level of an
    importable module becomes ``"module.path:Name"``.

    Each actor is a process of its own that builds its env copies from this name (an
    actor on another host too), and the learner and the evaluator build theirs, so
    an env *instance* cannot be used (it cannot be sent; its class or a function that
    builds it can be named), nor a factory that no other process can import by name:
    a lambda, a function defined inside another, or one defined in the script that
    was run (``__main__``; move it into a module: ``my_envs.py``, ``my_envs.MyEnv``).
    Those are a :class:`ConfigError` naming ``env`` and saying so."""
    import inspect

    if isinstance(env, str):
        return env
    instance = not callable(env) or hasattr(env, "possible_agents") or hasattr(env, "reset")
    if instance and not inspect.isclass(env):
        spec_id = getattr(getattr(env, "spec", None), "id", "")
        made = f" (it was made from {spec_id!r}: pass that id)" if spec_id else ""
        raise ConfigError(
            "env",
            env,
            "an env instance cannot be used: every actor process (and the learner and "
            "the evaluator) builds its own copies from a name; pass a gymnasium id, or "
            f"the env's class or a function that builds it, from a module{made}",
        )
    module = getattr(env, "__module__", None)
    qualname = getattr(env, "__qualname__", "")
    why = ""
    if not module or not qualname:
        why = "it has no module and name another process could import it by"
    elif module == "__main__":
        why = (
            "it is defined in the script that was run (__main__), which actor processes "
            "do not import: define it in a module (my_envs.py) and pass it from there"
        )
    elif "<" in qualname or "." in qualname:
        why = "only a class or function at the top level of a module can be imported by name"
    else:
        import importlib

        try:
            found = getattr(importlib.import_module(module), qualname, None)
        except ImportError:
            found = None
        if found is not env:
            why = f"{module}:{qualname} does not import as this object"
    if why:
        raise ConfigError("env", env, f"actor processes build the env by name, and {why}")
    return f"{module}:{qualname}"


def make_configs(
    env: str | Callable[..., Any] | None = None,
    *,
    preset: bool = True,
    config: str | os.PathLike[str] | None = None,
    **settings: Any,
) -> tuple[LearnerConfig, PPOConfig, PolicyConfig]:
    """Validated configs from keyword settings, as ``zmq-rl run`` builds them from flags.

    Precedence: ``settings`` > ``config`` (a TOML file, or ``"preset:NAME"``) > the
    env's shipped preset (when ``preset`` and no ``config``) > the dataclass
    defaults. ``env`` is ``env_id`` (a class or function of a module is named as
    ``"module:Name"``, :func:`env_name`). Each setting is a field name of
    :class:`LearnerConfig`, :class:`PPOConfig` or :class:`PolicyConfig`; an
    unknown name is a :class:`ConfigError` naming it (with a suggestion).
    """
    from .config_toml import LEARNER_SECTIONS, load_toml, preset_for
    from .presets import resolve_config_source

    if env is not None:
        settings["env_id"] = env
    if "env_id" in settings:
        settings["env_id"] = env_name(settings["env_id"])
    owner = _setting_owners(settings)
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


def _setting_owners(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Setting name -> its config section; a :class:`ConfigError` (with a suggestion)
    for a name in ``settings`` that no section has."""
    import difflib

    from .config_toml import LEARNER_SECTIONS

    owner = {f.name: s for s in LEARNER_SECTIONS for f in s.fields()}
    for name in settings:
        if name not in owner:
            close = difflib.get_close_matches(name, list(owner), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(name, settings[name], f"unknown setting{hint}")
    return owner


def _resume_configs(
    resume: str | os.PathLike[str],
    env: str | None,
    run_dir: str | os.PathLike[str] | None,
    config: str | os.PathLike[str] | None,
    settings: Mapping[str, Any],
) -> tuple[LearnerConfig, PPOConfig, PolicyConfig, dict[str, Any]]:
    """The configs to continue the run in ``resume`` with, and the overrides for
    ``Learner.resume``: what ``zmq-rl run --resume`` does with its flags.

    Settings equal to the run's are accepted; one that differs must be one of
    :data:`~zmq_rl.run.local_actors.RESUME_CHANGEABLE` (the budget, host, port, actors,
    evaluation, checkpointing, timeouts, device, learner ranks), anything else is a
    :class:`ConfigError` naming it, as are ``config``, another ``run_dir`` or
    another ``env``, and a run dir without a readable checkpoint (field ``resume``).
    """
    from .learner.checkpoint import load_resume_configs
    from .run.local_actors import RESUME_CHANGEABLE

    if config is not None:
        raise ConfigError(
            "config",
            str(config),
            "cannot be combined with resume (a resumed run keeps its checkpoint's settings)",
        )
    if run_dir is not None and Path(run_dir).resolve() != Path(resume).resolve():
        raise ConfigError("run_dir", str(run_dir), f"resume={str(resume)!r} runs in {resume}")
    _setting_owners(settings)
    early = {"device": settings["device"]} if "device" in settings else {}
    try:
        configs = load_resume_configs(resume, **early)
    except (OSError, ValueError, KeyError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError("resume", str(resume), f"cannot resume: {exc}") from None
    current = {f.name: getattr(c, f.name) for c in configs for f in dataclasses.fields(c)}
    if env is not None and env != current["env_id"]:
        raise ConfigError("env", env, f"the run in {resume} trains {current['env_id']}")
    overrides = dict(early)
    for name, value in settings.items():
        have = current[name]
        same = (
            tuple(value) == have
            if isinstance(have, tuple) and isinstance(value, list)
            else (value == have)
        )
        if same or name == "device":
            continue
        if name not in RESUME_CHANGEABLE:
            raise ConfigError(
                name,
                value,
                f"cannot change on resume (the run has {have!r}); only "
                + ", ".join(RESUME_CHANGEABLE)
                + " may",
            )
        overrides[name] = value
    cfg, ppo, policy = load_resume_configs(resume, **overrides)
    return cfg, ppo, policy, overrides


def _resolve_run_dir(cfg: LearnerConfig, run_dir: str | os.PathLike[str] | None) -> LearnerConfig:
    """``run_dir`` None -> a new ``runs/<env>-<timestamp>``; ``""`` -> no run dir."""
    from .run.session import resolve_run_dir

    return resolve_run_dir(cfg, None if run_dir is None else str(run_dir))


def _preset_name(env_id: str, preset: bool, config: Any) -> str | None:
    from .config_toml import preset_for

    return env_id if preset and config is None and preset_for(env_id) is not None else None


# -- callbacks --------------------------------------------------------------------------


# -- training ---------------------------------------------------------------------------


def _start_or_resume(
    env: str | Callable[..., Any] | None,
    run_dir: str | os.PathLike[str] | None,
    resume: str | os.PathLike[str] | None,
    preset: bool,
    config: str | os.PathLike[str] | None,
    settings: Mapping[str, Any],
) -> tuple[LearnerConfig, PPOConfig, PolicyConfig, tuple[str, dict[str, Any]] | None]:
    """The configs of a new run, or of the run in ``resume`` with the engine's resume
    argument (its run dir and the overrides); shared by :func:`train` and
    :func:`run_learner`."""
    env = None if env is None else env_name(env)
    if resume is not None:
        cfg, ppo, policy, overrides = _resume_configs(resume, env, run_dir, config, settings)
        return cfg, ppo, policy, (cfg.run_dir, overrides)
    cfg, ppo, policy = make_configs(env, preset=preset, config=config, **settings)
    return _resolve_run_dir(cfg, run_dir), ppo, policy, None


def train(
    env: str | Callable[..., Any] | None = None,
    *,
    run_dir: str | os.PathLike[str] | None = None,
    resume: str | os.PathLike[str] | None = None,
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
    ``"module.path:make_fn"`` (default CartPole-v1), or that class or function itself
    (from a module: :func:`env_name`; an env instance is refused, each actor process
    builds its own copies). ``settings``: config fields by
    name (see :func:`make_configs`; ``total_env_steps``, ``num_actors``, ``seed``,
    ``env_kwargs``, ``wrappers``, ``target_return``, ...). ``run_dir``: where the run
    writes its files; None = a new ``runs/<env>-<timestamp>``, ``""`` = none.
    ``callbacks``: :class:`Callback` objects (any hook returning False stops the run).
    ``resume``: a run directory to continue from its newest checkpoint (``zmq-rl run
    --resume RUN_DIR``): policy, optimiser, counters and report carry on, ``env`` and
    ``preset`` are ignored, and ``settings`` may change only the budget
    (``total_env_steps``), ``num_actors``, evaluation, checkpointing, timeouts,
    ``host``/``port``, ``device`` and ``num_learners``; anything else that differs
    from the run's is a :class:`ConfigError` naming it. Dead actors are restarted
    up to ``actor_restarts`` times each. ``tensorboard``
    and ``wandb_project`` as the ``--tensorboard`` / ``--wandb-project`` flags;
    ``verbose=False`` prints nothing (the run still logs through :mod:`logging`).

    Raises :class:`ConfigError` (a bad setting, an env that cannot be built:
    :class:`~zmq_rl.envs.EnvBuildError`) before anything starts, and
    :class:`~zmq_rl.run.common.CliFailure` for run-time failures (port in use,
    starved learner, a lost learner rank, an actor that cannot start). Ctrl-C stops
    the run cleanly (the result's ``interrupted`` is set).
    """
    Hooks(callbacks)  # a wrong callback fails before anything starts
    cfg, ppo, policy, resumed = _start_or_resume(env, run_dir, resume, preset, config, settings)
    return run_engine(
        cfg,
        ppo,
        policy,
        callbacks=callbacks,
        resume=resumed,
        local_actors=True,
        actor_restarts=actor_restarts,
        actor_restart_backoff=actor_restart_backoff,
        actor_log_level=actor_log_level or ("info" if cfg.run_dir else "warning"),
        tensorboard=tensorboard,
        wandb_project=wandb_project,
        console=console_for(verbose),
        preset=None if resumed else _preset_name(cfg.env_id, preset, config),
        command="zmq_rl.train",
    )[0]


def run_learner(
    env: str | Callable[..., Any] | None = None,
    *,
    run_dir: str | os.PathLike[str] | None = None,
    resume: str | os.PathLike[str] | None = None,
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
    train, and return the :class:`TrainResult`. Arguments as :func:`train`
    (``resume=RUN_DIR`` as ``zmq-learner --resume RUN_DIR``)."""
    Hooks(callbacks)  # a wrong callback fails before anything starts
    cfg, ppo, policy, resumed = _start_or_resume(env, run_dir, resume, preset, config, settings)
    return run_engine(
        cfg,
        ppo,
        policy,
        callbacks=callbacks,
        resume=resumed,
        local_actors=False,
        tensorboard=tensorboard,
        wandb_project=wandb_project,
        console=console_for(verbose),
        preset=None if resumed else _preset_name(cfg.env_id, preset, config),
        command="zmq_rl.run_learner",
    )[0]


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
    from .config_toml import flag_name

    defaults = ActorConfig()
    args: list[str] = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if value != getattr(defaults, f.name) or f.name == "learner":
            args += [flag_name(f.name), str(value)]
    command = [sys.executable, "-m", "zmq_rl.cli.actor", *args, "--log-level", log_level]
    commands = [list(command) for _ in range(count)]
    return ActorProcesses(commands, Path(log_dir) if log_dir is not None else None).start()
