"""Golden figures of ``PPOTrainer.update`` as it was before the sync-free rewrite
(commit c59f877), so that the rewrite is tested against the update it replaced.

``python -m tests.ppo_golden --write`` (run on the old code) wrote
``tests/fixtures/ppo_update_golden.npz``; ``tests/test_ppo.py`` recomputes every case
with today's code and compares parameters and metrics within float tolerance.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from pathlib import Path

import numpy as np
import torch
from gymnasium import spaces

from zmq_rl.config import PolicyConfig, PPOConfig
from zmq_rl.rl.policy import build_policy
from zmq_rl.rl.ppo import PPOTrainer, RolloutBatch

GOLDEN = Path(__file__).parent / "fixtures" / "ppo_update_golden.npz"
DEVICE = "cpu"
"""Where the cases run (tests/test_device.py runs them on CUDA too)."""
LAST_TRAINER = None
OBS = spaces.Box(-np.inf, np.inf, (4,), np.float32)
ACTION_SPACES = {
    "discrete": spaces.Discrete(3),
    "box": spaces.Box(-1.0, 1.0, (2,), np.float32),
}
BASE = PPOConfig(learning_rate=3e-3, num_epochs=3, minibatch_size=16, anneal_lr=False)
CASES: dict[str, tuple[str, int, dict]] = {
    # name: (action space, rows, PPOConfig changes)
    "ppo-discrete": ("discrete", 64, {}),
    "ppo-box": ("box", 64, {}),
    "ppo-remainder": ("discrete", 70, {}),
    "ppo-clip-value": ("discrete", 64, {"clip_value_loss": True}),
    "ppo-raw-advantages": ("box", 48, {"normalize_advantages": False}),
    "ppo-anneal": ("discrete", 64, {"anneal_lr": True, "anneal_clip_range": True}),
    "decoupled": ("discrete", 64, {"objective": "decoupled"}),
    "impact": ("box", 64, {"objective": "impact", "impact_target_update_every": 2}),
    "target-kl": ("discrete", 64, {"target_kl": 0.001}),
    "poisoned": ("discrete", 64, {"minibatch_size": 8}),
}


def _batch(policy, n: int, seed: int, poisoned: bool) -> RolloutBatch:
    gen = torch.Generator().manual_seed(seed)
    obs = torch.randn(n, 4, generator=gen)
    with torch.no_grad():
        actions, log_probs, values = policy.act(obs, gen)
    advantages = torch.randn(n, generator=gen)
    returns = values + advantages + 0.1 * torch.randn(n, generator=gen)
    if poisoned:
        returns[:2] = 3e38  # overflows the value loss: those minibatches are skipped
    return RolloutBatch(obs, actions, log_probs, values, advantages, returns)


def run_case(name: str) -> dict[str, np.ndarray]:
    """Three updates of one case from a fixed seed: the final parameters and every
    update's metrics, as arrays keyed ``name/...``."""
    space, rows, changes = CASES[name]
    torch.manual_seed(0)
    policy = build_policy(OBS, ACTION_SPACES[space], PolicyConfig(hidden_sizes=(16, 16)))
    policy = policy.to(DEVICE)
    trainer = PPOTrainer(policy, dataclasses.replace(BASE, **changes), seed=3)
    global LAST_TRAINER
    LAST_TRAINER = trainer
    out: dict[str, np.ndarray] = {}
    for update in range(3):
        behaviour = copy.deepcopy(policy).cpu()  # the actors' copy
        batch = _batch(behaviour, rows, seed=update, poisoned=name == "poisoned")
        metrics = trainer.update(batch, progress=0.2 * update)
        keys = sorted(metrics)
        out[f"{name}/metrics{update}"] = np.array([metrics[k] for k in keys], np.float64)
    for key, value in policy.state_dict().items():
        out[f"{name}/param/{key}"] = value.detach().cpu().numpy().copy()
    return out


def compute_all() -> dict[str, np.ndarray]:
    torch.set_num_threads(1)
    results: dict[str, np.ndarray] = {}
    for name in CASES:
        results.update(run_case(name))
    return results


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        np.savez(GOLDEN, **compute_all())
        print(f"wrote {GOLDEN}")
