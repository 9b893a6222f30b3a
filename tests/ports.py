"""Free TCP port blocks for tests and benchmarks that start learners (not part of the
package: a product never needs to guess a free port)."""

from __future__ import annotations

import random
import socket

LISTEN_PORTS_BELOW = 32768
"""Linux's ephemeral ports start here (net.ipv4.ip_local_port_range). A listening port
above it can be taken, while its server is down, by an outgoing connection's local
port, e.g. by an actor reconnecting to that very port on loopback (a TCP
self-connect): learners that are restarted on the same ports pick theirs below it."""


def free_port_block(size: int = 3, start: int = 20000, stop: int = LISTEN_PORTS_BELOW) -> int:
    """The first port of ``size`` consecutive free TCP ports on 127.0.0.1 (for
    tests and benchmarks that start learners: a learner binds port .. port + 2),
    below the ephemeral range (:data:`LISTEN_PORTS_BELOW`), where no outgoing
    connection can take it while its server is down."""
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
