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

A long link: :meth:`Topology.delay` adds ``tc netem`` delay on a host's ``eth0``
where the kernel has netem (:func:`netem_unavailable` says why not otherwise); where
it has not, :class:`DelayLine` is a userspace delay line, a TCP relay on a host of its
own that holds every byte for a fixed time in each direction (run it in a namespace
with ``python -m tests.netns delay-line ...``).

Also here: ``tests.netns:SlowStub-v0``, the stub env with a fixed step time, so
that a run's speed has an upper bound whatever the CPU (a fault must not be
outrun by the budget).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
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


def netem_unavailable() -> str:
    """Why ``tc netem`` cannot delay a link here ('' when it can): no ``tc``, or a
    kernel without the netem qdisc. Needs namespaces (:func:`unavailable`)."""
    if shutil.which("tc") is None:
        return "the tc command (iproute2) is not installed"
    probe = f"zrl{os.getpid()}netem"
    if _ip("netns", "add", probe, check=False).returncode != 0:
        return "cannot create a network namespace"
    try:
        _ip("-n", probe, "link", "set", "lo", "up", check=False)
        result = subprocess.run(
            ["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root", "netem"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return "" if result.returncode == 0 else f"tc netem: {result.stderr.strip()}"
    finally:
        _ip("netns", "del", probe, check=False)


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

    def delay(self, name: str, seconds: float) -> None:
        """Delay every packet host ``name`` sends by ``seconds`` (``tc netem`` on its
        ``eth0``; see :func:`netem_unavailable`)."""
        result = subprocess.run(
            [*self.prefix(name), "tc", "qdisc", "replace", "dev", "eth0", "root", "netem"]
            + ["delay", f"{seconds * 1000:g}ms"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if result.returncode != 0:
            raise RuntimeError(f"tc netem on {name}: {result.stderr.strip()}")

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


# -- a userspace delay line -----------------------------------------------------------

DELAY_CHUNKS = 1024
"""Chunks (of at most 64 KiB) a direction of a DelayLine connection may hold: a bound of
64 MiB, after which it stops reading and TCP pushes back."""


class DelayLine:
    """A TCP relay that delays every byte by ``delay`` seconds in each direction (so a
    round trip through it takes ``2 * delay`` longer), for kernels without netem.

    It listens on ``ports`` of ``listen`` and relays each connection to the same port
    of ``target``: an actor given the relay's address reaches the learner's three
    sockets through it (the welcome names the ports, not the host). Bytes keep their
    order; each direction holds at most :data:`DELAY_CHUNKS` chunks.
    """

    def __init__(self, listen: str, target: str, ports: Sequence[int], delay: float) -> None:
        self.listen, self.target, self.ports, self.delay = listen, target, list(ports), delay

    async def _direction(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(DELAY_CHUNKS)

        async def take_in() -> None:
            while chunk := await reader.read(65536):
                await queue.put((loop.time() + self.delay, chunk))
            await queue.put((loop.time() + self.delay, b""))

        async def give_out() -> None:
            while True:
                due, chunk = await queue.get()
                await asyncio.sleep(max(0.0, due - loop.time()))
                if not chunk:
                    return
                writer.write(chunk)
                await writer.drain()

        reading = asyncio.ensure_future(take_in())
        try:
            await give_out()
        finally:
            reading.cancel()
            writer.close()

    async def _relay(
        self, port: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            far_reader, far_writer = await asyncio.open_connection(self.target, port)
        except OSError:
            writer.close()
            return
        directions = [
            asyncio.ensure_future(self._direction(reader, far_writer)),
            asyncio.ensure_future(self._direction(far_reader, writer)),
        ]
        with contextlib.suppress(ConnectionError, OSError):
            await asyncio.wait(directions, return_when=asyncio.FIRST_COMPLETED)
        for task in directions:
            task.cancel()

    async def _wait_for_target(self, deadline: float) -> None:
        """Until every target port accepts a connection: a relay that accepted while the
        learner was not there yet would have to close at once, and a ZeroMQ peer takes
        a connection closed during its handshake for a failed handshake, not a learner
        that is still starting (a refused connection, which it retries)."""
        loop = asyncio.get_running_loop()
        for port in self.ports:
            while True:
                try:
                    _, writer = await asyncio.open_connection(self.target, port)
                except OSError:
                    if loop.time() > deadline:
                        raise
                    await asyncio.sleep(0.05)  # polling a port, with a deadline
                    continue
                writer.close()
                break

    async def serve(self, seconds: float) -> None:
        """Relay for ``seconds`` (a bound: the caller's run must fit in it), then stop.
        Listens only once the target's ports are open."""
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        await self._wait_for_target(end)
        servers = [
            await asyncio.start_server(
                lambda r, w, port=port: self._relay(port, r, w), self.listen, port
            )
            for port in self.ports
        ]
        print(f"delay line {self.listen} -> {self.target} ports {self.ports}", flush=True)
        try:
            await asyncio.sleep(max(0.0, end - loop.time()))
        finally:
            for server in servers:
                server.close()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.netns delay-line LISTEN TARGET DELAY_S SECONDS PORT...``."""
    parser = argparse.ArgumentParser(prog="python -m tests.netns")
    sub = parser.add_subparsers(dest="command", required=True)
    line = sub.add_parser("delay-line", help="relay TCP ports with a delay each way")
    line.add_argument("listen")
    line.add_argument("target")
    line.add_argument("delay", type=float, help="seconds added in each direction")
    line.add_argument("seconds", type=float, help="stop after this long")
    line.add_argument("ports", type=int, nargs="+")
    args = parser.parse_args(argv)
    relay = DelayLine(args.listen, args.target, args.ports, args.delay)
    asyncio.run(relay.serve(args.seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
