"""The learner's report: what a run consumed and produced (updates, env steps,
episodes, broadcasts, episode returns), plus what a distributed run adds (actors'
stats, counters, evaluations, dead and departed actors). ``report.json`` is this
dataclass as JSON."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

BUDGET_SPENT = "budget spent"
"""The stop reason of a run that consumed its ``total_env_steps``."""
TARGET_REACHED = "evaluation reached target_return"
"""How the stop reason of a run that an evaluation ended early begins (the target follows)."""
EPISODE_REWARDS_KEPT = 10_000
"""The report keeps the returns of (at least) the most recent this many episodes, so a
long run's memory stays flat; ``episodes_completed`` counts them all."""


def succeeded(stop_reason: str) -> bool:
    """Whether a run that stopped for ``stop_reason`` ended as it was meant to: its
    budget spent, or an evaluation reached ``target_return`` (not stopped, starved or
    failed). ``zmq-rl run`` then exits 0 with its summary, whatever its actors did
    after that end."""
    return stop_reason == BUDGET_SPENT or stop_reason.startswith(TARGET_REACHED)


@dataclass
class LearnerReport:
    """A run's outcome; ``to_json()`` is what ``report.json`` holds."""

    updates_completed: int = 0
    env_steps_consumed: int = 0
    episodes_completed: int = 0
    broadcasts_sent: int = 0
    last_policy_version: int = 0
    episode_rewards: list[float] = field(default_factory=list)
    """Returns of completed episodes in consumption order (the most recent 10,000
    or more on long runs; ``episodes_completed`` counts every one)."""
    final_stats: dict[str, float] | None = None
    actor_stats: dict[str, dict[str, Any]] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    evaluations: list[dict[str, float]] = field(default_factory=list)
    run_id: str = ""
    wall_seconds: float = 0.0
    stop_reason: str = ""
    dead_actors: list[dict[str, Any]] = field(default_factory=list)
    departed_actors: list[dict[str, Any]] = field(default_factory=list)
    """Report lines of registrations that ended before the run did (declared dead,
    replaced by a re-registration); ``actor_stats`` holds the final ones."""
    resumed_from: str = ""
    best_evaluation: dict[str, Any] | None = None
    """The evaluation with the highest mean return (its updates, env steps, version) and
    the file holding that policy (``policy-best.pt``); ``policy.pt`` is the final one."""
    self_play: list[dict[str, Any]] = field(default_factory=list)
    """Turn-based runs with an opponent pool: every snapshot the policy played, with
    the games' results and an Elo gap (:mod:`zmq_rl.learner.self_play`; also
    ``self_play.csv`` in the run dir)."""
    policies: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Several-policy runs (``policy_map``): each policy's agents, episodes, mean
    return of its last 100 episodes and last update's metrics, by policy id."""
    device: str = ""
    """Where the learner's policy and PPO update ran (``"cpu"``, ``"cuda:0"``): the
    ``device`` setting resolved on this machine."""

    @property
    def succeeded(self) -> bool:
        """Whether the run ended as it was meant to (:func:`succeeded`)."""
        return succeeded(self.stop_reason)

    def add_episodes(self, returns: list[float]) -> None:
        """Count finished episodes and keep their returns (the newest
        :data:`EPISODE_REWARDS_KEPT` or more: memory stays flat on long runs)."""
        self.episode_rewards.extend(returns)
        self.episodes_completed += len(returns)
        if len(self.episode_rewards) > 2 * EPISODE_REWARDS_KEPT:
            del self.episode_rewards[:-EPISODE_REWARDS_KEPT]

    def mean_recent_episode_reward(self, n: int) -> float:
        """Mean total reward of the last ``n`` completed episodes (0.0 before any)."""
        if not self.episode_rewards:
            return 0.0
        recent = self.episode_rewards[-n:]
        return float(sum(recent) / len(recent))

    def to_json(self) -> str:
        """The report as JSON (written as ``report.json`` in the run directory)."""
        return json.dumps(asdict(self), indent=2, default=float)
