"""Evaluation off the training path: snapshots evaluated in a separate process.

Over real sockets with the built-in actor on the stub env (every episode returns 5).
The speed this buys is measured in ``bench/eval_overhead.py``, not here.
"""

from __future__ import annotations

import json

import psutil
import pytest
import zmq

from tests.conftest import free_port_block
from tests.helpers import STUB_POLICY, Background, gym_actor, stub_learner_config
from zmq_rl.config import PolicyConfig, PPOConfig
from zmq_rl.learner.loop import Learner

SMALL_PPO = PPOConfig(num_epochs=1, minibatch_size=8)


def run(cfg, ppo=SMALL_PPO, policy=STUB_POLICY, **actor) -> tuple[Learner, object]:
    """Train ``cfg`` with one built-in actor (``actor``: its config changes); the
    learner and its report."""
    ctx = zmq.Context()
    learner = Learner(cfg, ppo, policy, context=ctx)
    actor = gym_actor(ctx, cfg.port, **actor)
    job = Background(learner.run)
    job.join(120)
    actor.join()
    learner.close()
    ctx.destroy(linger=0)
    assert job.error is None, repr(job.error)
    return learner, job.result


def evaluator_processes() -> list[psutil.Process]:
    """Live spawned children (multiprocessing's resource tracker is not one)."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.is_running() and "spawn_main" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


def test_background_evaluations_are_tagged_with_their_snapshot_and_can_stop_the_run():
    cfg = stub_learner_config(
        free_port_block(), eval_every=1, target_return=5.0, total_env_steps=8 * 2000
    )
    learner, report = run(cfg)
    assert report.stop_reason == "evaluation reached target_return 5"
    assert report.updates_completed < 2000  # stopped early, on a result that came back
    periodic = [e for e in report.evaluations if "reported_at_update" in e]
    assert periodic, report.evaluations
    for evaluation in periodic:
        # Each result is of the snapshot taken at its update, reported then or later.
        assert evaluation["updates"] <= evaluation["reported_at_update"]
        assert evaluation["env_steps"] == 8 * evaluation["updates"]
        assert evaluation["mean_return"] == 5.0
    assert report.evaluations[-1]["updates"] == report.updates_completed  # the final one
    # Every update was due; each due snapshot was either reported or counted skipped
    # (replaced while the evaluator was busy, or pending when the run stopped).
    skipped = report.counters.get("evaluation/skipped", 0)
    assert len(periodic) + skipped == report.updates_completed, (len(periodic), skipped)
    assert not evaluator_processes(), "the evaluator process outlived the learner"


def test_the_evaluator_starts_with_the_run_and_an_idle_one_is_not_waited_for():
    """The evaluator's process is up from the first update on (its imports are done by
    the first evaluation: on two busy cores they delayed the first result by ~30
    updates), and one that never got work is stopped at once, not joined for 5 s."""
    import time

    cfg = stub_learner_config(free_port_block(), eval_every=10**6, total_env_steps=8 * 3)
    ctx = zmq.Context()
    seen: list[int] = []
    learner = Learner(
        cfg,
        SMALL_PPO,
        STUB_POLICY,
        context=ctx,
        on_update=lambda row: seen.append(len(evaluator_processes())),
    )
    actor = gym_actor(ctx, cfg.port)
    job = Background(learner.run)
    job.join(120)
    actor.join()
    started = time.monotonic()
    learner.close()
    closed_in = time.monotonic() - started
    ctx.destroy(linger=0)
    assert job.error is None, repr(job.error)
    assert seen == [1, 1, 1], seen  # no evaluation was due, yet the process was up
    assert closed_in < 3.0, closed_in
    assert not evaluator_processes(), "the evaluator process outlived the learner"


def test_evaluation_in_the_loop_when_background_is_off():
    cfg = stub_learner_config(
        free_port_block(), eval_every=2, eval_in_background=False, total_env_steps=8 * 6
    )
    _, report = run(cfg)
    assert [e["updates"] for e in report.evaluations] == [2, 4, 6]
    assert all("reported_at_update" not in e for e in report.evaluations)
    assert not evaluator_processes()


@pytest.mark.parametrize("background", [True, False], ids=["background", "in-loop"])
def test_the_best_evaluated_policy_is_kept_as_policy_best(tmp_path, background):
    """policy.pt is the final policy; policy-best.pt the one whose evaluation was best,
    byte for byte what was evaluated: evaluating it again (same seed, deterministic)
    gives that evaluation's mean exactly. CartPole-v1, so evaluations differ."""
    from zmq_rl.learner.evaluation import evaluate_policy
    from zmq_rl.learner.runlog import EVAL_SEED_OFFSET
    from zmq_rl.serving.deploy import load_policy

    cfg = stub_learner_config(
        free_port_block(),
        env_id="CartPole-v1",
        num_envs=4,
        num_steps=16,
        fragment_length=16,
        eval_every=1,
        eval_episodes=3,
        eval_in_background=background,
        total_env_steps=16 * 4 * 12,
        run_dir=str(tmp_path / "run"),
    )
    ppo = PPOConfig(num_epochs=8, minibatch_size=32, learning_rate=0.01)  # moves fast
    policy_cfg = PolicyConfig(hidden_sizes=(32,))
    _, report = run(cfg, ppo, policy_cfg, env_id="CartPole-v1", num_envs=4)
    best = report.best_evaluation
    means = [e["mean_return"] for e in report.evaluations]
    assert len(set(means)) > 1, means  # the check below must pick one of several
    assert best is not None and best["mean_return"] == max(means)
    assert best["file"] == "policy-best.pt" and best["updates"] <= report.updates_completed
    saved = json.loads((tmp_path / "run" / "report.json").read_text())["best_evaluation"]
    assert saved == best
    policy = load_policy(tmp_path / "run" / "policy-best.pt")
    mean, _ = evaluate_policy(policy.network, "CartPole-v1", 3, cfg.seed + EVAL_SEED_OFFSET)
    assert policy.version == best["version"]
    assert mean == best["mean_return"]


