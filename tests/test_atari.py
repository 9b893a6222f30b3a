"""Atari: the preprocessed envs of :mod:`zmq_rl.envs` and the CNN of :mod:`zmq_rl.rl.cnn`.

A real (tiny) training run on Pong: ``zmq-rl run`` with actor processes stepping
``AtariPreprocessing`` + ``FrameStackObservation`` frames (uint8 ``[4, 84, 84]``)
and the Nature CNN learning from them for three updates, then evaluating. The ALE
parts are skipped with a reason when ale-py (or OpenCV) is not installed; the
missing-dependency message and the network itself are tested either way.
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
from zmq_rl import envs as atari_envs
from zmq_rl.cli import main as main_cli
from zmq_rl.config import PolicyConfig
from zmq_rl.rl.cnn import NatureCNN, nature_cnn
from zmq_rl.rl.policy import check_policy_interface, export_weights, import_weights

HAVE_ALE = importlib.util.find_spec("ale_py") is not None
HAVE_CV2 = importlib.util.find_spec("cv2") is not None
needs_ale = pytest.mark.skipif(
    not (HAVE_ALE and HAVE_CV2),
    reason="Atari needs ale-py and OpenCV: pip install 'zmq_rl[atari]'",
)

SHORT_PONG = "AtariPongShort-v0"
SHORT_PONG_ID = f"tests.test_atari:{SHORT_PONG}"
"""Pong through zmq_rl.envs, cut at 100 agent steps so that evaluation is quick.
Registered here, so any process (the actors too) can make it by this id."""
if SHORT_PONG not in gym.registry:
    gym.register(
        SHORT_PONG,
        entry_point=atari_envs.make_atari,
        kwargs={"game": "Pong"},
        max_episode_steps=100,
    )

FRAMES = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
ACTIONS = gym.spaces.Discrete(6)


@pytest.fixture(autouse=True)
def one_torch_thread():
    """As the learner and actors run (torch_threads = 1): on a busy machine, torch's
    default thread pool can make the 512 x 3136 orthogonal init take seconds."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_missing_ale_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ale_py", None)  # import ale_py -> ImportError
    with pytest.raises(atari_envs.AtariUnavailable, match=r"pip install ale-py"):
        gym.make("zmq_rl.envs:AtariPong-v0")
    assert issubclass(atari_envs.AtariUnavailable, ImportError)


def test_every_benchmark_game_is_registered() -> None:
    assert len(atari_envs.GAMES) == 57
    for game in ("Pong", "Breakout", "SpaceInvaders", "MontezumaRevenge"):
        assert atari_envs.env_id(game) in gym.registry
    assert atari_envs.register_game("Pong") == "AtariPong-v0"  # idempotent


@needs_ale
def test_preprocessed_pong_frames() -> None:
    env = gym.make("zmq_rl.envs:AtariPong-v0")
    try:
        assert env.observation_space == FRAMES
        assert env.action_space == ACTIONS
        obs, _ = env.reset(seed=0)
        assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
        for _ in range(5):
            obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
        assert obs.max() > 0  # real pixels
    finally:
        env.close()


def test_nature_cnn_follows_the_policy_interface() -> None:
    torch.manual_seed(0)
    policy = nature_cnn(FRAMES, ACTIONS, PolicyConfig())
    check_policy_interface(policy, "zmq_rl.rl.cnn:nature_cnn")
    assert isinstance(policy, NatureCNN)
    frames = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)
    gen = torch.Generator().manual_seed(1)
    action, log_prob, value = policy.act(frames, gen)
    assert action.dtype == torch.int64 and action.shape == log_prob.shape == value.shape == (5,)
    # The actors' uint8 frames and the learner's / evaluation's float copies agree exactly.
    floats = frames.float()
    with torch.no_grad():
        assert torch.equal(policy(frames)[0], policy(floats)[0])
        assert torch.equal(policy.value(frames), value)
    new_log_prob, entropy, new_value = policy.evaluate_actions(floats, action)
    torch.testing.assert_close(new_log_prob, log_prob)
    assert entropy.requires_grad and torch.all(entropy > 0)
    # An untrained policy is near uniform (policy head gain 0.01).
    assert torch.allclose(entropy, torch.full((5,), float(np.log(6))), atol=1e-2)
    # Same spaces, same network: weights move between two builds (learner -> actor).
    torch.manual_seed(9)
    other = nature_cnn(FRAMES, ACTIONS, PolicyConfig())
    import_weights(other, export_weights(policy))
    with torch.no_grad():
        assert torch.equal(other(frames)[0], policy(frames)[0])
    # Channels-last frames are permuted; single-channel frames get a channel axis.
    hwc = nature_cnn(gym.spaces.Box(0, 255, (84, 84, 4), np.uint8), ACTIONS, PolicyConfig())
    assert hwc.act(frames.permute(0, 2, 3, 1))[0].shape == (5,)
    gray = nature_cnn(gym.spaces.Box(0, 255, (84, 84), np.uint8), ACTIONS, PolicyConfig())
    assert gray.act(frames[:, 0])[0].shape == (5,)


def test_nature_cnn_refuses_what_it_cannot_handle() -> None:
    with pytest.raises(ValueError, match="Discrete action space"):
        nature_cnn(FRAMES, gym.spaces.Box(-1, 1, (2,)), PolicyConfig())
    with pytest.raises(ValueError, match="image Box"):
        nature_cnn(gym.spaces.Box(-1, 1, (8,)), ACTIONS, PolicyConfig())
    with pytest.raises(ValueError, match="normalize_obs"):
        nature_cnn(FRAMES, ACTIONS, PolicyConfig(normalize_obs=True))


@needs_ale
@pytest.mark.timeout(120)
def test_cnn_trains_a_few_updates_on_pong(tmp_path, capsys) -> None:
    run_dir = tmp_path / "pong"
    argv = [
        "run",
        "--env", SHORT_PONG_ID,
        "--factory", "zmq_rl.rl.cnn:nature_cnn",
        "--actors", "1",
        "--num-envs", "2",
        "--num-steps", "16",
        "--fragment-length", "16",
        "--total-env-steps", "96",
        "--num-epochs", "2",
        "--minibatch-size", "16",
        "--eval-episodes", "1",
        "--target-return", "inf",
        "--port", str(free_port_block()),
        "--run-dir", str(run_dir),
        "--no-plot",
    ]  # fmt: skip
    assert main_cli.main(argv) == 0, capsys.readouterr().err
    report = json.loads((run_dir / "report.json").read_text())
    assert report["updates_completed"] == 3 and report["env_steps_consumed"] == 96
    assert report["stop_reason"] == "budget spent"
    assert not [k for k in report["counters"] if k.startswith("rejected/")], report["counters"]
    final = report["evaluations"][-1]
    assert -21.0 <= final["mean_return"] <= 21.0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for row in [r for r in rows if "eval/mean_return" not in r]:  # the update rows
        assert np.isfinite(row["losses/policy_loss"]) and np.isfinite(row["losses/value_loss"])
    actor = report["actor_stats"]["0"]
    assert actor["actor/policy_updates_received"] >= 1
