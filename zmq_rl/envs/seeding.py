"""Seeds for env instances, shared by the actors and the learner's evaluation."""

from __future__ import annotations

import numpy as np

__all__ = ["env_seeds"]


def env_seeds(seed: int, num_envs: int) -> list[int]:
    """Independent reset seeds for ``num_envs`` env instances derived from one seed
    (``numpy.random.SeedSequence.spawn``), so no two slots replay one episode stream."""
    return [int(s.generate_state(1)[0]) for s in np.random.SeedSequence(seed).spawn(num_envs)]
