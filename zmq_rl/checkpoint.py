"""Checkpoint files: atomic writes, finding the newest, and the configs inside.

A checkpoint is a ``torch.save`` of tensors, numbers and JSON strings only, so it
loads with ``torch.load(weights_only=True)``: nothing executable is unpickled.
"""

from __future__ import annotations

import json
import os
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
