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
* ``MaskedBandit-v0``: PettingZoo's ``action_mask`` convention on a single-agent env:
  ``{"action_mask": MultiBinary(4), "cue": Box(-1, 1, (2,))}`` observations and
  ``Discrete(4)`` actions. The rewarded action is ``2 * (cue[0] > 0) + (cue[1] > 0)``;
  the mask always allows it, and each other action with probability 1/2. Taking a
  masked action is illegal: the env appends a line to the file ``violations`` (a
  constructor argument, so a test can see it across processes) and raises. 20 steps:
  a random *legal* policy gets ~9.4 (``20 * E[1 / (1 + Binomial(3, 1/2))]``), a good
  one 20. (With MultiDiscrete actions, ``multi=True``: ``MultiDiscrete([2, 2])``, the
  two bits of the same target, and a mask of 2 + 2 entries, one block per bit.)
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


class MaskedBanditEnv(gym.Env):
    """See the module docstring."""

    def __init__(self, violations: str = "", multi: bool = False) -> None:
        self.violations = violations
        self.multi = bool(multi)
        self.observation_space = gym.spaces.Dict(
            {
                "action_mask": gym.spaces.MultiBinary(4),
                "cue": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
            }
        )
        self.action_space = (
            gym.spaces.MultiDiscrete([2, 2]) if self.multi else gym.spaces.Discrete(4)
        )
        self.t = 0
        self.obs: dict = {}

    def target(self) -> int:
        """The rewarded action in the current observation (Discrete numbering)."""
        cue = self.obs["cue"]
        return 2 * int(cue[0] > 0) + int(cue[1] > 0)

    def _draw(self) -> dict:
        rng = self.np_random
        cue = rng.uniform(-1.0, 1.0, 2).astype(np.float32)
        target = 2 * int(cue[0] > 0) + int(cue[1] > 0)
        if self.multi:  # one block per bit: the target's bit, the other one half the time
            bits = (target >> 1, target & 1)
            mask = np.array([[b == v or rng.random() < 0.5 for v in (0, 1)] for b in bits])
        else:
            mask = (rng.random(4) < 0.5) | (np.arange(4) == target)
        self.obs = {"action_mask": mask.reshape(4).astype(np.int8), "cue": cue}
        return self.obs

    def _legal(self, action) -> bool:
        mask = self.obs["action_mask"]
        if self.multi:
            a = np.asarray(action).reshape(2)
            return bool(mask[int(a[0])] and mask[2 + int(a[1])])
        return bool(mask[int(action)])

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        return self._draw(), {}

    def step(self, action):
        if not self._legal(action):
            if self.violations:
                with open(self.violations, "a") as out:
                    out.write(f"{action} under mask {self.obs['action_mask'].tolist()}\n")
            raise RuntimeError(f"masked action {action} taken (mask {self.obs['action_mask']})")
        if self.multi:
            a = np.asarray(action).reshape(2)
            taken = 2 * int(a[0]) + int(a[1])
        else:
            taken = int(action)
        reward = float(taken == self.target())
        self.t += 1
        return self._draw(), reward, False, self.t >= EPISODE_LENGTH, {}


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
    ("MaskedBandit-v0", MaskedBanditEnv),
    ("TextObs-v0", TextObsEnv),
):
    if _id not in gym.registry:
        gym.register(_id, entry_point=_entry, disable_env_checker=True)
