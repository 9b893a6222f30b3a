"""The learner's ``device`` (issue 12, item 1; the GPU checks of item 5).

On every machine: the setting's validation (both branches of ``auto``, and ``cuda``
where CUDA is missing, by monkeypatching ``torch.cuda``), the flag on both command
lines and in the Python API, a real CPU run that names its device in report.json
and on the progress line, checkpoints that hold CPU tensors and load with
``map_location``.

Where a GPU exists (skipped with a reason elsewhere): one PPO update on CUDA equals
the CPU update from the same seed and rollout, CUDA weights are exported as CPU
arrays equal to the CPU learner's, checkpoints cross between devices, and a CUDA
learner with CPU actors trains CartPole. ``bench/gpu_check.py`` runs these on a
machine with a GPU, plus a throughput figure per device.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces

import zmq_rl
from tests.conftest import STUB_ENV_ID, free_port_block
from zmq_rl.cli import learner as learner_cli
from zmq_rl.cli import main as main_cli
from zmq_rl.cli.learner import LEARNER_SECTIONS
from zmq_rl.config import ConfigError, LearnerConfig, PolicyConfig, PPOConfig
from zmq_rl.learner.checkpoint import (
    atomic_torch_save,
    checkpoint_files,
    load_resume_configs,
    read_checkpoint,
    restore_run_state,
    run_state,
    save_policy,
    write_checkpoint,
)
from zmq_rl.learner.report import LearnerReport
from zmq_rl.learner.runlog import RunLog
from zmq_rl.rl.device import resolve_device, to_cpu, to_device
from zmq_rl.rl.policy import export_weights
from zmq_rl.rl.rollout import Rollout
from zmq_rl.rl.trainer import Trainer
from zmq_rl.run.local_actors import resume_configs

ROOT = Path(__file__).resolve().parents[1]
RUN_TIMEOUT_S = 180
"""Bound on one tiny ``zmq-rl run`` (three Python processes importing torch)."""
CUDA = torch.cuda.is_available()
NEEDS_CUDA = pytest.mark.skipif(
    not CUDA, reason="needs a CUDA GPU (torch.cuda.is_available() is False here)"
)
OBS_SPACE = spaces.Box(-np.inf, np.inf, (4,), np.float32)
ACT_SPACE = spaces.Discrete(2)


def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def one_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


# -- the setting ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["auto", "cpu"])
def test_auto_and_cpu_are_valid_anywhere(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    no_cuda(monkeypatch)
    assert LearnerConfig(device=name).validate().device == name
    assert LearnerConfig().device == "auto"  # the default


@pytest.mark.parametrize("name", ["cuda", "cuda:0", "cuda:12"])
def test_cuda_names_parse(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    one_gpu(monkeypatch)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 13)
    assert LearnerConfig(device=name).validate().device == name
    index = int(name.partition(":")[2] or 0)
    assert resolve_device(name) == torch.device("cuda", index)


@pytest.mark.parametrize("name", ["gpu", "cuda:-1", "cuda:x", "", "CUDA", "cuda:", "cpu:0", 0])
def test_bad_device_names_are_rejected_naming_the_field(name, monkeypatch) -> None:
    one_gpu(monkeypatch)  # even where CUDA exists: the text itself is wrong
    with pytest.raises(ConfigError) as info:
        LearnerConfig(device=name).validate()
    assert info.value.field == "device" and info.value.value == name
    assert str(info.value).startswith(f"device={name!r}: ")
    assert "auto, cpu, cuda" in info.value.reason


@pytest.mark.parametrize("name", ["cuda", "cuda:0"])
def test_cuda_without_cuda_is_a_config_error(name: str, monkeypatch) -> None:
    no_cuda(monkeypatch)
    with pytest.raises(ConfigError) as info:
        LearnerConfig(device=name).validate()
    assert info.value.field == "device" and info.value.value == name
    assert "CUDA is not available" in info.value.reason
    assert "--device cpu" in info.value.reason  # says what to do instead


def test_a_gpu_that_is_not_there_is_a_config_error(monkeypatch) -> None:
    one_gpu(monkeypatch)
    with pytest.raises(ConfigError, match=r"device='cuda:1': only 1 CUDA device"):
        LearnerConfig(device="cuda:1").validate()


def test_auto_resolves_to_cuda_when_available_else_cpu(monkeypatch) -> None:
    one_gpu(monkeypatch)
    assert resolve_device("auto") == torch.device("cuda", 0)
    no_cuda(monkeypatch)
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")


def test_flag_on_both_command_lines_and_in_the_python_api(capsys, monkeypatch) -> None:
    for main, argv in ((main_cli.main, ["run", "--help"]), (learner_cli.main, ["--help"])):
        with pytest.raises(SystemExit):
            main(argv)
        text = capsys.readouterr().out
        assert re.search(r"--device auto\|cpu\|cuda\|cuda:N", text), text
    assert "device" in learner_cli.RESUME_OVERRIDES
    cfg, _, _ = zmq_rl.make_configs("CartPole-v1", device="cpu")
    assert cfg.device == "cpu"
    with pytest.raises(ConfigError, match="device='gpu'"):
        zmq_rl.make_configs("CartPole-v1", device="gpu")


@pytest.mark.parametrize("device", ["gpu", "cuda"])
def test_zmq_rl_run_refuses_a_device_it_lacks_before_starting(device, monkeypatch, capsys):
    no_cuda(monkeypatch)
    argv = ["run", "--env", STUB_ENV_ID, "--device", device]
    assert main_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert re.search(rf"^error: device='{device}': ", err, re.M), err
    assert "Traceback" not in err


# -- the device boundary on the CPU ----------------------------------------------------------


def make_rollout(T: int = 16, B: int = 4, seed: int = 0) -> Rollout:
    """A CartPole-shaped rollout with one truncation (a final observation) and one
    termination."""
    rng = np.random.default_rng(seed)
    term = np.zeros((T, B), bool)
    trunc = np.zeros((T, B), bool)
    term[5, 1] = True
    trunc[9, 2] = True
    return Rollout(
        slots=[(b, 0) for b in range(B)],
        obs=rng.standard_normal((T, B, 4)).astype(np.float32),
        actions=rng.integers(0, 2, (T, B)).astype(np.int64),
        rewards=np.ones((T, B), np.float32),
        terminated=term,
        truncated=trunc,
        values=rng.standard_normal((T, B)).astype(np.float32),
        log_probs=np.full((T, B), np.log(0.5), np.float32),
        versions=np.zeros((T, B), np.int64),
        bootstrap_obs=rng.standard_normal((B, 4)).astype(np.float32),
        final_t=np.array([9], np.int64),
        final_b=np.array([2], np.int64),
        final_obs=rng.standard_normal((1, 4)).astype(np.float32),
    )


def make_trainer(device: str, use_vtrace: bool = False, policy_type: str = "mlp") -> Trainer:
    cfg = LearnerConfig(
        device=device, num_actors=1, num_envs=4, num_steps=16, use_vtrace=use_vtrace, seed=3
    )
    ppo = PPOConfig(num_epochs=2, minibatch_size=16)
    policy = PolicyConfig(hidden_sizes=(32, 32), policy_type=policy_type)
    return Trainer(cfg, ppo, policy, OBS_SPACE, ACT_SPACE)


def test_cpu_trainer_stays_on_the_cpu_and_exports_its_own_tensors() -> None:
    trainer = make_trainer("cpu")
    assert trainer.device == torch.device("cpu")
    assert all(p.device.type == "cpu" for p in trainer.policy.parameters())
    trainer.update(make_rollout(), 0.0)
    exported = dict(export_weights(trainer.policy))
    for name, tensor in trainer.policy.state_dict().items():
        assert exported[name].dtype == tensor.numpy().dtype
        assert exported[name].tobytes() == tensor.numpy().tobytes(), name  # bit-exact


def test_to_device_and_to_cpu_copy_nothing_on_the_cpu() -> None:
    t = torch.arange(6.0)
    assert to_device(t, torch.device("cpu")) is t
    value = {"a": t, "b": (t, t)}
    moved = to_device(value, torch.device("cpu"))
    assert moved["a"] is t and moved["b"][1] is t
    state = {"x": t, "nested": [t, {"y": t}], "n": 3, "s": "text"}
    out = to_cpu(state)
    assert out["x"] is t and out["nested"][1]["y"] is t and out["n"] == 3 and out["s"] == "text"


def test_cpu_evaluation_uses_the_policy_itself() -> None:
    runlog = RunLog(LearnerConfig(eval_every=0), LearnerReport())
    trainer = make_trainer("cpu")
    assert runlog._on_cpu(trainer.policy) is trainer.policy
    runlog.close()


def test_the_learners_log_line_names_the_device(caplog: pytest.LogCaptureFixture) -> None:
    report = LearnerReport(device="cuda:0", updates_completed=1, env_steps_consumed=64)
    runlog = RunLog(LearnerConfig(), report)
    with caplog.at_level("INFO", logger="zmq_rl.runlog"):
        runlog.record({"charts/policy_lag_mean": 0.0}, version=1, actors=2)
    runlog.close()
    assert re.search(r"^update 1/\d+ .* device cuda:0$", caplog.messages[-1]), caplog.messages


def save_and_read(tmp_path: Path, trainer: Trainer) -> dict:
    """A trainer's state through a checkpoint file and :func:`read_checkpoint`
    (``map_location="cpu"``), with the keys a learner checkpoint must hold."""
    path = tmp_path / "ckpt-00000001.pt"
    run_part = {k: "{}" for k in ("learner_config", "ppo_config", "policy_config", "report")}
    atomic_torch_save({"format": 1, **trainer.state_dict(), **run_part}, path)
    return read_checkpoint(path)


def assert_same_weights(a: Trainer | torch.nn.Module, b: Trainer | torch.nn.Module) -> None:
    """Bit-identical exported weights (of trainers' policies, or of modules)."""
    wa, wb = (export_weights(getattr(x, "policy", x)) for x in (a, b))
    assert [n for n, _ in wa] == [n for n, _ in wb]
    for (name, x), (_, y) in zip(wa, wb, strict=True):
        assert x.tobytes() == y.tobytes(), name


def test_checkpoint_holds_cpu_tensors_and_resumes_bit_exactly(tmp_path: Path) -> None:
    trainer = make_trainer("cpu")
    trainer.update(make_rollout(seed=0), 0.0)
    state = save_and_read(tmp_path, trainer)
    tensors = [state["trainer"]["policy"][k] for k in state["trainer"]["policy"]]
    tensors += [v for s in state["trainer"]["optimizer"]["state"].values() for v in s.values()]
    assert tensors and all(t.device.type == "cpu" for t in tensors)
    resumed = make_trainer("cpu")
    resumed.load_state_dict(state)
    assert_same_weights(trainer, resumed)
    # The next update is the same too: optimiser moments and shuffling RNG came back.
    a = trainer.update(make_rollout(seed=1), 0.5).metrics
    b = resumed.update(make_rollout(seed=1), 0.5).metrics
    assert a == b or all(a[k] == b[k] or (np.isnan(a[k]) and np.isnan(b[k])) for k in a)
    assert_same_weights(trainer, resumed)


# -- a real run ------------------------------------------------------------------------------


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_cpu_run_names_its_device_in_report_and_progress(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "zmq_rl.cli.main",
            "run",
            "--env",
            STUB_ENV_ID,
            "--device",
            "cpu",
            "--num-actors",
            "1",
            "--num-envs",
            "1",
            "--total-env-steps",
            "32",
            "--num-steps",
            "8",
            "--fragment-length",
            "8",
            "--eval-episodes",
            "1",
            "--checkpoint-every",
            "2",
            "--port",
            str(free_port_block(3)),
            "--run-dir",
            str(run_dir),
            "--starvation-timeout",
            "60",
            "--no-plot",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((run_dir / "report.json").read_text())
    assert report["device"] == "cpu" and report["updates_completed"] == 4
    # The plain progress lines (stdout is a pipe) and the summary name the device.
    progress = [line for line in result.stdout.splitlines() if line.startswith("update ")]
    assert progress and all(line.endswith("device cpu") for line in progress), result.stdout
    assert re.search(r"^\s+device\s+cpu$", result.stdout, re.M), result.stdout
    # What the run wrote loads as CPU tensors.
    state = read_checkpoint(sorted((run_dir / "checkpoints").glob("ckpt-*.pt"))[-1])
    assert all(t.device.type == "cpu" for t in state["trainer"]["policy"].values())
    policy_state = torch.load(run_dir / "policy.pt", weights_only=True)
    assert all(t.device.type == "cpu" for t in policy_state["policy"].values())


# -- where a GPU exists ----------------------------------------------------------------------


@NEEDS_CUDA
@pytest.mark.parametrize(
    ("use_vtrace", "policy_type"), [(False, "mlp"), (True, "mlp"), (False, "lstm")]
)
def test_ppo_update_on_cuda_equals_the_cpu_update(
    use_vtrace: bool, policy_type: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same seed, same rollout: the same metrics and weights within float32 tolerance
    (TF32 off: it rounds matmuls to 10 bits on purpose). The weights' tolerance
    allows for Adam's ``g / sqrt(v)`` on parameters whose gradient is near zero."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    cpu = make_trainer("cpu", use_vtrace, policy_type)
    gpu = make_trainer("cuda", use_vtrace, policy_type)
    assert gpu.device == torch.device("cuda", 0)
    assert_same_weights(cpu, gpu)  # built on the CPU from the same seed, then moved
    rollout = make_rollout()
    a = cpu.update(dataclasses.replace(rollout), 0.0).metrics
    b = gpu.update(dataclasses.replace(rollout), 0.0).metrics
    for key in a:
        assert np.isclose(a[key], b[key], rtol=1e-3, atol=1e-4, equal_nan=True), (key, a, b)
    for (name, x), (_, y) in zip(
        export_weights(cpu.policy), export_weights(gpu.policy), strict=True
    ):
        assert isinstance(y, np.ndarray) and y.dtype == x.dtype  # CPU arrays out
        np.testing.assert_allclose(x, y, rtol=1e-3, atol=1e-4, err_msg=name)


@NEEDS_CUDA
@pytest.mark.parametrize("case", ["ppo-discrete", "ppo-remainder", "impact", "poisoned"])
def test_cuda_graph_steps_equal_eager_steps(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The golden cases of tests/ppo_golden.py on CUDA, with the minibatch step captured
    as CUDA graphs and without: the same metrics and weights within float32 tolerance
    (graph capture's warm-up steps are undone), a graph per minibatch size, and a
    poisoned minibatch still skipped and counted."""
    from tests import ppo_golden

    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    results = {}
    for graphs in (True, False):
        monkeypatch.setattr(ppo_golden, "BASE", dataclasses.replace(
            ppo_golden.BASE, cuda_graphs=graphs
        ))  # fmt: skip
        monkeypatch.setattr(ppo_golden, "DEVICE", "cuda")
        results[graphs] = ppo_golden.run_case(case)
        if graphs and case != "poisoned":  # a poisoned update drops its graphs (rerun)
            captured = ppo_golden.LAST_TRAINER.graphs
            assert captured is not None and captured.graphs and not captured.disabled
    for key, eager in results[False].items():
        np.testing.assert_allclose(results[True][key], eager, rtol=1e-4, atol=1e-5, err_msg=key)


@NEEDS_CUDA
def test_cuda_checkpoints_load_on_the_cpu_and_back(tmp_path: Path) -> None:
    gpu = make_trainer("cuda")
    gpu.update(make_rollout(), 0.0)
    state = save_and_read(tmp_path, gpu)
    assert all(t.device.type == "cpu" for t in state["trainer"]["policy"].values())
    cpu = make_trainer("cpu")
    cpu.load_state_dict(state)
    assert_same_weights(gpu, cpu)
    again = make_trainer("cuda")
    again.load_state_dict(save_and_read(tmp_path, cpu))
    assert_same_weights(gpu, again)
    assert all(p.device.type == "cuda" for p in again.policy.parameters())
    again.update(make_rollout(seed=2), 0.5)  # the optimiser state followed its parameters
    save_policy(tmp_path / "policy.pt", gpu.policy, PolicyConfig(hidden_sizes=(32, 32)), "x", 1)
    saved = torch.load(tmp_path / "policy.pt", weights_only=True)
    assert all(t.device.type == "cpu" for t in saved["policy"].values())


@NEEDS_CUDA
def test_evaluation_of_a_cuda_policy_runs_on_a_cpu_copy() -> None:
    runlog = RunLog(LearnerConfig(env_id="CartPole-v1", eval_episodes=2), LearnerReport())
    gpu = make_trainer("cuda")
    copy = runlog._on_cpu(gpu.policy)
    assert copy is not gpu.policy and all(p.device.type == "cpu" for p in copy.parameters())
    assert_same_weights(gpu, copy)
    gpu.update(make_rollout(), 0.0)
    assert runlog._on_cpu(gpu.policy) is copy  # kept, and loaded with the new tensors
    assert_same_weights(gpu, copy)
    result = runlog.evaluate(gpu.policy)
    assert 1.0 <= result["mean_return"] <= 500.0
    runlog.close()


@NEEDS_CUDA
@pytest.mark.timeout(600)
def test_cuda_learner_with_cpu_actors_trains_cartpole(tmp_path: Path) -> None:
    result = zmq_rl.train(
        "CartPole-v1",  # the shipped preset: 2 actors x 4 envs, stops at eval 475
        device="cuda",
        run_dir=tmp_path / "run",
        port=free_port_block(),
        seed=1,
        total_env_steps=100_000,
        tensorboard=False,
        verbose=False,
    )
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["device"] == "cuda:0"
    assert result.last_evaluation is not None
    assert result.last_evaluation["mean_return"] >= 200.0, result.report.evaluations
    # The actors ran on the CPU and loaded CPU weights: the policy file is CPU tensors.
    saved = torch.load(result.policy_path, weights_only=True)
    assert all(t.device.type == "cpu" for t in saved["policy"].values())


def test_a_gpu_runs_checkpoint_resumes_on_a_cpu_machine_with_device_cpu(tmp_path, monkeypatch):
    """A checkpoint written by a run with ``device="cuda"`` (its config says so; its
    tensors are CPU tensors) on a machine without CUDA: resuming as it is fails naming
    the device, ``--device cpu`` resumes it, and the report names this machine's device."""
    no_cuda(monkeypatch)
    trainer = make_trainer("cpu")
    cfg = dataclasses.replace(trainer.cfg, device="cuda", run_dir=str(tmp_path))
    configs = (cfg, PPOConfig(), PolicyConfig())
    report = LearnerReport(device="cuda:0", updates_completed=1)
    state = {**trainer.state_dict(), **run_state(configs, report, {}, (0, 0))}
    write_checkpoint(tmp_path / "checkpoints", "ckpt-00000001.pt", state)
    with pytest.raises(ConfigError, match=r"device='cuda': CUDA is not available"):
        load_resume_configs(tmp_path)
    assert load_resume_configs(tmp_path, device="cpu")[0].device == "cpu"
    # zmq-rl run --resume RUN --device cpu: the override applies from the first read.
    run_parser = main_cli.subparser(main_cli.build_parser(), "run")
    defaults = {a.dest: a.default for a in run_parser._actions}
    args = main_cli.build_parser().parse_args(["run", "--resume", str(tmp_path), "--device", "cpu"])
    resumed, _, _, overrides = resume_configs(str(tmp_path), args, defaults, LEARNER_SECTIONS)
    assert resumed.device == "cpu" and overrides == {"device": "cpu"}
    restored = LearnerReport(device="cpu")
    restore_run_state(read_checkpoint(checkpoint_files(tmp_path)[-1]), restored, Counter())
    assert restored.device == "cpu" and restored.updates_completed == 1
