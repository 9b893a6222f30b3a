"""Shipped run presets: tuned ``[learner]``, ``[ppo]`` and ``[policy]`` tables per env.

Each ``<EnvId>.toml`` in this package is a config file for ``--config``; the
command line names one as ``--config preset:<EnvId>`` (``zmq-rl run --config
preset:LunarLander-v3``), and flags given after it still override its values.
``zmq-rl run`` and ``zmq-learner`` also apply the env's preset by themselves when
no ``--config`` is given (``--no-preset`` turns that off); a file is named after its
env id without the module (``AtariPong-v0.toml`` holds ``zmq_rl.envs:AtariPong-v0``)
and applies to that id and to the bare name. Each preset's
``target_return`` is the target of docs/learning-quality.md.
The hyperparameters start from rl-baselines3-zoo's PPO settings, mapped onto this
package's fields (zoo ``n_envs`` -> ``num_actors * num_envs`` with 2 actors,
``n_steps`` -> ``num_steps``, ``batch_size`` -> ``minibatch_size``, ``n_epochs`` ->
``num_epochs``, ``normalize`` -> ``normalize_obs`` + ``normalize_reward``); each
file's header says where it departs from the zoo and what it reached
(docs/learning-quality.md has the measured table).
"""

from __future__ import annotations

import difflib
from importlib import resources
from pathlib import Path

__all__ = ["PRESET_PREFIX", "UnknownPreset", "available", "preset_path", "resolve_config_source"]

PRESET_PREFIX = "preset:"
"""The prefix that makes ``--config`` read a shipped preset instead of a file."""


class UnknownPreset(ValueError):
    """No preset of that name ships with the package; the message lists those that do."""


def _folder() -> Path:
    return Path(str(resources.files(__name__)))


def available() -> list[str]:
    """Names of the shipped presets (their env ids), sorted."""
    return sorted(p.stem for p in _folder().glob("*.toml"))


def preset_path(name: str) -> Path:
    """The TOML file of preset ``name``; :class:`UnknownPreset` naming the choices."""
    names = available()
    if name not in names:
        close = difflib.get_close_matches(name, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UnknownPreset(f"unknown preset {name!r}{hint}; shipped presets: {', '.join(names)}")
    return _folder() / f"{name}.toml"


def resolve_config_source(text: str) -> Path:
    """``preset:NAME`` -> that preset's file; anything else -> ``Path(text)``."""
    if text.startswith(PRESET_PREFIX):
        return preset_path(text[len(PRESET_PREFIX) :])
    return Path(text)
