"""The built-in actor: gymnasium envs driven by a :class:`~zmq_rl.actor.agent.Agent`.

It uses only the public embedding API, exactly as a simulator would: env slots step
in lockstep, :meth:`Agent.act` (weights, staleness valve, one batched policy forward)
gives every slot its action, :meth:`Agent.observe` records the step (a fragment per
group of slots every ``fragment_length`` steps).
"""

from __future__ import annotations

import contextlib
import logging
import traceback
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from ..config import ActorConfig
from ..envs import EnvStepper, build_env, env_shape, make_env
from ..envs.multi_agent import ParallelSlots, TurnSlots, agent_spaces, is_turn_based, stacked
from ..envs.seeding import env_seeds
from ..envs.stepping import step_and_reset
from ..rl.device import set_compute_threads
from ..rl.masking import ActionMaskError
from ..rl.weights import WeightsMismatch
from ..wire.protocol import Weights
from ..wire.spaces import map_value
from ..wire.transport import CurveClientKeys, load_public_certificate, load_secret_certificate
from .agent import PAUSE_WAIT_S, Agent, Decision
from .client import ActorClient, BadExperience
from .opponents import OpponentPool

if TYPE_CHECKING:
    from ..rl.policy import Policy

log = logging.getLogger("zmq_rl.actor")


class SpaceMismatch(RuntimeError):
    """The actor's env spaces differ from the learner's."""


class BadEnvValue(ValueError):
    """An env returned NaN or inf (or a reward past the learner's limit, or an
    ``action_mask`` that allows no action), or the policy produced such a value or
    log-prob: the actor stops instead of sending rows the learner would refuse. The
    message names the env id, the slot, the step of the episode and the field
    (observation, reward, final observation)."""


class EnvCrashed(RuntimeError):
    """The env raised while the actor stepped (or reset) it. The message, one line,
    names the env, the slot, the step of its episode, the exception and where it was
    raised; the traceback is logged at debug level."""


def env_crashed(env_id: str, exc: BaseException, where: str) -> EnvCrashed:
    """The :class:`EnvCrashed` of ``exc``, raised by ``env_id``'s code ``where``
    (``"in slot 3 at step 51 of its episode"``)."""
    log.debug("env %s raised %s", env_id, where, exc_info=exc)
    frames = traceback.extract_tb(exc.__traceback__)
    at = f" (at {frames[-1].filename}:{frames[-1].lineno}, in {frames[-1].name})" if frames else ""
    text = str(exc).strip()
    first = f": {text.splitlines()[0]}" if text else ""
    return EnvCrashed(f"env {env_id} raised {type(exc).__name__} {where}{first}{at}")


ENV_FIELDS = {
    "next_obs": "observation",
    "final_obs": "final observation (of a truncated episode)",
    "rewards": "reward",
    "obs": "observation",
}
"""What the env returned, by the client's field name (for :class:`BadEnvValue`)."""


def _decide(
    agent: Agent,
    pool: OpponentPool | None,
    obs: Any,
    movers: np.ndarray,
    opponent: np.ndarray,
    snapshots: np.ndarray,
) -> Decision:
    """One decision per mover (``movers``: their slots): the policy's (:meth:`Agent.decide`;
    several policies: each slot's own) for the seats it plays, the snapshot's of the
    game (``snapshots``, per mover) for opponent seats (env actions only: not
    recorded)."""
    if pool is None or not opponent.any():
        return agent.decide(obs, slots=movers)
    mine = np.flatnonzero(~opponent)
    theirs = np.flatnonzero(opponent)
    decided = (
        agent.decide(map_value(lambda a: a[mine], obs), slots=movers[mine]) if mine.size else None
    )
    moves = pool.act(map_value(lambda a: a[theirs], obs), snapshots[theirs])
    if decided is None:
        return Decision(moves, moves, np.zeros(len(moves), np.float32),
                        np.zeros(len(moves), np.float32), agent.runner.version)  # fmt: skip

    def spread(mine_rows: np.ndarray, filler: np.ndarray) -> np.ndarray:
        out = np.empty((len(opponent), *mine_rows.shape[1:]), mine_rows.dtype)
        out[mine], out[theirs] = mine_rows, filler
        return out

    return Decision(
        spread(decided.env_actions, moves.astype(decided.env_actions.dtype)),
        spread(
            decided.actions,
            np.zeros((len(theirs), *decided.actions.shape[1:]), decided.actions.dtype),
        ),
        spread(decided.values, np.zeros(len(theirs), np.float32)),
        spread(decided.log_probs, np.zeros(len(theirs), np.float32)),
        decided.version,
    )


