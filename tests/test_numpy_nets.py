"""Every shipped network in numpy (zmq_rl/rl/numpy_nets.py) is its torch module.

For each network an actor host runs -- Dict / Tuple observations with action masks,
MultiDiscrete / MultiBinary / Box heads, the LSTM and GRU, the pixel presets' CNNs and
the board games' networks -- the numpy copy has the module's ``state_dict`` layout
and, loaded with the module's (perturbed, trained-looking) weights, on 1,000
observations:

* samples the **same actions** as the module's ``act`` when both get the same random
  draws (the numpy network's draws are replayed into torch's ``exponential_``,
  ``rand`` and ``randn``), with the same log-probabilities and values (and the same
  next states, carried over 50 steps, for the recurrent cells);
* takes the same mode as ``act(deterministic=True)``;
* scores the actions it sampled as ``evaluate_actions`` scores them.

The largest differences are printed as ``NUMPY-NETS ...`` lines (``pytest -s``);
docs/benchmarks.md section 24 lists them.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from zmq_rl.config import PolicyConfig
from zmq_rl.conformance.vectors import masked_spaces
from zmq_rl.rl.numpy_mlp import NumpyMLP, rng_of
from zmq_rl.rl.numpy_nets import NumpyNetwork, leaf_paths, numpy_network
from zmq_rl.rl.policy import build_policy, export_weights
from zmq_rl.wire.spaces import batch_obs

from .test_protocol_network import CASES as PAGE_CASES

ROWS = 1000
TOL = {"rtol": 1e-4, "atol": 1e-4}
"""docs/protocol.md section 6.3: an actor keeps log-probs and values within 1e-4 (absolute
for |x| <= 1, relative above) of the learner's float32 forward pass."""

BOARD = gym.spaces.Dict(
    [
        ("action_mask", gym.spaces.Box(0, 1, (7,), np.int8)),
        ("observation", gym.spaces.Box(0, 1, (6, 7, 2), np.int8)),
    ]
)
"""PettingZoo's connect four (sorted keys, as gymnasium orders a Dict)."""

CASES: dict[str, tuple[gym.Space, gym.Space, PolicyConfig]] = {
    "mlp-discrete": (
        gym.spaces.Box(-1.0, 1.0, (4,), np.float32),
        gym.spaces.Discrete(3),
        PolicyConfig(normalize_obs=True),
    ),
    "mlp-box": (
        gym.spaces.Box(-1.0, 1.0, (8,), np.float32),
        gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
        PolicyConfig(activation="relu", shared_trunk=True),
    ),
    "dict-masked-discrete": (
        *masked_spaces(),
        PolicyConfig(hidden_sizes=(16,), normalize_obs=True),
    ),
    "dict-masked-multidiscrete": PAGE_CASES["multi-discrete-masked"],
    "tuple-multibinary": PAGE_CASES["tuple-multi-binary"],
    "box-2d-action": (
        gym.spaces.Box(-5, 5, (3,), np.int64),
        gym.spaces.Box(-1.0, 1.0, (2, 2), np.float32),
        PolicyConfig(hidden_sizes=(16, 16), log_std_init=-0.5),
    ),
    "image-part": (
        gym.spaces.Dict(
            [
                ("frame", gym.spaces.Box(0, 255, (36, 40, 3), np.uint8)),
                ("speed", gym.spaces.Box(-1.0, 1.0, (1,), np.float32)),
            ]
        ),
        gym.spaces.Discrete(4),
        PolicyConfig(hidden_sizes=(32,)),
    ),
    "lstm": (*masked_spaces(), PolicyConfig(hidden_sizes=(16,), policy_type="lstm")),
    "gru": (
        gym.spaces.Box(-1.0, 1.0, (5,), np.float32),
        gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
        PolicyConfig(hidden_sizes=(8, 12), policy_type="gru", normalize_obs=True),
    ),
    "minatar_cnn": (
        gym.spaces.Box(0, 1, (4, 10, 10), np.uint8),
        gym.spaces.Discrete(3),
        PolicyConfig(factory="zmq_rl.rl.cnn:minatar_cnn"),
    ),
    "nature_cnn": (
        gym.spaces.Box(0, 255, (4, 84, 84), np.uint8),
        gym.spaces.Discrete(6),
        PolicyConfig(factory="zmq_rl.rl.cnn:nature_cnn"),
    ),
    "board_cnn": (
        BOARD,
        gym.spaces.Discrete(7),
        PolicyConfig(factory="zmq_rl.rl.boards:board_cnn"),
    ),
    "gravity_board_cnn": (
        BOARD,
        gym.spaces.Discrete(7),
        PolicyConfig(factory="zmq_rl.rl.boards:gravity_board_cnn", hidden_sizes=(32,)),
    ),
    "drop_game_cnn": (
        BOARD,
        gym.spaces.Discrete(7),
        PolicyConfig(factory="zmq_rl.rl.boards:drop_game_cnn", hidden_sizes=(32, 16)),
    ),
}


