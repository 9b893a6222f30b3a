"""Shared fixtures: free port blocks for learners, the stub env id."""

from __future__ import annotations

import pytest
import zmq

from tests.ports import free_port_block

STUB_ENV_ID = "tests.stub_env:Stub-v0"


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
