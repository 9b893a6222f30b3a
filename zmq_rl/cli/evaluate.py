"""``zmq-rl eval``: load a saved policy and measure it on fresh episodes.

The learner saves ``policy.pt`` as plain tensors plus the JSON policy config and
env id (:meth:`zmq_rl.learner.Learner.save_policy`), so it is loaded with
``torch.load(weights_only=True)``: nothing is unpickled beyond tensors and
primitive values.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zmq_rl.config import PolicyConfig

from .common import CliFailure, ensure_env_importable

log = logging.getLogger(__name__)

__all__ = ["LoadedPolicy", "evaluate", "load_policy", "policy_path", "record_episodes"]

POLICY_NAME = "policy.pt"


@dataclass
class LoadedPolicy:
    """A policy rebuilt from ``policy.pt``."""

    policy: Any
    env_id: str
    version: int
    config: PolicyConfig
    path: Path


def policy_path(target: str | Path) -> Path:
    """``RUN_DIR`` -> ``RUN_DIR/policy.pt``; a file path is returned as is."""
    path = Path(target)
    if path.is_dir():
        path = path / POLICY_NAME
    if not path.is_file():
        raise CliFailure(
            f"{path}: no such policy file (a run writes {POLICY_NAME} when it ends; "
            "an interrupted run has none)"
        )
    return path


def load_policy(target: str | Path, env_id: str = "") -> LoadedPolicy:
    """Rebuild the actor-critic saved at ``target`` (a run dir or a ``policy.pt``).

    ``env_id`` overrides the saved env id (e.g. a variant with the same spaces).
    """
    import gymnasium as gym
    import torch

    from zmq_rl.policy import build_policy

    path = policy_path(target)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated file or not a torch file at all
        raise CliFailure(f"{path}: cannot load the policy: {exc}") from None
    try:
        raw = json.loads(state["policy_config"])
        raw["hidden_sizes"] = tuple(raw["hidden_sizes"])
        config = PolicyConfig(**raw).validate()
        env_id = env_id or str(state["env_id"])
        weights = state["policy"]
    except (KeyError, TypeError, ValueError) as exc:
        raise CliFailure(f"{path}: not a zmq_rl policy file ({exc})") from None
    ensure_env_importable(env_id)
    env = gym.make(env_id)
    try:
        policy = build_policy(env.observation_space, env.action_space, config)
    finally:
        env.close()
    try:
        policy.load_state_dict(weights)
    except RuntimeError as exc:
        raise CliFailure(f"{path}: the weights do not fit env {env_id}: {exc}") from None
    policy.eval()
    return LoadedPolicy(policy, env_id, int(state.get("version", 0)), config, path)


def evaluate(loaded: LoadedPolicy, episodes: int, seed: int) -> tuple[float, float]:
    """Mean and std return of ``episodes`` deterministic episodes (the learner's evaluator)."""
    from zmq_rl.evaluation import evaluate_policy

    return evaluate_policy(loaded.policy, loaded.env_id, episodes, seed=seed)


def record_episodes(
    loaded: LoadedPolicy, episodes: int, seed: int, video_dir: Path
) -> tuple[float, float]:
    """Play ``episodes`` deterministic episodes one after another, recording each to
    ``video_dir`` with :class:`gymnasium.wrappers.RecordVideo`; mean and std return.

    Needs moviepy (and, for the classic-control envs, pygame to render).
    """
    if importlib.util.find_spec("moviepy") is None:
        raise CliFailure(
            "--video needs moviepy, which is not installed: pip install moviepy "
            "(classic-control envs such as CartPole also need pygame to render: "
            "pip install 'zmq_rl[video]' installs both)"
        )
    import gymnasium as gym
    import numpy as np
    import torch

    from zmq_rl.actor import env_seeds

    try:
        env = gym.make(loaded.env_id, render_mode="rgb_array")
    except Exception as exc:  # no rgb_array rendering in this env
        raise CliFailure(f"cannot render {loaded.env_id}: {exc}") from None
    env = gym.wrappers.RecordVideo(
        env,
        str(video_dir),
        episode_trigger=lambda _: True,
        name_prefix="eval",
        disable_logger=True,
    )
    discrete = isinstance(env.action_space, gym.spaces.Discrete)
    returns = []
    try:
        for episode_seed in env_seeds(seed, episodes):
            obs, _ = env.reset(seed=episode_seed)
            total, done = 0.0, False
            while not done:
                batch = torch.as_tensor(np.asarray(obs)[None], dtype=torch.float32)
                action, _, _ = loaded.policy.act(batch, deterministic=True)
                a = (
                    action[0].item()
                    if discrete
                    else np.clip(action[0].numpy(), env.action_space.low, env.action_space.high)
                )
                obs, reward, terminated, truncated, _ = env.step(a)
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
    except gym.error.DependencyNotInstalled as exc:
        raise CliFailure(f"cannot render {loaded.env_id}: {exc}") from None
    finally:
        env.close()
    return float(np.mean(returns)), float(np.std(returns))
