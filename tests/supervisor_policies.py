"""``--factory`` policies that fail on purpose, for tests/test_supervisor.py.

Both build the built-in MLP (same weights, so learner and actors agree) and break
one process on purpose:

* ``tests.supervisor_policies:learner_only`` raises in every actor process (as a
  factory whose module or hardware exists on the learner's host only would): each
  actor dies right after its registration, before it collects anything;
* ``tests.supervisor_policies:crash_once`` raises once per learner process, inside
  update :data:`CRASH_AT_UPDATE` (from ``update_obs_stats``, which the learner calls
  once per update and actors never call): the learner crashes once, and a learner
  resumed in the same process runs on.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Any

import numpy as np

from zmq_rl.config import PolicyConfig
from zmq_rl.rl.policy import ActorCritic, build_policy

CRASH_AT_UPDATE = 6
"""The update (counted in this process) whose ``update_obs_stats`` raises."""
CRASH_MESSAGE = "injected learner crash (tests.supervisor_policies:crash_once)"
ACTOR_MESSAGE = "this policy cannot be built in an actor process (tests.supervisor_policies)"

_calls = 0
_crashed = False


def _in_actor() -> bool:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return getattr(spec, "name", "") == "zmq_rl.cli.actor"


def _mlp(observation_space: Any, action_space: Any, cfg: PolicyConfig) -> ActorCritic:
    return build_policy(observation_space, action_space, replace(cfg, factory=""))


def learner_only(observation_space: Any, action_space: Any, cfg: PolicyConfig) -> ActorCritic:
    """The built-in MLP in the learner; a RuntimeError in an actor process."""
    if _in_actor():
        raise RuntimeError(ACTOR_MESSAGE)
    return _mlp(observation_space, action_space, cfg)


class CrashOnce(ActorCritic):
    """The built-in MLP whose ``update_obs_stats`` raises once in a learner process."""

    def update_obs_stats(self, obs: np.ndarray) -> None:
        global _calls, _crashed
        _calls += 1
        if not _crashed and _calls == CRASH_AT_UPDATE:
            _crashed = True
            raise RuntimeError(CRASH_MESSAGE)
        super().update_obs_stats(obs)


def crash_once(observation_space: Any, action_space: Any, cfg: PolicyConfig) -> ActorCritic:
    """The built-in MLP as a :class:`CrashOnce` (same parameters and buffers)."""
    policy = _mlp(observation_space, action_space, cfg)
    policy.__class__ = CrashOnce
    return policy
