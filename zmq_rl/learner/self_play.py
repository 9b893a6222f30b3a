"""The run's table of self-play snapshots: every snapshot the actors played the
policy against, with the games' results and an Elo gap (no sockets).

Each actor reports its games against each snapshot in its bye
(``self_play/vs/<version>/wins|draws|losses``, :meth:`zmq_rl.actor.opponents.OpponentPool.stats`);
:func:`self_play_table` adds them over the actors. The *Elo gap* of a snapshot is
how many Elo points the training policy played above it, from its score ``s`` over
those games (a win 1, a draw 1/2; smoothed ``(wins + draws/2 + 1/2) / (games + 1)``
so that a clean sweep is finite): ``400 log10(s / (1 - s))`` (the logistic Elo
model, Elo 1978). The policy kept learning while it played them, so a gap measures
the policy *over the games it played* against that snapshot, not a fixed rating:
an old snapshot's large gap says the policy kept beating it, a recent snapshot's
small gap that it is about as strong.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["elo_ratings", "self_play_table", "write_self_play_csv"]

_KEY = re.compile(r"(?:actor/)?self_play/vs/(\d+)/(wins|draws|losses)")
COLUMNS = ("version", "games", "wins", "draws", "losses", "score", "elo_gap")


def self_play_table(actor_stats: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per snapshot version (ascending): games, wins, draws, losses (of the
    policy's seat), its score and Elo gap (module docstring), summed over every
    actor's stats (``report.json``'s ``actor_stats``). Empty without self-play."""
    totals: dict[int, dict[str, float]] = {}
    for stats in actor_stats.values():
        for key, value in stats.items():
            match = _KEY.fullmatch(key)
            # (a count that is negative or not whole is ignored: docs/protocol.md 4.8)
            if match and float(value) >= 0 and float(value).is_integer():
                row = totals.setdefault(int(match[1]), dict.fromkeys(COLUMNS[2:5], 0.0))
                row[match[2]] += float(value)
    table = []
    for version in sorted(totals):
        wins, draws, losses = (int(totals[version][k]) for k in COLUMNS[2:5])
        games = wins + draws + losses
        if not games:
            continue
        score = (wins + draws / 2 + 0.5) / (games + 1)
        table.append(
            {
                "version": version,
                "games": games,
                "wins": wins,
                "draws": draws,
                "losses": losses,
                "score": round((wins + draws / 2) / games, 4),
                "elo_gap": round(400 * math.log10(score / (1 - score)), 1),
            }
        )
    return table


def write_self_play_csv(path: Path, table: list[dict[str, Any]]) -> None:
    """Write ``table`` (:func:`self_play_table`) as CSV with a header row."""
    with path.open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(table)


def elo_ratings(points: np.ndarray, games: np.ndarray, iterations: int = 2000) -> np.ndarray:
    """Elo ratings of players who met in ``games[i, j]`` games in which ``i`` scored
    ``points[i, j]`` (a win 1, a draw 1/2), fitted by maximum likelihood of the
    Bradley-Terry model (P(i beats j) = g_i / (g_i + g_j)) with Hunter's (2004) MM
    iterations, on the Elo scale (400 log10 g), the first player at 0. Every pair
    that met gets half a game of prior each way, so a clean sweep stays finite."""
    games = np.asarray(games, np.float64) + 1.0 * (np.asarray(games) > 0)
    points = np.asarray(points, np.float64) + 0.5 * (np.asarray(games) > 0)
    wins = points.sum(axis=1)
    gamma = np.ones(len(games))
    for _ in range(iterations):
        denominators = (games / (gamma[:, None] + gamma[None, :])).sum(axis=1)
        new = np.where(denominators > 0, wins / np.maximum(denominators, 1e-300), gamma)
        new /= np.exp(np.mean(np.log(new)))
        if np.allclose(new, gamma, rtol=1e-10, atol=0):
            break
        gamma = new
    elo = 400.0 * np.log10(gamma)
    return elo - elo[0]
