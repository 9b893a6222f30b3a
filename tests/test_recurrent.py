"""Recurrent policies: the LSTM/GRU actor-critic, truncated BPTT over sequences, and
the learner's bookkeeping of the actors' states (fragment starts, episode resets,
rollouts that begin mid-fragment)."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np
import pytest
import torch

from zmq_rl.config import PolicyConfig, PPOConfig
from zmq_rl.learner.queues import SlotQueues
from zmq_rl.rl.networks import batch_obs, obs_tensor
from zmq_rl.rl.policy import FactoryError, build_policy, check_policy_interface, is_recurrent
from zmq_rl.rl.ppo import PPOTrainer
from zmq_rl.rl.targets import TargetSettings, recurrent_batch, sequence_layout
from zmq_rl.wire.protocol import Fragment

MASKED = "zmq_rl.envs:MaskedCartPole-v1"


def make_policy(kind: str = "lstm", seed: int = 0, **kwargs):
    torch.manual_seed(seed)
    env = gym.make(MASKED)
    policy = build_policy(
        env.observation_space,
        env.action_space,
        PolicyConfig(policy_type=kind, hidden_sizes=(16,), **kwargs),
    )
    env.close()
    return policy


@pytest.mark.parametrize(("kind", "size"), [("lstm", 32), ("gru", 16)])
def test_recurrent_policy_interface_and_state(kind, size):
    policy = make_policy(kind)
    assert is_recurrent(policy) and policy.state_size == size
    check_policy_interface(policy, "built-in")
    state = policy.initial_state(3)
    assert state.shape == (3, size) and not state.any()
    obs = torch.randn(3, 2)
    a1, lp1, v1, s1 = policy.act_recurrent(obs, state, deterministic=True)
    assert a1.shape == lp1.shape == v1.shape == (3,) and s1.shape == (3, size)
    assert s1.abs().sum() > 0
    # The state matters: the same observation from another state acts differently.
    _, lp2, v2, s2 = policy.act_recurrent(obs, s1, deterministic=True)
    assert not torch.allclose(v1, v2) and not torch.allclose(s1, s2)
    with pytest.raises(ValueError, match="state of shape"):
        policy.act_recurrent(obs, torch.zeros(3, size + 1))


def test_recurrent_factory_needs_the_recurrent_methods():
    class Half(torch.nn.Module):
        state_size = 4

        def initial_state(self, n):
            return torch.zeros(n, 4)

    with pytest.raises(FactoryError, match="act_recurrent, evaluate_sequence"):
        check_policy_interface(Half(), "m:f")


def test_evaluate_sequence_matches_step_by_step_acting_and_backpropagates_through_time():
    policy = make_policy("lstm")
    L, N = 6, 3
    obs = torch.randn(L, N, 2, requires_grad=True)
    actions = torch.randint(0, 2, (L, N))
    state0 = torch.randn(N, policy.state_size) * 0.1
    lengths = torch.tensor([6, 4, 1])
    log_prob, entropy, value, final = policy.evaluate_sequence(obs, actions, state0, lengths)
    assert log_prob.shape == entropy.shape == value.shape == (L, N)
    # One row at a time with act_recurrent gives the same values and final states.
    state = state0
    for t in range(L):
        _, _, v, nxt = policy.act_recurrent(obs[t].detach(), state, deterministic=True)
        for n in range(N):
            if t < lengths[n]:
                assert torch.allclose(v[n], value[t, n], atol=1e-5)
            if t == lengths[n] - 1:
                assert torch.allclose(nxt[n], final[n], atol=1e-5)
        state = nxt
    # Truncated BPTT: the last row's log-prob depends on the first row's observation
    # through the recurrent state, but never on a padding row.
    log_prob[5, 0].backward(retain_graph=True)
    assert obs.grad[0, 0].abs().sum() > 0
    assert obs.grad[:, 1:].abs().sum() == 0
    obs.grad = None
    log_prob[0, 2].backward()
    assert obs.grad[1:, 2].abs().sum() == 0


def collect(policy, env_id: str, num_envs: int, steps: int, cuts: list[int], seed: int = 0):
    """Act like zmq_rl.actor.gym_actor.GymActor for ``steps`` lockstep steps and return the
    fragments it would send: a fragment ends after each row index in ``cuts``
    (fragment lengths vary, as when an actor flushes at a valve pause)."""
    envs = [gym.make(env_id, max_episode_steps=11) for _ in range(num_envs)]
    space = envs[0].observation_space
    obs = batch_obs(space, [e.reset(seed=seed + i)[0] for i, e in enumerate(envs)])
    state = policy.initial_state(num_envs)
    generator = torch.Generator().manual_seed(seed)
    rows, fragments = [], []
    start_state = state
    for t in range(steps):
        action, log_prob, value, next_state = policy.act_recurrent(
            obs_tensor(obs), state, generator
        )
        if not rows:
            start_state = state
        rec = {"obs": obs, "actions": action.numpy(), "values": value.numpy()}
        rec["log_probs"] = log_prob.numpy()
        rec["rewards"], rec["terminated"], rec["truncated"], final = [], [], [], {}
        nxt = []
        for j, env in enumerate(envs):
            o, r, term, trunc, _ = env.step(int(action[j]))
            rec["rewards"].append(r)
            rec["terminated"].append(term)
            rec["truncated"].append(trunc)
            if trunc and not term:
                final[j] = o
            if term or trunc:
                o, _ = env.reset()
            nxt.append(o)
        rec["final"] = final
        rows.append(rec)
        obs = batch_obs(space, nxt)
        done = np.array(rec["terminated"]) | np.array(rec["truncated"])
        state = next_state * torch.from_numpy(~done)[:, None]
        if t in cuts or t == steps - 1:
            fragments.append(to_fragment(rows, obs, start_state, len(fragments)))
            rows = []
    return fragments


def to_fragment(rows, next_obs, state, seq) -> Fragment:
    B = len(rows[0]["rewards"])
    final_index = [t * B + b for t, r in enumerate(rows) for b in sorted(r["final"])]
    finals = [r["final"][b] for r in rows for b in sorted(r["final"])]
    return Fragment(
        actor_id=0,
        version=0,
        seq=seq,
        run_id="r",
        token=bytes(16),
        slots=np.arange(B),
        obs=np.stack([r["obs"] for r in rows]),
        actions=np.stack([r["actions"] for r in rows]),
        rewards=np.array([r["rewards"] for r in rows], np.float32),
        terminated=np.array([r["terminated"] for r in rows]),
        truncated=np.array([r["truncated"] for r in rows]),
        values=np.stack([r["values"] for r in rows]),
        log_probs=np.stack([r["log_probs"] for r in rows]),
        next_obs=next_obs,
        final_obs_index=np.array(final_index, np.int32),
        final_obs=np.stack(finals).astype(np.float32) if finals else np.zeros((0, 2), np.float32),
        state=state.numpy().astype(np.float32),
    )


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_learner_recomputes_the_actors_log_probs_and_values_exactly(kind):
    """On-policy data re-evaluated by the learner's sequence unroll gives back what
    the actor computed step by step, cell for cell: the states at fragment starts,
    the zeroing at every episode start, and the state carried into a rollout that
    begins mid-fragment are all right (any slip changes the values)."""
    policy = make_policy(kind, seed=3)
    # 36 steps of 2 slots in fragments of 8, 5 (a partial flush), 8, 8, 7 rows;
    # rollouts of 12 rows then begin mid-fragment twice. Episodes end (CartPole
    # terminations and truncation at 11 steps) throughout.
    fragments = collect(policy, MASKED, 2, 36, cuts=[7, 12, 20, 28])
    queues = SlotQueues()
    for f in fragments:
        queues.push(f)
    slots = [(0, 0), (0, 1)]
    settings = TargetSettings(gamma=0.99, gae_lambda=0.95, use_vtrace=True)
    carry: dict = {}
    seen_kinds = set()
    truncations = 0
    for _ in range(3):
        rollout = queues.take(slots, 12)
        truncations += len(rollout.final_t)
        layout = sequence_layout(rollout)
        seen_kinds.update(layout.kind.tolist())
        batch, diag = recurrent_batch(rollout, policy, settings, carry)
        # With V-trace the target log-probs are the learner's: on-policy, rho = 1.
        assert diag["charts/importance_ratio_mean"] == pytest.approx(1.0, abs=1e-4)
        mask = batch.mask.numpy()
        np.testing.assert_allclose(
            batch.old_values.numpy()[mask],
            rollout.values[layout.t, layout.b][mask],
        )
        # The sequence unroll itself reproduces the actor's values cell by cell.
        _, _, value, _ = policy.evaluate_sequence(
            batch.obs, batch.actions, batch.states, batch.lengths
        )
        np.testing.assert_allclose(
            value.detach().numpy()[mask], rollout.values[layout.t, layout.b][mask], atol=1e-5
        )
    assert seen_kinds == {0, 1, 2}, "carried, fragment and episode-start states all used"
    assert truncations > 0


def two_slot_rollout(policy):
    """16 rows of 2 slots collected by ``policy``, cut into fragments of 8 and 8."""
    queues = SlotQueues()
    for f in collect(policy, MASKED, 2, 16, cuts=[7]):
        queues.push(f)
    return queues.take([(0, 0), (0, 1)], 16)


def test_recompute_values_ignores_the_behaviour_values_of_sequences():
    """With ``recompute_values`` a recurrent batch's GAE targets come from the
    learner's unroll: spoiling the values the actors sent changes nothing (and
    changes the targets without it)."""
    policy = make_policy("gru", seed=2)
    rollout = two_slot_rollout(policy)
    spoiled = dataclasses.replace(rollout, values=rollout.values + 5.0)
    settings = TargetSettings(gamma=0.99, gae_lambda=0.95)
    fresh = dataclasses.replace(settings, recompute_values=True)
    exact, _ = recurrent_batch(rollout, policy, fresh, {})
    recomputed, _ = recurrent_batch(spoiled, policy, fresh, {})
    plain, _ = recurrent_batch(spoiled, policy, settings, {})
    mask = exact.mask.numpy()
    np.testing.assert_allclose(
        recomputed.advantages.numpy()[mask], exact.advantages.numpy()[mask], atol=1e-5
    )
    np.testing.assert_allclose(
        recomputed.returns.numpy()[mask], exact.returns.numpy()[mask], atol=1e-4
    )
    assert np.abs(plain.advantages.numpy()[mask] - exact.advantages.numpy()[mask]).max() > 0.1
    # old_values stay what the actors sent.
    np.testing.assert_allclose(
        recomputed.old_values.numpy()[mask], exact.old_values.numpy()[mask] + 5.0, atol=1e-5
    )


def test_layout_cuts_at_fragment_and_episode_starts():
    policy = make_policy("lstm")
    fragments = collect(policy, MASKED, 1, 10, cuts=[3])
    queues = SlotQueues()
    for f in fragments:
        queues.push(f)
    rollout = queues.take([(0, 0)], 10)
    rollout.terminated[:] = False
    rollout.truncated[:] = False
    rollout.terminated[5, 0] = True
    layout = sequence_layout(rollout)
    assert layout.first.tolist() == [0, 4, 6]
    assert layout.lengths.tolist() == [4, 2, 4]
    assert layout.kind.tolist() == [1, 1, 2]


def test_ppo_update_on_sequences_changes_the_recurrent_weights():
    policy = make_policy("lstm", seed=1)
    rollout = two_slot_rollout(policy)
    batch, _ = recurrent_batch(rollout, policy, TargetSettings(gamma=0.99, gae_lambda=0.95), {})
    before = policy.rnn.weight_hh_l0.detach().clone()
    trainer = PPOTrainer(policy, PPOConfig(num_epochs=2, minibatch_size=8))
    metrics = trainer.update(batch)
    assert metrics["losses/skipped_minibatches"] == 0
    assert metrics["losses/epochs_run"] == pytest.approx(2.0)
    assert not torch.equal(before, policy.rnn.weight_hh_l0)


def test_policy_type_reaches_the_welcome_policy_map():
    from zmq_rl.config import LearnerConfig
    from zmq_rl.learner.loop import run_settings
    from zmq_rl.rl.policy import policy_config_from

    env = gym.make(MASKED)
    policy = make_policy("gru")
    settings = run_settings(
        LearnerConfig(env_id=MASKED),
        env.observation_space,
        env.action_space,
        PolicyConfig(policy_type="gru", hidden_sizes=(16,)),
        state_size=policy.state_size,
    )
    env.close()
    assert settings.policy["policy_type"] == "gru" and settings.state_size == 16
    actor_side = build_policy(
        settings.observation_space, settings.action_space, policy_config_from(settings)
    )
    assert actor_side.state_size == settings.state_size


@pytest.mark.timeout(400)
def test_lstm_run_through_real_processes(tmp_path, learner_port):
    """zmq-rl run with --policy-type lstm: the actors carry and send the state, the
    learner accepts every fragment and trains on sequences (fragments of 4 rows,
    rollouts of 6: rollouts begin mid-fragment)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "zmq_rl", "run", "--env", "tests.stub_env:Stub-v0"]
    argv += ["--policy-type", "lstm", "--hidden-sizes", "8", "--actors", "1"]
    argv += ["--num-envs", "2", "--num-steps", "6", "--fragment-length", "4"]
    argv += ["--total-env-steps", "48", "--eval-episodes", "2", "--num-epochs", "2"]
    argv += ["--minibatch-size", "4", "--port", str(learner_port), "--run-dir", str(run_dir)]
    argv += ["--no-plot"]
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True, timeout=360)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((run_dir / "report.json").read_text())
    assert report["stop_reason"] == "budget spent"
    assert report["updates_completed"] == 4 and report["env_steps_consumed"] == 48
    assert report["episodes_completed"] >= 8  # Stub-v0 episodes are 5 steps
    rejected = {k: v for k, v in report["counters"].items() if "reject" in k and v}
    assert not rejected, rejected
    # The trained LSTM deploys (issue 29: load_policy(run).predict and export raised).
    import zmq_rl

    policy = zmq_rl.load_policy(run_dir)
    assert policy.recurrent and policy.state_size == 16
    env = policy.make_env()
    obs, _ = env.reset(seed=0)
    action, state = policy.predict(obs, episode_start=True)
    assert env.action_space.contains(action.item()) and state.shape == (16,)
    action, state = policy.predict(obs, state, episode_start=False)
    assert state.shape == (16,)
    returns, lengths = zmq_rl.evaluate_policy(
        policy, n_eval_episodes=2, return_episode_rewards=True
    )
    assert len(returns) == 2 and all(n == 5 for n in lengths)  # Stub-v0 episodes are 5 steps
    module = torch.jit.load(str(zmq_rl.export_policy(run_dir, "torchscript", tmp_path / "p.ts")))
    batch = torch.from_numpy(np.stack([obs, obs]).astype(np.float32))
    scripted, next_state = module(batch, torch.zeros(2, 16), torch.ones(2))
    expected, expected_state = policy.predict(np.stack([obs, obs]))
    assert np.array_equal(scripted.numpy(), expected)
    assert np.allclose(next_state.numpy(), expected_state, atol=1e-6)
