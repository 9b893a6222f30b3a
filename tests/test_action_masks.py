"""Action masks (PettingZoo's ``action_mask`` convention, zmq_rl/rl/masking.py): masked
actions are never sampled (property test, Discrete and MultiDiscrete), log-probs and
entropies are those of the renormalised categorical, the mode is the argmax over the
allowed actions (in the policy, ``predict`` and an exported graph), an all-masked row is
refused at the actor naming ``action_mask``, the mask reaches the learner unchanged
through the wire codec, and a real ``zmq-rl run`` on an env that raises on a masked
action completes and learns above a random legal policy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zmq_rl.config import PolicyConfig
from zmq_rl.rl.masking import (
    ActionMaskError,
    check_action_mask,
    check_observation_mask,
    mask_key,
    masked_logits,
    random_allowed_action,
)
from zmq_rl.rl.networks import ActionHeads, StructuredActorCritic
from zmq_rl.rl.policy import build_policy
from zmq_rl.wire.spaces import decode_value, encode_value

REPO = Path(__file__).resolve().parent.parent
CFG = PolicyConfig(hidden_sizes=(16,))


def _obs_space(n: int) -> gym.spaces.Dict:
    return gym.spaces.Dict(
        {"action_mask": gym.spaces.MultiBinary(n), "x": gym.spaces.Box(-1.0, 1.0, (3,))}
    )


def _masks(nvec: list[int], rows: int):
    """Masks ``[rows, sum(nvec)]`` with at least one allowed entry per component."""
    blocks = [
        st.lists(st.booleans(), min_size=n, max_size=n).filter(any) for n in nvec for _ in [0]
    ]
    row = st.tuples(*blocks).map(lambda parts: [b for part in parts for b in part])
    return st.lists(row, min_size=rows, max_size=rows).map(lambda m: np.array(m, np.int8))


def _allowed(mask: np.ndarray, nvec: list[int], action: np.ndarray) -> bool:
    bounds = np.concatenate([[0], np.cumsum(nvec)])
    action = action.reshape(mask.shape[0], len(nvec))
    return all(
        mask[r, bounds[k] + action[r, k]] for r in range(mask.shape[0]) for k in range(len(nvec))
    )


# --------------------------------------------------------------------------- sampling


@pytest.mark.parametrize("nvec", [[5], [2, 3, 4]])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_masked_sampling_never_picks_a_masked_action(nvec, data):
    space = gym.spaces.Discrete(nvec[0]) if len(nvec) == 1 else gym.spaces.MultiDiscrete(nvec)
    heads = ActionHeads(space, CFG)
    rows = 8
    mask = data.draw(_masks(nvec, rows))
    # Raw logits that favour the masked actions strongly: sampling must still avoid them.
    scale = data.draw(st.floats(0.0, 1e4))
    params = torch.from_numpy(np.where(mask == 0, scale, -scale).astype(np.float32))
    params = params + torch.randn(params.shape)
    seed = data.draw(st.integers(0, 2**31 - 1))
    generator = torch.Generator().manual_seed(seed)
    for deterministic in (False, True):
        action, log_prob = heads.sample(params, generator, deterministic, torch.from_numpy(mask))
        assert _allowed(mask, nvec, action.numpy()), (mask, action)
        assert torch.isfinite(log_prob).all()


def test_sampling_follows_the_renormalised_distribution():
    heads = ActionHeads(gym.spaces.Discrete(4), CFG)
    params = torch.tensor([[3.0, 0.0, 1.0, 0.5]]).expand(20000, 4)
    mask = torch.tensor([[0, 1, 1, 0]]).expand(20000, 4)
    action, _ = heads.sample(params, torch.Generator().manual_seed(0), mask=mask)
    freq = np.bincount(action.numpy(), minlength=4) / 20000
    expected = np.exp([0.0, 1.0]) / np.exp([0.0, 1.0]).sum()
    assert freq[0] == freq[3] == 0
    np.testing.assert_allclose(freq[1:3], expected, atol=0.015)


# --------------------------------------------------------------------------- the loss


def _renormalised(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """The categorical of ``logits`` restricted to ``allowed``, computed by hand."""
    p = np.where(allowed, np.exp(logits - logits[allowed].max()), 0.0)
    return p / p.sum()


def test_log_prob_and_entropy_are_those_of_the_renormalised_categorical():
    nvec = [3, 4]
    heads = ActionHeads(gym.spaces.MultiDiscrete(nvec), CFG).double()
    rng = np.random.default_rng(0)
    logits = rng.normal(0.0, 3.0, (6, 7))
    logits[:, 0] = 50.0  # a masked action with the largest logit changes nothing
    mask = rng.random((6, 7)) < 0.6
    mask[:, 0] = False
    mask[:, 1] = True  # one allowed per component
    mask[:, 3] = True
    actions = np.array([[1, 0], [2, 3], [1, 0], [1, 0], [1, 0], [1, 0]])
    for r in range(6):  # only allowed actions are evaluated (those actors sample)
        actions[r, 0] = rng.choice(np.flatnonzero(mask[r, :3]))
        actions[r, 1] = rng.choice(np.flatnonzero(mask[r, 3:]))
    params = torch.tensor(logits, requires_grad=True)
    log_prob, entropy = heads.evaluate(params, torch.from_numpy(actions), torch.from_numpy(mask))
    for r in range(6):
        p0 = _renormalised(logits[r, :3], mask[r, :3])
        p1 = _renormalised(logits[r, 3:], mask[r, 3:])
        want_lp = np.log(p0[actions[r, 0]]) + np.log(p1[actions[r, 1]])
        want_h = -sum((p[p > 0] * np.log(p[p > 0])).sum() for p in (p0, p1))
        assert log_prob[r].item() == pytest.approx(want_lp, abs=1e-12)
        assert entropy[r].item() == pytest.approx(want_h, abs=1e-12)
    (log_prob.sum() + entropy.sum()).backward()
    assert torch.isfinite(params.grad).all()
    assert (params.grad[torch.from_numpy(~mask)] == 0).all()  # masked logits get nothing


def test_masked_logits_are_finite_and_of_the_logits_dtype():
    for dtype in (torch.float16, torch.float32, torch.float64):
        logits = torch.zeros(2, 3, dtype=dtype)
        out = masked_logits(logits, torch.tensor([[1, 0, 1], [0, 0, 1]]))
        assert torch.isfinite(out).all() and out.dtype == dtype
        assert out[0, 1] == out[1, 0] == torch.finfo(dtype).min
        probs = torch.softmax(out.double(), dim=-1)
        assert probs[0, 1] == 0 and probs[1, 2] == 1


# --------------------------------------------------------------------------- the mode


def _biased_policy(space, masked_favourite: int):
    """A policy whose raw logits favour action ``masked_favourite`` by far."""
    obs_space = _obs_space(int(np.sum(getattr(space, "nvec", [getattr(space, "n", 0)]))))
    policy = build_policy(obs_space, space, CFG)
    with torch.no_grad():
        policy.policy_head.bias.zero_()
        policy.policy_head.bias[masked_favourite] = 100.0
    return obs_space, policy


def test_deterministic_action_is_the_argmax_over_allowed_actions():
    space = gym.spaces.Discrete(4, start=1)
    obs_space, policy = _biased_policy(space, 2)
    assert isinstance(policy, StructuredActorCritic) and policy.mask_key == "action_mask"
    with torch.no_grad():
        policy.policy_head.bias[3] = 5.0  # the best allowed one
    obs = {
        "action_mask": torch.tensor([[1, 1, 0, 1]], dtype=torch.int8),
        "x": torch.zeros(1, 3),
    }
    action, log_prob, _ = policy.act(obs, deterministic=True)
    assert action.item() == 3 and torch.isfinite(log_prob).all()
    unmasked = {**obs, "action_mask": torch.ones(1, 4, dtype=torch.int8)}
    assert policy.act(unmasked, deterministic=True)[0].item() == 2

    from zmq_rl.serving.deploy import DeployedPolicy

    deployed = DeployedPolicy(policy, obs_space, space)
    one = {"action_mask": np.array([1, 1, 0, 1]), "x": np.zeros(3)}
    action, state = deployed.predict(one)
    assert int(action) == 3 + 1 and state is None  # the env's numbering (start=1)
    sampled = deployed.predict(
        {"action_mask": np.tile([1, 1, 0, 1], (50, 1)), "x": np.zeros((50, 3))},
        deterministic=False,
    )[0]
    assert set(sampled.tolist()) <= {1, 2, 4}
    with pytest.raises(ActionMaskError, match="action_mask"):
        deployed.predict({"action_mask": np.zeros(4), "x": np.zeros(3)})


def test_exported_graph_takes_the_argmax_over_allowed_actions(tmp_path):
    space = gym.spaces.MultiDiscrete([2, 3])
    obs_space, policy = _biased_policy(space, 3)  # component 1's action 1, masked below
    from zmq_rl.serving.deploy import DeployedPolicy, export_torchscript

    deployed = DeployedPolicy(policy, obs_space, space)
    export_torchscript(deployed, tmp_path / "policy.ts")
    graph = torch.jit.load(str(tmp_path / "policy.ts"))
    mask = torch.tensor([[1, 1, 1, 0, 1], [1, 1, 1, 1, 1]], dtype=torch.int8)
    action = graph(mask, torch.zeros(2, 3))
    assert action[0, 1].item() != 1 and action[1, 1].item() == 1
    want = deployed.predict({"action_mask": mask.numpy(), "x": np.zeros((2, 3))})[0]
    np.testing.assert_array_equal(action.numpy(), want)
    extra = {"zmq_rl.json": ""}
    torch.jit.load(str(tmp_path / "policy.ts"), _extra_files=extra)
    meta = json.loads(extra["zmq_rl.json"])
    assert meta["action_mask"] == "action_mask"
    assert list(json.loads(meta["observation_keys"])) == ["action_mask", "x"]


@pytest.mark.parametrize("policy_type", ["lstm", "gru"])
def test_recurrent_policies_mask_too(policy_type):
    space = gym.spaces.Discrete(3)
    policy = build_policy(
        _obs_space(3), space, PolicyConfig(hidden_sizes=(8,), policy_type=policy_type)
    )
    with torch.no_grad():
        policy.policy_head.bias[:] = torch.tensor([100.0, 0.0, 0.0])
    mask = torch.tensor([[0, 1, 1]] * 4, dtype=torch.int8)
    obs = {"action_mask": mask, "x": torch.zeros(4, 3)}
    action, _, _, _ = policy.act_recurrent(obs, policy.initial_state(4))
    assert (action != 0).all()
    seq = {"action_mask": mask.reshape(2, 2, 3), "x": torch.zeros(2, 2, 3)}
    log_prob, entropy, _, _ = policy.evaluate_sequence(
        seq, torch.ones(2, 2, dtype=torch.int64), policy.initial_state(2), torch.tensor([2, 2])
    )
    assert torch.isfinite(log_prob).all() and (entropy <= np.log(2) + 1e-6).all()


# --------------------------------------------------------------------------- refusals


def test_a_row_with_no_allowed_action_is_refused_naming_action_mask():
    nvec = np.array([2, 3])
    check_action_mask(np.array([[1, 0, 0, 0, 1]]), nvec)
    with pytest.raises(ActionMaskError, match=r"observation\.action_mask: slot 1 .*component 1"):
        check_observation_mask(
            _obs_space(5),
            gym.spaces.MultiDiscrete(nvec),
            {"action_mask": np.array([[1, 0, 0, 0, 1], [0, 1, 0, 0, 0]])},
        )


def test_mask_sizes_are_checked_when_the_policy_is_built():
    with pytest.raises(ActionMaskError, match="action_mask.*5 entries.*needs 4"):
        build_policy(_obs_space(5), gym.spaces.Discrete(4), CFG)
    with pytest.raises(ActionMaskError, match="needs 5"):
        build_policy(_obs_space(4), gym.spaces.MultiDiscrete([2, 3]), CFG)
    # A continuous action space leaves action_mask an ordinary observation part.
    assert mask_key(_obs_space(4), gym.spaces.Box(-1, 1, (2,))) is None
    assert mask_key(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(4)) is None


def test_agent_refuses_an_observation_with_no_allowed_action():
    """The actor's check runs before the policy: nothing is sampled for the row."""
    from zmq_rl.actor.agent import PolicyRunner

    runner = PolicyRunner.__new__(PolicyRunner)
    runner.observation_space, runner.action_space = _obs_space(3), gym.spaces.Discrete(3)
    runner.check_mask({"action_mask": np.array([[1, 0, 0]], np.int8), "x": np.zeros((1, 3))})
    with pytest.raises(ActionMaskError, match="action_mask: slot 0 allows no action"):
        runner.check_mask({"action_mask": np.zeros((1, 3), np.int8), "x": np.zeros((1, 3))})


