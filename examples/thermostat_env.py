"""The thermostat room as a gymnasium env, for the *learner* side only.

A zmq_rl learner is configured with a gymnasium id: it reads the observation and
action spaces from it (to build the policy and to check each actor's spaces) and
runs its evaluations on it. The simulator in :mod:`examples.thermostat_sim` never
uses this class; it drives :class:`~examples.thermostat_physics.Building` from its
own main loop. Both share :mod:`examples.thermostat_physics`, so the learner
evaluates on the same physics.

Id: ``examples.thermostat_env:Thermostat-v0`` (importable from the repository root).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from examples.thermostat_physics import POWER_LEVELS_KW, Room
from examples.thermostat_sim import ACTION_SPACE, OBSERVATION_SPACE


class ThermostatEnv(gym.Env):
    """One room for one hour; truncated (never terminated) after the hour."""

    observation_space = OBSERVATION_SPACE
    action_space = ACTION_SPACE

    def __init__(self) -> None:
        self.room = Room(np.random.default_rng())

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.room.rng = self.np_random
        self.room.reset()
        return self.room.observe(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        reward = self.room.advance(POWER_LEVELS_KW[int(action)])
        return self.room.observe(), reward, False, self.room.hour_over, {}


if "Thermostat-v0" not in gym.registry:
    gym.register("Thermostat-v0", entry_point=ThermostatEnv, disable_env_checker=True)
