"""``zmq-rl``: one command for the whole workflow (``run``, ``eval``, ``export``, ``plot``,
``keys``).

The subcommands are functions registered with
:func:`~zmq_rl.cli.commands.subcommand` (the registry, :mod:`zmq_rl.cli.commands`):
the general ones here, ``slurm`` and ``ray`` in their own modules, which this entry
point imports (they import the registry, never this module). Adding a subcommand is
adding one such function here or in a module imported below::

    @subcommand("keys", "generate CURVE key pairs for encrypted sockets",
                arg("out_dir", type=Path, help="where to write the keys"))
    def keys_command(args: argparse.Namespace) -> int:
        ...
        return 0
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from . import ray_launch, slurm  # noqa: F401  (they register the slurm and ray subcommands)
from .commands import (
    RUN_DEFAULTS,
    SUBCOMMANDS,
    arg,
    build_parser,
    non_negative,
    subcommand,
    subparser,
)
from .exits import EXIT_INTERRUPTED, guard, setup_logging
from .flags import LOG_LEVELS, Section, add_short_help, flag_name, parse_with_config
from .learner import LEARNER_SECTIONS, add_learner_flags, configs_from_args, preset_note
from .plot import add_plot_flags, plot_from_args

__all__ = ["arg", "build_parser", "main", "subcommand"]


# -- run ------------------------------------------------------------------------------


def positive_float(text: str) -> float:
    """An argparse type: a number > 0."""
    value = non_negative(float)(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
    return value


RUN_COMMON_FLAGS = {
    "--env": "a gymnasium id, module:Id, module.path:EnvClass, or a PettingZoo env "
    "module (pettingzoo.sisl.pursuit_v5)",
    "--actors": "local actor processes",
    "--num-envs": "env copies per actor",
    "--total-env-steps": "the budget (agent steps in a multi-agent env), spent exactly "
    "(--batch-mode slots: to within a rollout)",
    "--target-return": "stop once an evaluation's mean return reaches this",
    "--eval-every": "evaluate every N updates",
    "--seed": "",
    "--run-dir": "where the run's files go ('' = none)",
    "--config": "settings from a TOML file, or a shipped preset:NAME",
    "--no-preset": "ignore the env's shipped preset (CartPole-v1, LunarLander-v3, ...)",
    "--hidden-sizes": "",
    "--policy-type": "mlp, or lstm / gru for partially observed envs",
    "--learning-rate": "",
    "--device": "where the update runs (actors stay on the CPU)",
    "--port": "the learner's first port (it binds three)",
    "--resume": "continue the run in RUN_DIR from its newest checkpoint",
    "--log-level": "",
}
"""What ``zmq-rl run -h`` lists (``--help`` lists every flag)."""


def _run_flags(parser: argparse.ArgumentParser) -> None:
    add_short_help(
        parser,
        RUN_COMMON_FLAGS,
        "common flags",
        "Train with a learner in this process and --actors local actor processes; "
        "writes runs/<env>-<timestamp>/ (metrics, report, policy.pt, learning_curve.png). "
        "An env with a shipped preset takes its tuned settings, budget and target.",
    )
    add_learner_flags(parser, defaults=RUN_DEFAULTS)
    parser.add_argument(
        "--actor-log-level",
        choices=LOG_LEVELS,
        default=None,
        help="log level of the actor processes (default: info into RUN_DIR/logs/actor-N.log; "
        "without a run dir they log to stderr at --log-level)",
    )
    parser.add_argument(
        "--plot",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="draw learning_curve.png into the run dir at the end",
    )
    from ..run.local_actors import MAX_BACKOFF_S, RESUME_CHANGEABLE

    supervision = parser.add_argument_group(
        "supervision", "restarting dead actors and a crashed learner; resuming a run"
    )
    supervision.add_argument(
        "--actor-restarts",
        metavar="N",
        type=non_negative(int),
        default=3,
        help="restart an actor process that dies during training up to N times (per actor); "
        "it rejoins as a late joiner. An actor that exits with code 2 (a configuration "
        "error) or fails before it started collecting is not restarted: the run then "
        "fails at once with its error",
    )
    supervision.add_argument(
        "--actor-restart-backoff",
        metavar="SECONDS",
        type=non_negative(float),
        default=1.0,
        help="wait before restarting a dead actor, doubled with each consecutive failure "
        f"of that actor (at most {MAX_BACKOFF_S:g} s)",
    )
    supervision.add_argument(
        "--actor-learner-timeout",
        metavar="SECONDS",
        type=positive_float,
        default=None,
        help="each actor gives up (exit 1) when the learner was silent this long: "
        "zmq-actor's --learner-timeout (default: the actor's, 60 s)",
    )
    supervision.add_argument(
        "--resume",
        metavar="RUN_DIR",
        default=None,
        help="continue the run in RUN_DIR from its newest checkpoint with new local actors "
        "(configs, policy, optimiser, counters; version numbering continues). Only "
        + ", ".join(flag_name(n) for n in RESUME_CHANGEABLE)
        + " may differ from the run's (besides the flags of this group, --log-level, "
        "--actor-log-level, --plot and --tensorboard); other changed settings are refused",
    )
    supervision.add_argument(
        "--resume-on-crash",
        metavar="N",
        nargs="?",
        type=non_negative(int),
        const=3,
        default=0,
        help="when the learner crashes with an error, resume it from its newest checkpoint "
        "while the actors keep running, up to N times (N defaults to 3 when the flag is "
        "given without it; 0 = off)",
    )


@subcommand(
    "run",
    "train with a learner here and --actors local actor processes",
    _run_flags,
    description="Train in one command: the learner runs in this process and --actors "
    "actor processes (python -m zmq_rl.cli.actor) connect to it over loopback. "
    "Ctrl-C (or SIGTERM, SIGHUP) stops everything. An actor process that dies is "
    "restarted (--actor-restarts); --resume RUN_DIR continues an interrupted run. The run "
    "dir gets config.toml, metrics.jsonl, metrics.csv, report.json, policy.pt, "
    "learning_curve.png and logs/actor-N.log. " + preset_note() + " CartPole-v1's "
    "preset, the default env, stops at mean return 475.",
    sections=LEARNER_SECTIONS,
)
def run_command(args: argparse.Namespace) -> int:
    """``zmq-rl run``: parse, then the run's engine (:func:`zmq_rl.run.engine.train`,
    as :func:`zmq_rl.train`) plus the summary."""
    from ..run.common import require_learner_install

    require_learner_install()  # before the engine imports torch: one line, exit 2
    from ..run.engine import train as run_engine
    from ..run.local_actors import resume_configs
    from ..run.session import make_console, print_summary

    resume = None
    if args.resume is not None:
        run_parser = subparser(build_parser("run"), "run")
        defaults = {a.dest: a.default for a in run_parser._actions}
        cfg, ppo, policy, overrides = resume_configs(args.resume, args, defaults, LEARNER_SECTIONS)
        resume = (cfg.run_dir, overrides)
    else:
        cfg, ppo, policy = configs_from_args(args)
    setup_logging(args.log_level)
    console = make_console()
    result, outcome, extra = run_engine(
        cfg,
        ppo,
        policy,
        local_actors=True,
        actor_restarts=args.actor_restarts,
        actor_restart_backoff=args.actor_restart_backoff,
        actor_log_level=args.actor_log_level or ("info" if cfg.run_dir else args.log_level),
        tensorboard=args.tensorboard,
        wandb_project=args.wandb_project,
        console=console,
        preset=getattr(args, "applied_preset", None),
        command="zmq-rl run",
        resume=resume,
        resume_on_crash=args.resume_on_crash,
        resume_command="zmq-rl run --resume",
        plot=_plot_curve if args.plot else None,
        actor_args=(
            ["--learner-timeout", repr(args.actor_learner_timeout)]
            if args.actor_learner_timeout is not None
            else []
        ),
    )
    print_summary(console, outcome, extra)
    return EXIT_INTERRUPTED if result.interrupted else 0


def _plot_curve(run_dir: Path) -> Path:
    """``--plot``: draw ``RUN_DIR/learning_curve.png``; its path."""
    from .plot import CURVE_NAME, plot_runs

    return plot_runs([str(run_dir)], run_dir / CURVE_NAME)


# -- eval -----------------------------------------------------------------------------


@subcommand(
    "eval",
    "measure a saved policy: mean ± std return over fresh episodes (a turn-based game: "
    "wins, draws and losses per seat against --opponent)",
    arg(
        "target",
        metavar="RUN_DIR_OR_POLICY",
        help="a run directory, its policy.pt, or one of its checkpoints/ckpt-N.pt",
    ),
    arg("--episodes", type=int, default=20, help="episodes to play"),
    arg(
        "--deterministic",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="act by the policy's mode; --no-deterministic samples actions (seeded by "
        "--seed) (default: as the run evaluated, its config.toml's eval_deterministic: "
        "pursuit's preset samples; the mode where there is no config.toml)",
    ),
    arg(
        "--seed",
        type=int,
        default=10_000,
        help="seed of the episodes (a run with --seed S evaluates with S + 10000)",
    ),
    arg("--env", default="", help="env id to play (default: the one the policy was trained on)"),
    arg(
        "--opponent",
        metavar="random|policy:PATH|MODULE:NAME",
        default="random",
        help="turn-based games: who plays the other seats (as zmq-rl run's --eval-opponent): "
        "random legal moves, a saved policy (policy:PATH), or a scripted player such as "
        "zmq_rl.envs.baselines:one_ply_move",
    ),
    arg(
        "--video",
        metavar="DIR",
        type=Path,
        default=None,
        help="record every episode to DIR as MP4 (needs moviepy, and pygame for "
        "classic-control envs: pip install 'zmq_rl[video]')",
    ),
    arg(
        "--log-level",
        choices=LOG_LEVELS,
        default="warning",
        help="log messages of this level and above (to stderr)",
    ),
)
def eval_command(args: argparse.Namespace) -> int:
    """Play a saved policy and print the mean ± std return (as the run evaluated: by its
    mode unless the run sampled, --deterministic / --no-deterministic say otherwise); a
    turn-based game says against whom, and each seat's wins, draws and losses."""
    from zmq_rl.config import ConfigError

    from .evaluate import (
        Evaluation,
        describe,
        evaluate,
        load_policy,
        record_episodes,
        run_deterministic,
    )

    setup_logging(args.log_level)
    if args.episodes < 1:
        raise ConfigError("episodes", args.episodes, "must be an integer >= 1")
    loaded = load_policy(args.target, env_id=args.env)
    deterministic = args.deterministic
    if deterministic is None:
        deterministic = run_deterministic(args.target)
    if args.video is not None:
        result = Evaluation(*record_episodes(loaded, args.episodes, args.seed, args.video))
    else:
        result = evaluate(loaded, args.episodes, args.seed, args.opponent, deterministic)
    for line in describe(loaded, result, args.episodes, args.seed):
        print(line)
    if args.video is not None:
        print(f"videos: {args.video}")
    return 0


