"""Checkpoint and policy files: their layout, atomic writes, finding the newest.

A checkpoint is a ``torch.save`` of tensors, numbers and JSON strings only, so it
loads with ``torch.load(weights_only=True)``: nothing executable is unpickled. It
holds the trainer's :meth:`~zmq_rl.trainer.Trainer.state_dict` (policy, optimiser,
version, episode returns in progress, RNG, reward scaler) plus the run's part
(:func:`run_state`: configs, report, counters, rows still queued).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from .config import LearnerConfig, PolicyConfig, PPOConfig

CHECKPOINT_FORMAT = 1
CHECKPOINTS_KEPT = 3


def write_checkpoint(folder: Path, name: str, state: dict[str, Any]) -> Path:
    """Save ``state`` as ``folder/name`` atomically and keep the newest
    :data:`CHECKPOINTS_KEPT` ``ckpt-*.pt`` files."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    atomic_torch_save({"format": CHECKPOINT_FORMAT, **state}, path)
    for old in sorted(folder.glob("ckpt-*.pt"))[:-CHECKPOINTS_KEPT]:
        old.unlink(missing_ok=True)
    return path


def read_checkpoint(path: Path) -> dict[str, Any]:
    """Load a checkpoint safely (``weights_only``) and check its format."""
    state = torch.load(path, weights_only=True)
    if state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path}: unknown checkpoint format {state.get('format')!r}")
    return state


def checkpoint_configs(
    state: dict[str, Any], path: Path, run_dir: str | Path, **learner_overrides: Any
) -> tuple[LearnerConfig, PPOConfig, PolicyConfig]:
    """The configs a checkpoint was written with (``learner_overrides`` applied,
    ``run_dir`` set to where it is now), validated."""
    raw = json.loads(state["learner_config"])
    raw.update(learner_overrides, run_dir=str(run_dir))
    policy_raw = json.loads(state["policy_config"])
    policy_raw["hidden_sizes"] = tuple(policy_raw["hidden_sizes"])
    return (
        LearnerConfig(**raw).validate(),
        PPOConfig(**json.loads(state["ppo_config"])).validate(),
        PolicyConfig(**policy_raw).validate(),
    )


def load_resume_configs(
    run_dir: str | Path, **learner_overrides: Any
) -> tuple[LearnerConfig, PPOConfig, PolicyConfig]:
    """The configs :meth:`Learner.resume` would use for ``run_dir``."""
    path = newest_checkpoint(run_dir)
    return checkpoint_configs(read_checkpoint(path), path, run_dir, **learner_overrides)


def newest_checkpoint(run_dir: str | Path) -> Path:
    """The newest ``checkpoints/ckpt-*.pt`` of a run directory (FileNotFoundError
    naming the directory when there is none)."""
    found = sorted((Path(run_dir) / "checkpoints").glob("ckpt-*.pt"))
    if not found:
        raise FileNotFoundError(f"no checkpoint in {Path(run_dir) / 'checkpoints'}")
    return found[-1]


def checkpoint_name(updates_completed: int) -> str:
    """The file name of the checkpoint written after ``updates_completed`` updates."""
    return f"ckpt-{updates_completed:08d}.pt"


def run_state(
    configs: tuple[Any, Any, Any],
    report: Any,
    counters: dict[str, int],
    queued: tuple[int, int],
) -> dict[str, Any]:
    """The learner's part of a checkpoint: its (learner, ppo, policy) configs, the
    report so far, the counters, and (rows, fragments) received but not yet consumed."""
    learner_cfg, ppo_cfg, policy_cfg = configs
    return {
        "learner_config": json.dumps(config_dict(learner_cfg)),
        "ppo_config": json.dumps(config_dict(ppo_cfg)),
        "policy_config": json.dumps(config_dict(policy_cfg)),
        "report": json.dumps(asdict(report), default=float),
        "counters": json.dumps(counters),
        "queued": json.dumps(list(queued)),
    }


def save_learner_checkpoint(
    run_dir: str | Path,
    trainer_state: dict[str, Any],
    configs: tuple[Any, Any, Any],
    report: Any,
    counters: dict[str, int],
    queued: tuple[int, int],
) -> Path:
    """Write ``run_dir/checkpoints/ckpt-<updates>.pt``: the trainer's state plus the
    run's (:func:`run_state`), atomically; the newest few are kept."""
    state = {**trainer_state, **run_state(configs, report, counters, queued)}
    name = checkpoint_name(report.updates_completed)
    return write_checkpoint(Path(run_dir) / "checkpoints", name, state)


def restore_run_state(state: dict[str, Any], report: Any, counters: Counter[str]) -> None:
    """Put a checkpoint's report and counters back (the new run keeps its own run id
    and actor lines); rows that were queued when it was written died with the old
    learner and are counted as ``discarded/.../learner_restart``, so that received =
    consumed + discarded still holds."""
    for key, value in json.loads(state["report"]).items():
        if key not in ("run_id", "actor_stats"):
            setattr(report, key, value)
    counters.update(json.loads(state["counters"]))
    counters["learner/resumes"] += 1
    rows, fragments = json.loads(state.get("queued", "[0, 0]"))
    if rows:
        counters["discarded/steps/learner_restart"] += rows
        counters["discarded/fragments/learner_restart"] += fragments


def save_policy(path: Path, policy: Any, policy_cfg: Any, env_id: str, version: int) -> None:
    """Write ``policy.pt``: the policy's tensors plus what rebuilds it (its config as
    JSON, the env id, the version), atomically; ``zmq-rl eval`` reads it."""
    state = {
        "policy": policy.state_dict(),
        "policy_config": json.dumps(config_dict(policy_cfg)),
        "env_id": env_id,
        "version": version,
    }
    atomic_torch_save(state, path)


def config_dict(cfg: Any) -> dict[str, Any]:
    """A config dataclass as a JSON-able dict (tuples become lists)."""
    raw = asdict(cfg)
    return {k: list(v) if isinstance(v, tuple) else v for k, v in raw.items()}


def atomic_torch_save(state: dict[str, Any], path: Path) -> None:
    """``torch.save`` to a temp file, then rename: a crash never leaves half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write bytes to a temp file, then rename over ``path``."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
