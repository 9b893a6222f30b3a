"""Checkpoint and policy files: their layout, atomic writes, finding the newest.

A checkpoint is a ``torch.save`` of tensors, numbers and JSON strings only, so it
loads with ``torch.load(weights_only=True)``: nothing executable is unpickled. Its
tensors are CPU tensors whatever device the learner ran on, and it is read with
``map_location="cpu"``, so a checkpoint moves between GPU and CPU machines. It
holds the trainer's :meth:`~zmq_rl.rl.trainer.Trainer.state_dict` (policy, optimiser,
version, episode returns in progress, RNG, reward scaler) plus the run's part
(:func:`run_state`: configs, report, counters, rows still queued).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from ..config import LearnerConfig, PolicyConfig, PPOConfig
from ..config import config_dict as config_dict  # re-exported (it was defined here)
from ..rl.device import to_cpu
from .report import LearnerReport

log = logging.getLogger("zmq_rl.checkpoint")

CHECKPOINT_FORMAT = 1
CHECKPOINTS_KEPT = 3


class WriteFailed(OSError):
    """A run file could not be written (full disk, permissions, ...); the message names
    the file, the bytes it needed and the space left, and the temp file is gone."""


def write_checkpoint(folder: Path, name: str, state: dict[str, Any], keep_every: int = 0) -> Path:
    """Save ``state`` as ``folder/name`` atomically and keep the newest
    :data:`CHECKPOINTS_KEPT` ``ckpt-*.pt`` files, and those whose update is a multiple
    of ``keep_every`` (``keep_checkpoint_every``; 0: none). Raises
    :class:`WriteFailed`; the checkpoints already there are kept."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    atomic_torch_save({"format": CHECKPOINT_FORMAT, **state}, path)
    for old in sorted(folder.glob("ckpt-*.pt"))[:-CHECKPOINTS_KEPT]:
        if not (keep_every and _update_of(old) % keep_every == 0):
            old.unlink(missing_ok=True)
    return path


def _update_of(path: Path) -> int:
    """The update of ``ckpt-<update>.pt`` (-1 for another name: never kept for good)."""
    digits = path.stem.removeprefix("ckpt-")
    return int(digits) if digits.isdigit() else -1


class CorruptCheckpoint(ValueError):
    """A checkpoint file that cannot be loaded (truncated, not a checkpoint, ...)."""


def read_checkpoint(path: Path) -> dict[str, Any]:
    """Load a checkpoint safely (``weights_only``) and check its format and keys;
    :class:`CorruptCheckpoint` naming the file and the reason otherwise."""
    try:
        # map_location: a checkpoint written on a GPU loads on a CPU-only machine (the
        # trainer copies what it loads onto its own device).
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises RuntimeError, pickle errors, EOFError, OSError
        raise CorruptCheckpoint(f"{path}: cannot be loaded ({type(exc).__name__}: {exc})") from exc
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise CorruptCheckpoint(f"{path}: unknown checkpoint format {found!r}")
    missing = [key for key in REQUIRED_KEYS if key not in state]
    if missing:
        raise CorruptCheckpoint(f"{path}: not a learner checkpoint (no {', '.join(missing)})")
    return state


REQUIRED_KEYS = ("trainer", "version", "learner_config", "ppo_config", "policy_config", "report")
"""What every checkpoint holds; one without them is not resumable."""


def newest_readable_checkpoint(run_dir: str | Path) -> tuple[Path, dict[str, Any]]:
    """The newest checkpoint of ``run_dir`` that loads, with its state. A newer one
    that does not load (a truncated file, a crash mid-copy) is skipped with a
    warning naming it; FileNotFoundError when there is none, CorruptCheckpoint
    naming every file when none loads."""
    problems = []
    for path in reversed(checkpoint_files(run_dir)):
        try:
            state = read_checkpoint(path)
        except CorruptCheckpoint as exc:
            log.warning("skipping checkpoint %s", exc)
            problems.append(str(exc))
            continue
        return path, state
    if problems:
        raise CorruptCheckpoint("no checkpoint could be loaded: " + "; ".join(problems))
    raise FileNotFoundError(f"no checkpoint in {Path(run_dir) / 'checkpoints'}")


def checkpoint_configs(
    state: dict[str, Any], path: Path, run_dir: str | Path, **learner_overrides: Any
) -> tuple[LearnerConfig, PPOConfig, PolicyConfig]:
    """The configs a checkpoint was written with (``learner_overrides`` applied,
    ``run_dir`` set to where it is now), validated. A checkpoint written before
    ``batch_mode`` existed resumes with every slot's rollout, the way it trained."""
    raw = json.loads(state["learner_config"])
    raw.setdefault("batch_mode", "slots")
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
    path, state = newest_readable_checkpoint(run_dir)
    return checkpoint_configs(state, path, run_dir, **learner_overrides)


