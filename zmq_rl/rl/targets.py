"""From a time-major :class:`~zmq_rl.rl.rollout.Rollout` to a flat PPO batch.

Advantages are GAE (Schulman et al. 2016) on the actors' behaviour values, or
V-trace (Espeholt et al. 2018) with target log-probs from re-evaluating every
stored ``(obs, action)`` under the learner's current policy (with ``vtrace_lambda``
equal to ``gae_lambda``, on-policy data gives GAE's targets exactly). Episode ends enter
only through the discounts; a truncated step is bootstrapped by adding
``gamma * V(final observation)`` to its reward (its discount is 0 like any episode
end), a terminated one is not. No sockets here.

Rows that are not valid (``Rollout.valid``: a multi-agent slot without a live agent)
enter the targets as terminated rows with reward 0 and value 0 (and, for V-trace,
log-ratio 0), so nothing valid bootstraps from or accumulates through them, and
their contents (placeholders) cannot reach a valid row's target; the batch holds
only valid rows (feed-forward) or valid rows in sequences that never span an
invalid row (recurrent), so PPO never sees them either.

Devices: the rollout is host arrays. Its tensors are copied to the policy's device
once (:func:`zmq_rl.rl.device.to_device`), the forward passes the targets need run
there, their outputs (values, log-probs: ``[T, B]`` at most) come back to the host,
where GAE / V-trace run in numpy (sequential scans over ``T``: cheap on the host,
kernel-launch bound on a GPU), and the small target arrays go to the device. The
batch handed to PPO is on the device, so :meth:`RolloutBatch.to` copies nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import torch

from ..wire.spaces import Value, map_value
from .advantages import gae, vtrace
from .device import to_device
from .policy import Policy, is_recurrent
from .ppo import RolloutBatch
from .rollout import Rollout, SlotKey


@dataclass(frozen=True)
class TargetSettings:
    """What :func:`rollout_to_batch` needs of the run's configuration; each field has
    the name of the :class:`~zmq_rl.config.LearnerConfig` field it comes from."""

    gamma: float
    gae_lambda: float
    use_vtrace: bool = False
    recompute_values: bool = False
    vtrace_rho_bar: float = 1.0
    vtrace_c_bar: float = 1.0
    vtrace_lambda: float = 1.0
    vtrace_weight_advantages: bool = True
    standardize_before_weight: bool = False
    """Not a ``LearnerConfig`` field: ``PPOConfig.normalize_advantages`` (see
    :meth:`from_config`). Standardise V-trace's advantages over the rollout before
    the ``min(rho_bar, rho_s)`` weight, so that PPO's per-minibatch normalisation
    cannot turn the weight itself into the advantage."""

    @classmethod
    def from_config(cls, cfg: Any, ppo_cfg: Any | None = None) -> TargetSettings:
        """The settings of a :class:`~zmq_rl.config.LearnerConfig` (same field names),
        adjusted to the :class:`~zmq_rl.config.PPOConfig` that trains on them: the
        advantage weight is standardised-first when PPO normalises advantages, and
        dropped for the ``decoupled`` / ``impact`` objectives, whose surrogates carry
        their own truncated weight against the behaviour policy."""
        settings = cls(
            **{f.name: getattr(cfg, f.name) for f in fields(cls) if hasattr(cfg, f.name)}
        )
        if ppo_cfg is None:
            return settings
        return replace(
            settings,
            standardize_before_weight=ppo_cfg.normalize_advantages,
            vtrace_weight_advantages=settings.vtrace_weight_advantages
            and ppo_cfg.objective == "ppo",
        )


def _tensor(array: np.ndarray) -> torch.Tensor:
    """Observations as the policy sees them on the actors: uint8 frames stay uint8
    (a quarter of float32's memory for an Atari rollout; the policy casts each
    minibatch), integer parts keep their dtype (indices), float64 becomes float32."""
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    if tensor.dtype == torch.float32 or not tensor.dtype.is_floating_point:
        return tensor
    return tensor.float()


def _obs(value: Value) -> Any:
    """An observation value as tensors (:func:`_tensor` per leaf)."""
    return map_value(_tensor, value)


def _targets(
    rollout: Rollout,
    settings: TargetSettings,
    rewards: np.ndarray,
    bootstrap: np.ndarray,
    target_lp: np.ndarray | None,
    values_now: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """(advantages, returns) ``[T, B]`` by V-trace (with the current policy's log-probs
    and values) or GAE (on the behaviour values, or on the current critic's with
    ``recompute_values``), and V-trace's diagnostics.

    Invalid rows (``rollout.valid`` False) are made terminated rows of reward 0 and
    value 0 (log-ratio 0) with ``np.where``, so their contents, however large, reach
    no valid row's target; their own targets are 0 and the diagnostics are means over
    the valid rows."""
    valid = rollout.valid
    done = rollout.terminated | rollout.truncated
    behaviour_values = rollout.values.astype(np.float32)
    if valid is not None:
        done = done | ~valid
        rewards = np.where(valid, rewards, np.float32(0))
        behaviour_values = np.where(valid, behaviour_values, np.float32(0))
        bootstrap = np.where(valid[-1], bootstrap, np.float32(0))
        if values_now is not None:
            values_now = np.where(valid, values_now, np.float32(0))
    discounts = (settings.gamma * (1.0 - done)).astype(np.float32)  # [T, B]
    diagnostics: dict[str, float] = {}
    if settings.use_vtrace:
        log_rhos = target_lp - rollout.log_probs.astype(np.float32)
        if valid is not None:
            log_rhos = np.where(valid, log_rhos, np.float32(0))
        out = vtrace(
            log_rhos,
            discounts,
            rewards,
            values_now,
            bootstrap,
            rho_bar=settings.vtrace_rho_bar,
            c_bar=settings.vtrace_c_bar,
            lam=settings.vtrace_lambda,
        )
        # PPO's trust region stays around the behaviour policy mu (as APPO): the
        # ratio pi/mu limits how far an update moves from what acted, while the
        # clipped rhos inside V-trace correct the targets. The advantages carry
        # IMPALA's min(rho_bar, rho_s) on top of that ratio unless told otherwise.
        # Both choices were measured: see docs/learning-quality.md.
        rhos = np.exp(log_rhos)
        # Statistics over the valid rows (all of them without ``valid``; none: skipped).
        real = rhos if valid is None else rhos[valid]
        if not settings.vtrace_weight_advantages:
            advantages = out.advantages
        elif settings.standardize_before_weight:
            # PPO normalises each minibatch's advantages. Were the weighted ones
            # normalised, an advantage of nearly constant sign (an accurate critic:
            # small, biased A) would become (w - mean w) / std w, so the weight
            # itself -- high where the learner already raised pi -- would drive the
            # update: a positive feedback that collapsed every V-trace seed at
            # broadcast_every 1 (docs/benchmarks.md section 22). Standardising first
            # keeps the advantage's sign where it belongs. Over valid rows only.
            kept = out.advantages if valid is None or not valid.any() else out.advantages[valid]
            standardized = (out.advantages - kept.mean()) / (kept.std() + 1e-8)
            advantages = np.minimum(settings.vtrace_rho_bar, rhos) * standardized
        else:
            advantages = out.pg_advantages
        if valid is not None:
            advantages = np.where(valid, advantages, np.float32(0))
        if real.size:
            diagnostics["charts/importance_ratio_mean"] = float(real.mean())
            diagnostics["charts/importance_ratio_clipped"] = float(
                (real > settings.vtrace_rho_bar).mean()
            )
        return advantages, out.vs, diagnostics
    values = values_now if settings.recompute_values else behaviour_values
    advantages, returns = gae(rewards, values, bootstrap, discounts, settings.gae_lambda)
    return advantages, returns, diagnostics


def policy_device(policy: Any) -> torch.device:
    """The device of the policy's parameters (the CPU for one without parameters)."""
    for parameter in policy.parameters():
        return parameter.device
    return torch.device("cpu")


