"""The ``zmq-rl conformance`` subcommand: its flags and its body (docs/protocol.md 11.2)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

__all__ = ["add_conformance_flags", "conformance_from_args"]

ACTOR_HELP = {
    "env_id": "the learner's env id (a gymnasium id or a multi-agent PettingZoo env); the "
    "actor must run the same env",
    "env_kwargs": "keyword arguments of the env (JSON or key=value,...), also sent in the "
    "welcome: e.g. max_episode_steps=20 so that the truncation clause is exercised",
    "policy_map": "several policies: AGENT=POLICY,... as zmq-rl run's --policy-map",
    "host": "address the learner binds (and hands to the actor)",
    "port": "control port (experience +1, weights +2); 0 = a free block below the "
    "ephemeral ports (ZMQ_RL_TEST_PORTS=START-STOP picks in that range)",
    "num_steps": "rows per slot per rollout (= S, steps per broadcast)",
    "fragment_length": "rows per fragment the welcome asks for",
    "max_lead_steps": "L, the valve's lead (>= num_steps)",
    "heartbeat_interval": "seconds, announced in the welcome",
    "heartbeat_slack": "seconds added to 2 x heartbeat_interval for the longest allowed gap",
    "steady_versions": "broadcasts before the valve phase",
    "pickup_steps": "rows per slot of an older version allowed after a broadcast "
    "(0 = max_lead_steps + fragment_length)",
    "register_timeout": "seconds for the actor's first hello (its start-up included)",
    "phase_timeout": "seconds for each phase (a broadcast, the valve, the restart)",
    "quiet": "seconds without a fragment that mean 'paused' (a pause short of the valve budget "
    "fails only after 3 x this)",
    "shutdown_timeout": "seconds for the bye after shutdown",
    "exit_timeout": "seconds for the process to end after shutdown",
    "mismatch_timeout": "seconds the actor is watched after a protocol-1 reply",
    "output": "file for the actor's stdout and stderr (default: a temporary file)",
}
LEARNER_HELP = {
    "register_timeout": "seconds for the welcome",
    "reply_timeout": "seconds for each refuse",
    "reject_wait": "seconds to wait after the invalid fragments for a (wrong) broadcast",
    "broadcast_timeout": "seconds for the broadcast after the last valid row",
    "heartbeat_slack": "seconds added to 2 x heartbeat_interval for the longest allowed gap",
    "shutdown_timeout": "seconds to stream waiting for the end of the run (else SKIP)",
    "num_envs": "slots of the well-behaved actor",
}


def _add_options(parser: argparse.ArgumentParser, cls: Any, helps: dict[str, str]) -> None:
    for f in dataclasses.fields(cls):
        flag = "--" + ("env" if f.name == "env_id" else f.name.replace("_", "-"))
        parser.add_argument(
            flag,
            dest=f.name,
            type=type(f.default),
            default=f.default,
            help=f"{helps[f.name]} (default: {f.default!r})",
        )


def add_conformance_flags(parser: argparse.ArgumentParser) -> None:
    """``actor`` and ``learner`` targets with their options."""
    from ..conformance.actor import ActorCheckOptions
    from ..conformance.learner import LearnerCheckOptions
    from .flags import add_logging_flag

    targets = parser.add_subparsers(dest="target", metavar="TARGET", required=True)
    actor = targets.add_parser(
        "actor",
        help="check an actor command: zmq-rl conformance actor [options] -- CMD ARGS...",
        description="Start a learner on free local ports, run CMD ARGS... with "
        "ZMQ_RL_LEARNER=HOST:PORT in its environment (and {learner} in ARGS replaced by "
        "it), drive it through docs/protocol.md's clauses, print one line per clause. "
        "Exit 0 only if every MUST clause passed.",
    )
    learner = targets.add_parser(
        "learner",
        help="check a running learner: zmq-rl conformance learner HOST:PORT",
        description="Play a well-behaved actor and misbehaving ones against the learner at "
        "HOST:PORT (fresh, waiting for one actor: --num-actors 1; a small "
        "--total-env-steps lets the shutdown be checked). Exit 0 only if every MUST "
        "clause passed.",
    )
    for target, options, option_help in (
        (actor, ActorCheckOptions, ACTOR_HELP),
        (learner, LearnerCheckOptions, LEARNER_HELP),
    ):
        _add_options(target, options, option_help)
        target.add_argument("--json", type=Path, help="also write the report as JSON here")
        add_logging_flag(target, default="error")
    actor.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    learner.add_argument("address", metavar="HOST:PORT", help="the learner's control address")


def conformance_from_args(args: argparse.Namespace) -> int:
    """Run the check the arguments name; print the report; 0 if it conforms."""
    from ..run.common import CliFailure, check_env
    from .exits import setup_logging

    setup_logging(args.log_level)

    if args.target == "actor":
        check_env(args.env_id, env_kwargs=args.env_kwargs)  # a bad id fails up front
        from ..conformance.actor import ActorCheckOptions, check_actor

        command = list(args.command)
        if command and command[0] == "--":
            command = command[1:]
        if not command:
            raise CliFailure("conformance actor: give the actor command after --")
        names = [f.name for f in dataclasses.fields(ActorCheckOptions)]
        report = check_actor(command, ActorCheckOptions(**{n: getattr(args, n) for n in names}))
    else:
        from ..conformance.learner import LearnerCheckOptions, check_learner

        names = [f.name for f in dataclasses.fields(LearnerCheckOptions)]
        options = LearnerCheckOptions(**{n: getattr(args, n) for n in names})
        report = check_learner(args.address, options)
    for line in report.lines():
        print(line, flush=True)
    if args.json:
        args.json.write_text(json.dumps(report.to_json(), indent=1) + "\n")
    return 0 if report.passed() else 1
