"""Small gymnasium envs with structured spaces, for tests that train through real
processes. Importable by id (``"tests.space_envs:DictObs-v0"``, ...) from any process
whose working directory is the repository root.

* ``DictObs-v0``: a contextual bandit with a Dict observation
  ``{"bits": MultiBinary(2), "mode": Discrete(3, start=1), "pos": Box(-1, 1, (2,))}``
  and ``Discrete(3)`` actions. The rewarded action is
  ``(mode - 1 + (pos[0] > 0)) % 3``: it needs both the one-hot part and the box
  part (``bits`` is noise that must travel and be ignored). 20 steps per episode,
  reward 1 for the right action: a random policy gets ~6.7, a good one 20.
* ``MultiDiscreteAct-v0``: ``Box(-1, 1, (2,))`` observations and
  ``MultiDiscrete([3, 2], start=[1, 0])`` actions; component 0 is rewarded (0.5)
  for naming the third of ``[-1, 1]`` that ``obs[0]`` falls in (as 1, 2, 3: the
  ``start`` offset must reach the env), component 1 (0.5) for the sign of
  ``obs[1]``. 20 steps: a random policy gets ~8.3, a good one 20.
* ``TextObs-v0``: a ``Text`` observation, which zmq_rl does not support (for the
  one-line refusal of the CLIs).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

EPISODE_LENGTH = 20


class DictObsEnv(gym.Env):
    """See the module docstring."""

    observation_space = gym.spaces.Dict(
        {
            "bits": gym.spaces.MultiBinary(2),
            "mode": gym.spaces.Discrete(3, start=1),
            "pos": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
        }
    )
    action_space = gym.spaces.Discrete(3)

    def __init__(self) -> None:
        self.t = 0
        self.obs: dict = {}

    def _draw(self) -> dict:
        rng = self.np_random
        self.obs = {
            "bits": rng.integers(0, 2, 2).astype(np.int8),
            "mode": int(rng.integers(1, 4)),
            "pos": rng.uniform(-1.0, 1.0, 2).astype(np.float32),
        }
        return self.obs

    def target(self) -> int:
        """The rewarded action in the current observation."""
        return (self.obs["mode"] - 1 + int(self.obs["pos"][0] > 0)) % 3

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        return self._draw(), {}

    def step(self, action):
        reward = float(int(action) == self.target())
        self.t += 1
        # Truncated, not terminated: the final (Dict) observation travels too.
        return self._draw(), reward, False, self.t >= EPISODE_LENGTH, {}


class MultiDiscreteActEnv(gym.Env):
    """See the module docstring."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.MultiDiscrete([3, 2], start=[1, 0])

    def __init__(self) -> None:
        self.t = 0
        self.obs = np.zeros(2, np.float32)

    def _draw(self) -> np.ndarray:
        self.obs = self.np_random.uniform(-1.0, 1.0, 2).astype(np.float32)
        return self.obs

    def target(self) -> tuple[int, int]:
        """The rewarded (component 0, component 1) in the current observation."""
        third = 1 + int(np.digitize(self.obs[0], [-1.0 / 3.0, 1.0 / 3.0]))
        return third, int(self.obs[1] > 0)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        return self._draw(), {}

    def step(self, action):
        action = np.asarray(action)
        if not self.action_space.contains(action.astype(self.action_space.dtype)):
            raise ValueError(f"action {action!r} is not in {self.action_space}")
        first, second = self.target()
        reward = 0.5 * float(action[0] == first) + 0.5 * float(action[1] == second)
        self.t += 1
        return self._draw(), reward, self.t >= EPISODE_LENGTH, False, {}


class TextObsEnv(gym.Env):
    """A space zmq_rl refuses."""

    observation_space = gym.spaces.Text(8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        return "hello", {}

    def step(self, action):
        return "hello", 0.0, True, False, {}


for _id, _entry in (
    ("DictObs-v0", DictObsEnv),
    ("MultiDiscreteAct-v0", MultiDiscreteActEnv),
    ("TextObs-v0", TextObsEnv),
):
    if _id not in gym.registry:
        gym.register(_id, entry_point=_entry, disable_env_checker=True)