# -- export ---------------------------------------------------------------------------


@subcommand(
    "export",
    "write a trained policy as ONNX, TorchScript or safetensors, to run without zmq_rl",
    arg(
        "target",
        metavar="RUN_DIR_OR_POLICY",
        help="a run directory, its policy.pt, or one of its checkpoints/ckpt-N.pt",
    ),
    arg(
        "--format",
        dest="fmt",
        choices=("onnx", "torchscript", "safetensors"),
        required=True,
        help="onnx: for onnxruntime (C, C++, C#, Java, JS, Python); torchscript: for "
        "torch.jit.load / libtorch; safetensors: the weights, architecture in the metadata. "
        "A recurrent (lstm / gru) policy's graph also takes state and episode_start and "
        "returns next_state (docs/api.md)",
    ),
    arg("--out", metavar="FILE", type=Path, required=True, help="the file to write"),
    arg("--env", default="", help="env id for the spaces (default: the policy's own)"),
    arg(
        "--log-level",
        choices=LOG_LEVELS,
        default="warning",
        help="log messages of this level and above (to stderr)",
    ),
)
def export_command(args: argparse.Namespace) -> int:
    """Export the deterministic action graph (observation normalisation folded in):
    float32 observations [batch, *obs_shape] in, actions out (int64 [batch] for
    Discrete, float32 [batch, act_dim] clipped to the bounds for Box); a recurrent
    policy also takes state [batch, state_size] and episode_start [batch] and returns
    next_state. See docs/embedding.md for running the ONNX file from C."""
    from ..run.common import CliFailure, require_learner_install

    require_learner_install("zmq-rl export", ("torch",))
    from zmq_rl.serving.deploy import ExportUnavailable, PolicyFileError, export_policy

    setup_logging(args.log_level)
    try:
        path = export_policy(args.target, args.fmt, args.out, env_id=args.env)
    except (PolicyFileError, ExportUnavailable) as exc:
        raise CliFailure(str(exc)) from None
    except OSError as exc:  # --out in a folder that cannot be created or written
        where = exc.filename or args.out
        raise CliFailure(f"--out {args.out}: cannot write {where}: {exc.strerror or exc}") from None
    print(f"wrote {path} ({args.fmt}, {path.stat().st_size:,} bytes)")
    return 0


