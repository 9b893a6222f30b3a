"""``--factory zmq_rl.rl.boards:board_cnn``: board planes through window convolutions, the
rest of the built-in structured actor-critic unchanged (masks, heads, weights)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from zmq_rl.config import PolicyConfig
from zmq_rl.rl.boards import board_cnn
from zmq_rl.rl.networks import is_board_space
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