# -- every evaluation in every sink, at the step it measured (issue 29, item 1) ---------


class RecordingTensorBoard:
    """Stands in for torch's SummaryWriter where the ``tensorboard`` package is not
    installed: keeps each ``add_scalar`` as ``tag -> [(step, value)]``."""

    def __init__(self) -> None:
        self.scalars: dict[str, list[tuple[int, float]]] = {}

    def add_scalar(self, tag: str, value: float, global_step: int) -> None:
        self.scalars.setdefault(tag, []).append((int(global_step), float(value)))

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def tensorboard_scalars(run_dir, writer, tag: str) -> list[tuple[int, float]]:
    """``(step, value)`` of ``tag`` as TensorBoard shows it: read back from the event
    files when the package is installed, else what the recording stand-in got."""
    if isinstance(writer.recorded_tb, RecordingTensorBoard):
        return writer.recorded_tb.scalars.get(tag, [])
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def test_every_evaluation_lands_in_every_sink_at_the_env_step_it_measured(tmp_path):
    """A real CartPole learner with a real background evaluator: metrics.jsonl,
    metrics.csv and TensorBoard hold exactly report.json's evaluations, the final one
    included, each at the env step of the weights it evaluated (on main: at the step
    of the update that collected it, the newest of several only, the final one
    nowhere)."""
    import csv

    from zmq_rl.learner.metrics import MetricsWriter, tensorboard_available

    run_dir = tmp_path / "run"
    cfg = stub_learner_config(
        free_port_block(),
        env_id="CartPole-v1",
        num_envs=2,
        num_steps=16,
        fragment_length=16,
        eval_every=1,
        eval_episodes=4,
        total_env_steps=16 * 2 * 30,
        target_return=float("inf"),
        run_dir=str(run_dir),
    )
    assert cfg.eval_in_background
    writer = MetricsWriter(run_dir, tensorboard=tensorboard_available())
    writer.recorded_tb = writer._tb
    if writer._tb is None:
        writer._tb = writer.recorded_tb = RecordingTensorBoard()
    ctx = zmq.Context()
    learner = Learner(
        cfg,
        SMALL_PPO,
        STUB_POLICY,
        context=ctx,
        on_update=writer.write,
        on_evaluation=writer.write,
    )
    actor = gym_actor(ctx, cfg.port, env_id="CartPole-v1", num_envs=2)
    job = Background(learner.run)
    job.join(120)
    actor.join()
    learner.close()
    writer.close()
    ctx.destroy(linger=0)
    assert job.error is None, repr(job.error)

    report = json.loads((run_dir / "report.json").read_text())
    expected = [(e["env_steps"], e["mean_return"]) for e in report["evaluations"]]
    assert len(expected) >= 2, expected
    first = report["evaluations"][0]  # submitted as the evaluator process started
    assert first["reported_at_update"] > first["updates"], first
    assert expected[-1][0] == report["env_steps_consumed"]  # the final evaluation
    steps = [step for step, _ in expected]
    assert steps == sorted(set(steps)), steps  # each snapshot evaluated once
    jsonl = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["env_steps"], r["eval/mean_return"]) for r in jsonl if "eval/mean_return" in r] == (
        expected
    )
    updates = [r for r in jsonl if "eval/mean_return" not in r]
    assert len(updates) == report["updates_completed"]
    with open(run_dir / "metrics.csv", newline="") as f:
        csv_rows = [r for r in csv.DictReader(f) if r["eval/mean_return"]]
    assert [(int(r["env_steps"]), float(r["eval/mean_return"])) for r in csv_rows] == expected
    assert tensorboard_scalars(run_dir, writer, "eval/mean_return") == [
        (step, pytest.approx(mean)) for step, mean in expected
    ]
    by_step = {e["env_steps"]: e for e in report["evaluations"]}
    for row in jsonl:
        if "eval/mean_return" in row:
            measured = by_step[row["env_steps"]]
            assert row["update"] == measured["updates"]
            assert row["wall_seconds"] == measured["wall_seconds"]
            assert row["eval/std_return"] == measured["std_return"]


