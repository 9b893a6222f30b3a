"""Run a learner from the command line: run dir, config.toml, progress, metrics, summary.

Shared by ``zmq-learner`` (actors come from elsewhere) and ``zmq-rl run`` (which
starts local actor processes around the run through ``around_run``).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from rich.console import Console

from zmq_rl.config import ConfigError, LearnerConfig, PolicyConfig, PPOConfig, replace

from ..config_toml import dump_toml
from ..learner.report import LearnerReport
from .common import (
    STOP_SIGNALS,
    CliFailure,
    check_bind_host,
    check_env,
    default_run_dir,
    format_duration,
    note_hangup,
    release_run_dir,
)
from .fleet import ActorFleet, FleetLearner, RunLearner
from .progress import TrainingProgress

if TYPE_CHECKING:
    from zmq_rl.learner.loop import Learner
    from zmq_rl.wire.transport import LearnerSockets

log = logging.getLogger("zmq_rl.cli.training")

__all__ = [
    "RUN_MARKERS",
    "StartingLearner",
    "TrainingOutcome",
    "check_run_dir_is_new",
    "make_console",
    "print_summary",
    "resolve_run_dir",
    "train",
]

CONFIG_NAME = "config.toml"
RUN_MARKERS = ("config.toml", "metrics.jsonl", "report.json", "policy.pt")
"""Files whose presence means a run directory holds a run already."""
RESUME_COMMAND = "zmq-learner --resume"
"""The command that continues a run, named when a run dir is refused."""
TENSORBOARD_OFF = (
    "TensorBoard logging is off: the tensorboard package is not installed "
    "(pip install 'zmq_rl[tensorboard]'; --no-tensorboard hides this line)"
)


def make_console() -> Console:
    """The stdout console of the commands (no wrapping of long lines in logs)."""
    return Console(soft_wrap=True, highlight=False)


def resolve_run_dir(cfg: LearnerConfig, run_dir: str | None) -> LearnerConfig:
    """Fill in ``runs/<env>-<timestamp>`` when no ``--run-dir`` was given (None; the
    directory is created now, see :func:`~zmq_rl.run.common.default_run_dir`); an
    explicit empty string keeps the run without a directory."""
    if run_dir is None:
        run_dir = default_run_dir(cfg.env_id)
    return replace(cfg, run_dir=run_dir)


def check_run_dir_is_new(run_dir: str, resume_command: str = RESUME_COMMAND) -> None:
    """Refuse (:class:`ConfigError`) a run dir that holds a run already, so that two
    runs are never merged into one directory; the message says how to continue it
    and how to start a new one."""
    if not run_dir:
        return
    path = Path(run_dir)
    found = [name for name in RUN_MARKERS if (path / name).exists()]
    if not found and any((path / "checkpoints").glob("ckpt-*.pt")):
        found.append("checkpoints/")
    if found:
        raise ConfigError(
            "run_dir",
            run_dir,
            f"holds a run already ({', '.join(found)}): continue it with "
            f"'{resume_command} {run_dir}', or start a new run with another --run-dir "
            "(or without --run-dir: every run gets its own runs/<env>-<timestamp>)",
        )


def write_config(
    cfg: LearnerConfig,
    ppo: PPOConfig,
    policy: PolicyConfig,
    command: str = "zmq-learner",
    preset: str | None = None,
) -> Path | None:
    """Write the resolved config as ``config.toml`` in the run dir (loadable by ``--config``).

    ``run_dir`` is written as a comment, so that repeating a run with ``--config``
    makes a new run directory instead of appending to this one. A run dir that
    cannot be created or written is a :class:`ConfigError` naming it.
    """
    if not cfg.run_dir:
        return None
    path = Path(cfg.run_dir) / CONFIG_NAME
    name = (preset or "").rpartition(":")[2]
    header = (
        f"zmq_rl run config, written {time.strftime('%Y-%m-%d %H:%M:%S')}.\n"
        + (f"Defaults from preset {preset} (zmq_rl/presets/{name}.toml).\n" if preset else "")
        + f"Repeat the run with: {command} --config {path}"
    )
    text = dump_toml({"learner": cfg, "ppo": ppo, "policy": policy}, header, commented=("run_dir",))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as exc:
        what = "create it" if not path.parent.is_dir() else f"write {CONFIG_NAME} in it"
        raise ConfigError("run_dir", cfg.run_dir, f"cannot {what}: {exc.strerror or exc}") from None
    return path


def preset_line(name: str, cfg: LearnerConfig) -> str:
    """The line that says a run took its defaults from the env's preset: the preset's own
    budget and target, and this run's where a flag overrode them (issue 29: the line
    printed the user's ``--total-env-steps`` as the preset's)."""
    import tomllib

    from zmq_rl.presets import preset_path

    name = name.rpartition(":")[2]  # the env id "zmq_rl.envs:AtariPong-v0" -> its preset
    own = tomllib.loads(preset_path(name).read_text()).get("learner", {})
    steps = own.get("total_env_steps", LearnerConfig.total_env_steps)
    target = float(own.get("target_return", LearnerConfig.target_return))
    changed = []
    if cfg.total_env_steps != steps:
        changed.append(f"{cfg.total_env_steps:,} steps")
    if cfg.target_return != target:
        changed.append(f"target return {cfg.target_return:g}")
    batch = own.get("batch_rows", 0)
    if batch and cfg.batch_rows_for() != batch:
        changed.append(f"batches of {cfg.batch_rows_for():,} rows")
    here = f" (this run: {', '.join(changed)})" if changed else ""
    rows = f"batches of {batch:,} rows, " if batch else ""
    sampled = "" if own.get("eval_deterministic", True) else ", evaluations sample actions"
    return (
        f"using preset {name} (zmq_rl/presets/{name}.toml: tuned settings, "
        f"{rows}{steps:,} steps, target return {target:g}{sampled}); "
        f"flags override it{here}, --no-preset ignores it"
    )


class TrainingOutcome:
    """What :func:`train` produced: the learner's report (None if interrupted) and files."""

    def __init__(self, cfg: LearnerConfig) -> None:
        self.cfg = cfg
        self.report: Any = None
        self.interrupted = False
        self.updates_seen = 0
        self.agents_per_env = 1  # slots per env copy (a multi-agent env's agents)
        self.last_row: Mapping[str, Any] = {}
        self.steps_at_start = 0
        """Env steps the learner had consumed when this session started (a resume's)."""
        self.session_seconds: float | None = None
        """This session's wall time when it differs from the report's (learner restarts)."""