def _host(tensor: torch.Tensor) -> np.ndarray:
    """A forward pass's output as a host array."""
    return tensor.cpu().numpy()


@torch.no_grad()
def rollout_to_batch(
    rollout: Rollout,
    policy: Policy,
    settings: TargetSettings,
    carry: dict[SlotKey, np.ndarray] | None = None,
    device: torch.device | None = None,
) -> tuple[RolloutBatch, dict[str, float]]:
    """Compute advantages and returns for ``rollout`` and batch it.

    ``old_log_probs`` and ``old_values`` are always the behaviour policy's (what the
    actors stored): with V-trace, PPO's clipped ratio pi/mu bounds the step away
    from the acting policy, and the clipped importance weights inside the V-trace
    targets and advantages correct the returns for the lag.

    A recurrent policy (``state_size > 0``) gets a batch of sequences
    (:func:`recurrent_batch`); ``carry`` maps each slot to the state its next rollout
    starts from where that rollout begins in the middle of a fragment (updated here).
    ``device``: where the batch goes and the forward passes run (default: the
    policy's); every tensor of the rollout is copied there once.
    Returns the batch and a few diagnostics (``charts/...`` keys).
    """
    device = policy_device(policy) if device is None else device
    if is_recurrent(policy):
        return recurrent_batch(rollout, policy, settings, {} if carry is None else carry, device)
    T, B = rollout.num_steps, rollout.num_slots

    def put(value: Any) -> Any:
        return to_device(value, device)

    # The training rows: every cell, or (some rows not valid) the valid cells only, in
    # row-major order; invalid rows are dropped here, before any forward pass.
    keep = None if rollout.valid is None else np.flatnonzero(rollout.valid.reshape(T * B))
    n = T * B if keep is None else len(keep)

    def rows(array: np.ndarray) -> np.ndarray:
        flat = array.reshape(T * B, *array.shape[2:])
        return flat if keep is None else flat[keep]

    flat_obs = put(_obs(map_value(rows, rollout.obs)))
    flat_actions = put(torch.from_numpy(np.ascontiguousarray(rows(rollout.actions))))
    rewards = rollout.rewards.astype(np.float32, copy=True)  # [T, B]
    if len(rollout.final_t):
        final_values = _host(policy.value(put(_obs(rollout.final_obs))))
        rewards[rollout.final_t, rollout.final_b] += settings.gamma * final_values
    bootstrap = _host(policy.value(put(_obs(rollout.bootstrap_obs))))  # [B]
    target_lp = values_now = None
    if settings.use_vtrace or settings.recompute_values:
        if n:
            target_log_probs, _, current_values = policy.evaluate_actions(flat_obs, flat_actions)
            lp, v = _host(target_log_probs), _host(current_values)
        else:  # no valid row at all
            lp = v = np.zeros(0, np.float32)
        target_lp, values_now = _cells(lp, keep, T, B), _cells(v, keep, T, B)
    advantages, returns, diagnostics = _targets(
        rollout, settings, rewards, bootstrap, target_lp, values_now
    )
    batch = RolloutBatch(
        obs=flat_obs,
        actions=flat_actions,
        old_log_probs=put(_flat(rows(rollout.log_probs), n)),
        old_values=put(_flat(rows(rollout.values), n)),
        advantages=put(_flat(rows(advantages), n)),
        returns=put(_flat(rows(returns), n)),
    )
    return batch, diagnostics


