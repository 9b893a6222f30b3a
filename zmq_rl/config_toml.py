"""The TOML form of the configs: how a run's ``config.toml`` is written, and the error
of a config file that cannot be read.

Below the command line and the engine alike: ``zmq-rl run``, ``zmq-learner`` and
``zmq_rl.train`` write a run's ``config.toml`` with :func:`dump_toml`, the command
line's ``--config`` reads it back (:func:`zmq_rl.cli.flags.load_toml`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["ConfigFileError", "dump_toml"]


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