@contextlib.contextmanager
def _mask_errors_are_the_envs(env_id: str) -> Iterator[None]:
    """An action mask that allows no action is the env's error (its observation), not
    the policy's: :class:`BadEnvValue` naming the env."""
    try:
        yield
    except ActionMaskError as exc:
        raise BadEnvValue(
            f"env {env_id} returned an observation that allows no action: {exc}"
        ) from None


def _shape_problem(space: gym.Space, value: Any, path: str = "") -> str:
    """Where a batch of observations (leading dim: the envs) does not have the shape
    ``space`` declares: ``"of shape (5,) where ... (4,)"`` for the first leaf that
    differs, with its key; ``""`` when every leaf fits."""
    if isinstance(space, gym.spaces.Dict) and isinstance(value, dict):
        for key, sub in space.spaces.items():
            if key not in value:
                return f"without its key {path}{key!r}"
            found = _shape_problem(sub, value[key], f"{path}{key!r}: ")
            if found:
                return found
        return ""
    if isinstance(space, gym.spaces.Tuple) and isinstance(value, tuple):
        for i, sub in enumerate(space.spaces):
            found = _shape_problem(sub, value[i], f"{path}[{i}]: ")
            if found:
                return found
        return ""
    got = tuple(np.shape(value)[1:])
    want = tuple(space.shape or ())
    if got != want:
        return f"{path}of shape {got} where its observation space says {want} ({space})"
    return ""


def check_observations(
    env_id: str, space: gym.Space, batch: Any, what: str = "observation"
) -> None:
    """:class:`BadEnvValue` naming ``env_id`` when a batch of its observations does not
    have the shapes of its observation ``space`` (the policy would fail on it with a
    shape error deep in its forward pass)."""
    problem = _shape_problem(space, batch)
    if problem:
        raise BadEnvValue(f"env {env_id} returned an {what} {problem}")


def curve_client_keys(cfg: ActorConfig) -> CurveClientKeys | None:
    """The actor's CURVE keys from its config (None when CURVE is off)."""
    if not cfg.curve_secret_key:
        return None
    public, secret = load_secret_certificate(cfg.curve_secret_key, "curve_secret_key")
    server = load_public_certificate(cfg.curve_server_key, "curve_server_key")
    return CurveClientKeys(public=public, secret=secret, server_public=server)


def load_weights(client: ActorClient, policy: Policy, weights: Weights) -> None:
    """Deprecated (the built-in actor is an :class:`~zmq_rl.actor.agent.Agent`, which loads
    weights itself): load broadcast weights into ``policy``; weights whose tensors do
    not fit are rejected (counted by the client) and the old ones stay in use."""
    warnings.warn(
        "zmq_rl.actor.load_weights is deprecated; zmq_rl.Agent loads weights itself",
        DeprecationWarning,
        stacklevel=2,
    )
    from ..rl.policy import import_weights

    try:
        import_weights(policy, weights.tensors)
    except WeightsMismatch as exc:
        client.reject_weights(weights, exc)


def stack(values: list[Any]) -> Any:
    """One batched value (leading dim ``len(values)``) of per-env observations."""
    return stacked(values)


