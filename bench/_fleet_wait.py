"""The wait per step of ``bench/fleet.py`` for a tree from before ``zmq_rl.envs.StepDelay``
(``--base-tree``): ``--wrapper _fleet_wait:StepDelay(seconds=...)``."""

from __future__ import annotations

import time

import gymnasium as gym


class StepDelay(gym.Wrapper):
    """Sleep ``seconds`` after every step of the env."""

    def __init__(self, env: gym.Env, seconds: float) -> None:
        super().__init__(env)
        self.seconds = seconds

    def step(self, action):  # noqa: D102 (gymnasium's)
        out = self.env.step(action)
        time.sleep(self.seconds)
        return out