def _cells(rows: np.ndarray, keep: np.ndarray | None, T: int, B: int) -> np.ndarray:
    """``[T, B]`` from one value per training row: ``rows`` reshaped, or (``keep``: the
    flat cells of the valid rows) scattered into zeros, 0 at every invalid row."""
    if keep is None:
        return rows.reshape(T, B)
    cells = np.zeros(T * B, rows.dtype)
    cells[keep] = rows
    return cells.reshape(T, B)


def _flat(array: np.ndarray, *shape: int) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array, np.float32).reshape(*shape))


@dataclass(frozen=True)
class SequenceLayout:
    """How a rollout's ``[T, B]`` cells are cut into sequences for a recurrent policy.

    A sequence is a run of rows of one column that begins at row 0, where a fragment
    begins (``Rollout.state_starts``: the actor's state is known there) or where an
    episode begins (the state is zero there, as the actor zeroes it), and ends
    before the next such row; so no sequence crosses an episode boundary. ``t`` /
    ``b`` ``[L, N]`` index each sequence's rows (padding repeats the sequence's
    last cell); ``mask`` marks real rows, ``lengths`` ``[N]`` counts them;
    ``first`` ``[N]`` is each sequence's first row and ``kind`` ``[N]`` where its
    state comes from: 0 carried (row 0 mid-fragment), 1 the fragment's, 2 zeros
    (an episode begins)."""

    t: np.ndarray
    b: np.ndarray
    mask: np.ndarray
    lengths: np.ndarray
    first: np.ndarray
    column: np.ndarray
    kind: np.ndarray


