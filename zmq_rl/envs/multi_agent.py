"""Multi-agent (PettingZoo) environments as env slots: one slot per possible agent.

A PettingZoo env is named like a gymnasium one (:func:`zmq_rl.envs.build_env`):
``--env pettingzoo.sisl.pursuit_v5`` (a module with ``parallel_env``, or with an AEC
``env``), or ``module.path:factory`` returning a ``ParallelEnv`` / ``AECEnv``. The
Parallel API is used as it is; an AEC env through PettingZoo's own
``aec_to_parallel`` when its metadata says ``is_parallelizable``. Any other AEC env
is a turn-based game (connect four, chess): its agents act one at a time, and
:class:`TurnSlots` plays it in rounds, holding each move's row until its outcome is
known.

Every possible agent of an env gets a slot of its own (``agents_per_env`` =
``len(possible_agents)``), and one shared policy acts for them all, so every agent
must have the same observation and action spaces (:func:`agent_spaces` says which
agent differs). :class:`ParallelSlots` steps several such envs in lockstep for an
actor: each step every slot gets a row; a slot whose agent is not alive (it
finished before its env's episode did, or has not appeared yet) gets a row that
is *not valid* (reward 0, ends nothing, its action unused), which the learner
leaves out of training and of every count (docs/protocol.md section 4.1.4). An
agent's last valid row carries its terminated or truncated flag; a slot starts a
fresh trajectory when a new agent takes it (the env's next episode, or an agent
that appears mid-episode). No sockets and no RL here (the actor drives these
classes: :mod:`zmq_rl.actor.gym_actor`).
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..wire.protocol import StepArrays
from ..wire.spaces import Value, as_value, map_value

__all__ = [
    "AgentSpaceMismatch",
    "ParallelSlots",
    "SlotStep",
    "TurnSlots",
    "agent_spaces",
    "is_multi_agent",
    "is_turn_based",
    "stacked",
    "to_parallel",
]


class AgentSpaceMismatch(ValueError):
    """A multi-agent env whose agents do not share one observation and action space
    (one shared policy needs them to), or that lists no ``possible_agents``."""


def _pettingzoo_envs() -> tuple[type, type] | None:
    """PettingZoo's ``(ParallelEnv, AECEnv)``, or None when PettingZoo has not been
    imported: then no object can be a PettingZoo env, and asking about a gymnasium env
    must not import it (a single-agent run loads only the runtime packages)."""
    if "pettingzoo" not in sys.modules:
        return None
    from pettingzoo.utils.env import AECEnv, ParallelEnv

    return ParallelEnv, AECEnv


def is_multi_agent(env: Any) -> bool:
    """Whether ``env`` is a PettingZoo env (Parallel or AEC API)."""
    classes = _pettingzoo_envs()
    return classes is not None and isinstance(env, classes)


def to_parallel(env: Any, label: str) -> Any:
    """``env`` under the Parallel API where it has one: a ``ParallelEnv`` as it is, a
    parallelizable AEC env through PettingZoo's ``aec_to_parallel``; a turn-based AEC
    env (its agents act one at a time) stays an AEC env, for :class:`TurnSlots`."""
    from pettingzoo.utils.conversions import aec_to_parallel
    from pettingzoo.utils.env import AECEnv

    if isinstance(env, AECEnv) and env.metadata.get("is_parallelizable", False):
        return aec_to_parallel(env)
    return env


def is_turn_based(env: Any) -> bool:
    """Whether ``env`` (from :func:`zmq_rl.envs.build_env`) is a turn-based AEC env."""
    classes = _pettingzoo_envs()
    return classes is not None and isinstance(env, classes[1])


def agent_spaces(env: Any, label: str) -> tuple[Any, Any, list[Any]]:
    """``(observation_space, action_space, possible_agents)`` of a Parallel env whose
    agents all share the two spaces; :class:`AgentSpaceMismatch` naming the first
    agent that differs (or the missing ``possible_agents``)."""
    try:
        agents = list(env.possible_agents)
    except AttributeError:
        raise AgentSpaceMismatch(
            f"{label} lists no possible_agents: zmq_rl gives each possible agent a slot"
        ) from None
    if not agents:
        raise AgentSpaceMismatch(f"{label} has no possible_agents")
    first = agents[0]
    spaces = (env.observation_space(first), env.action_space(first))
    for agent in agents[1:]:
        theirs = (env.observation_space(agent), env.action_space(agent))
        for kind, mine, other in zip(("observation", "action"), spaces, theirs, strict=True):
            if mine != other:
                raise AgentSpaceMismatch(
                    f"{label}: agent {agent!r} has {kind} space {other}, agent {first!r} "
                    f"has {mine}: one shared policy needs one space for every agent"
                )
    return spaces[0], spaces[1], agents


@dataclass
class SlotStep:
    """What one lockstep step of every slot returned (``[slots]`` arrays), as
    :meth:`zmq_rl.actor.agent.Agent.observe` takes it: ``valid`` says which slots held
    a live agent when the actions were chosen (the rows being completed)."""

    next_obs: Value
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_obs: dict[int, Any]
    valid: np.ndarray


class _AgentSlots:
    """``len(envs) * agents_per_env`` slots over env copies that share
    ``possible_agents``: slot ``e * agents_per_env + i`` is possible agent ``i`` of env
    ``e``."""

    def __init__(self, envs: Sequence[Any], possible_agents: Sequence[Any]) -> None:
        self.envs = list(envs)
        self.agents = list(possible_agents)
        self.agents_per_env = len(self.agents)
        self.index = {agent: i for i, agent in enumerate(self.agents)}
        self.num_slots = len(self.envs) * self.agents_per_env
        self.episode_steps = np.zeros(self.num_slots, np.int64)  # of each slot's agent

    def slot(self, env_index: int, agent: Any) -> int:
        """The slot of ``agent`` in env ``env_index``; KeyError naming an agent that is
        not one of the env's ``possible_agents``."""
        try:
            return env_index * self.agents_per_env + self.index[agent]
        except KeyError:
            raise KeyError(
                f"env {env_index} returned agent {agent!r}, which is not one of its "
                f"possible_agents {self.agents}"
            ) from None

    def close(self) -> None:
        """Close every env."""
        for env in self.envs:
            env.close()


