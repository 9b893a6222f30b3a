"""A run's ``policy.pt`` and checkpoints: where they are and what they hold, without
torch.

:func:`saved_policy` reads the state a file holds (what ``torch.load`` returned, or
:func:`~zmq_rl.rl.torch_file.read_torch_file` on a host without torch) into a
:class:`SavedPolicy`; :func:`read_saved_policy` reads a file without torch, its
tensors as numpy arrays, and :func:`numpy_policy` builds the numpy network
(:mod:`zmq_rl.rl.numpy_nets`) that plays it: what ``zmq-rl eval`` runs on an actor
host (``pip install zmq_rl``). :func:`zmq_rl.serving.deploy.read_policy_file` is the
torch reader; the learner writes the files (:mod:`zmq_rl.learner.checkpoint`).
"""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import PolicyConfig, parse_env_kwargs

__all__ = [
    "NOT_OURS",
    "POLICY_NAME",
    "PolicyFileError",
    "SavedPolicy",
    "load_error_reason",
    "numpy_policy",
    "policy_path",
    "read_saved_policy",
    "saved_policy",
]

POLICY_NAME = "policy.pt"
NOT_OURS = (
    "not a policy.pt or checkpoint written by zmq_rl (a run dir's policy.pt, or its "
    "checkpoints/ckpt-N.pt)"
)


class PolicyFileError(ValueError):
    """A policy file is missing, unreadable, or was not written by zmq_rl; the
    message names the file and the reason."""


@dataclass
class SavedPolicy:
    """What a ``policy.pt`` or checkpoint holds: the weights and what rebuilds the network."""

    path: Path
    config: PolicyConfig
    env_id: str
    weights: dict[str, Any]
    """The network's tensors by name: torch tensors, or numpy arrays when read without
    torch (:func:`read_saved_policy`)."""
    version: int = 0
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    wrappers: list[str] = field(default_factory=list)
    agent_policies: list[str] = field(default_factory=list)
    """A run of several policies: the policy id of each agent (``policy-<id>.pt``)."""


def policy_path(target: str | Path) -> Path:
    """``RUN_DIR`` -> ``RUN_DIR/policy.pt``; a file is returned as is. PolicyFileError
    when there is no such file."""
    path = Path(target)
    if path.is_dir():
        path = path / POLICY_NAME
    if not path.is_file():
        raise PolicyFileError(
            f"{path}: no such policy file (a run writes {POLICY_NAME} when it ends; "
            "a checkpoint, RUN_DIR/checkpoints/ckpt-N.pt, can be loaded too)"
        )
    return path


def load_error_reason(exc: BaseException) -> str:
    """Why ``torch.load(weights_only=True)`` failed, in one line."""
    text = str(exc)
    if isinstance(exc, pickle.UnpicklingError) and "Unsupported global" in text:
        return "it holds Python objects besides tensors"
    if "zip archive" in text or "central directory" in text:
        return "the file is truncated or corrupt"
    if isinstance(exc, EOFError):
        return "the file is empty or truncated"
    return "not a torch file"


def saved_policy(path: Path, state: Any) -> SavedPolicy:
    """The :class:`SavedPolicy` of ``state``, what file ``path`` holds (a
    policy file, :meth:`RunFiles.save_policy <zmq_rl.learner.outputs.RunFiles.save_policy>`,
    or a checkpoint); PolicyFileError naming the file
    when it is neither."""
    if not isinstance(state, dict):
        raise PolicyFileError(f"{path}: {NOT_OURS}; it holds a {type(state).__name__}")
    try:
        if "trainer" in state and "learner_config" in state:  # Learner.checkpoint()
            learner = json.loads(state["learner_config"])
            env_id = str(learner["env_id"])
            env_kwargs = parse_env_kwargs(str(learner.get("env_kwargs", "")))
            wrappers = list(learner.get("wrappers", []))
            weights = state["trainer"]["policy"]
        else:  # a policy file (learner/outputs.py: RunFiles.save_policy)
            env_id = str(state["env_id"])
            env_kwargs = json.loads(state.get("env_kwargs", "{}"))
            wrappers = json.loads(state.get("wrappers", "[]"))
            weights = state["policy"]
        raw = json.loads(state["policy_config"])
        raw["hidden_sizes"] = tuple(raw["hidden_sizes"])
        config = PolicyConfig(**raw).validate()
        version = int(state.get("version", 0))
        agent_policies = [str(p) for p in json.loads(state.get("agent_policies", "[]"))]
    except (KeyError, TypeError, ValueError) as exc:
        missing = f"no {exc}" if isinstance(exc, KeyError) else str(exc)
        raise PolicyFileError(f"{path}: {NOT_OURS} ({missing})") from None
    return SavedPolicy(
        path, config, env_id, weights, version, dict(env_kwargs), list(wrappers), agent_policies
    )


def read_saved_policy(target: str | Path) -> SavedPolicy:
    """:func:`saved_policy` of a file read without torch
    (:func:`~zmq_rl.rl.torch_file.read_torch_file`): its weights are numpy arrays."""
    from .torch_file import TorchFileError, read_torch_file

    path = policy_path(target)
    try:
        state = read_torch_file(path)
    except TorchFileError as exc:
        raise PolicyFileError(f"{path}: {NOT_OURS}: {exc}") from None
    return saved_policy(path, state)


def numpy_policy(saved: SavedPolicy, observation_space: Any, action_space: Any) -> Any:
    """The numpy network of ``saved`` for these spaces (:func:`~zmq_rl.rl.numpy_nets.numpy_network`)
    loaded with its weights (numpy arrays, :func:`read_saved_policy`).
    :class:`~zmq_rl.rl.installs.TorchMissing` for a custom factory's network,
    PolicyFileError when the weights do not fit the spaces."""
    import numpy as np

    from .installs import TorchMissing, needs_torch_line
    from .numpy_mlp import rng_of
    from .numpy_nets import numpy_network
    from .weights import WeightsMismatch

    net = numpy_network(observation_space, action_space, saved.config, rng_of(0))
    if net is None:
        raise TorchMissing(needs_torch_line(saved.config.factory))
    try:
        net.load([(name, np.asarray(array)) for name, array in saved.weights.items()])
    except WeightsMismatch as exc:
        raise PolicyFileError(
            f"{saved.path}: the weights do not fit env {saved.env_id}: {exc}"
        ) from None
    return net
