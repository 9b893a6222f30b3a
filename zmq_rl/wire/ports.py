"""Free TCP port blocks for whatever starts a learner on ports nobody chose: the
conformance tool's learner, the tests and the benchmarks.

A learner binds three consecutive ports (control, experience, weights); a product
started by a user is told its ports. A block picked here is free when it is picked,
not promised to stay free: the caller binds it at once.
"""

from __future__ import annotations

import os
import random
import socket

__all__ = ["DEFAULT_RANGE", "LISTEN_PORTS_BELOW", "PORT_RANGE_ENV", "free_port_block", "port_range"]

LISTEN_PORTS_BELOW = 32768
"""Linux's ephemeral ports start here (net.ipv4.ip_local_port_range). A listening port
above it can be taken, while its server is down, by an outgoing connection's local
port, e.g. by an actor reconnecting to that very port on loopback (a TCP
self-connect): learners that are restarted on the same ports pick theirs below it."""

PORT_RANGE_ENV = "ZMQ_RL_TEST_PORTS"
"""``START-STOP`` (e.g. ``40000-45000``): the ports :func:`free_port_block` picks from
(blocks lie within ``[START, STOP)``), for a machine where 20000-32767 is firewalled or
shared with other services, or to keep concurrent test runs apart."""
DEFAULT_RANGE = (20000, LISTEN_PORTS_BELOW)


def port_range() -> tuple[int, int]:
    """``(start, stop)`` from :data:`PORT_RANGE_ENV`, else :data:`DEFAULT_RANGE`; a
    malformed value is a ``ValueError`` naming the variable and the value."""
    text = os.environ.get(PORT_RANGE_ENV, "").strip()
    if not text:
        return DEFAULT_RANGE
    start, sep, stop = text.partition("-")
    try:
        lo, hi = int(start), int(stop)
    except ValueError:
        lo = hi = -1
    if not sep or not 1024 <= lo < hi <= 65536 or hi - lo < 16:
        raise ValueError(
            f"{PORT_RANGE_ENV}={text!r}: must be START-STOP with 1024 <= START, "
            "START + 16 <= STOP <= 65536 (e.g. 40000-45000)"
        )
    return lo, hi


def free_port_block(
    size: int = 3, start: int | None = None, stop: int | None = None, host: str = "127.0.0.1"
) -> int:
    """The first port of ``size`` consecutive free TCP ports on ``host`` (a learner
    binds port .. port + 2), by default below the ephemeral range
    (:data:`LISTEN_PORTS_BELOW`), where no outgoing connection can take it while its
    server is down. ``start``/``stop`` default to :data:`PORT_RANGE_ENV`'s range
    (20000-32768 when it is not set)."""
    lo, hi = port_range()
    start = lo if start is None else start
    stop = hi if stop is None else stop
    for _ in range(200):
        base = random.randrange(start, stop - size)
        socks = []
        try:
            for port in range(base, base + size):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                socks.append(s)
                s.bind((host, port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no block of {size} free ports found in {start}-{stop}")