class Recording:
    """A numpy ``Generator`` whose draws are kept, to be replayed into torch."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.draws: list[np.ndarray] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.rng, name)

        def draw(*args: Any, **kwargs: Any) -> np.ndarray:
            out = method(*args, **kwargs)
            self.draws.append(np.array(out, copy=True))
            return out

        return draw


def replay(monkeypatch: pytest.MonkeyPatch, draws: list[np.ndarray]) -> None:
    """torch's ``exponential_``, ``rand`` and ``randn`` hand out ``draws`` in order."""
    queue = list(draws)

    def next_draw(shape: Any) -> torch.Tensor:
        return torch.from_numpy(queue.pop(0).copy()).reshape(tuple(shape))

    monkeypatch.setattr(
        torch.Tensor, "exponential_", lambda self, *a, **k: self.copy_(next_draw(self.shape))
    )
    monkeypatch.setattr(torch, "rand", lambda shape, *a, **k: next_draw(shape))
    monkeypatch.setattr(torch, "randn", lambda shape, *a, **k: next_draw(shape))


def tensors(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: tensors(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(tensors(v) for v in value)
    out = torch.from_numpy(np.ascontiguousarray(value))
    return out.float() if out.dtype == torch.float64 else out


def observations(space: gym.Space, rows: int, seed: int) -> Any:
    """``rows`` observations of ``space``; every mask allows an action per component."""
    space.seed(seed)
    obs = batch_obs(space, [space.sample() for _ in range(rows)])  # (in the wire's dtypes)
    if isinstance(space, gym.spaces.Dict) and "action_mask" in space.spaces:
        obs["action_mask"][:, 0] = 1
        obs["action_mask"][:, 2] = 1  # (MultiDiscrete [2, 3]: component 1 starts at 2)
    for path, leaf in leaf_paths(space):
        if isinstance(leaf, gym.spaces.Box) and leaf.shape == (6, 7, 2):
            # boards where one cell holds one colour at most
            board = obs[path[0]]
            board[..., 1] &= 1 - board[..., 0]
    return obs


def rows(value: Any, index: slice) -> Any:
    if isinstance(value, dict):
        return {k: rows(v, index) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(rows(v, index) for v in value)
    return value[index]


def pair(case: str, seed: int = 0) -> tuple[torch.nn.Module, Any, PolicyConfig]:
    """The torch module of ``case`` with perturbed weights and statistics, and its
    numpy copy loaded with them."""
    obs_space, act_space, cfg = CASES[case]
    cfg = cfg.validate()
    torch.manual_seed(seed)
    module = build_policy(obs_space, act_space, cfg).eval()
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for p in module.parameters():  # weights of a trained net's scale: 1/sqrt(fan-in)
            p.add_(torch.randn_like(p) * (0.2 if p.dim() < 2 else p[0].numel() ** -0.5))
        for name, buffer in module.named_buffers():
            if name.endswith("obs_mean"):
                buffer.copy_(torch.from_numpy(rng.normal(0, 0.5, buffer.shape)))
            elif name.endswith("obs_var"):
                buffer.copy_(torch.from_numpy(rng.uniform(0.5, 2.0, buffer.shape)))
    net = numpy_network(obs_space, act_space, cfg, rng_of(seed))
    assert isinstance(net, (NumpyNetwork, NumpyMLP)), type(net)
    net.load(export_weights(module))
    return module, net, cfg


@pytest.mark.parametrize("case", list(CASES))
def test_the_layout_is_the_torch_modules_state_dict(case):
    obs_space, act_space, cfg = CASES[case]
    module = build_policy(obs_space, act_space, cfg.validate())
    net = numpy_network(obs_space, act_space, cfg, rng_of(0))
    want = [(k, tuple(v.shape), v.numpy().dtype) for k, v in module.state_dict().items()]
    assert [(k, shape, dtype) for k, (shape, dtype) in net.layout.items()] == want
    assert net.state_size == int(getattr(module, "state_size", 0))


def _near_ties(scores: np.ndarray, got: np.ndarray, want: np.ndarray) -> int:
    """Rows whose actions differ; each must be a near tie of ``scores`` (the top two
    within 1e-4), which float rounding may order either way."""
    differ = np.flatnonzero((got.reshape(len(got), -1) != want.reshape(len(want), -1)).any(1))
    for row in differ:
        top = np.sort(scores[row].reshape(-1))[-2:]
        assert top[1] - top[0] < 1e-4, (row, got[row], want[row], top)
    return len(differ)


@pytest.mark.parametrize("case", list(CASES))
def test_the_numpy_network_acts_as_the_torch_module(case, monkeypatch):
    module, net, _ = pair(case)
    obs_space = CASES[case][0]
    obs = observations(obs_space, ROWS, seed=1)
    record = Recording(seed=2)
    net.rng = record  # type: ignore[assignment]
    report: dict[str, float] = {}
    if net.state_size:  # 50 steps of 20 rows, the state carried by each side
        state_np, state_t = net.initial_state(20), module.initial_state(20)
        got, want = [], []
        for step in range(ROWS // 20):
            batch = rows(obs, slice(20 * step, 20 * step + 20))
            record.draws.clear()
            out = net.act_recurrent(batch, state_np)
            with monkeypatch.context() as patch, torch.no_grad():
                replay(patch, record.draws)
                ref = module.act_recurrent(tensors(batch), state_t)
            got.append(out)
            want.append([t.numpy() for t in ref])
            state_np, state_t = out[3], ref[3]
        got_cat = [np.concatenate([g[i] for g in got]) for i in range(4)]
        want_cat = [np.concatenate([w[i] for w in want]) for i in range(4)]
        report["state"] = float(np.abs(got_cat[3] - want_cat[3]).max())
        np.testing.assert_allclose(got_cat[3], want_cat[3], **TOL)
    else:
        got_cat = list(net.act(obs))
        with monkeypatch.context() as patch, torch.no_grad():
            replay(patch, record.draws)
            want_cat = [t.numpy() for t in module.act(tensors(obs))]
    actions, log_probs, values = got_cat[:3]
    assert actions.dtype == want_cat[0].dtype and actions.shape == want_cat[0].shape
    if actions.dtype.kind == "f":
        np.testing.assert_allclose(actions, want_cat[0], **TOL)
        report["actions"] = float(np.abs(actions - want_cat[0]).max())
    else:
        assert np.array_equal(actions, want_cat[0]), int((actions != want_cat[0]).sum())
        report["actions_differ"] = 0
    np.testing.assert_allclose(log_probs, want_cat[1], **TOL)
    np.testing.assert_allclose(values, want_cat[2], **TOL)
    report["log_prob"] = float(np.abs(log_probs - want_cat[1]).max())
    report["value"] = float(np.abs(values - want_cat[2]).max())
    if net.mask_key is not None:  # only allowed actions
        mask = np.asarray(obs[net.mask_key]).reshape(ROWS, -1)
        nvec = np.atleast_1d(getattr(CASES[case][1], "nvec", getattr(CASES[case][1], "n", 0)))
        chosen = actions.reshape(ROWS, -1) + np.concatenate([[0], np.cumsum(nvec)[:-1]])
        assert (np.take_along_axis(mask, chosen, axis=1) != 0).all()
    print(f"NUMPY-NETS {case} " + " ".join(f"{k}={v:.2g}" for k, v in report.items()))


@pytest.mark.parametrize("case", list(CASES))
def test_the_mode_and_the_scores_of_sampled_actions_are_torchs(case):
    module, net, _ = pair(case, seed=3)
    obs = observations(CASES[case][0], ROWS, seed=4)
    obs_t = tensors(obs)
    if net.state_size:
        state = np.random.default_rng(5).normal(0, 0.5, (ROWS, net.state_size)).astype(np.float32)
        got, next_np = net.mode_recurrent(obs, state)
        with torch.no_grad():
            want, _, _, next_t = module.act_recurrent(obs_t, torch.from_numpy(state), None, True)
            sampled, log_probs, values, _ = net.act_recurrent(obs, state)
            lengths = torch.ones(ROWS, dtype=torch.int64)
            ref = module.evaluate_sequence(
                {k: v[None] for k, v in obs_t.items()} if isinstance(obs_t, dict) else obs_t[None],
                torch.from_numpy(sampled)[None],
                torch.from_numpy(state),
                lengths,
            )
        np.testing.assert_allclose(next_np, next_t.numpy(), **TOL)
        ref_log_prob, ref_value = ref[0][0].numpy(), ref[2][0].numpy()
    else:
        got = net.mode(obs)
        with torch.no_grad():
            want = module.act(obs_t, deterministic=True)[0]
            sampled, log_probs, values = net.act(obs)
            ref_log_prob, _, ref_value = (
                t.numpy() for t in module.evaluate_actions(obs_t, torch.from_numpy(sampled))
            )
    want = want.numpy()
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.dtype.kind == "f":
        np.testing.assert_allclose(got, want, **TOL)
    else:
        params = net.forward_recurrent(obs, state)[0] if net.state_size else net.forward(obs)[0]
        ties = _near_ties(params, got, want)
        assert ties <= 2, ties
        print(f"NUMPY-NETS {case} modes differ in {ties} of {ROWS} rows (near ties)")
    np.testing.assert_allclose(log_probs, ref_log_prob, **TOL)
    np.testing.assert_allclose(values, ref_value, **TOL)
