"""Rows that are not valid (multi-agent slots without a live agent, ``Fragment.valid``)
on the learner side: rollout assembly, targets, the PPO update and accounting.

The key property: an invalid row's contents are placeholders, so replacing them by
other garbage must change nothing a learner computes (parameters, metrics, targets,
episode returns, statistics), while the same garbage in rows taken as valid must."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from gymnasium import spaces

from zmq_rl.config import LearnerConfig, PolicyConfig, PPOConfig
from zmq_rl.learner.queues import SlotQueues
from zmq_rl.rl.advantages import gae, vtrace
from zmq_rl.rl.closed_form import ClosedFormSteps
from zmq_rl.rl.normalization import RewardScaler
from zmq_rl.rl.policy import build_policy
from zmq_rl.rl.ppo import PPOTrainer
from zmq_rl.rl.rollout import Rollout
from zmq_rl.rl.targets import TargetSettings, recurrent_batch, rollout_to_batch, sequence_layout
from zmq_rl.rl.trainer import Trainer
from zmq_rl.wire.protocol import Fragment, decode, encode

torch.set_num_threads(1)

OBS_SPACE = spaces.Box(-np.inf, np.inf, (3,), np.float32)
ACT_SPACE = spaces.Discrete(3)
T, B = 8, 3
GAMMA, LAM = 0.9, 0.8

# Column 0: one agent all along (its episode ends at row 3, the next begins at 4).
# Column 1: an agent that terminates at row 2, an empty slot for rows 3-5, a new
# agent from row 6. Column 2: empty until row 2, an agent truncated at row 4 (a
# final observation), empty again from row 5.
VALID = np.ones((T, B), bool)
VALID[3:6, 1] = False
VALID[:2, 2] = False
VALID[5:, 2] = False
TERMINATED = [(3, 0), (2, 1)]
TRUNCATED = [(4, 2)]


# -- fixtures ------------------------------------------------------------------------


def make_rollout(seed: int = 0, valid: np.ndarray | None = VALID) -> Rollout:
    """A ``[T, B]`` rollout with random contents that keeps the wire's rules for
    ``valid``: an invalid row has reward 0 and ends nothing."""
    rng = np.random.default_rng(seed)
    terminated = np.zeros((T, B), bool)
    truncated = np.zeros((T, B), bool)
    for t, b in TERMINATED:
        terminated[t, b] = True
    for t, b in TRUNCATED:
        truncated[t, b] = True
    rewards = rng.standard_normal((T, B)).astype(np.float32)
    if valid is not None:
        rewards[~valid] = 0.0
    return Rollout(
        slots=[(0, b) for b in range(B)],
        obs=rng.standard_normal((T, B, 3)).astype(np.float32),
        actions=rng.integers(0, 3, (T, B)).astype(np.int64),
        rewards=rewards,
        terminated=terminated,
        truncated=truncated,
        values=rng.standard_normal((T, B)).astype(np.float32),
        log_probs=-rng.random((T, B)).astype(np.float32) - 0.5,
        versions=rng.integers(0, 3, (T, B)).astype(np.int64),
        bootstrap_obs=rng.standard_normal((B, 3)).astype(np.float32),
        final_t=np.array([t for t, _ in TRUNCATED], np.int64),
        final_b=np.array([b for _, b in TRUNCATED], np.int64),
        final_obs=rng.standard_normal((len(TRUNCATED), 3)).astype(np.float32),
        valid=None if valid is None else valid.copy(),
    )


def garble(rollout: Rollout, seed: int, scale: float = 50.0) -> Rollout:
    """``rollout`` with other placeholders in its invalid rows: observations,
    actions, values and log-probs (and the bootstrap observation of a column whose
    last row is invalid). Rewards stay 0 and no invalid row ends an episode, as the
    wire demands."""
    rng = np.random.default_rng(1000 + seed)
    invalid = ~rollout.valid
    obs, actions = rollout.obs.copy(), rollout.actions.copy()
    values, log_probs = rollout.values.copy(), rollout.log_probs.copy()
    k = int(invalid.sum())
    obs[invalid] = scale * rng.standard_normal((k, 3)).astype(np.float32)
    actions[invalid] = rng.integers(0, 3, k)
    values[invalid] = scale * rng.standard_normal(k).astype(np.float32)
    log_probs[invalid] = -scale * rng.random(k).astype(np.float32)
    bootstrap_obs = rollout.bootstrap_obs.copy()
    last_invalid = invalid[-1]
    bootstrap_obs[last_invalid] = scale * rng.standard_normal((int(last_invalid.sum()), 3))
    return dataclasses.replace(
        rollout,
        obs=obs,
        actions=actions,
        values=values,
        log_probs=log_probs,
        bootstrap_obs=bootstrap_obs,
        rewards=rollout.rewards.copy(),
        valid=rollout.valid.copy(),
    )


def make_trainer(analytic: bool = True, **learner) -> Trainer:
    cfg = LearnerConfig(num_steps=T, gamma=GAMMA, gae_lambda=LAM, seed=5, **learner)
    ppo = PPOConfig(
        num_epochs=3, minibatch_size=6, learning_rate=3e-3, anneal_lr=False,
        clip_value_loss=True, ent_coef=0.01, analytic_gradients=analytic,
    )  # fmt: skip
    policy = PolicyConfig(hidden_sizes=(16,), normalize_obs=True)
    return Trainer(cfg, ppo, policy, OBS_SPACE, ACT_SPACE)


def update(trainer: Trainer, rollout: Rollout):
    result = trainer.update(dataclasses.replace(rollout), progress=0.25)
    params = [p.detach().clone() for p in trainer.policy.parameters()]
    buffers = [b.detach().clone() for b in trainer.policy.buffers()]
    return result, params, buffers


def assert_same_metrics(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key, value in want.items():
        if math.isnan(value):
            assert math.isnan(got[key]), key
        else:
            assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-7), key


# -- (a) rollout assembly ----------------------------------------------------------------


def fragment(actor_id: int, slots: list[int], rows: int, seq: int, valid=None) -> Fragment:
    """A wire-checked fragment of ``rows`` rows of ``slots`` (round-tripped through
    encode/decode, so ``valid`` obeys the protocol): a valid row before an invalid
    one is terminated, every invalid row has reward 0. Each cell's observation
    encodes (actor, slot, seq, row)."""
    n = len(slots)
    t = np.arange(rows)[:, None]
    obs = (1000 * actor_id + 100 * np.asarray(slots)[None, :] + 10 * seq + t).astype(np.float32)
    terminated = np.zeros((rows, n), bool)
    rewards = np.ones((rows, n), np.float32)
    if valid is not None:
        valid = np.asarray(valid, bool)
        terminated[:-1] = valid[:-1] & ~valid[1:]
        rewards[~valid] = 0.0
    f = Fragment(
        actor_id=actor_id, version=seq, seq=seq, run_id="r", token=bytes(16),
        slots=np.asarray(slots), obs=obs[..., None], actions=np.zeros((rows, n), np.int64),
        rewards=rewards, terminated=terminated, truncated=np.zeros((rows, n), bool),
        values=np.zeros((rows, n), np.float32), log_probs=np.zeros((rows, n), np.float32),
        next_obs=np.zeros((n, 1), np.float32), valid=valid,
    )  # fmt: skip
    decoded = decode(encode(f))
    assert isinstance(decoded, Fragment)
    return decoded


def test_rollout_assembles_valid_from_fragments_with_and_without_it():
    """Columns from fragments with and without ``valid`` (an all-valid fragment's
    column is True), a two-slot fragment copied as one block, and fragments split
    across rollouts: ``valid`` follows each row to where it lands."""
    queues = SlotQueues()
    v0 = np.array([[1, 1], [1, 0], [0, 0], [0, 1], [1, 1]], bool)  # actor 0, slots 0-1
    v1 = np.array([[1, 0], [1, 0], [1, 1]], bool)
    queues.push(fragment(0, [0, 1], 5, 0, v0))
    queues.push(fragment(0, [0, 1], 3, 1, v1))
    queues.push(fragment(1, [0], 4, 0))  # no valid: every row valid
    queues.push(fragment(1, [0], 4, 1, np.array([[1], [0], [0], [1]], bool)))
    slots = [(0, 0), (1, 0), (0, 1)]
    first = queues.take(slots, 6)
    expected = np.stack(
        [np.r_[v0[:, 0], v1[:1, 0]], np.r_[np.ones(4, bool), [True, False]],
         np.r_[v0[:, 1], v1[:1, 1]]], axis=1,
    )  # fmt: skip
    np.testing.assert_array_equal(first.valid, expected)
    # The rows themselves landed where their valid flags did.
    assert first.obs[5, 1, 0] == 1000 + 10 + 1 and first.obs[5, 2, 0] == 100 + 10
    assert first.env_steps == int(expected.sum())
    np.testing.assert_array_equal(first.slot_env_steps(), expected.sum(axis=0))
    second = queues.take(slots, 2)  # the rest of the split fragments
    np.testing.assert_array_equal(
        second.valid, np.stack([v1[1:, 0], [False, True], v1[1:, 1]], axis=1)
    )
    assert second.env_steps == 4


def test_rollout_of_valid_rows_only_has_valid_none():
    """Fragments without ``valid``, or whose taken rows are all valid, give
    ``valid = None`` (the single-agent fast path), and every row is an env step."""
    queues = SlotQueues()
    queues.push(fragment(0, [0, 1], 4, 0))
    queues.push(fragment(1, [0], 4, 0, np.array([[1], [1], [0], [0]], bool)))
    rollout = queues.take([(0, 0), (0, 1), (1, 0)], 2)
    assert rollout.valid is None
    assert rollout.env_steps == 6
    assert rollout.valid_mask().all() and rollout.valid_mask().shape == (2, 3)
    rest = queues.take([(0, 0), (0, 1), (1, 0)], 2)
    np.testing.assert_array_equal(rest.valid[:, 2], [False, False])
    assert rest.env_steps == 4


# -- (b) the PPO update ignores invalid rows ---------------------------------------------


@pytest.mark.parametrize("analytic", [True, False])
@pytest.mark.parametrize("use_vtrace", [False, True])
def test_invalid_rows_have_no_influence_on_the_update(analytic, use_vtrace):
    """One Trainer update (obs and reward normalisation, targets, minibatches with a
    remainder, clipped value loss): placeholders in the invalid rows change neither
    the parameters, the observation statistics, the metrics nor the returns; the same
    contents taken as valid rows do change the parameters."""
    rollout = make_rollout(seed=1)
    garbled = garble(rollout, seed=2)
    runs = []
    for data in (rollout, garbled, dataclasses.replace(garbled, valid=None)):
        trainer = make_trainer(analytic, use_vtrace=use_vtrace, normalize_reward=True)
        assert (trainer.ppo.flat is not None) is analytic
        runs.append(update(trainer, data))
    (base, params, buffers), (other, params2, buffers2), (_, included, _) = runs
    for p, q in zip(params, params2, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
    for p, q in zip(buffers, buffers2, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
    assert_same_metrics(other.metrics, base.metrics)
    assert other.episode_returns == base.episode_returns
    lag = trainer.version - rollout.versions[VALID]
    assert base.metrics["charts/policy_lag_mean"] == pytest.approx(lag.mean())
    assert base.metrics["charts/policy_lag_max"] == lag.max()
    assert max(float((p - q).abs().max()) for p, q in zip(params, included, strict=True)) > 1e-3


@pytest.mark.parametrize("analytic", [True, False])
def test_the_batch_holds_the_valid_rows_and_the_minibatches_cut_them(monkeypatch, analytic):
    """The flat batch is the valid rows in row-major order; PPO cuts its minibatches
    from that many rows (a remainder minibatch included), each epoch covering every
    valid row once."""
    rollout = make_rollout(seed=3)
    policy = make_trainer().policy
    batch, _ = rollout_to_batch(rollout, policy, TargetSettings(gamma=GAMMA, gae_lambda=LAM))
    n = rollout.env_steps
    assert len(batch) == n == 16 < T * B
    np.testing.assert_array_equal(batch.obs.numpy(), rollout.obs[VALID])
    np.testing.assert_array_equal(batch.actions.numpy(), rollout.actions[VALID])
    np.testing.assert_array_equal(batch.old_values.numpy(), rollout.values[VALID])
    sizes: list[int] = []
    if analytic:  # the numpy steps (rl/closed_form.py)
        gradients = ClosedFormSteps.gradients

        def record(self, rows, clip_range):
            sizes.append(int(rows.actions.shape[0]))
            return gradients(self, rows, clip_range)

        monkeypatch.setattr(ClosedFormSteps, "gradients", record)
    else:
        original = PPOTrainer._minibatch_step

        def record(self, rows, plan, tally, checked):
            sizes.append(int(rows.tensors["actions"].shape[0]))
            return original(self, rows, plan, tally, checked)

        monkeypatch.setattr(PPOTrainer, "_minibatch_step", record)
    ppo = PPOConfig(num_epochs=2, minibatch_size=6, analytic_gradients=analytic)
    trainer = PPOTrainer(policy, ppo, seed=0)
    assert (trainer.flat is not None) is analytic
    metrics = trainer.update(batch)
    assert sizes == [6, 6, 4] * 2
    assert metrics["losses/epochs_run"] == pytest.approx(2.0)
    sizes.clear()
    ppo = PPOConfig(num_epochs=1, num_minibatches=4, analytic_gradients=analytic)
    PPOTrainer(policy, ppo, seed=0).update(batch)
    assert sizes == [4, 4, 4, 4]  # 16 valid rows in 4 (24 rows would give 6 each)


def test_a_rollout_without_valid_rows_takes_no_step():
    """Every slot empty: no gradient step, no statistics, no episode; the update is
    still counted and its metrics are finite where they can be."""
    rollout = make_rollout(seed=4, valid=np.zeros((T, B), bool))
    rollout.terminated[:] = False
    rollout.truncated[:] = False
    rollout = dataclasses.replace(
        rollout, final_t=np.zeros(0, np.int64), final_b=np.zeros(0, np.int64),
        final_obs=np.zeros((0, 3), np.float32),
    )  # fmt: skip
    trainer = make_trainer(normalize_reward=True)
    before = [p.detach().clone() for p in trainer.policy.state_dict().values()]
    result = trainer.update(rollout, progress=0.0)
    after = list(trainer.policy.state_dict().values())
    for p, q in zip(before, after, strict=True):
        assert torch.equal(p, q)
    assert result.episode_returns == []
    assert trainer.reward_scaler.count == 0
    assert trainer.ppo.updates == 1
    assert result.metrics["losses/epochs_run"] == 0
    assert math.isnan(result.metrics["losses/explained_variance"])


# -- (c) targets -------------------------------------------------------------------------


def cells(batch_values, valid: np.ndarray) -> np.ndarray:
    """The batch's per-row values back in ``[T, B]`` (NaN at invalid rows)."""
    out = np.full(valid.shape, np.nan)
    out[valid] = batch_values.numpy()
    return out