# --------------------------------------------------------------------------- the wire


def test_the_mask_travels_with_the_observation_and_the_learner_sees_the_same_one():
    """What the actor acted on (log-prob included) is what the learner evaluates after
    the rows went through the wire codec: the mask is just a part of the observation."""
    space = gym.spaces.MultiDiscrete([3, 2])
    obs_space = _obs_space(5)
    policy = build_policy(obs_space, space, CFG)
    rng = np.random.default_rng(1)
    mask = np.array([[1, 0, 1, 1, 0], [0, 1, 0, 0, 1], [1, 1, 1, 1, 1]], np.int8)
    obs = {"action_mask": mask, "x": rng.uniform(-1, 1, (3, 3)).astype(np.float32)}
    tensors = {k: torch.from_numpy(v) for k, v in obs.items()}
    action, log_prob, _ = policy.act(tensors, torch.Generator().manual_seed(0))
    arrived = decode_value(encode_value(obs), "rows.obs", (3,))
    np.testing.assert_array_equal(arrived["action_mask"], mask)
    assert arrived["action_mask"].dtype == np.int8
    again, _, _ = policy.evaluate_actions(
        {k: torch.from_numpy(np.array(v)) for k, v in arrived.items()}, action
    )
    torch.testing.assert_close(again, log_prob, rtol=0, atol=1e-6)


