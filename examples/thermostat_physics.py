"""The thermostat building's physics: plain numpy, no zmq_rl, no gymnasium.

Shared by the simulator (:mod:`examples.thermostat_sim`), the learner-side
gymnasium env (:mod:`examples.thermostat_env`) and the raw-protocol actor
(:mod:`examples.raw_protocol_actor`), so all three run the same dynamics.

A room loses ``LOSS_PER_MINUTE`` of its indoor-outdoor temperature difference per
minute and gains ``HEAT_PER_KW_MINUTE`` degrees per kW of heating. Each hour (an
episode) starts with new weather, a new target and a random temperature; the
reward per minute is ``-|temp - target|``.
"""

from __future__ import annotations

import numpy as np

POWER_LEVELS_KW = (0.0, 1.0, 2.0, 3.0)
"""The heater's settings; the policy picks one per room per minute."""
EPISODE_MINUTES = 60
"""Ticks per episode; an episode ends by truncation, never by termination."""
LOSS_PER_MINUTE = 0.1
"""Fraction of the indoor-outdoor temperature difference lost per minute."""
HEAT_PER_KW_MINUTE = 1.0
"""Degrees Celsius one kW of heating adds per minute."""
OBS_LIMIT = 10.0
"""Observations are clipped to [-OBS_LIMIT, OBS_LIMIT]."""


class Room:
    """One room: an indoor temperature, a target, the outside temperature."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.reset()

    def reset(self) -> None:
        """Start a new hour: new weather, new target, a random starting temperature."""
        self.outside = float(self.rng.uniform(0.0, 15.0))
        self.target = float(self.rng.uniform(18.0, 23.0))
        self.temp = float(self.rng.uniform(10.0, 25.0))
        self.minute = 0

    def observe(self) -> np.ndarray:
        """``[(temp - target) / 5, (outside - target) / 10]`` as float32."""
        obs = np.array(
            [(self.temp - self.target) / 5.0, (self.outside - self.target) / 10.0], np.float32
        )
        return np.clip(obs, -OBS_LIMIT, OBS_LIMIT)

    def advance(self, power_kw: float) -> float:
        """One minute of physics; returns the reward ``-|temp - target|``."""
        self.temp += LOSS_PER_MINUTE * (self.outside - self.temp) + HEAT_PER_KW_MINUTE * power_kw
        self.minute += 1
        return -abs(self.temp - self.target)

    @property
    def hour_over(self) -> bool:
        """Whether this room's episode has reached its time limit."""
        return self.minute >= EPISODE_MINUTES


class Building:
    """The simulator: rooms and a clock. Its caller decides when time moves on."""

    def __init__(self, num_rooms: int, seed: int) -> None:
        seeds = np.random.SeedSequence(seed).spawn(num_rooms)
        self.rooms = [Room(np.random.default_rng(s)) for s in seeds]
        self.clock = 0  # minutes since the simulation started

    def observe(self) -> np.ndarray:
        """``[num_rooms, 2]`` observations."""
        return np.stack([room.observe() for room in self.rooms])

    def tick(self, power_kw: np.ndarray) -> np.ndarray:
        """Advance every room one minute with the given heater powers; the rewards."""
        self.clock += 1
        return np.array(
            [room.advance(float(p)) for room, p in zip(self.rooms, power_kw, strict=True)],
            np.float32,
        )
