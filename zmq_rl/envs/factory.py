"""Making environments (:func:`make_env`) as every process of a run does.

:func:`make_env` is how every process of a run builds its env -- the learner's
probe, each actor, the evaluator, ``zmq-rl eval``/``export`` -- from the same three
settings: the env (a gymnasium id, ``module:Id``, or a user's own
``module.path:EnvClass`` / ``module.path:make_fn``), the keyword arguments of
``gym.make`` (``--env-kwargs``) and gymnasium wrappers by import path
(``--wrapper module:Wrapper``, applied in order). A failure is an
:class:`EnvBuildError` naming the env id and the reason. :func:`build_env` also
builds PettingZoo envs (:mod:`zmq_rl.envs.multi_agent`); :func:`env_shape` says
what the learner needs of an env.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from ..config import ConfigError, parse_env_kwargs, parse_wrapper, wrapper_spec
from .multi_agent import (
    AgentSpaceMismatch,
    agent_spaces,
    is_multi_agent,
    is_turn_based,
    to_parallel,
)

__all__ = [
    "EnvBuildError",
    "EnvShape",
    "build_env",
    "env_shape",
    "import_callable",
    "make_env",
]


class EnvBuildError(ConfigError):
    """An environment cannot be built: ``field`` is ``env_id`` or ``wrappers``, and
    the message names the env id (or wrapper) and the reason."""


def _importable_cwd() -> None:
    """Let ``module:...`` specs find modules in the working directory, as
    ``python -m`` does (console scripts do not put it on ``sys.path``)."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)


def _import_attr(spec: str, field: str, env_label: str) -> tuple[Any, Any]:
    """``"pkg.mod:Name"`` -> (module, attribute or None); EnvBuildError if the module
    does not import."""
    module_name, _, name = spec.partition(":")
    _importable_cwd()
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's to see
        raise EnvBuildError(
            field, env_label, f"cannot import module {module_name!r}: {type(exc).__name__}: {exc}"
        ) from None
    return module, getattr(module, name, None)


def import_callable(spec: str, field: str) -> Any:
    """The callable ``"module.path:name"`` names (a scripted player, a factory);
    :class:`EnvBuildError` naming ``field`` and ``spec`` when its module does not
    import or it is no callable there."""
    _, found = _import_attr(spec, field, spec)
    if not callable(found):
        raise EnvBuildError(field, spec, f"{spec.partition(':')[2]!r} is not a callable there")
    return found


def _load_wrapper(spec: str) -> tuple[Any, dict[str, Any]]:
    """The wrapper of ``spec`` (``module:Name`` or ``module:Name(key=value,...)``, see
    :func:`~zmq_rl.config.parse_wrapper`) and the keyword arguments it is called with."""
    try:
        path, kwargs = parse_wrapper(wrapper_spec(spec) if isinstance(spec, str) else spec)
    except ConfigError as exc:
        raise EnvBuildError("wrappers", spec, exc.reason) from None
    _, wrapper = _import_attr(path, "wrappers", spec)
    if wrapper is None:
        raise EnvBuildError("wrappers", spec, f"the module has no attribute {path.split(':')[1]!r}")
    if not callable(wrapper):
        raise EnvBuildError("wrappers", spec, "is not a class or callable taking an env")
    return wrapper, kwargs


def make_env(
    env_id: str,
    env_kwargs: Mapping[str, Any] | str | None = None,
    wrappers: Sequence[str] = (),
    **make_kwargs: Any,
) -> gym.Env:
    """Build one single-agent environment as every process of a run does
    (:func:`build_env`); a multi-agent (PettingZoo) env is an :class:`EnvBuildError`
    saying so, for the callers that step one agent."""
    env = build_env(env_id, env_kwargs, wrappers, **make_kwargs)
    if not isinstance(env, gym.Env):
        env.close()
        raise EnvBuildError(
            "env_id",
            env_id,
            "is a multi-agent (PettingZoo) env, and this needs a single-agent gymnasium env "
            "(training, zmq-rl eval and zmq_rl.evaluate_policy take PettingZoo envs: "
            "docs/multi_agent.md)",
        )
    return env