def train(
    cfg: LearnerConfig,
    ppo: PPOConfig,
    policy: PolicyConfig,
    console: Console,
    *,
    tensorboard: bool | None = None,
    around_run: Callable[[FleetLearner], ActorFleet] | None = None,
    live: bool | None = None,
    command: str = "zmq-learner",
    resume: tuple[str, Mapping[str, Any]] | None = None,
    wrap_learner: Callable[[Learner], RunLearner] | None = None,
    preset: str | None = None,
    resume_command: str = RESUME_COMMAND,
    on_update: Callable[[Mapping[str, Any]], None] | None = None,
    wandb_project: str | None = None,
) -> TrainingOutcome:
    """Bind a learner, run it to the end of its budget and return the outcome.

    ``around_run(learner)`` is entered after the sockets are bound and exited after
    the run (also on errors and interrupts): ``zmq-rl run`` starts and stops its
    actor processes there. For a new run of one learner rank it is entered before
    torch is imported and the learner built, with a :class:`StartingLearner` that
    stands in for the learner until then; a resumed run, and one of several learner
    ranks, build the learner first and enter it with the learner. Raises
    :class:`CliFailure` for a port in use or a starved learner. The first Ctrl-C or
    SIGTERM during the run asks the learner to stop
    (:meth:`~zmq_rl.learner.loop.Learner.request_stop`: it shuts the actors down and
    writes its report, checkpoint and policy); a second one aborts at once,
    without a report. Either way the outcome has ``interrupted`` set. SIGHUP stops
    it like SIGTERM, and never aborts (a closing terminal may send several).
    ``resume=(run_dir, overrides)`` continues that run's newest checkpoint.
    ``wrap_learner(learner)``, when given, returns what is run and stopped instead
    of the learner (``zmq-rl run --resume-on-crash`` restarts a crashed one there).

    ``preset``: the env preset the configs came from, announced as the first line.
    ``on_update(row)``: called with every update's metrics row after it is recorded
    (the Python API's callbacks). ``wandb_project``: also log the rows to Weights &
    Biases (:class:`~zmq_rl.learner.metrics.MetricsWriter`; needs a run dir).
    Before the learner binds, a new run's dir is checked: one that holds a run
    already (``resume_command`` is the way the message names to continue it) or
    cannot be created is a :class:`ConfigError`.
    """
    from zmq_rl.learner.metrics import MetricsWriter, WandbUnavailable, tensorboard_available

    if preset:
        console.print(preset_line(preset, cfg), markup=False)
    try:
        if resume is None:
            check_run_dir_is_new(cfg.run_dir, resume_command)
        check_bind_host(cfg.host)
        shape = check_env(cfg.env_id, policy.factory, cfg.env_kwargs_map(), cfg.wrappers)
        if resume is None:
            check_before_start(cfg, policy, shape)
            write_config(cfg, ppo, policy, command, preset)
    except BaseException:
        release_run_dir(cfg.run_dir)
        raise
    if cfg.run_dir and tensorboard is None and not tensorboard_available():
        console.print(TENSORBOARD_OFF, markup=False)
    outcome = TrainingOutcome(cfg)
    outcome.agents_per_env = shape.agents_per_env
    with contextlib.ExitStack() as stack:
        metrics = None
        if cfg.run_dir:
            try:
                writer = MetricsWriter(
                    cfg.run_dir,
                    tensorboard=tensorboard,
                    wandb_project=wandb_project,
                    wandb_config={"learner": cfg, "ppo": ppo, "policy": policy},
                )
            except WandbUnavailable as exc:
                raise ConfigError("wandb_project", wandb_project, str(exc)) from None
            metrics = stack.enter_context(writer)
        elif wandb_project:
            raise ConfigError(
                "wandb_project", wandb_project, "needs a run dir (its files go there)"
            )
        waiting = (
            f"waiting for {cfg.num_actors} actor(s) at {cfg.host}:{cfg.port} "
            f"(experience :{cfg.experience_port()}, weights :{cfg.weights_port()})"
        )
        progress = TrainingProgress(
            cfg.num_updates(outcome.agents_per_env),
            console,
            waiting=waiting,
            live=live,
            total_env_steps=cfg.total_env_steps,
        )
        user_hook = on_update

        def on_update(row: Mapping[str, Any]) -> None:
            outcome.updates_seen += 1
            outcome.last_row = row
            if metrics is not None:
                metrics.write(row)
            progress.update(row)
            if user_hook is not None:
                user_hook(row)

        def on_evaluation(row: Mapping[str, Any]) -> None:
            if metrics is not None:  # an evaluation's row, at the env step it measured
                metrics.write(row)
            progress.evaluation(row)

        starting = None
        if around_run is not None and resume is None and cfg.num_learners == 1:
            # Bind, then start the fleet, then import torch and build the trainer: the
            # actors start while the learner does (docs/design.md §10, "Start-up").
            starting = StartingLearner(cfg, bind_sockets(cfg, shape))
            stack.callback(starting.close)  # (after the fleet stopped, as below)
            stack.enter_context(around_run(starting))
        from zmq_rl.learner.loop import Learner, LearnerRankLost, LearnerStarved

        try:
            if resume is not None:
                learner = Learner.resume(
                    resume[0], on_update=on_update, on_evaluation=on_evaluation, **resume[1]
                )
            else:
                learner = Learner(
                    cfg,
                    ppo,
                    policy,
                    on_update=on_update,
                    on_evaluation=on_evaluation,
                    sockets=None if starting is None else starting.sockets,
                )
        except OSError as exc:
            raise CliFailure(str(exc)) from None
        outcome.steps_at_start = learner.report.env_steps_consumed
        progress.steps_at_start = outcome.steps_at_start
        progress.device = learner.report.device
        if wrap_learner is not None:
            learner = wrap_learner(learner)
        if starting is not None:
            starting.attach(learner)
        else:
            stack.callback(learner.close)
            if around_run is not None:
                stack.enter_context(around_run(learner))
        try:
            with progress, _graceful_stop(learner, outcome, quiet=console.quiet):
                outcome.report = learner.run()
        except (LearnerStarved, LearnerRankLost, OSError) as exc:  # OSError: a run file
            raise CliFailure(str(exc)) from None
        except KeyboardInterrupt:
            outcome.interrupted = True
    return outcome


