"""Envs that break a promise of the docs in one way each (issue 44 section 5): the
command line must say so in one line, naming the env, not in a traceback.

* ``BadMask-v0``: an ``action_mask`` of 3 entries for ``Discrete(4)`` actions;
* ``WrongShape-v0``: declares ``Box(4,)`` observations and returns 5 numbers;
* ``RaisesAt-v0``: an env that raises ``RuntimeError`` at its ``fail_at``-th step
  (51 by default), counted over every copy in the process: a failure after the actor
  started collecting.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

EPISODE_LENGTH = 20


class BadMaskEnv(gym.Env):
    """See the module docstring."""

    observation_space = gym.spaces.Dict(
        {
            "action_mask": gym.spaces.MultiBinary(3),
            "x": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
        }
    )
    action_space = gym.spaces.Discrete(4)

    def _obs(self) -> dict:
        return {"action_mask": np.ones(3, np.int8), "x": np.zeros(2, np.float32)}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        return self._obs(), {}

    def step(self, action):
        return self._obs(), 0.0, False, False, {}


class WrongShapeEnv(gym.Env):
    """See the module docstring."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        return np.zeros(5, np.float32), {}

    def step(self, action):
        return np.zeros(5, np.float32), 0.0, False, False, {}


STEPS_TAKEN = [0]
"""Steps of every ``RaisesAtEnv`` of this process."""


class RaisesAtEnv(gym.Env):
    """See the module docstring."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, fail_at: int = 51) -> None:
        self.fail_at = int(fail_at)
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        STEPS_TAKEN[0] += 1
        if STEPS_TAKEN[0] >= self.fail_at:
            raise RuntimeError(f"the simulator crashed at step {STEPS_TAKEN[0]}")
        self.t += 1
        return np.zeros(2, np.float32), 0.0, False, self.t >= EPISODE_LENGTH, {}


for _id, _entry in (
    ("BadMask-v0", BadMaskEnv),
    ("WrongShape-v0", WrongShapeEnv),
    ("RaisesAt-v0", RaisesAtEnv),
):
    if _id not in gym.registry:
        gym.register(_id, entry_point=_entry, disable_env_checker=True)
