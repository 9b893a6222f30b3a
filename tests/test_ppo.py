"""Tests for zmq_rl.ppo: the loss against hand-computed values and the trainer's update."""

from __future__ import annotations

import dataclasses
import io
import math

import numpy as np
import pytest
import torch
from gymnasium import spaces

from zmq_rl.config import PolicyConfig, PPOConfig
from zmq_rl.rl.policy import ActorCritic, build_policy
from zmq_rl.rl.ppo import PPOTrainer, RolloutBatch, explained_variance, ppo_loss

torch.set_num_threads(1)

OBS = spaces.Box(-np.inf, np.inf, (4,), np.float32)
DISCRETE = spaces.Discrete(3)
BOX = spaces.Box(-1.0, 1.0, (2,), np.float32)
SMALL = PolicyConfig(hidden_sizes=(16, 16))


# -- ppo_loss ----------------------------------------------------------------------

# Ratios r = [1.5, 0.5, 1.1], advantages A = [1, 1, -2], clip 0.2:
#   r*A = [1.5, 0.5, -2.2], clip(r)*A = [1.2, 0.8, -2.2]
#   min = [1.2 (clipped), 0.5 (outside the band, but the unclipped term is lower), -2.2]
RATIOS = [1.5, 0.5, 1.1]
ADV = [1.0, 1.0, -2.0]
VALUE = [1.0, 2.0, 3.0]
OLD_VALUE = [0.0, 2.5, 3.5]
RETURNS = [1.5, 1.0, 3.0]
ENTROPY = [0.5, 0.7, 0.9]


def _loss_inputs():
    old_log_prob = torch.tensor([-1.0, -0.5, -2.0], dtype=torch.float64)
    log_prob = (
        old_log_prob + torch.log(torch.tensor(RATIOS, dtype=torch.float64))
    ).requires_grad_()
    value = torch.tensor(VALUE, dtype=torch.float64, requires_grad=True)
    entropy = torch.tensor(ENTROPY, dtype=torch.float64, requires_grad=True)
    adv, old_value, returns = (
        torch.tensor(x, dtype=torch.float64) for x in (ADV, OLD_VALUE, RETURNS)
    )
    return log_prob, old_log_prob, adv, value, old_value, returns, entropy


def test_ppo_loss_hand_computed_unclipped_value():
    log_prob, old_log_prob, adv, value, old_value, returns, entropy = _loss_inputs()
    out = ppo_loss(
        log_prob, old_log_prob, adv, value, old_value, returns, entropy,
        clip_range=0.2, clip_value_loss=False, value_clip_range=0.2, vf_coef=0.5, ent_coef=0.01,
    )  # fmt: skip
    policy_loss = -(1.2 + 0.5 - 2.2) / 3  # = 1/6
    value_loss = 0.5 * (0.25 + 1.0 + 0.0) / 3
    entropy_mean = 0.7
    approx_kl = ((0.5 - math.log(1.5)) + (-0.5 - math.log(0.5)) + (0.1 - math.log(1.1))) / 3
    assert out.policy_loss.item() == pytest.approx(policy_loss, abs=1e-12)
    assert out.value_loss.item() == pytest.approx(value_loss, abs=1e-12)
    assert out.entropy.item() == pytest.approx(entropy_mean, abs=1e-12)
    assert out.approx_kl.item() == pytest.approx(approx_kl, abs=1e-12)
    assert out.clip_fraction.item() == pytest.approx(2 / 3, abs=1e-12)
    total = policy_loss - 0.01 * entropy_mean + 0.5 * value_loss
    assert out.total.item() == pytest.approx(total, abs=1e-12)
    assert not out.approx_kl.requires_grad and not out.clip_fraction.requires_grad

    # Gradient of the policy loss w.r.t. log_prob: -r*A/N where the unclipped term is
    # the min, 0 where the clipped term is (element 0).
    out.policy_loss.backward()
    expected = torch.tensor([0.0, -0.5 * 1.0 / 3, -1.1 * -2.0 / 3], dtype=torch.float64)
    torch.testing.assert_close(log_prob.grad, expected)


