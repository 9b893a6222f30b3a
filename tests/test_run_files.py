"""Run files under trouble: a full disk during checkpoints, a corrupt newest checkpoint.

The full-disk tests mount a real 1 MiB tmpfs for the run directory (root only; they
skip with the reason elsewhere) and fill it, so every write fails as it would on a
full disk: nothing here fakes ``torch.save``.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import free_port_block
from tests.helpers import STUB_POLICY, Background, gym_actor, stub_learner_config
from zmq_rl.config import PPOConfig
from zmq_rl.learner.checkpoint import CorruptCheckpoint, WriteFailed, checkpoint_files
from zmq_rl.learner.loop import Learner

SMALL_PPO = PPOConfig(num_epochs=1, minibatch_size=8)


@pytest.fixture
def full_disk(tmp_path):
    """A 1 MiB tmpfs with all but 4 KB taken by ``filler``; unmounted afterwards."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root and mount(8) for a small tmpfs")
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        filler = mount_point / "filler"
        with open(filler, "wb") as f:
            f.write(b"\0" * (shutil.disk_usage(mount_point).free - 4096))
        yield mount_point, filler
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], timeout=30, check=False)


def run_with_actor(cfg, on_update=None) -> tuple[Background, Learner]:
    import zmq

    ctx = zmq.Context()
    learner = Learner(cfg, SMALL_PPO, STUB_POLICY, context=ctx, on_update=on_update)
    actor = gym_actor(ctx, cfg.port)
    run = Background(learner.run)
    run.join()
    actor.join()
    learner.close()
    ctx.destroy(linger=0)
    return run, learner


def test_checkpoints_that_do_not_fit_are_warnings_and_training_goes_on(full_disk, caplog):
    mount_point, filler = full_disk
    run_dir = mount_point / "run"

    def free_space(row) -> None:
        if row["update"] == 3:
            filler.unlink(missing_ok=True)  # the operator made room

    cfg = stub_learner_config(
        free_port_block(), run_dir=str(run_dir), checkpoint_every=1, total_env_steps=8 * 6
    )
    with caplog.at_level(logging.WARNING, logger="zmq_rl"):
        run, learner = run_with_actor(cfg, free_space)
    assert run.error is None, repr(run.error)
    report = run.result
    assert report.env_steps_consumed == 8 * 6 and report.stop_reason == "budget spent"
    failed = learner.counters["checkpoint/failed"]
    assert failed >= 2  # updates 1 and 2 at least could not be checkpointed
    warnings = [r.getMessage() for r in caplog.records if "tries again" in r.getMessage()]
    assert len(warnings) == failed
    assert "cannot write" in warnings[0] and "bytes free" in warnings[0]
    assert "ckpt-00000001.pt" in warnings[0]
    assert not list(run_dir.rglob("*.tmp")), "a failed write left its temp file"
    assert (run_dir / "report.json").exists() and (run_dir / "policy.pt").exists()
    assert checkpoint_files(run_dir)[-1].name == "ckpt-00000006.pt"


def test_final_outputs_that_do_not_fit_fail_the_run_after_the_actors_stopped(full_disk):
    mount_point, _ = full_disk
    run_dir = mount_point / "run"
    cfg = stub_learner_config(free_port_block(), run_dir=str(run_dir), total_env_steps=8 * 3)
    run, learner = run_with_actor(cfg)  # the actor thread ended: it was told to stop
    assert isinstance(run.error, WriteFailed), repr(run.error)
    # The checkpoint, report.json, policy.pt and policy-best.pt (of the final evaluation).
    assert "the run ended but 4 output(s) failed" in str(run.error)
    assert learner.report.stop_reason == "budget spent"
    assert all(rec.said_bye for rec in learner.members)
    assert not list(run_dir.rglob("*.tmp"))


def checkpointed_learner(run_dir: Path, updates: list[int]) -> list[Path]:
    """Checkpoints of a learner (no actors) as if written after ``updates`` updates,
    the version equal to the update count."""
    import zmq

    ctx = zmq.Context()
    learner = Learner(
        stub_learner_config(free_port_block(), run_dir=str(run_dir)),
        SMALL_PPO,
        STUB_POLICY,
        context=ctx,
    )
    paths = []
    try:
        for n in updates:
            learner.report.updates_completed = learner.version = n
            paths.append(learner.checkpoint())
    finally:
        learner.close()
        ctx.destroy(linger=0)
    return paths


def test_resume_skips_a_truncated_newest_checkpoint_and_names_it(tmp_path, caplog):
    older, newest = checkpointed_learner(tmp_path, [4, 8])
    os.truncate(newest, 600)
    with caplog.at_level(logging.WARNING, logger="zmq_rl"):
        resumed = Learner.resume(tmp_path, port=free_port_block())
    try:
        assert resumed.report.resumed_from == str(older)
        assert resumed.version == 4 and resumed.report.updates_completed == 4
    finally:
        resumed.close()
    skipped = [r.getMessage() for r in caplog.records if "skipping checkpoint" in r.getMessage()]
    assert len(skipped) == 1 and str(newest) in skipped[0] and "cannot be loaded" in skipped[0]


def test_resume_with_no_loadable_checkpoint_names_every_file(tmp_path):
    paths = checkpointed_learner(tmp_path, [1, 2])
    for path in paths:
        path.write_bytes(b"not a checkpoint")
    with pytest.raises(CorruptCheckpoint, match="no checkpoint could be loaded") as info:
        Learner.resume(tmp_path, port=free_port_block())
    assert all(str(path) in str(info.value) for path in paths)
