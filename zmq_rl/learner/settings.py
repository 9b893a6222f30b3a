"""What a learner tells its actors, and how its loop ends early.

:func:`run_settings` is the welcome's ``config`` (every actor of a run obeys it);
:class:`LearnerStarved` and :class:`StopRequested` end a learner's loop. Shared by the
learner (:mod:`zmq_rl.learner.loop`), its other ranks (:mod:`zmq_rl.learner.ranks`)
and the conformance tool, so none of them imports another for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import gymnasium as gym

from ..config import (
    ConfigError,
    LearnerConfig,
    PolicyConfig,
    config_dict,
    parse_policy_hidden_sizes,
    parse_policy_map,
    resolve_policy_map,
)
from ..envs import EnvShape
from ..wire.protocol import RunSettings
from .evaluation import opponent_player
from .ingest import fragment_limit

__all__ = [
    "HEARTBEAT_INTERVAL_S",
    "BatchPlan",
    "LearnerStarved",
    "PolicyPlan",
    "StopRequested",
    "batch_plan",
    "check_env_settings",
    "policy_plan",
    "run_settings",
]

HEARTBEAT_INTERVAL_S = 1.0
"""How often the learner and its actors send heartbeats (RunSettings.heartbeat_interval)."""


class LearnerStarved(RuntimeError):
    """No rollout could be completed within ``starvation_timeout``."""


class StopRequested(Exception):
    """Raised inside the loop when :meth:`Learner.request_stop` was called."""


@dataclass(frozen=True)
class PolicyPlan:
    """The policies of a run: ``agent_policies`` (the policy id of each agent index)
    and ``configs`` (each policy's network, in order of first appearance). Empty for
    the usual run of one policy shared by every agent."""

    agent_policies: list[str] = field(default_factory=list)
    configs: dict[str, PolicyConfig] = field(default_factory=dict)

    @property
    def several(self) -> bool:
        """Whether the run trains more than one policy."""
        return len(self.configs) > 1


def policy_plan(cfg: LearnerConfig, policy_cfg: PolicyConfig, shape: EnvShape) -> PolicyPlan:
    """The run's :class:`PolicyPlan` from ``policy_map`` and ``policy_hidden_sizes``
    against the env's agents. A :class:`ConfigError` names what is wrong, before any
    socket or process: a map on a single-agent env, an agent without a policy, an
    entry that maps no agent, and what several policies cannot be combined with yet
    (an opponent pool, learner ranks, recurrent or custom networks)."""
    entries = parse_policy_map(cfg.policy_map)
    if not entries:
        return PolicyPlan()
    if not shape.agents:
        raise ConfigError(
            "policy_map", cfg.policy_map, f"{cfg.env_id} is a single-agent env: nothing to map"
        )
    agent_policies = resolve_policy_map(entries, list(shape.agents), cfg.env_id)
    ids = list(dict.fromkeys(agent_policies))
    if len(ids) == 1:
        return PolicyPlan()  # every agent maps to one policy: the shared-policy run
    for name, value, why in (
        ("opponent_pool", cfg.opponent_pool, "snapshot opponents are self-play of one policy"),
        ("num_learners", cfg.num_learners, "several policies train on one learner rank"),
    ):
        if value not in (0, 1):
            raise ConfigError(name, value, f"cannot be combined with policy_map: {why}")
    if policy_cfg.policy_type != "mlp" or policy_cfg.factory:
        raise ConfigError(
            "policy_map",
            cfg.policy_map,
            "several policies need the built-in feed-forward network for now "
            f"(policy_type={policy_cfg.policy_type!r}, factory={policy_cfg.factory!r})",
        )
    sizes = parse_policy_hidden_sizes(cfg.policy_hidden_sizes)
    configs = {
        pid: replace(policy_cfg, hidden_sizes=sizes.get(pid, policy_cfg.hidden_sizes)).validate()
        for pid in ids
    }
    return PolicyPlan(agent_policies, configs)


@dataclass(frozen=True)
class BatchPlan:
    """How the learner takes each update's rows (``batch_mode``, docs/design.md
    section 10): ``rows`` True: ``segments`` segments of ``segment`` rows from whichever
    slots delivered (the oldest complete ones); False: ``segment`` rows of every member
    slot. ``lead`` is ``max_lead_steps`` as configured (0: derived) and
    ``max_policy_lag`` the lag bound (0: derived from the fleet, :meth:`lag_bound`)."""

    rows: bool
    segment: int
    segments: int = 0
    lead: int = 0
    max_policy_lag: int = 0
    broadcast_every: int = 1

    @property
    def rows_per_update(self) -> int:
        """Rows one update takes in a rows batch (0 for every-slot rollouts)."""
        return self.segment * self.segments

    def updates(self, cfg: LearnerConfig, agents_per_env: int) -> int:
        """The updates the budget buys (the progress display's total): budget over the
        fixed batch, or over the nominal fleet's rollout (:meth:`LearnerConfig.num_updates`)."""
        if self.rows:
            return max(1, cfg.total_env_steps // self.rows_per_update)
        return cfg.num_updates(agents_per_env)

    def grant_lead(self, live_slots: int) -> int:
        """The steps per slot a grant allows beyond the most the learner had used of any
        slot of the actor at its last publication: enough that the live slots can
        deliver a broadcast cycle and one batch more (``(broadcast_every + 1) *
        batch_rows`` rows), so the next update's rows are recorded while this one
        trains, as with the ``S``/``L`` valve's ``2 S``, and no more (a larger lead adds
        only policy lag once the learner is what the actors wait for, docs/design.md
        section 5.6); ``max_lead_steps`` when it is set and larger (a smaller one could
        leave the learner short of a cycle's rows)."""
        rows = (self.broadcast_every + 1) * self.rows_per_update
        return max(self.lead, 1, -(-rows // max(1, live_slots)))

    def lag_bound(self, live_slots: int) -> int:
        """The versions a row may lag the learner before it is dropped: ``max_policy_lag``
        when set, else twice the updates the grants let the live slots queue (each holds
        at most one segment beyond its lead, :meth:`grant_lead`), in versions, plus 2 (a
        broadcast in flight, a segment being recorded)."""
        if self.max_policy_lag:
            return self.max_policy_lag
        queued = live_slots * (self.grant_lead(live_slots) + self.segment)
        updates = -(-queued // max(1, self.rows_per_update))
        return 2 * -(-updates // self.broadcast_every) + 2


def batch_plan(cfg: LearnerConfig, agents_per_env: int, recurrent: bool) -> BatchPlan:
    """The run's :class:`BatchPlan`: ``batch_mode`` resolved (``auto`` is ``rows``, or
    ``slots`` for a recurrent policy, whose sequences need a slot's rows in one column,
    and for several learner ranks, whose plan fills every member slot). A
    :class:`ConfigError` names ``batch_mode`` when ``rows`` is asked of a recurrent
    policy."""
    mode = cfg.batch_mode
    if mode == "rows" and recurrent:
        raise ConfigError(
            "batch_mode",
            mode,
            "rows batches are for feed-forward policies: a recurrent policy's sequences "
            "need each slot's rows in one column (use slots or auto)",
        )
    rows = mode == "rows" or (mode == "auto" and not recurrent and cfg.num_learners == 1)
    if not rows:
        return BatchPlan(rows=False, segment=cfg.num_steps)
    return BatchPlan(
        rows=True,
        segment=cfg.num_steps,
        segments=max(1, cfg.batch_rows_for(agents_per_env) // cfg.num_steps),
        lead=cfg.max_lead_steps,
        max_policy_lag=cfg.max_policy_lag,
        broadcast_every=cfg.broadcast_every,
    )


def check_env_settings(
    cfg: LearnerConfig, shape: EnvShape, observation_space: gym.Space, action_space: gym.Space
) -> None:
    """The checks of ``cfg`` that need the env (``shape``): a :class:`ConfigError` names
    the field, before any socket binds or actor starts. Snapshot opponents, random
    openings and other evaluation opponents are for turn-based games; several learner
    ranks are for single-agent envs; ``eval_opponent`` must name a player that loads."""
    if cfg.opponent_pool and not shape.turn_based:
        raise ConfigError(
            "opponent_pool",
            cfg.opponent_pool,
            f"{cfg.env_id} is not a turn-based game: snapshot opponents play turn-based "
            "games only (0 turns the pool off)",
        )
    if cfg.opening_moves and not shape.turn_based:
        raise ConfigError(
            "opening_moves",
            cfg.opening_moves,
            f"{cfg.env_id} is not a turn-based game: random openings are for turn-based "
            "games only (0 turns them off)",
        )
    if cfg.eval_opponent != "random":
        if not shape.turn_based:
            raise ConfigError(
                "eval_opponent",
                cfg.eval_opponent,
                f"{cfg.env_id} is not a turn-based game: only those have other seats",
            )
        opponent_player(cfg.eval_opponent, observation_space, action_space)  # names the field
    if shape.agents_per_env > 1 and cfg.num_learners > 1:
        raise ConfigError(
            "num_learners",
            cfg.num_learners,
            f"{cfg.env_id} is a multi-agent env: it trains on one learner rank for now "
            "(the ranks' reports count every row as an env step)",
        )
    rows = cfg.batch_rows_for(shape.agents_per_env)
    if cfg.batch_mode != "slots" and cfg.total_env_steps < rows:
        raise ConfigError(
            "total_env_steps",
            cfg.total_env_steps,
            f"must cover at least one update ({rows} rows per update of {cfg.env_id})",
        )


def formula_valve(cfg: LearnerConfig, batch: BatchPlan | None) -> tuple[int, int]:
    """``(S, L)`` of the ``S``/``L`` valve (docs/protocol.md section 5.4) for actors that
    did not announce grants. Every-slot rollouts: ``broadcast_every * num_steps`` and
    ``max_lead_steps`` (or ``2 S``), exact. Rows batches: a broadcast cycle consumes
    ``broadcast_every * batch_rows`` rows from whichever slots delivered, unevenly, so a
    version proves nothing about one slot; ``S`` is then the whole cycle's rows, which
    one slot alone may deliver (so no fleet of such actors, however small, can stall the
    learner), and the lag bound drops what a fleet of them outruns (counted
    ``discarded/*/stale``; docs/design.md section 5.6)."""
    if batch is None or not batch.rows:
        return cfg.steps_per_broadcast(), cfg.effective_max_lead_steps()
    per_cycle = batch.rows_per_update * cfg.broadcast_every
    return per_cycle, max(cfg.max_lead_steps, per_cycle) if cfg.max_lead_steps else 2 * per_cycle


def run_settings(
    cfg: LearnerConfig,
    observation_space: gym.Space,
    action_space: gym.Space,
    policy_cfg: PolicyConfig,
    *,
    weights_bytes: int = 0,
    state_size: int = 0,
    agents_per_env: int = 1,
    plan: PolicyPlan | None = None,
    batch: BatchPlan | None = None,
) -> RunSettings:
    """The settings every actor of this run obeys (the welcome's ``config``), with
    ``num_envs`` the default an actor gets when its hello asks for none.

    ``weights_bytes`` is the encoded size of this run's weights message: actors must
    accept twice that (plus 64 KB) on their SUB socket. ``state_size`` is the policy's
    recurrent state per slot (0 for a feed-forward policy). ``plan``: the policies
    of a several-policy run (``policy_map``, ``policies``). ``batch``: the run's
    :class:`BatchPlan`; with rows batches, the ``S`` and ``L`` of actors without grants
    are those of the configured fleet (:func:`formula_valve`), and ``batch_rows`` says
    how many rows an update takes (informational, docs/protocol.md section 4.4)."""
    several = plan is not None and plan.several
    per_cycle, lead = formula_valve(cfg, batch)
    return RunSettings(
        env_id=cfg.env_id,
        observation_space=observation_space,
        action_space=action_space,
        policy=config_dict(next(iter(plan.configs.values())) if several else policy_cfg),
        num_steps=cfg.num_steps,
        broadcast_every=cfg.broadcast_every,
        steps_per_broadcast=per_cycle,
        max_lead_steps=lead,
        fragment_length=cfg.fragment_length,
        num_envs=cfg.num_envs * agents_per_env,
        seed=cfg.seed,
        heartbeat_interval=HEARTBEAT_INTERVAL_S,
        state_size=state_size,
        max_weights_bytes=2 * weights_bytes + 64 * 1024,
        max_fragment_bytes=fragment_limit(cfg, observation_space, action_space),
        env_kwargs=cfg.env_kwargs_map(),
        wrappers=list(cfg.wrappers),
        agents_per_env=agents_per_env,
        opponent_pool=cfg.opponent_pool,
        opponent_every=cfg.opponent_every,
        opponent_share=float(cfg.opponent_share),
        opponent_choice=cfg.opponent_choice,
        opening_moves=cfg.opening_moves,
        policy_map=list(plan.agent_policies) if several else [],
        policies={pid: config_dict(c) for pid, c in plan.configs.items()} if several else {},
        batch_rows=batch.rows_per_update if batch is not None and batch.rows else 0,
    )