def sequence_layout(rollout: Rollout) -> SequenceLayout:
    """Cut ``rollout`` into sequences (see :class:`SequenceLayout`).

    Rows that are not valid (``rollout.valid``) belong to no sequence: a sequence
    ends before an invalid row, and the valid row that ends an invalid run (a new
    agent took the slot) begins a sequence from zeros, like an episode start. So the
    batch holds no invalid row, and no state flows through one."""
    T, B = rollout.num_steps, rollout.num_slots
    fragment_start = (
        rollout.state_starts if rollout.state_starts is not None else np.zeros((T, B), bool)
    )
    done = rollout.terminated | rollout.truncated
    episode_start = np.zeros((T, B), bool)
    episode_start[1:] = done[:-1]
    valid = rollout.valid
    if valid is not None:
        episode_start[1:] |= ~valid[:-1]  # a new agent after an empty slot
    # Where an episode begins the state is zero whatever the fragment says (the
    # actor zeroed it and sent that zero state); else the fragment's state.
    kinds = np.where(episode_start, 2, np.where(fragment_start, 1, 0))
    cut = episode_start | fragment_start
    cut[0] = True
    if valid is not None:
        cut &= valid  # sequences begin at valid rows only
    first_t, column = np.nonzero(cut.T)[1], np.nonzero(cut.T)[0]  # column-major order
    ends = np.append(first_t[1:], T)
    ends[np.append(column[1:] != column[:-1], True)] = T
    if valid is not None and len(first_t):
        # ... and end at the first invalid row after their start, if that comes first.
        invalid_rows = np.where(valid, T, np.arange(T)[:, None])  # [T, B]
        next_invalid = np.minimum.accumulate(invalid_rows[::-1], axis=0)[::-1]
        ends = np.minimum(ends, next_invalid[first_t, column])
    lengths = ends - first_t
    length = int(lengths.max()) if len(lengths) else 0
    steps = np.arange(length)[:, None]
    mask = steps < lengths[None, :]
    t = first_t[None, :] + np.minimum(steps, lengths[None, :] - 1)
    b = np.broadcast_to(column[None, :], t.shape).copy()
    return SequenceLayout(
        t, b, mask, lengths.astype(np.int64), first_t, column, kinds[first_t, column]
    )


