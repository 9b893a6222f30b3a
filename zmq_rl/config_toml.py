"""The TOML form of the configs: the sections (``[learner]``, ``[ppo]``, ``[policy]``),
how a config file or a shipped preset is read (:func:`load_toml`, :func:`preset_for`)
and how a run's ``config.toml`` is written (:func:`dump_toml`).

Below the command line and the engine alike: ``zmq-rl run``, ``zmq-learner`` and
``zmq_rl.train`` write a run's ``config.toml`` with :func:`dump_toml`; the command
line's ``--config`` and :func:`zmq_rl.make_configs` read files back with
:func:`load_toml` (:mod:`zmq_rl.cli.flags` adds the flags of the same sections).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import math
import sys
import tomllib
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import ConfigError, LearnerConfig, PolicyConfig, PPOConfig, toml_env_value

__all__ = [
    "LEARNER_SECTIONS",
    "ConfigFileError",
    "Section",
    "coerce",
    "dump_toml",
    "flag_name",
    "load_toml",
    "preset_for",
]


class ConfigFileError(ValueError):
    """A ``--config`` file cannot be read, is not TOML, or holds an unknown key."""


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} to TOML")


def dump_toml(configs: Mapping[str, Any], header: str = "", commented: Iterable[str] = ()) -> str:
    """TOML text with one table per config dataclass instance (``{"learner": cfg}``).

    Fields named in ``commented`` are written as comments (shown, not loaded).
    """
    lines = [f"# {line}" for line in header.splitlines()]
    commented = set(commented)
    for name, cfg in configs.items():
        if lines:
            lines.append("")
        lines.append(f"[{name}]")
        for f in dataclasses.fields(cfg):
            prefix = "# " if f.name in commented else ""
            lines.append(f"{prefix}{f.name} = {_toml_value(getattr(cfg, f.name))}")
    return "\n".join(lines) + "\n"


# -- reading: sections, values, files -------------------------------------------------


@dataclass(frozen=True)
class Section:
    """One config dataclass exposed on a command line and as a TOML table.

    ``name`` is the TOML table (``[learner]``) and the prefix of the argparse dest;
    ``cls`` the dataclass; ``title`` the heading of its group in ``--help``.
    """

    name: str
    cls: type
    title: str

    def fields(self) -> tuple[dataclasses.Field, ...]:
        """The dataclass fields, in declaration order."""
        return dataclasses.fields(self.cls)

    def dest(self, field_name: str) -> str:
        """The argparse dest of a field (``"learner.gamma"``)."""
        return f"{self.name}.{field_name}"


def flag_name(field_name: str) -> str:
    """``num_envs`` -> ``--num-envs``."""
    return "--" + field_name.replace("_", "-")


def _parse_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("not an integer") from None
    if not value.is_integer():
        raise argparse.ArgumentTypeError("not an integer")
    return int(value)


def _parse_float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("not a number") from None


def _parse_int_list(text: str) -> tuple[int, ...]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError("not a comma list of integers")
    try:
        return tuple(_parse_int(p) for p in parts)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError("not a comma list of integers") from None


def _kind(annotation: Any) -> str:
    """Classify a resolved field annotation: int, float, bool, str or int_tuple."""
    if annotation in (int, float, bool, str):
        return annotation.__name__
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is tuple and args and args[0] is int:
        return "int_tuple"
    if origin is tuple and args and args[0] is str:
        return "str_tuple"
    if origin in (typing.Union, types.UnionType):
        raise TypeError(f"optional/union config fields are not supported: {annotation!r}")
    raise TypeError(f"config field type {annotation!r} has no command-line form")


def _field_kinds(cls: type) -> dict[str, str]:
    hints = typing.get_type_hints(cls)
    return {f.name: _kind(hints[f.name]) for f in dataclasses.fields(cls)}


def coerce(kind: str, name: str, value: Any) -> Any:
    """Convert a value read from TOML to a field's type; :class:`ConfigError` if it can't."""
    if kind == "bool":
        if isinstance(value, bool):
            return value
        raise ConfigError(name, value, "must be true or false")
    if kind == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(name, value, "must be an integer")
    if kind == "float":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(name, value, "must be a number")
    if kind == "str":
        if isinstance(value, str):
            return value
        raise ConfigError(name, value, "must be a string")
    if kind == "int_tuple":
        if isinstance(value, list) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            return tuple(value)
        if isinstance(value, str):
            try:
                return _parse_int_list(value)
            except argparse.ArgumentTypeError:
                pass
        raise ConfigError(name, value, "must be a list of integers")
    if kind == "str_tuple":
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
        if isinstance(value, str):
            return (value,)
        raise ConfigError(name, value, "must be a list of strings")
    raise TypeError(kind)


def deprecated_names(cls: type) -> dict[str, str]:
    """Old field name -> current name, for the renamed fields of a config dataclass."""
    return {
        old: f.name
        for f in dataclasses.fields(cls)
        for old in f.metadata.get("deprecated_names", ())
    }


def load_toml(path: Path, sections: Sequence[Section]) -> dict[str, Any]:
    """Read a TOML config into ``{dest: value}`` for :meth:`ArgumentParser.set_defaults`.

    Accepts tables named after the sections and flat keys (matched to the section
    that has the field). Raises :class:`ConfigFileError` for an unreadable file,
    invalid TOML, an unknown table or key (naming it, with a suggestion), and
    a value of the wrong type (the message then reads ``FILE: field=value: reason``).
    """
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigFileError(f"{path}: cannot read config: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigFileError(f"{path}: invalid TOML: {exc}") from None
    kinds = {s.name: _field_kinds(s.cls) for s in sections}
    owner = {name: s for s in sections for name in kinds[s.name]}
    by_name = {s.name: s for s in sections}
    values: dict[str, Any] = {}

    renamed = {old: new for s in sections for old, new in deprecated_names(s.cls).items()}

    def put(section: Section, key: str, value: Any, where: str) -> None:
        if key in renamed:
            sys.stderr.write(f"warning: {path}: {key!r} is deprecated; use {renamed[key]!r}\n")
            key = renamed[key]
        if key not in kinds[section.name]:
            raise ConfigFileError(
                f"{path}: unknown key {key!r} in {where}{_suggest(key, kinds[section.name])}"
            )
        try:
            value = toml_env_value(key, value)  # env_kwargs / wrappers given as tables
            values[section.dest(key)] = coerce(kinds[section.name][key], key, value)
        except ConfigError as exc:
            raise ConfigFileError(f"{path}: {exc}") from None

    for key, value in data.items():
        if isinstance(value, dict) and (key in by_name or key not in owner):
            section = by_name.get(key)
            if section is None:
                raise ConfigFileError(
                    f"{path}: unknown table [{key}]{_suggest(key, by_name)}; "
                    f"known tables: {', '.join(f'[{s}]' for s in by_name)}"
                )
            for sub_key, sub_value in value.items():
                put(section, sub_key, sub_value, f"[{key}]")
        else:
            section = owner.get(renamed.get(key, key))
            if section is None:
                raise ConfigFileError(f"{path}: unknown key {key!r}{_suggest(key, owner)}")
            put(section, key, value, "the top level")
    return values


def _suggest(word: str, options: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def preset_for(env_id: str) -> Path | None:
    """The shipped preset of ``env_id`` (:mod:`zmq_rl.presets`), or None if it has none.

    A preset is named after its env id without the module (``AtariPong-v0`` holds
    ``env_id = "zmq_rl.envs:AtariPong-v0"``): it applies to that id and to the bare name."""
    from zmq_rl.presets import available, preset_path

    name = env_id.rpartition(":")[2]
    if name not in available():
        return None
    path = preset_path(name)
    own = str(tomllib.loads(path.read_text()).get("learner", {}).get("env_id", name))
    return path if env_id in (own, own.rpartition(":")[2]) else None


LEARNER_SECTIONS = (
    Section("learner", LearnerConfig, "learner (run, rollout, sockets)"),
    Section("ppo", PPOConfig, "PPO update"),
    Section("policy", PolicyConfig, "policy network"),
)
"""The config sections of a learner: ``zmq-rl run``, ``zmq-learner``, ``make_configs``."""