@dataclass(frozen=True)
class EnvShape:
    """What the learner needs of an env: the spaces one (shared) policy acts in and
    how many slots one env copy fills (its possible agents; 1 for a gymnasium env)."""

    observation_space: gym.Space
    action_space: gym.Space
    agents_per_env: int = 1
    turn_based: bool = False  # a PettingZoo AEC game whose agents move one at a time
    agents: tuple[str, ...] = ()  # a multi-agent env's possible agents (slot order)


def env_shape(
    env_id: str, env_kwargs: Mapping[str, Any] | str | None = None, wrappers: Sequence[str] = ()
) -> EnvShape:
    """Build (and close) the env once and say its :class:`EnvShape`; a multi-agent
    env whose agents do not share their spaces is an :class:`EnvBuildError` naming
    the agent."""
    env = build_env(env_id, env_kwargs, wrappers)
    try:
        if isinstance(env, gym.Env):
            return EnvShape(env.observation_space, env.action_space)
        try:
            obs_space, act_space, agents = agent_spaces(env, env_id)
        except AgentSpaceMismatch as exc:
            raise EnvBuildError("env_id", env_id, str(exc).removeprefix(f"{env_id}: ")) from None
        names = tuple(str(a) for a in agents)
        return EnvShape(obs_space, act_space, len(agents), is_turn_based(env), names)
    finally:
        env.close()


MISSING_PACKAGE_HINTS = {
    "pettingzoo": "pip install 'zmq_rl[multi-agent]' (in a checkout: bin/train --extra "
    "multi-agent ...); docs/multi_agent.md",
}
"""What to install when an env id names a module of one of these packages and the
package is missing (instead of gymnasium's ``NameNotFound``)."""


def _module_factory(env_id: str) -> Any:
    """``parallel_env`` (else ``env``) of a PettingZoo-style module named ``env_id``
    (``pettingzoo.sisl.pursuit_v5``), or None when ``env_id`` is no such module."""
    if "." not in env_id or env_id in gym.registry:
        return None
    _importable_cwd()
    try:
        module = importlib.import_module(env_id)
    except ModuleNotFoundError as exc:
        if exc.name and env_id.startswith(exc.name):  # no such module: a gymnasium id
            top = env_id.split(".")[0]
            if exc.name == top and top in MISSING_PACKAGE_HINTS:  # its package is missing
                raise EnvBuildError(
                    "env_id", env_id, f"{top} is not installed: {MISSING_PACKAGE_HINTS[top]}"
                ) from None
            return None
        raise EnvBuildError(
            "env_id", env_id, f"cannot import it: {exc} (pip install the env's extras)"
        ) from None
    except Exception as exc:  # noqa: BLE001 - the module is there and fails: say how
        raise EnvBuildError(
            "env_id", env_id, f"cannot import it: {type(exc).__name__}: {exc}"
        ) from None
    return getattr(module, "parallel_env", None) or getattr(module, "env", None)


