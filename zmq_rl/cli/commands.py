"""The registry of ``zmq-rl``'s subcommands and the parser built from it.

A subcommand is one function registered with :func:`subcommand`; its flags are
declared in the decorator (``arg(...)`` specs, or a function that adds them), and
the function takes the parsed :class:`argparse.Namespace` and returns the exit
code::

    @subcommand("keys", "generate CURVE key pairs for encrypted sockets",
                arg("out_dir", type=Path, help="where to write the keys"))
    def keys_command(args: argparse.Namespace) -> int:
        ...
        return 0

The modules that define subcommands (:mod:`zmq_rl.cli.main`, :mod:`~zmq_rl.cli.slurm`,
:mod:`~zmq_rl.cli.ray_launch`) import this one; it imports none of them, so the
registry is the bottom of the command line and no subcommand module imports another
to register. The entry point, :func:`zmq_rl.cli.main.main`, imports them all.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .flags import CliParser, HelpFormatter, Section, add_version_flag

__all__ = [
    "ORDER",
    "RUN_DEFAULTS",
    "Arg",
    "SUBCOMMANDS",
    "Subcommand",
    "arg",
    "build_parser",
    "non_negative",
    "subcommand",
    "subparser",
]


@dataclass(frozen=True)
class Arg:
    """The arguments of one ``parser.add_argument`` call."""

    names: tuple[str, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)


def arg(*names: str, **kwargs: Any) -> Arg:
    """Declare one argument of a subcommand (same signature as ``add_argument``)."""
    return Arg(names, kwargs)


Configure = Callable[[argparse.ArgumentParser], None]


@dataclass(frozen=True)
class Subcommand:
    """A registered subcommand: its name, help, arguments and body."""

    name: str
    help: str
    description: str
    args: tuple[Arg | Configure, ...]
    run: Callable[[argparse.Namespace], int]
    sections: tuple[Section, ...] = ()


SUBCOMMANDS: dict[str, Subcommand] = {}
"""Every registered subcommand by name."""

ORDER = ("run", "eval", "export", "ladder", "plot", "keys", "serve", "conformance", "slurm", "ray")
"""The order of ``zmq-rl --help``'s list (a subcommand not named here comes last)."""


def _position(sub: Subcommand) -> int:
    return ORDER.index(sub.name) if sub.name in ORDER else len(ORDER)


def subcommand(
    name: str,
    help: str,
    *args: Arg | Configure,
    description: str = "",
    sections: Sequence[Section] = (),
) -> Callable[[Callable[[argparse.Namespace], int]], Callable[[argparse.Namespace], int]]:
    """Register the decorated function as ``zmq-rl NAME``.

    ``args`` are :func:`arg` specs or functions that add arguments to the
    subcommand's parser. ``sections``: the config dataclasses whose flags the
    subcommand has (with ``--config``); a TOML file given there is applied before
    the function runs. The function gets the parsed namespace and returns the
    exit code; it may raise :class:`~zmq_rl.run.common.CliFailure` or a config
    error (reported as ``error: ...``).
    """

    def register(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        if name in SUBCOMMANDS:
            raise ValueError(f"subcommand {name!r} is registered twice")
        doc = _plain_text((fn.__doc__ or "").strip())
        SUBCOMMANDS[name] = Subcommand(
            name, help, description or doc or help, args, fn, tuple(sections)
        )
        return fn

    return register


def _plain_text(doc: str) -> str:
    """A docstring as ``--help`` shows it: reST markup (``code``, :func:`name`) removed."""
    doc = re.sub(r":\w+:`~?([^`]+)`", r"\1", doc)
    return doc.replace("``", "")


def build_parser(only: str | None = "") -> argparse.ArgumentParser:
    """The ``zmq-rl`` parser with one subparser per registered subcommand (all
    :class:`~zmq_rl.cli.flags.CliParser`: no prefix matching, one-line errors).

    ``only``: add the flags of that subcommand alone (``None``: of none, ``""``: of
    all; the others get their name and help, enough for ``zmq-rl --help``), so that a
    command imports what its own flags need and nothing of the others' (the conformance
    flags import the learner). The subcommands are listed in the order of :data:`ORDER`."""
    parser = CliParser(
        prog="zmq-rl",
        description="Distributed PPO over ZeroMQ. 'zmq-rl run' trains with local actors; "
        "for several machines use zmq-learner and zmq-actor, or on a cluster 'zmq-rl slurm' "
        "or 'zmq-rl ray'.",
        formatter_class=HelpFormatter,
    )
    add_version_flag(parser)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for sub in sorted(SUBCOMMANDS.values(), key=_position):
        sp = subparsers.add_parser(
            sub.name,
            help=sub.help,
            description=sub.description,
            formatter_class=HelpFormatter,
        )
        if only in ("", sub.name):
            for spec in sub.args:
                if isinstance(spec, Arg):
                    sp.add_argument(*spec.names, **spec.kwargs)
                else:
                    spec(sp)
        sp.set_defaults(_subcommand=sub.name)
    return parser


def subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of subcommand ``name`` inside ``parser``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]
    raise KeyError(name)


RUN_DEFAULTS = {"num_actors": 2, "eval_every": 5}
"""Where ``zmq-rl run`` differs from the learner's defaults. No ``target_return``: an
env's stop condition comes from its preset (CartPole-v1: 475) or from the user."""


def non_negative(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type: ``kind`` (int or float) and >= 0."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
        return value

    parse.__name__ = kind.__name__
    return parse
