"""The built-in actor: gymnasium envs driven by a :class:`~zmq_rl.actor.agent.Agent`.

It uses only the public embedding API, exactly as a simulator would: env slots step
in lockstep, :meth:`Agent.act` (weights, staleness valve, one batched policy forward)
gives every slot its action, :meth:`Agent.observe` records the step (a fragment per
group of slots every ``fragment_length`` steps).
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from ..config import ActorConfig
from ..envs import make_env
from ..rl.masking import ActionMaskError
from ..rl.policy import Policy, WeightsMismatch, import_weights
from ..seeding import env_seeds
from ..wire.protocol import Weights
from ..wire.spaces import as_value, map_value
from ..wire.transport import CurveClientKeys, load_public_certificate, load_secret_certificate
from .agent import PAUSE_WAIT_S, Agent
from .client import ActorClient, BadExperience

log = logging.getLogger("zmq_rl.actor")


class SpaceMismatch(RuntimeError):
    """The actor's env spaces differ from the learner's."""


class BadEnvValue(ValueError):
    """An env returned NaN or inf (or a reward past the learner's limit, or an
    ``action_mask`` that allows no action), or the policy produced such a value or
    log-prob: the actor stops instead of sending rows the learner would refuse. The
    message names the env id, the slot, the step of the episode and the field
    (observation, reward, final observation)."""


ENV_FIELDS = {
    "next_obs": "observation",
    "final_obs": "final observation (of a truncated episode)",
    "rewards": "reward",
    "obs": "observation",
}
"""What the env returned, by the client's field name (for :class:`BadEnvValue`)."""


def curve_client_keys(cfg: ActorConfig) -> CurveClientKeys | None:
    """The actor's CURVE keys from its config (None when CURVE is off)."""
    if not cfg.curve_secret_key:
        return None
    public, secret = load_secret_certificate(cfg.curve_secret_key, "curve_secret_key")
    server = load_public_certificate(cfg.curve_server_key, "curve_server_key")
    return CurveClientKeys(public=public, secret=secret, server_public=server)


def load_weights(client: ActorClient, policy: Policy, weights: Weights) -> None:
    """Deprecated (the built-in actor is an :class:`~zmq_rl.actor.agent.Agent`, which loads
    weights itself): load broadcast weights into ``policy``; weights whose tensors do
    not fit are rejected (counted by the client) and the old ones stay in use."""
    warnings.warn(
        "zmq_rl.actor.load_weights is deprecated; zmq_rl.Agent loads weights itself",
        DeprecationWarning,
        stacklevel=2,
    )
    try:
        import_weights(policy, weights.tensors)
    except WeightsMismatch as exc:
        client.reject_weights(weights, exc)


def stack(values: list[Any]) -> Any:
    """One batched value (leading dim ``len(values)``) of per-env observations."""
    return map_value(lambda *xs: np.stack(xs), *(as_value(v) for v in values))


class GymActor:
    """One actor process's work: register, then collect until told to stop."""

    def __init__(self, cfg: ActorConfig, context: Any = None) -> None:
        self.cfg = cfg.validate()
        self.context = context

    def run(self) -> dict[str, float]:
        """Run until the learner asks for shutdown; return the actor's stats."""
        cfg = self.cfg
        torch.set_num_threads(cfg.torch_threads)
        spaces: tuple[Any, Any] = (None, None)
        if cfg.env_id:
            with make_env(cfg.env_id) as probe:
                spaces = (probe.observation_space, probe.action_space)
        with Agent(
            cfg.learner,
            *spaces,
            cfg.num_envs,
            seed=cfg.seed,
            env_id=cfg.env_id,
            actor_id=cfg.actor_id,
            context=self.context,
            register_timeout=cfg.register_timeout,
            learner_timeout=cfg.learner_timeout,
            curve=curve_client_keys(cfg),
        ) as agent:
            settings = agent.settings
            env_id = cfg.env_id or settings.env_id
            envs = [
                make_env(env_id, settings.env_kwargs, settings.wrappers)
                for _ in range(agent.num_envs)
            ]
            try:
                return self._collect(agent, env_id, envs)
            finally:
                for env in envs:
                    env.close()

    def _collect(self, agent: Agent, env_id: str, envs: list[gym.Env]) -> dict[str, float]:
        spaces = (envs[0].observation_space, envs[0].action_space)
        if spaces != (agent.observation_space, agent.action_space):
            raise SpaceMismatch(
                f"env {env_id} has spaces {spaces[0]} / {spaces[1]}, the learner's are "
                f"{agent.observation_space} / {agent.action_space}"
            )
        seeds = env_seeds(agent.seed, len(envs))
        obs = stack([env.reset(seed=s)[0] for env, s in zip(envs, seeds, strict=True)])
        log.info(
            "actor %d collecting on %d x %s (seed %d)",
            *(agent.client.actor_id, len(envs), env_id, agent.seed),
        )
        rewards = np.zeros(len(envs), np.float32)
        terminated = np.zeros(len(envs), bool)
        truncated = np.zeros(len(envs), bool)
        episode_steps = np.zeros(len(envs), np.int64)  # steps of each slot's episode
        while not agent.shutdown_requested:
            try:
                actions = agent.act(obs)
            except ActionMaskError as exc:  # the env's observation, not the policy
                raise BadEnvValue(
                    f"env {env_id} returned an observation that allows no action: {exc}"
                ) from None
            final_obs, next_obs = {}, []
            for j, env in enumerate(envs):
                action = actions[j].item() if actions[j].ndim == 0 else actions[j]
                o, rewards[j], terminated[j], truncated[j], _ = env.step(action)
                episode_steps[j] += 1
                if terminated[j] or truncated[j]:
                    if not terminated[j]:
                        final_obs[j] = o
                    o, _ = env.reset()
                next_obs.append(o)
            obs = stack(next_obs)
            try:
                agent.observe(rewards, terminated, truncated, obs, final_obs)
            except BadExperience as exc:
                ended = terminated | truncated
                raise self._bad_env_value(exc, env_id, episode_steps, ended) from None
            episode_steps[terminated | truncated] = 0
        return dict(agent.stats)

    @staticmethod
    def _bad_env_value(
        exc: BadExperience, env_id: str, episode_steps: np.ndarray, ended: np.ndarray
    ) -> BadEnvValue:
        """The error naming the env, slot, episode step and field of ``exc``; a reset
        observation (of an episode that just ended) is named as such."""
        slot, field = exc.slot, ENV_FIELDS.get(exc.field, exc.field)
        if exc.field not in ENV_FIELDS:  # values, log-probs, actions: the policy's
            return BadEnvValue(f"the policy acting on env {env_id} produced {exc}")
        if exc.field == "next_obs" and ended[slot]:
            field, step = "reset observation", 0
        else:
            step = int(episode_steps[slot])
        detail = str(exc).split(": ", 1)[1]
        return BadEnvValue(
            f"env {env_id} returned a non-finite or out-of-range {field} in slot {slot} at "
            f"step {step} of its episode ({exc.step} steps of that slot since the welcome): "
            f"{detail}"
        )


__all__ = ["PAUSE_WAIT_S", "BadEnvValue", "GymActor", "SpaceMismatch", "env_seeds", "load_weights"]
