"""Shared fixtures: free port blocks for learners, the stub env id."""

from __future__ import annotations

import socket

import pytest

STUB_ENV_ID = "tests.stub_env:Stub-v0"


def free_port_block(size: int = 3, start: int = 20000, stop: int = 60000) -> int:
    """The first port of ``size`` consecutive free TCP ports on 127.0.0.1."""
    import random

    for _ in range(200):
        base = random.randrange(start, stop - size)
        socks = []
        try:
            for port in range(base, base + size):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no block of free ports found")


@pytest.fixture
def learner_port() -> int:
    """Control port of a free (port, port + 1, port + 2) block."""
    return free_port_block(3)
