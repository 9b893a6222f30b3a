"""Action masks: the PettingZoo ``action_mask`` convention for categorical actions.

An env opts in by returning a ``gymnasium.spaces.Dict`` observation with a key
``"action_mask"`` (:data:`MASK_KEY`): a ``MultiBinary(n)`` or a ``Box`` of ``n`` 0/1
entries, one per action of a ``Discrete(n)`` action space, or ``sum(nvec)`` entries
(one block per component, in order) of a ``MultiDiscrete(nvec)`` one. Nonzero means
*allowed*, 0 *masked*. The mask is an ordinary part of the observation: it travels
with it (actor to learner, in the experience) and is encoded with the other parts;
the policy also reads it to mask its logits.

This module holds the pure pieces (no sockets, no policy state):

* :func:`mask_key` decides whether a pair of spaces is masked, and checks the mask's
  size against the action space once, when the policy is built;
* :func:`masked_logits` is the masking itself, as SB3-contrib's
  ``MaskableCategorical``: masked logits become the most negative finite value of
  their dtype, so their probability is exactly 0 after the softmax, the softmax
  renormalises over the allowed actions, and nothing is ``-inf`` (no ``NaN`` in
  ``0 * log 0`` nor in gradients);
* :func:`empty_mask_rows` / :func:`check_action_mask` find rows in which a
  component has no allowed action -- an env error, refused where an actor acts
  (:class:`ActionMaskError`), since no distribution over zero actions exists.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import gymnasium
import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = [
    "MASK_KEY",
    "ActionMaskError",
    "check_action_mask",
    "check_observation_mask",
    "empty_mask_rows",
    "mask_entries",
    "masked_action_problem",
    "mask_key",
    "mask_nvec",
    "masked_logits",
    "random_allowed_action",
]

MASK_KEY = "action_mask"
"""The observation key that carries the mask (PettingZoo's name)."""


class ActionMaskError(ValueError):
    """An observation's ``action_mask`` allows no action (of some component) in a row
    that is to be acted on, or does not fit the action space."""


def mask_nvec(action_space: gymnasium.Space) -> np.ndarray | None:
    """The category counts a mask covers, one per component: ``[n]`` for
    ``Discrete(n)``, ``nvec`` flattened for ``MultiDiscrete``; None for action spaces
    that cannot be masked (MultiBinary, Box)."""
    if isinstance(action_space, gymnasium.spaces.Discrete):
        return np.array([int(action_space.n)], np.int64)
    if isinstance(action_space, gymnasium.spaces.MultiDiscrete):
        return np.asarray(action_space.nvec, np.int64).reshape(-1)
    return None


def mask_key(observation_space: gymnasium.Space, action_space: gymnasium.Space) -> str | None:
    """:data:`MASK_KEY` when the policy of these spaces masks its logits: a Dict
    observation with an ``action_mask`` entry and a Discrete / MultiDiscrete action;
    None otherwise (a Box or MultiBinary action space leaves ``action_mask`` an
    ordinary observation part).

    Raises :class:`ActionMaskError` naming ``action_mask`` when the mask's space is not
    a ``MultiBinary`` or ``Box``, or its size is not the number of actions (Discrete
    ``n``; MultiDiscrete ``sum(nvec)``): a mismatch is a bug in the env, better found
    when the policy is built than as a shape error in the first forward pass."""
    if not isinstance(observation_space, gymnasium.spaces.Dict):
        return None
    space = observation_space.spaces.get(MASK_KEY)
    nvec = mask_nvec(action_space)
    if space is None or nvec is None:
        return None
    if not isinstance(space, (gymnasium.spaces.MultiBinary, gymnasium.spaces.Box)):
        raise ActionMaskError(
            f"observation {MASK_KEY!r} is {space}: it must be a MultiBinary or a Box of "
            f"{int(nvec.sum())} 0/1 entries (1 = allowed), one per action of {action_space}"
        )
    size = int(np.prod(space.shape, dtype=np.int64))
    if size != int(nvec.sum()):
        raise ActionMaskError(
            f"observation {MASK_KEY!r} has {size} entries, but {action_space} needs "
            f"{int(nvec.sum())} (one per action; MultiDiscrete: sum(nvec), one block per "
            "component)"
        )
    return MASK_KEY


def masked_logits(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``logits`` ``[N, A]`` with every entry whose ``mask`` ``[N, A]`` (any shape that
    reshapes to it; any dtype) is 0 replaced by ``torch.finfo(logits.dtype).min``.

    Finite, not ``-inf``: ``softmax`` then gives masked actions probability exactly 0
    (``exp`` underflows) and renormalises over the allowed ones, while
    ``p * log p`` stays ``0`` instead of ``NaN``. ``masked_fill`` passes no gradient
    to the masked logits. A row whose entries are all masked gets a uniform
    distribution (finite, but meaningless: actors refuse such rows first)."""
    import torch  # here, not at the top: actors check masks without torch (rl/numpy_mlp.py)

    allowed = mask.reshape(logits.shape) != 0
    return logits.masked_fill(~allowed, torch.finfo(logits.dtype).min)


def empty_mask_rows(mask: Any, nvec: np.ndarray) -> list[tuple[int, int]]:
    """``(row, component)`` of every component block of ``mask`` (``[N, sum(nvec)]``,
    or anything that reshapes to it) with no allowed (nonzero) entry."""
    flat = np.asarray(mask).reshape(-1, int(nvec.sum())) != 0
    bounds = np.concatenate([[0], np.cumsum(nvec)])
    empty: list[tuple[int, int]] = []
    for k in range(len(nvec)):
        rows = np.flatnonzero(~flat[:, bounds[k] : bounds[k + 1]].any(axis=1))
        empty.extend((int(r), k) for r in rows)
    return sorted(empty)


def check_action_mask(mask: Any, nvec: np.ndarray, where: str = MASK_KEY) -> None:
    """Raise :class:`ActionMaskError` naming ``where`` (the ``action_mask`` field),
    the slot and the component when a row of ``mask`` allows no action: there is no
    distribution to sample from, and guessing one would hand the env an action it
    said is illegal."""
    empty = empty_mask_rows(mask, nvec)
    if not empty:
        return
    row, component = empty[0]
    part = f" (component {component} of {len(nvec)})" if len(nvec) > 1 else ""
    raise ActionMaskError(
        f"{where}: slot {row} allows no action{part}: every entry is 0 "
        f"({len(empty)} such row(s) in this batch). An env must allow at least one "
        "action in every observation it is asked to act on (1 = allowed, PettingZoo's "
        "convention)"
    )


def check_observation_mask(
    observation_space: gymnasium.Space,
    action_space: gymnasium.Space,
    obs: Any,
    where: str = "observation",
) -> None:
    """:func:`check_action_mask` on the ``action_mask`` of ``obs`` (a batch of
    observations to act on, a dict with leading dim ``[N]``), named
    ``<where>.action_mask``; a no-op for spaces without a mask (:func:`mask_key`)."""
    key = mask_key(observation_space, action_space)
    if key is not None:
        check_action_mask(obs[key], mask_nvec(action_space), f"{where}.{key}")


def mask_entries(nvec: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """``[N, K]``: for each of ``N`` rows of policy ``actions`` (0-based, ``K =
    len(nvec)`` components each), the index in the row's mask of each component's
    action (its block of the mask starts at the sum of the earlier ``nvec``)."""
    rows = actions.size // len(nvec)
    offsets = np.concatenate([[0], np.cumsum(nvec)[:-1]])
    return actions.reshape(rows, len(nvec)).astype(np.int64) + offsets


def random_allowed_action(
    observation_space: gymnasium.Space,
    action_space: gymnasium.Space,
    obs: Any,
    rng: np.random.Generator,
) -> Any:
    """A uniformly random action that ``obs``'s ``action_mask`` allows (each component
    among its block's nonzero entries), or ``action_space.sample()`` where the spaces
    have no mask (:func:`mask_key`). For probes that step an env with no policy (the
    evaluator's :func:`~zmq_rl.envs.stepping.steps_wait`): an env that refuses masked
    actions is never sent one."""
    if mask_key(observation_space, action_space) is None:
        return action_space.sample()
    nvec = mask_nvec(action_space)
    mask = np.asarray(obs[MASK_KEY]).reshape(-1) != 0
    check_action_mask(mask, nvec)
    starts = np.concatenate([[0], np.cumsum(nvec)[:-1]])
    picks = [
        int(rng.choice(np.flatnonzero(mask[s : s + n])))
        for s, n in zip(starts, nvec, strict=True)
    ]
    if isinstance(action_space, gymnasium.spaces.Discrete):
        return int(action_space.start) + picks[0]
    return (np.asarray(picks, action_space.dtype) + action_space.start.reshape(-1)).reshape(
        action_space.shape
    )


def masked_action_problem(
    observation_space: gymnasium.Space,
    action_space: gymnasium.Space,
    obs: Any,
    actions: np.ndarray,
    valid: np.ndarray | None = None,
) -> str | None:
    """Why a fragment's rows break their own ``action_mask`` (docs/protocol.md section
    7.2, ``masked_action``), or None: in some valid row (``valid`` ``[T, B]``, None: every
    row) the action (of some component) is one the row's mask forbids, or the mask allows
    no action at all. ``obs`` is the fragment's observation value (``[T, B, ...]``
    leaves), ``actions`` its policy actions, in range for ``action_space`` (checked
    before). None for spaces without a mask (:func:`mask_key`): rows that are not valid
    took no action and are not checked."""
    key = mask_key(observation_space, action_space)
    if key is None:
        return None
    nvec = mask_nvec(action_space)
    lead = actions.shape[:2]
    rows = int(np.prod(lead))
    allowed = np.asarray(obs[key]).reshape(rows, int(nvec.sum())) != 0
    bad = ~allowed[np.arange(rows)[:, None], mask_entries(nvec, actions)].all(axis=1)
    if valid is not None:
        bad &= valid.reshape(-1)
    if not bad.any():
        return None
    first = int(np.flatnonzero(bad)[0])
    t, b = divmod(first, lead[1])
    what = (
        "allows no action"
        if empty_mask_rows(allowed[first], nvec)
        else f"forbids its action {actions[t, b].tolist()}"
    )
    return (
        f"row {t} of column {b}: its {key} {what} ({int(bad.sum())} such row(s); "
        "a row's action must be one its own mask allows)"
    )
