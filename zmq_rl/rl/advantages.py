"""Advantage and value-target estimators: GAE and V-trace.

All functions here are pure numpy and operate on *time-major* batches:

* per-step quantities (rewards, values, discounts, log importance ratios) have
  shape ``[T, B]``: ``T`` steps of a trajectory fragment for ``B`` independent
  environments (or actors), with ``x[t, b]`` the quantity at step ``t`` of
  environment ``b``;
* the bootstrap value ``V(x_T)`` -- the value of the state reached after the
  last step -- has shape ``[B]``.

Naming follows DeepMind's rlax: ``r_t`` is the reward received on the
transition out of step ``t``, ``discount_t`` the discount applied to what
follows it, ``v_tm1`` the values ``V(x_t)`` of the states the steps start from
and ``v_t`` the values ``V(x_{t+1})`` of the states they lead to (``v_tm1``
shifted by one, with the bootstrap value appended).

Episode boundaries enter *only* through ``discounts``: the caller passes
``discounts[t] = gamma * (1 - done[t])`` (as :mod:`zmq_rl.rl.targets` does), so
a zero discount at step ``t`` stops both bootstrapping from ``V(x_{t+1})`` and
any propagation of later advantages back across the boundary. Truncation
(time-limit) handling is the caller's business. With autoreset rows, where the
row after a truncated step already belongs to the next episode, the caller sets
that step's discount to 0 as for any episode end and adds ``gamma * V(final
observation)`` to its reward (``zmq_rl.rl.targets`` does exactly this).

Computation is done internally in float64; every output is float32.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike

__all__ = [
    "GaeOutput",
    "VTraceOutput",
    "gae",
    "vtrace",
]


class GaeOutput(NamedTuple):
    """Output of :func:`gae`.

    Attributes:
      advantages: ``[T, B]`` float32 generalized advantage estimates ``A_t``.
      returns: ``[T, B]`` float32 value targets ``A_t + V(x_t)``
        (the lambda-returns).
    """

    advantages: np.ndarray
    returns: np.ndarray


class VTraceOutput(NamedTuple):
    """Output of :func:`vtrace`.

    Attributes:
      vs: ``[T, B]`` float32 V-trace value targets ``v_s``.
      pg_advantages: ``[T, B]`` float32 importance-weighted advantages for the
        policy-gradient term, ``rho_s (r_s + discount_s q_{s+1} - V(x_s))``.
      advantages: ``[T, B]`` float32 the same without the weight ``rho_s``:
        ``r_s + discount_s q_{s+1} - V(x_s)``. For a surrogate that already
        importance-weights each sample, such as PPO's ratio ``pi / mu`` taken
        against the behaviour policy.
    """

    vs: np.ndarray
    pg_advantages: np.ndarray
    advantages: np.ndarray


def _as_float_array(name: str, x: ArrayLike, ndim: int) -> np.ndarray:
    """Returns `x` as a float64 array after checking its dtype and rank."""
    arr = np.asarray(x)
    if not np.issubdtype(arr.dtype, np.floating):
        raise ValueError(
            f"`{name}` must have a floating dtype, got {arr.dtype} (shape {arr.shape})."
        )
    if arr.ndim != ndim:
        layout = "[T, B]" if ndim == 2 else "[B]"
        raise ValueError(f"`{name}` must have rank {ndim} ({layout}), got shape {arr.shape}.")
    return arr.astype(np.float64, copy=False)


def _check_same_shape(name: str, arr: np.ndarray, expected: tuple[int, ...], ref: str) -> None:
    if arr.shape != expected:
        raise ValueError(
            f"`{name}` must have the same shape as `{ref}` {expected}, got shape {arr.shape}."
        )


def _check_bootstrap(bootstrap_value: np.ndarray, tb: tuple[int, ...], ref: str) -> None:
    if bootstrap_value.shape != tb[1:]:
        raise ValueError(
            f"`bootstrap_value` must have shape [B] = {tb[1:]} to match `{ref}` {tb}, "
            f"got shape {bootstrap_value.shape}."
        )


def _check_positive(name: str, value: float) -> float:
    value = float(value)
    if not value > 0:  # also rejects NaN
        raise ValueError(f"`{name}` must be > 0, got {value}.")
    return value


def _check_unit_interval(name: str, value: float) -> float:
    value = float(value)
    if not 0.0 <= value <= 1.0:  # also rejects NaN
        raise ValueError(f"`{name}` must be in [0, 1], got {value}.")
    return value


def gae(
    rewards: ArrayLike,
    values: ArrayLike,
    bootstrap_value: ArrayLike,
    discounts: ArrayLike,
    lam: float,
) -> GaeOutput:
    """Generalized Advantage Estimation.

    See "High-Dimensional Continuous Control Using Generalized Advantage
    Estimation" by Schulman, Moritz, Levine, Jordan and Abbeel (ICLR 2016),
    eq. 16, with the per-step ``gamma`` replaced by ``discount_t`` so that
    episode boundaries are handled by the caller:

      delta_t = r_t + discount_t * V(x_{t+1}) - V(x_t)
      A_t     = delta_t + discount_t * lam * A_{t+1},     A_T = 0
      G_t     = A_t + V(x_t)

    where ``V(x_T)`` is `bootstrap_value`. With ``lam = 1`` the returns are the
    discounted n-step returns bootstrapped from ``V(x_T)``; with ``lam = 0`` they
    are one-step TD targets. Computed in float64, returned as float32.

    Args:
      rewards: ``[T, B]`` rewards ``r_t``.
      values: ``[T, B]`` value estimates ``V(x_t)``.
      bootstrap_value: ``[B]`` value estimate ``V(x_T)`` of the final state.
      discounts: ``[T, B]`` discounts ``discount_t = gamma * (1 - terminated_t)``.
      lam: the GAE mixing parameter lambda, in ``[0, 1]``.

    Returns:
      GaeOutput(advantages ``[T, B]``, returns ``[T, B]``), both float32.

    Raises:
      ValueError: on a non-float or wrongly shaped argument, or `lam` outside
        ``[0, 1]``.
    """
    r_t = _as_float_array("rewards", rewards, 2)  # [T, B]
    v_tm1 = _as_float_array("values", values, 2)  # [T, B]
    bootstrap = _as_float_array("bootstrap_value", bootstrap_value, 1)  # [B]
    discount_t = _as_float_array("discounts", discounts, 2)  # [T, B]
    _check_same_shape("values", v_tm1, r_t.shape, "rewards")
    _check_same_shape("discounts", discount_t, r_t.shape, "rewards")
    _check_bootstrap(bootstrap, r_t.shape, "rewards")
    lam = _check_unit_interval("lam", lam)

    # V(x_{t+1}): values shifted by one step, bootstrap appended.
    v_t = np.concatenate([v_tm1[1:], bootstrap[None]], axis=0)  # [T, B]
    delta_t = r_t + discount_t * v_t - v_tm1  # [T, B]

    advantages = np.zeros_like(delta_t)  # [T, B]
    acc = np.zeros_like(bootstrap)  # [B], A_{t+1}
    for t in reversed(range(r_t.shape[0])):
        acc = delta_t[t] + discount_t[t] * lam * acc
        advantages[t] = acc
    returns = advantages + v_tm1  # [T, B]
    return GaeOutput(
        advantages=advantages.astype(np.float32),
        returns=returns.astype(np.float32),
    )


def vtrace(
    log_rhos: ArrayLike,
    discounts: ArrayLike,
    rewards: ArrayLike,
    values: ArrayLike,
    bootstrap_value: ArrayLike,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    pg_rho_bar: float | None = None,
    lam: float = 1.0,
) -> VTraceOutput:
    """V-trace off-policy value targets and policy-gradient advantages.

    See "IMPALA: Scalable Distributed Deep-RL with Importance Weighted
    Actor-Learner Architectures" by Espeholt et al. (ICML 2018), eq. 1:

      v_s = V(x_s) + sum_{t=s}^{T-1} gamma^{t-s} (prod_{i=s}^{t-1} c_i) rho_t delta_t

    with ``gamma^{t-s}`` generalised to ``prod_{i=s}^{t-1} discount_i`` and

      rho_t   = min(rho_bar, exp(log_rho_t))
      c_t     = lam * min(c_bar, exp(log_rho_t))
      delta_t = r_t + discount_t V(x_{t+1}) - V(x_t),      V(x_T) = bootstrap_value

    It is computed by the equivalent backward recursion (Remark 1 of the paper)

      v_s - V(x_s) = rho_s delta_s + discount_s c_s (v_{s+1} - V(x_{s+1})),
      v_T - V(x_T) = 0.

    The trace coefficient carries the optional lambda of section 4.1 (as in
    Retrace(lambda), ``c_i = lambda min(c_bar, rho_i)``), which mixes multi-step and
    one-step targets exactly as GAE's lambda does. The policy-gradient advantage (section 4.2) is

      pg_adv_s = min(pg_rho_bar, exp(log_rho_s)) (r_s + discount_s q_{s+1} - V(x_s)),
      q_{s+1}  = lam v_{s+1} + (1 - lam) V(x_{s+1}),       v_T = V(x_T) = bootstrap_value,

    where `pg_rho_bar` defaults to `rho_bar` (the lambda-mixed bootstrap ``q`` is
    rlax's ``vtrace_td_error_and_advantage``; with ``lam = 1`` it is the paper's
    ``v_{s+1}``). ``advantages`` is ``pg_adv_s`` without its weight
    ``min(pg_rho_bar, rho_s)``. On-policy (``log_rhos = 0``) with ``rho_bar, c_bar >= 1``
    the outputs equal GAE with the same ``lam``: ``vs`` its returns, ``pg_advantages``
    and ``advantages`` its advantages, so V-trace is GAE plus an off-policy
    correction. Computed in float64, returned as float32.

    Args:
      log_rhos: ``[T, B]`` log importance ratios ``log pi(a_t|x_t) - log mu(a_t|x_t)``
        of the target policy ``pi`` over the behaviour policy ``mu``.
      discounts: ``[T, B]`` discounts ``discount_t = gamma * (1 - terminated_t)``.
      rewards: ``[T, B]`` rewards ``r_t``.
      values: ``[T, B]`` value estimates ``V(x_t)``.
      bootstrap_value: ``[B]`` value estimate ``V(x_T)`` of the final state.
      rho_bar: truncation threshold for the ``rho_t`` weighting ``delta_t``;
        must be > 0.
      c_bar: truncation threshold for the trace coefficients ``c_t``; must be > 0.
      pg_rho_bar: truncation threshold for the policy-gradient importance
        weights; must be > 0 if given, defaults to `rho_bar`.
      lam: the trace lambda in ``[0, 1]``; 1 is the paper's eq. 1 as written.

    Returns:
      VTraceOutput(vs, pg_advantages, advantages), each ``[T, B]`` float32.

    Raises:
      ValueError: on a non-float or wrongly shaped argument, a clipping
        threshold that is not > 0, or `lam` outside ``[0, 1]``.
    """
    log_rho_t = _as_float_array("log_rhos", log_rhos, 2)  # [T, B]
    discount_t = _as_float_array("discounts", discounts, 2)  # [T, B]
    r_t = _as_float_array("rewards", rewards, 2)  # [T, B]
    v_tm1 = _as_float_array("values", values, 2)  # [T, B]
    bootstrap = _as_float_array("bootstrap_value", bootstrap_value, 1)  # [B]
    _check_same_shape("discounts", discount_t, log_rho_t.shape, "log_rhos")
    _check_same_shape("rewards", r_t, log_rho_t.shape, "log_rhos")
    _check_same_shape("values", v_tm1, log_rho_t.shape, "log_rhos")
    _check_bootstrap(bootstrap, log_rho_t.shape, "log_rhos")
    rho_bar = _check_positive("rho_bar", rho_bar)
    c_bar = _check_positive("c_bar", c_bar)
    pg_rho_bar = rho_bar if pg_rho_bar is None else _check_positive("pg_rho_bar", pg_rho_bar)
    lam = _check_unit_interval("lam", lam)

    rhos = np.exp(log_rho_t)  # [T, B]
    clipped_rhos = np.minimum(rho_bar, rhos)  # [T, B]
    cs = lam * np.minimum(c_bar, rhos)  # [T, B]

    # V(x_{t+1}): values shifted by one step, bootstrap appended.
    v_t = np.concatenate([v_tm1[1:], bootstrap[None]], axis=0)  # [T, B]
    deltas = clipped_rhos * (r_t + discount_t * v_t - v_tm1)  # [T, B], rho_t delta_t

    vs_minus_v = np.zeros_like(deltas)  # [T, B]
    acc = np.zeros_like(bootstrap)  # [B], v_{s+1} - V(x_{s+1})
    for s in reversed(range(r_t.shape[0])):
        acc = deltas[s] + discount_t[s] * cs[s] * acc
        vs_minus_v[s] = acc
    vs = vs_minus_v + v_tm1  # [T, B]

    # q_{s+1} = lam v_{s+1} + (1 - lam) V(x_{s+1}), with v_T = V(x_T).
    vs_tp1 = np.concatenate([vs[1:], bootstrap[None]], axis=0)  # [T, B]
    q_tp1 = lam * vs_tp1 + (1.0 - lam) * v_t  # [T, B]
    advantages = r_t + discount_t * q_tp1 - v_tm1  # [T, B]
    pg_rhos = np.minimum(pg_rho_bar, rhos)  # [T, B]
    return VTraceOutput(
        vs=vs.astype(np.float32),
        pg_advantages=(pg_rhos * advantages).astype(np.float32),
        advantages=advantages.astype(np.float32),
    )
