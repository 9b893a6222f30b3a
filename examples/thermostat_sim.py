"""A building simulator with its own main loop, trained through :class:`zmq_rl.Agent`.

This is not a gymnasium env. The simulator owns time: :meth:`Building.tick` advances
every room of the building by one minute, and the main loop in :func:`run` decides
when that happens. A policy served by a zmq_rl learner sets each room's heater: the
loop asks ``agent.act(obs)`` for the heater settings and tells ``agent.observe(...)``
what came of them; the agent does weights, the staleness valve and the experience.

Each room is one env *slot* (``num_envs`` = the number of rooms); all rooms tick in
lockstep. A room's episode is one hour (``EPISODE_MINUTES`` ticks) and ends by
*truncation*: nothing terminal happens to a room at minute 60, the experiment just
restarts with a new target and new weather. The learner therefore needs the true last
observation of the hour (``final_obs``) to bootstrap the value of the state the room
was left in.

Run it (from the repository root, with a learner for the matching gymnasium id
``examples.thermostat_env:Thermostat-v0`` listening on port 5555)::

    python -m examples.thermostat_sim --learner 127.0.0.1:5555 --rooms 4

See ``docs/embedding.md`` for what every call does.
"""

from __future__ import annotations

import argparse
import logging
import sys

import gymnasium as gym
import numpy as np

from examples.thermostat_physics import OBS_LIMIT, POWER_LEVELS_KW, Building
from zmq_rl import Agent
from zmq_rl.actor.client import LearnerLost, LearnerRefused, LearnerUnreachable
from zmq_rl.rl.device import set_compute_threads

log = logging.getLogger("thermostat_sim")

ENV_ID = "examples.thermostat_env:Thermostat-v0"
"""The gymnasium id the learner uses for the same spaces and dynamics."""

OBSERVATION_SPACE = gym.spaces.Box(-OBS_LIMIT, OBS_LIMIT, (2,), np.float32)
"""``[(temp - target) / 5, (outside - target) / 10]``: the error and the weather."""
ACTION_SPACE = gym.spaces.Discrete(len(POWER_LEVELS_KW))
"""An index into :data:`POWER_LEVELS_KW`."""


def run(
    learner: str,
    num_rooms: int = 4,
    seed: int = -1,
    actor_id: int = -1,
    max_minutes: int = 0,
    register_timeout: float = 30.0,
    learner_timeout: float = 60.0,
) -> dict[str, float]:
    """Simulate until the learner says stop (or ``max_minutes``); return the stats."""
    # Registers: the learner refuses other spaces; seed -1 = the run's seed + 1 + actor id.
    agent = Agent(
        learner,
        OBSERVATION_SPACE,
        ACTION_SPACE,
        num_rooms,
        seed=seed,
        env_id=ENV_ID,  # informational
        actor_id=actor_id,
        register_timeout=register_timeout,
        learner_timeout=learner_timeout,
    )
    extra: dict[str, float] = {}
    try:
        building = Building(num_rooms, agent.seed)
        log.info("actor %d: %d rooms, seed %d", agent.client.actor_id, num_rooms, agent.seed)
        errors, obs = 0.0, building.observe()
        terminated = np.zeros(num_rooms, bool)  # a room never reaches a terminal state
        while not agent.shutdown_requested and not (max_minutes and building.clock >= max_minutes):
            actions = agent.act(obs)  # may wait (staleness valve); never waits for weights
            if agent.shutdown_requested:  # said while act() waited: stop before the tick
                break
            rewards = building.tick(np.asarray(POWER_LEVELS_KW)[actions])
            errors -= float(rewards.sum())
            # An hour is a time limit: truncated, with the true last observation kept.
            truncated = np.array([room.hour_over for room in building.rooms])
            final_obs = {
                j: room.observe() for j, room in enumerate(building.rooms) if room.hour_over
            }
            for j in final_obs:
                building.rooms[j].reset()
            obs = building.observe()  # the reset observation where an hour ended
            agent.observe(rewards, terminated, truncated, obs, final_obs)
        agent.flush()  # a partial fragment (if stopped by max_minutes) still goes out
        room_minutes = building.clock * num_rooms
        extra = {
            "sim/minutes": float(building.clock),
            "sim/mean_abs_error": errors / room_minutes if room_minutes else 0.0,
        }
        return {**agent.stats, **extra}
    finally:
        agent.close(extra)  # always say bye (with the counters) and close the sockets


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--learner", default="127.0.0.1:5555", help="learner HOST[:PORT]")
    parser.add_argument("--rooms", type=int, default=4, help="rooms (env slots) to simulate")
    parser.add_argument(
        "--seed",
        type=int,
        default=-1,
        help="simulation and sampling seed; -1 = the run's seed + 1 + actor id",
    )
    parser.add_argument("--actor-id", type=int, default=-1, help="requested actor id")
    parser.add_argument(
        "--max-minutes",
        type=int,
        default=0,
        help="stop after this many simulated minutes; 0 = when the learner says",
    )
    parser.add_argument(
        "--register-timeout",
        type=float,
        default=30.0,
        help="seconds to wait for the learner's welcome",
    )
    parser.add_argument(
        "--learner-timeout",
        type=float,
        default=60.0,
        help="give up after hearing nothing from the learner for this long",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    set_compute_threads(1)  # numpy's BLAS (the agent's network acts in numpy: no torch)
    try:
        stats = run(
            args.learner,
            args.rooms,
            args.seed,
            args.actor_id,
            args.max_minutes,
            args.register_timeout,
            args.learner_timeout,
        )
    except (LearnerUnreachable, LearnerRefused, LearnerLost) as exc:
        print(f"thermostat_sim: {exc}", file=sys.stderr)
        return 1
    print(" ".join(f"{k}={v:g}" for k, v in stats.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
