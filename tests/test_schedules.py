"""Schedules and loss options of the PPO update, seen from outside.

* ``anneal_lr`` / ``anneal_clip_range``: over a short real run (a learner and a
  GymActor on the stub env), every row of ``metrics.jsonl`` reports
  ``charts/learning_rate = lr * (1 - progress)`` and ``charts/clip_range = eps *
  (1 - progress)``, where ``progress`` is the share of the budget consumed *before*
  that update; without annealing both stay constant.
* ``clip_value_loss``: the clipped value loss is the pessimistic max of the plain
  and clipped errors (hand-computed), has no gradient through the clipped branch,
  and in a real PPO update keeps the value function near the behaviour values
  where the unclipped loss lets it run to the returns.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
import zmq

from tests.helpers import stub_learner_config
from tests.stub_env import StubEnv
from zmq_rl.actor.gym_actor import GymActor
from zmq_rl.config import ActorConfig, PolicyConfig, PPOConfig
from zmq_rl.learner.loop import Learner
from zmq_rl.rl.policy import build_policy
from zmq_rl.rl.ppo import PPOTrainer, RolloutBatch, ppo_loss

TIMEOUT = 30.0
UPDATES = 5
ROWS = 8 * 2  # num_steps * slots


def run_and_read_metrics(port: int, run_dir: Path, ppo: PPOConfig) -> list[dict[str, Any]]:
    """A real run of UPDATES updates; the rows of its metrics.jsonl."""
    cfg = stub_learner_config(
        port,
        num_envs=2,
        fragment_length=4,
        total_env_steps=ROWS * UPDATES,
        run_dir=str(run_dir),
    )
    ctx = zmq.Context()
    learner = Learner(cfg, ppo, PolicyConfig(hidden_sizes=(8,)), context=ctx)
    errors: list[BaseException] = []

    def act() -> None:
        try:
            GymActor(
                ActorConfig(learner=f"127.0.0.1:{port}", register_timeout=TIMEOUT), context=ctx
            ).run()
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    actor = threading.Thread(target=act, name="actor", daemon=True)
    actor.start()
    try:
        report = learner.run()
    finally:
        learner.close()
        actor.join(TIMEOUT)
        ctx.destroy(linger=0)
    assert not actor.is_alive() and not errors, errors
    assert report.updates_completed == UPDATES
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "eval/mean_return" not in r]  # the update rows
    assert [r["update"] for r in rows] == list(range(1, UPDATES + 1))
    return rows


@pytest.mark.parametrize("anneal", [True, False], ids=["annealed", "constant"])
def test_lr_and_clip_range_follow_progress_in_the_metrics(tmp_path, learner_port, anneal) -> None:
    ppo = PPOConfig(
        learning_rate=1e-3,
        clip_range=0.2,
        anneal_lr=anneal,
        anneal_clip_range=anneal,
        num_epochs=1,
        minibatch_size=16,
    )
    rows = run_and_read_metrics(learner_port, tmp_path, ppo)
    for k, row in enumerate(rows):
        progress = k * ROWS / (ROWS * UPDATES)  # steps consumed before update k + 1
        assert row["env_steps"] == (k + 1) * ROWS
        frac = 1.0 - progress if anneal else 1.0
        assert row["charts/learning_rate"] == pytest.approx(1e-3 * frac, rel=1e-12)
        assert row["charts/clip_range"] == pytest.approx(0.2 * frac, rel=1e-12)
    lrs = [r["charts/learning_rate"] for r in rows]
    if anneal:
        # Linear: equal decrements of lr / UPDATES, ending one step above zero.
        steps = [a - b for a, b in zip(lrs, lrs[1:], strict=False)]
        assert steps == pytest.approx([1e-3 / UPDATES] * (UPDATES - 1), rel=1e-9)
        assert lrs[-1] == pytest.approx(1e-3 / UPDATES)
    else:
        assert len(set(lrs)) == 1


def loss_of(value, old_value, returns, clip_value_loss: bool):
    value = torch.tensor(value, requires_grad=True)
    zeros = torch.zeros(len(value))
    loss = ppo_loss(
        zeros,
        zeros,
        zeros,
        value,
        torch.tensor(old_value),
        torch.tensor(returns),
        zeros,
        clip_range=0.2,
        clip_value_loss=clip_value_loss,
        value_clip_range=0.2,
        vf_coef=0.5,
        ent_coef=0.0,
    )
    loss.value_loss.backward()
    return float(loss.value_loss.detach()), value.grad.tolist()


def test_value_loss_clipping_by_hand() -> None:
    # V moved from 0 to 2 towards a return of 3: plain error (2 - 3)^2 = 1, but the
    # clipped prediction 0 + clip(2, -0.2, 0.2) = 0.2 errs by 2.8^2 = 7.84, and the
    # max of the two is taken. The second element moved less than the clip range.
    plain, plain_grad = loss_of([2.0, 0.1], [0.0, 0.0], [3.0, 1.0], clip_value_loss=False)
    clipped, clipped_grad = loss_of([2.0, 0.1], [0.0, 0.0], [3.0, 1.0], clip_value_loss=True)
    assert plain == pytest.approx(0.5 * (1.0 + 0.81) / 2)
    assert clipped == pytest.approx(0.5 * (7.84 + 0.81) / 2)
    assert plain_grad[0] == pytest.approx((2.0 - 3.0) / 2)
    assert clipped_grad[0] == 0.0  # the clipped branch is constant in V
    # Moving away from the return: the plain error is already the larger one.
    plain, _ = loss_of([-1.0], [0.0], [3.0], clip_value_loss=False)
    clipped, _ = loss_of([-1.0], [0.0], [3.0], clip_value_loss=True)
    assert plain == clipped == pytest.approx(0.5 * 16.0)
    # Within the clip range the two losses agree.
    assert loss_of([0.1], [0.0], [1.0], False)[0] == loss_of([0.1], [0.0], [1.0], True)[0]


def value_shift_after_update(clip: bool) -> tuple[float, float]:
    """Mean move of V over one PPO update towards returns 10 above the behaviour
    values, and the update's mean value loss."""
    torch.manual_seed(0)
    policy = build_policy(
        StubEnv.observation_space, StubEnv.action_space, PolicyConfig(hidden_sizes=(16,))
    )
    obs = torch.rand(64, 2)
    actions = torch.randint(0, 2, (64,))
    with torch.no_grad():
        log_probs, _, values = policy.evaluate_actions(obs, actions)
    batch = RolloutBatch(
        obs=obs,
        actions=actions,
        old_log_probs=log_probs,
        old_values=values,
        advantages=torch.zeros(64),
        returns=values + 10.0,
    )
    cfg = PPOConfig(
        learning_rate=1e-2,
        anneal_lr=False,
        num_epochs=30,
        minibatch_size=64,
        clip_range=0.2,
        clip_value_loss=clip,
    )
    metrics = PPOTrainer(policy, cfg, seed=0).update(batch)
    with torch.no_grad():
        moved = (policy.value(obs) - values).mean().item()
    return moved, metrics["losses/value_loss"]


def test_value_clipping_in_a_ppo_update() -> None:
    """The plain loss drags V towards the returns; the clipped loss stops pulling once
    V has moved by the clip range (what remains is Adam's momentum)."""
    plain_move, plain_loss = value_shift_after_update(clip=False)
    clipped_move, clipped_loss = value_shift_after_update(clip=True)
    assert plain_move > 3.0, plain_move
    assert 0.2 <= clipped_move < 0.4 * plain_move, (clipped_move, plain_move)
    assert clipped_loss > plain_loss  # the pessimistic max keeps the error large