def test_an_evaluation_row_goes_to_tensorboard_and_wandb_at_its_own_step(tmp_path):
    """A background result written after later update rows: TensorBoard gets its
    eval/ scalars (only those) at the step it measured; W&B, whose step only moves
    forward, gets them at its newest step with eval/env_steps as their x axis."""
    from zmq_rl.learner.metrics import MetricsWriter

    class RecordingWandb:
        def __init__(self) -> None:
            self.logged: list[tuple[dict, int]] = []

        def log(self, data: dict, step: int) -> None:
            self.logged.append((dict(data), step))

        def finish(self) -> None:
            pass

    writer = MetricsWriter(tmp_path, tensorboard=False)
    writer._tb, writer._wandb = RecordingTensorBoard(), RecordingWandb()
    tb, wandb = writer._tb, writer._wandb
    writer.write({"update": 1, "env_steps": 64, "wall_seconds": 1.0, "loss": 0.5})
    writer.write({"update": 2, "env_steps": 128, "wall_seconds": 2.0, "loss": 0.25})
    writer.write(
        {
            "update": 1,
            "env_steps": 64,
            "wall_seconds": 1.0,
            "eval/mean_return": 9.5,
            "eval/std_return": 0.5,
            "reported_at_update": 2,
        }
    )
    writer.close()
    assert tb.scalars["eval/mean_return"] == [(64, 9.5)]
    assert tb.scalars["eval/std_return"] == [(64, 0.5)]
    assert tb.scalars["wall_seconds"] == [(64, 1.0), (128, 2.0)]  # not the eval row's
    assert "reported_at_update" not in tb.scalars
    steps = [step for _, step in wandb.logged]
    assert steps == sorted(steps)
    assert wandb.logged[-1] == (
        {"eval/mean_return": 9.5, "eval/std_return": 0.5, "eval/env_steps": 64},
        128,
    )


# -- evaluation is passive (issue 29, item 2) ---------------------------------------------