def check_before_start(cfg: LearnerConfig, policy: PolicyConfig, shape: Any) -> None:
    """What the learner would refuse when it is built, or an actor when it starts to
    collect, refused here as a :class:`ConfigError` (one line, exit 2) before any
    socket binds or actor starts (issue 44 section 5): the env-dependent settings
    (:func:`~zmq_rl.learner.settings.check_env_settings`: an ``eval_opponent`` file
    that is no policy, ...), the policy map, an ``action_mask`` whose size is not the
    number of actions, and a recurrent policy on a turn-based game."""
    from zmq_rl.learner.settings import check_env_settings, policy_plan
    from zmq_rl.rl.masking import ActionMaskError, mask_key

    check_env_settings(cfg, shape, shape.observation_space, shape.action_space)
    policy_plan(cfg, policy, shape)
    if shape.turn_based and policy.policy_type != "mlp":
        raise ConfigError(
            "policy_type",
            policy.policy_type,
            f"{cfg.env_id} is a turn-based game: its actors decide each move apart from "
            "the others (one seat at a time), which needs a feed-forward policy (mlp)",
        )
    if not policy.factory:  # a custom network reads the observation its own way
        try:
            mask_key(shape.observation_space, shape.action_space)
        except ActionMaskError as exc:
            raise ConfigError("env_id", cfg.env_id, f"its {exc}") from None