# --------------------------------------------------------------------------- training

RUN_TIMEOUT = 240.0


@pytest.mark.timeout(RUN_TIMEOUT + 30)
@pytest.mark.parametrize(
    ("multi", "random_legal", "bound"), [(False, 9.4, 15.0), (True, 11.25, 15.0)]
)
def test_masked_env_trains_through_real_processes_without_a_masked_action(
    tmp_path, learner_port, multi, random_legal, bound
):
    """``zmq-rl run`` (a learner and two actor processes over tcp) on MaskedBandit-v0,
    whose env raises on (and records) any masked action: the run ends normally, no
    masked action was ever taken (by actors nor by the learner's evaluation), and the
    evaluation beats a random legal policy by far (Discrete: ~9.4 of 20; MultiDiscrete,
    one mask block per component: ~11.25)."""
    violations = tmp_path / "violations.txt"
    run_dir = tmp_path / "run"
    argv = [
        sys.executable, "-m", "zmq_rl", "run",
        "--env", "tests.space_envs:MaskedBandit-v0",
        "--env-kwargs", json.dumps({"violations": str(violations), "multi": multi}),
        "--port", str(learner_port),
        "--total-env-steps", "4096",
        "--gamma", "0.5",
        "--learning-rate", "3e-3",
        "--num-epochs", "10",
        "--hidden-sizes", "32",
        "--eval-episodes", "10",
        "--seed", "1",
        "--run-dir", str(run_dir),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT
    )
    assert not violations.exists(), violations.read_text()
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((run_dir / "report.json").read_text())
    assert report["stop_reason"] == "budget spent"
    rejected = {k: v for k, v in report.get("counters", {}).items() if "reject" in k and v}
    assert not rejected, rejected
    final = report["evaluations"][-1]["mean_return"]
    assert final >= bound, f"evaluation {final} (random legal ~{random_legal}): {report}"


@pytest.mark.parametrize("multi", [False, True])
def test_a_probe_steps_masked_envs_with_allowed_actions_only(multi):
    """The evaluator's wait probe (``steps_wait``) steps an env with no policy: its
    random actions are allowed ones (MaskedBandit raises on any other), and the probe
    of an env that fails counts as one that does not wait instead of ending the run."""
    from tests.space_envs import MaskedBanditEnv
    from zmq_rl.envs.stepping import steps_wait
    from zmq_rl.learner.evaluation import _steps_wait

    env = MaskedBanditEnv(multi=multi)
    obs, _ = env.reset(seed=3)
    rng = np.random.default_rng(0)
    for _ in range(200):
        action = random_allowed_action(env.observation_space, env.action_space, obs, rng)
        assert env.action_space.contains(np.asarray(action) if multi else action)
        obs = env.step(action)[0]  # raises on a masked action
    violations = []

    class Recorded(MaskedBanditEnv):
        def step(self, action):
            if not self._legal(action):
                violations.append(action)
            return super().step(action)

    assert _steps_wait(Recorded(multi=multi), seed=1) is False and not violations
    assert steps_wait(Recorded(multi=multi), steps=50) is False  # random: refused, no crash
    assert violations
