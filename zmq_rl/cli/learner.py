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

from .common import EXIT_INTERRUPTED, guard, setup_logging
from .flags import (
    HelpFormatter,
    Section,
    add_config_flags,
    add_logging_flag,
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

LEARNER_SECTIONS = (
    Section("learner", LearnerConfig, "learner (run, rollout, sockets)"),
    Section("ppo", PPOConfig, "PPO update"),
    Section("policy", PolicyConfig, "policy network"),
)
ALIASES = {"env_id": ["--env"], "num_actors": ["--actors"]}
RUN_DIR_DEFAULT = "runs/<env>-<timestamp>; '' = no run directory"


def add_learner_flags(
    parser: argparse.ArgumentParser, defaults: Mapping[str, Any] | None = None
) -> None:
    """Add every learner/PPO/policy field, ``--config``, ``--log-level`` and ``--tensorboard``."""
    add_config_flags(
        parser,
        LEARNER_SECTIONS,
        aliases=ALIASES,
        defaults=defaults,
        default_help={"run_dir": RUN_DIR_DEFAULT},
    )
    add_logging_flag(parser)
    parser.add_argument(
        "--tensorboard",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="write TensorBoard events into the run dir (default: when the tensorboard "
        "package is installed)",
    )


def build_parser(prog: str = "zmq-learner") -> argparse.ArgumentParser:
    """The ``zmq-learner`` argument parser."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run the learner: bind control (ROUTER, --port), experience (PULL, "
        "port + 1) and weights (PUB, port + 2), wait for --num-actors actors, train with "
        "PPO until --total-env-steps are consumed, then shut the actors down. Writes "
        "config.toml, metrics.jsonl, metrics.csv, report.json and policy.pt into the "
        "run dir.",
        epilog="Example: zmq-learner --host 0.0.0.0 --env CartPole-v1 --actors 2, then on "
        "each actor machine: zmq-actor --learner LEARNER_HOST:5555",
        formatter_class=HelpFormatter,
    )
    add_learner_flags(parser)
    return parser


def resolve(
    argv: Sequence[str] | None,
    parser: argparse.ArgumentParser | None = None,
    flags_parser: argparse.ArgumentParser | None = None,
) -> tuple[argparse.Namespace, LearnerConfig, PPOConfig, PolicyConfig]:
    """Parse ``argv`` (with ``--config``) into validated configs; run_dir resolved.

    Raises :class:`~zmq_rl.config.ConfigError` or
    :class:`~zmq_rl.cli.flags.ConfigFileError`; argparse exits 2 on bad syntax.
    """
    parser = parser or build_parser()
    args = parse_with_config(parser, argv, LEARNER_SECTIONS, flags_parser)
    return (args, *configs_from_args(args))


def configs_from_args(args: argparse.Namespace) -> tuple[LearnerConfig, PPOConfig, PolicyConfig]:
    """Validated configs from parsed learner flags, with the default run dir filled in."""
    from .training import resolve_run_dir

    configs = build_configs(args, LEARNER_SECTIONS)
    cfg = resolve_run_dir(configs["learner"], getattr(args, "learner.run_dir"))
    return cfg, configs["ppo"], configs["policy"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``zmq-learner``; returns the exit code."""
    parser = build_parser()

    def body() -> int:
        from .training import make_console, print_summary, train

        args, cfg, ppo, policy = resolve(argv, parser)
        setup_logging(args.log_level)
        console = make_console()
        outcome = train(cfg, ppo, policy, console, tensorboard=args.tensorboard)
        print_summary(console, outcome)
        return EXIT_INTERRUPTED if outcome.interrupted else 0

    return guard(body)


if __name__ == "__main__":
    sys.exit(main())
