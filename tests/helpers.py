"""Helpers shared by the socket tests."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from tests.conftest import STUB_ENV_ID
from zmq_rl.config import LearnerConfig

JOIN_TIMEOUT = 30.0
STARVATION_TIMEOUT = 30.0


def stub_learner_config(port: int, **changes: Any) -> LearnerConfig:
    """A small learner on the stub env, bound at ``port``: one actor with one slot,
    8-step rollouts sent as one fragment, 10 updates, a one-episode evaluation, seed 0,
    no periodic checkpoints. ``changes`` override any field."""
    base: dict[str, Any] = dict(
        env_id=STUB_ENV_ID,
        port=port,
        num_actors=1,
        envs_per_actor=1,
        num_steps=8,
        fragment_length=8,
        total_env_steps=8 * 10,
        eval_episodes=1,
        seed=0,
        starvation_timeout=STARVATION_TIMEOUT,
        checkpoint_every=0,
    )
    return LearnerConfig(**{**base, **changes})


class Background:
    """Run ``fn`` in a daemon thread; keep its result or exception (``error``)."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None

        def target() -> None:
            try:
                self.result = fn()
            except BaseException as exc:  # noqa: BLE001 - inspected by the test
                self.error = exc

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()

    def alive(self) -> bool:
        return self.thread.is_alive()

    def join(self, timeout: float = JOIN_TIMEOUT) -> Any:
        """Wait (bounded) for the thread; fail if it is still running."""
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"thread still running after {timeout}s"
        return self.result


class CheckedBackground(Background):
    """A :class:`Background` whose ``join`` re-raises the thread's exception."""

    def join(self, timeout: float = JOIN_TIMEOUT) -> Any:
        result = super().join(timeout)
        if self.error is not None:
            raise self.error
        return result
