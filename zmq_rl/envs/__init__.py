"""Environments: building one as every process of a run does, and the env ids zmq_rl
registers.

- :mod:`~zmq_rl.envs.factory`: :func:`make_env`, :func:`build_env`, :func:`env_shape`
  (a gymnasium id, ``module:Id``, a user's ``module.path:EnvClass`` or a PettingZoo
  env; :class:`EnvBuildError` names what fails);
- :mod:`~zmq_rl.envs.catalog`: preprocessed Atari games, ``MaskedCartPole-v1`` and
  MinAtar, registered when this package is imported, so ``zmq_rl.envs:AtariPong-v0``
  works as an env id from any process;
- :mod:`~zmq_rl.envs.multi_agent`: PettingZoo envs as slots (ParallelSlots,
  TurnSlots);
- :mod:`~zmq_rl.envs.seeding`: the seeds of a process's envs (actors and evaluation);
- :mod:`~zmq_rl.envs.baselines`: scripted players of turn-based games;
- :mod:`~zmq_rl.envs.stepping`: stepping several envs at once, in threads when their
  steps wait; :mod:`~zmq_rl.envs.waiting`: :class:`StepDelay`, a simulator's wait per
  step (``--wrapper 'zmq_rl.envs:StepDelay(seconds=0.01)'``).

Imports the wire (multi-agent envs as slots of step arrays) and the settings; beside
``rl``, below the actor and the learner (docs/design.md, "The layout").
"""

from __future__ import annotations

from ..config import parse_env_kwargs
from .catalog import (
    FRAME_SKIP,
    FRAME_STACK,
    GAMES,
    MASKED_CARTPOLE,
    MINATAR_GAMES,
    NOOP_MAX,
    SCREEN_SIZE,
    AtariUnavailable,
    MaskVelocity,
    MinAtarFrames,
    MinAtarUnavailable,
    env_id,
    make_atari,
    make_masked_cartpole,
    make_minatar,
    register_game,
)
from .factory import EnvBuildError, EnvShape, build_env, env_shape, import_callable, make_env
from .stepping import EnvStepper
from .waiting import StepDelay

__all__ = [
    "FRAME_SKIP",
    "FRAME_STACK",
    "GAMES",
    "MASKED_CARTPOLE",
    "MINATAR_GAMES",
    "NOOP_MAX",
    "SCREEN_SIZE",
    "StepDelay",
    "AtariUnavailable",
    "EnvBuildError",
    "EnvShape",
    "EnvStepper",
    "MaskVelocity",
    "MinAtarFrames",
    "MinAtarUnavailable",
    "build_env",
    "env_id",
    "env_shape",
    "import_callable",
    "make_atari",
    "make_env",
    "make_masked_cartpole",
    "make_minatar",
    "parse_env_kwargs",
    "register_game",
]