def train_weights(port: int, first_actor: int, **eval_settings) -> list:
    """Train a small CartPole policy with two actors registering in the order
    ``first_actor`` first, then the other; the final weights. The valve's lead is
    one broadcast cycle: each rollout is acted by exactly the version before it,
    whatever the timing (a longer lead lets a slow actor's rows be acted by a newer
    version, which is timing, not evaluation)."""
    import time

    from zmq_rl.rl.policy import export_weights

    cfg = stub_learner_config(
        port,
        env_id="CartPole-v1",
        num_actors=2,
        num_envs=2,
        num_steps=16,
        fragment_length=16,
        max_lead_steps=16,
        eval_episodes=3,
        total_env_steps=16 * 4 * 8,
        target_return=float("inf"),
        batch_mode="slots",  # bit-for-bit repeatable: every slot's rows, in key order
        **eval_settings,
    )
    ctx = zmq.Context()
    learner = Learner(cfg, PPOConfig(num_epochs=2, minibatch_size=16), STUB_POLICY, context=ctx)
    job = Background(learner.run)
    actors = [gym_actor(ctx, port, env_id="CartPole-v1", num_envs=2, actor_id=first_actor)]
    deadline = time.monotonic() + 60
    while learner.members.get(first_actor) is None:  # registered: the other may come
        assert time.monotonic() < deadline and job.alive(), "the first actor never registered"
        time.sleep(0.01)
    actors.append(gym_actor(ctx, port, env_id="CartPole-v1", num_envs=2, actor_id=1 - first_actor))
    job.join(120)
    for actor in actors:
        actor.join()
    weights = export_weights(learner.policy)
    learner.close()
    ctx.destroy(linger=0)
    assert job.error is None, repr(job.error)
    assert job.result.updates_completed == 8
    return weights


def test_evaluation_on_off_or_in_the_background_trains_the_same_weights():
    """Same seed: no evaluation, background evaluation every update and in-loop
    evaluation every update train bit-identical weights, whichever actor registered
    first (on main the rollout's columns followed the registration order, a race)."""
    off = train_weights(free_port_block(), first_actor=0, eval_every=0)
    background = train_weights(
        free_port_block(), first_actor=1, eval_every=1, eval_in_background=True
    )
    in_loop = train_weights(
        free_port_block(), first_actor=0, eval_every=1, eval_in_background=False
    )
    for name, array in off:
        assert any(array.any() for _, array in off)
        assert (dict(background)[name] == array).all(), f"background evaluation changed {name}"
        assert (dict(in_loop)[name] == array).all(), f"in-loop evaluation changed {name}"


# -- Ctrl-C (issue 29, item 8) --------------------------------------------------------------


@pytest.mark.timeout(300)
@pytest.mark.parametrize("program", ["zmq-rl run", "zmq-learner"])
def test_ctrl_c_in_a_terminal_stops_the_run_without_a_traceback(tmp_path, program):
    """Ctrl-C in a terminal sends SIGINT to its whole process group: the learner,
    the background evaluator it spawned (and zmq-rl run's actors). The run stops
    cleanly (rc 130) and nothing prints a traceback (on main the evaluator printed
    a KeyboardInterrupt traceback of 17 lines)."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    port, run_dir = free_port_block(), tmp_path / "run"
    common = [
        *("--env-id", "CartPole-v1", "--total-env-steps", "10000000", "--target-return", "inf"),
        *("--eval-every", "1", "--eval-episodes", "2", "--port", str(port)),
        *("--run-dir", str(run_dir)),
    ]
    python = [sys.executable, "-m"]
    if program == "zmq-rl run":
        command = [*python, "zmq_rl.cli.main", "run", *common, "--no-plot"]
    else:
        command = [*python, "zmq_rl.cli.learner", *common, "--num-actors", "1"]
    root = Path(__file__).resolve().parents[1]
    pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=root)
    proc = subprocess.Popen(command, start_new_session=True, **pipes)  # its own "terminal"
    helpers = []
    if program == "zmq-learner":  # an actor elsewhere: not in the signalled group
        actor = [*python, "zmq_rl.cli.actor", "--learner", f"127.0.0.1:{port}"]
        helpers.append(subprocess.Popen(actor, start_new_session=True, **pipes))
    try:
        deadline = time.monotonic() + 180
        metrics = run_dir / "metrics.jsonl"
        while not (
            evaluator_processes_of(proc.pid)
            and metrics.is_file()
            and "eval/mean_return" in metrics.read_text()
        ):  # an evaluator that has evaluated: it is past its start-up
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no background evaluation within 180 s"
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        for p in [proc, *helpers]:
            if p.poll() is None:
                p.kill()
            p.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert (
        "interrupted (SIGINT)" in json.loads((run_dir / "report.json").read_text())["stop_reason"]
    )


def evaluator_processes_of(pid: int) -> list[psutil.Process]:
    """The spawned evaluator processes under ``pid``."""
    found = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if "spawn_main" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found
