"""The off-policy surrogates of ``PPOConfig.objective``: decoupled PPO (Hilton et al.
2021) and IMPACT (Luo et al. 2020) against hand-computed values, their reductions to
PPO, the trainer's proximal policy and target network, and one short real-process
CartPole run per objective with V-trace and stale weights (broadcast every 4)."""

from __future__ import annotations

import io
import math
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import zmq_rl
from tests.ports import free_port_block
from tests.test_ppo import _params, config, make_batch, make_policy
from zmq_rl.config import OBJECTIVES, ConfigError, LearnerConfig, PolicyConfig, PPOConfig
from zmq_rl.rl.ppo import PPOTrainer, RolloutBatch, decoupled_ppo_loss, impact_loss, ppo_loss
from zmq_rl.rl.trainer import Trainer

torch.set_num_threads(1)

COMMON = dict(clip_value_loss=False, value_clip_range=0.2, vf_coef=0.5, ent_coef=0.01)


def _t(values: list[float], grad: bool = False) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64, requires_grad=grad)


def _value_parts(n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """value, old_value, returns, entropy with value loss 0.5 * mean(1) and entropy 0.5."""
    return _t([1.0] * n, True), _t([0.0] * n), _t([0.0] * n), _t([0.5] * n, True)


# -- decoupled_ppo_loss -----------------------------------------------------------------

# r = pi/pi_prox = [1.5, 0.5, 1.1], A = [1, 1, -2], eps 0.2 (as tests/test_ppo.py):
#   min(r*A, clip(r)*A) = [1.2 (clipped), 0.5, -2.2]
# w = min(rho_bar = 1.5, pi_prox/mu = [2.0, 0.5, 1.0]) = [1.5, 0.5, 1.0]
#   w * min = [1.8, 0.25, -2.2], mean = -0.05  ->  policy_loss = 0.05


def test_decoupled_loss_hand_computed():
    behaviour = _t([-1.0, -0.5, -2.0])
    prox = behaviour + torch.log(_t([2.0, 0.5, 1.0]))
    log_prob = (prox + torch.log(_t([1.5, 0.5, 1.1]))).detach().requires_grad_()
    value, old_value, returns, entropy = _value_parts(3)
    out = decoupled_ppo_loss(
        log_prob, prox, behaviour, _t([1.0, 1.0, -2.0]), value, old_value, returns, entropy,
        clip_range=0.2, rho_bar=1.5, **COMMON,
    )  # fmt: skip
    assert out.policy_loss.item() == pytest.approx(0.05, abs=1e-12)
    assert out.value_loss.item() == pytest.approx(0.5, abs=1e-12)
    assert out.total.item() == pytest.approx(0.05 - 0.01 * 0.5 + 0.5 * 0.5, abs=1e-12)
    # approx_kl and clip_fraction are against pi_prox, the trust region's centre.
    kl = sum((r - 1.0) - math.log(r) for r in (1.5, 0.5, 1.1)) / 3
    assert out.approx_kl.item() == pytest.approx(kl, abs=1e-12)
    assert out.clip_fraction.item() == pytest.approx(2 / 3, abs=1e-12)
    # d policy_loss / d log_prob = -w r A / N where the unclipped term is the min.
    out.policy_loss.backward()
    expected = _t([0.0, -0.5 * 0.5 * 1.0 / 3, -1.0 * 1.1 * -2.0 / 3])
    torch.testing.assert_close(log_prob.grad, expected)


def test_decoupled_loss_is_ppo_when_proximal_is_behaviour():
    gen = torch.Generator().manual_seed(0)
    behaviour = torch.randn(32, generator=gen)
    log_prob = behaviour + 0.3 * torch.randn(32, generator=gen)
    args = [torch.randn(32, generator=gen) for _ in range(5)]  # A, V, V_old, R, H
    ppo = ppo_loss(log_prob, behaviour, *args, clip_range=0.2, **COMMON)
    dec = decoupled_ppo_loss(
        log_prob, behaviour, behaviour, *args, clip_range=0.2, rho_bar=1.0, **COMMON
    )
    for a, b in zip(ppo, dec, strict=True):
        assert torch.equal(a, b)


# -- impact_loss -------------------------------------------------------------------------

# r = pi/mu = [1.8, 0.5, 2.0, 0.9], pi_target/mu = [1.4, 0.4, 3.0, 1.0], rho_bar 2:
#   rho = [1.4, 0.4, 2.0 (truncated), 1.0], eps 0.2 -> bands [1.12, 1.68], [0.32, 0.48],
#   [1.6, 2.4], [0.8, 1.2]; A = [1, -1, 1, -2]:
#   clip(r) = [1.68, 0.48, 2.0, 0.9]; min(r A, clip(r) A) = [1.68 (clipped),
#   -0.5 (unclipped below), 2.0, -1.8]; mean = 0.345 -> policy_loss = -0.345


def test_impact_loss_hand_computed():
    behaviour = _t([-1.0, -0.5, -2.0, -0.1])
    target = behaviour + torch.log(_t([1.4, 0.4, 3.0, 1.0]))
    log_prob = (behaviour + torch.log(_t([1.8, 0.5, 2.0, 0.9]))).detach().requires_grad_()
    value, old_value, returns, entropy = _value_parts(4)
    out = impact_loss(
        log_prob, target, behaviour, _t([1.0, -1.0, 1.0, -2.0]), value, old_value, returns,
        entropy, clip_range=0.2, rho_bar=2.0, **COMMON,
    )  # fmt: skip
    assert out.policy_loss.item() == pytest.approx(-0.345, abs=1e-12)
    assert out.total.item() == pytest.approx(-0.345 - 0.01 * 0.5 + 0.5 * 0.5, abs=1e-12)
    assert out.clip_fraction.item() == pytest.approx(0.5, abs=1e-12)  # r_0 and r_1 outside
    # approx_kl is against pi_target: x = pi/pi_target = r / (pi_target/mu).
    xs = [1.8 / 1.4, 0.5 / 0.4, 2.0 / 3.0, 0.9 / 1.0]
    kl = sum((x - 1.0) - math.log(x) for x in xs) / 4
    assert out.approx_kl.item() == pytest.approx(kl, abs=1e-12)
    out.policy_loss.backward()
    expected = _t([0.0, -0.5 * -1.0 / 4, -2.0 * 1.0 / 4, -0.9 * -2.0 / 4])
    torch.testing.assert_close(log_prob.grad, expected)


def test_impact_loss_is_ppo_when_target_is_behaviour():
    gen = torch.Generator().manual_seed(1)
    behaviour = torch.randn(32, generator=gen)
    log_prob = behaviour + 0.3 * torch.randn(32, generator=gen)
    args = [torch.randn(32, generator=gen) for _ in range(5)]
    ppo = ppo_loss(log_prob, behaviour, *args, clip_range=0.2, **COMMON)
    imp = impact_loss(log_prob, behaviour, behaviour, *args, clip_range=0.2, rho_bar=1.0, **COMMON)
    for a, b in zip(ppo, imp, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_impact_without_truncation_is_decoupled_around_the_target():
    """min(r A, clip(r, rho(1-e), rho(1+e)) A) = rho min((r/rho) A, clip(r/rho) A)."""
    gen = torch.Generator().manual_seed(2)
    behaviour = torch.randn(64, generator=gen, dtype=torch.float64)
    target = behaviour + 0.5 * torch.randn(64, generator=gen, dtype=torch.float64)
    log_prob = (target + 0.3 * torch.randn(64, generator=gen, dtype=torch.float64)).requires_grad_()
    args = [torch.randn(64, generator=gen, dtype=torch.float64) for _ in range(5)]
    imp = impact_loss(log_prob, target, behaviour, *args, clip_range=0.2, rho_bar=1e9, **COMMON)
    dec = decoupled_ppo_loss(
        log_prob, target, behaviour, *args, clip_range=0.2, rho_bar=1e9, **COMMON
    )
    torch.testing.assert_close(imp.policy_loss, dec.policy_loss)
    torch.testing.assert_close(imp.approx_kl, dec.approx_kl)
    (g_imp,) = torch.autograd.grad(imp.policy_loss, log_prob)
    (g_dec,) = torch.autograd.grad(dec.policy_loss, log_prob)
    torch.testing.assert_close(g_imp, g_dec)


# -- config ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "name"),
    [
        ({"objective": "appo"}, "objective"),
        ({"objective_rho_bar": 0.0}, "objective_rho_bar"),
        ({"objective_rho_bar": math.inf}, "objective_rho_bar"),
        ({"impact_target_update_every": 0}, "impact_target_update_every"),
    ],
)
def test_config_rejects_bad_objective_settings(changes, name):
    with pytest.raises(ConfigError) as err:
        PPOConfig(**changes).validate()
    assert err.value.field == name


def test_objective_is_a_flag_with_its_choices():
    from zmq_rl.cli.flags import CliParser, Section, add_config_flags

    parser = CliParser()
    add_config_flags(parser, [Section("ppo", PPOConfig, "PPO")])
    text = parser.format_help()
    assert "--objective" in text and "--objective-rho-bar" in text
    assert all(name in text for name in OBJECTIVES)


# -- PPOTrainer ----------------------------------------------------------------------------


def stale_batch(n: int = 64) -> RolloutBatch:
    """Data whose behaviour log-probs are far from the learner's (a lagging actor):
    the learner's own actions with log mu = log pi + N(0, 0.5^2)."""
    batch = make_batch(make_policy(seed=5), n=n)
    gen = torch.Generator().manual_seed(11)
    batch.old_log_probs = batch.old_log_probs + 0.5 * torch.randn(n, generator=gen)
    return batch


@pytest.mark.parametrize("objective", ["decoupled", "impact"])
def test_fresh_data_steps_like_ppo(objective):
    """On fresh data the proximal policy and the (first) target network are the
    behaviour policy, so the new objectives take PPO's steps (to float precision:
    the batch's behaviour log-probs come from ``act``, the centre's from
    ``evaluate_actions``)."""
    batch = make_batch(make_policy(seed=0))
    trainers = {
        name: PPOTrainer(make_policy(seed=0), config(objective=name, num_epochs=2), seed=3)
        for name in ("ppo", objective)
    }
    for trainer in trainers.values():
        trainer.update(batch)
    for a, b in zip(
        _params(trainers["ppo"].policy), _params(trainers[objective].policy), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


@pytest.mark.parametrize("objective", ["decoupled", "impact"])
def test_stale_data_updates_differ_from_ppo_and_stay_finite(objective):
    batch = stale_batch()
    ppo = PPOTrainer(make_policy(seed=5), config(), seed=1)
    other = PPOTrainer(make_policy(seed=5), config(objective=objective), seed=1)
    m_ppo, m_other = ppo.update(batch), other.update(batch)
    assert all(math.isfinite(v) for k, v in m_other.items() if "explained" not in k)
    # The trust region is centred on the learner's policy: the first minibatch's
    # approx_kl is 0 there, but large against the stale behaviour policy for ppo.
    assert m_other["losses/approx_kl"] < m_ppo["losses/approx_kl"]
    assert any(
        not torch.equal(a, b)
        for a, b in zip(_params(ppo.policy), _params(other.policy), strict=True)
    )


def test_impact_target_network_refreshes_every_n_updates():
    batch = stale_batch()
    trainer = PPOTrainer(
        make_policy(seed=5), config(objective="impact", impact_target_update_every=2)
    )
    snapshots = []
    for _ in range(3):
        snapshots.append([p.detach().clone() for p in trainer.policy.parameters()])
        trainer.update(batch)
    target = _params(trainer.target_policy)
    # Refreshed at the start of updates 0 and 2: now the policy as it was before update 2.
    assert all(torch.equal(a, b) for a, b in zip(target, snapshots[2], strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(target, snapshots[1], strict=True))
    assert trainer.updates == 3


def test_impact_state_dict_round_trip_keeps_the_target_network():
    batch = stale_batch()
    cfg = config(objective="impact", impact_target_update_every=3)
    trainer = PPOTrainer(make_policy(seed=5), cfg, seed=2)
    trainer.update(batch)
    buffer = io.BytesIO()
    torch.save(trainer.state_dict(), buffer)
    buffer.seek(0)
    restored = PPOTrainer(make_policy(seed=6), cfg, seed=0)
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    assert restored.updates == 1
    for _ in range(3):  # across a refresh at update 3
        trainer.update(batch)
        restored.update(batch)
    for a, b in zip(_params(trainer.policy), _params(restored.policy), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("objective", ["decoupled", "impact"])
def test_recurrent_sequences_train_with_the_new_objectives(objective):
    from tests.test_recurrent import MASKED, collect
    from tests.test_recurrent import make_policy as make_recurrent
    from zmq_rl.learner.queues import SlotQueues
    from zmq_rl.rl.targets import TargetSettings, recurrent_batch

    behaviour = make_recurrent("lstm", seed=1)
    queues = SlotQueues()
    for fragment in collect(behaviour, MASKED, 2, 16, cuts=[7]):
        queues.push(fragment)
    rollout = queues.take([(0, 0), (0, 1)], 16)
    policy = make_recurrent("lstm", seed=2)
    batch, _ = recurrent_batch(rollout, policy, TargetSettings(gamma=0.99, gae_lambda=0.95), {})
    before = policy.rnn.weight_hh_l0.detach().clone()
    trainer = PPOTrainer(policy, PPOConfig(num_epochs=2, minibatch_size=8, objective=objective))
    metrics = trainer.update(batch)
    assert metrics["losses/skipped_minibatches"] == 0
    assert math.isfinite(metrics["losses/policy_loss"])
    assert not torch.equal(before, policy.rnn.weight_hh_l0)


def test_trainer_drops_vtrace_advantage_weight_only_for_the_new_objectives():
    env = gym.make("CartPole-v1")
    cfg = LearnerConfig(use_vtrace=True)
    made = {
        name: Trainer(
            cfg, PPOConfig(objective=name), PolicyConfig(), env.observation_space, env.action_space
        )
        for name in OBJECTIVES
    }
    env.close()
    assert made["ppo"].targets.vtrace_weight_advantages is True
    assert made["decoupled"].targets.vtrace_weight_advantages is False
    assert made["impact"].targets.vtrace_weight_advantages is False


# -- real processes ------------------------------------------------------------------------

# CartPole-v1's preset with V-trace and weights broadcast every 4 updates (actors act
# with a policy 4-8 updates old), 2 actor processes, a 30k-step budget (~10-25 s).
# Measured final 20-episode evaluations at this budget, seeds 0-4
# (docs/learning-quality.md, "Off-policy objectives"): ppo 489.9, 500.0, 440.4,
# 495.9, 500.0; decoupled 500.0, 500.0, 162.1, 355.8, 145.7; impact 500.0, 485.4,
# 500.0, 474.2, 500.0. Random play scores about 22, so 100 is "clearly learned" with
# margin below the worst seed seen (the test runs seed 0).
RUN_STEPS = 30_000
RUN_THRESHOLD = 100.0


@pytest.mark.timeout(300)
@pytest.mark.parametrize("objective", OBJECTIVES)
def test_short_cartpole_run_with_stale_weights_learns(objective, tmp_path: Path):
    """A real learner and two actor processes train with each objective under lag."""
    result = zmq_rl.train(
        "CartPole-v1",
        run_dir=tmp_path / "run",
        objective=objective,
        use_vtrace=True,
        broadcast_every=4,
        total_env_steps=RUN_STEPS,
        target_return=math.inf,
        eval_every=1000,
        eval_in_background=False,
        port=free_port_block(),
        tensorboard=False,
        verbose=False,
        seed=0,
    )
    assert result.report.stop_reason == "budget spent"
    final = result.last_evaluation
    assert final is not None and np.isfinite(final["mean_return"])
    assert final["mean_return"] >= RUN_THRESHOLD, final
    config_text = (tmp_path / "run" / "config.toml").read_text()
    assert f'objective = "{objective}"' in config_text


def test_dataclass_field_defaults_are_documented():
    text = (Path(__file__).resolve().parents[1] / "docs" / "api.md").read_text()
    for name in ("objective", "objective_rho_bar", "impact_target_update_every"):
        assert f"`{name}`" in text, name