# -- plot -----------------------------------------------------------------------------


@subcommand(
    "plot",
    "draw learning curves (return vs env steps) of one or more runs; runs sharing a "
    "label are drawn as their mean with a band",
    add_plot_flags,
)
def plot_command(args: argparse.Namespace) -> int:
    """Draw training return (mean of the last 100 episodes) and evaluation returns
    (mean ± std) against env steps, from each run's metrics.jsonl and report.json;
    --label or --group overlays seeds as their mean with a band, --reference adds a
    published score."""
    from ..run.common import require_learner_install

    require_learner_install("zmq-rl plot", ("matplotlib",))
    return plot_from_args(args)


# -- ladder ---------------------------------------------------------------------------


@subcommand(
    "ladder",
    "a round-robin Elo ladder of a turn-based run's snapshots (its checkpoints and policy.pt)",
    arg("run_dir", metavar="RUN_DIR", type=Path, help="the run directory"),
    arg("--games", type=int, default=20, help="games per pair of snapshots (seats alternate)"),
    arg("--points", type=int, default=6, help="checkpoints to take, evenly spaced"),
    arg("--seed", type=int, default=0, help="seed of the games (moves are sampled)"),
    arg(
        "--checkpoints",
        metavar="DIR",
        type=Path,
        default=None,
        help="take the checkpoints from DIR (copies kept along the run) instead of "
        "RUN_DIR/checkpoints, which holds the newest three and, with the run's "
        "--keep-checkpoint-every N, every N-th",
    ),
)
def ladder_command(args: argparse.Namespace) -> int:
    """Play every pair of snapshots, fit Elo ratings, print them and write ladder.csv."""
    from zmq_rl.config import ConfigError

    from ..run.common import require_learner_install

    require_learner_install("zmq-rl ladder", ("torch",))

    from .ladder import ladder, write_ladder_csv

    for name in ("games", "points"):
        if getattr(args, name) < 1 + (name == "points"):
            raise ConfigError(name, getattr(args, name), f"must be >= {1 + (name == 'points')}")
    rows = ladder(args.run_dir, args.games, args.points, args.seed, args.checkpoints)
    write_ladder_csv(args.run_dir / "ladder.csv", rows)
    width = max(len(row["player"]) for row in rows)
    print(f"{'player':<{width}} {'version':>7} {'elo':>8} {'score':>6} {'games':>6}")
    for row in rows:
        print(
            f"{row['player']:<{width}} {row['version']:>7} {row['elo']:>8.1f} "
            f"{row['score']:>6.3f} {row['games']:>6}"
        )
    print(f"written: {args.run_dir / 'ladder.csv'}")
    return 0