def test_ppo_loss_hand_computed_clipped_value():
    log_prob, old_log_prob, adv, value, old_value, returns, entropy = _loss_inputs()
    out = ppo_loss(
        log_prob, old_log_prob, adv, value, old_value, returns, entropy,
        clip_range=0.2, clip_value_loss=True, value_clip_range=0.2, vf_coef=2.0, ent_coef=0.0,
    )  # fmt: skip
    # V_clip = old + clip(V - old, -0.2, 0.2) = [0.2, 2.3, 3.3]
    # (V - R)^2 = [0.25, 1, 0];  (V_clip - R)^2 = [1.69, 1.69, 0.09];  max = [1.69, 1.69, 0.09]
    value_loss = 0.5 * (1.69 + 1.69 + 0.09) / 3
    assert out.value_loss.item() == pytest.approx(value_loss, abs=1e-12)
    assert out.total.item() == pytest.approx(1 / 6 + 2.0 * value_loss, abs=1e-12)
    # The clipped branch is the max everywhere, so no gradient reaches V where
    # V - old was clipped (all three elements here).
    out.value_loss.backward()
    torch.testing.assert_close(value.grad, torch.zeros(3, dtype=torch.float64))

    # A wider value clip leaves element 2 unclipped: V_clip = [1.0, 2.0, 3.0] for c = 1,
    # so both branches coincide and the loss equals the unclipped one.
    log_prob, old_log_prob, adv, value, old_value, returns, entropy = _loss_inputs()
    wide = ppo_loss(
        log_prob, old_log_prob, adv, value, old_value, returns, entropy,
        clip_range=0.2, clip_value_loss=True, value_clip_range=1.0, vf_coef=0.5, ent_coef=0.0,
    )  # fmt: skip
    assert wide.value_loss.item() == pytest.approx(0.5 * 1.25 / 3, abs=1e-12)


def test_ppo_loss_without_clipping_is_the_plain_surrogate():
    log_prob, old_log_prob, adv, value, old_value, returns, entropy = _loss_inputs()
    out = ppo_loss(
        log_prob, old_log_prob, adv, value, old_value, returns, entropy,
        clip_range=10.0, clip_value_loss=False, value_clip_range=0.2, vf_coef=0.5, ent_coef=0.0,
    )  # fmt: skip
    assert out.policy_loss.item() == pytest.approx(-(1.5 + 0.5 - 2.2) / 3, abs=1e-12)
    assert out.clip_fraction.item() == 0.0


def test_explained_variance():
    target = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert explained_variance(target, target) == pytest.approx(1.0)
    assert explained_variance(torch.full((4,), 2.5), target) == pytest.approx(0.0)
    assert explained_variance(target + 1.0, target) == pytest.approx(1.0)  # offsets explained
    noisy = target + torch.tensor([1.0, -1.0, 1.0, -1.0])  # Var(residual) = 1, Var(y) = 1.25
    assert explained_variance(noisy, target) == pytest.approx(1.0 - 1.0 / 1.25)
    assert math.isnan(explained_variance(target, torch.ones(4)))


# -- PPOTrainer --------------------------------------------------------------------


def make_policy(action_space: spaces.Space = DISCRETE, seed: int = 0) -> ActorCritic:
    torch.manual_seed(seed)
    return build_policy(OBS, action_space, SMALL)


def make_batch(policy: ActorCritic, n: int = 64, seed: int = 0) -> RolloutBatch:
    """Behaviour data from ``policy`` itself, with random-sign advantages."""
    gen = torch.Generator().manual_seed(seed)
    obs = torch.randn(n, 4, generator=gen)
    with torch.no_grad():
        actions, log_probs, values = policy.act(obs, gen)
    advantages = torch.randn(n, generator=gen)
    returns = values + advantages + 0.1 * torch.randn(n, generator=gen)
    return RolloutBatch(obs, actions, log_probs, values, advantages, returns)


def config(**changes) -> PPOConfig:
    base = PPOConfig(learning_rate=3e-3, num_epochs=4, minibatch_size=16, anneal_lr=False)
    return dataclasses.replace(base, **changes)


@pytest.mark.parametrize("action_space", [DISCRETE, BOX])
def test_updates_raise_log_prob_of_positive_advantage_actions(action_space):
    policy = make_policy(action_space)
    batch = make_batch(policy, n=128)
    trainer = PPOTrainer(policy, config(num_epochs=4), seed=0)
    positive = batch.advantages > 0

    def log_probs() -> torch.Tensor:
        with torch.no_grad():
            return policy.evaluate_actions(batch.obs, batch.actions)[0]

    start = log_probs()
    for _ in range(5):
        trainer.update(batch)
    delta = log_probs() - start
    assert delta[positive].mean() > 0.01
    assert delta[~positive].mean() < -0.01


def test_value_loss_decreases():
    policy = make_policy()
    batch = make_batch(policy)
    batch.returns = batch.obs.sum(dim=1)  # a learnable value target
    trainer = PPOTrainer(policy, config(vf_coef=1.0), seed=0)
    first = trainer.update(batch)["losses/value_loss"]
    for _ in range(10):
        last = trainer.update(batch)["losses/value_loss"]
    assert last < 0.3 * first


EXPECTED_KEYS = {
    "losses/policy_loss",
    "losses/value_loss",
    "losses/entropy",
    "losses/approx_kl",
    "losses/clip_fraction",
    "losses/explained_variance",
    "losses/epochs_run",
    "losses/skipped_minibatches",
    "charts/learning_rate",
    "charts/clip_range",
}


