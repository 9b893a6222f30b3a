"""What a tic-tac-toe policy does against a one-ply player: how often it takes an
immediate win, how often it blocks the opponent's immediate win when it has none, and
its mean return (docs/benchmarks.md section 24, "Why: the positions self-play visits").

    zmq-rl run --env pettingzoo.classic.tictactoe_v3 --seed 0 --total-env-steps 1500000 \\
        --target-return inf --run-dir runs/ttt/seed0 --actors 2 --num-envs 32 \\
        --num-steps 64 --num-epochs 4 --minibatch-size 1024 --hidden-sizes 128,128 \\
        [--opening-moves 4]
    python bench/tictactoe_tactics.py runs/ttt/seed0 [--games 400]

The policy (``zmq_rl.load_policy``, deterministic) plays ``--games`` games of
``tictactoe_v3`` against the one-ply player (a winning cell if there is one, else a
cell that blocks the opponent's win, else a random free cell), seats alternating.
Results go to ``bench/results/tictactoe_tactics.json`` (``--out``), one entry per run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from connect_four import PolicyPlayer, Tactics  # noqa: E402

import zmq_rl  # noqa: E402

LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]


def completing(planes: np.ndarray, plane: int) -> list[int]:
    """The free cells (actions: ``row * 3 + col``) that complete a line of ``plane``."""
    occupied = planes.sum(-1)
    mine = planes[..., plane]
    out = []
    for action in range(9):
        row, col = divmod(action, 3)
        if occupied[row, col]:
            continue
        after = mine.copy()
        after[row, col] = 1
        cells = after.reshape(-1)
        if any(all(cells[i] for i in line) for line in LINES):
            out.append(action)
    return out


def one_ply(obs: dict[str, np.ndarray], rng: np.random.Generator) -> int:
    """Win if possible, else block, else a random free cell."""
    legal = np.flatnonzero(obs["action_mask"])
    moves = completing(obs["observation"], 0) or completing(obs["observation"], 1)
    return int(rng.choice(moves or legal))


def measure(run_dir: str, games: int, seed: int = 0) -> dict[str, float]:
    """Play ``games`` games of ``run_dir``'s policy against :func:`one_ply`."""
    from pettingzoo.classic import tictactoe_v3

    player = PolicyPlayer(zmq_rl.load_policy(run_dir))
    rng = np.random.default_rng(seed)
    env = tictactoe_v3.env()
    tactics = Tactics(completing)
    returns = []
    for game in range(games):
        env.reset(seed=seed + game)
        me = env.possible_agents[game % 2]
        for agent in env.agent_iter():
            obs, reward, terminated, truncated, _ = env.last()
            if terminated or truncated:
                if agent == me:
                    returns.append(float(reward))
                env.step(None)
                continue
            if agent != me:
                env.step(one_ply(obs, rng))
                continue
            action = player(obs, rng)
            tactics.see(obs, action)
            env.step(action)
    env.close()
    return {**tactics.counts(), "games": games, "mean_return": float(np.mean(returns))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--games", type=int, default=400)
    parser.add_argument(
        "--out", default=str(Path(__file__).parent / "results" / "tictactoe_tactics.json")
    )
    parser.add_argument(
        "--port", type=int, default=0, help="accepted for a uniform interface: binds no port"
    )
    args = parser.parse_args(argv)
    results = {}
    for run in args.runs:
        r = results[run] = measure(run, args.games)
        print(
            f"{run}: took {r['wins_taken']} of {r['wins_available']} immediate wins, blocked "
            f"{r['blocks_made']} of {r['blocks_needed']} threats, mean return "
            f"{r['mean_return']:+.3f} against one-ply ({args.games} games)"
        )
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