def build_env(
    env_id: str,
    env_kwargs: Mapping[str, Any] | str | None = None,
    wrappers: Sequence[str] = (),
    **make_kwargs: Any,
) -> Any:
    """Build one environment as every process of a run does: a gymnasium env, or a
    multi-agent PettingZoo env under the Parallel API (:mod:`zmq_rl.envs.multi_agent`).

    ``env_id`` is one of:

    * a registered gymnasium id (``"CartPole-v1"``) -> ``gym.make(env_id, **kwargs)``;
    * ``"module:Id"`` where importing ``module`` registers ``Id`` (gymnasium's own
      form, e.g. ``zmq_rl.envs:AtariPong-v0``);
    * ``"module.path:EnvClass"`` (a :class:`gymnasium.Env` subclass) or
      ``"module.path:make_fn"`` (a callable returning an env): called with the
      keyword arguments. Modules in the working directory are found.
    * a PettingZoo env module (``"pettingzoo.sisl.pursuit_v5"``): its
      ``parallel_env`` (else its AEC ``env``) with the keyword arguments; or
      ``"module.path:factory"`` returning a PettingZoo ``ParallelEnv`` / ``AECEnv``.
      AEC envs run through PettingZoo's ``aec_to_parallel`` when parallelizable;
      turn-based games stay AEC envs (:class:`~zmq_rl.envs.multi_agent.TurnSlots`).

    ``env_kwargs``: a mapping, or the text form of ``--env-kwargs`` (JSON object or
    ``key=value,...``, see :func:`~zmq_rl.config.parse_env_kwargs`); ``make_kwargs``
    (e.g. ``render_mode``) are added to them. ``wrappers``: ``"module:Wrapper"``
    specs, each called as ``Wrapper(env)``, in order; ``"module:Wrapper(key=value,...)"``
    calls ``Wrapper(env, key=value, ...)`` (e.g.
    ``"gymnasium.wrappers:TimeLimit(max_episode_steps=200)"``). Raises :class:`EnvBuildError`
    naming the env id (or the wrapper) and the reason when anything fails.
    """
    kwargs = parse_env_kwargs(env_kwargs) if isinstance(env_kwargs, str) else dict(env_kwargs or {})
    kwargs.update(make_kwargs)
    if not isinstance(env_id, str) or not env_id:
        raise EnvBuildError("env_id", env_id, "must be a non-empty env id")
    shown = f" with env_kwargs {json.dumps(kwargs, default=str)}" if kwargs else ""
    factory = None if ":" in env_id else _module_factory(env_id)
    if ":" in env_id:
        module_part, _, name = env_id.partition(":")
        if not module_part or not name:
            raise EnvBuildError("env_id", env_id, "must be 'module.path:Name'")
        _, attr = _import_attr(env_id, "env_id", env_id)
        if name not in gym.registry:
            if attr is None:
                raise EnvBuildError(
                    "env_id",
                    env_id,
                    f"module {module_part!r} neither registers a gymnasium id {name!r} nor "
                    f"has an attribute {name!r} (an Env class or a function returning an env)",
                )
            if not callable(attr):
                raise EnvBuildError("env_id", env_id, f"{name!r} is not a class or function")
            factory = attr
    try:
        env = factory(**kwargs) if factory is not None else gym.make(env_id, **kwargs)
    except EnvBuildError:
        raise
    except Exception as exc:  # noqa: BLE001 - gymnasium and user code raise many kinds
        raise EnvBuildError(
            "env_id", env_id, f"cannot make the env{shown}: {type(exc).__name__}: {exc}"
        ) from None
    if is_multi_agent(env):
        try:
            env = to_parallel(env, env_id)
        except ValueError as exc:
            raise EnvBuildError("env_id", env_id, str(exc).removeprefix(f"{env_id} ")) from None
    elif not isinstance(env, gym.Env):
        raise EnvBuildError(
            "env_id",
            env_id,
            f"{env_id.partition(':')[2]}(...) returned a {type(env).__name__}, not a gymnasium.Env "
            "or a PettingZoo env",
        )
    for spec in wrappers:
        wrapper, wrapper_kwargs = _load_wrapper(spec)
        try:
            wrapped = wrapper(env, **wrapper_kwargs)
        except Exception as exc:  # noqa: BLE001
            env.close()
            raise EnvBuildError(
                "wrappers", spec, f"cannot wrap env {env_id}: {type(exc).__name__}: {exc}"
            ) from None
        if not isinstance(wrapped, gym.Env) and not is_multi_agent(wrapped):
            env.close()
            raise EnvBuildError(
                "wrappers",
                spec,
                f"returned a {type(wrapped).__name__}, not a gymnasium.Env or a PettingZoo env",
            )
        env = wrapped
    return env
