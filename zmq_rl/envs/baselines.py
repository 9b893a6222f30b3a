"""Scripted players of turn-based games, for evaluation against fixed opponents.

A *player* is a callable ``(observation of the agent to move, rng) -> action``: the
learner's evaluations play one against the policy (``--eval-opponent``, see
:func:`zmq_rl.learner.evaluation.evaluate_policy`), and ``bench/connect_four.py``
plays them in its matchups. No RL and no sockets here: numpy on observations.

Connect four (``pettingzoo.classic.connect_four_v3``): :func:`one_ply_move` wins if it
can, else blocks the opponent's immediate win, else plays a random legal column,
all from the observation (the ``[6, 7, 2]`` board of the player to move and its
opponent, and the ``action_mask``); :func:`random_move` plays any legal column.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "COLS",
    "MOVER",
    "OPPONENT",
    "ROWS",
    "landing_row",
    "legal_moves",
    "one_ply_move",
    "random_move",
    "winning_moves",
]

ROWS, COLS = 6, 7  # row 0 is the top of the board; pieces fall to the highest free row index
MOVER, OPPONENT = 0, 1  # the observation's planes: the player to move's pieces, the other's


def landing_row(planes: np.ndarray, col: int) -> int | None:
    """The row a piece dropped in ``col`` lands on (the lowest free cell: the highest
    row index, row 0 being the top), or None when the column is full. ``planes`` is
    the observation's ``[6, 7, 2]`` board."""
    occupied = planes[:, col, 0].astype(bool) | planes[:, col, 1].astype(bool)
    free = np.flatnonzero(~occupied)
    return int(free[-1]) if free.size else None


def _completes_four(plane: np.ndarray, row: int, col: int) -> bool:
    """Whether ``plane`` (one player's ``[6, 7]`` pieces, with a piece at ``(row, col)``)
    has four in a row through that cell: horizontally, vertically or on a diagonal."""
    for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
        count = 1
        for sign in (1, -1):
            r, c = row + sign * dr, col + sign * dc
            while 0 <= r < ROWS and 0 <= c < COLS and plane[r, c]:
                count += 1
                r, c = r + sign * dr, c + sign * dc
        if count >= 4:
            return True
    return False


def winning_moves(planes: np.ndarray, player_plane: int) -> list[int]:
    """The columns where dropping a piece of ``player_plane`` (0: the player to move,
    1: its opponent) completes four in a row for that player, in column order.

    This is what the one-ply player looks for, for itself (to win) and for the
    opponent (to block); full columns are never listed."""
    planes = np.asarray(planes)
    moves = []
    for col in range(COLS):
        row = landing_row(planes, col)
        if row is None:
            continue
        plane = planes[:, :, player_plane].astype(bool)
        plane[row, col] = True
        if _completes_four(plane, row, col):
            moves.append(col)
    return moves


def legal_moves(obs: dict[str, np.ndarray]) -> list[int]:
    """The columns the observation's ``action_mask`` allows."""
    return [int(c) for c in np.flatnonzero(np.asarray(obs["action_mask"]))]


def random_move(obs: dict[str, np.ndarray], rng: np.random.Generator) -> int:
    """A uniformly random legal column: the weakest baseline."""
    return int(rng.choice(legal_moves(obs)))


def one_ply_move(obs: dict[str, np.ndarray], rng: np.random.Generator) -> int:
    """The one-ply lookahead player: a winning column if there is one, else one that
    blocks the opponent's immediate win, else a uniformly random legal column (ties
    broken at random). A policy that only learned not to lose at once to random
    play beats it far less often than it beats random."""
    legal = legal_moves(obs)
    for plane in (MOVER, OPPONENT):
        moves = [c for c in winning_moves(obs["observation"], plane) if c in legal]
        if moves:
            return int(rng.choice(moves))
    return int(rng.choice(legal))
