"""A simulator that waits: :class:`StepDelay` makes every step of an env take at least
``seconds`` of wall time without using the CPU, as a physics engine at a fixed tick, a
game server or a remote service does. Use it to see what a fleet buys for your own
simulator's pace before you have it at hand::

    zmq-rl run --env CartPole-v1 --actors 16 --wrapper 'zmq_rl.envs:StepDelay(seconds=0.01)'

(every actor's envs and the evaluator's wait 10 ms a step: a 100 Hz simulator;
docs/benchmarks.md section 28 measures fleets of them).
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym

__all__ = ["StepDelay"]


class StepDelay(gym.Wrapper):
    """Each ``step`` lasts at least ``seconds`` (it sleeps what the env's own step did
    not take); ``reset`` is not delayed. The sleep releases the GIL, so envs stepped in
    threads (:class:`~zmq_rl.envs.stepping.EnvStepper`) wait together."""

    def __init__(self, env: gym.Env, seconds: float = 0.01) -> None:
        if not 0.0 <= float(seconds) < 3600.0:
            raise ValueError(f"StepDelay: seconds={seconds!r}: must be in [0, 3600)")
        super().__init__(env)
        self.seconds = float(seconds)

    def step(self, action: Any) -> Any:
        """The env's step, then a sleep for what is left of ``seconds``."""
        start = time.perf_counter()
        out = self.env.step(action)
        left = self.seconds - (time.perf_counter() - start)
        if left > 0:
            time.sleep(left)
        return out
