"""``zmq-learner``: bind the learner's sockets and train until the budget is spent.

Every field of :class:`~zmq_rl.config.LearnerConfig`, :class:`~zmq_rl.config.PPOConfig`
and :class:`~zmq_rl.config.PolicyConfig` is a flag (``zmq-learner --help``).
Actors are started elsewhere: ``zmq-actor --learner HOST:PORT``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from zmq_rl.config import LearnerConfig, PolicyConfig, PPOConfig

from ..config_toml import LEARNER_SECTIONS
from ..run.common import CliFailure
from .exits import EXIT_CONFIG, EXIT_INTERRUPTED, guard, setup_logging
from .flags import (
    CliParser,
    HelpFormatter,
    add_config_flags,
    add_logging_flag,
    add_version_flag,
    build_configs,
    parse_with_config,
)

__all__ = [
    "LEARNER_SECTIONS",
    "add_learner_flags",
    "build_parser",
    "configs_from_args",
    "main",
    "resolve",
]

ALIASES = {"env_id": ["--env"], "num_actors": ["--actors"], "wrappers": ["--wrapper"]}
RUN_DIR_DEFAULT = "runs/<env>-<timestamp>, new for every run; '' = no run directory"
PRESET_NOTE = (
    "Per-env defaults: when the env has a shipped preset (zmq_rl/presets: {names}) and "
    "no --config is given, the preset's values replace the defaults shown here (its "
    "tuned hyper-parameters, budget and target return; the first output line says so); "
    "flags still override it, --no-preset turns it off. Other envs get these defaults "
    "and train the whole budget (no target return)."
)


def add_learner_flags(
    parser: argparse.ArgumentParser, defaults: Mapping[str, Any] | None = None
) -> None:
    """Add every learner/PPO/policy field, ``--config``, ``--no-preset``, ``--log-level``
    and ``--tensorboard``."""
    add_config_flags(
        parser,
        LEARNER_SECTIONS,
        aliases=ALIASES,
        defaults=defaults,
        default_help={"run_dir": RUN_DIR_DEFAULT},
    )
    parser.add_argument(
        "--no-preset",
        dest="use_preset",
        action="store_false",
        help="do not take the defaults from the env's shipped preset (see above)",
    )
    add_logging_flag(parser)
    parser.add_argument(
        "--tensorboard",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="write TensorBoard events into the run dir (default: when the tensorboard "
        "package is installed)",
    )
    parser.add_argument(
        "--wandb-project",
        metavar="NAME",
        default=None,
        help="also log metrics to this Weights & Biases project (pip install "
        "'zmq_rl[wandb]'; files in RUN_DIR/wandb; WANDB_MODE=offline works without a "
        "network, 'wandb sync' uploads later)",
    )


def preset_note() -> str:
    """The ``--help`` paragraph on per-env presets."""
    from zmq_rl.presets import available

    return PRESET_NOTE.format(names=", ".join(available()))


def build_parser(prog: str = "zmq-learner") -> argparse.ArgumentParser:
    """The ``zmq-learner`` argument parser."""
    parser = CliParser(
        prog=prog,
        description="Run the learner: bind control (ROUTER, --port), experience (PULL, "
        "port + 1) and weights (PUB, port + 2), wait for --num-actors actors, train with "
        "PPO until --total-env-steps are consumed, then shut the actors down. Writes "
        "config.toml, metrics.jsonl, metrics.csv, report.json and policy.pt into the "
        "run dir, which must not hold a run already (continue one with --resume). " + preset_note(),
        epilog="Example: zmq-learner --host 0.0.0.0 --env CartPole-v1 --actors 2, then on "
        "each actor machine: zmq-actor --learner LEARNER_HOST:5555",
        formatter_class=HelpFormatter,
    )
    add_learner_flags(parser)
    add_version_flag(parser)
    return parser


def resolve(
    argv: Sequence[str] | None,
    parser: argparse.ArgumentParser | None = None,
    flags_parser: argparse.ArgumentParser | None = None,
) -> tuple[argparse.Namespace, LearnerConfig, PPOConfig, PolicyConfig]:
    """Parse ``argv`` (with ``--config``, or the env's preset) into validated configs;
    run_dir resolved. ``args.applied_preset`` names the preset applied automatically.

    Raises :class:`~zmq_rl.config.ConfigError` or
    :class:`~zmq_rl.cli.flags.ConfigFileError`; argparse exits 2 on bad syntax.
    """
    parser = parser or build_parser()
    args = parse_with_config(parser, argv, LEARNER_SECTIONS, flags_parser)
    return (args, *configs_from_args(args))


def configs_from_args(args: argparse.Namespace) -> tuple[LearnerConfig, PPOConfig, PolicyConfig]:
    """Validated configs from parsed learner flags, with the default run dir filled in."""
    from ..run.session import resolve_run_dir

    configs = build_configs(args, LEARNER_SECTIONS)
    cfg = resolve_run_dir(configs["learner"], getattr(args, "learner.run_dir"))
    return cfg, configs["ppo"], configs["policy"]


RESUME_OVERRIDES = (
    "host",
    "port",
    "total_env_steps",
    "starvation_timeout",
    "actor_timeout",
    "device",
    "num_learners",
)
"""Settings ``--resume`` takes from the command line; the rest come from the checkpoint."""


def build_resume_parser(prog: str = "zmq-learner") -> argparse.ArgumentParser:
    """The parser of ``zmq-learner --resume RUN_DIR [overrides]``."""
    parser = CliParser(prog=f"{prog} --resume", formatter_class=HelpFormatter)
    parser.add_argument("--resume", metavar="RUN_DIR", required=True)
    for name in RESUME_OVERRIDES:
        kind = LearnerConfig.__dataclass_fields__[name].type
        parser.add_argument(
            "--" + name.replace("_", "-"),
            type={"int": int, "float": float}.get(str(kind), str),
            default=None,
        )
    add_logging_flag(parser)
    parser.add_argument("--tensorboard", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--wandb-project", metavar="NAME", default=None)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``zmq-learner``; returns the exit code."""
    parser = build_parser()
    parser.add_argument(
        "--resume",
        metavar="RUN_DIR",
        default=None,
        help="continue the run in RUN_DIR from its newest checkpoint (configs, policy, "
        "optimiser, counters; version numbering continues). Only "
        + ", ".join("--" + n.replace("_", "-") for n in RESUME_OVERRIDES)
        + ", --log-level and --tensorboard may be given with it",
    )
    argv = list(sys.argv[1:] if argv is None else argv)

    def body() -> int:
        from ..run.common import require_learner_install

        if not any(a in ("-h", "--help") for a in argv):
            require_learner_install()  # one line, exit 2, on an actor host's install
        from ..run.engine import train as run_engine
        from ..run.session import RESUME_COMMAND, make_console, print_summary

        if any(a == "--resume" or a.startswith("--resume=") for a in argv):
            args = build_resume_parser().parse_args(argv)
            from zmq_rl.learner.checkpoint import load_resume_configs

            overrides = {n: getattr(args, n) for n in RESUME_OVERRIDES}
            overrides = {k: v for k, v in overrides.items() if v is not None}
            try:
                cfg, ppo, policy = load_resume_configs(args.resume, **overrides)
            except (OSError, ValueError) as exc:
                raise CliFailure(f"cannot resume {args.resume}: {exc}") from None
            resume = (args.resume, overrides)
        else:
            args, cfg, ppo, policy = resolve(argv, parser)
            resume = None
        setup_logging(args.log_level)
        from zmq_rl.rl.distributed import rank_spec

        try:
            spec = rank_spec(cfg.num_learners, cfg.host, cfg.rendezvous_port())
        except ValueError as exc:
            raise CliFailure(str(exc), EXIT_CONFIG) from None
        if spec is not None and not spec.leader:  # torchrun started this rank
            from zmq_rl.learner.ranks import run_learner_rank

            return run_learner_rank(spec, cfg, ppo, policy)
        console = make_console()
        result, outcome, _ = run_engine(  # as zmq_rl.run_learner
            cfg,
            ppo,
            policy,
            local_actors=False,
            console=console,
            tensorboard=args.tensorboard,
            wandb_project=getattr(args, "wandb_project", None),
            resume=resume,
            preset=getattr(args, "applied_preset", None),
            command="zmq-learner",
            resume_command=RESUME_COMMAND,
        )
        print_summary(console, outcome)
        return EXIT_INTERRUPTED if result.interrupted else 0

    return guard(body)


if __name__ == "__main__":
    sys.exit(main())
