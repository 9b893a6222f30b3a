"""The built-in actor: gymnasium envs + a local policy copy, on :class:`ActorClient`.

It uses only the public client API, exactly as an embedding simulator would.
Env slots step in lockstep with one batched policy forward per step. The loop:

1. handle control and load the newest weights (non-blocking poll);
2. if the staleness valve says so, wait for weights (50 ms at a time, so a
   shutdown is noticed) and go back to 1;
3. act on every slot, step every env, hand the step to the client (which sends a
   fragment per slot every ``fragment_length`` steps).
"""

from __future__ import annotations

import logging
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from .client import ActorClient
from .config import ActorConfig
from .networks import batch_obs, obs_tensor
from .policy import (
    Policy,
    WeightsMismatch,
    build_policy,
    import_weights,
    is_recurrent,
    policy_config_from,
)
from .protocol import Weights, Welcome
from .seeding import env_seeds
from .spaces import env_actions, map_value
from .transport import CurveClientKeys, load_public_certificate, load_secret_certificate

log = logging.getLogger(__name__)

PAUSE_WAIT_S = 0.05
"""How long a paused actor blocks on SUB before re-checking control: short, so a
shutdown or a learner restart is noticed within a step's time."""


class SpaceMismatch(RuntimeError):
    """The actor's env spaces differ from the learner's."""


def curve_client_keys(cfg: ActorConfig) -> CurveClientKeys | None:
    """The actor's CURVE keys from its config (None when CURVE is off)."""
    if not cfg.curve_secret_key:
        return None
    public, secret = load_secret_certificate(cfg.curve_secret_key, "curve_secret_key")
    server = load_public_certificate(cfg.curve_server_key, "curve_server_key")
    return CurveClientKeys(public=public, secret=secret, server_public=server)


def load_weights(client: ActorClient, policy: Policy, weights: Weights) -> None:
    """Load broadcast weights into the policy; weights whose tensors do not fit the
    network are rejected (counted by the client) and the old ones stay in use."""
    try:
        import_weights(policy, weights.tensors)
    except WeightsMismatch as exc:
        client.reject_weights(weights, exc)


class GymActor:
    """One actor process's work: register, then collect until told to stop."""

    def __init__(self, cfg: ActorConfig, context: Any = None) -> None:
        self.cfg = cfg.validate()
        self.context = context

    def run(self) -> dict[str, float]:
        """Run until the learner asks for shutdown; return the actor's stats."""
        cfg = self.cfg
        torch.set_num_threads(cfg.torch_threads)
        probe = gym.make(cfg.env_id) if cfg.env_id else None
        client = ActorClient(
            cfg.learner,
            env_id=cfg.env_id,
            observation_space=probe.observation_space if probe else None,
            action_space=probe.action_space if probe else None,
            num_envs=cfg.num_envs,
            actor_id=cfg.actor_id,
            context=self.context,
            register_timeout=cfg.register_timeout,
            learner_timeout=cfg.learner_timeout,
            curve=curve_client_keys(cfg),
        )
        if probe is not None:
            probe.close()
        try:
            welcome = client.register()
            return self._collect(client, welcome)
        finally:
            client.close()

    def _collect(self, client: ActorClient, welcome: Welcome) -> dict[str, float]:
        cfg = self.cfg
        settings = welcome.settings
        env_id = cfg.env_id or settings.env_id
        num_envs = client.num_envs
        envs = [gym.make(env_id) for _ in range(num_envs)]
        obs_space, act_space = settings.observation_space, settings.action_space
        if envs[0].observation_space != obs_space or envs[0].action_space != act_space:
            raise SpaceMismatch(
                f"env {env_id} has spaces {envs[0].observation_space} / "
                f"{envs[0].action_space}, the learner's are {obs_space} / {act_space}"
            )
        policy = build_policy(obs_space, act_space, policy_config_from(settings))
        policy.eval()
        import_weights(policy, welcome.weights.tensors)
        scalar = isinstance(act_space, gym.spaces.Discrete)
        seed = cfg.seed if cfg.seed >= 0 else settings.seed + 1 + client.actor_id
        generator = torch.Generator().manual_seed(seed)
        recurrent = is_recurrent(policy)
        state = policy.initial_state(num_envs) if recurrent else None
        obs = batch_obs(
            obs_space,
            [env.reset(seed=s)[0] for env, s in zip(envs, env_seeds(seed, num_envs), strict=True)],
        )
        log.info(
            "actor %d collecting on %d x %s (seed %d)", client.actor_id, num_envs, env_id, seed
        )
        rewards = np.zeros(num_envs, np.float32)
        terminated = np.zeros(num_envs, bool)
        truncated = np.zeros(num_envs, bool)
        next_obs: list[Any] = [None] * num_envs
        with torch.inference_mode():
            while True:
                weights = client.poll()
                if weights is not None:
                    load_weights(client, policy, weights)
                if client.shutdown_requested:
                    break
                if client.should_pause():
                    weights = client.wait_for_weights(PAUSE_WAIT_S)
                    if weights is not None:
                        load_weights(client, policy, weights)
                    continue
                if recurrent:
                    action_t, log_prob_t, value_t, next_state = policy.act_recurrent(
                        obs_tensor(obs), state, generator
                    )
                else:
                    action_t, log_prob_t, value_t = policy.act(obs_tensor(obs), generator)
                actions = action_t.numpy()
                to_env = env_actions(act_space, actions)
                final_obs = {}
                for j, env in enumerate(envs):
                    o, r, term, trunc, _ = env.step(to_env[j].item() if scalar else to_env[j])
                    rewards[j], terminated[j], truncated[j] = r, term, trunc
                    if term or trunc:
                        if trunc and not term:
                            final_obs[j] = batch_obs(obs_space, [o])
                        o, _ = env.reset()
                    next_obs[j] = o
                if final_obs:
                    final_obs = {j: map_value(lambda a: a[0], v) for j, v in final_obs.items()}
                stacked = batch_obs(obs_space, next_obs)
                client.step(
                    obs,
                    actions,
                    rewards,
                    terminated,
                    truncated,
                    value_t.numpy(),
                    log_prob_t.numpy(),
                    stacked,
                    final_obs,
                    state=None if state is None else state.numpy(),
                )
                if recurrent:
                    # The state each slot acts from next: zeros where an episode began.
                    state = next_state * torch.from_numpy(~(terminated | truncated))[:, None]
                obs = stacked
        for env in envs:
            env.close()
        return dict(client.stats)


__all__ = ["GymActor", "SpaceMismatch", "env_seeds", "load_weights"]
