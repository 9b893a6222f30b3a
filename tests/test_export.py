"""``zmq_rl.load_policy`` and ``zmq-rl export``: the exported ONNX / TorchScript graphs
act exactly as the policy does, on observations recorded from real episodes, in a
process where zmq_rl cannot be imported; safetensors holds the deploy weights.

The policies are built as a run builds them and saved with the learner's own
``save_policy`` (weights perturbed, observation statistics set, so that
normalisation and action clipping matter), which keeps the test to seconds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import zmq_rl
from zmq_rl.config import PolicyConfig
from zmq_rl.learner.checkpoint import save_policy
from zmq_rl.rl.policy import build_policy

ZMQ_RL = str(Path(sys.executable).with_name("zmq-rl"))
TIMEOUT = 300  # a bound only

# Runs the exported files with zmq_rl made unimportable: they must need only
# torch / onnxruntime.
RUNNER = r"""
import json, sys
sys.modules["zmq_rl"] = None  # any import of zmq_rl now fails
import numpy as np
obs = np.load(sys.argv[1])
out = {}
import torch
module = torch.jit.load(sys.argv[2])
out["torchscript"] = module(torch.from_numpy(obs)).numpy().tolist()
try:
    import onnxruntime
except ImportError:
    pass
else:
    session = onnxruntime.InferenceSession(sys.argv[3], providers=["CPUExecutionProvider"])
    out["onnx"] = session.run(["action"], {"obs": obs})[0].tolist()
    out["onnx_meta"] = session.get_modelmeta().custom_metadata_map
