"""A building simulator with its own main loop, trained through :class:`ActorClient`.

This is not a gymnasium env. The simulator owns time: :meth:`Building.tick` advances
every room of the building by one minute, and the main loop in :func:`run` decides
when that happens. A policy served by a zmq_rl learner sets each room's heater;
the experience goes back to the learner over :class:`zmq_rl.client.ActorClient`.

Each room is one env *slot* (``num_envs`` = the number of rooms); all rooms tick in
lockstep, so the loop records a step with ``client.step(...)``. A room's episode is
one hour (``EPISODE_MINUTES`` ticks) and ends by *truncation*: nothing terminal
happens to a room at minute 60, the experiment just restarts with a new target and
new weather. The learner therefore needs the true last observation of the hour
(``final_obs``) to bootstrap the value of the state the room was left in.

Run it (from the repository root, with a learner for the matching gymnasium id
``examples.thermostat_env:Thermostat-v0`` listening on port 5555)::

    python -m examples.thermostat_sim --learner 127.0.0.1:5555 --rooms 4

See ``docs/embedding.md`` for what every client call does.
"""

from __future__ import annotations

import argparse
import logging
import sys

import gymnasium as gym
import numpy as np
import torch

from examples.thermostat_physics import OBS_LIMIT, POWER_LEVELS_KW, Building
from zmq_rl.client import ActorClient, LearnerLost, LearnerRefused, LearnerUnreachable
from zmq_rl.policy import import_weights, policy_from_welcome

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
    client = ActorClient(
        learner,
        env_id=ENV_ID,  # informational: the learner compares the spaces below with its own
        observation_space=OBSERVATION_SPACE,
        action_space=ACTION_SPACE,
        num_envs=num_rooms,
        actor_id=actor_id,
        register_timeout=register_timeout,
        learner_timeout=learner_timeout,
    )
    extra: dict[str, float] = {}
    try:
        # 1. Register: the welcome carries the run's settings and the current weights.
        welcome = client.register()
        policy = policy_from_welcome(welcome)
        if seed < 0:  # as the built-in actor: the run's seed + 1 + this actor's id
            seed = welcome.settings.seed + 1 + client.actor_id
        generator = torch.Generator().manual_seed(seed)
        building = Building(num_rooms, seed)
        log.info("actor %d: %d rooms, seed %d", client.actor_id, num_rooms, seed)

        errors = 0.0
        obs = building.observe()
        truncated = np.zeros(num_rooms, bool)
        terminated = np.zeros(num_rooms, bool)  # a room never reaches a terminal state
        with torch.inference_mode():
            while not client.shutdown_requested:
                # 2. Every tick: control messages, heartbeats, and maybe newer weights.
                weights = client.poll()
                if weights is not None:
                    import_weights(policy, weights.tensors)  # before the next action
                if client.shutdown_requested:
                    break
                # 3. The staleness valve: too far ahead of the learner, so wait a bit.
                if client.should_pause():
                    weights = client.wait_for_weights(0.05)
                    if weights is not None:
                        import_weights(policy, weights.tensors)
                    continue
                if max_minutes and building.clock >= max_minutes:
                    break
                # 4. Act, and let the simulator move time on.
                action, log_prob, value = policy.act(torch.from_numpy(obs), generator)
                actions = action.numpy()
                rewards = building.tick(np.asarray(POWER_LEVELS_KW)[actions])
                errors -= float(rewards.sum())
                # 5. Episode ends: an hour is a time limit, so truncated, with the
                #    true last observation kept for bootstrapping.
                final_obs: dict[int, np.ndarray] = {}
                for j, room in enumerate(building.rooms):
                    truncated[j] = room.hour_over
                    if room.hour_over:
                        final_obs[j] = room.observe()
                        room.reset()
                next_obs = building.observe()  # the reset observation where an hour ended
                client.step(
                    obs,
                    actions,
                    rewards,
                    terminated,
                    truncated,
                    value.numpy(),
                    log_prob.numpy(),
                    next_obs,
                    final_obs,
                )
                obs = next_obs
        client.flush()  # a partial fragment (if stopped by max_minutes) still goes out
        room_minutes = building.clock * num_rooms
        extra = {
            "sim/minutes": float(building.clock),
            "sim/mean_abs_error": errors / room_minutes if room_minutes else 0.0,
        }
        return {**client.stats, **extra}
    finally:
        # 6. Always say bye (with our counters) and close the sockets.
        client.close(extra)


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
    torch.set_num_threads(1)
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