def bind_sockets(cfg: LearnerConfig, shape: Any) -> LearnerSockets:
    """The learner's sockets for a run of ``shape``'s spaces, bound before torch is
    imported (:func:`~zmq_rl.learner.ingest.bind_ingest_sockets`); a port in use is a
    :class:`CliFailure`, as when the learner binds them itself."""
    from zmq_rl.learner.ingest import bind_ingest_sockets

    try:
        return bind_ingest_sockets(cfg, shape.observation_space, shape.action_space)
    except OSError as exc:
        raise CliFailure(str(exc)) from None


class StartingLearner:
    """The :class:`~zmq_rl.run.fleet.FleetLearner` a fleet is started with while the
    learner is still being built. ``zmq-rl run`` binds the learner's sockets (no
    torch), starts its actors against them, and only then imports torch and builds the
    trainer, so the actors' start-up overlaps the learner's and a port in use still
    fails before any actor starts. Until :meth:`attach` it answers with the config and
    an empty report and keeps a stop request for the learner; from then on it answers
    with the learner's config and report, and passes stops and actor exits on."""

    def __init__(self, cfg: LearnerConfig, sockets: LearnerSockets) -> None:
        self.sockets = sockets
        self.learner: RunLearner | None = None
        self._cfg = cfg
        self._report = LearnerReport()
        self._stop_reason = ""
        self._lock = threading.Lock()  # a fleet's monitor thread may ask to stop

    @property
    def cfg(self) -> LearnerConfig:
        """The learner's config (the run's, until it is built)."""
        return self._cfg if self.learner is None else self.learner.cfg

    @property
    def report(self) -> LearnerReport:
        """The learner's report (an empty one until it is built)."""
        return self._report if self.learner is None else self.learner.report

    def request_stop(self, reason: str) -> None:
        """Ask the learner to stop: at once once built, else as soon as it is."""
        with self._lock:
            if self.learner is None:
                self._stop_reason = self._stop_reason or reason
                return
        self.learner.request_stop(reason)

    def attach(self, learner: RunLearner) -> None:
        """The learner is built on the sockets: forward to it from now on (with the
        stop a fleet asked for meanwhile)."""
        with self._lock:
            self.learner = learner
            reason = self._stop_reason
        if reason:
            learner.request_stop(reason)

    def close(self) -> None:
        """Close the learner, or the sockets when no learner was built on them."""
        if self.learner is not None:
            self.learner.close()
        else:
            self.sockets.close()

    def actor_exited(self, pid: int) -> None:
        """Tell the learner that an actor process exited
        (:meth:`~zmq_rl.learner.loop.Learner.actor_exited`); before it is built no
        actor is registered, so there is nothing to tell."""
        if self.learner is not None:
            self.learner.actor_exited(pid)

    @property
    def learner_restarts(self) -> list[dict[str, Any]] | None:
        """The learner's restarts when it resumes after a crash (``--resume-on-crash``:
        a ``ResumingLearner``), else None."""
        return None if self.learner is None else self.learner.learner_restarts


