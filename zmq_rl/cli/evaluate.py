"""``zmq-rl eval``: load a saved policy and measure it on fresh episodes.

The learner saves ``policy.pt`` as plain tensors plus the JSON policy config and
env id (:meth:`zmq_rl.learner.Learner.save_policy`), and its checkpoints
(``checkpoints/ckpt-N.pt``, :meth:`~zmq_rl.learner.Learner.checkpoint`) hold the
same policy under ``trainer``, with the configs as JSON; both load with
``torch.load(weights_only=True)``: nothing is unpickled beyond tensors and
primitive values. Any other file is refused in one line.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import pickle
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
            "a checkpoint, RUN_DIR/checkpoints/ckpt-N.pt, can be evaluated too)"
        )
    return path


NOT_OURS = (
    "not a policy.pt or checkpoint written by zmq_rl (a run dir's policy.pt, or its "
    "checkpoints/ckpt-N.pt)"
)


def _load_error(exc: BaseException) -> str:
    """Why ``torch.load(weights_only=True)`` failed, in one line (none of torch's
    advice on unsafe loading or filing issues)."""
    text = str(exc)
    if isinstance(exc, pickle.UnpicklingError) and "Unsupported global" in text:
        return "it holds Python objects besides tensors"
    if "zip archive" in text or "central directory" in text:
        return "the file is truncated or corrupt"
    if isinstance(exc, EOFError):
        return "the file is empty or truncated"
    return "not a torch file"


def read_saved_policy(path: Path, state: Any) -> tuple[PolicyConfig, str, Any, int]:
    """The policy config, env id, weights and version stored in a loaded ``policy.pt``
    or checkpoint; :class:`CliFailure` naming the file when it is neither."""
    if not isinstance(state, dict):
        raise CliFailure(f"{path}: {NOT_OURS}; it holds a {type(state).__name__}")
    try:
        if "trainer" in state and "learner_config" in state:  # Learner.checkpoint()
            env_id = str(json.loads(state["learner_config"])["env_id"])
            weights = state["trainer"]["policy"]
        else:  # Learner.save_policy()
            env_id = str(state["env_id"])
            weights = state["policy"]
        raw = json.loads(state["policy_config"])
        raw["hidden_sizes"] = tuple(raw["hidden_sizes"])
        config = PolicyConfig(**raw).validate()
        version = int(state.get("version", 0))
    except (KeyError, TypeError, ValueError) as exc:
        missing = f"no {exc}" if isinstance(exc, KeyError) else str(exc)
        raise CliFailure(f"{path}: {NOT_OURS} ({missing})") from None
    return config, env_id, weights, version


def load_policy(target: str | Path, env_id: str = "") -> LoadedPolicy:
    """Rebuild the actor-critic saved at ``target``: a run dir, its ``policy.pt``, or
    one of its checkpoints (``checkpoints/ckpt-N.pt``).

    ``env_id`` overrides the saved env id (e.g. a variant with the same spaces).
    """
    import gymnasium as gym
    import torch

    from zmq_rl.policy import build_policy

    path = policy_path(target)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated file or not a torch file at all
        raise CliFailure(f"{path}: {NOT_OURS}: {_load_error(exc)}") from None
    config, saved_env, weights, version = read_saved_policy(path, state)
    env_id = env_id or saved_env
    ensure_env_importable(env_id)
    env = gym.make(env_id)
    try:
        policy = build_policy(env.observation_space, env.action_space, config)
    finally:
        env.close()
    try:
        policy.load_state_dict(weights)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CliFailure(f"{path}: the weights do not fit env {env_id}: {first}") from None
    policy.eval()
    return LoadedPolicy(policy, env_id, version, config, path)


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

    from zmq_rl.networks import batch_obs, obs_tensor
    from zmq_rl.policy import is_recurrent
    from zmq_rl.seeding import env_seeds
    from zmq_rl.spaces import env_actions

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
    scalar = isinstance(env.action_space, gym.spaces.Discrete)
    policy = loaded.policy
    recurrent = is_recurrent(policy)
    returns = []
    try:
        for episode_seed in env_seeds(seed, episodes):
            obs, _ = env.reset(seed=episode_seed)
            total, done = 0.0, False
            state = policy.initial_state(1) if recurrent else None
            while not done:
                batch = obs_tensor(batch_obs(env.observation_space, [obs]))
                if recurrent:
                    action, _, _, state = policy.act_recurrent(batch, state, deterministic=True)
                else:
                    action, _, _ = policy.act(batch, deterministic=True)
                a = env_actions(env.action_space, action.numpy())[0]
                obs, reward, terminated, truncated, _ = env.step(a.item() if scalar else a)
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
    except gym.error.DependencyNotInstalled as exc:
        raise CliFailure(f"cannot render {loaded.env_id}: {exc}") from None
    finally:
        env.close()
    return float(np.mean(returns)), float(np.std(returns))
