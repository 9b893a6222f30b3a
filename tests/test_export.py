"""``zmq_rl.load_policy`` and ``zmq-rl export``: the exported ONNX / TorchScript graphs
act exactly as the policy does, on observations recorded from real episodes, in a
process where zmq_rl cannot be imported; safetensors holds the deploy weights.

The policies are built as a run builds them and saved with the learner's own
``save_policy`` (weights perturbed, observation statistics set, so that
normalisation and action clipping matter), which keeps the test to seconds.
"""

from __future__ import annotations

import copy
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
    one, state = policy.predict(obs[0])
    assert state is None and one.shape == (1,) and np.allclose(one, expected[0], atol=1e-6)
    batch, _ = policy.predict(obs[:5])
    assert batch.shape == (5, 1) and np.allclose(batch, expected[:5], atol=1e-6)
    sampled, _ = policy.predict(obs[:50], deterministic=False)
    assert policy.action_space.contains(sampled[0]) and not np.allclose(sampled, expected[:50])
    assert policy.version == 7 and policy.make_env().spec.id == "Pendulum-v1"
    cart, cart_obs = saved_policy(tmp_path / "c", "CartPole-v1")
    action, _ = zmq_rl.load_policy(cart).predict(cart_obs[0])
    assert action.shape == () and int(action) in (0, 1)


def test_predict_returns_action_and_state_as_sb3(tmp_path: Path) -> None:
    """``a, _ = policy.predict(obs)`` (Stable-Baselines3's habit) gives the action for
    one observation and for a batch of two, where the action alone used to raise
    (one) or unpack into two actions (two)."""
    cart, obs = saved_policy(tmp_path, "CartPole-v1")
    policy = zmq_rl.load_policy(cart)
    expected = reference_actions(cart, obs)
    action, state = policy.predict(obs[0])
    assert state is None and action.shape == () and action == expected[0]
    actions, state = policy.predict(obs[:2])
    assert state is None and actions.shape == (2,)
    assert np.array_equal(actions, expected[:2])
    result = policy.predict(obs[:2])
    assert isinstance(result, zmq_rl.Prediction) and isinstance(result, tuple)
    assert len(result) == 2 and result.action is result[0] and result.state is None
    assert copy.deepcopy(result)[0].tolist() == actions.tolist()
    with pytest.raises(ValueError, match="feed-forward and has no state"):
        policy.predict(obs[0], state=np.zeros(4, np.float32))


def test_predict_old_return_form_still_works_with_a_warning(tmp_path: Path) -> None:
    """The deprecation path of docs/api.md: code written when predict returned the
    action alone keeps working, with a FutureWarning, where a pair cannot be meant."""
    cart, obs = saved_policy(tmp_path, "CartPole-v1")
    policy = zmq_rl.load_policy(cart)
    expected = int(reference_actions(cart, obs[:1])[0])
    with pytest.warns(FutureWarning, match="action, state = policy.predict"):
        assert int(policy.predict(obs[0])) == expected
    with pytest.warns(FutureWarning):
        assert policy.predict(obs[0]) in (0, 1)
    with pytest.warns(FutureWarning):
        assert policy.predict(obs[0]) == expected
    with pytest.warns(FutureWarning):
        assert policy.predict(obs[0]).item() == expected
    with pytest.warns(FutureWarning):
        assert policy.predict(obs[:3]).shape == (3,)
    with pytest.warns(FutureWarning):
        assert np.array_equal(np.asarray(policy.predict(obs[:3])), reference_actions(cart, obs[:3]))
    with pytest.warns(FutureWarning):
        assert list(range(3))[policy.predict(obs[0])] == expected
    pend, pend_obs = saved_policy(tmp_path / "p", "Pendulum-v1")
    pendulum = zmq_rl.load_policy(pend)
    env = pendulum.make_env()
    env.reset(seed=0)
    with pytest.warns(FutureWarning):  # env.step(policy.predict(obs)) of a Box env
        env.step(pendulum.predict(pend_obs[0]))
    with pytest.warns(FutureWarning):
        assert np.allclose(pendulum.predict(pend_obs[0]) * 2, 2 * pendulum.predict(pend_obs[0])[0])
    # predict(obs, False): the old positional ``deterministic`` still samples.
    with pytest.warns(FutureWarning, match="deterministic"):
        sampled, state = pendulum.predict(pend_obs[:50], False)
    assert state is None and not np.allclose(sampled, reference_actions(pend, pend_obs[:50]))


