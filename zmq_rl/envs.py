"""Making environments (:func:`make_env`), and preprocessed Atari ids.

:func:`make_env` is how every process of a run builds its env -- the learner's
probe, each actor, the evaluator, ``zmq-rl eval``/``export`` -- from the same three
settings: the env (a gymnasium id, ``module:Id``, or a user's own
``module.path:EnvClass`` / ``module.path:make_fn``), the keyword arguments of
``gym.make`` (``--env-kwargs``) and gymnasium wrappers by import path
(``--wrapper module:Wrapper``, applied in order). A failure is an
:class:`EnvBuildError` naming the env id and the reason.

Atari: ``--env zmq_rl.envs:AtariPong-v0``.

Importing this module registers ``Atari<Game>-v0`` for the usual Atari games
(:data:`GAMES`; :func:`register_game` adds others). gymnasium's ``"module:Id"``
form imports the module first, so the id works from any process -- the learner,
every actor, ``zmq-rl eval`` -- with nothing else to set up::

    zmq-rl run --env zmq_rl.envs:AtariPong-v0 --factory zmq_rl.cnn:nature_cnn ...

Each id is the ALE ``ALE/<Game>-v5`` env with ``frameskip=1`` (the skipping is done
by the wrapper, which max-pools the last two frames) wrapped in gymnasium's
``AtariPreprocessing`` (84x84 grayscale, ``frame_skip=4``, up to 30 no-op actions
at reset, ``terminal_on_life_loss=False``, no scaling: observations stay uint8)
and ``FrameStackObservation(4)``. The observation space is ``Box(0, 255, (4, 84,
84), uint8)``; actions are the game's minimal action set. The v5 defaults apply
otherwise: sticky actions with ``repeat_action_probability=0.25`` (Machado et
al. 2018) and at most 108,000 frames per episode; keyword arguments of
``gym.make`` override them (``gym.make("zmq_rl.envs:AtariPong-v0",
repeat_action_probability=0.0)``) and reach :func:`make_atari`.

ale-py (whose wheels carry the ROMs) and OpenCV (for the resize) are optional
dependencies: ``pip install 'zmq_rl[atari]'``. Without them the ids are still
registered, and making one raises :class:`AtariUnavailable` saying what to install.
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
import numpy as np

from .config import ConfigError, parse_env_kwargs, parse_wrapper, wrapper_spec
from .multi_agent import (
    AgentSpaceMismatch,
    agent_spaces,
    is_multi_agent,
    is_turn_based,
    to_parallel,
)

__all__ = [
    "FRAME_STACK",
    "GAMES",
    "SCREEN_SIZE",
    "AtariUnavailable",
    "EnvBuildError",
    "EnvShape",
    "build_env",
    "env_shape",
    "env_id",
    "make_atari",
    "make_env",
    "parse_env_kwargs",
    "register_game",
    "MASKED_CARTPOLE",
    "MaskVelocity",
    "make_masked_cartpole",
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
            "is a multi-agent (PettingZoo) env: this command runs single-agent envs "
            "(training runs it: docs/multi_agent.md)",
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
    multi-agent PettingZoo env under the Parallel API (:mod:`zmq_rl.multi_agent`).

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
      turn-based games stay AEC envs (:class:`~zmq_rl.multi_agent.TurnSlots`).

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


SCREEN_SIZE = 84
FRAME_STACK = 4
FRAME_SKIP = 4
NOOP_MAX = 30

GAMES = (
    "Alien",
    "Amidar",
    "Assault",
    "Asterix",
    "Asteroids",
    "Atlantis",
    "BankHeist",
    "BattleZone",
    "BeamRider",
    "Berzerk",
    "Bowling",
    "Boxing",
    "Breakout",
    "Centipede",
    "ChopperCommand",
    "CrazyClimber",
    "Defender",
    "DemonAttack",
    "DoubleDunk",
    "Enduro",
    "FishingDerby",
    "Freeway",
    "Frostbite",
    "Gopher",
    "Gravitar",
    "Hero",
    "IceHockey",
    "Jamesbond",
    "Kangaroo",
    "Krull",
    "KungFuMaster",
    "MontezumaRevenge",
    "MsPacman",
    "NameThisGame",
    "Phoenix",
    "Pitfall",
    "Pong",
    "PrivateEye",
    "Qbert",
    "Riverraid",
    "RoadRunner",
    "Robotank",
    "Seaquest",
    "Skiing",
    "Solaris",
    "SpaceInvaders",
    "StarGunner",
    "Surround",
    "Tennis",
    "TimePilot",
    "Tutankham",
    "UpNDown",
    "Venture",
    "VideoPinball",
    "WizardOfWor",
    "YarsRevenge",
    "Zaxxon",
)
"""The 57 games of the Atari benchmark (Badia et al. 2020), by their ALE v5 names."""


class AtariUnavailable(ImportError):
    """ale-py (the Arcade Learning Environment) is not installed."""


def env_id(game: str) -> str:
    """The id this module registers for ``game`` (``"Pong"`` -> ``"AtariPong-v0"``)."""
    return f"Atari{game}-v0"


def _load_ale() -> None:
    try:
        import ale_py
    except ImportError as exc:
        raise AtariUnavailable(
            "Atari environments need ale-py (the Arcade Learning Environment, whose wheels "
            "include the game ROMs): pip install ale-py, or pip install 'zmq_rl[atari]' "
            f"({exc})"
        ) from exc
    try:
        import cv2  # noqa: F401  (AtariPreprocessing resizes with OpenCV)
    except ImportError as exc:
        raise AtariUnavailable(
            "Atari preprocessing needs OpenCV: pip install opencv-python-headless, or pip "
            f"install 'zmq_rl[atari]' ({exc})"
        ) from exc
    gym.register_envs(ale_py)


def make_atari(
    game: str,
    *,
    frame_skip: int = FRAME_SKIP,
    noop_max: int = NOOP_MAX,
    frame_stack: int = FRAME_STACK,
    screen_size: int = SCREEN_SIZE,
    terminal_on_life_loss: bool = False,
    render_mode: str | None = None,
    **ale_kwargs: Any,
) -> gym.Env:
    """``ALE/<game>-v5`` (``frameskip=1``) + ``AtariPreprocessing`` + ``FrameStackObservation``.

    ``ale_kwargs`` go to the ALE env (e.g. ``repeat_action_probability``,
    ``full_action_space``, ``max_num_frames_per_episode``). Raises
    :class:`AtariUnavailable` when ale-py is missing.
    """
    _load_ale()
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    env = gym.make(f"ALE/{game}-v5", frameskip=1, render_mode=render_mode, **ale_kwargs)
    env = AtariPreprocessing(
        env,
        noop_max=noop_max,
        frame_skip=frame_skip,
        screen_size=screen_size,
        terminal_on_life_loss=terminal_on_life_loss,
        grayscale_obs=True,
        grayscale_newaxis=False,
        scale_obs=False,
    )
    env = FrameStackObservation(env, frame_stack)
    space = env.observation_space
    assert space.dtype == np.uint8 and space.shape == (frame_stack, screen_size, screen_size)
    return env


def register_game(game: str) -> str:
    """Register ``Atari<game>-v0`` (if not yet registered); return the id."""
    name = env_id(game)
    if name not in gym.registry:
        gym.register(id=name, entry_point=make_atari, kwargs={"game": game})
    return name


for _game in GAMES:
    register_game(_game)


# --------------------------------------------------------------------------- partial observability


class MaskVelocity(gym.ObservationWrapper):
    """CartPole without its velocities: the observation is ``[x, theta]`` (cart
    position and pole angle), so a policy must infer the velocities from the history
    -- a memoryless policy cannot balance the pole for long, a recurrent one can
    (the "CartPole-NoVel" task of the RecurrentPPO benchmarks).

    ``gym.make("zmq_rl.envs:MaskedCartPole-v1")`` is ``CartPole-v1`` (500 steps at
    most) under this wrapper; observations are float32 ``Box((2,))``.
    """

    KEEP = (0, 2)
    """Indices of CartPole's ``[x, x_dot, theta, theta_dot]`` that are kept."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        inner = env.observation_space
        keep = list(self.KEEP)
        self.observation_space = gym.spaces.Box(
            inner.low[keep], inner.high[keep], (len(keep),), np.float32
        )

    def observation(self, observation: np.ndarray) -> np.ndarray:
        """The kept components, float32."""
        return np.asarray(observation, np.float32)[list(self.KEEP)]


