"""``zmq_rl.AgentTeam``: a multi-agent simulator's actor side with agents by name.

A simulator that keys its agents by name (as PettingZoo's Parallel API does) acts and
records with mappings instead of slot arrays::

    with Agent("learner:5555", obs_space, act_space, num_envs=len(names)) as agent:
        team = AgentTeam(agent, names)
        obs = sim.reset()                                  # {name: observation}
        while not agent.shutdown_requested:
            actions = team.act(obs)                        # {name: action}
            obs, rewards, terminated, truncated = sim.step(actions)
            obs = team.observe(obs, rewards, terminated, truncated)
            if not obs:                                    # every agent has left
                obs = sim.reset()

Each possible agent is a slot of the :class:`~zmq_rl.actor.agent.Agent` (slot ``i`` is
``names[i]``; with ``copies`` > 1 simulators stepped together, slot
``c * len(names) + i`` is agent ``i`` of copy ``c``, and every argument and result is
a list of mappings, one per copy). An agent that is not in ``act``'s mapping has no
live agent in its slot: its row is *not valid* (docs/protocol.md section 4.1.4), as
:class:`~zmq_rl.envs.multi_agent.ParallelSlots` does for PettingZoo envs. ``observe`` takes
what the step returned: the observation of every agent after it (the last one of an
agent that ended, and the first of one that appeared), each acting agent's reward
and whether it terminated or was truncated; it returns the observations to act on
next (the agents still there and the newcomers). An agent that acted must either
end (terminated or truncated) or be observed again: one that vanished is a
ValueError naming it, not a silently invented ending.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..envs.multi_agent import stacked
from .agent import Agent

__all__ = ["AgentTeam"]

Named = Mapping[Any, Any]


class AgentTeam:
    """Acting and recording by agent name over an :class:`Agent` (module docstring)."""

    def __init__(self, agent: Agent, possible_agents: Sequence[Any], copies: int = 1) -> None:
        self.agent = agent
        self.names = list(possible_agents)
        self.index = {name: i for i, name in enumerate(self.names)}
        self.copies = int(copies)
        k = len(self.names)
        if not k or len(self.index) != k:
            raise ValueError(f"possible_agents must be distinct names, got {self.names}")
        if agent.num_envs != self.copies * k:
            raise ValueError(
                f"the agent has {agent.num_envs} slots; {self.copies} cop(ies) of "
                f"{k} agents need {self.copies * k} (Agent(..., num_envs={self.copies * k}))"
            )
        self._acting: np.ndarray | None = None  # slots with a live agent at the last act
        self._last: list[Any] = [None] * agent.num_envs  # each slot's newest observation

    def act(self, observations: Named | Sequence[Named]) -> Any:
        """The actions ``{name: action}`` (a list of them with copies) of every agent in
        ``observations`` (``{name: observation}``; a list of them with copies): one
        batched forward for every slot. Slots of agents not named act on a stand-in
        and their rows are not valid."""
        per_copy = self._per_copy(observations, "observations")
        n = self.agent.num_envs
        acting = np.zeros(n, bool)
        for c, named in enumerate(per_copy):
            for name, obs in named.items():
                slot = self._slot(c, name)
                acting[slot], self._last[slot] = True, obs
        if not acting.any():
            raise ValueError("act() with no agent: pass the observation of at least one")
        actions = self.agent.act(self._stacked(acting))
        self._acting = acting
        out = [
            {name: self._unwrap(actions[self._slot(c, name)]) for name in named}
            for c, named in enumerate(per_copy)
        ]
        return out if self.copies > 1 or not isinstance(observations, Mapping) else out[0]

    def observe(
        self,
        observations: Named | Sequence[Named],
        rewards: Named | Sequence[Named],
        terminated: Named | Sequence[Named],
        truncated: Named | Sequence[Named],
    ) -> Any:
        """Record the step of the last :meth:`act`; return ``{name: observation}`` (a
        list with copies) of the agents to act for next: those that acted and go on,
        and newcomers (named in ``observations`` without having acted). A truncated
        agent's observation here is its final one (bootstrapped by the learner)."""
        if self._acting is None:
            raise RuntimeError("observe() without act(): call act() first")
        acting, self._acting = self._acting, None
        parts = [
            self._per_copy(x, what)
            for x, what in (
                (observations, "observations"),
                (rewards, "rewards"),
                (terminated, "terminated"),
                (truncated, "truncated"),
            )
        ]
        n = self.agent.num_envs
        reward = np.zeros(n, np.float32)
        term, trunc = np.zeros(n, bool), np.zeros(n, bool)
        final_obs: dict[int, Any] = {}
        going_on: list[dict[Any, Any]] = []
        for c, (obs, rew, ter, tru) in enumerate(zip(*parts, strict=True)):
            live = {}
            for name, value in obs.items():
                slot = self._slot(c, name)
                if not acting[slot]:  # a newcomer: acts from the next step
                    self._last[slot], live[name] = value, value
                    continue
                self._last[slot] = value
            for slot in np.flatnonzero(acting[c * len(self.names) : (c + 1) * len(self.names)]):
                name, slot = self.names[slot], c * len(self.names) + slot
                reward[slot] = float(rew.get(name, 0.0))
                term[slot], trunc[slot] = bool(ter.get(name, False)), bool(tru.get(name, False))
                if term[slot]:
                    trunc[slot] = False
                elif name not in obs:
                    raise ValueError(
                        f"agent {name!r} (copy {c}) acted but is neither observed again nor "
                        "terminated or truncated: say how its episode ended"
                    )
                elif trunc[slot]:
                    final_obs[slot] = obs[name]
                else:
                    live[name] = obs[name]
            going_on.append(live)
        next_live = np.zeros(n, bool)
        for c, live in enumerate(going_on):
            for name in live:
                next_live[self._slot(c, name)] = True
        self.agent.observe(reward, term, trunc, self._stacked(next_live), final_obs, valid=acting)
        return going_on if self.copies > 1 or isinstance(observations, Sequence) else going_on[0]

    # ------------------------------------------------------------------ helpers

    def _per_copy(self, value: Any, what: str) -> list[Named]:
        """``value`` as one mapping per copy (a mapping alone: the one copy's)."""
        per_copy = [value] if isinstance(value, Mapping) else list(value)
        if len(per_copy) != self.copies or not all(isinstance(v, Mapping) for v in per_copy):
            raise ValueError(f"{what}: expected {self.copies} mapping(s) of agent name -> value")
        return per_copy

    def _slot(self, copy: int, name: Any) -> int:
        if name not in self.index:
            raise ValueError(f"agent {name!r} is not one of the possible agents {self.names}")
        return copy * len(self.names) + self.index[name]

    def _stacked(self, live: np.ndarray) -> Any:
        """Every slot's observation: its agent's where ``live``, else a stand-in (a
        live agent's of the same copy, else the slot's own last, else any): a real
        value of the space, action mask included, whose row is not valid."""
        k, fallback = len(self.names), next(v for v in self._last if v is not None)
        values = []
        for slot in range(self.agent.num_envs):
            copy = range(slot - slot % k, slot - slot % k + k)
            candidates = (
                self._last[slot] if live[slot] else None,
                next((self._last[s] for s in copy if live[s]), None),
                self._last[slot],
                fallback,
            )
            values.append(next(v for v in candidates if v is not None))
        return stacked(values)

    @staticmethod
    def _unwrap(action: np.ndarray) -> Any:
        return action.item() if np.ndim(action) == 0 else action