class ShiftedActionEnv(gym.Env):
    """Box observations, ``Discrete(3, start=-1)`` actions (-1, 0, 1); refuses others."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Discrete(3, start=-1)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action: int) -> tuple:
        assert self.action_space.contains(action), action
        self.t += 1
        return self.observation_space.sample(), float(action), False, self.t >= 10, {}


def test_discrete_actions_are_the_envs_from_their_start(tmp_path: Path) -> None:
    """predict, the exports and evaluate_policy give the env's actions of a
    ``Discrete(n, start)`` space, not the network's 0-based indices."""
    env_id = f"{__name__}:ShiftedActionEnv"
    env = ShiftedActionEnv()
    torch.manual_seed(0)
    cfg = PolicyConfig(hidden_sizes=(8,))
    network = build_policy(env.observation_space, env.action_space, cfg)
    with torch.no_grad():
        for p in network.parameters():
            p.add_(torch.randn_like(p))
    save_policy(tmp_path / "policy.pt", network, cfg, env_id, 1)
    policy = zmq_rl.load_policy(tmp_path)
    obs = np.stack([env.observation_space.sample() for _ in range(200)])
    indices = network.act(torch.from_numpy(obs), deterministic=True)[0].numpy()
    assert set(indices.tolist()) == {0, 1, 2}
    actions, _ = policy.predict(obs)
    assert np.array_equal(actions, indices - 1)
    script = zmq_rl.export_policy(policy, "torchscript", tmp_path / "p.ts")
    assert np.array_equal(torch.jit.load(str(script))(torch.from_numpy(obs)).numpy(), indices - 1)
    returns, lengths = zmq_rl.evaluate_policy(
        policy, n_eval_episodes=2, return_episode_rewards=True
    )
    assert lengths == [10, 10]  # every action was one the env takes


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


# -- recurrent policies -----------------------------------------------------------------

SEQUENCES, STEPS = 100, 12

# Steps the exported recurrent graphs over [T, B] observations, feeding each step's
# next_state back, with zmq_rl made unimportable.
RECURRENT_RUNNER = r"""
import json, sys
sys.modules["zmq_rl"] = None  # any import of zmq_rl now fails
import numpy as np
import onnxruntime
import torch
data = np.load(sys.argv[1])
obs, starts, size = data["obs"], data["starts"], int(sys.argv[4])
out = {}
module = torch.jit.load(sys.argv[2])
state, actions = torch.zeros(obs.shape[1], size), []
for t in range(obs.shape[0]):
    action, state = module(torch.from_numpy(obs[t]), state, torch.from_numpy(starts[t]))
    actions.append(action.numpy().tolist())
out["torchscript"] = {"actions": actions, "state": state.numpy().tolist()}
session = onnxruntime.InferenceSession(sys.argv[3], providers=["CPUExecutionProvider"])
names = [i.name for i in session.get_inputs()] + [o.name for o in session.get_outputs()]
state, actions = np.zeros((obs.shape[1], size), np.float32), []
for t in range(obs.shape[0]):
    feed = {"obs": obs[t], "state": state, "episode_start": starts[t]}
    action, state = session.run(["action", "next_state"], feed)
    actions.append(action.tolist())
out["onnx"] = {"actions": actions, "state": state.tolist(), "names": names}
out["onnx_meta"] = session.get_modelmeta().custom_metadata_map
print(json.dumps(out))
"""


def saved_recurrent_policy(
    tmp_path: Path, env_id: str, kind: str
) -> tuple[Path, np.ndarray, np.ndarray]:
    """A recurrent policy.pt (perturbed weights, obs statistics) and SEQUENCES
    sequences of STEPS observations from real episodes, time-major ``[T, B, ...]``,
    with their episode starts ``[T, B]``: where an episode of the stream began, plus
    random resets, so states are reset in the middle of sequences."""
    torch.manual_seed(0)
    env = gym.make(env_id)
    cfg = PolicyConfig(policy_type=kind, hidden_sizes=(16,), normalize_obs=True)
    policy = build_policy(env.observation_space, env.action_space, cfg)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    rng = np.random.default_rng(0)
    env.action_space.seed(0)
    obs, _ = env.reset(seed=3)
    stream, starts, start = [], [], True
    while len(stream) < SEQUENCES * STEPS:
        stream.append(np.asarray(obs, np.float32))
        starts.append(start or rng.random() < 0.08)
        obs, _, term, trunc, _ = env.step(env.action_space.sample())
        start = term or trunc
        if start:
            obs, _ = env.reset()
    recorded = np.stack(stream).reshape(SEQUENCES, STEPS, -1).swapaxes(0, 1)
    flags = np.asarray(starts, np.float32).reshape(SEQUENCES, STEPS).T.copy()
    flags[0] = 1.0  # every sequence begins an episode
    policy.update_obs_stats(np.stack(stream) * 1.5 + 0.3)
    tmp_path.mkdir(parents=True, exist_ok=True)
    save_policy(tmp_path / "policy.pt", policy, cfg, env_id, 5)
    return tmp_path / "policy.pt", np.ascontiguousarray(recorded), flags


