"""The delivery floor as a PettingZoo Parallel env, for the *learner* side only.

A zmq_rl learner is configured with an env: for a multi-agent one it reads each
agent's spaces and the number of possible agents from it (a slot each), and runs
its evaluations on it. The simulator in :mod:`examples.couriers_sim` never uses this
class; both drive :class:`~examples.couriers_physics.Floor`, so the learner evaluates
on the same dynamics.

Env: ``examples.couriers_env:couriers`` (importable from the repository root).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from pettingzoo import ParallelEnv

from examples.couriers_physics import MOVES, ROBOTS, Floor

OBSERVATION_SPACE = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACTION_SPACE = gym.spaces.Discrete(len(MOVES))
AGENTS = [f"robot_{i}" for i in range(ROBOTS)]


class CouriersEnv(ParallelEnv):
    """One floor for one shift; each robot is an agent that leaves on delivery."""

    metadata = {"name": "couriers_v0", "render_modes": []}

    def __init__(self) -> None:
        self.possible_agents = list(AGENTS)
        self.floor = Floor(np.random.default_rng())
        self.agents: list[str] = []

    def observation_space(self, agent: str) -> gym.Space:
        return OBSERVATION_SPACE

    def action_space(self, agent: str) -> gym.Space:
        return ACTION_SPACE

    def _observations(self) -> dict[str, np.ndarray]:
        return {AGENTS[i]: r.observe() for i, r in enumerate(self.floor.robots) if r is not None}

    def reset(self, seed: int | None = None, options: Any = None) -> tuple[dict, dict]:
        if seed is not None:
            self.floor.rng = np.random.default_rng(seed)
        self.floor.start_shift()
        obs = self._observations()
        self.agents = list(obs)
        return obs, {a: {} for a in obs}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        moved = self.floor.tick({AGENTS.index(a): int(m) for a, m in actions.items()})
        rewards = {AGENTS[i]: r for i, (r, _, _, _) in moved.items()}
        terms = {AGENTS[i]: d for i, (_, d, _, _) in moved.items()}
        truncs = {AGENTS[i]: g for i, (_, _, g, _) in moved.items()}
        obs = {AGENTS[i]: o for i, (_, _, _, o) in moved.items()} | self._observations()
        self.agents = [] if self.floor.over else list(self._observations())
        return obs, rewards, terms, truncs, {a: {} for a in obs}


def couriers() -> CouriersEnv:
    """The env factory (``--env examples.couriers_env:couriers``)."""
    return CouriersEnv()
