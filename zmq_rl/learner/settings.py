"""What a learner tells its actors, and how its loop ends early.

:func:`run_settings` is the welcome's ``config`` (every actor of a run obeys it);
:class:`LearnerStarved` and :class:`StopRequested` end a learner's loop. Shared by the
learner (:mod:`zmq_rl.learner.loop`), its other ranks (:mod:`zmq_rl.learner.ranks`)
and the conformance tool, so none of them imports another for them.
"""

from __future__ import annotations

import gymnasium as gym

from ..config import LearnerConfig, PolicyConfig
from ..wire.protocol import RunSettings, largest_fragment_bytes
from .checkpoint import config_dict

__all__ = ["HEARTBEAT_INTERVAL_S", "LearnerStarved", "StopRequested", "run_settings"]

HEARTBEAT_INTERVAL_S = 1.0
"""How often the learner and its actors send heartbeats (RunSettings.heartbeat_interval)."""


class LearnerStarved(RuntimeError):
    """No rollout could be completed within ``starvation_timeout``."""


class StopRequested(Exception):
    """Raised inside the loop when :meth:`Learner.request_stop` was called."""


def run_settings(
    cfg: LearnerConfig,
    observation_space: gym.Space,
    action_space: gym.Space,
    policy_cfg: PolicyConfig,
    *,
    weights_bytes: int = 0,
    state_size: int = 0,
    agents_per_env: int = 1,
) -> RunSettings:
    """The settings every actor of this run obeys (the welcome's ``config``), with
    ``num_envs`` the default an actor gets when its hello asks for none.

    ``weights_bytes`` is the encoded size of this run's weights message: actors must
    accept twice that (plus 64 KB) on their SUB socket. ``state_size`` is the policy's
    recurrent state per slot (0 for a feed-forward policy)."""
    return RunSettings(
        env_id=cfg.env_id,
        observation_space=observation_space,
        action_space=action_space,
        policy=config_dict(policy_cfg),
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
        max_fragment_bytes=cfg.max_message_bytes
        or largest_fragment_bytes(observation_space, action_space, cfg.fragment_length),
        env_kwargs=cfg.env_kwargs_map(),
        wrappers=list(cfg.wrappers),
        agents_per_env=agents_per_env,
        opponent_pool=cfg.opponent_pool,
        opponent_every=cfg.opponent_every,
        opponent_share=float(cfg.opponent_share),
    )
