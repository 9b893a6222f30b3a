"""The opponent pool of turn-based self-play: frozen snapshots of the policy that an
actor plays its learning seats against, never trained on (no sockets).

Playing only the latest policy against itself lets a game's strategies chase each
other in circles; a pool of earlier snapshots keeps the policy honest against what it
already beat (Sample Factory's and OpenAI Five's self-play). The actor takes a
snapshot of the weights it acts with once per span of ``every`` policy versions (the
first at its welcome; then the first version it loads at or past the next multiple of
``every``, so versions it skips, newest wins, never thin the pool out) and keeps the
newest ``size`` (docs/protocol.md section 4.4, "The snapshot pool"). Every game against
the pool draws its opponent when it starts (:meth:`OpponentPool.choose`), by
``choice``:

* ``uniform``: uniformly over the pool ("uniform over past");
* ``latest``: the newest snapshot;
* ``win_rate``: prioritised fictitious self-play (AlphaStar, Vinyals et al. 2019,
  "Grandmaster level in StarCraft II", PFSP with f(x) = (1 - x)^2): snapshot ``v``
  with weight ``(1 - x_v)^2``, ``x_v`` the policy's smoothed score against it so far
  (wins + draws / 2 + 1, over games + 2), so the snapshots it beats least are
  played most; never 0, so none is forgotten.

The pool keeps every game's result by snapshot (:meth:`OpponentPool.record`) and
reports them in the actor's bye (:meth:`OpponentPool.stats`), from which the
learner makes the run's table of snapshots (``report.json`` ``self_play``).
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from ..wire.protocol import Welcome
from ..wire.spaces import env_actions, map_value
from .agent import PolicyRunner

__all__ = ["OUTCOMES", "OpponentPool"]

OUTCOMES = ("win", "draw", "loss")
"""A game's result for the policy's seat."""


class OpponentPool:
    """Snapshots ``(version, network)`` of the acting policy, each game's draw among
    them, and the results against each."""

    def __init__(
        self, size: int, every: int, welcome: Welcome, seed: int, choice: str = "uniform"
    ) -> None:
        self.size = int(size)
        self.every = int(every)
        self.choice = choice
        self.welcome = welcome
        self.seed = int(seed)
        self.snapshots: deque[int] = deque()  # versions, oldest first
        self.runners: dict[int, PolicyRunner] = {}  # the network of each snapshot
        self.results: dict[int, list[int]] = {}  # version -> [wins, draws, losses]
        self.rng = np.random.default_rng(seed)
        self._seen = -1  # the acting version at the last offer

    def offer(self, acting: PolicyRunner) -> None:
        """After ``acting`` moved to a new version: take a snapshot if one is due (its
        version is in a later span of ``every`` versions than the newest snapshot's:
        ``version // every`` is greater), dropping the oldest beyond ``size``."""
        version = acting.version
        if version == self._seen:
            return
        self._seen = version
        if self.snapshots and version // self.every <= self.snapshots[-1] // self.every:
            return
        runner = (
            self.runners.pop(self.snapshots.popleft())
            if len(self.snapshots) >= self.size
            else PolicyRunner(self.welcome, self.seed + len(self.runners) + 1)
        )
        runner.load_tensors(acting.named_weights())
        self.snapshots.append(version)
        self.runners[version] = runner

    def choose(self) -> int:
        """The snapshot (its version) a game that starts now is played against."""
        versions = list(self.snapshots)
        if self.choice == "latest" or len(versions) == 1:
            return versions[-1]
        if self.choice == "win_rate":
            scores = np.array([self.score(v) for v in versions])
            weights = (1.0 - scores) ** 2
            return versions[int(self.rng.choice(len(versions), p=weights / weights.sum()))]
        return versions[int(self.rng.integers(len(versions)))]

    def score(self, version: int) -> float:
        """The policy's smoothed score against snapshot ``version`` (a win 1, a draw
        1/2): (wins + draws / 2 + 1) / (games + 2); 1/2 before any game."""
        wins, draws, losses = self.results.get(version, (0, 0, 0))
        return (wins + draws / 2 + 1) / (wins + draws + losses + 2)

    def record(self, version: int, outcome: str) -> None:
        """A game against snapshot ``version`` ended with ``outcome`` for the policy."""
        self.results.setdefault(version, [0, 0, 0])[OUTCOMES.index(outcome)] += 1

    def act(self, obs: Any, versions: np.ndarray) -> np.ndarray:
        """The (sampled) env actions of each row's snapshot (``versions``, one per
        row; a snapshot dropped from the pool mid-game hands its games to the oldest
        kept): one batched forward per snapshot."""
        out: np.ndarray | None = None
        for version in np.unique(versions):
            rows = np.flatnonzero(versions == version)
            runner = self.runners.get(int(version)) or self.runners[self.snapshots[0]]
            mine = map_value(lambda a, rows=rows: a[rows], obs)
            runner.check_mask(mine, "opponent observation")
            actions, _, _, _ = runner.act(mine, None)
            moves = env_actions(runner.action_space, actions)
            if out is None:
                out = np.empty((len(versions), *moves.shape[1:]), moves.dtype)
            out[rows] = moves
        assert out is not None, "no opponent rows"
        return out

    def stats(self) -> dict[str, float]:
        """What the actor reports of its pool (in its bye): its size and oldest
        snapshot, and its games against every snapshot it played,
        ``self_play/vs/<version>/wins|draws|losses``."""
        out = {
            "self_play/snapshots": float(len(self.snapshots)),
            "self_play/oldest_version": float(self.snapshots[0]) if self.snapshots else -1.0,
        }
        for version, counts in self.results.items():
            for name, n in zip(("wins", "draws", "losses"), counts, strict=True):
                out[f"self_play/vs/{version}/{name}"] = float(n)
        return out