# -- keys -----------------------------------------------------------------------------


@subcommand(
    "keys",
    "generate a CURVE key pair (NAME.key public, NAME.key_secret secret) for encrypted, "
    "authenticated sockets; see docs/security.md",
    arg("out_dir", metavar="DIR", type=Path, help="folder to write the two files into"),
    arg("--name", default="learner", help="file name stem, e.g. learner or actor-01"),
    arg("--force", action="store_true", help="overwrite existing files of that name"),
)
def keys_command(args: argparse.Namespace) -> int:
    """Write ``DIR/NAME.key`` and ``DIR/NAME.key_secret`` with pyzmq's
    ``zmq.auth.create_certificates``; refuse to overwrite unless ``--force``."""
    import zmq.auth

    from ..run.common import CliFailure

    public = args.out_dir / f"{args.name}.key"
    secret = args.out_dir / f"{args.name}.key_secret"
    if not args.force and (public.exists() or secret.exists()):
        raise CliFailure(f"{public} or {secret} exists; pass --force to overwrite")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    zmq.auth.create_certificates(str(args.out_dir), args.name)
    secret.chmod(0o600)
    print(
        f"public key: {public}  (give it to the other side: the learner's to actors, "
        "an actor's into the learner's --curve-authorized-keys folder)"
    )
    print(f"secret key: {secret}  (keep it on this machine)")
    return 0