@pytest.mark.parametrize(
    "settings",
    [
        TargetSettings(gamma=GAMMA, gae_lambda=LAM),
        TargetSettings(gamma=GAMMA, gae_lambda=LAM, recompute_values=True),
        TargetSettings(gamma=GAMMA, gae_lambda=LAM, use_vtrace=True, vtrace_lambda=LAM),
        TargetSettings(
            gamma=GAMMA, gae_lambda=LAM, use_vtrace=True, standardize_before_weight=True
        ),
    ],
    ids=["gae", "gae-recompute", "vtrace", "vtrace-standardised"],
)
def test_targets_of_valid_rows_ignore_invalid_rows(settings):
    """GAE and V-trace targets (and V-trace's diagnostics) of the valid rows are the
    same whatever the invalid rows hold, even placeholders of 1e30 (nothing may
    multiply them by zero into a NaN), and even where a valid row is followed by an
    invalid one without an episode end (rows from different fragments)."""
    valid = VALID.copy()
    valid[6, 0] = False  # row 5 of column 0 is valid, not done, and then the slot is empty
    rollout = make_rollout(seed=5, valid=valid)
    policy = make_trainer().policy
    batch, diag = rollout_to_batch(rollout, policy, settings)
    for scale in (50.0, 1e30):
        other, diag2 = rollout_to_batch(garble(rollout, seed=6, scale=scale), policy, settings)
        torch.testing.assert_close(other.advantages, batch.advantages, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(other.returns, batch.returns, rtol=1e-6, atol=1e-6)
        assert diag2 == pytest.approx(diag)
    if settings.use_vtrace:
        assert 0 < diag["charts/importance_ratio_mean"] < 1.5
    # A plausible bug would chain through them: taking the garbled rows as valid does.
    included, _ = rollout_to_batch(
        dataclasses.replace(garble(rollout, seed=6), valid=None), policy, settings
    )
    assert not np.allclose(included.advantages.numpy()[valid.reshape(-1)], batch.advantages)


def test_gae_targets_of_each_agent_are_those_of_its_own_rows():
    """Each agent's GAE targets are :func:`gae` on its own valid rows, ended by a zero
    discount: the empty-slot rows neither bootstrap nor pass advantages on, not even
    from the next agent of the slot to an agent before the empty rows that did not
    end its episode (rows from different fragments)."""
    valid = VALID.copy()
    valid[6, 0] = False  # column 0: rows 4-5 valid, not done; then empty; row 7 a new agent
    rollout = make_rollout(seed=7, valid=valid)
    policy = make_trainer().policy
    settings = TargetSettings(gamma=GAMMA, gae_lambda=LAM)
    batch, _ = rollout_to_batch(rollout, policy, settings)
    adv, ret = cells(batch.advantages, valid), cells(batch.returns, valid)
    with torch.no_grad():
        v_final = float(policy.value(torch.from_numpy(rollout.final_obs))[0])
        v_boot = policy.value(torch.from_numpy(rollout.bootstrap_obs)).numpy()
    # (column, rows, reward bonus at the last row, bootstrap after the last row)
    agents = [
        (0, slice(4, 6), 0.0, 0.0),  # followed by an empty row: nothing after it counts
        (0, slice(7, 8), 0.0, float(v_boot[0])),
        (1, slice(0, 3), 0.0, 0.0),  # terminated at row 2
        (1, slice(6, 8), 0.0, float(v_boot[1])),  # the new agent, cut by the rollout
        (2, slice(2, 5), GAMMA * v_final, 0.0),  # truncated at row 4
    ]
    for b, rows, bonus, boot in agents:
        r = rollout.rewards[rows, b].astype(np.float64).copy()
        r[-1] += bonus
        n = len(r)
        discounts = np.full(n, GAMMA)
        if boot == 0.0:
            discounts[-1] = 0.0
        want = gae(
            r[:, None], rollout.values[rows, b, None].astype(np.float64), np.array([boot]),
            discounts[:, None], LAM,
        )  # fmt: skip
        np.testing.assert_allclose(adv[rows, b], want.advantages[:, 0], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ret[rows, b], want.returns[:, 0], rtol=1e-5, atol=1e-5)


def test_vtrace_statistics_are_over_valid_rows():
    """V-trace's importance-ratio diagnostics and the standardisation before the
    weight are over the valid rows only: on-policy rows (weight 1) give valid
    advantages of mean 0 and std 1, however many rows are empty."""
    rollout = make_rollout(seed=14)
    policy = make_trainer().policy
    with torch.no_grad():
        lp, _, _ = policy.evaluate_actions(
            torch.from_numpy(rollout.obs.reshape(T * B, 3)),
            torch.from_numpy(rollout.actions.reshape(T * B)),
        )
    lp = lp.numpy().reshape(T, B)
    behaviour = np.where(VALID & (np.arange(T)[:, None] < 4), lp, lp + 0.3).astype(np.float32)
    settings = TargetSettings(
        gamma=GAMMA, gae_lambda=LAM, use_vtrace=True, standardize_before_weight=True
    )
    _, diag = rollout_to_batch(dataclasses.replace(rollout, log_probs=behaviour), policy, settings)
    rhos = np.exp(lp - behaviour)[VALID]
    assert diag["charts/importance_ratio_mean"] == pytest.approx(rhos.mean(), rel=1e-5)
    assert diag["charts/importance_ratio_clipped"] == pytest.approx((rhos > 1.0).mean())
    on_policy, _ = rollout_to_batch(dataclasses.replace(rollout, log_probs=lp), policy, settings)
    advantages = on_policy.advantages.numpy().astype(np.float64)
    assert abs(advantages.mean()) < 1e-5
    assert advantages.std() == pytest.approx(1.0, rel=1e-4)


def test_vtrace_of_an_agent_is_vtrace_of_its_own_rows():
    """V-trace targets of the agent of column 1 that terminates at row 2 are
    :func:`vtrace` of its three rows alone."""
    rollout = make_rollout(seed=8)
    policy = make_trainer().policy
    settings = TargetSettings(gamma=GAMMA, gae_lambda=LAM, use_vtrace=True, vtrace_lambda=LAM)
    settings = dataclasses.replace(settings, vtrace_weight_advantages=False)
    batch, _ = rollout_to_batch(rollout, policy, settings)
    rows = slice(0, 3)
    with torch.no_grad():
        lp, _, v = policy.evaluate_actions(
            torch.from_numpy(rollout.obs[rows, 1]), torch.from_numpy(rollout.actions[rows, 1])
        )
    want = vtrace(
        (lp.numpy() - rollout.log_probs[rows, 1])[:, None].astype(np.float64),
        np.array([[GAMMA], [GAMMA], [0.0]]),
        rollout.rewards[rows, 1, None].astype(np.float64),
        v.numpy()[:, None].astype(np.float64),
        np.zeros(1),
        lam=LAM,
    )
    np.testing.assert_allclose(cells(batch.returns, VALID)[rows, 1], want.vs[:, 0], atol=1e-5)
    np.testing.assert_allclose(
        cells(batch.advantages, VALID)[rows, 1], want.advantages[:, 0], atol=1e-5
    )


# -- (d) accounting ----------------------------------------------------------------------


def test_env_steps_and_episode_returns_count_valid_rows_only():
    """A rollout's env steps are its valid rows; episode returns add the rewards of
    an agent's own rows, come in the order the episodes ended (row 2 of column 1,
    row 3 of column 0, row 4 of column 2: the progress line's recent mean is over the
    latest episodes, not the last columns'), and carry an unfinished one over an
    empty stretch."""
    rollout = make_rollout(seed=9)
    assert rollout.env_steps == int(VALID.sum()) == 16
    np.testing.assert_array_equal(rollout.slot_env_steps(), [8, 5, 3])
    trainer = make_trainer()
    returns = trainer._account(rollout)
    r = rollout.rewards.astype(np.float64)
    want = [r[:3, 1].sum(), r[:4, 0].sum(), r[2:5, 2].sum()]
    assert returns == pytest.approx(want)
    assert trainer.running_return[(0, 0)] == pytest.approx(r[4:, 0].sum())
    assert trainer.running_return[(0, 1)] == pytest.approx(r[6:, 1].sum())
    assert trainer.running_return[(0, 2)] == 0.0


def test_accounting_skips_invalid_rows_whatever_they_hold():
    """Episode returns and the reward statistics read no invalid row: a reward in one
    (which the wire rejects, but a learner must not depend on it) changes nothing."""
    rollout = make_rollout(seed=10)
    spoiled = dataclasses.replace(rollout, rewards=np.where(VALID, rollout.rewards, 7.0))
    spoiled.rewards = spoiled.rewards.astype(np.float32)
    a, b = make_trainer(), make_trainer()
    assert a._account(rollout) == b._account(spoiled)
    assert a.running_return == b.running_return
    done = rollout.terminated | rollout.truncated
    scalers = [RewardScaler(GAMMA), RewardScaler(GAMMA)]
    scalers[0].observe(rollout.rewards, done, rollout.slots, rollout.valid)
    scalers[1].observe(spoiled.rewards, done, rollout.slots, rollout.valid)
    assert scalers[0].count == scalers[1].count == 16
    assert float(scalers[0].var) == pytest.approx(float(scalers[1].var))
    assert scalers[0].returns == scalers[1].returns


# -- (e) recurrent policies --------------------------------------------------------------


def recurrent_rollout(seed: int, policy) -> Rollout:
    rollout = make_rollout(seed=seed)
    starts = np.zeros((T, B), bool)
    starts[0] = True
    starts[4] = True  # a second fragment begins at row 4
    rng = np.random.default_rng(seed)
    states = np.zeros((T, B, policy.state_size), np.float32)
    states[starts] = rng.standard_normal((int(starts.sum()), policy.state_size))
    return dataclasses.replace(rollout, states=states, state_starts=starts)


def test_recurrent_sequences_skip_invalid_rows():
    """No sequence holds or spans an invalid row, and the agent that takes an empty
    slot starts from zeros."""
    policy = build_policy(OBS_SPACE, ACT_SPACE, PolicyConfig(policy_type="gru", hidden_sizes=(8,)))
    layout = sequence_layout(recurrent_rollout(11, policy))
    real = layout.mask
    assert not (~VALID[layout.t[real], layout.b[real]]).any()
    assert int(layout.lengths.sum()) == int(VALID.sum())
    got = sorted(zip(layout.column.tolist(), layout.first.tolist(), layout.lengths.tolist(),
                     layout.kind.tolist(), strict=True))  # fmt: skip
    # column 0: rows 0-3 (episode ends), 4-7 (episode start); column 1: rows 0-2, then
    # a new agent at 6 (zeros); column 2: the agent of rows 2-4 (zeros: it took the
    # empty slot).
    assert got == [(0, 0, 4, 1), (0, 4, 4, 2), (1, 0, 3, 1), (1, 6, 2, 2), (2, 2, 2, 2),
                   (2, 4, 1, 1)]  # fmt: skip


def test_recurrent_update_ignores_invalid_rows():
    """A recurrent batch's targets and one PPO update on it are the same whatever the
    invalid rows hold; the carried state of a slot whose last row is empty is zero."""
    results = []
    for garbled in (False, True):
        torch.manual_seed(3)
        policy = build_policy(
            OBS_SPACE, ACT_SPACE, PolicyConfig(policy_type="gru", hidden_sizes=(8,))
        )
        rollout = recurrent_rollout(12, policy)
        if garbled:
            rollout = garble(rollout, seed=13)
        carry: dict = {}
        settings = TargetSettings(gamma=GAMMA, gae_lambda=LAM, use_vtrace=True)
        batch, _ = recurrent_batch(rollout, policy, settings, carry)
        assert int(batch.mask.sum()) == rollout.env_steps
        assert not carry[(0, 2)].any()  # column 2's last row is invalid
        mask = batch.mask.numpy()
        targets = (batch.advantages.numpy()[mask], batch.returns.numpy()[mask])
        metrics = PPOTrainer(policy, PPOConfig(num_epochs=2, minibatch_size=8)).update(batch)
        results.append((targets, metrics, [p.detach().clone() for p in policy.parameters()]))
    (targets, metrics, params), (targets2, metrics2, params2) = results
    for x, y in zip(targets, targets2, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6)
    assert_same_metrics(metrics2, metrics)
    for p, q in zip(params, params2, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