@pytest.mark.parametrize("action_space", [DISCRETE, BOX])
@pytest.mark.parametrize("clip_value_loss", [False, True])
def test_metrics_are_finite_python_floats(action_space, clip_value_loss):
    policy = make_policy(action_space)
    trainer = PPOTrainer(policy, config(clip_value_loss=clip_value_loss, ent_coef=0.01))
    metrics = trainer.update(make_batch(policy))
    assert set(metrics) == EXPECTED_KEYS
    for key, value in metrics.items():
        assert type(value) is float and math.isfinite(value), key
    assert metrics["losses/epochs_run"] == 4.0
    assert metrics["losses/approx_kl"] >= 0.0
    assert 0.0 <= metrics["losses/clip_fraction"] <= 1.0
    assert metrics["losses/entropy"] > 0.0


@pytest.mark.parametrize("progress", [0.0, 0.25, 0.9])
def test_anneal_lr_and_clip_range(progress):
    policy = make_policy()
    batch = make_batch(policy)
    annealed = PPOTrainer(policy, config(learning_rate=1e-3, anneal_lr=True))
    metrics = annealed.update(batch, progress=progress)
    assert metrics["charts/learning_rate"] == pytest.approx(1e-3 * (1 - progress), rel=1e-12)
    assert annealed.optimizer.param_groups[0]["lr"] == metrics["charts/learning_rate"]
    assert metrics["charts/clip_range"] == 0.2

    fixed = PPOTrainer(policy, config(learning_rate=1e-3, anneal_clip_range=True))
    metrics = fixed.update(batch, progress=progress)
    assert metrics["charts/learning_rate"] == 1e-3
    assert metrics["charts/clip_range"] == pytest.approx(0.2 * (1 - progress), rel=1e-12)


def test_progress_at_end_of_budget_freezes_the_policy():
    policy = make_policy()
    before = [p.clone() for p in policy.parameters()]
    PPOTrainer(policy, config(anneal_lr=True)).update(make_batch(policy), progress=1.0)
    assert all(torch.equal(a, b) for a, b in zip(before, policy.parameters(), strict=True))


@pytest.mark.parametrize("progress", [-0.1, 1.5, float("nan")])
def test_progress_out_of_range_is_rejected(progress):
    policy = make_policy()
    with pytest.raises(ValueError, match="progress"):
        PPOTrainer(policy, config()).update(make_batch(policy), progress=progress)


def test_target_kl_stops_early_after_at_least_one_step():
    policy = make_policy()
    batch = make_batch(policy)
    before = [p.clone() for p in policy.parameters()]
    trainer = PPOTrainer(policy, config(learning_rate=0.05, num_epochs=10, target_kl=1e-6))
    metrics = trainer.update(batch)
    assert metrics["losses/epochs_run"] < 10
    assert metrics["losses/epochs_run"] > 0
    assert metrics["losses/approx_kl"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.parameters(), strict=True))

    off = PPOTrainer(make_policy(), config(learning_rate=0.05, num_epochs=10, target_kl=0.0))
    assert off.update(batch)["losses/epochs_run"] == 10.0


def _params(policy: ActorCritic) -> list[torch.Tensor]:
    return [p.detach().clone() for p in policy.parameters()]


def test_same_seed_same_parameters_different_seed_different():
    batch = make_batch(make_policy())
    results = []
    for seed in (5, 5, 6):
        policy = make_policy(seed=1)
        trainer = PPOTrainer(policy, config(), seed=seed)
        trainer.update(batch)
        trainer.update(batch)
        results.append(_params(policy))
    assert all(torch.equal(a, b) for a, b in zip(results[0], results[1], strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(results[0], results[2], strict=True))


def test_gradient_norm_is_clipped():
    """With a tiny max_grad_norm, Adam's steps shrink to ~lr * g / eps: near zero.
    (Adam is otherwise invariant to the gradient's scale, so this isolates the clip.)"""
    moved = {}
    for max_grad_norm in (1e-9, 0.5):
        policy = make_policy(seed=1)
        before = _params(policy)
        PPOTrainer(policy, config(max_grad_norm=max_grad_norm, num_epochs=1)).update(
            make_batch(policy)
        )
        moved[max_grad_norm] = max(
            (a - b).abs().max().item() for a, b in zip(before, _params(policy), strict=True)
        )
    assert moved[1e-9] < 1e-5
    assert moved[0.5] > 1e-3


def test_odd_sizes_and_singleton_minibatches_stay_finite():
    policy = make_policy(BOX)
    # 5 transitions, minibatch 2: the last minibatch of each epoch has 1 element and
    # must skip normalisation (its std is NaN) rather than poison the parameters.
    trainer = PPOTrainer(policy, config(minibatch_size=2, num_epochs=3))
    metrics = trainer.update(make_batch(policy, n=5))
    assert metrics["losses/epochs_run"] == 3.0
    assert all(math.isfinite(v) for v in metrics.values())
    assert all(torch.isfinite(p).all() for p in policy.parameters())
    # minibatch_size above N uses the whole batch.
    big = PPOTrainer(policy, config(minibatch_size=256, num_epochs=2))
    assert big.update(make_batch(policy, n=7))["losses/epochs_run"] == 2.0


def test_advantage_normalisation_is_scale_invariant():
    policy_a, policy_b = make_policy(seed=2), make_policy(seed=2)
    batch = make_batch(policy_a)
    scaled = dataclasses.replace(batch, advantages=batch.advantages * 100.0 + 3.0)
    # The value loss does not see the advantages; only the policy gradient does.
    PPOTrainer(policy_a, config(), seed=1).update(batch)
    PPOTrainer(policy_b, config(), seed=1).update(scaled)
    for a, b in zip(
        policy_a.actor_trunk.parameters(), policy_b.actor_trunk.parameters(), strict=True
    ):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)