# -- serve ----------------------------------------------------------------------------


def _serve_sections() -> tuple[Section, ...]:
    from zmq_rl.config import ServeConfig

    return (Section("serve", ServeConfig, "inference server"),)


def _serve_flags(parser: argparse.ArgumentParser) -> None:
    from .flags import add_config_flags, add_logging_flag

    add_config_flags(parser, _serve_sections())
    add_logging_flag(parser, default="info")


@subcommand(
    "serve",
    "remote inference for simulators that cannot run the policy: they send observations "
    "to a ROUTER socket and get actions; the server registers with the learner for each "
    "simulator and pushes its experience; see docs/inference.md",
    _serve_flags,
    sections=_serve_sections(),
)
def serve_command(args: argparse.Namespace) -> int:
    """Serve actions from the learner's newest weights to attached simulators, batched
    across them, and push their experience to the learner; exit once the learner shut
    the run down and every simulator is gone (see --keep-serving)."""
    from zmq_rl.serving.serve import serve

    from .flags import build_configs

    setup_logging(args.log_level)
    return serve(build_configs(args, _serve_sections())["serve"])


# -- conformance ----------------------------------------------------------------------


def _conformance_flags(parser: argparse.ArgumentParser) -> None:
    from zmq_rl.cli.conformance import add_conformance_flags

    add_conformance_flags(parser)


@subcommand(
    "conformance",
    "check an actor command or a running learner against docs/protocol.md, clause by "
    "clause (conformance actor -- CMD ..., conformance learner HOST:PORT)",
    _conformance_flags,
)
def conformance_command(args: argparse.Namespace) -> int:
    """Print one line per clause of docs/protocol.md (PASS/FAIL/SKIP, MUST/SHOULD, the
    section, what was seen); exit 0 only if every MUST clause passed."""
    from zmq_rl.cli.conformance import conformance_from_args

    return conformance_from_args(args)


# -- entry point ----------------------------------------------------------------------


def _command_named(argv: Sequence[str]) -> str | None:
    """The registered subcommand ``argv`` names (its first word), else ``None``: the
    only one whose flags ``main`` builds, so that ``zmq-rl --help`` and a mistyped
    command answer without importing torch."""
    first = next((word for word in argv if not word.startswith("-")), None)
    return first if first in SUBCOMMANDS else None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``zmq-rl``; returns the exit code."""
    parser = build_parser(_command_named(sys.argv[1:] if argv is None else argv))

    def body() -> int:
        args = parser.parse_args(argv)
        sub = SUBCOMMANDS[args._subcommand]
        if sub.sections:  # --config FILE, or the env's preset
            args = parse_with_config(parser, argv, sub.sections, subparser(parser, sub.name))
        return sub.run(args)

    return guard(body)


if __name__ == "__main__":
    sys.exit(main())