def recurrent_reference(
    path: Path, obs: np.ndarray, starts: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """What the trained network does as an actor runs it: act_recurrent from the
    state of the previous step, zeroed where an episode starts; (actions [T, B, ...]
    clipped to the Box bounds, the final state [B, S])."""
    network = zmq_rl.load_policy(path).network
    state = network.initial_state(obs.shape[1])
    actions = []
    for t in range(obs.shape[0]):
        state = state * (1.0 - torch.from_numpy(starts[t])).unsqueeze(-1)
        action, _, _, state = network.act_recurrent(
            torch.from_numpy(obs[t]), state, deterministic=True
        )
        actions.append(action.numpy())
    space = zmq_rl.load_policy(path).action_space
    stacked = np.stack(actions)
    if isinstance(space, gym.spaces.Box):
        stacked = np.clip(stacked, space.low, space.high)
    return stacked, state.numpy()


def assert_actions_equal(got: np.ndarray, expected: np.ndarray, what: str) -> None:
    assert got.shape == expected.shape, what
    if expected.dtype == np.int64:
        assert got.dtype == np.int64 and np.array_equal(got, expected), what
    else:
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5, err_msg=what)


@pytest.mark.parametrize(("env_id", "kind"), [("CartPole-v1", "lstm"), ("Pendulum-v1", "gru")])
def test_recurrent_exports_and_predict_act_as_the_policy(
    tmp_path: Path, env_id: str, kind: str
) -> None:
    """A recurrent policy exports to ONNX (through ``zmq-rl export``, the command of
    issue 29's report) and TorchScript; the graphs, run where zmq_rl cannot be
    imported, and ``predict(obs, state, episode_start)`` give the network's actions
    and states on 100 observation sequences whose states are reset mid-sequence."""
    pytest.importorskip("onnxruntime", reason="pip install 'zmq_rl[export]'")
    path, obs, starts = saved_recurrent_policy(tmp_path, env_id, kind)
    assert starts[1:].any()  # resets inside the sequences
    expected, final = recurrent_reference(path, obs, starts)
    never_reset, _ = recurrent_reference(path, obs, np.zeros_like(starts))
    _, final_never = recurrent_reference(path, obs, np.zeros_like(starts))
    assert not np.allclose(final, final_never)  # the resets matter to the states
    if env_id == "CartPole-v1":
        assert set(np.unique(expected).tolist()) == {0, 1}
    else:
        assert not np.allclose(expected, never_reset)
    onnx_file = tmp_path / "exported" / "policy.onnx"
    done = subprocess.run(
        [ZMQ_RL, "export", str(tmp_path), "--format", "onnx", "--out", str(onnx_file)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    script_file = zmq_rl.export_policy(path, "torchscript", tmp_path / "policy.ts")
    np.savez(tmp_path / "seq.npz", obs=obs, starts=starts)
    policy = zmq_rl.load_policy(path)
    run = subprocess.run(
        [sys.executable, "-c", RECURRENT_RUNNER, str(tmp_path / "seq.npz"), str(script_file)]
        + [str(onnx_file), str(policy.state_size)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout)
    assert got["onnx"]["names"] == ["obs", "state", "episode_start", "action", "next_state"]
    for fmt in ("torchscript", "onnx"):
        actions = np.asarray(got[fmt]["actions"], expected.dtype)
        assert_actions_equal(actions, expected, fmt)
        np.testing.assert_allclose(got[fmt]["state"], final, rtol=0, atol=1e-5, err_msg=fmt)
    meta = got["onnx_meta"]
    assert meta["cell"] == kind and int(meta["state_size"]) == policy.state_size
    # predict, as RecurrentPPO.predict: the batch of 100 ...
    state, actions = None, []
    for t in range(STEPS):
        action, state = policy.predict(obs[t], state=state, episode_start=starts[t].astype(bool))
        actions.append(action)
    assert_actions_equal(np.stack(actions), expected, "predict")
    np.testing.assert_allclose(state, final, rtol=0, atol=1e-6)
    # ... and one sequence, one observation at a time (state [state_size]).
    state = None
    for t in range(STEPS):
        action, state = policy.predict(obs[t, 7], state, bool(starts[t, 7]))
        assert_actions_equal(np.asarray(action), expected[t, 7], f"predict one, step {t}")
    assert state.shape == (policy.state_size,)
    np.testing.assert_allclose(state, final[7], rtol=0, atol=1e-6)
    assert np.array_equal(policy.initial_state(4), np.zeros((4, policy.state_size), np.float32))
    # safetensors: the cell's weights (PyTorch's layout), no critic.
    out = zmq_rl.export_policy(path, "safetensors", tmp_path / "policy.safetensors")
    with open(out, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    assert "network.rnn.weight_hh_l0" in header and not any("value_head" in k for k in header)
    assert json.loads(header["__metadata__"]["observation_shape"]) == list(obs.shape[2:])
    with pytest.raises(ValueError, match=r"state of shape \(3,\) does not fit"):
        policy.predict(obs[0, 0], state=np.zeros(3))
    with pytest.raises(ValueError, match="episode_start of shape"):
        policy.predict(obs[0], episode_start=np.zeros(3, bool))
