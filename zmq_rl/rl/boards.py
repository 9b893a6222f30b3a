"""Networks for board games: ``--factory zmq_rl.rl.boards:board_cnn``.

PettingZoo's classic games (connect four, tic-tac-toe, go, chess) observe a board as
``[H, W, C]`` planes beside an ``action_mask``. Flattened into an MLP, a threat (three
of one colour and a free cell in a line) must be learned anew at every place on the
board; one layer of convolutions over every 4 x 4 window sees it wherever it is.
"""

from __future__ import annotations

import gymnasium

from zmq_rl.config import PolicyConfig
from zmq_rl.rl.networks import StructuredActorCritic, is_board_space, leaf_paths

__all__ = ["board_cnn", "gravity_board_cnn"]


def board_cnn(
    observation_space: gymnasium.Space, action_space: gymnasium.Space, cfg: PolicyConfig
) -> StructuredActorCritic:
    """The ``--factory zmq_rl.rl.boards:board_cnn`` entry point: the built-in
    structured actor-critic (so ``action_mask`` entries, Dict observations and every
    action space work as with the MLP) whose board parts -- ``[H, W, C]`` Box planes
    with fewer channels than either side, e.g. connect four's ``(6, 7, 2)`` -- go
    through one layer of 64 convolutions over every 4 x 4 window (no padding: every
    line of four cells lies in one window; smaller boards get windows as large as
    the board) instead of being flattened; the MLP trunks of ``cfg.hidden_sizes``
    follow. A space without a board part is refused by name."""
    _require_board(observation_space, "board_cnn")
    return StructuredActorCritic(observation_space, action_space, cfg, boards=True)


def gravity_board_cnn(
    observation_space: gymnasium.Space, action_space: gymnasium.Space, cfg: PolicyConfig
) -> StructuredActorCritic:
    """``--factory zmq_rl.rl.boards:gravity_board_cnn``: :func:`board_cnn` for drop games
    such as connect four, whose convolutions also see a plane of the cells a piece can
    land on (:func:`zmq_rl.rl.networks.landing_cells`, computed from the board in the
    forward pass). Three in a line and a free cell is a threat only when that cell is
    playable, which depends on the cell below it: for a diagonal whose free cell is its
    lowest, no 4 x 4 window holds both; for other lines the trunk has to combine two
    windows' features."""
    _require_board(observation_space, "gravity_board_cnn")
    return StructuredActorCritic(observation_space, action_space, cfg, boards="gravity")


def _require_board(observation_space: gymnasium.Space, name: str) -> None:
    if not any(is_board_space(leaf) for _, leaf in leaf_paths(observation_space)):
        raise ValueError(
            f"zmq_rl.rl.boards:{name} needs a board in the observation: a Box of shape "
            f"(H, W, C) with fewer channels than either side, got {observation_space!r}"
        )
