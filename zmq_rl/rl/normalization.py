"""Running statistics for observation and reward normalisation (pure numpy).

Observation statistics live in the policy (:mod:`zmq_rl.rl.policy`) as buffers so they
travel with the weights; reward scaling is learner-only (:class:`RewardScaler`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np


def merge_moments(
    mean: np.ndarray,
    var: np.ndarray,
    count: float,
    batch_mean: np.ndarray,
    batch_var: np.ndarray,
    batch_count: float,
) -> tuple[np.ndarray, np.ndarray, float]:
    """Combine two (mean, population variance, count) summaries into one.

    Chan, Golub & LeVeque (1979), the parallel form of Welford's algorithm:
    ``delta = m_b - m_a``, ``m = m_a + delta * n_b / n``,
    ``M2 = M2_a + M2_b + delta^2 * n_a * n_b / n``, ``var = M2 / n``.
    """
    total = count + batch_count
    if total == 0:
        return mean, var, 0.0
    delta = batch_mean - mean
    new_mean = mean + delta * (batch_count / total)
    m2 = var * count + batch_var * batch_count + np.square(delta) * count * batch_count / total
    return new_mean, m2 / total, float(total)


class RewardScaler:
    """Divide rewards by a running std of the discounted return (as SB3's VecNormalize).

    Each slot keeps ``R_t = gamma * R_{t-1} + r_t`` (reset after an episode ends);
    the variance of all ``R_t`` seen so far scales the rewards, so value targets
    stay O(1) whatever the env's reward magnitude. Scaled rewards are clipped to
    ``[-clip, clip]``. Episode returns for reports are taken before scaling.
    """

    def __init__(self, gamma: float, clip: float = 10.0, eps: float = 1e-8) -> None:
        self.gamma = float(gamma)
        self.clip = float(clip)
        self.eps = float(eps)
        self.mean = np.zeros(())
        self.var = np.ones(())
        self.count = 0.0
        self.returns: dict[Hashable, float] = {}

    def scale(
        self, rewards: np.ndarray, dones: np.ndarray, slots: Sequence[Hashable]
    ) -> np.ndarray:
        """Update the statistics with ``rewards [T, B]`` and return them scaled."""
        self.observe(rewards, dones, slots)
        return self.apply(rewards)

    def observe(
        self,
        rewards: np.ndarray,
        dones: np.ndarray,
        slots: Sequence[Hashable],
        valid: np.ndarray | None = None,
    ) -> None:
        """Fold the discounted returns of ``rewards [T, B]`` into the statistics.
        ``valid`` (``[T, B]`` bool; None: all rows): rows that are False (a
        multi-agent slot without a live agent) are no step: skipped, and not counted."""
        T, B = rewards.shape
        if T * B == 0:
            return
        discounted = np.empty((T, B), np.float64)
        for b, key in enumerate(slots):
            running = self.returns.get(key, 0.0)
            for t in range(T):
                if valid is not None and not valid[t, b]:
                    continue
                running = self.gamma * running + float(rewards[t, b])
                discounted[t, b] = running
                if dones[t, b]:
                    running = 0.0
            self.returns[key] = running
        if valid is not None:
            discounted = discounted[valid]
            if discounted.size == 0:
                return
        self.mean, self.var, self.count = merge_moments(
            self.mean, self.var, self.count, discounted.mean(), discounted.var(), discounted.size
        )

    def apply(self, rewards: np.ndarray) -> np.ndarray:
        """``rewards`` divided by the return's running std, clipped, as float32."""
        std = np.sqrt(self.var + self.eps)
        return np.clip(rewards / std, -self.clip, self.clip).astype(np.float32)

    def state(self) -> dict:
        """JSON-able state (for checkpoints): the statistics, not the slots' running
        returns (a resumed run's slots start new streams, docs/protocol.md 5.6)."""
        return {"var": float(self.var), "mean": float(self.mean), "count": self.count}

    def load(self, state: dict) -> None:
        """Restore :meth:`state` output (an older checkpoint's ``returns`` are ignored);
        every slot's running return starts from 0."""
        self.mean = np.asarray(state["mean"])
        self.var = np.asarray(state["var"])
        self.count = float(state["count"])
        self.returns = {}
