"""``zmq-rl ladder RUN_DIR``: a round-robin Elo ladder of a turn-based run's snapshots.

The players are up to ``points`` checkpoints of the run (``checkpoints/ckpt-N.pt``,
evenly spaced over those kept: the learner keeps its newest three, so keep copies
along a long run and name their folder) and its final ``policy.pt``, one per policy
version. Every pair plays
``games`` games, seats alternating, with moves *sampled* from each policy (seeded:
two deterministic policies would replay one game per seating); the points (a win
1, a draw 1/2, from the game's +1 / 0 / −1 payoff to a seat, as PettingZoo's classic
games pay) are fitted to Elo ratings by :func:`zmq_rl.learner.self_play.elo_ratings`,
the earliest player at 0. The table is printed and written to ``RUN_DIR/ladder.csv``.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Any

import numpy as np

from ..run.common import CliFailure

__all__ = ["ladder", "write_ladder_csv"]

COLUMNS = ("player", "version", "elo", "score", "games")


def _players(run_dir: Path, points: int, folder: Path | None = None) -> list[Path]:
    """Up to ``points`` checkpoints of ``folder`` (default ``run_dir/checkpoints``),
    evenly spaced (oldest first), then policy.pt."""
    kept = sorted(
        (folder or run_dir / "checkpoints").glob("ckpt-*.pt"),
        key=lambda p: int(re.sub(r"\D", "", p.stem) or 0),
    )
    if len(kept) > points:
        kept = [kept[int(i)] for i in np.linspace(0, len(kept) - 1, points).round()]
    final = run_dir / "policy.pt"
    players = [*dict.fromkeys(kept), *([final] if final.is_file() else [])]
    if len(players) < 2:
        raise CliFailure(
            f"{run_dir}: a ladder needs two snapshots or more (checkpoints/ckpt-*.pt and "
            f"policy.pt); found {len(players)}"
        )
    return players


def ladder(
    run_dir: str | Path,
    games: int = 20,
    points: int = 6,
    seed: int = 0,
    checkpoints: str | Path | None = None,
) -> list[dict]:
    """The ladder's rows (module docstring), weakest to strongest by Elo;
    ``checkpoints``: a folder of kept checkpoints instead of the run's own (the
    learner keeps its newest three)."""
    from ..envs import env_shape
    from ..learner.evaluation import evaluate_policy
    from ..learner.self_play import elo_ratings
    from ..serving.deploy import PolicyFileError, load_policy

    run_dir = Path(run_dir)
    paths = _players(run_dir, points, None if checkpoints is None else Path(checkpoints))
    try:
        loaded = [load_policy(path) for path in paths]
    except PolicyFileError as exc:
        raise CliFailure(str(exc)) from None
    # The final checkpoint is often policy.pt's version: one player per version.
    by_version = {q.version: (p, q) for p, q in zip(paths, loaded, strict=True)}
    paths, loaded = [p for p, _ in by_version.values()], [q for _, q in by_version.values()]
    if len(loaded) < 2:
        raise CliFailure(f"{run_dir}: its snapshots are all version {loaded[0].version}")
    first = loaded[0]
    if not env_shape(first.env_id, first.env_kwargs, first.wrappers).turn_based:
        raise CliFailure(f"{first.env_id} is not a turn-based game: no ladder to play")
    n = len(loaded)
    won, met = np.zeros((n, n)), np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            mean, _ = evaluate_policy(
                loaded[i].network, first.env_id, games, seed + 1000 * i + j, first.env_kwargs,
                first.wrappers, deterministic=False, opponent=loaded[j].network,
            )  # fmt: skip
            won[i, j] = games * (mean + 1.0) / 2.0
            won[j, i] = games - won[i, j]
            met[i, j] = met[j, i] = games
    elo = elo_ratings(won, met)
    rows = [
        {
            "player": str(path.relative_to(run_dir) if path.is_relative_to(run_dir) else path),
            "version": policy.version,
            "elo": round(float(elo[k]), 1),
            "score": round(float(won[k].sum() / met[k].sum()), 3),
            "games": int(met[k].sum()),
        }
        for k, (path, policy) in enumerate(zip(paths, loaded, strict=True))
    ]
    return sorted(rows, key=lambda row: row["elo"])


def write_ladder_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write the ladder's rows as CSV with a header row."""
    with path.open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
