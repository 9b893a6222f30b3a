"""The env ids that importing :mod:`zmq_rl.envs` registers: preprocessed Atari games,
CartPole without its velocities, and MinAtar.

Atari: ``--env zmq_rl.envs:AtariPong-v0``.

Importing :mod:`zmq_rl.envs` registers ``Atari<Game>-v0`` for the usual Atari games
(:data:`GAMES`; :func:`register_game` adds others). gymnasium's ``"module:Id"``
form imports the module first, so the id works from any process -- the learner,
every actor, ``zmq-rl eval`` -- with nothing else to set up::

    zmq-rl run --env zmq_rl.envs:AtariPong-v0 --factory zmq_rl.rl.cnn:nature_cnn ...

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

``zmq_rl.envs:MaskedCartPole-v1`` (:class:`MaskVelocity`) and
``zmq_rl.envs:MinAtar<Game>-v1`` (:func:`make_minatar`) are registered the same way.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

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
