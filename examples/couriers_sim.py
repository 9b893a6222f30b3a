"""Delivery robots with their own main loop, trained through :class:`zmq_rl.Agent`.

A multi-agent simulator that is not a PettingZoo (or gymnasium) env: the loop below
owns time and ticks every floor of a depot. Each floor has up to
:data:`~examples.couriers_physics.ROBOTS` robots, and each robot position is one
*slot* (``num_envs`` = floors x robots; slot ``f * ROBOTS + i`` is robot ``i`` of
floor ``f``). One shared policy drives every robot: ``agent.act(obs)`` moves them
all, ``agent.observe(..., valid=...)`` records what came of it. A robot that
delivered (terminated) or gave up (truncated, with its last observation as
``final_obs``) leaves the floor while the others drive on; until a new robot takes
its place, its slot's rows are *not valid* (``valid`` False: reward 0, nothing
ended, the action unused), and the learner leaves them out of training and of every
count (docs/protocol.md section 4.1.4). A floor starts a new shift when its last
robot left.

Run it from the repository root, with a learner of the matching env
(``zmq-learner --env examples.couriers_env:couriers --num-envs 4``) on port 5555::

    python -m examples.couriers_sim --learner 127.0.0.1:5555 --floors 4

See ``docs/embedding.md`` ("Several agents per env").
"""

from __future__ import annotations

import argparse
import logging
import sys

import numpy as np

from examples.couriers_env import ACTION_SPACE, OBSERVATION_SPACE
from examples.couriers_physics import ROBOTS, Floor
from zmq_rl import Agent
from zmq_rl.actor.client import LearnerLost, LearnerRefused, LearnerUnreachable

log = logging.getLogger("couriers_sim")

ENV_ID = "examples.couriers_env:couriers"
"""The env the learner uses for the same spaces and dynamics."""


def observe(floors: list[Floor], last: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every slot's observation and whether a robot is there. An empty slot shows
    what it showed last (any value of the space will do: its row is not valid)."""
    obs, present = last.copy(), np.zeros(len(floors) * ROBOTS, bool)
    for f, floor in enumerate(floors):
        for i, robot in enumerate(floor.robots):
            if robot is not None:
                obs[f * ROBOTS + i] = robot.observe()
                present[f * ROBOTS + i] = True
    return obs, present


def run(learner: str, num_floors: int = 4, seed: int = -1, actor_id: int = -1) -> dict[str, float]:
    """Simulate until the learner says stop; return the stats."""
    slots = num_floors * ROBOTS
    with Agent(
        learner, OBSERVATION_SPACE, ACTION_SPACE, slots, seed=seed, env_id=ENV_ID, actor_id=actor_id
    ) as agent:
        rng = np.random.default_rng(agent.seed)
        floors = [Floor(rng) for _ in range(num_floors)]
        for floor in floors:
            floor.start_shift()
        obs, present = observe(floors, np.zeros((slots, 3), np.float32))
        deliveries = robot_ticks = 0
        while not agent.shutdown_requested:
            actions = agent.act(obs)
            if agent.shutdown_requested:
                break
            valid = present  # the rows being completed: a robot was there to move
            rewards = np.zeros(slots, np.float32)
            delivered = np.zeros(slots, bool)
            gave_up = np.zeros(slots, bool)
            final_obs = {}
            for f, floor in enumerate(floors):
                moves = {i: int(actions[f * ROBOTS + i]) for i, r in enumerate(floor.robots) if r}
                for i, (reward, done, quit_, last) in floor.tick(moves).items():
                    slot = f * ROBOTS + i
                    rewards[slot], delivered[slot], gave_up[slot] = reward, done, quit_
                    if quit_:
                        final_obs[slot] = last  # truncated: the learner bootstraps from it
                if floor.over:
                    floor.start_shift()
            robot_ticks += int(valid.sum())
            deliveries += int(delivered.sum())
            obs, present = observe(floors, obs)
            agent.observe(rewards, delivered, gave_up, obs, final_obs, valid=valid)
        extra = {"sim/robot_ticks": float(robot_ticks), "sim/deliveries": float(deliveries)}
        print(f"sim/robot_ticks={robot_ticks} sim/deliveries={deliveries}", flush=True)
        agent.close(extra)
        return {**agent.stats, **extra}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--learner", default="127.0.0.1:5555")
    parser.add_argument("--floors", type=int, default=4)
    parser.add_argument("--seed", type=int, default=-1)
    parser.add_argument("--actor-id", type=int, default=-1)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        run(args.learner, args.floors, args.seed, args.actor_id)
    except (LearnerRefused, LearnerUnreachable, LearnerLost) as exc:
        log.error("%s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
