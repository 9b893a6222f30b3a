"""Shared fixtures: free port blocks for learners, the stub env id."""

from __future__ import annotations

import pytest

from zmq_rl.transport import free_port_block

STUB_ENV_ID = "tests.stub_env:Stub-v0"


@pytest.fixture
def learner_port() -> int:
    """Control port of a free (port, port + 1, port + 2) block."""
    return free_port_block(3)