@contextlib.contextmanager
def _graceful_stop(
    learner: FleetLearner, outcome: TrainingOutcome, quiet: bool = False
) -> Iterator[None]:
    """First Ctrl-C / SIGTERM / SIGHUP: ask the learner to stop after the current
    step (it shuts the actors down and writes its report and policy); a second
    Ctrl-C or SIGTERM raises :class:`KeyboardInterrupt` at once. A SIGHUP never
    does: the terminal is gone, and closing one can send several. The line that says
    so goes to stderr unless ``quiet`` (the Python API's ``verbose=False``)."""

    def on_signal(signum: int, frame: FrameType | None) -> None:
        hangup = signum == getattr(signal, "SIGHUP", None)
        if hangup:
            note_hangup()
        if outcome.interrupted:
            if hangup:
                return
            raise KeyboardInterrupt(signal.Signals(signum).name)
        outcome.interrupted = True
        name = signal.Signals(signum).name
        learner.request_stop(f"interrupted ({name})")
        if quiet:
            return
        with contextlib.suppress(OSError):  # stderr may be a pipe whose reader is gone
            sys.stderr.write(
                f"\n{name}: stopping after the current update "
                "(press Ctrl-C again to abort at once)\n"
            )

    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set in the main thread (the Python API)
        return
    previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def print_summary(
    console: Console, outcome: TrainingOutcome, extra: Mapping[str, str] | None = None
) -> None:
    """Print the end-of-run summary: updates, steps, wall time, last evaluation, files."""
    cfg = outcome.cfg
    report = outcome.report
    lines: list[tuple[str, str]] = []
    if report is None:
        row = outcome.last_row
        lines.append(("stopped", "interrupted"))
        lines.append(("updates", f"{outcome.updates_seen}"))
        if row:
            lines.append(("env steps", f"{int(row.get('env_steps', 0)):,}"))
            lines.append(("wall time", format_duration(float(row.get("wall_seconds", 0.0)))))
    else:
        lines.append(("stopped", report.stop_reason or "done"))
        # The budget is env steps (next line): an update count from it is an estimate,
        # wrong for turn-based games and fleets other than the nominal one.
        lines.append(("updates", f"{report.updates_completed}"))
        lines.append(("env steps", f"{report.env_steps_consumed:,} of {cfg.total_env_steps:,}"))
        # Speed from this session's steps and time (a resumed run's total is not).
        session_steps = report.env_steps_consumed - outcome.steps_at_start
        wall = report.wall_seconds if outcome.session_seconds is None else outcome.session_seconds
        sps = session_steps / max(wall, 1e-9)
        since = f", {session_steps:,} steps since the resume" if outcome.steps_at_start else ""
        lines.append(("wall time", f"{format_duration(wall)} ({sps:,.0f} steps/s{since})"))
        lines.append(
            (
                "episodes",
                f"{report.episodes_completed:,}, mean return of the last 100: "
                + (
                    f"{report.mean_recent_episode_reward(100):.1f}"
                    if report.episodes_completed
                    else "- (no episode ended)"
                ),
            )
        )
        skipped = report.counters.get("evaluation/skipped", 0)
        if skipped:
            lines.append(
                (
                    "evaluations",
                    f"{len(report.evaluations)} run, {skipped} skipped (due while the "
                    "background evaluator was busy: the newest snapshot goes next)",
                )
            )
        if report.evaluations:
            last = report.evaluations[-1]
            lines.append(
                (
                    "last eval",
                    f"{last['mean_return']:.1f} ± {last['std_return']:.1f} over "
                    f"{cfg.eval_episodes} episodes (after {int(last['env_steps']):,} steps)",
                )
            )
        best = report.best_evaluation
        if best and len(report.evaluations) > 1:
            where = f", {best['file']}" if best.get("file") else ""
            lines.append(
                (
                    "best eval",
                    f"{best['mean_return']:.1f} ± {best['std_return']:.1f} (after "
                    f"{int(best['env_steps']):,} steps, version {best['version']}{where})",
                )
            )
        lines.append(("policy version", str(report.last_policy_version)))
        if report.device:
            lines.append(("device", report.device))
    if cfg.run_dir:
        lines.append(("run dir", cfg.run_dir))
    lines.extend((extra or {}).items())
    width = max(len(k) for k, _ in lines)
    console.print("[bold]summary[/bold]")
    for key, value in lines:
        console.print(f"  {key:<{width}}  {value}", markup=False)
