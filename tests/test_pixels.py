"""Learning from pixels on a CPU (issue 14, item 3): MinAtar through
:mod:`zmq_rl.envs` (``MinAtar<Game>-v1``: ``[C, 10, 10]`` uint8 frames of 0/1 cells)
and MinAtar's network, :func:`zmq_rl.rl.cnn.minatar_cnn`.

The frames, the network's interface and a real three-update ``zmq-rl run`` (actor
processes stepping MinAtar Breakout, the learner training the CNN) are tested; the
learning curve itself is docs/benchmarks.md's (hours of CPU, not a test). Skipped with
a reason when minatar is not installed; the missing-package message is tested either
way.
"""

from __future__ import annotations

import importlib.util
import json
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

from tests.conftest import free_port_block
from zmq_rl import envs
from zmq_rl.cli import main as main_cli
from zmq_rl.config import PolicyConfig
from zmq_rl.rl.cnn import minatar_cnn
from zmq_rl.rl.policy import check_policy_interface

needs_minatar = pytest.mark.skipif(
    importlib.util.find_spec("minatar") is None,
    reason="MinAtar is not installed: pip install 'zmq_rl[pixels]'",
)


def test_every_minatar_game_is_registered() -> None:
    for game in envs.MINATAR_GAMES:
        assert f"MinAtar{game}-v1" in gym.registry


def test_missing_minatar_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "minatar.gym", None)  # import fails
    with pytest.raises(envs.MinAtarUnavailable, match=r"zmq_rl\[pixels\]"):
        envs.make_minatar("Breakout")


@needs_minatar
@pytest.mark.parametrize("game", envs.MINATAR_GAMES)
def test_frames_are_channels_first_uint8_cells(game: str) -> None:
    env = gym.make(f"MinAtar{game}-v1")
    try:
        obs, _ = env.reset(seed=0)
        space = env.observation_space
        assert obs.dtype == np.uint8 and obs.shape == space.shape and space.shape[1:] == (10, 10)
        assert set(np.unique(obs)) <= {0, 1} and obs.sum() > 0  # something is on screen
        assert space.contains(obs)
        for _ in range(5):
            obs, *_ = env.step(env.action_space.sample())
            assert space.contains(obs)
    finally:
        env.close()


@needs_minatar
def test_minatar_cnn_follows_the_policy_interface() -> None:
    env = gym.make("MinAtarBreakout-v1")
    policy = minatar_cnn(env.observation_space, env.action_space, PolicyConfig())
    check_policy_interface(policy, "zmq_rl.rl.cnn:minatar_cnn")
    obs = torch.as_tensor(np.stack([env.reset(seed=s)[0] for s in range(3)]))
    action, log_prob, value = policy.act(obs)
    assert action.shape == (3,) and bool((action < env.action_space.n).all())
    assert torch.isfinite(log_prob).all() and torch.isfinite(value).all()
    # 0/1 cells are used as they are: a frame of ones is not scaled down by 1/255.
    assert policy.scale == 1.0
    env.close()


def test_minatar_cnn_refuses_what_it_cannot_handle() -> None:
    box = gym.spaces.Box(0, 1, (4, 10, 10), np.uint8)
    with pytest.raises(ValueError, match="image Box observation space of shape"):
        minatar_cnn(gym.spaces.Box(0, 1, (10,), np.float32), gym.spaces.Discrete(3), PolicyConfig())
    with pytest.raises(ValueError, match="Discrete action space"):
        minatar_cnn(box, gym.spaces.Box(-1, 1, (2,)), PolicyConfig())


@needs_minatar
@pytest.mark.timeout(240)
def test_minatar_breakout_trains_a_few_updates_through_real_processes(tmp_path, capsys) -> None:
    run_dir = tmp_path / "breakout"
    argv = [
        "run",
        "--env", "MinAtarBreakout-v1",  # its preset: the MinAtar CNN
        "--actors", "2",
        "--num-envs", "2",
        "--num-steps", "32",
        "--fragment-length", "16",
        "--batch-rows", str(2 * 2 * 32),  # (the preset's is 2,048)
        "--total-env-steps", str(3 * 2 * 2 * 32),
        "--num-epochs", "2",
        "--minibatch-size", "64",
        "--eval-episodes", "2",
        "--target-return", "inf",
        "--port", str(free_port_block()),
        "--run-dir", str(run_dir),
        "--no-plot",
    ]  # fmt: skip
    assert main_cli.main(argv) == 0, capsys.readouterr().err
    report = json.loads((run_dir / "report.json").read_text())
    assert report["updates_completed"] == 3 and report["env_steps_consumed"] == 384
    assert report["stop_reason"] == "budget spent"
    assert not [k for k in report["counters"] if k.startswith("rejected/")], report["counters"]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "eval/mean_return" not in r]  # the update rows
    assert rows and all(np.isfinite(r["losses/policy_loss"]) for r in rows)
    assert 0.0 <= report["evaluations"][-1]["mean_return"] < 100.0
