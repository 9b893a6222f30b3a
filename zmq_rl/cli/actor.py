"""``zmq-actor``: step gymnasium envs with a local policy copy for a learner.

Registers with the learner at ``--learner HOST[:PORT]``, then collects until the
learner says shutdown (exit 0) or Ctrl-C / SIGTERM / SIGHUP (exit 130). A learner
that refuses the registration or does not answer within ``--register-timeout``
makes it print the reason and exit 1; a host name that does not resolve, or an env
whose spaces zmq_rl cannot train on, is a config error (exit 2). Every
:class:`~zmq_rl.config.ActorConfig` field is a flag (``zmq-actor --help``).

gymnasium and ``zmq_rl.actor.gym_actor`` are imported only after the arguments are
parsed, so ``--help`` and usage errors answer at once; torch is not imported at all
(every shipped network acts in numpy, :mod:`zmq_rl.rl.numpy_nets`), and a run whose
network is a custom factory that only torch builds stops, on a host without torch, at
its welcome with one line naming the install (exit 2).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from zmq_rl.config import ActorConfig, ConfigError

from ..run.common import CliFailure, check_env, check_learner_host
from .exits import EXIT_CONFIG, EXIT_INTERRUPTED, guard, setup_logging
from .flags import (
    CliParser,
    HelpFormatter,
    Section,
    add_config_flags,
    add_logging_flag,
    add_version_flag,
    build_configs,
    parse_with_config,
)

__all__ = ["ACTOR_SECTIONS", "build_parser", "main", "resolve"]

ACTOR_SECTIONS = (Section("actor", ActorConfig, "actor"),)
ALIASES = {"env_id": ["--env"]}
PARENT_POLL_S = 0.5
PARENT_GONE_GRACE_S = 10.0


def build_parser(prog: str = "zmq-actor") -> argparse.ArgumentParser:
    """The ``zmq-actor`` argument parser."""
    parser = CliParser(
        prog=prog,
        description="Run one actor: register with the learner (DEALER to its control "
        "port), then step --num-envs envs with the newest weights (SUB, port + 2) and push "
        "experience (PUSH, port + 1) until the learner shuts the run down.",
        epilog="Example: zmq-actor --learner 10.0.0.5:5555 --num-envs 8",
        formatter_class=HelpFormatter,
    )
    add_config_flags(parser, ACTOR_SECTIONS, aliases=ALIASES)
    add_logging_flag(parser, default="info")
    add_version_flag(parser)
    # For `zmq-rl run`: exit when the process that started this actor is gone.
    parser.add_argument("--parent-pid", type=int, default=0, help=argparse.SUPPRESS)
    # For `zmq-rl run` without a run dir: a file to create once the actor collects.
    parser.add_argument("--ready-file", default="", help=argparse.SUPPRESS)
    return parser


def resolve(
    argv: Sequence[str] | None, parser: argparse.ArgumentParser | None = None
) -> tuple[argparse.Namespace, ActorConfig]:
    """Parse ``argv`` (with ``--config``) into a validated :class:`ActorConfig`."""
    parser = parser or build_parser()
    args = parse_with_config(parser, argv, ACTOR_SECTIONS)
    from zmq_rl.wire.transport import parse_learner_address  # after parsing: --help stays fast

    cfg = build_configs(args, ACTOR_SECTIONS)["actor"]
    try:
        parse_learner_address(cfg.learner)
    except ValueError as exc:
        raise ConfigError("learner", cfg.learner, str(exc)) from None
    return args, cfg


def _exit_with_parent(parent_pid: int) -> None:
    """Interrupt this process (a clean exit) once ``parent_pid`` is no longer its parent,
    saying so in one log line: the ``zmq-rl run`` that started it, and its learner, are
    gone (killed with ``kill -9``, say), and nothing else would tell the actor why it
    stops (issue 29: actors lingered 10 s without a word)."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        logging.getLogger("zmq_rl.actor").warning(
            "the zmq-rl run that started this actor (pid %d, its learner) is gone: exiting",
            parent_pid,
        )
        # SIGTERM raises KeyboardInterrupt in the main thread (sigterm_as_interrupt) even
        # inside a blocking call, where interrupt_main waits for the call to return.
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(PARENT_GONE_GRACE_S)
        os._exit(EXIT_INTERRUPTED)  # the clean exit did not happen in time

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``zmq-actor``; returns the exit code."""
    parser = build_parser()

    def body() -> int:
        args, cfg = resolve(argv, parser)  # before the heavy imports: --help is instant
        import gymnasium as gym

        from zmq_rl.actor.client import (
            InvalidWelcome,
            LearnerLost,
            LearnerRefused,
            LearnerUnreachable,
        )
        from zmq_rl.actor.gym_actor import BadEnvValue, EnvCrashed, GymActor, SpaceMismatch

        setup_logging(args.log_level)
        if args.parent_pid:
            _exit_with_parent(args.parent_pid)
        check_learner_host(cfg.learner)
        if cfg.env_id:
            check_env(cfg.env_id)
        ready = Path(args.ready_file) if args.ready_file else None
        try:
            stats = GymActor(cfg, on_collecting=ready.touch if ready else None).run()
        except (LearnerRefused, InvalidWelcome) as exc:
            raise CliFailure(str(exc)) from None
        except LearnerUnreachable as exc:
            raise CliFailure(
                f"{exc}: is the learner running, is --learner right, and does the learner "
                "bind an address this host can reach (zmq-learner --host 0.0.0.0)?"
            ) from None
        except LearnerLost as exc:
            raise CliFailure(f"{exc}; giving up (see --learner-timeout)") from None
        except SpaceMismatch as exc:
            raise CliFailure(str(exc)) from None
        except EnvCrashed as exc:  # the env's own error, in one line (its traceback: debug)
            raise CliFailure(str(exc)) from None
        except BadEnvValue as exc:  # a restart would run into it again: not restarted
            raise CliFailure(str(exc), EXIT_CONFIG) from None
        except gym.error.Error as exc:  # the learner's env id does not exist here
            raise CliFailure(f"cannot make the learner's env on this host: {exc}") from None
        summary = ", ".join(f"{k} {v:g}" for k, v in stats.items())
        print(f"actor done: {summary}", flush=True)
        return 0

    return guard(body)


if __name__ == "__main__":
    sys.exit(main())
