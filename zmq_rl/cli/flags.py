"""Command-line flags and TOML config files generated from the config dataclasses.

Every field of a config dataclass (:mod:`zmq_rl.config`) becomes one flag: the flag
name is the field name with ``-`` for ``_``, the type comes from the annotation,
the help text and ``choices`` from ``metadata``, and the default from the field, so
a field cannot exist in the dataclass and be missing from the command line (the
tests compare ``--help`` with the dataclasses).

Types:

* ``int`` and ``float``: a number (``1e5`` is accepted for an int when integral);
* ``bool``: ``--flag`` / ``--no-flag`` (:class:`argparse.BooleanOptionalAction`);
* ``tuple[int, ...]``: a comma list, ``--hidden-sizes 64,64``;
* ``tuple[str, ...]``: a repeatable flag, ``--wrapper a:B --wrapper c:D`` (given on
  the command line, the values replace a config file's list);
* ``str``: as given, restricted to ``metadata["choices"]`` when present.

``--config FILE.toml`` loads values from a TOML file, either in sections named
after the dataclasses (``[learner]``, ``[ppo]``, ``[policy]``, ``[actor]``) or as
flat keys; flags given on the command line override the file. ``--config
preset:NAME`` loads a preset shipped in :mod:`zmq_rl.presets` (``preset:CartPole-v1``).
An unknown key is an error that names it. :func:`dump_toml` writes a resolved config
back in the same form, so a run's ``config.toml`` can be passed to ``--config`` to repeat it.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import sys
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from zmq_rl.config_toml import (  # the TOML form of the configs lives below the CLI
    ConfigFileError,
    Section,
    _field_kinds,
    _parse_float,
    _parse_int,
    _parse_int_list,
    dump_toml,
    flag_name,
    load_toml,
    preset_for,
)

__all__ = [
    "LOG_LEVELS",
    "CliParser",
    "ConfigFileError",
    "HelpFormatter",
    "Section",
    "add_config_flags",
    "add_logging_flag",
    "add_short_help",
    "add_version_flag",
    "build_configs",
    "dump_toml",
    "flag_name",
    "load_toml",
    "parse_with_config",
    "preset_for",
    "version_line",
]

LOG_LEVELS = ("debug", "info", "warning", "error")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each flag's default, except where the help already says it, and for a
    flag that takes no value (``--no-preset``: its "default: True" read as the
    preset being off)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "(default:" in text or action.default is None:
            return text
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            return text
        return super()._get_help_string(action) or text


class CliParser(argparse.ArgumentParser):
    """The argument parser of every command: no prefix matching, one-line errors.

    * ``allow_abbrev`` is off (and subparsers inherit the class), so ``--learning-rat``
      is an unknown flag instead of ``--learning-rate``;
    * a value that does not convert or is not among the choices reads
      ``error: <field>=<value>: <reason>``, like a config error;
    * any usage error prints that one ``error:`` line (with a "did you mean" for an
      unknown flag close to a real one) and a pointer to ``--help``, not the whole
      usage, and exits 2.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def _get_value(self, action: argparse.Action, arg_string: str) -> Any:
        try:
            return super()._get_value(action, arg_string)
        except argparse.ArgumentError:
            reason = _conversion_reason(action, arg_string)
            raise argparse.ArgumentError(None, _field_message(action, arg_string, reason)) from None

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError:
            choices = ", ".join(str(c) for c in action.choices or ())
            reason = f"must be one of {choices}"
            raise argparse.ArgumentError(None, _field_message(action, value, reason)) from None

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """As argparse's; remembers ``args`` so that an error can name the subcommand."""
        self._last_args = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> typing.NoReturn:
        """Print ``error: message`` and a pointer to ``--help``; exit 2."""
        message = " ".join(message.split())  # one line
        prog = self.prog
        if message.startswith("unrecognized arguments:"):
            sub = self._subcommand_parser()
            prog = sub.prog if sub is not None else prog
            message += _suggest_flags(sub or self, message.split(":", 1)[1].split())
        self.exit(2, f"error: {message}\ntry '{prog} --help'\n")

    def _subcommand_parser(self) -> argparse.ArgumentParser | None:
        """The subparser named in the arguments being parsed, if any."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                for word in getattr(self, "_last_args", ()):
                    if word in action.choices:
                        return action.choices[word]
        return None


def _suggest_flags(parser: argparse.ArgumentParser, unknown: Sequence[str]) -> str:
    """`` (did you mean --x?)`` for unknown flags close to one of ``parser``'s.

    A flag that begins one or more known flags (``--total`` of ``--total-env-steps``:
    an abbreviation, which the parsers do not expand) names those, else the closest
    spelling (difflib) is offered."""
    known = _option_strings(parser)
    hints = []
    for word in unknown:
        flag = word.split("=", 1)[0]
        if flag.startswith("--"):
            close = sorted({k for k in known if k.startswith(flag)}, key=len)[:3]
            close = close or difflib.get_close_matches(flag, known, n=1)
            if close:
                hints.append(f"{flag}: did you mean {' or '.join(close)}?")
    return f" ({'; '.join(hints)})" if hints else ""


def _option_strings(parser: argparse.ArgumentParser) -> list[str]:
    """Every long option of ``parser`` and of its subparsers."""
    found: list[str] = []
    for action in parser._actions:
        found.extend(o for o in action.option_strings if o.startswith("--"))
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found.extend(_option_strings(sub))
    return found


def _field_of(action: argparse.Action) -> str:
    """The config field (or plain dest) an action sets: ``ppo.num_epochs`` -> ``num_epochs``."""
    return str(action.dest).rsplit(".", 1)[-1]


def _field_message(action: argparse.Action, value: Any, reason: str) -> str:
    return f"{_field_of(action)}={value!r}: {reason}"


def _conversion_reason(action: argparse.Action, text: str) -> str:
    """Why ``action.type`` did not take ``text``, in a few words."""
    try:
        action.type(text)  # type: ignore[misc]
    except argparse.ArgumentTypeError as exc:
        return str(exc)
    except (TypeError, ValueError):
        pass
    name = getattr(action.type, "__name__", "")
    return {"int": "not an integer", "float": "not a number"}.get(name, f"not a valid {name}")


# -- converting values ----------------------------------------------------------------


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    raise TypeError(f"config field {f.name!r} has no default, so it cannot be a flag")


_PARSERS: dict[str, Callable[[str], Any]] = {
    "int": _parse_int,
    "float": _parse_float,
    "str": str,
    "int_tuple": _parse_int_list,
    "str_tuple": str,
}
_METAVARS = {"int": "N", "float": "X", "str": "TEXT", "int_tuple": "N,N,...", "str_tuple": "TEXT"}


class _AppendTuple(argparse.Action):
    """A repeatable flag collecting a tuple: the first use on the command line
    replaces the default (a config file's list), later uses append."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        marker = f"_given_{self.dest}"
        current = getattr(namespace, self.dest, None) if getattr(namespace, marker, False) else ()
        setattr(namespace, self.dest, (*(current or ()), values))
        setattr(namespace, marker, True)


# -- flags ----------------------------------------------------------------------------


def add_config_flags(
    parser: argparse.ArgumentParser,
    sections: Sequence[Section],
    *,
    aliases: Mapping[str, Sequence[str]] | None = None,
    defaults: Mapping[str, Any] | None = None,
    default_help: Mapping[str, str] | None = None,
) -> None:
    """Add one flag per field of every section, in a help group per section.

    ``aliases`` maps a field name to extra flags (``{"env_id": ["--env"]}``);
    ``defaults`` replaces a field's dataclass default for this command;
    ``default_help`` describes a default that is computed later (shown instead of
    the value, e.g. ``"runs/<env>-<timestamp>"``; the flag's default is then None).
    Field names must be unique across the sections.
    """
    aliases = aliases or {}
    defaults = defaults or {}
    default_help = default_help or {}
    seen: dict[str, str] = {}
    for section in sections:
        kinds = _field_kinds(section.cls)
        doc = (section.cls.__doc__ or "").strip().splitlines()
        group = parser.add_argument_group(section.title, doc[0] if doc else None)
        for f in section.fields():
            if f.name in seen:
                raise ValueError(
                    f"field {f.name!r} is in both [{seen[f.name]}] and [{section.name}]"
                )
            seen[f.name] = section.name
            kind = kinds[f.name]
            names = [flag_name(f.name), *aliases.get(f.name, ())]
            help_text = str(f.metadata.get("help", "")).replace("%", "%%")
            if f.name in default_help:
                default: Any = None
                help_text += f" (default: {default_help[f.name]})"
            else:
                default = defaults.get(f.name, _field_default(f))
                if kind == "int_tuple" and isinstance(default, tuple):
                    help_text += f" (default: {','.join(str(v) for v in default)})"
                elif kind == "str_tuple" and isinstance(default, tuple):
                    help_text += f" (default: {' '.join(default) or 'none'})"
                elif default == "":
                    help_text += " (default: '')"
            kwargs: dict[str, Any] = {
                "dest": section.dest(f.name),
                "default": default,
                "help": help_text,
            }
            if kind == "bool":
                kwargs["action"] = argparse.BooleanOptionalAction
            elif kind == "str_tuple":
                kwargs["action"] = _AppendTuple
                kwargs["metavar"] = f.metadata.get("metavar", _METAVARS[kind])
            else:
                kwargs["type"] = _PARSERS[kind]
                kwargs["metavar"] = f.metadata.get("metavar", _METAVARS[kind])
                choices = f.metadata.get("choices")
                if choices:
                    kwargs["choices"] = tuple(choices)
                    kwargs["metavar"] = "{" + ",".join(str(c) for c in choices) + "}"
            group.add_argument(*names, **kwargs)
            for old in f.metadata.get("deprecated_names", ()):
                group.add_argument(
                    flag_name(old),
                    **{**kwargs, "help": argparse.SUPPRESS},
                    action=_deprecated_action(flag_name(old), names[0], kwargs.get("action")),
                )
    help_text = (
        "read settings from a TOML file (tables "
        + ", ".join(f"[{s.name}]" for s in sections)
        + " or flat keys); flags given here override it"
    )
    metavar = "FILE.toml"
    if any(s.name == "learner" for s in sections):
        from zmq_rl.presets import available

        metavar = "FILE.toml|preset:NAME"

        help_text += (
            ". 'preset:NAME' reads a shipped, tuned preset instead: "
            + ", ".join(available())
            + " (e.g. --config preset:LunarLander-v3 --seed 1)"
        )
    parser.add_argument(
        "--config",
        metavar=metavar,
        type=_config_source,
        default=None,
        help=help_text.replace("%", "%%"),
    )


def _deprecated_action(old: str, new: str, base: Any) -> type[argparse.Action]:
    """An argparse action for a renamed flag: warn once on stderr, then act as ``new``."""
    parent = base or argparse._StoreAction

    class Deprecated(parent):  # type: ignore[misc, valid-type]
        def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
            # A command parses its arguments up to three times with the same parser
            # (parse_with_config: the config or preset, then the flags again): warn once.
            warned = parser.__dict__.setdefault("_deprecations_warned", set())
            if old not in warned:
                warned.add(old)
                sys.stderr.write(f"warning: {old} is deprecated; use {new}\n")
            super().__call__(parser, namespace, values, option)

    return Deprecated


def _config_source(text: str) -> Path:
    """``--config`` value: a file path, or ``preset:NAME`` for a shipped preset."""
    from zmq_rl.presets import UnknownPreset, resolve_config_source

    try:
        return resolve_config_source(text)
    except UnknownPreset as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_short_help(
    parser: argparse.ArgumentParser, common: Mapping[str, str], title: str, summary: str
) -> None:
    """``-h`` shows a one-line usage, ``summary`` and only the flags named in
    ``common`` (an option string, e.g. ``--env``, to a short help text: ``""`` keeps
    the flag's own), in that order, then how many more ``--help`` lists; ``--help``
    keeps listing every flag, under the same one-line usage (argparse's own usage of
    a command with every config field as a flag runs to dozens of lines)."""
    import copy

    full = next(a for a in parser._actions if isinstance(a, argparse._HelpAction))
    full.option_strings = [o for o in full.option_strings if o != "-h"]
    full.help = "show every flag with its default and exit"
    parser._option_string_actions.pop("-h", None)
    parser.usage = "%(prog)s [FLAGS]  (-h: the common flags; --help: all of them)"

    class ShortHelp(argparse.Action):
        def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
            chosen = []
            for flag, text in common.items():
                action = parser._option_string_actions[flag]
                shown = copy.copy(action)
                shown.option_strings = [flag]
                shown.help = text.replace("%", "%%") if text else action.help
                chosen.append(shown)
            listed = {id(parser._option_string_actions[f]) for f in common}
            others = [
                a
                for a in parser._actions
                if a.option_strings and id(a) not in listed and a.help != argparse.SUPPRESS
            ]
            formatter = parser._get_formatter()
            formatter.add_usage(parser.usage, parser._actions, [])
            formatter.add_text(summary)
            formatter.start_section(title)
            formatter.add_arguments(chosen)
            formatter.end_section()
            formatter.add_text(
                f"{len(others)} more flags (every setting of the run is one): "
                f"'{parser.prog} --help' lists them all with their defaults."
            )
            parser._print_message(formatter.format_help(), sys.stdout)
            parser.exit(0)

    parser.add_argument(
        "-h", action=ShortHelp, nargs=0, default=argparse.SUPPRESS, help="show the common flags"
    )


def version_line(prog: str) -> str:
    """``zmq-rl 0.1.0 (wire protocol 2, Python 3.11.7, /path/to/zmq_rl)``: what
    ``--version`` prints (nothing heavy is imported for it)."""
    import platform

    import zmq_rl
    from zmq_rl.wire.codec import PROTOCOL_VERSION

    where = Path(zmq_rl.__file__).resolve().parent
    return (
        f"{prog} {zmq_rl.__version__} (wire protocol {PROTOCOL_VERSION}, "
        f"Python {platform.python_version()}, {where})"
    )


class _VersionAction(argparse.Action):
    """``--version``: print :func:`version_line` and exit 0."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        parser._print_message(version_line(parser.prog.split()[0]) + "\n", sys.stdout)
        parser.exit(0)


def add_version_flag(parser: argparse.ArgumentParser) -> None:
    """Add ``--version``."""
    parser.add_argument(
        "--version",
        action=_VersionAction,
        nargs=0,
        default=argparse.SUPPRESS,
        help="print the version (of zmq_rl and of its wire protocol) and exit",
    )


def add_logging_flag(parser: argparse.ArgumentParser, default: str = "warning") -> None:
    """Add ``--log-level``."""
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default=default,
        help="log messages of this level and above (to stderr)",
    )


def build_configs(args: argparse.Namespace, sections: Sequence[Section]) -> dict[str, Any]:
    """Build and validate one dataclass instance per section from parsed flags.

    Fields whose flag value is None (a default computed later) are left out, so
    the dataclass default applies; the caller replaces them afterwards. Raises
    :class:`ConfigError` from the dataclasses' ``validate()``.
    """
    out: dict[str, Any] = {}
    for section in sections:
        kwargs = {}
        for f in section.fields():
            value = getattr(args, section.dest(f.name))
            if value is not None:
                kwargs[f.name] = value
        out[section.name] = section.cls(**kwargs).validate()
    return out


# -- TOML -----------------------------------------------------------------------------


PRESET_ENV_DEST = "learner.env_id"
"""The dest whose value picks the automatic preset."""


def parse_with_config(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    sections: Sequence[Section],
    flags_parser: argparse.ArgumentParser | None = None,
) -> argparse.Namespace:
    """Parse ``argv``; if it names ``--config``, load the file and parse again.

    The file's values become the defaults of ``flags_parser`` (the parser, or the
    subcommand parser, that owns the generated flags), so flags given on the
    command line win over the file and the file wins over the dataclass defaults.

    Without ``--config``, on a parser that has ``--no-preset`` (dest ``use_preset``)
    and not given it: when the env (``--env`` or its default) has a shipped preset,
    that preset is loaded as if it were the ``--config`` file. The namespace's
    ``applied_preset`` then names the env (None when no preset was applied). A
    namespace with ``resume`` set gets no preset: a resumed run keeps its own settings.
    """
    args = parser.parse_args(argv)
    path = getattr(args, "config", None)
    preset = None
    resuming = getattr(args, "resume", None) is not None  # the run's own config applies
    if path is None and getattr(args, "use_preset", False) and not resuming:
        path = preset_for(str(getattr(args, PRESET_ENV_DEST, "")))
        preset = getattr(args, PRESET_ENV_DEST) if path is not None else None
    if path is None:
        args.applied_preset = None
        return args
    values = load_toml(path, sections)
    (flags_parser or parser).set_defaults(**values)
    args = parser.parse_args(argv)
    args.applied_preset = preset
    return args
