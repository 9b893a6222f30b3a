"""Small PettingZoo Parallel envs for the multi-agent tests (importable by actor
processes as ``tests.agent_envs:...``).

:class:`ComingAndGoing`: four possible agents; each episode starts with some of
them and the others appear later; each agent leaves (terminated) after a number
of steps of its own, and whoever is left at ``max_cycles`` is truncated. Each step
an agent sees a one-hot target among three and earns 1 for choosing it, so a shared
policy learns to score 1 per step against 1/3 for a random one. The env keeps a
ledger of every agent step it ran, which the tests hold the slots' rows against.

With ``roles=True`` agents 2 and 3 earn their point for the target's *next* choice
instead: one policy seeing the same observation cannot serve both roles (at best
half the agents score), two policies mapped by role can (the several-policy tests).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from pettingzoo import ParallelEnv

TARGETS = 3


class ComingAndGoing(ParallelEnv):
    """Agents that appear and leave mid-episode (see the module docstring)."""

    metadata = {"name": "coming_and_going_v0", "render_modes": []}

    def __init__(self, max_cycles: int = 12, mask: bool = False, roles: bool = False) -> None:
        self.possible_agents = [f"agent_{i}" for i in range(4)]
        self.shift = {a: int(roles and i >= 2) for i, a in enumerate(self.possible_agents)}
        self.max_cycles = max_cycles
        self.mask = mask
        box = gym.spaces.Box(0.0, 1.0, (TARGETS,), np.float32)
        self._obs_space = (
            gym.spaces.Dict({"obs": box, "action_mask": gym.spaces.MultiBinary(TARGETS)})
            if mask
            else box
        )
        self._act_space = gym.spaces.Discrete(TARGETS)
        self.rng = np.random.default_rng()
        self.agents: list[str] = []
        self.ledger: list[tuple[str, float, bool, bool]] = []  # per agent step
        self.episodes = 0

    def observation_space(self, agent: str) -> gym.Space:
        return self._obs_space

    def action_space(self, agent: str) -> gym.Space:
        return self._act_space

    def _observe(self, agent: str) -> Any:
        target = np.zeros(TARGETS, np.float32)
        target[self.targets[agent]] = 1.0
        if not self.mask:
            return target
        return {"obs": target, "action_mask": np.ones(TARGETS, np.int8)}

    def reset(self, seed: int | None = None, options: Any = None) -> tuple[dict, dict]:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.episodes += 1
        self.cycle = 0
        first = int(self.rng.integers(1, len(self.possible_agents)))
        self.agents = self.possible_agents[:first]
        self.later = {a: int(self.rng.integers(1, 4)) for a in self.possible_agents[first:]}
        self.life = {a: int(self.rng.integers(2, 8)) for a in self.possible_agents}
        self.targets = {a: int(self.rng.integers(TARGETS)) for a in self.possible_agents}
        return {a: self._observe(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        assert set(actions) == set(self.agents), (sorted(actions), self.agents)
        self.cycle += 1
        rewards, terms, truncs = {}, {}, {}
        for agent in self.agents:
            wanted = (self.targets[agent] + self.shift[agent]) % TARGETS
            rewards[agent] = float(int(actions[agent]) == wanted)
            self.life[agent] -= 1
            terms[agent] = self.life[agent] <= 0
            truncs[agent] = self.cycle >= self.max_cycles and not terms[agent]
            self.targets[agent] = int(self.rng.integers(TARGETS))
            self.ledger.append((agent, rewards[agent], terms[agent], truncs[agent]))
        obs = {a: self._observe(a) for a in self.agents}
        self.agents = [a for a in self.agents if not (terms[a] or truncs[a])]
        if self.cycle < self.max_cycles:
            for agent, at in list(self.later.items()):
                if at == self.cycle:
                    del self.later[agent]
                    self.agents.append(agent)
                    obs[agent] = self._observe(agent)
        if not self.agents:
            self.later.clear()
        infos = {a: {} for a in obs}
        return obs, rewards, terms, truncs, infos

    def close(self) -> None:
        pass


def coming_and_going(**kwargs: Any) -> ComingAndGoing:
    """The env factory, as ``--env tests.agent_envs:coming_and_going``."""
    return ComingAndGoing(**kwargs)