def test_invalid_batch_is_rejected():
    policy = make_policy()
    batch = make_batch(policy, n=8)
    bad = dataclasses.replace(batch, returns=batch.returns[:7])
    with pytest.raises(ValueError, match="returns"):
        PPOTrainer(policy, config()).update(bad)


def test_state_dict_round_trip_through_weights_only_load():
    batch = make_batch(make_policy())
    policy = make_policy(seed=3)
    trainer = PPOTrainer(policy, config(), seed=9)
    trainer.update(batch)

    buffer = io.BytesIO()
    torch.save(trainer.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)

    restored = PPOTrainer(make_policy(seed=4), config(), seed=0)
    restored.load_state_dict(state)
    # Continuing from the checkpoint takes exactly the steps the original takes
    # (same weights, Adam moments and minibatch order).
    trainer.update(batch)
    restored.update(batch)
    for a, b in zip(_params(trainer.policy), _params(restored.policy), strict=True):
        assert torch.equal(a, b)


def test_non_finite_minibatches_are_skipped_not_applied():
    """Returns of 3e38 overflow the value loss to inf: those minibatches are skipped
    (counted), the others train, and no parameter becomes NaN or inf."""
    policy = make_policy()
    batch = make_batch(policy)
    batch.returns[:2] = 3e38  # two poisoned rows: the minibatches holding them are skipped
    trainer = PPOTrainer(policy, config(minibatch_size=8, num_epochs=2))
    before = [p.detach().clone() for p in policy.parameters()]
    metrics = trainer.update(batch)
    assert metrics["losses/skipped_minibatches"] > 0
    assert all(torch.isfinite(p).all() for p in policy.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.parameters(), strict=True))


# -- against the update before the sync-free rewrite ----------------------------------


@pytest.mark.parametrize("case", list(__import__("tests.ppo_golden").ppo_golden.CASES))
def test_update_matches_the_update_it_replaced(case):
    """Parameters and metrics after three updates equal those of the update before
    the rewrite (tests/ppo_golden.py wrote them), objective by objective, with the
    skip of poisoned minibatches and the target_kl stop among the cases."""
    from tests.ppo_golden import GOLDEN, run_case

    golden = np.load(GOLDEN)
    now = run_case(case)
    assert sorted(now) == sorted(k for k in golden.files if k.startswith(f"{case}/"))
    for key, value in now.items():
        np.testing.assert_allclose(value, golden[key], rtol=2e-5, atol=2e-6, err_msg=key)


@pytest.mark.parametrize("rows", [64, 128, 70])
def test_num_minibatches_fixes_the_steps_per_epoch_whatever_the_rollout(rows):
    """With num_minibatches the minibatch grows with the rollout: the same number of
    Adam steps per epoch for 64, 128 or 70 rows (the last one holds the remainder);
    without it, minibatch_size fixes the size and the step count grows."""
    policy = make_policy()
    batch = make_batch(policy, n=rows)
    trainer = PPOTrainer(policy, config(num_epochs=2, num_minibatches=4))
    steps = []
    trainer.optimizer.register_step_post_hook(lambda *_: steps.append(1))
    metrics = trainer.update(batch)
    assert len(steps) == 2 * 4
    assert trainer.minibatch_size_for(rows) == math.ceil(rows / 4)
    assert metrics["losses/epochs_run"] == 2.0
    fixed = PPOTrainer(make_policy(), config(num_epochs=1, minibatch_size=16))
    assert fixed.minibatch_size_for(rows) == 16


def test_num_minibatches_must_not_be_negative():
    with pytest.raises(ValueError, match="num_minibatches"):
        config(num_minibatches=-1).validate()
