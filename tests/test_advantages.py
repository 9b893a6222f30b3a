"""Tests for zmq_rl.rl.advantages against independent reference implementations.

The references below deliberately avoid the backward recursions used by the
module: GAE is an explicit double sum over future TD errors, V-trace is the
sum-of-products formula of IMPALA eq. 1, and n-step returns are summed forward.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zmq_rl.rl.advantages import GaeOutput, VTraceOutput, gae, vtrace

RTOL = 1e-5
ATOL = 1e-4


# --------------------------------------------------------------------------- references


def ref_gae(rewards, values, bootstrap, discounts, lam):
    """A_t = sum_{k>=t} (prod_{j=t}^{k-1} discount_j * lam) * delta_k, per env, forward sums."""
    T, B = rewards.shape
    adv = np.zeros((T, B), dtype=np.float64)
    for b in range(B):
        next_values = [float(values[t + 1, b]) for t in range(T - 1)] + [float(bootstrap[b])]
        deltas = [
            float(rewards[t, b]) + float(discounts[t, b]) * next_values[t] - float(values[t, b])
            for t in range(T)
        ]
        for t in range(T):
            total = 0.0
            for k in range(t, T):
                weight = 1.0
                for j in range(t, k):
                    weight *= float(discounts[j, b]) * lam
                total += weight * deltas[k]
            adv[t, b] = total
    return adv, adv + values.astype(np.float64)


def ref_nstep_returns(rewards, bootstrap, discounts):
    """G_t = sum_{k=t}^{T-1} (prod_{j=t}^{k-1} d_j) r_k + (prod_{j=t}^{T-1} d_j) V(x_T)."""
    T, B = rewards.shape
    out = np.zeros((T, B), dtype=np.float64)
    for b in range(B):
        for t in range(T):
            g, scale = 0.0, 1.0
            for k in range(t, T):
                g += scale * float(rewards[k, b])
                scale *= float(discounts[k, b])
            out[t, b] = g + scale * float(bootstrap[b])
    return out


def ref_vtrace(
    log_rhos, discounts, rewards, values, bootstrap, rho_bar, c_bar, pg_rho_bar=None, lam=1.0
):
    """IMPALA eq. 1 as an explicit sum of products (no recursion), with c_i = lam min(c_bar, rho_i)
    and the policy-gradient bootstrap lam v_{s+1} + (1 - lam) V(x_{s+1})."""
    if pg_rho_bar is None:
        pg_rho_bar = rho_bar
    T, B = rewards.shape
    vs = np.zeros((T, B), dtype=np.float64)
    pg = np.zeros((T, B), dtype=np.float64)
    for b in range(B):
        v = [float(values[t, b]) for t in range(T)] + [float(bootstrap[b])]
        ratio = [math.exp(float(log_rhos[t, b])) for t in range(T)]
        rho = [min(rho_bar, x) for x in ratio]
        c = [lam * min(c_bar, x) for x in ratio]
        d = [float(discounts[t, b]) for t in range(T)]
        r = [float(rewards[t, b]) for t in range(T)]
        for s in range(T):
            total = 0.0
            for t in range(s, T):
                prod = 1.0
                for i in range(s, t):
                    prod *= d[i] * c[i]
                total += prod * rho[t] * (r[t] + d[t] * v[t + 1] - v[t])
            vs[s, b] = v[s] + total
        for s in range(T):
            v_next = lam * vs[s + 1, b] + (1 - lam) * v[s + 1] if s + 1 < T else v[T]
            pg[s, b] = min(pg_rho_bar, ratio[s]) * (r[s] + d[s] * v_next - v[s])
    return vs, pg


# --------------------------------------------------------------------------- data


def make_batch(seed, T, B, *, p_term=0.2, log_rho_scale=0.5):
    rng = np.random.default_rng(seed)
    gamma = rng.uniform(0.8, 0.99)
    terminated = rng.random((T, B)) < p_term
    return {
        "rewards": rng.normal(size=(T, B)).astype(np.float32),
        "values": rng.normal(size=(T, B)).astype(np.float32),
        "bootstrap_value": rng.normal(size=(B,)).astype(np.float32),
        "discounts": (gamma * (1.0 - terminated)).astype(np.float32),
        "log_rhos": (log_rho_scale * rng.normal(size=(T, B))).astype(np.float32),
    }


shapes = {
    "seed": st.integers(0, 2**31 - 1),
    "T": st.integers(1, 12),
    "B": st.integers(1, 5),
}


def _gae(d, lam):
    return gae(d["rewards"], d["values"], d["bootstrap_value"], d["discounts"], lam)


def _vtrace(d, **kw):
    return vtrace(
        d["log_rhos"], d["discounts"], d["rewards"], d["values"], d["bootstrap_value"], **kw
    )


def _ref_vtrace(d, rho_bar=1.0, c_bar=1.0, pg_rho_bar=None, lam=1.0):
    return ref_vtrace(
        d["log_rhos"],
        d["discounts"],
        d["rewards"],
        d["values"],
        d["bootstrap_value"],
        rho_bar,
        c_bar,
        pg_rho_bar,
        lam,
    )


# --------------------------------------------------------------------------- hand-computed


def test_gae_hand_computed():
    # T=3, B=1; discount 0 at t=1 ends the episode there.
    # delta = [1 + .9*1 - .5, 2 + 0*1.5 - 1, 3 + .9*2 - 1.5] = [1.4, 1.0, 3.3]
    # A_2 = 3.3; A_1 = 1.0 + 0*.5*3.3 = 1.0; A_0 = 1.4 + .9*.5*1.0 = 1.85
    out = gae(
        rewards=np.array([[1.0], [2.0], [3.0]], np.float32),
        values=np.array([[0.5], [1.0], [1.5]], np.float32),
        bootstrap_value=np.array([2.0], np.float32),
        discounts=np.array([[0.9], [0.0], [0.9]], np.float32),
        lam=0.5,
    )
    assert isinstance(out, GaeOutput)
    np.testing.assert_allclose(out.advantages, [[1.85], [1.0], [3.3]], rtol=1e-6)
    np.testing.assert_allclose(out.returns, [[2.35], [2.0], [4.8]], rtol=1e-6)


def test_gae_hand_computed_two_envs_independent():
    # Env 1 is env 0 with rewards doubled and its own bootstrap; columns must not mix.
    rewards = np.array([[1.0, 2.0], [2.0, 4.0]], np.float32)
    values = np.zeros((2, 2), np.float32)
    out = gae(
        rewards, values, np.array([0.0, 10.0], np.float32), np.full((2, 2), 0.5, np.float32), 1.0
    )
    # env 0: G_1 = 2, G_0 = 1 + .5*2 = 2 ; env 1: G_1 = 4 + .5*10 = 9, G_0 = 2 + .5*9 = 6.5
    np.testing.assert_allclose(out.returns, [[2.0, 6.5], [2.0, 9.0]], rtol=1e-6)


def hand_vtrace(**kw) -> VTraceOutput:
    """V-trace of the hand-computed three-step example (ratios 2, .5, 1; c_bar .8)."""
    return vtrace(
        log_rhos=np.log(np.array([[2.0], [0.5], [1.0]], np.float32)),
        discounts=np.full((3, 1), 0.9, np.float32),
        rewards=np.array([[1.0], [2.0], [3.0]], np.float32),
        values=np.array([[0.5], [1.0], [1.5]], np.float32),
        bootstrap_value=np.array([2.0], np.float32),
        rho_bar=1.0,
        c_bar=0.8,
        **kw,
    )


def test_vtrace_hand_computed():
    # ratios [2, .5, 1]; rho_bar=1, c_bar=.8 -> rho=[1, .5, 1], c=[.8, .5, .8]
    # delta = [1 + .9*1 - .5, 2 + .9*1.5 - 1, 3 + .9*2 - 1.5] = [1.4, 2.35, 3.3]
    # vs_2 - V_2 = 3.3
    # vs_1 - V_1 = .5*2.35 + .9*.5*3.3 = 2.66
    # vs_0 - V_0 = 1*1.4 + .9*.8*2.66 = 3.3152
    # pg: [1*(1 + .9*3.66 - .5), .5*(2 + .9*4.8 - 1), 1*(3 + .9*2 - 1.5)] = [3.794, 2.66, 3.3]
    out = hand_vtrace()
    assert isinstance(out, VTraceOutput)
    np.testing.assert_allclose(out.vs, [[3.8152], [3.66], [4.8]], rtol=1e-6)
    np.testing.assert_allclose(out.pg_advantages, [[3.794], [2.66], [3.3]], rtol=1e-6)
    np.testing.assert_allclose(out.advantages, [[3.794], [5.32], [3.3]], rtol=1e-6)


def test_vtrace_hand_computed_with_lambda():
    # Same data as above with lam = .5: c = .5 * [.8, .5, .8] = [.4, .25, .4]
    # vs_2 - V_2 = 3.3
    # vs_1 - V_1 = .5*2.35 + .9*.25*3.3 = 1.9175
    # vs_0 - V_0 = 1*1.4 + .9*.4*1.9175 = 2.0903
    # q_1 = .5*2.9175 + .5*1 = 1.95875, q_2 = .5*4.8 + .5*1.5 = 3.15, q_3 = V(x_3) = 2
    # pg: [1*(1 + .9*1.95875 - .5), .5*(2 + .9*3.15 - 1), 1*(3 + .9*2 - 1.5)]
    out = hand_vtrace(lam=0.5)
    np.testing.assert_allclose(out.vs, [[2.5903], [2.9175], [4.8]], rtol=1e-6)
    np.testing.assert_allclose(
        out.pg_advantages, [[0.5 + 0.9 * 1.95875], [0.5 * (1 + 0.9 * 3.15)], [3.3]], rtol=1e-6
    )


# --------------------------------------------------------------------------- property tests


@settings(max_examples=60, deadline=None)
@given(**shapes, lam=st.floats(0.0, 1.0))
def test_gae_matches_double_sum_reference(seed, T, B, lam):
    d = make_batch(seed, T, B)
    out = _gae(d, lam)
    adv, ret = ref_gae(d["rewards"], d["values"], d["bootstrap_value"], d["discounts"], lam)
    np.testing.assert_allclose(out.advantages, adv, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(out.returns, ret, rtol=RTOL, atol=ATOL)


@settings(max_examples=40, deadline=None)
@given(**shapes)
def test_gae_lam1_is_nstep_return_to_bootstrap(seed, T, B):
    d = make_batch(seed, T, B)
    out = _gae(d, 1.0)
    expected = ref_nstep_returns(d["rewards"], d["bootstrap_value"], d["discounts"])
    np.testing.assert_allclose(out.returns, expected, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(out.advantages, expected - d["values"], rtol=RTOL, atol=ATOL)


@settings(max_examples=40, deadline=None)
@given(**shapes)
def test_gae_lam0_is_one_step_td_error(seed, T, B):
    d = make_batch(seed, T, B)
    out = _gae(d, 0.0)
    next_v = np.concatenate([d["values"][1:], d["bootstrap_value"][None]], axis=0)
    td = d["rewards"] + d["discounts"] * next_v - d["values"]
    np.testing.assert_allclose(out.advantages, td, rtol=RTOL, atol=ATOL)


@settings(max_examples=60, deadline=None)
@given(
    **shapes,
    rho_bar=st.floats(0.1, 3.0),
    c_bar=st.floats(0.1, 3.0),
    pg_rho_bar=st.none() | st.floats(0.1, 3.0),
    lam=st.sampled_from([1.0, 0.0]) | st.floats(0.0, 1.0),
)
def test_vtrace_matches_eq1_reference(seed, T, B, rho_bar, c_bar, pg_rho_bar, lam):
    d = make_batch(seed, T, B)
    out = _vtrace(d, rho_bar=rho_bar, c_bar=c_bar, pg_rho_bar=pg_rho_bar, lam=lam)
    vs, pg = _ref_vtrace(d, rho_bar, c_bar, pg_rho_bar, lam)
    np.testing.assert_allclose(out.vs, vs, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(out.pg_advantages, pg, rtol=RTOL, atol=ATOL)
    # The unweighted advantages are the weighted ones divided by the clipped weight.
    weights = np.minimum(rho_bar if pg_rho_bar is None else pg_rho_bar, np.exp(d["log_rhos"]))
    np.testing.assert_allclose(out.advantages * weights, pg, rtol=RTOL, atol=ATOL)


@settings(max_examples=40, deadline=None)
@given(**shapes, clip=st.floats(1.0, 5.0), lam=st.sampled_from([1.0, 0.0]) | st.floats(0.0, 1.0))
def test_vtrace_on_policy_equals_gae(seed, T, B, clip, lam):
    """On-policy, V-trace with trace lambda is GAE with the same lambda, in both outputs."""
    d = make_batch(seed, T, B)
    d["log_rhos"] = np.zeros_like(d["log_rhos"])
    out = _vtrace(d, rho_bar=clip, c_bar=clip, lam=lam)
    g = _gae(d, lam)
    np.testing.assert_allclose(out.vs, g.returns, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(out.pg_advantages, g.advantages, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(out.advantages, g.advantages, rtol=RTOL, atol=ATOL)


# --------------------------------------------------------------------------- targeted cases


def test_episode_boundary_stops_propagation():
    T, B = 6, 2
    d = make_batch(0, T, B, p_term=0.0)
    d["discounts"][2] = 0.0  # episode ends after step 2
    base_gae = _gae(d, 0.95)
    base_vt = _vtrace(d, rho_bar=2.0, c_bar=2.0)
    # Perturb everything strictly after the boundary, including the bootstrap.
    p = {k: v.copy() for k, v in d.items()}
    p["rewards"][3:] += 5.0
    p["values"][3:] -= 3.0
    p["bootstrap_value"] += 7.0
    p["log_rhos"][3:] += 0.3
    pert_gae = _gae(p, 0.95)
    pert_vt = _vtrace(p, rho_bar=2.0, c_bar=2.0)
    for a, b in [
        (base_gae.advantages, pert_gae.advantages),
        (base_gae.returns, pert_gae.returns),
        (base_vt.vs, pert_vt.vs),
        (base_vt.pg_advantages, pert_vt.pg_advantages),
    ]:
        np.testing.assert_array_equal(a[:3], b[:3])
        assert not np.allclose(a[3:], b[3:])
    # At the terminal step the advantage is just r - V.
    np.testing.assert_allclose(
        base_gae.advantages[2], d["rewards"][2] - d["values"][2], rtol=1e-6, atol=1e-6
    )


def test_bootstrap_only_affects_through_last_discount():
    d = make_batch(1, 4, 3, p_term=0.0)
    out = _gae(d, 1.0)
    p = dict(d, bootstrap_value=d["bootstrap_value"] + 1.0)
    out2 = _gae(p, 1.0)
    # dG_t / dV(x_T) = prod_{j=t}^{T-1} discount_j
    expected = np.flip(np.cumprod(np.flip(d["discounts"].astype(np.float64), 0), 0), 0)
    np.testing.assert_allclose(out2.returns - out.returns, expected, rtol=1e-4, atol=1e-5)


def test_vtrace_clipping_bites():
    d = make_batch(3, 8, 4, p_term=0.0)
    d["log_rhos"] = np.abs(d["log_rhos"]) + 1.0  # all ratios > e
    clipped = _vtrace(d, rho_bar=1.0, c_bar=1.0)
    unclipped = _vtrace(d, rho_bar=1e6, c_bar=1e6)
    assert not np.allclose(clipped.vs, unclipped.vs, rtol=1e-3)
    assert not np.allclose(clipped.pg_advantages, unclipped.pg_advantages, rtol=1e-3)
    vs, pg = _ref_vtrace(d, 1.0, 1.0)
    np.testing.assert_allclose(clipped.vs, vs, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(clipped.pg_advantages, pg, rtol=RTOL, atol=ATOL)
    # Unclipped also matches the reference at the (non-binding) large thresholds.
    vs_u, pg_u = _ref_vtrace(d, 1e6, 1e6)
    np.testing.assert_allclose(unclipped.vs, vs_u, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(unclipped.pg_advantages, pg_u, rtol=RTOL, atol=ATOL)
    # With all ratios above both thresholds, clipping makes it on-policy-like:
    # rho = c = 1 everywhere, so vs equals the lam=1 GAE returns.
    np.testing.assert_allclose(clipped.vs, _gae(d, 1.0).returns, rtol=RTOL, atol=ATOL)


def test_vtrace_rho_and_c_clipped_separately():
    d = make_batch(4, 6, 3, p_term=0.0)
    d["log_rhos"] = np.abs(d["log_rhos"]) + 0.5  # all ratios > 1.6
    only_c = _vtrace(d, rho_bar=1e6, c_bar=1.0)
    only_rho = _vtrace(d, rho_bar=1.0, c_bar=1e6)
    assert not np.allclose(only_c.vs, only_rho.vs, rtol=1e-3)
    for rho_bar, c_bar, out in [(1e6, 1.0, only_c), (1.0, 1e6, only_rho)]:
        vs, pg = _ref_vtrace(d, rho_bar, c_bar)
        np.testing.assert_allclose(out.vs, vs, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(out.pg_advantages, pg, rtol=RTOL, atol=ATOL)
    # c only enters the trace through later steps: the last step is unaffected by c_bar.
    np.testing.assert_allclose(only_c.vs[-1], _vtrace(d, rho_bar=1e6, c_bar=1e6).vs[-1], rtol=1e-6)


def test_vtrace_pg_rho_bar_used_when_given():
    d = make_batch(5, 7, 3)
    d["log_rhos"] = np.abs(d["log_rhos"]) + 0.5  # all ratios > 1.6
    default = _vtrace(d, rho_bar=1.0, c_bar=1.0)
    explicit_same = _vtrace(d, rho_bar=1.0, c_bar=1.0, pg_rho_bar=1.0)
    with_pg = _vtrace(d, rho_bar=1.0, c_bar=1.0, pg_rho_bar=1.5)
    np.testing.assert_array_equal(default.pg_advantages, explicit_same.pg_advantages)
    # pg_rho_bar only changes the policy-gradient advantages, not vs.
    np.testing.assert_array_equal(with_pg.vs, default.vs)
    assert not np.allclose(with_pg.pg_advantages, default.pg_advantages, rtol=1e-3)
    _, pg = _ref_vtrace(d, 1.0, 1.0, 1.5)
    np.testing.assert_allclose(with_pg.pg_advantages, pg, rtol=RTOL, atol=ATOL)
    # Every ratio exceeds both thresholds, so pg advantages scale by exactly 1.5.
    np.testing.assert_allclose(with_pg.pg_advantages, 1.5 * default.pg_advantages, rtol=1e-5)


# --------------------------------------------------------------------------- dtypes / inputs


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_output_dtype_is_float32(dtype):
    d = {k: v.astype(dtype) for k, v in make_batch(6, 5, 2).items()}
    g = _gae(d, 0.9)
    v = _vtrace(d)
    for arr in (*g, *v):
        assert arr.dtype == np.float32
        assert arr.shape == (5, 2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_inputs_not_mutated(dtype):
    d = {k: v.astype(dtype) for k, v in make_batch(7, 5, 3, p_term=0.3).items()}
    before = {k: v.copy() for k, v in d.items()}
    _gae(d, 0.9)
    _vtrace(d, rho_bar=0.8, c_bar=0.9, pg_rho_bar=0.7)
    for k, arr in d.items():
        np.testing.assert_array_equal(arr, before[k], err_msg=k)


def test_accepts_lists():
    out = gae([[1.0], [1.0]], [[0.0], [0.0]], [0.0], [[1.0], [1.0]], 1.0)
    np.testing.assert_allclose(out.returns, [[2.0], [1.0]])


# --------------------------------------------------------------------------- validation


GAE_ARGS = ("rewards", "values", "bootstrap_value", "discounts")
VTRACE_ARGS = ("log_rhos", "discounts", "rewards", "values", "bootstrap_value")


def _bad_shape(name, arr):
    if name == "bootstrap_value":
        return np.zeros(arr.shape[0] + 1, np.float32)
    return np.zeros((arr.shape[0] + 1, arr.shape[1]), np.float32)


@pytest.mark.parametrize("name", GAE_ARGS)
def test_gae_shape_mismatch_names_argument(name):
    d = make_batch(8, 4, 3)
    args = {k: d[k] for k in GAE_ARGS}
    args[name] = _bad_shape(name, args[name])
    with pytest.raises(ValueError, match=f"`{name}`"):
        gae(**args, lam=0.9)


@pytest.mark.parametrize("name", VTRACE_ARGS)
def test_vtrace_shape_mismatch_names_argument(name):
    d = make_batch(8, 4, 3)
    args = {k: d[k] for k in VTRACE_ARGS}
    args[name] = _bad_shape(name, args[name])
    with pytest.raises(ValueError, match=f"`{name}`"):
        vtrace(**args)


@pytest.mark.parametrize("name", ("rewards", "bootstrap_value"))
def test_wrong_rank_names_argument(name):
    d = make_batch(8, 4, 3)
    args = {k: d[k] for k in GAE_ARGS}
    args[name] = args[name][..., None]
    with pytest.raises(ValueError, match=f"`{name}`.*shape"):
        gae(**args, lam=0.9)


def test_bootstrap_with_time_axis_rejected():
    # A [T, B]-shaped bootstrap (a common off-by-one) must not broadcast silently.
    d = make_batch(8, 3, 3)
    with pytest.raises(ValueError, match="`bootstrap_value`"):
        gae(d["rewards"], d["values"], d["values"], d["discounts"], 0.9)


def test_integer_dtype_rejected():
    d = make_batch(8, 3, 2)
    with pytest.raises(ValueError, match="`rewards`.*dtype"):
        gae(d["rewards"].astype(np.int64), d["values"], d["bootstrap_value"], d["discounts"], 0.9)


@pytest.mark.parametrize("lam", [-0.1, 1.1, float("nan")])
def test_bad_lam_names_argument(lam):
    d = make_batch(8, 3, 2)
    with pytest.raises(ValueError, match="`lam`"):
        _gae(d, lam)
    with pytest.raises(ValueError, match="`lam`"):
        _vtrace(d, lam=lam)


@pytest.mark.parametrize("name", ["rho_bar", "c_bar", "pg_rho_bar"])
@pytest.mark.parametrize("value", [0.0, -1.0, float("nan")])
def test_vtrace_nonpositive_threshold_names_argument(name, value):
    d = make_batch(9, 3, 2)
    with pytest.raises(ValueError, match=f"`{name}`"):
        _vtrace(d, **{name: value})
