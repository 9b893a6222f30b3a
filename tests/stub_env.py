"""A deterministic gymnasium env for tests (the reference module's ``StubEnv``).

Observation ``[t, t]`` (the step counter), reward +1 per step, terminated every
5 steps. Importable by id ``"tests.stub_env:Stub-v0"`` from any process whose
working directory is the repository root.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

OBS_DIM = 2
EPISODE_LENGTH = 5


class StubEnv(gym.Env):
    """Counts steps; ends each episode after ``EPISODE_LENGTH`` steps."""

    observation_space = gym.spaces.Box(0.0, np.inf, (OBS_DIM,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self) -> None:
        self.t = 0

    def _obs(self) -> np.ndarray:
        return np.full(OBS_DIM, self.t, np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 1.0, self.t % EPISODE_LENGTH == 0, False, {}


if "Stub-v0" not in gym.registry:
    gym.register("Stub-v0", entry_point=StubEnv, disable_env_checker=True)
