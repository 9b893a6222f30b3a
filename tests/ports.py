"""Free TCP port blocks for tests that start learners: the package's own helper
(:mod:`zmq_rl.wire.ports`, which honours ``ZMQ_RL_TEST_PORTS``), importable from here."""

from __future__ import annotations

from zmq_rl.wire.ports import (  # noqa: F401  (the tests' names for it)
    DEFAULT_RANGE,
    LISTEN_PORTS_BELOW,
    PORT_RANGE_ENV,
    free_port_block,
    port_range,
)
