"""What a learner tells its actors, and how its loop ends early.

:func:`run_settings` is the welcome's ``config`` (every actor of a run obeys it);
:class:`LearnerStarved` and :class:`StopRequested` end a learner's loop. Shared by the
learner (:mod:`zmq_rl.learner.loop`), its other ranks (:mod:`zmq_rl.learner.ranks`)
and the conformance tool, so none of them imports another for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import gymnasium as gym

from ..config import (
    ConfigError,
    LearnerConfig,
    PolicyConfig,
    parse_policy_hidden_sizes,
    parse_policy_map,
    resolve_policy_map,
)
from ..envs import EnvShape
from ..wire.protocol import RunSettings
from .checkpoint import config_dict
from .ingest import fragment_limit

__all__ = [
    "HEARTBEAT_INTERVAL_S",
    "LearnerStarved",
    "PolicyPlan",
    "StopRequested",
    "policy_plan",
    "run_settings",
]

HEARTBEAT_INTERVAL_S = 1.0
"""How often the learner and its actors send heartbeats (RunSettings.heartbeat_interval)."""


class LearnerStarved(RuntimeError):
    """No rollout could be completed within ``starvation_timeout``."""


class StopRequested(Exception):
    """Raised inside the loop when :meth:`Learner.request_stop` was called."""


@dataclass(frozen=True)
class PolicyPlan:
    """The policies of a run: ``agent_policies`` (the policy id of each agent index)
    and ``configs`` (each policy's network, in order of first appearance). Empty for
    the usual run of one policy shared by every agent."""

    agent_policies: list[str] = field(default_factory=list)
    configs: dict[str, PolicyConfig] = field(default_factory=dict)

    @property
    def several(self) -> bool:
        """Whether the run trains more than one policy."""
        return len(self.configs) > 1


def policy_plan(cfg: LearnerConfig, policy_cfg: PolicyConfig, shape: EnvShape) -> PolicyPlan:
    """The run's :class:`PolicyPlan` from ``policy_map`` and ``policy_hidden_sizes``
    against the env's agents. A :class:`ConfigError` names what is wrong, before any
    socket or process: a map on a single-agent env, an agent without a policy, an
    entry that maps no agent, and what several policies cannot be combined with yet
    (an opponent pool, learner ranks, recurrent or custom networks)."""
    entries = parse_policy_map(cfg.policy_map)
    if not entries:
        return PolicyPlan()
    if not shape.agents:
        raise ConfigError(
            "policy_map", cfg.policy_map, f"{cfg.env_id} is a single-agent env: nothing to map"
        )
    agent_policies = resolve_policy_map(entries, list(shape.agents), cfg.env_id)
    ids = list(dict.fromkeys(agent_policies))
    if len(ids) == 1:
        return PolicyPlan()  # every agent maps to one policy: the shared-policy run
    for name, value, why in (
        ("opponent_pool", cfg.opponent_pool, "snapshot opponents are self-play of one policy"),
        ("num_learners", cfg.num_learners, "several policies train on one learner rank"),
    ):
        if value not in (0, 1):
            raise ConfigError(name, value, f"cannot be combined with policy_map: {why}")
    if policy_cfg.policy_type != "mlp" or policy_cfg.factory:
        raise ConfigError(
            "policy_map",
            cfg.policy_map,
            "several policies need the built-in feed-forward network for now "
            f"(policy_type={policy_cfg.policy_type!r}, factory={policy_cfg.factory!r})",
        )
    sizes = parse_policy_hidden_sizes(cfg.policy_hidden_sizes)
    configs = {
        pid: replace(policy_cfg, hidden_sizes=sizes.get(pid, policy_cfg.hidden_sizes)).validate()
        for pid in ids
    }
    return PolicyPlan(agent_policies, configs)


def run_settings(
    cfg: LearnerConfig,
    observation_space: gym.Space,
    action_space: gym.Space,
    policy_cfg: PolicyConfig,
    *,
    weights_bytes: int = 0,
    state_size: int = 0,
    agents_per_env: int = 1,
    plan: PolicyPlan | None = None,
) -> RunSettings:
    """The settings every actor of this run obeys (the welcome's ``config``), with
    ``num_envs`` the default an actor gets when its hello asks for none.

    ``weights_bytes`` is the encoded size of this run's weights message: actors must
    accept twice that (plus 64 KB) on their SUB socket. ``state_size`` is the policy's
    recurrent state per slot (0 for a feed-forward policy). ``plan``: the policies
    of a several-policy run (``policy_map``, ``policies``)."""
    several = plan is not None and plan.several
    return RunSettings(
        env_id=cfg.env_id,
        observation_space=observation_space,
        action_space=action_space,
        policy=config_dict(next(iter(plan.configs.values())) if several else policy_cfg),
        num_steps=cfg.num_steps,
        broadcast_every=cfg.broadcast_every,
        steps_per_broadcast=cfg.steps_per_broadcast(),
        max_lead_steps=cfg.effective_max_lead_steps(),
        fragment_length=cfg.fragment_length,
        num_envs=cfg.num_envs * agents_per_env,
        seed=cfg.seed,
        heartbeat_interval=HEARTBEAT_INTERVAL_S,
        state_size=state_size,
        max_weights_bytes=2 * weights_bytes + 64 * 1024,
        max_fragment_bytes=fragment_limit(cfg, observation_space, action_space),
        env_kwargs=cfg.env_kwargs_map(),
        wrappers=list(cfg.wrappers),
        agents_per_env=agents_per_env,
        opponent_pool=cfg.opponent_pool,
        opponent_every=cfg.opponent_every,
        opponent_share=float(cfg.opponent_share),
        opponent_choice=cfg.opponent_choice,
        opening_moves=cfg.opening_moves,
        policy_map=list(plan.agent_policies) if several else [],
        policies={pid: config_dict(c) for pid, c in plan.configs.items()} if several else {},
    )