class ParallelSlots(_AgentSlots):
    """``len(envs) * agents_per_env`` slots over PettingZoo Parallel envs that share
    ``possible_agents``: slot ``e * agents_per_env + i`` is possible agent ``i`` of env
    ``e``. :meth:`reset` starts every env; :meth:`step` takes one action per slot
    (those of slots without a live agent are ignored), steps every env once, resets
    an env whose agents are all gone, and returns a :class:`SlotStep`."""

    def __init__(self, envs: Sequence[Any], possible_agents: Sequence[Any]) -> None:
        super().__init__(envs, possible_agents)
        self.alive = np.zeros(self.num_slots, bool)  # slots whose agent is live now
        self._last: list[Any] = [None] * self.num_slots  # each live agent's observation
        # A live agent's observation per env: what a slot without an agent shows the
        # policy (a real value of the space, its action mask included).
        self._stand_in: list[Any] = [None] * len(self.envs)

    def reset(self, seeds: Sequence[int | None]) -> Value:
        """Reset every env (``seeds[e]`` for env ``e``); the observations of every slot
        (a placeholder from a live agent of the same env where the slot has none)."""
        for e, (env, seed) in enumerate(zip(self.envs, seeds, strict=True)):
            self._start(e, env.reset(seed=seed)[0])
        return self._observations()

    def _start(self, e: int, observations: dict[Any, Any]) -> None:
        """Take the first observations of env ``e``'s episode."""
        if not observations:
            raise ValueError(f"env {e} started an episode with no agents")
        k = self.agents_per_env
        self.alive[e * k : (e + 1) * k] = False
        self.episode_steps[e * k : (e + 1) * k] = 0
        for agent, obs in observations.items():
            slot = self.slot(e, agent)
            self.alive[slot] = True
            self._last[slot] = obs

    def _observations(self) -> Value:
        """Every slot's observation: its live agent's, else a live agent's of its env."""
        k = self.agents_per_env
        for e in range(len(self.envs)):
            live = np.flatnonzero(self.alive[e * k : (e + 1) * k])
            if live.size:
                self._stand_in[e] = self._last[e * k + int(live[0])]
        return stacked(
            [
                self._last[slot] if self.alive[slot] else self._stand_in[slot // k]
                for slot in range(self.num_slots)
            ]
        )

    def step(self, actions: Any) -> SlotStep:
        """Step every env with the actions of its live agents (``actions[slot]``)."""
        n, k = self.num_slots, self.agents_per_env
        valid = self.alive.copy()
        rewards = np.zeros(n, np.float32)
        terminated = np.zeros(n, bool)
        truncated = np.zeros(n, bool)
        final_obs: dict[int, Any] = {}
        for e, env in enumerate(self.envs):
            chosen = {}
            for agent in env.agents:
                slot = self.slot(e, agent)
                if not self.alive[slot]:  # appeared since the last step: acts from now on
                    continue
                action = actions[slot]
                chosen[agent] = action.item() if np.ndim(action) == 0 else action
            observations, agent_rewards, terms, truncs, _ = env.step(chosen)
            for agent in chosen:
                slot = self.slot(e, agent)
                rewards[slot] = agent_rewards.get(agent, 0.0)
                terminated[slot] = bool(terms.get(agent, False))
                truncated[slot] = bool(truncs.get(agent, False))
                self.episode_steps[slot] += 1
                if agent in observations:
                    self._last[slot] = observations[agent]
                    if truncated[slot] and not terminated[slot]:
                        final_obs[slot] = observations[agent]
                elif truncated[slot] and not terminated[slot]:
                    final_obs[slot] = self._last[slot]
                if not (terminated[slot] or truncated[slot]) and agent not in env.agents:
                    # The agent left without saying how: its episode ends here.
                    terminated[slot] = True
                if terminated[slot] or truncated[slot]:
                    self.alive[slot] = False
            for agent in env.agents:  # newcomers take their slot for the next step
                slot = self.slot(e, agent)
                if not self.alive[slot] and agent not in chosen and agent in observations:
                    self.alive[slot] = True
                    self.episode_steps[slot] = 0
                    self._last[slot] = observations[agent]
            if not env.agents:
                self._start(e, env.reset()[0])
            elif not self.alive[e * k : (e + 1) * k].any():
                raise ValueError(f"env {e} has agents {env.agents} but none of them observed")
        return SlotStep(self._observations(), rewards, terminated, truncated, final_obs, valid)


def stacked(values: Sequence[Any]) -> Value:
    """One batched value (leading dim ``len(values)``) of per-agent observations (any
    value of the space each: arrays, or dicts / tuples of them)."""
    return map_value(lambda *xs: np.stack(xs), *(as_value(v) for v in values))


@dataclass
class _Row:
    """One agent's row: what it saw and chose at its turn, and (once final) what came
    of it before its next turn."""

    obs: Any
    action: Any
    value: float
    log_prob: float
    version: int
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    final_obs: Any = None  # a truncated row's last observation


@dataclass
class SlotRows(StepArrays):
    """One lockstep row of every slot, as :meth:`zmq_rl.actor.agent.Agent.record`
    takes it: the step arrays (``[slots]``) and what follows them (``version``: the
    oldest that chose a valid row)."""

    next_obs: Value
    final_obs: dict[int, Any]
    valid: np.ndarray
    version: int | None


class OpponentSeats:
    """Who plays the seats of turn-based games besides the policy: in a share
    (``share``) of the games one seat, drawn uniformly with ``rng`` when the game starts,
    is an *opponent* that the caller moves by other means (a frozen snapshot of the
    policy). ``pick()`` names the opponent of each such game (:attr:`opponent_of`, per
    env), and ``on_result(opponent, outcome)`` hears how it ended for the policy's seat
    (``"win"``, ``"draw"``, ``"loss"``; counted in :attr:`results`)."""

    def __init__(
        self,
        num_envs: int,
        agents_per_env: int,
        share: float,
        rng: np.random.Generator,
        pick: Callable[[], int],
        on_result: Callable[[int, str], None],
    ) -> None:
        self.agents_per_env = agents_per_env
        self.share, self.rng = float(share), rng
        self.pick, self.on_result = pick, on_result
        self.opponent = np.zeros(num_envs * agents_per_env, bool)  # per slot, this game
        self.opponent_of = np.full(num_envs, -1, np.int64)  # each game's opponent
        self.results: dict[str, int] = {"win": 0, "draw": 0, "loss": 0}
        """Games against an opponent seat, by the result of the policy's seat."""

    def seat(self, e: int) -> None:
        """Draw whether env ``e``'s new game has an opponent seat, and which."""
        k = self.agents_per_env
        self.opponent[e * k : (e + 1) * k] = False
        if self.share and self.rng.random() < self.share:
            self.opponent[e * k + int(self.rng.integers(k))] = True
            self.opponent_of[e] = self.pick()

    def game_over(self, slot: int, reward: float) -> None:
        """The game of ``slot`` ended with ``reward`` for that (policy's) seat: a result
        against the game's opponent, if it had one."""
        k = self.agents_per_env
        e = slot // k
        if self.opponent[e * k : (e + 1) * k].any():
            outcome = "win" if reward > 0 else "loss" if reward < 0 else "draw"
            self.results[outcome] += 1
            self.on_result(int(self.opponent_of[e]), outcome)


class TurnSlots(_AgentSlots):
    """Turn-based AEC envs (connect four, chess) as ``len(envs) * agents_per_env``
    lockstep slots: slot ``e * agents_per_env + i`` is possible agent ``i`` of env ``e``.

    Agents act one at a time, and an agent's reward for a move is known only when its
    turn comes again (or the game ends): PettingZoo's ``last()`` then holds what it
    earned since it moved. So a move's row is *held* until then and becomes final
    with that reward and ending. The slots advance in **rounds** of
    ``agents_per_env`` turns (:meth:`to_move` and :meth:`play` once per turn, one
    decision batch over the envs); a game that ends waits for the round's end to
    start the next, so every game starts a round. After a round :meth:`emit` gives
    every slot one row: its oldest final row, or, when it has none and its agent's
    last row ended a game, a row that is not valid (docs/protocol.md section 4.1.4).
    Mid-game every agent moves once per round, so a slot always has a final row by
    then; a game's last round makes two at once for the agents that moved in it, and
    the next game's first round (whose moves are not final yet) takes the extra.
    Agents must take turns in a fixed rotation (every live agent once per
    ``agents_per_env`` turns); ValueError otherwise, naming the env and the agent.

    ``opponent_share``, ``pick`` and ``on_result``: the opponent seats
    (:class:`OpponentSeats`, :attr:`seats`): an opponent seat's rows are never recorded,
    so its slot's rows are not valid for that whole game (it ended its previous game,
    so that is allowed).

    ``opening_moves``: every game starts with a number of uniformly random legal moves
    drawn from ``0..opening_moves`` (with ``rng``) and rounded down to whole rounds, so
    the first seat still moves first; they are nobody's rows. Self-play settles into a
    few lines of play, and a policy trained only on them meets positions it never saw
    against any other player (docs/benchmarks.md section 24); random openings spread
    the positions. An opening that ends the game starts it over without one.
    """

    def __init__(
        self,
        envs: Sequence[Any],
        possible_agents: Sequence[Any],
        opponent_share: float = 0.0,
        rng: np.random.Generator | None = None,
        pick: Callable[[], int] = lambda: 0,
        on_result: Callable[[int, str], None] = lambda opponent, outcome: None,
        opening_moves: int = 0,
    ) -> None:
        super().__init__(envs, possible_agents)
        self.opening_moves = int(opening_moves)
        self.held: list[_Row | None] = [None] * self.num_slots  # moved, outcome unknown
        self.final: list[deque[_Row]] = [deque() for _ in range(self.num_slots)]
        self.ended = np.ones(self.num_slots, bool)  # the last emitted row ended a game
        self._last_obs: list[Any] = [None] * self.num_slots
        self._over = np.zeros(len(self.envs), bool)  # the env's game ended this round
        self.rng = rng or np.random.default_rng()
        self.seats = OpponentSeats(
            len(self.envs), self.agents_per_env, opponent_share, self.rng, pick, on_result
        )
        self.turns = np.zeros(self.num_slots, np.int64)  # moves of each slot this round

    @property
    def opponent(self) -> np.ndarray:
        """Per slot: whether an opponent plays that seat in the current game."""
        return self.seats.opponent

    @property
    def opponent_of(self) -> np.ndarray:
        """Per env: the opponent of its current game (when it has an opponent seat)."""
        return self.seats.opponent_of

    @property
    def results(self) -> dict[str, int]:
        """Games against an opponent seat, by the result of the policy's seat."""
        return self.seats.results

    def reset(self, seeds: Sequence[int | None]) -> None:
        """Start every env's first game (``seeds[e]`` for env ``e``)."""
        for e, (_, seed) in enumerate(zip(self.envs, seeds, strict=True)):
            self._start_game(e, seed)
        self._over[:] = False

    def _start_game(self, e: int, seed: int | None = None) -> None:
        """Reset env ``e``, play its random opening (see the class docstring) and draw
        its opponent seat."""
        env = self.envs[e]
        env.reset(seed=seed)
        moves = int(self.rng.integers(0, self.opening_moves + 1)) if self.opening_moves else 0
        for _ in range(moves - moves % self.agents_per_env):
            obs = env.last()[0]
            mask = obs.get("action_mask") if isinstance(obs, dict) else None
            if mask is None:
                space = env.action_space(env.agent_selection)
                space.seed(int(self.rng.integers(2**31)))  # the actor's seed decides
                env.step(space.sample())
            else:
                env.step(int(self.rng.choice(np.flatnonzero(mask))))
            if any(env.terminations.values()) or any(env.truncations.values()):
                env.reset()  # the opening ended the game: start it over without one
                break
        self.seats.seat(e)

    def to_move(self) -> tuple[list[int], list[int], Value | None]:
        """The next turn of the round: ``(envs, slots, observations)`` of the agent to
        move in every env whose game goes on (settling the row each of them held:
        ``last()`` says what it earned since); an env whose game ended this round
        waits for the next one. ``observations`` is None when no env has a move."""
        envs, slots, observations = [], [], []
        for e, env in enumerate(self.envs):
            if self._over[e]:
                continue
            agent = env.agent_selection
            obs, reward, terminated, truncated, _ = env.last()
            slot = self.slot(e, agent)
            self._last_obs[slot] = obs
            self._settle(slot, obs, float(reward), bool(terminated), bool(truncated))
            envs.append(e)
            slots.append(slot)
            observations.append(obs)
        if not observations:
            return envs, slots, None
        return envs, slots, stacked(observations)

    def _settle(self, slot: int, obs: Any, reward: float, term: bool, trunc: bool) -> None:
        """The held row of ``slot`` gets its outcome and becomes final."""
        row = self.held[slot]
        if row is None:
            return
        row.reward, row.terminated, row.truncated = reward, term, trunc and not term
        if term or trunc:
            self.seats.game_over(slot, reward)
        if row.truncated:
            row.final_obs = obs
        self.held[slot] = None
        self.final[slot].append(row)

    def play(self, envs: list[int], slots: list[int], actions: Any, decided: Any) -> None:
        """Step env ``envs[k]`` with ``actions[k]`` (env actions) for its mover
        ``slots[k]`` and hold the row (``decided``: the policy's ``actions``,
        ``values``, ``log_probs`` and ``version``, row ``k``; an opponent seat's move is
        not held, and ``decided`` may be None when every mover is one); then settle
        the agents a move finished (a won game ends them all)."""
        for k, (e, slot) in enumerate(zip(envs, slots, strict=True)):
            if self.turns[slot] >= 1:
                raise ValueError(
                    f"env {e}: agent {self.agents[slot % self.agents_per_env]!r} moves twice "
                    "in one round; turn-based envs must let agents take turns in rotation"
                )
            self.turns[slot] += 1
            if not self.seats.opponent[slot]:
                self.held[slot] = _Row(
                    self._last_obs[slot],
                    decided.actions[k],
                    float(decided.values[k]),
                    float(decided.log_probs[k]),
                    int(decided.version),
                )
            env = self.envs[e]
            action = actions[k]
            env.step(action.item() if np.ndim(action) == 0 else action)
            self.episode_steps[slot] += 1
            self._step_out_finished(e)

    def _step_out_finished(self, e: int) -> None:
        """Settle and step out (``step(None)``) every finished agent of env ``e`` in
        turn order; the env's game is over when none is left."""
        env = self.envs[e]
        while env.agents:
            agent = env.agent_selection
            obs, reward, terminated, truncated, _ = env.last()
            if not (terminated or truncated):
                return
            slot = self.slot(e, agent)
            self._last_obs[slot] = obs
            self._settle(slot, obs, float(reward), bool(terminated), bool(truncated))
            env.step(None)
        self._over[e] = True

    def emit(self, like_actions: np.ndarray) -> SlotRows:
        """One row of every slot after a round (see the class docstring);
        ``like_actions``: one policy action, for the shape and dtype of the unused
        actions of rows that are not valid."""
        self._start_round()
        slots = range(self.num_slots)
        rows = [self._take_row(slot) for slot in slots]
        following = [self._next_obs(slot) for slot in slots]
        for slot, row in enumerate(rows):
            if row is not None:
                self.ended[slot] = row.terminated or row.truncated
        return _slot_rows(rows, self._last_obs, following, like_actions)

    def _start_round(self) -> None:
        """Start the games that ended in the round just played: a game starts at a
        round's start."""
        self.turns[:] = 0
        for e in np.flatnonzero(self._over):
            self._start_game(e)
            self.episode_steps[e * self.agents_per_env : (e + 1) * self.agents_per_env] = 0
        self._over[:] = False

    def _take_row(self, slot: int) -> _Row | None:
        """The slot's oldest final row; None (a row that is not valid) when it has none
        and its agent's last row ended a game."""
        if self.final[slot]:
            return self.final[slot].popleft()
        if self.ended[slot]:
            return None
        raise RuntimeError(f"slot {slot} has no final row after a round (a bug)")

    def _next_obs(self, slot: int) -> Any:
        """What follows the slot's emitted row: its next row's observation (final, else
        held), else the last observation its agent saw."""
        if self.final[slot]:
            return self.final[slot][0].obs
        held = self.held[slot]
        return held.obs if held is not None else self._last_obs[slot]


def _slot_rows(
    rows: Sequence[_Row | None], last_obs: Sequence[Any], following: list[Any], like_actions: Any
) -> SlotRows:
    """The lockstep arrays of one row per slot; a slot without one (None) gets a row
    that is not valid: its agent's last observation, zeros, and an action of zeros
    shaped as ``like_actions``."""
    blank = np.zeros_like(like_actions)
    filled = [
        _Row(obs, blank, 0.0, 0.0, 0) if row is None else row
        for row, obs in zip(rows, last_obs, strict=True)
    ]
    versions = [row.version for row in rows if row is not None]
    return SlotRows(
        obs=stacked([row.obs for row in filled]),
        actions=np.stack([row.action for row in filled]),
        rewards=np.array([row.reward for row in filled], np.float32),
        terminated=np.array([row.terminated for row in filled], bool),
        truncated=np.array([row.truncated for row in filled], bool),
        values=np.array([row.value for row in filled], np.float32),
        log_probs=np.array([row.log_prob for row in filled], np.float32),
        next_obs=stacked(following),
        final_obs={slot: row.final_obs for slot, row in enumerate(filled) if row.truncated},
        valid=np.array([row is not None for row in rows]),
        version=min(versions) if versions else None,
    )
