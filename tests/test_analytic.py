"""Closed-form PPO gradients (zmq_rl.rl.analytic) against autograd: every parameter's
gradient and every loss term, across heads, trunks, activations, value clipping and
the kinks of the clipped objective; and the trainer's steps with and without them."""

from __future__ import annotations

import copy
import dataclasses
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces

from zmq_rl.config import PolicyConfig, PPOConfig
from zmq_rl.rl import analytic as analytic_module
from zmq_rl.rl.analytic import (
    CLOSED_FORM_FIELDS,
    GRADIENT_FREE_FIELDS,
    AnalyticBatch,
    LossSums,
    analytic_support,
    ppo_gradients,
)
from zmq_rl.rl.closed_form import standardised
from zmq_rl.rl.loss_terms import MEAN_KEYS
from zmq_rl.rl.policy import build_policy
from zmq_rl.rl.ppo import PPOTrainer, RolloutBatch, ppo_loss

torch.set_num_threads(1)

OBS = spaces.Box(-np.inf, np.inf, (5,), np.float32)
SPACES = {"discrete": spaces.Discrete(4), "box": spaces.Box(-1.0, 1.0, (3,), np.float32)}


def _policy(action: str, dtype: torch.dtype = torch.float64, **policy_kw):
    torch.manual_seed(3)
    cfg = PolicyConfig(hidden_sizes=(16, 8), **policy_kw)
    policy = build_policy(OBS, SPACES[action], cfg).to(dtype)
    with torch.no_grad():  # heads away from their near-zero init, so every term matters
        policy.policy_head.weight.normal_(0.0, 0.5)
        policy.value_head.bias.fill_(0.3)
        if hasattr(policy, "log_std"):
            policy.log_std.copy_(torch.tensor([-0.3, 0.1, 0.4]))
        if policy.normalize_obs:
            policy.obs_mean.copy_(torch.linspace(-1, 1, 5))
            policy.obs_var.copy_(torch.linspace(0.5, 3, 5))
    return policy


def _batch(policy, n: int = 48, spread: float = 0.6, seed: int = 0) -> AnalyticBatch:
    """Rows whose behaviour log-probs differ from the policy's by up to ``spread``, so
    that ratios fall inside and outside the clip band, and advantages of both signs."""
    g = torch.Generator().manual_seed(seed)
    dtype = policy.value_head.weight.dtype
    obs = torch.randn(n, 5, generator=g, dtype=dtype) * 2.0
    with torch.no_grad():
        actions, log_prob, value = policy.act(obs, generator=g)
    shift = (torch.rand(n, generator=g, dtype=dtype) * 2.0 - 1.0) * spread
    shift[:4] = 0.0  # ratio exactly 1: the tie of the clipped objective's min
    return AnalyticBatch(
        obs=obs,
        actions=actions,
        old_log_prob=log_prob + shift,
        old_value=value + torch.randn(n, generator=g, dtype=dtype) * 0.4,
        returns=value + torch.randn(n, generator=g, dtype=dtype),
        advantages=torch.randn(n, generator=g, dtype=dtype),
    )


def _autograd(policy, batch: AnalyticBatch, cfg: PPOConfig, clip: float):
    policy.zero_grad(set_to_none=True)
    log_prob, entropy, value = policy.evaluate_actions(batch.obs, batch.actions)
    loss = ppo_loss(
        log_prob, batch.old_log_prob, batch.advantages, value, batch.old_value,
        batch.returns, entropy, clip_range=clip, clip_value_loss=cfg.clip_value_loss,
        value_clip_range=clip, vf_coef=cfg.vf_coef, ent_coef=cfg.ent_coef,
    )  # fmt: skip
    loss.total.backward()
    grads = {name: p.grad.clone() for name, p in policy.named_parameters()}
    policy.zero_grad(set_to_none=True)
    return loss, grads


