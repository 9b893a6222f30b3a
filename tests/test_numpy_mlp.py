"""The plain MLP without torch (zmq_rl/rl/numpy_mlp.py): its layout is the torch
module's, it acts as the numpy sampler on the torch module does, it refuses what the
torch module refuses, and a real actor of a real run never imports torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from zmq_rl.actor.agent import PolicyRunner
from zmq_rl.config import LearnerConfig, PolicyConfig
from zmq_rl.learner.settings import run_settings
from zmq_rl.rl.numpy_act import NumpySampler
from zmq_rl.rl.numpy_mlp import NumpyMLP, mlp_dims, mlp_forward, mlp_layout, rng_of
from zmq_rl.rl.policy import ActorCritic, build_policy, check_weights, export_weights
from zmq_rl.rl.weights import WeightsMismatch
from zmq_rl.wire.protocol import Weights, Welcome

from .ports import free_port_block

BOX3 = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
CONFIGS = [
    PolicyConfig(),
    PolicyConfig(shared_trunk=True, hidden_sizes=(5,)),
    PolicyConfig(activation="relu", normalize_obs=True, hidden_sizes=(7, 6, 5)),
    PolicyConfig(ortho_init=False, normalize_obs=True, shared_trunk=True),
]
ACTIONS = [gym.spaces.Discrete(4), gym.spaces.Box(-2.0, 2.0, (2,), np.float32)]


def _numpy_dtype(tensor: torch.Tensor) -> np.dtype:
    return tensor.detach().numpy().dtype


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("action_space", ACTIONS, ids=["discrete", "box"])
def test_the_layout_is_the_torch_modules_state_dict(cfg, action_space):
    """Names in order, shapes and dtypes: a wrong index (the activation's slot), a
    missing buffer or a float64 bias would refuse every broadcast."""
    obs_space = gym.spaces.Box(-1.0, 1.0, (2, 3), np.float32)  # flattened: 6
    dims = mlp_dims(obs_space, action_space, cfg)
    module = build_policy(obs_space, action_space, cfg)
    assert type(module) is ActorCritic and dims is not None
    want = [(k, tuple(v.shape), _numpy_dtype(v)) for k, v in module.state_dict().items()]
    got = [(k, shape, dtype) for k, (shape, dtype) in mlp_layout(dims, cfg).items()]
    assert got == want


@pytest.mark.parametrize(
    ("obs_space", "action_space", "cfg"),
    [
        (gym.spaces.Discrete(5), gym.spaces.Discrete(2), PolicyConfig()),
        (gym.spaces.Box(0, 9, (4,), np.int64), gym.spaces.Discrete(2), PolicyConfig()),
        (BOX3, gym.spaces.Discrete(3, start=1), PolicyConfig()),
        (BOX3, gym.spaces.MultiDiscrete([2, 3]), PolicyConfig()),
        (BOX3, gym.spaces.Box(-1.0, 1.0, (2, 2), np.float32), PolicyConfig()),
        (BOX3, gym.spaces.Discrete(2), PolicyConfig(policy_type="gru")),
    ],
    ids=["discrete-obs", "int-box-obs", "start-1", "multidiscrete", "2d-box-action", "gru"],
)
def test_mlp_dims_is_none_exactly_where_another_network_is_built(obs_space, action_space, cfg):
    assert mlp_dims(obs_space, action_space, cfg) is None
    assert type(build_policy(obs_space, action_space, cfg)) is not ActorCritic


def _loaded_pair(cfg: PolicyConfig, action_space, seed: int) -> tuple[NumpyMLP, NumpySampler]:
    """A torch module with trained-looking weights (and observation statistics) and a
    NumpyMLP loaded with the same weights, both seeded ``seed``."""
    torch.manual_seed(seed)
    module = build_policy(BOX3, action_space, cfg)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    if cfg.normalize_obs:
        module.update_obs_stats(np.random.default_rng(seed).normal(2.0, 3.0, (50, 3)))
    mlp = NumpyMLP(mlp_dims(BOX3, action_space, cfg), cfg, rng_of(seed))
    mlp.load(export_weights(module))
    return mlp, NumpySampler(module, seed)


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("action_space", ACTIONS, ids=["discrete", "box"])
def test_numpy_mlp_acts_bit_for_bit_as_the_sampler_on_the_torch_module(cfg, action_space):
    mlp, sampler = _loaded_pair(cfg, action_space, seed=3)
    obs = np.random.default_rng(0).normal(0.0, 4.0, (8, 3)).astype(np.float32)
    for _ in range(5):  # the random streams advance alike
        for got, want in zip(mlp.act(obs), sampler.act(obs), strict=True):
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)


def test_a_mismatch_is_refused_in_the_torch_words_and_changes_nothing():
    cfg = PolicyConfig(normalize_obs=True)
    mlp, sampler = _loaded_pair(cfg, ACTIONS[1], seed=1)
    good = mlp.named_arrays()
    cases = {
        "shape": [(n, a[:1] if n == "policy_head.bias" else a) for n, a in good],
        "dtype": [(n, a.astype(np.float64) if n == "log_std" else a) for n, a in good],
        "scalar": [(n, a.reshape(1) if n == "obs_count" else a) for n, a in good],
        "missing": good[1:],
        "unexpected": [*good, ("extra", np.zeros(1, np.float32))],
        "duplicate": [*good, good[0]],
        "not-an-array": [(n, a.tolist() if n == "log_std" else a) for n, a in good],
    }
    for name, weights in cases.items():
        with pytest.raises(WeightsMismatch) as numpy_error:
            mlp.load(weights)
        with pytest.raises(WeightsMismatch) as torch_error:
            check_weights(sampler.policy, weights)
        assert str(numpy_error.value) == str(torch_error.value), name
    for (n, a), (m, b) in zip(mlp.named_arrays(), good, strict=True):
        assert n == m and np.array_equal(a, b)  # nothing loaded from a refused message


def _welcome(cfg: PolicyConfig, module: torch.nn.Module, version: int = 0) -> Welcome:
    spaces = (BOX3, gym.spaces.Discrete(4))
    return Welcome(
        actor_id=0, run_id="r", base_version=0, experience_port=1, weights_port=2,
        settings=run_settings(LearnerConfig(env_id=""), *spaces, cfg),
        weights=Weights(version=version, run_id="r", tensors=export_weights(module)),
    )  # fmt: skip


def test_a_runner_holds_the_mlp_in_numpy_until_its_torch_module_is_asked_for():
    """Before: no module; reading ``policy`` builds one with the newest weights, and
    the actions go on with the same random stream as a runner that never built one."""
    cfg = PolicyConfig()
    torch.manual_seed(0)
    first = build_policy(BOX3, gym.spaces.Discrete(4), cfg)
    newer = build_policy(BOX3, gym.spaces.Discrete(4), cfg)
    welcome = _welcome(cfg, first)
    switching, staying = PolicyRunner(welcome, seed=5), PolicyRunner(welcome, seed=5)
    assert switching.mlp is not None and switching._policy is None
    update = Weights(version=1, run_id="r", tensors=export_weights(newer))
    assert switching.load(update) and staying.load(update)
    obs = np.random.default_rng(1).normal(size=(6, 3)).astype(np.float32)
    np.testing.assert_array_equal(switching.act(obs)[0], staying.act(obs)[0])
    module = switching.policy  # the torch module, built now
    assert switching.mlp is None and switching.policy is module
    for name, tensor in module.state_dict().items():
        assert torch.equal(tensor, newer.state_dict()[name]), name
    for _ in range(3):
        for got, want in zip(switching.act(obs)[:3], staying.act(obs)[:3], strict=True):
            np.testing.assert_array_equal(got, want)
    # From now on the module holds the weights: a later broadcast lands in it.
    back = Weights(version=2, run_id="r", tensors=export_weights(first))
    assert switching.load(back) and staying.load(back)
    assert torch.equal(module.policy_head.weight, first.policy_head.weight)
    bad = Weights(version=3, run_id="r", tensors=export_weights(first)[1:])
    assert not switching.load(bad) and not staying.load(bad)
    assert switching.version == staying.version == 2


NO_TORCH_ACTOR = textwrap.dedent(
    """
    import sys

    class NoTorch:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ImportError(f"this actor must not import {name}")

    sys.meta_path.insert(0, NoTorch())
    from zmq_rl.cli.actor import main

    code = main(sys.argv[1:])
    print("torch imported:", "torch" in sys.modules)
    sys.exit(code)
    """
)


def test_a_real_actor_of_a_real_run_trains_without_importing_torch(tmp_path: Path):
    """A ``zmq-learner`` on CartPole and one ``zmq-actor`` whose process refuses to import
    torch: the run consumes its whole budget from that actor and ends cleanly."""
    port = free_port_block(3)
    root = Path(__file__).resolve().parents[1]
    learner = subprocess.Popen(
        [sys.executable, "-m", "zmq_rl.cli.learner", "--env", "CartPole-v1",
         "--num-actors", "1", "--total-env-steps", "6144", "--port", str(port),
         "--run-dir", str(tmp_path / "run"), "--target-return", "inf"],
        cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        actor = subprocess.run(
            [sys.executable, "-c", NO_TORCH_ACTOR, "--learner", f"127.0.0.1:{port}",
             "--env", "CartPole-v1"],
            cwd=root, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        out, _ = learner.communicate(timeout=120)
    finally:
        if learner.poll() is None:
            learner.kill()
            learner.communicate(timeout=30)
    assert actor.returncode == 0, actor.stderr[-3000:]
    assert "torch imported: False" in actor.stdout, actor.stdout[-2000:]
    assert learner.returncode == 0, out[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert max(row["env_steps"] for row in rows) >= 6144  # trained on its experience


def _torch_mapped(pid: int) -> bool:
    """Whether process ``pid`` has torch's library loaded (imported torch)."""
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.parametrize("action_space", ACTIONS, ids=["discrete", "box"])
def test_the_mode_in_numpy_is_torchs_mode(action_space):
    cfg = PolicyConfig(normalize_obs=True)
    mlp, sampler = _loaded_pair(cfg, action_space, seed=2)
    obs = np.random.default_rng(2).normal(0.0, 4.0, (64, 3)).astype(np.float32)
    with torch.no_grad():
        want, _, _ = sampler.policy.act(torch.from_numpy(obs), deterministic=True)
    got = mlp.mode(obs)
    assert got.dtype == want.numpy().dtype and got.shape == tuple(want.shape)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)