def make_masked_cartpole(**kwargs: Any) -> gym.Env:
    """``CartPole-v1`` with its velocities masked (:class:`MaskVelocity`)."""
    return MaskVelocity(gym.make("CartPole-v1", **kwargs))


MASKED_CARTPOLE = "MaskedCartPole-v1"
if MASKED_CARTPOLE not in gym.registry:
    gym.register(id=MASKED_CARTPOLE, entry_point=make_masked_cartpole)


# --------------------------------------------------------------------------- MinAtar (pixels)

MINATAR_GAMES = ("Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders")
"""The MinAtar games (Young & Tian 2019, "MinAtar: An Atari-Inspired Testbed for
Thorough and Reproducible Reinforcement Learning Experiments")."""


class MinAtarUnavailable(ImportError):
    """MinAtar is not installed (``pip install 'zmq_rl[pixels]'``)."""


class MinAtarFrames(gym.ObservationWrapper):
    """MinAtar's ``[10, 10, C]`` bool observation as uint8 0/1, channels first
    (``[C, 10, 10]``): one byte per cell on the wire, the layout torch convolves."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        h, w, c = env.observation_space.shape
        self.observation_space = gym.spaces.Box(0, 1, (c, h, w), np.uint8)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        """``[H, W, C]`` bool -> ``[C, H, W]`` uint8."""
        return np.ascontiguousarray(np.asarray(observation, np.uint8).transpose(2, 0, 1))


def make_minatar(game: str, max_episode_steps: int = 10_000, **kwargs: Any) -> gym.Env:
    """MinAtar ``game`` with its minimal action set, frames as :class:`MinAtarFrames`,
    truncated after ``max_episode_steps`` (MinAtar itself has no time limit; Seaquest
    and Freeway end by themselves, a good Breakout player might not)."""
    try:
        from minatar.gym import BaseEnv
    except ImportError as exc:
        raise MinAtarUnavailable(
            f"MinAtar{game}-v1 needs the minatar package: pip install 'zmq_rl[pixels]' ({exc})"
        ) from exc
    snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in game).lstrip("_")
    env = BaseEnv(snake, use_minimal_action_set=True, **kwargs)
    return gym.wrappers.TimeLimit(MinAtarFrames(env), max_episode_steps)


for _game in MINATAR_GAMES:
    if f"MinAtar{_game}-v1" not in gym.registry:
        gym.register(id=f"MinAtar{_game}-v1", entry_point=make_minatar, kwargs={"game": _game})