CASES = {
    "discrete": dict(action="discrete"),
    "discrete-relu": dict(action="discrete", activation="relu"),
    "discrete-shared": dict(action="discrete", shared_trunk=True),
    "discrete-normalized-obs": dict(action="discrete", normalize_obs=True),
    "box": dict(action="box"),
    "box-shared-relu": dict(action="box", shared_trunk=True, activation="relu"),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("clip_value_loss", [False, True])
@pytest.mark.parametrize("ent_coef", [0.0, 0.02])
def test_gradients_and_loss_terms_equal_autograd(case, clip_value_loss, ent_coef):
    kw = dict(CASES[case])
    policy = _policy(kw.pop("action"), **kw)
    cfg = PPOConfig(clip_value_loss=clip_value_loss, ent_coef=ent_coef, vf_coef=0.7)
    batch = _batch(policy)
    want_loss, want = _autograd(policy, batch, cfg, 0.2)
    loss, grads = ppo_gradients(policy, batch, cfg, 0.2)
    names = dict(policy.named_parameters())
    assert sorted(want) == sorted(name for name, p in names.items() if p in grads)
    for name, g in want.items():
        torch.testing.assert_close(grads[names[name]], g, rtol=1e-9, atol=1e-12, msg=name)
    for term in ("total", "policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction"):
        torch.testing.assert_close(getattr(loss, term), getattr(want_loss, term).detach())
    assert 0.0 < float(loss.clip_fraction) < 1.0  # both sides of the band were exercised


def test_value_clip_kinks_equal_autograd():
    """Values exactly on the clip band's edges and squared errors exactly tied. The
    values are made exact (a zero value-head weight and a dyadic bias), so numpy and
    torch see the same bits whatever rounding this CPU's matmuls use: a tie one side
    rounds away from would compare different sub-gradients, not the code."""
    policy = _policy("discrete")
    with torch.no_grad():
        policy.value_head.weight.zero_()
        policy.value_head.bias.fill_(0.5)
    cfg = PPOConfig(clip_value_loss=True, vf_coef=1.0)
    batch = _batch(policy, n=8)
    with torch.no_grad():
        value = policy.value(batch.obs)
    assert torch.equal(value, torch.full_like(value, 0.5))
    old_value = value.clone()
    old_value[:2] = value[:2] - 0.25  # delta == +clip exactly: on the band's edge
    old_value[2:4] = value[2:4] + 0.25  # delta == -clip
    returns = value + 1.0
    returns[4:6] = value[4:6]  # zero error: the plain and the clipped squares tie
    batch = batch._replace(old_value=old_value, returns=returns)
    _, want = _autograd(policy, batch, cfg, 0.25)
    _, grads = ppo_gradients(policy, batch, cfg, 0.25)
    assert want["value_head.weight"].abs().sum() > 0  # the value loss is exercised
    for name, p in policy.named_parameters():
        torch.testing.assert_close(grads[p], want[name], rtol=1e-9, atol=1e-12, msg=name)


def test_gradients_written_into_given_tensors():
    policy = _policy("box")
    cfg = PPOConfig(clip_value_loss=True, ent_coef=0.01)
    batch = _batch(policy)
    _, fresh = ppo_gradients(policy, batch, cfg, 0.2)
    out = {p: torch.full_like(p, 7.0) for p in policy.parameters()}
    _, written = ppo_gradients(policy, batch, cfg, 0.2, out=out)
    for p in policy.parameters():
        assert written[p] is out[p]
        torch.testing.assert_close(out[p], fresh[p], rtol=0, atol=0)


def test_support_is_the_plain_mlp_under_ppo():
    mlp = _policy("discrete")
    assert analytic_support(mlp, PPOConfig()) is None
    assert "objective" in analytic_support(mlp, PPOConfig(objective="decoupled"))
    lstm = build_policy(OBS, SPACES["discrete"], PolicyConfig(policy_type="lstm"))
    assert "RecurrentActorCritic" in analytic_support(lstm, PPOConfig())
    assert "not the CPU" in analytic_support(copy.deepcopy(mlp).to("meta"), PPOConfig())
    assert "float16" in analytic_support(copy.deepcopy(mlp).half(), PPOConfig())
    mlp.policy_head.bias.requires_grad_(False)  # autograd would leave it alone
    assert "frozen" in analytic_support(mlp, PPOConfig())


def test_every_ppo_config_field_is_written_down_once():
    """The closed form's fence: each ``PPOConfig`` field is either implemented by it or
    leaves the gradient alone, in rl/analytic.py. A field in neither list fails here,
    so a new field cannot be silently ignored by the closed form."""
    fields = {field.name for field in dataclasses.fields(PPOConfig)}
    implemented, gradient_free = set(CLOSED_FORM_FIELDS), set(GRADIENT_FREE_FIELDS)
    assert not implemented & gradient_free, "a field in both lists"
    assert not fields - implemented - gradient_free, "write the new field down in rl/analytic.py"
    assert not (implemented | gradient_free) - fields, "a listed field PPOConfig no longer has"


@dataclasses.dataclass(frozen=True)
class _ConfigWithANewField(PPOConfig):
    new_knob: float = dataclasses.field(default=0.0, metadata={"help": "a field of tomorrow"})


def test_a_config_setting_an_unlisted_field_is_refused_and_logged_once(caplog, monkeypatch):
    """A field in neither list keeps the closed form when it holds its default; set, it
    turns it off (the trainer uses autograd), logged once with the field's name."""
    monkeypatch.setattr(analytic_module, "_logged_fields", set())
    caplog.set_level(logging.INFO, logger="zmq_rl.analytic")
    policy = _policy("discrete", dtype=torch.float32)
    assert analytic_support(policy, _ConfigWithANewField()) is None
    assert PPOTrainer(policy, _ConfigWithANewField()).flat is not None
    set_knob = _ConfigWithANewField(new_knob=1.0)
    assert "new_knob" in analytic_support(policy, set_knob)
    assert all(PPOTrainer(policy, set_knob).flat is None for _ in range(2))
    logged = [r for r in caplog.records if r.name == "zmq_rl.analytic"]
    assert len(logged) == 1 and logged[0].levelno == logging.WARNING
    assert "new_knob" in logged[0].getMessage()


def test_the_loss_sums_are_in_the_trainers_order():
    """The trainer adds a step's :class:`LossSums` to its means in ``MEAN_KEYS`` order."""
    assert LossSums._fields == MEAN_KEYS


def _rollout_batch(policy, n: int, seed: int) -> RolloutBatch:
    b = _batch(policy, n=n, seed=seed)
    return RolloutBatch(
        obs=b.obs.float(), actions=b.actions, old_log_probs=b.old_log_prob.float(),
        old_values=b.old_value.float(), advantages=b.advantages.float(),
        returns=b.returns.float(),
    )  # fmt: skip


@pytest.mark.parametrize("action", ["discrete", "box"])
def test_trainer_updates_equal_with_and_without_closed_form_gradients(action):
    """Three float32 updates (4 epochs, a remainder minibatch, clipped gradients):
    parameters and metrics agree with the autograd trainer's to float32 rounding."""
    results = []
    for analytic in (True, False):
        policy = _policy(action, dtype=torch.float32)
        cfg = PPOConfig(
            num_epochs=4, minibatch_size=20, max_grad_norm=0.3, ent_coef=0.01,
            clip_value_loss=True, analytic_gradients=analytic, learning_rate=3e-3,
        )  # fmt: skip
        trainer = PPOTrainer(policy, cfg, seed=1)
        assert (trainer.flat is not None) is analytic
        metrics = [trainer.update(_rollout_batch(policy, 70, seed)) for seed in range(3)]
        results.append((policy, metrics))
    (fast, fast_metrics), (slow, slow_metrics) = results
    for (name, p), q in zip(fast.named_parameters(), slow.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=name)
    for got, want in zip(fast_metrics, slow_metrics, strict=True):
        assert got.keys() == want.keys()
        for key in want:
            assert got[key] == pytest.approx(want[key], rel=1e-3, abs=1e-5), key


def test_adam_state_started_by_the_closed_form_is_torchs():
    """The closed form starts Adam's state itself (not through ``optimizer.step()``):
    after one update its state has torch's keys, dtypes, devices and step count."""
    states = []
    for analytic in (True, False):
        policy = _policy("discrete", dtype=torch.float32)
        cfg = PPOConfig(num_epochs=1, minibatch_size=16, analytic_gradients=analytic)
        trainer = PPOTrainer(policy, cfg, seed=0)
        trainer.update(_rollout_batch(policy, 32, 0))
        states.append(trainer.optimizer.state_dict())
    fast, slow = states
    assert fast["param_groups"] == slow["param_groups"]
    assert fast["state"].keys() == slow["state"].keys()
    for index, want in slow["state"].items():
        got = fast["state"][index]
        assert got.keys() == want.keys()
        for key, value in want.items():
            assert (got[key].dtype, got[key].device, got[key].shape) == (
                value.dtype, value.device, value.shape,
            ), (index, key)  # fmt: skip
        assert float(got["step"]) == float(want["step"]) == 2.0


def test_a_cpu_learner_never_imports_dynamo():
    """Building the trainer, updating, and saving and loading its state leave
    ``torch._dynamo`` unimported (its import is ~1.1 s of a learner's start-up)."""
    code = (
        "import sys, copy, torch\n"
        "from tests.test_analytic import _policy, _rollout_batch\n"
        "from zmq_rl.config import PPOConfig\n"
        "from zmq_rl.rl.ppo import PPOTrainer\n"
        "policy = _policy('discrete', dtype=torch.float32)\n"
        "trainer = PPOTrainer(policy, PPOConfig(num_epochs=1, minibatch_size=16), seed=0)\n"
        "assert trainer.flat is not None\n"
        "trainer.update(_rollout_batch(policy, 32, 0))\n"
        "trainer.load_state_dict(copy.deepcopy(trainer.state_dict()))\n"
        "trainer.update(_rollout_batch(policy, 32, 1))\n"
        "print(sorted(m for m in sys.modules if m.startswith('torch._dynamo')))\n"
    )
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


def test_a_poisoned_minibatch_is_still_skipped():
    """A non-finite advantage: the update reruns checked and skips that minibatch,
    with closed-form gradients as with autograd."""
    policy = _policy("discrete", dtype=torch.float32)
    before = [p.detach().clone() for p in policy.parameters()]
    trainer = PPOTrainer(policy, dataclasses.replace(PPOConfig(), num_epochs=1, minibatch_size=16))
    batch = _rollout_batch(policy, 32, 0)
    batch.advantages[3] = float("nan")
    metrics = trainer.update(batch)
    assert metrics["losses/skipped_minibatches"] >= 1.0
    assert all(torch.isfinite(p).all() for p in policy.parameters())
    assert any(not torch.equal(p, q) for p, q in zip(policy.parameters(), before, strict=True))


def test_adam_state_loaded_mid_run_is_the_one_stepped():
    """After a checkpoint load replaces Adam's tensors, the next steps move the new
    ones (a stale list of the old moments would leave them as loaded)."""
    policy = _policy("discrete", dtype=torch.float32)
    trainer = PPOTrainer(policy, PPOConfig(num_epochs=1, minibatch_size=16), seed=0)
    trainer.update(_rollout_batch(policy, 32, 0))
    trainer.load_state_dict(copy.deepcopy(trainer.state_dict()))  # new tensors
    param = next(policy.parameters())
    loaded = trainer.optimizer.state[param]["exp_avg"]
    before = loaded.clone()
    trainer.update(_rollout_batch(policy, 32, 1))
    assert trainer.optimizer.state[param]["exp_avg"] is loaded
    assert not torch.equal(loaded, before)
    assert float(trainer.optimizer.state[param]["step"]) == 4.0


def test_optimizer_step_hooks_still_run():
    policy = _policy("box", dtype=torch.float32)
    trainer = PPOTrainer(policy, PPOConfig(num_epochs=2, minibatch_size=16), seed=0)
    steps = []
    trainer.optimizer.register_step_post_hook(lambda *_: steps.append(1))
    trainer.update(_rollout_batch(policy, 32, 0))
    assert len(steps) == 2 * 2


def test_parameters_given_new_memory_are_still_the_ones_stepped():
    """The numpy steps move the policy's own tensors: a parameter whose memory was
    replaced after the trainer was built (``param.data = ...``) is trained too."""
    policy = _policy("discrete", dtype=torch.float32)
    trainer = PPOTrainer(policy, PPOConfig(num_epochs=1, minibatch_size=16), seed=0)
    trainer.update(_rollout_batch(policy, 32, 0))
    head = policy.policy_head.weight
    head.data = head.data.clone()  # memory of its own, outside the flat buffer
    before = head.detach().clone()
    trainer.update(_rollout_batch(policy, 32, 1))
    assert not torch.equal(head, before)
    flat = trainer.flat.flat_params  # the parameter is a view of the flat buffer again
    assert head.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_standardised_advantages_are_torchs(dtype: torch.dtype) -> None:
    """The numpy steps standardise a minibatch's advantages as the torch update does:
    ``(a - mean) / (std + 1e-8)`` with the unbiased std, in the advantages' dtype."""
    adv = torch.randn(64, generator=torch.Generator().manual_seed(3), dtype=dtype) * 7 + 2
    expected = (adv - adv.mean()) / (adv.std() + 1e-8)
    got = standardised(adv.numpy().copy())
    assert got.dtype == adv.numpy().dtype
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    np.testing.assert_allclose(got, expected.numpy(), rtol=tol, atol=tol)
