"""The cost of one PPO minibatch step of each connect-four network, on one torch thread.

``board_cnn``, ``gravity_board_cnn`` and ``drop_game_cnn`` (``zmq_rl.rl.boards``) at the
benchmark's ``--hidden-sizes 128,128``: ``evaluate_actions`` on a minibatch of random
boards, the backward pass and an Adam step, interleaved round by round; the median
milliseconds per step and each network's ratio to ``board_cnn`` (docs/benchmarks.md §24).

    python bench/board_step_cost.py
    python bench/board_step_cost.py --minibatch 1024 --rounds 9
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

FACTORIES = ("board_cnn", "gravity_board_cnn", "drop_game_cnn")


def step_seconds(net: Any, obs: dict, actions: Any, optimiser: Any, steps: int) -> float:
    """Seconds per minibatch step (forward, backward, optimiser) over ``steps`` steps."""
    start = time.perf_counter()
    for _ in range(steps):
        log_prob, entropy, value = net.evaluate_actions(obs, actions)
        (value.square().mean() - log_prob.mean() - 0.01 * entropy.mean()).backward()
        optimiser.step()
        optimiser.zero_grad(set_to_none=True)
    return (time.perf_counter() - start) / steps


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minibatch", type=int, default=256, help="rows per step")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds per network")
    parser.add_argument("--steps", type=int, default=20, help="steps per round")
    parser.add_argument("--out", default="", help="also write the medians here as JSON")
    parser.add_argument(
        "--port", type=int, default=0, help="accepted for a uniform interface: binds no port"
    )
    args = parser.parse_args(argv)

    import gymnasium as gym
    import numpy as np
    import torch

    from zmq_rl.config import PolicyConfig
    from zmq_rl.rl import boards

    torch.set_num_threads(1)
    torch.manual_seed(0)
    board = gym.spaces.Box(0, 1, (6, 7, 2), np.int8)
    mask = gym.spaces.Box(0, 1, (7,), np.int8)
    space = gym.spaces.Dict({"action_mask": mask, "observation": board})
    rng = np.random.default_rng(0)
    n = args.minibatch
    obs = {
        "action_mask": torch.ones(n, 7, dtype=torch.int8),
        "observation": torch.from_numpy(rng.integers(0, 2, (n, 6, 7, 2)).astype(np.int8)),
    }
    actions = torch.from_numpy(rng.integers(0, 7, n))
    nets = {}
    for name in FACTORIES:
        net = getattr(boards, name)(
            space, gym.spaces.Discrete(7), PolicyConfig(hidden_sizes=(128, 128))
        )
        nets[name] = (net, torch.optim.Adam(net.parameters(), lr=3e-4))
        step_seconds(net, obs, actions, nets[name][1], 3)  # warm-up
    times: dict[str, list[float]] = {name: [] for name in FACTORIES}
    for _ in range(args.rounds):
        for name, (net, optimiser) in nets.items():
            times[name].append(step_seconds(net, obs, actions, optimiser, args.steps))
    medians = {name: 1e3 * statistics.median(t) for name, t in times.items()}
    print(f"{n}-row minibatch step, one torch thread, median of {args.rounds} rounds:")
    for name, ms in medians.items():
        print(f"  {name:<18} {ms:7.2f} ms  ({ms / medians['board_cnn']:.2f} x board_cnn)")
    if args.out:
        import json
        from pathlib import Path

        Path(args.out).write_text(json.dumps({"minibatch": n, "median_ms": medians}) + "\n")
    return medians


if __name__ == "__main__":
    main()