print(json.dumps(out))
"""


def saved_policy(tmp_path: Path, env_id: str, **env_kwargs: object) -> tuple[Path, np.ndarray]:
    """A policy.pt for ``env_id`` with perturbed weights and obs statistics, and
    200 observations recorded from episodes it played (stochastically)."""
    torch.manual_seed(0)
    env = gym.make(env_id, **env_kwargs)
    cfg = PolicyConfig(hidden_sizes=(16, 16), normalize_obs=True)
    policy = build_policy(env.observation_space, env.action_space, cfg)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    observations = []
    obs, _ = env.reset(seed=3)
    generator = torch.Generator().manual_seed(1)
    while len(observations) < 200:
        observations.append(np.asarray(obs, np.float32))
        action = policy.act(torch.from_numpy(observations[-1][None]), generator)[0][0].numpy()
        if isinstance(env.action_space, gym.spaces.Box):
            action = np.clip(action, env.action_space.low, env.action_space.high)
        obs, _, term, trunc, _ = env.step(action.item() if action.ndim == 0 else action)
        if term or trunc:
            obs, _ = env.reset()
    recorded = np.stack(observations)
    policy.update_obs_stats(recorded * 1.5 + 0.3)  # statistics unlike the raw scale
    path = tmp_path / "policy.pt"
    tmp_path.mkdir(parents=True, exist_ok=True)
    save_policy(path, policy, cfg, env_id, 7, env_kwargs=env_kwargs)
    return path, recorded


def reference_actions(path: Path, obs: np.ndarray) -> np.ndarray:
    """What the trained network itself does: its deterministic act(), clipped to the
    Box bounds as an actor clips before env.step."""
    deployed = zmq_rl.load_policy(path)
    actions = deployed.network.act(torch.from_numpy(obs), deterministic=True)[0].numpy()
    if not deployed.discrete:
        space = deployed.action_space
        actions = np.clip(actions, space.low, space.high)
    return actions


@pytest.mark.parametrize(
    ("env_id", "env_kwargs"), [("CartPole-v1", {}), ("Pendulum-v1", {"g": 9.0})]
)
def test_exports_act_as_the_policy_without_zmq_rl(
    tmp_path: Path, env_id: str, env_kwargs: dict
) -> None:
    path, obs = saved_policy(tmp_path, env_id, **env_kwargs)
    expected = reference_actions(path, obs)
    if env_id == "Pendulum-v1":  # the perturbed means leave the bounds: clipping is tested
        assert (np.abs(expected) == 2.0).any() and (np.abs(expected) < 2.0).any()
    else:
        assert set(expected.tolist()) == {0, 1}
    onnx_file = zmq_rl.export_policy(path, "onnx", tmp_path / "policy.onnx")
    script_file = zmq_rl.export_policy(tmp_path, "torchscript", tmp_path / "policy.ts")
    np.save(tmp_path / "obs.npy", obs)
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, str(tmp_path / "obs.npy"), str(script_file), str(onnx_file)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout)
    discrete = env_id == "CartPole-v1"
    formats = ["torchscript"] + (["onnx"] if "onnx" in got else [])
    for fmt in formats:
        actions = np.asarray(got[fmt])
        assert actions.shape == expected.shape, fmt
        if discrete:
            assert actions.dtype == np.int64 and np.array_equal(actions, expected), fmt
        else:
            np.testing.assert_allclose(actions, expected, rtol=0, atol=1e-5, err_msg=fmt)
    if "onnx" not in got:
        pytest.skip("onnxruntime is not installed (pip install 'zmq_rl[export]'): ONNX unchecked")
    meta = got["onnx_meta"]
    if meta:  # written when the onnx package is installed
        assert meta["env_id"] == env_id and json.loads(meta["env_kwargs"]) == env_kwargs
        assert meta["version"] == "7"


def test_load_policy_predict(tmp_path: Path) -> None:
    path, obs = saved_policy(tmp_path, "Pendulum-v1")
    policy = zmq_rl.load_policy(tmp_path)
    assert isinstance(policy, torch.nn.Module) and not policy.training
    expected = reference_actions(path, obs)
    one = policy.predict(obs[0])
    assert one.shape == (1,) and np.allclose(one, expected[0], atol=1e-6)
    batch = policy.predict(obs[:5])
    assert batch.shape == (5, 1) and np.allclose(batch, expected[:5], atol=1e-6)
    sampled = policy.predict(obs[:50], deterministic=False)
    assert policy.action_space.contains(sampled[0]) and not np.allclose(sampled, expected[:50])
    assert policy.version == 7 and policy.make_env().spec.id == "Pendulum-v1"
    cart, cart_obs = saved_policy(tmp_path / "c", "CartPole-v1")
    action = zmq_rl.load_policy(cart).predict(cart_obs[0])
    assert action.shape == () and int(action) in (0, 1)


def test_safetensors_holds_the_deploy_weights(tmp_path: Path) -> None:
    path, obs = saved_policy(tmp_path, "CartPole-v1")
    out = zmq_rl.export_policy(path, "safetensors", tmp_path / "policy.safetensors")
    safetensors = pytest.importorskip("safetensors.torch")
    tensors = safetensors.load_file(str(out))
    assert not any("critic" in name or "value_head" in name for name in tensors)
    # Rebuild the deterministic action from the file alone, as another framework would.
    x = torch.from_numpy(obs)
    x = ((x - tensors["obs_mean"]) / tensors["obs_std"]).clamp(-10, 10)
    for i in (0, 2):
        w = tensors[f"network.actor_trunk.{i}.weight"]
        x = torch.tanh(x @ w.T + tensors[f"network.actor_trunk.{i}.bias"])
    logits = x @ tensors["network.policy_head.weight"].T + tensors["network.policy_head.bias"]
    assert np.array_equal(logits.argmax(-1).numpy(), reference_actions(path, obs))
    with open(out, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        meta = json.loads(f.read(size))["__metadata__"]
    assert meta["env_id"] == "CartPole-v1" and json.loads(meta["action"]) == {
        "type": "discrete",
        "n": 2,
    }


def test_export_command(tmp_path: Path) -> None:
    saved_policy(tmp_path, "CartPole-v1")
    out = tmp_path / "exported" / "policy.pt2"
    done = subprocess.run(
        [ZMQ_RL, "export", str(tmp_path), "--format", "torchscript", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert out.is_file() and f"wrote {out}" in done.stdout
    missing = subprocess.run(
        [ZMQ_RL, "export", str(tmp_path / "nope"), "--format", "onnx", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert missing.returncode == 1 and "no such policy file" in missing.stderr
    assert "Traceback" not in missing.stderr