@torch.no_grad()
def recurrent_batch(
    rollout: Rollout,
    policy: Any,
    settings: TargetSettings,
    carry: dict[SlotKey, np.ndarray],
    device: torch.device | None = None,
) -> tuple[RolloutBatch, dict[str, float]]:
    """Targets and a sequence batch for a recurrent policy (truncated BPTT), on
    ``device`` (default: the policy's) as :func:`rollout_to_batch`.

    Every sequence (:func:`sequence_layout`) starts from the state the actor sent
    with its fragment, or from zeros where an episode begins. A sequence at row 0 of
    a column that begins mid-fragment (the previous rollout took the fragment's
    first rows, which happens after an actor flushed a partial fragment at a valve
    pause, or when ``num_steps`` is not a multiple of ``fragment_length``) starts
    from ``carry[slot]``: the state the learner computed after that previous
    rollout's last row, or zeros when there is none (a new slot, a resumed run).
    One no-grad unroll with the current policy gives V(final observation) of
    truncated steps and V(bootstrap observation) from the states after the right
    rows, and, for V-trace, the target log-probs and values."""
    device = policy_device(policy) if device is None else device

    def put(value: Any) -> Any:
        return to_device(value, device)

    T, B = rollout.num_steps, rollout.num_slots
    S = int(policy.state_size)
    layout = sequence_layout(rollout)
    n = len(layout.lengths)
    states0 = np.zeros((n, S), np.float32)
    from_fragment = layout.kind == 1
    if from_fragment.any():
        states0[from_fragment] = rollout.states[
            layout.first[from_fragment], layout.column[from_fragment]
        ]
    for k in np.flatnonzero(layout.kind == 0):
        state = carry.get(rollout.slots[int(layout.column[k])])
        if state is not None:
            states0[k] = state
    tt, bb, mask = layout.t, layout.b, layout.mask
    obs = put(_obs(map_value(lambda a: a[tt, bb], rollout.obs)))
    actions = put(torch.from_numpy(np.ascontiguousarray(rollout.actions[tt, bb])))
    init = put(torch.from_numpy(states0))
    lengths = torch.from_numpy(layout.lengths)  # stays on the host (packing reads it)
    log_prob, _, value, final = policy.evaluate_sequence(obs, actions, init, lengths)
    final = _host(final)
    last_t = layout.first + layout.lengths - 1
    # The state after each cell that ends a sequence (truncated steps always do).
    after = np.zeros((T, B, S), np.float32)
    after[last_t, layout.column] = final
    done = rollout.terminated | rollout.truncated
    rewards = rollout.rewards.astype(np.float32, copy=True)
    if len(rollout.final_t):
        final_state = put(torch.from_numpy(after[rollout.final_t, rollout.final_b]))
        _, _, final_values, _ = policy.act_recurrent(
            put(_obs(rollout.final_obs)), final_state, deterministic=True
        )
        rewards[rollout.final_t, rollout.final_b] += settings.gamma * _host(final_values)
    # An episode that ended restarts at zero; so does a slot whose last row is not
    # valid (no sequence ends there: ``after`` is zero), as its next agent must.
    last = after[T - 1] * ~done[T - 1][:, None]
    _, _, bootstrap_t, _ = policy.act_recurrent(
        put(_obs(rollout.bootstrap_obs)), put(torch.from_numpy(last)), deterministic=True
    )
    for b, key in enumerate(rollout.slots):
        carry[key] = last[b].copy()
    target_lp = values_now = None
    if settings.use_vtrace or settings.recompute_values:
        target_lp = np.zeros((T, B), np.float32)
        values_now = np.zeros((T, B), np.float32)
        target_lp[tt[mask], bb[mask]] = _host(log_prob)[mask]
        values_now[tt[mask], bb[mask]] = _host(value)[mask]
    advantages, returns, diagnostics = _targets(
        rollout, settings, rewards, _host(bootstrap_t), target_lp, values_now
    )
    diagnostics["charts/sequence_length_mean"] = float(layout.lengths.mean())

    def cells(array: np.ndarray) -> torch.Tensor:
        return put(torch.from_numpy(np.ascontiguousarray(array[tt, bb], np.float32)))

    batch = RolloutBatch(
        obs=obs,
        actions=actions,
        old_log_probs=cells(rollout.log_probs),
        old_values=cells(rollout.values),
        advantages=cells(advantages),
        returns=cells(returns),
        states=init,
        lengths=lengths,
        mask=put(torch.from_numpy(mask)),
    )
    return batch, diagnostics