class GymActor:
    """One actor process's work: register, then collect until told to stop."""

    def __init__(
        self,
        cfg: ActorConfig,
        context: Any = None,
        on_collecting: Callable[[], None] | None = None,
    ) -> None:
        """``on_collecting``: called once the actor registered, built its envs and
        starts to collect (after its log line ``actor N collecting on ...``); a failure
        after it is not a start-up failure (``zmq-rl run``'s supervisor)."""
        self.cfg = cfg.validate()
        self.context = context
        self.on_collecting = on_collecting

    def _collecting(self, message: str, *args: Any) -> None:
        """Log that the actor collects now, and say so to ``on_collecting``."""
        log.info(message, *args)
        if self.on_collecting is not None:
            self.on_collecting()

    def run(self) -> dict[str, float]:
        """Run until the learner asks for shutdown; return the actor's stats."""
        cfg = self.cfg
        set_compute_threads(cfg.torch_threads)
        spaces: tuple[Any, Any] = (None, None)
        slots = cfg.num_envs
        if cfg.env_id:
            shape = env_shape(cfg.env_id)
            spaces = (shape.observation_space, shape.action_space)
            slots *= shape.agents_per_env  # a multi-agent env fills one slot per agent
        with Agent(
            cfg.learner,
            *spaces,
            slots,
            seed=cfg.seed,
            env_id=cfg.env_id,
            actor_id=cfg.actor_id,
            context=self.context,
            register_timeout=cfg.register_timeout,
            learner_timeout=cfg.learner_timeout,
            curve=curve_client_keys(cfg),
        ) as agent:
            settings = agent.settings
            env_id = cfg.env_id or settings.env_id
            if settings.agents_per_env > 1:
                return self._collect_agents(agent, env_id)
            envs = [
                make_env(env_id, settings.env_kwargs, settings.wrappers)
                for _ in range(agent.num_envs)
            ]
            try:
                return self._collect(agent, env_id, envs)
            finally:
                for env in envs:
                    env.close()

    def _collect(self, agent: Agent, env_id: str, envs: list[gym.Env]) -> dict[str, float]:
        spaces = (envs[0].observation_space, envs[0].action_space)
        if spaces != (agent.observation_space, agent.action_space):
            raise SpaceMismatch(
                f"env {env_id} has spaces {spaces[0]} / {spaces[1]}, the learner's are "
                f"{agent.observation_space} / {agent.action_space}"
            )
        seeds = env_seeds(agent.seed, len(envs))
        obs = stack([env.reset(seed=s)[0] for env, s in zip(envs, seeds, strict=True)])
        check_observations(env_id, spaces[0], obs, "observation at reset")
        self._collecting(
            "actor %d collecting on %d x %s (seed %d)",
            *(agent.actor_id, len(envs), env_id, agent.seed),
        )
        rewards = np.zeros(len(envs), np.float32)
        terminated = np.zeros(len(envs), bool)
        truncated = np.zeros(len(envs), bool)
        episode_steps = np.zeros(len(envs), np.int64)  # steps of each slot's episode
        stepper = EnvStepper(envs, self.cfg.step_envs)
        slot_of = {id(env): j for j, env in enumerate(envs)}

        def step(env: gym.Env, action: Any) -> Any:
            try:
                return step_and_reset(env, action)
            except Exception as exc:  # noqa: BLE001 - the env's own error, said in one line
                j = slot_of[id(env)]
                where = f"in slot {j} at step {episode_steps[j] + 1} of its episode"
                raise env_crashed(env_id, exc, where) from None

        with stepper:
            while not agent.shutdown_requested:
                with _mask_errors_are_the_envs(env_id):
                    actions = agent.act(obs)
                final_obs, next_obs = {}, []
                moves = [a.item() if a.ndim == 0 else a for a in actions]
                for j, (o, rewards[j], terminated[j], truncated[j], last) in enumerate(
                    stepper.step(moves, step=step)
                ):
                    if last is not None and not terminated[j]:
                        final_obs[j] = last
                    next_obs.append(o)
                episode_steps += 1
                obs = stack(next_obs)
                check_observations(env_id, spaces[0], obs)
                try:
                    agent.observe(rewards, terminated, truncated, obs, final_obs)
                except BadExperience as exc:
                    ended = terminated | truncated
                    raise self._bad_env_value(exc, env_id, episode_steps, ended) from None
                episode_steps[terminated | truncated] = 0
        return dict(agent.stats)

    def _collect_agents(self, agent: Agent, env_id: str) -> dict[str, float]:
        """The multi-agent loop: every possible agent of every env copy is a slot
        (:class:`~zmq_rl.envs.multi_agent.ParallelSlots`); a slot without a live agent
        records a row that is not valid."""
        settings, k = agent.settings, agent.settings.agents_per_env
        if agent.num_envs % k:
            raise SpaceMismatch(
                f"the learner gave {agent.num_envs} slots, not a multiple of the "
                f"{k} agents of each {env_id} env"
            )
        envs = [
            build_env(env_id, settings.env_kwargs, settings.wrappers)
            for _ in range(agent.num_envs // k)
        ]
        try:
            obs_space, act_space, agents = agent_spaces(envs[0], env_id)
            if (obs_space, act_space) != (agent.observation_space, agent.action_space):
                raise SpaceMismatch(
                    f"env {env_id} has agent spaces {obs_space} / {act_space}, the learner's "
                    f"are {agent.observation_space} / {agent.action_space}"
                )
            if len(agents) != k:
                raise SpaceMismatch(
                    f"env {env_id} has {len(agents)} possible agents, the learner's has {k}"
                )
            if is_turn_based(envs[0]):
                return self._collect_turns(agent, env_id, envs, agents)
            slots = ParallelSlots(envs, agents)
            obs = slots.reset(env_seeds(agent.seed, len(envs)))
            check_observations(env_id, obs_space, obs, "observation at reset")
            self._collecting(
                "actor %d collecting on %d x %s (%d agents each, seed %d)",
                *(agent.actor_id, len(envs), env_id, k, agent.seed),
            )
            while not agent.shutdown_requested:
                with _mask_errors_are_the_envs(env_id):
                    actions = agent.act(obs)
                try:
                    steps = slots.step(actions)
                except Exception as exc:  # noqa: BLE001 - the env's own error, in one line
                    raise env_crashed(env_id, exc, "while its env copies stepped") from None
                obs = steps.next_obs
                check_observations(env_id, obs_space, obs)
                try:
                    agent.observe(
                        steps.rewards,
                        steps.terminated,
                        steps.truncated,
                        obs,
                        steps.final_obs,
                        valid=steps.valid,
                    )
                except BadExperience as exc:
                    ended = steps.terminated | steps.truncated
                    raise self._bad_env_value(exc, env_id, slots.episode_steps, ended) from None
            return dict(agent.stats)
        finally:
            for env in envs:
                env.close()

    def _collect_turns(
        self, agent: Agent, env_id: str, envs: list[Any], agents: list[Any]
    ) -> dict[str, float]:
        """The turn-based loop: rounds of ``agents_per_env`` turns, one batched
        :meth:`Agent.decide` per turn over the envs whose game goes on, the moves' rows
        held until their outcome is known and recorded once per round with
        :meth:`Agent.record` (:class:`~zmq_rl.envs.multi_agent.TurnSlots`). With an opponent
        pool (the welcome's ``opponent_pool``), a share of the games seat a frozen
        snapshot (:class:`~zmq_rl.actor.opponents.OpponentPool`), whose moves are not
        recorded."""
        settings = agent.settings
        pool = None
        if settings.opponent_pool:
            pool = OpponentPool(
                settings.opponent_pool,
                settings.opponent_every,
                agent.welcome,
                agent.seed,
                settings.opponent_choice,
            )
            pool.offer(agent.runner)
        share = settings.opponent_share if pool is not None else 0.0
        slots = TurnSlots(
            envs,
            agents,
            share,
            np.random.default_rng(agent.seed),
            **({} if pool is None else {"pick": pool.choose, "on_result": pool.record}),
            opening_moves=settings.opening_moves,
        )
        slots.reset(env_seeds(agent.seed, len(slots.envs)))
        self._collecting(
            "actor %d collecting on %d x %s (turn-based, %d agents each, seed %d)",
            *(agent.actor_id, len(slots.envs), env_id, slots.agents_per_env, agent.seed),
        )
        like_action = None
        while not agent.shutdown_requested:
            for _ in range(slots.agents_per_env):
                playing, movers, obs = slots.to_move()
                if obs is None:
                    continue
                with _mask_errors_are_the_envs(env_id):
                    decision = _decide(
                        agent,
                        pool,
                        obs,
                        np.asarray(movers),
                        slots.opponent[movers],
                        slots.opponent_of[playing],
                    )
                if agent.shutdown_requested:
                    return self._turn_stats(agent, slots, pool)
                if like_action is None and decision.actions.size:
                    like_action = decision.actions[0]
                try:
                    slots.play(playing, movers, decision.env_actions, decision)
                except Exception as exc:  # noqa: BLE001 - the env's own error, in one line
                    raise env_crashed(env_id, exc, "while its games moved") from None
            if pool is not None:
                pool.offer(agent.runner)
            rows = slots.emit(like_action)
            try:
                agent.record(
                    **rows.step_arrays(),
                    next_obs=rows.next_obs,
                    final_obs=rows.final_obs,
                    valid=rows.valid,
                    version=rows.version,
                )
            except BadExperience as exc:
                ended = rows.terminated | rows.truncated
                raise self._bad_env_value(exc, env_id, slots.episode_steps, ended) from None
        return self._turn_stats(agent, slots, pool)

    @staticmethod
    def _turn_stats(agent: Agent, slots: TurnSlots, pool: OpponentPool | None) -> dict[str, float]:
        """The actor's stats, with its games against the pool (said in its bye)."""
        if pool is None:
            return dict(agent.stats)
        results = slots.results
        extra = {
            **pool.stats(),
            "self_play/wins": float(results["win"]),
            "self_play/draws": float(results["draw"]),
            "self_play/losses": float(results["loss"]),
        }
        agent.stats.update(extra)
        return dict(agent.stats)

    @staticmethod
    def _bad_env_value(
        exc: BadExperience, env_id: str, episode_steps: np.ndarray, ended: np.ndarray
    ) -> BadEnvValue:
        """The error naming the env, slot, episode step and field of ``exc``; a reset
        observation (of an episode that just ended) is named as such."""
        slot, field = exc.slot, ENV_FIELDS.get(exc.field, exc.field)
        if exc.field not in ENV_FIELDS:  # values, log-probs, actions: the policy's
            return BadEnvValue(f"the policy acting on env {env_id} produced {exc}")
        if exc.field == "next_obs" and ended[slot]:
            field, step = "reset observation", 0
        else:
            step = int(episode_steps[slot])
        detail = str(exc).split(": ", 1)[1]
        return BadEnvValue(
            f"env {env_id} returned a non-finite or out-of-range {field} in slot {slot} at "
            f"step {step} of its episode ({exc.step} steps of that slot since the welcome): "
            f"{detail}"
        )


__all__ = [
    "PAUSE_WAIT_S",
    "BadEnvValue",
    "EnvCrashed",
    "GymActor",
    "SpaceMismatch",
    "env_seeds",
    "load_weights",
]