def test_a_torch_module_and_its_numpy_copy_score_alike_and_the_evaluator_has_no_torch():
    """In-process evaluation of the torch module and the background evaluator's numpy
    network give the same numbers (a run's best policy is re-scored in process), and
    the background evaluator of the plain MLP never loads torch."""
    from zmq_rl.learner.evaluation import BackgroundEvaluator, evaluate_policy

    cfg = PolicyConfig(hidden_sizes=(16,))
    space = gym.make("CartPole-v1")
    torch.manual_seed(4)
    module = build_policy(space.observation_space, space.action_space, cfg)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p))
    mlp = NumpyMLP(mlp_dims(space.observation_space, space.action_space, cfg), cfg, rng_of(0))
    mlp.load(export_weights(module))
    in_process = evaluate_policy(module, "CartPole-v1", 4, seed=7)
    assert evaluate_policy(mlp, "CartPole-v1", 4, seed=7) == in_process
    evaluator = BackgroundEvaluator("CartPole-v1", 4, 7, cfg)
    try:
        evaluator.submit("snapshot", export_weights(module))
        results = evaluator.results(timeout=120)
        assert results == [("snapshot", *in_process)]
        assert _torch_mapped(os.getpid())  # (the check sees torch where it is loaded)
        assert not _torch_mapped(evaluator._process.pid)
    finally:
        evaluator.close()


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("action_space", ACTIONS, ids=["discrete", "box"])
def test_the_one_numpy_forward_is_the_modules(cfg, action_space):
    """:func:`mlp_forward`, which the actors sample from and the learner's closed form
    backpropagates through, gives the module's head outputs and values, and keeps
    each trunk's input and every layer's output."""
    mlp, sampler = _loaded_pair(cfg, action_space, seed=5)
    module = sampler.policy
    obs = np.random.default_rng(5).normal(0.0, 4.0, (16, 3)).astype(np.float32)
    actor, critic, got_params, got_value = mlp_forward(mlp.arrays, mlp._flat(obs), mlp.relu)
    with torch.no_grad():
        params, value = module(torch.from_numpy(obs))
        x = module.flat_obs(torch.from_numpy(obs))
        trunk = module.trunk if cfg.shared_trunk else module.actor_trunk
        h = trunk(x)
    np.testing.assert_allclose(got_params, params.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_value, value.numpy(), rtol=1e-5, atol=1e-6)
    assert len(actor) == len(cfg.hidden_sizes) + 1
    assert (critic is actor) is cfg.shared_trunk
    np.testing.assert_allclose(actor[0], x.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(actor[-1], h.numpy(), rtol=1e-5, atol=1e-6)


def test_the_numpy_mlp_module_imports_and_acts_without_torch():
    """``rl/numpy_mlp.py`` (the actor's and the evaluator's network, whose forward the
    learner's closed form shares) works in a process that cannot import torch."""
    code = NO_TORCH_ACTOR.split("from zmq_rl.cli")[0] + textwrap.dedent(
        """
        import numpy as np
        from gymnasium import spaces
        from zmq_rl.config import PolicyConfig
        from zmq_rl.rl.numpy_mlp import NumpyMLP, mlp_dims, rng_of

        cfg = PolicyConfig(normalize_obs=True)
        box = spaces.Box(-1.0, 1.0, (3,), np.float32)
        mlp = NumpyMLP(mlp_dims(box, spaces.Discrete(2), cfg), cfg, rng_of(0))
        actions, log_probs, values = mlp.act(np.zeros((4, 3), np.float32))
        print(actions.shape, mlp.mode(np.zeros((4, 3), np.float32)).shape)
        print("torch imported:", "torch" in sys.modules)
        """
    )
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:2] == ["(4,) (4,)", "torch imported: False"], done.stdout
