"""``--factory zmq_rl.rl.boards:board_cnn``: board planes through window convolutions, the
rest of the built-in structured actor-critic unchanged (masks, heads, weights)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from zmq_rl.config import PolicyConfig
from zmq_rl.envs.baselines import landing_row
from zmq_rl.rl.boards import board_cnn, drop_game_cnn, gravity_board_cnn
from zmq_rl.rl.networks import is_board_space, landing_cells
from zmq_rl.rl.policy import export_weights, import_weights

BOARD = gym.spaces.Box(0, 1, (6, 7, 2), np.int8)
SPACE = gym.spaces.Dict({"action_mask": gym.spaces.Box(0, 1, (7,), np.int8), "observation": BOARD})
COLUMNS = gym.spaces.Discrete(7)


def _obs(n: int, seed: int = 0) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(seed)
    mask = rng.integers(0, 2, (n, 7)).astype(np.int8)
    mask[:, 3] = 1  # at least one legal column per row
    board = rng.integers(0, 2, (n, 6, 7, 2)).astype(np.int8)
    return {"action_mask": torch.from_numpy(mask), "observation": torch.from_numpy(board)}


def test_the_board_goes_through_windows_of_four_and_masks_still_hold() -> None:
    torch.manual_seed(0)
    policy = board_cnn(SPACE, COLUMNS, PolicyConfig(hidden_sizes=(32, 32)))
    conv = next(m for m in policy.modules() if isinstance(m, torch.nn.Conv2d))
    assert conv.kernel_size == (4, 4) and conv.in_channels == 2
    assert policy.encoder.out_features == 64 * 3 * 4 + 7  # the windows, then the mask
    obs = _obs(256)
    actions, log_prob, value = policy.act(obs, torch.Generator().manual_seed(1))
    allowed = obs["action_mask"].numpy().astype(bool)
    assert allowed[np.arange(256), actions.numpy()].all()  # never a masked column
    new_log_prob, entropy, new_value = policy.evaluate_actions(obs, actions)
    torch.testing.assert_close(new_log_prob, log_prob)
    torch.testing.assert_close(new_value.detach(), value)
    assert entropy.requires_grad
    # A threat moved across the board changes the features: the conv sees positions.
    a, b = _obs(1, 5), _obs(1, 5)
    a["observation"][:] = 0
    b["observation"][:] = 0
    a["observation"][0, 5, 0:3, 0] = 1  # three in the bottom row, left
    b["observation"][0, 5, 4:7, 0] = 1  # three in the bottom row, right
    with torch.no_grad():
        assert not torch.equal(policy.encoder(a), policy.encoder(b))
    # Same spaces, same network: the learner's weights load into an actor's build.
    torch.manual_seed(7)
    other = board_cnn(SPACE, COLUMNS, PolicyConfig(hidden_sizes=(32, 32)))
    import_weights(other, export_weights(policy))
    with torch.no_grad():
        assert torch.equal(other(obs)[0], policy(obs)[0])


def test_small_boards_use_windows_as_large_as_the_board() -> None:
    tic_tac_toe = gym.spaces.Box(0, 1, (3, 3, 2), np.int8)
    policy = board_cnn(tic_tac_toe, gym.spaces.Discrete(9), PolicyConfig(hidden_sizes=(16,)))
    conv = next(m for m in policy.modules() if isinstance(m, torch.nn.Conv2d))
    assert conv.kernel_size == (3, 3)
    assert policy.act(torch.zeros(4, 3, 3, 2, dtype=torch.int8))[0].shape == (4,)


def test_a_space_without_a_board_is_refused_by_name() -> None:
    assert is_board_space(BOARD)
    assert not is_board_space(gym.spaces.Box(-1, 1, (8,)))
    with pytest.raises(ValueError, match="board_cnn needs a board"):
        board_cnn(gym.spaces.Box(-1, 1, (8,)), COLUMNS, PolicyConfig())
    with pytest.raises(ValueError, match="gravity_board_cnn needs a board"):
        gravity_board_cnn(gym.spaces.Box(-1, 1, (8,)), COLUMNS, PolicyConfig())


def _stacked_boards(n: int, seed: int) -> np.ndarray:
    """``n`` boards ``[6, 7, 2]`` whose columns are filled from the bottom to random
    heights (some full), as gravity leaves them."""
    rng = np.random.default_rng(seed)
    boards = np.zeros((n, 6, 7, 2), np.int8)
    for board in boards:
        for col in range(7):
            for row in range(5, 5 - int(rng.integers(0, 7)), -1):
                board[row, col, int(rng.integers(2))] = 1
    return boards


def test_landing_cells_are_where_a_dropped_piece_lands() -> None:
    """The gravity plane marks, per column, the row ``zmq_rl.envs.baselines.landing_row``
    finds (the scripted players' rule), and nothing in a full column."""
    boards = _stacked_boards(64, 3)
    planes = torch.from_numpy(boards).permute(0, 3, 1, 2).float()
    cells = landing_cells(planes)[:, 0].numpy()
    for board, marked in zip(boards, cells, strict=True):
        expected = np.zeros((6, 7))
        for col in range(7):
            row = landing_row(board, col)
            if row is not None:
                expected[row, col] = 1
        np.testing.assert_array_equal(marked, expected)


def test_the_gravity_network_sees_whether_a_threat_is_playable() -> None:
    """Three of the mover's on a diagonal whose free cell is its lowest is a threat only
    when a piece lies under that cell. No 4 x 4 window of ``board_cnn`` holds both
    the line and that cell; ``gravity_board_cnn``'s landing plane tells the two apart
    in the line's window. It still masks and loads weights."""
    torch.manual_seed(0)
    policy = gravity_board_cnn(SPACE, COLUMNS, PolicyConfig(hidden_sizes=(32, 32)))
    conv = next(m for m in policy.modules() if isinstance(m, torch.nn.Conv2d))
    assert conv.in_channels == 3 and conv.kernel_size == (4, 4)
    obs = _obs(128)
    actions = policy.act(obs, torch.Generator().manual_seed(1))[0]
    assert obs["action_mask"].numpy().astype(bool)[np.arange(128), actions.numpy()].all()
    board = torch.zeros(2, 6, 7, 2)
    for row, col in ((3, 1), (2, 2), (1, 3)):  # the mover's three, held up by the other's
        board[:, row, col, 0] = 1
        board[:, row + 1 :, col, 1] = 1
    board[1, 5, 0, 1] = 1  # only in board 1 is the free cell (4, 0) playable
    planes = board.permute(0, 3, 1, 2)
    assert torch.equal(planes[0, :, 1:5, 0:4], planes[1, :, 1:5, 0:4])  # the line's window
    cells = landing_cells(planes)
    assert cells[:, 0, 4, 0].tolist() == [0.0, 1.0]
    assert not torch.equal(cells[0, :, 1:5, 0:4], cells[1, :, 1:5, 0:4])
    other = gravity_board_cnn(SPACE, COLUMNS, PolicyConfig(hidden_sizes=(32, 32)))
    import_weights(other, export_weights(policy))
    with torch.no_grad():
        assert torch.equal(other(obs)[0], policy(obs)[0])


def test_the_drop_game_network_judges_each_column_by_its_landing_cell() -> None:
    """``drop_game_cnn``: column c's logit is the actor MLP on the 7 x 7 cells around
    the cell ``zmq_rl.envs.baselines.landing_row`` finds for c (pieces, landing plane, ones;
    zeros off the board), the same weights for every column; full columns are never
    chosen; act and evaluate_actions agree; the learner's weights load into an actor's
    build."""
    torch.manual_seed(0)
    cfg = PolicyConfig(hidden_sizes=(32, 32))
    policy = drop_game_cnn(SPACE, COLUMNS, cfg)
    boards = _stacked_boards(96, 4)
    boards[0] = 0  # an empty board
    mask = np.array([[landing_row(b, c) is not None for c in range(7)] for b in boards])
    obs = {
        "action_mask": torch.from_numpy(mask.astype(np.int8)),
        "observation": torch.from_numpy(boards),
    }
    with torch.no_grad():
        logits = policy(obs)[0].numpy()
    for board, row_logits in zip(boards, logits, strict=True):
        landing = np.zeros((6, 7), np.float32)
        for col in range(7):
            if (row := landing_row(board, col)) is not None:
                landing[row, col] = 1
        planes = np.concatenate(
            [board.transpose(2, 0, 1), landing[None], np.ones((1, 6, 7), np.float32)]
        ).astype(np.float32)
        padded = np.pad(planes, ((0, 0), (3, 3), (3, 3)))
        for col in range(7):
            if (row := landing_row(board, col)) is None:
                continue
            patch = torch.from_numpy(padded[:, row : row + 7, col : col + 7].reshape(1, -1))
            with torch.no_grad():
                expected = policy.policy_head(policy.actor_trunk(patch)).item()
            assert row_logits[col] == pytest.approx(expected, abs=1e-5)
    actions, log_prob, value = policy.act(obs, torch.Generator().manual_seed(1))
    assert mask[np.arange(96), actions.numpy()].all()  # never a full column
    new_log_prob, entropy, new_value = policy.evaluate_actions(obs, actions)
    torch.testing.assert_close(new_log_prob, log_prob)
    torch.testing.assert_close(new_value.detach(), value)
    assert entropy.requires_grad and policy.value(obs).shape == (96,)
    torch.manual_seed(7)
    other = drop_game_cnn(SPACE, COLUMNS, cfg)
    import_weights(other, export_weights(policy))
    with torch.no_grad():
        assert torch.equal(other(obs)[0], policy(obs)[0])


def test_the_drop_game_network_refuses_what_is_not_a_drop_game() -> None:
    with pytest.raises(ValueError, match="drop_game_cnn needs an observation of one board"):
        drop_game_cnn(gym.spaces.Box(-1, 1, (8,)), COLUMNS, PolicyConfig())
    extra = gym.spaces.Dict({"observation": BOARD, "score": gym.spaces.Box(-1, 1, (1,))})
    with pytest.raises(ValueError, match="drop_game_cnn needs an observation of one board"):
        drop_game_cnn(extra, COLUMNS, PolicyConfig())
    with pytest.raises(ValueError, match=r"Discrete\(7\) for a board 7 wide, got Discrete\(9\)"):
        drop_game_cnn(BOARD, gym.spaces.Discrete(9), PolicyConfig())