def checkpoint_files(run_dir: str | Path) -> list[Path]:
    """The ``checkpoints/ckpt-*.pt`` files of a run directory, oldest first."""
    return sorted((Path(run_dir) / "checkpoints").glob("ckpt-*.pt"))


def newest_checkpoint(run_dir: str | Path) -> Path:
    """The newest ``checkpoints/ckpt-*.pt`` of a run directory (FileNotFoundError
    naming the directory when there is none); it may not load, see
    :func:`newest_readable_checkpoint`."""
    found = checkpoint_files(run_dir)
    if not found:
        raise FileNotFoundError(f"no checkpoint in {Path(run_dir) / 'checkpoints'}")
    return found[-1]


def checkpoint_name(updates_completed: int) -> str:
    """The file name of the checkpoint written after ``updates_completed`` updates."""
    return f"ckpt-{updates_completed:08d}.pt"


def run_state(
    configs: tuple[Any, Any, Any],
    report: LearnerReport,
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
    report: LearnerReport,
    counters: dict[str, int],
    queued: tuple[int, int],
) -> Path:
    """Write ``run_dir/checkpoints/ckpt-<updates>.pt``: the trainer's state plus the
    run's (:func:`run_state`), atomically; the newest few are kept, and every
    ``keep_checkpoint_every``-th of the learner config (``configs[0]``)."""
    state = {**trainer_state, **run_state(configs, report, counters, queued)}
    name = checkpoint_name(report.updates_completed)
    keep_every = int(getattr(configs[0], "keep_checkpoint_every", 0))
    return write_checkpoint(Path(run_dir) / "checkpoints", name, state, keep_every)


def restore_run_state(state: dict[str, Any], report: LearnerReport, counters: Counter[str]) -> None:
    """Put a checkpoint's report and counters back (the new run keeps its own run id
    and actor lines, and names the device it runs on); rows that were queued when it
    was written died with the old learner and are counted as
    ``discarded/.../learner_restart``, so that received = consumed + discarded still
    holds."""
    for key, value in json.loads(state["report"]).items():
        if key not in ("run_id", "actor_stats", "device"):
            setattr(report, key, value)
    counters.update(json.loads(state["counters"]))
    counters["learner/resumes"] += 1
    rows, fragments = json.loads(state.get("queued", "[0, 0]"))
    if rows:
        counters["discarded/steps/learner_restart"] += rows
        counters["discarded/fragments/learner_restart"] += fragments


def save_policy(
    path: Path,
    policy: Any,
    policy_cfg: Any,
    env_id: str,
    version: int,
    env_kwargs: dict[str, Any] | None = None,
    wrappers: Any = (),
    agent_policies: list[str] | None = None,
) -> None:
    """Write ``policy.pt``: the policy's tensors plus what rebuilds it (its config as
    JSON, the env id, ``gym.make`` kwargs and wrappers as JSON, the version),
    atomically; ``zmq-rl eval``, ``zmq-rl export`` and ``zmq_rl.load_policy`` read it.
    ``policy`` is the module or its ``state_dict`` (a mapping of tensors).
    ``agent_policies``: a run of several policies' policy id of each agent (its
    files are ``policy-<id>.pt`` beside this one; ``zmq-rl eval`` plays them all)."""
    tensors = policy if isinstance(policy, Mapping) else policy.state_dict()
    state = {
        "policy": to_cpu(dict(tensors)),  # loads on any device
        "policy_config": json.dumps(config_dict(policy_cfg)),
        "env_id": env_id,
        "env_kwargs": json.dumps(dict(env_kwargs or {})),
        "wrappers": json.dumps(list(wrappers)),
        "version": version,
    }
    if agent_policies:
        state["agent_policies"] = json.dumps(list(agent_policies))
    atomic_torch_save(state, path)


def atomic_torch_save(state: dict[str, Any], path: Path) -> None:
    """``torch.save`` to a temp file, then rename: a crash never leaves half a file.
    :class:`WriteFailed` when the write fails (the temp file is removed)."""
    _atomic(path, lambda tmp: torch.save(state, tmp))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write bytes to a temp file, then rename over ``path`` (:class:`WriteFailed`)."""
    _atomic(path, lambda tmp: tmp.write_bytes(data))


def _atomic(path: Path, write: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as exc:  # torch.save reports a full disk as RuntimeError
        needed = tmp.stat().st_size if tmp.exists() else 0
        tmp.unlink(missing_ok=True)
        try:
            free = shutil.disk_usage(path.parent).free
        except OSError:
            free = -1
        raise WriteFailed(
            f"cannot write {path}: {exc}; wrote {needed:,} bytes before failing, "
            f"{free:,} bytes free on its filesystem"
        ) from exc
