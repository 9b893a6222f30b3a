"""Networks for board games: ``--factory zmq_rl.rl.boards:board_cnn``.

PettingZoo's classic games (connect four, tic-tac-toe, go, chess) observe a board as
``[H, W, C]`` planes beside an ``action_mask``. Flattened into an MLP, a threat (three
of one colour and a free cell in a line) must be learned anew at every place on the
board; one layer of convolutions over every 4 x 4 window sees it wherever it is
(:func:`board_cnn`, :func:`gravity_board_cnn`). In a drop game (connect four) a move
is the choice of a landing cell: :func:`drop_game_cnn` judges every column by the
cells around its landing cell with one set of weights.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import torch
from torch.nn import functional as F

from zmq_rl.config import PolicyConfig
from zmq_rl.rl.layers import layer, trunk
from zmq_rl.rl.networks import (
    ActionHeads,
    BoardPart,
    FeedForwardActorCritic,
    StructuredActorCritic,
    landing_cells,
    value_at,
)
from zmq_rl.rl.numpy_nets import check_board_spaces, check_drop_game_spaces

__all__ = ["DropGameCNN", "board_cnn", "drop_game_cnn", "gravity_board_cnn"]


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
    check_board_spaces(observation_space, "board_cnn")
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
    check_board_spaces(observation_space, "gravity_board_cnn")
    return StructuredActorCritic(observation_space, action_space, cfg, boards="gravity")


def drop_game_cnn(
    observation_space: gymnasium.Space, action_space: gymnasium.Space, cfg: PolicyConfig
) -> DropGameCNN:
    """``--factory zmq_rl.rl.boards:drop_game_cnn``: :class:`DropGameCNN`, each column
    judged by one MLP over the 7 x 7 cells around its landing cell, for drop games such
    as connect four (one board, an optional ``action_mask``, one discrete action per
    column; anything else is refused by name)."""
    return DropGameCNN(observation_space, action_space, cfg)


class DropGameCNN(FeedForwardActorCritic):
    """An actor-critic for drop games (connect four) whose policy judges each column
    by the cell a piece dropped there lands on.

    Column ``c``'s logit is an MLP of ``cfg.hidden_sizes`` (the same weights for every
    column) over the 7 x 7 cells around its landing cell: the board's planes,
    :func:`~zmq_rl.rl.networks.landing_cells` and a plane of ones (so the zero padding
    marks the edge). The value is :func:`board_cnn`'s with the landing plane
    (:func:`gravity_board_cnn`): 4 x 4 window convolutions, flattened, and an MLP.

    Why: a move in a drop game is the choice of a landing cell, and whether it wins,
    blocks or hands the opponent the cell above is decided by the lines through that
    cell, which all lie within three cells of it. Judging every landing cell with one
    set of weights (a convolution evaluated where the moves are) learns a pattern once
    for the whole board, where :func:`board_cnn`'s flattened windows learn each
    (pattern, place, column) triple separately.
    """

    reach = 3
    """Cells on each side of the landing cell that its column's logit sees."""

    def __init__(
        self,
        observation_space: gymnasium.Space,
        action_space: gymnasium.Space,
        cfg: PolicyConfig,
    ) -> None:
        super().__init__()
        cfg.validate()
        self.board_path, board, self.mask_key = check_drop_game_spaces(
            observation_space, action_space
        )
        width, channels = int(board.shape[1]), int(board.shape[2])
        self.heads = ActionHeads(action_space, cfg)
        side = 2 * self.reach + 1
        height = int(board.shape[0])
        # patch_index[cell] = the cells of the padded board around ``cell``, flat.
        rows = torch.arange(height).repeat_interleave(width)
        cols = torch.arange(width).repeat(height)
        d = torch.arange(side)
        grid = (rows[:, None, None] + d[None, :, None]) * (width + 2 * self.reach) + (
            cols[:, None, None] + d[None, None, :]
        )
        self.register_buffer("patch_index", grid.reshape(height * width, -1), persistent=False)
        self.register_buffer("columns", torch.arange(width), persistent=False)
        self.actor_trunk = trunk((channels + 2) * side * side, cfg)
        self.policy_head = layer(cfg.hidden_sizes[-1], 1, 0.01, cfg.ortho_init)
        self.critic_board = BoardPart(board, cfg.ortho_init, gravity=True)
        self.critic_trunk = trunk(self.critic_board.out_features, cfg)
        self.value_head = layer(cfg.hidden_sizes[-1], 1, 1.0, cfg.ortho_init)

    def forward(self, obs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """(column logits ``[N, W]``, value ``[N]``)."""
        dtype = self.value_head.weight.dtype
        board = value_at(obs, self.board_path)
        planes = board.to(dtype).permute(0, 3, 1, 2)  # [N, C, H, W]
        landing = landing_cells(planes)
        x = torch.cat([planes, landing, torch.ones_like(landing)], dim=1)
        # The landing row of each column: its free cells fill it from the top.
        free = (planes.sum(dim=1) == 0).sum(dim=1)  # [N, W]
        row = (free - 1).clamp(min=0)  # a full column's logit is masked anyway
        cell = row * planes.shape[3] + self.columns  # [N, W], in H * W
        padded = F.pad(x, (self.reach,) * 4).flatten(2)  # [N, C + 2, (H + 2r) * (W + 2r)]
        n, channels, _ = padded.shape
        index = self.patch_index[cell].reshape(n, 1, -1).expand(-1, channels, -1)
        patches = padded.gather(2, index).reshape(n, channels, cell.shape[1], -1)
        features = patches.transpose(1, 2).flatten(2)  # [N, W, (C + 2) * side^2]
        logits = self.policy_head(self.actor_trunk(features)).squeeze(-1)
        return logits, self._value(board, dtype)

    def value(self, obs: Any) -> torch.Tensor:
        """State values ``V(obs)``, ``[N]``, without the columns' logits."""
        board = value_at(obs, self.board_path)
        return self._value(board, self.value_head.weight.dtype)

    def _value(self, board: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return self.value_head(self.critic_trunk(self.critic_board(board, dtype))).squeeze(-1)
