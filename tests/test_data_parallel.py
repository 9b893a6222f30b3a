"""Data-parallel PPO (:mod:`zmq_rl.rl.distributed`): two gloo ranks in real processes
take the step one learner would take on the union of their batches, identically."""

from __future__ import annotations

import multiprocessing
import os
import queue
from typing import Any

import numpy as np
import pytest
import torch

from tests.ports import free_port_block
from tests.test_ppo import config, make_batch, make_policy
from zmq_rl.config import ConfigError, LearnerConfig
from zmq_rl.rl.distributed import Collective, DataParallel, RankSpec, parameter_digest, rank_spec
from zmq_rl.rl.ppo import PPOTrainer, RolloutBatch

WORLD = 2
ROWS = 64

# name -> (PPOConfig changes, which rows each rank holds: None = no rows)
CASES: dict[str, tuple[dict[str, Any], list[tuple[int, int] | None]]] = {
    # One minibatch, no advantage normalisation: exactly one learner's step on the union.
    "union": (
        dict(num_epochs=1, minibatch_size=ROWS, normalize_advantages=False),
        [(0, 40), (40, 64)],
    ),
    # A rank without rows still takes the common steps; the step is rank 0's rows'.
    "one_rank_empty": (
        dict(num_epochs=2, minibatch_size=ROWS, normalize_advantages=False),
        [(0, 32), None],
    ),
    # Many minibatches, normalisation, uneven halves: the ranks stay identical.
    "minibatches": (dict(num_epochs=3, minibatch_size=16), [(0, 40), (40, 64)]),
    # target_kl stops every rank at the same step.
    "target_kl": (dict(num_epochs=8, minibatch_size=8, target_kl=0.002), [(0, 32), (32, 64)]),
}


def _slice(batch: RolloutBatch, rows: tuple[int, int] | None) -> RolloutBatch | None:
    if rows is None:
        return None
    a, b = rows
    return RolloutBatch(
        batch.obs[a:b],
        batch.actions[a:b],
        batch.old_log_probs[a:b],
        batch.old_values[a:b],
        batch.advantages[a:b],
        batch.returns[a:b],
    )


def _rank_main(rank: int, init: str, out: Any) -> None:
    """One rank: every case's update; puts (rank, {case: (params, epochs_run, digest)})."""
    torch.set_num_threads(1)
    collective = Collective(RankSpec(rank, WORLD, init))
    results = {}
    try:
        for name, (changes, rows) in CASES.items():
            policy = make_policy()
            batch = make_batch(policy, n=ROWS)
            trainer = PPOTrainer(policy, config(**changes), seed=rank)
            trainer.sync = DataParallel(collective)
            metrics = trainer.update(_slice(batch, rows[rank]))
            params = [p.detach().numpy().copy() for p in policy.parameters()]
            results[name] = (params, metrics["losses/epochs_run"], parameter_digest(policy))
    finally:
        collective.close()
    out.put((rank, results))


@pytest.fixture(scope="module")
def ranks() -> dict[int, dict[str, Any]]:
    """Every case run by two gloo ranks (spawned processes), by rank."""
    port = free_port_block(1)
    init = f"tcp://127.0.0.1:{port}"
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(r, init, out), daemon=True) for r in range(WORLD)]
    for proc in procs:
        proc.start()
    found = {}
    try:
        for _ in range(WORLD):
            rank, results = out.get(timeout=120)
            found[rank] = results
    except queue.Empty:
        pytest.fail(f"the ranks reported {sorted(found)} within 120 s")
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    return found


def _single(changes: dict[str, Any], rows: tuple[int, int]) -> list[np.ndarray]:
    policy = make_policy()
    batch = make_batch(policy, n=ROWS)
    PPOTrainer(policy, config(**changes), seed=0).update(_slice(batch, rows))
    return [p.detach().numpy() for p in policy.parameters()]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("case", list(CASES))
def test_every_rank_holds_identical_parameters(ranks, case):
    params0, epochs0, digest0 = ranks[0][case]
    params1, epochs1, digest1 = ranks[1][case]
    assert digest0 == digest1
    for a, b in zip(params0, params1, strict=True):
        np.testing.assert_array_equal(a, b)
    assert epochs0 == epochs1
    # ...and they moved: a sync that dropped every gradient would also be "equal".
    start = [p.detach().numpy() for p in make_policy().parameters()]
    assert any(not np.allclose(a, s) for a, s in zip(params0, start, strict=True))


@pytest.mark.timeout(180)
def test_two_ranks_take_the_step_one_learner_takes_on_the_union(ranks):
    changes, _ = CASES["union"]
    expected = _single(changes, (0, ROWS))
    for got, want in zip(ranks[0]["union"][0], expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.timeout(180)
def test_a_rank_without_rows_adds_nothing_to_the_step(ranks):
    changes, rows = CASES["one_rank_empty"]
    expected = _single(changes, rows[0])
    for got, want in zip(ranks[1]["one_rank_empty"][0], expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.timeout(180)
def test_target_kl_stops_both_ranks_early(ranks):
    assert ranks[0]["target_kl"][1] < CASES["target_kl"][0]["num_epochs"]


def test_num_learners_is_validated_by_name():
    with pytest.raises(ConfigError, match="num_learners"):
        LearnerConfig(num_learners=0).validate()


def test_ports_of_the_ranks_follow_the_control_port():
    cfg = LearnerConfig(port=7000, num_learners=3)
    assert (cfg.port, cfg.experience_port(0), cfg.weights_port()) == (7000, 7001, 7002)
    assert [cfg.experience_port(r) for r in (1, 2)] == [7003, 7004]
    assert cfg.rendezvous_port() == 7005


def test_rank_spec_from_torchrun_environment(monkeypatch):
    for key in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    assert rank_spec(1, "127.0.0.1", 7005) is None
    spec = rank_spec(2, "0.0.0.0", 7004)
    assert (spec.rank, spec.world_size, spec.init_method) == (0, 2, "tcp://127.0.0.1:7004")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    spec = rank_spec(2, "127.0.0.1", 7004)
    assert (spec.rank, spec.world_size, spec.init_method) == (1, 2, "env://")
    with pytest.raises(ValueError, match="WORLD_SIZE=2"):
        rank_spec(3, "127.0.0.1", 7004)
    assert os.environ["RANK"] == "1"


def test_learner_help_lists_num_learners_and_how_ranks_meet(capsys):
    from zmq_rl.cli import learner as learner_cli

    with pytest.raises(SystemExit):
        learner_cli.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--num-learners N" in text and "--device" in text
    assert "PORT + 2 + r" in text and "torchrun" in text
