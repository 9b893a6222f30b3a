"""Delivery robots in a corridor: the dynamics shared by the simulator and its env.

A *floor* is a corridor of :data:`CELLS` cells with up to :data:`ROBOTS` robots.
Each robot starts somewhere with a parcel for a target cell; each tick it moves
left, waits or moves right (:data:`MOVES`). It pays :data:`STEP_COST` per tick and
earns 1 when it reaches its target, which ends its delivery: it leaves the floor
while the others are still driving. A delivery that takes :data:`PATIENCE` ticks is
given up (truncated). A floor's shift begins with 1 to :data:`ROBOTS` robots; more
arrive during the first ticks, and it ends when no robot is left. Robots never
block each other: the point is agents that come and go, not the traffic.

No RL and no gymnasium here: :mod:`examples.couriers_sim` (the simulator's own main
loop, trained through :class:`zmq_rl.Agent`) and :mod:`examples.couriers_env` (a
PettingZoo env for the learner's spaces and evaluations) both drive :class:`Floor`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CELLS = 9
ROBOTS = 3
MOVES = (-1, 0, 1)
STEP_COST = 0.05
PATIENCE = 16
ARRIVALS = 4
"""A robot that is not there at the start of a shift arrives within this many ticks."""


@dataclass
class Robot:
    position: int
    target: int
    ticks: int = 0

    def observe(self) -> np.ndarray:
        """``[position, target, target - position]`` scaled to [-1, 1]."""
        scale = CELLS - 1
        return np.array(
            [self.position / scale, self.target / scale, (self.target - self.position) / scale],
            np.float32,
        )


class Floor:
    """One corridor: robots by index ``0..ROBOTS-1`` (None where no robot is)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.robots: list[Robot | None] = [None] * ROBOTS
        self.arrivals: dict[int, int] = {}
        self.tick_count = 0

    def _new_robot(self) -> Robot:
        position, target = self.rng.choice(CELLS, 2, replace=False)
        return Robot(int(position), int(target))

    def start_shift(self) -> None:
        """New robots: some now, the others within :data:`ARRIVALS` ticks."""
        first = int(self.rng.integers(1, ROBOTS + 1))
        self.robots = [self._new_robot() if i < first else None for i in range(ROBOTS)]
        self.arrivals = {i: int(self.rng.integers(1, ARRIVALS + 1)) for i in range(first, ROBOTS)}
        self.tick_count = 0

    def tick(self, moves: dict[int, int]) -> dict[int, tuple[float, bool, bool, np.ndarray]]:
        """Move every robot present (``moves[i]`` an index into :data:`MOVES`); returns
        ``{robot: (reward, delivered, gave_up, observation)}`` for the robots that
        moved. Robots that delivered or gave up leave (the observation is their last);
        robots due to arrive appear."""
        self.tick_count += 1
        out = {}
        for i, robot in enumerate(self.robots):
            if robot is None:
                continue
            robot.position = int(np.clip(robot.position + MOVES[moves[i]], 0, CELLS - 1))
            robot.ticks += 1
            delivered = robot.position == robot.target
            gave_up = not delivered and robot.ticks >= PATIENCE
            out[i] = (float(delivered) - STEP_COST, delivered, gave_up, robot.observe())
            if delivered or gave_up:
                self.robots[i] = None
        for i, at in list(self.arrivals.items()):
            if at == self.tick_count:
                del self.arrivals[i]
                self.robots[i] = self._new_robot()
        return out

    @property
    def over(self) -> bool:
        """No robot is on the floor and none is due."""
        return not self.arrivals and all(robot is None for robot in self.robots)
