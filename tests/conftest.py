"""Shared fixtures: free port blocks for learners, a ZeroMQ context, learners running in
a thread. ``STUB_ENV_ID`` and ``free_port_block`` are importable from here too."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import zmq

from tests.helpers import STUB_ENV_ID as STUB_ENV_ID  # re-exported
from tests.helpers import STUB_POLICY, CheckedBackground
from tests.ports import free_port_block
from zmq_rl.config import LearnerConfig, PolicyConfig, PPOConfig
from zmq_rl.learner.loop import Learner

StartLearner = Callable[..., tuple[Learner, CheckedBackground]]


@pytest.fixture
def learner_port() -> int:
    """Control port of a free (port, port + 1, port + 2) block."""
    return free_port_block(3)


@pytest.fixture
def ctx():
    """A private ZeroMQ context, destroyed (linger 0) after the test."""
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
def start_learner(ctx) -> Iterator[StartLearner]:
    """``start_learner(cfg, ppo=PPOConfig(num_epochs=1), policy=STUB_POLICY)`` builds a
    Learner on ``ctx`` and runs it in a thread: it returns ``(learner, run)``, ``run`` a
    CheckedBackground whose ``join`` returns the run's report. Every learner started is
    closed after the test (before ``ctx`` is destroyed)."""
    learners: list[Learner] = []

    def start(
        cfg: LearnerConfig,
        ppo: PPOConfig | None = None,
        policy: PolicyConfig = STUB_POLICY,
    ) -> tuple[Learner, CheckedBackground]:
        learner = Learner(cfg, ppo or PPOConfig(num_epochs=1), policy, context=ctx)
        learners.append(learner)
        return learner, CheckedBackground(learner.run)

    yield start
    for learner in learners:
        learner.close()
