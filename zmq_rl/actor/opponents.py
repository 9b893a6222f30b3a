"""The opponent pool of turn-based self-play: frozen snapshots of the policy that an
actor plays its learning seats against, never trained on (no sockets).

Playing only the latest policy against itself lets a game's strategies chase each
other in circles; a pool of earlier snapshots keeps the policy honest against what it
already beat (the "uniform over past" choice of Sample Factory's and OpenAI Five's
self-play). The actor takes a snapshot of the weights it acts with every
``every`` policy versions (the first at its welcome), keeps the newest ``size``, and
after each new version draws the opponent uniformly among them; every opponent seat
of the actor's games plays that snapshot until the next draw, sampling its moves.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from ..rl.policy import export_weights, import_weights
from ..wire.protocol import Welcome
from ..wire.spaces import env_actions
from .agent import PolicyRunner

__all__ = ["OpponentPool"]


class OpponentPool:
    """Snapshots ``(version, weights)`` of the acting policy and the one drawn to play."""

    def __init__(self, size: int, every: int, welcome: Welcome, seed: int) -> None:
        self.snapshots: deque[tuple[int, list[tuple[str, np.ndarray]]]] = deque(maxlen=size)
        self.every = int(every)
        self.runner = PolicyRunner(welcome, seed)  # the network a snapshot is loaded into
        self.rng = np.random.default_rng(seed)
        self.playing = -1  # the version of the snapshot drawn
        self._seen = -1  # the acting version at the last offer

    def offer(self, acting: PolicyRunner) -> None:
        """After ``acting`` moved to a new version: take a snapshot if one is due, and
        draw the opponent anew."""
        version = acting.version
        if version == self._seen:
            return
        self._seen = version
        if not self.snapshots or version >= self.snapshots[-1][0] + self.every:
            self.snapshots.append((version, export_weights(acting.policy)))
        self.playing, weights = self.snapshots[int(self.rng.integers(len(self.snapshots)))]
        import_weights(self.runner.policy, weights)

    def act(self, obs: Any) -> np.ndarray:
        """The drawn snapshot's (sampled) env actions for a batch of observations."""
        self.runner.check_mask(obs, "opponent observation")
        actions, _, _, _ = self.runner.act(obs, None)
        return env_actions(self.runner.action_space, actions)

    def stats(self) -> dict[str, float]:
        """What the actor reports of its pool (in its bye)."""
        return {
            "self_play/snapshots": float(len(self.snapshots)),
            "self_play/oldest_version": float(self.snapshots[0][0]) if self.snapshots else -1.0,
            "self_play/playing_version": float(self.playing),
        }
