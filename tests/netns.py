"""Separate hosts on one machine: Linux network namespaces joined by a bridge.

:class:`Topology` makes one namespace per host plus one for the switch (a Linux
bridge), and a veth pair per host: ``eth0`` in the host's namespace, a port of
the bridge at the other end. Every address lives in one private /24 inside these
namespaces only (nothing is added to the machine's own namespace), so a test can
reach, and cut, nothing but its own hosts. A cut is the switch port going down
(``ip link set PORT down``): the host's ``eth0`` loses carrier, packets in either
direction are lost, and TCP retransmits until the port comes back up.

Needs root and iproute2; :func:`unavailable` says why a test must skip otherwise.
:meth:`Topology.close` kills whatever still runs in the namespaces and deletes
them; it is safe to call on a half-built topology and more than once.

Also here: ``tests.netns:SlowStub-v0``, the stub env with a fixed step time, so
that a run's speed has an upper bound whatever the CPU (a fault must not be
outrun by the budget).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence

import gymnasium as gym

from tests.stub_env import StubEnv

SUBNET_PREFIX = "10.231"
"""Addresses are SUBNET_PREFIX.<x>.<n>/24 with x from the test process's pid."""
BRIDGE = "br0"
SLOW_STEP_S = 0.02
"""Step time of SlowStub-v0: at most 50 steps per second per env."""


class SlowStubEnv(StubEnv):
    """:class:`~tests.stub_env.StubEnv` whose every step takes ``SLOW_STEP_S``: a
    slow simulator, bounding how fast a run can go."""

    def step(self, action):
        time.sleep(SLOW_STEP_S)
        return super().step(action)


if "SlowStub-v0" not in gym.registry:
    gym.register("SlowStub-v0", entry_point=SlowStubEnv, disable_env_checker=True)

SLOW_ENV_ID = "tests.netns:SlowStub-v0"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


def unavailable() -> str:
    """Why namespaces cannot be used here ('' when they can): not root, no ``ip``, or
    ``ip netns add`` refused (e.g. an unprivileged container)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    probe = f"zrl{os.getpid()}probe"
    result = _ip("netns", "add", probe, check=False)
    if result.returncode != 0:
        return f"ip netns add failed: {result.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return ""


class Topology:
    """Hosts ``names`` (e.g. ``["l", "a1", "a2"]``), each in namespace
    ``zrl<pid><name>``, on one bridge in namespace ``zrl<pid>br``."""

    def __init__(self, names: Sequence[str], tag: str | None = None) -> None:
        self.tag = tag or str(os.getpid())
        self.names = list(names)
        self.bridge_ns = f"zrl{self.tag}br"
        self.subnet = f"{SUBNET_PREFIX}.{20 + os.getpid() % 200}"
        self.created: list[str] = []

    def ns(self, name: str) -> str:
        """The namespace of host ``name``."""
        return f"zrl{self.tag}{name}"

    def address(self, name: str) -> str:
        """The IPv4 address of host ``name``."""
        return f"{self.subnet}.{self.names.index(name) + 1}"

    def port(self, name: str) -> str:
        """The bridge port (in the bridge's namespace) that host ``name`` hangs on."""
        return f"p{self.names.index(name)}"

    def prefix(self, name: str) -> list[str]:
        """Command prefix that runs a program on host ``name``."""
        return ["ip", "netns", "exec", self.ns(name)]

    def up(self) -> Topology:
        """Create everything; on an error, undo what was made and re-raise."""
        try:
            for ns in [self.bridge_ns, *map(self.ns, self.names)]:
                if ns in self._existing():  # a leftover of a killed run with our pid
                    self._delete(ns)
                _ip("netns", "add", ns)
                self.created.append(ns)
                _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", self.bridge_ns, "link", "add", BRIDGE, "type", "bridge")
            _ip("-n", self.bridge_ns, "link", "set", BRIDGE, "up")
            for name in self.names:
                port, ns = self.port(name), self.ns(name)
                _ip(
                    "-n",
                    self.bridge_ns,
                    "link",
                    "add",
                    port,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    "eth0",
                    "netns",
                    ns,
                )
                _ip("-n", self.bridge_ns, "link", "set", port, "master", BRIDGE)
                _ip("-n", self.bridge_ns, "link", "set", port, "up")
                _ip("-n", ns, "addr", "add", f"{self.address(name)}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
        except BaseException:
            self.close()
            raise
        return self

    def cut(self, name: str) -> None:
        """Unplug host ``name``: its bridge port goes down."""
        _ip("-n", self.bridge_ns, "link", "set", self.port(name), "down")

    def restore(self, name: str) -> None:
        """Plug host ``name`` back in."""
        _ip("-n", self.bridge_ns, "link", "set", self.port(name), "up")

    def close(self) -> None:
        """Kill every process left in the namespaces, then delete them."""
        for ns in reversed(self.created):
            self._delete(ns)
        self.created.clear()

    @staticmethod
    def _existing() -> set[str]:
        result = _ip("netns", "list", check=False)
        return {line.split()[0] for line in result.stdout.splitlines() if line.strip()}

    @staticmethod
    def _delete(ns: str) -> None:
        pids = _ip("netns", "pids", ns, check=False).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        _ip("netns", "del", ns, check=False)
