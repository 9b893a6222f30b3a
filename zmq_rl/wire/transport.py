"""ZeroMQ socket setup: endpoints, options (linger, HWM, max message size).

Every socket of the project is made by :func:`make_socket`, so each one has an
explicit linger and high-water mark. The chosen behaviour at the HWM:

* experience (actor PUSH → learner PULL): never dropped. PUSH blocks at its HWM;
  the actor's send waits (polling its control socket) until there is room.
* weights (learner PUB → actor SUB): may be dropped at the HWM (libzmq's PUB
  drops the new message for a subscriber whose queue is full); only the newest
  version matters, actors drain the queue and load only the newest.
* control (ROUTER / DEALER): small messages; ROUTER_MANDATORY makes a send to a
  peer that has gone raise instead of vanishing.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import zmq

from ..config import DEFAULT_PORT, ConfigError

log = logging.getLogger("zmq_rl.transport")

EXPERIENCE_HWM = 1000
"""Fragments queued per PUSH/PULL pipe before the sender blocks."""
EXPERIENCE_BUFFER_BYTES = 64 * 1024 * 1024
"""What the learner's PULL may buffer per peer, in bytes (RCVHWM is derived from it
and the largest message allowed)."""
WEIGHTS_HWM = 4
"""Weight blobs queued per PUB/SUB pipe; past it PUB drops the new blob for that
subscriber (a slow actor then catches up with the next broadcast)."""
CONTROL_HWM = 1000
"""Control messages queued per peer toward the learner's peers (ROUTER SNDHWM), and
the most queued from one peer (RCVHWM; see CONTROL_BUFFER_BYTES)."""
CONTROL_BUFFER_BYTES = 4 * 1024 * 1024
"""What the learner's ROUTER may buffer per peer, in bytes: its RCVHWM is this over
the control message limit, at least CONTROL_MIN_HWM."""
CONTROL_MIN_HWM = 16
"""The least RCVHWM of the learner's ROUTER (a legitimate actor sends one heartbeat
a second)."""
ACTOR_PUSH_LINGER_MS = 2000
"""How long an exiting actor keeps trying to deliver fragments it already sent."""


def parse_learner_address(address: str, default_port: int = DEFAULT_PORT) -> tuple[str, int]:
    """Split ``HOST[:PORT]`` or ``tcp://HOST:PORT`` into (host, control port).

    Raises ValueError naming the address when it cannot be parsed.
    """
    text = address.strip()
    if text.startswith("tcp://"):
        text = text[len("tcp://") :]
    if not text:
        raise ValueError(f"learner address {address!r} is empty")
    if text.startswith("["):  # [ipv6]:port
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host, port_text = text, ""
    if not host:
        raise ValueError(f"learner address {address!r} has no host")
    try:
        port = int(port_text) if port_text else default_port
    except ValueError:
        raise ValueError(
            f"learner address {address!r}: port {port_text!r} is not a number"
        ) from None
    if not 1 <= port <= 65535:
        raise ValueError(f"learner address {address!r}: port {port} out of range")
    return host, port


def tcp_endpoint(host: str, port: int) -> str:
    """``tcp://host:port`` (IPv6 hosts bracketed)."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"tcp://{host}:{port}"


@dataclass(frozen=True)
class SocketOptions:
    """Options every socket gets explicitly."""

    linger_ms: int = 0
    sndhwm: int = CONTROL_HWM
    rcvhwm: int = CONTROL_HWM
    max_message_bytes: int = -1  # -1: no limit (only for sockets that send)


def make_socket(ctx: zmq.Context, kind: int, options: SocketOptions) -> zmq.Socket:
    """Create a socket of ``kind`` with linger, HWMs and ZMQ_MAXMSGSIZE set."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, options.linger_ms)
    sock.setsockopt(zmq.SNDHWM, options.sndhwm)
    sock.setsockopt(zmq.RCVHWM, options.rcvhwm)
    sock.setsockopt(zmq.MAXMSGSIZE, options.max_message_bytes)
    sock.setsockopt(zmq.IPV6, 1)  # accept IPv6 hosts too (IPv4 keeps working)
    if kind == zmq.ROUTER:
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    if kind in (zmq.DEALER, zmq.ROUTER, zmq.PUSH, zmq.SUB):
        # Quick reconnects so that a restarted learner is found again fast.
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
    return sock


@dataclass(frozen=True)
class CurveServerKeys:
    """The learner's CURVE key pair and the folder of authorised actor public keys."""

    public: bytes
    secret: bytes
    authorized_dir: str


@dataclass(frozen=True)
class CurveClientKeys:
    """An actor's CURVE key pair and the learner's public key it must verify."""

    public: bytes
    secret: bytes
    server_public: bytes


def load_secret_certificate(path: str, what: str) -> tuple[bytes, bytes]:
    """(public, secret) from a ``zmq.auth`` secret certificate file.

    Raises :class:`~zmq_rl.config.ConfigError` naming ``what`` and the path when the
    file is missing, unreadable, not a certificate, or holds only a public key (the
    ``.key`` file given where the ``.key_secret`` one belongs): the CLIs print it as
    one ``error:`` line and exit 2.
    """
    public, secret = _read_certificate(path, what)
    if not secret:
        raise ConfigError(
            what, path, "holds only a public key; give the secret certificate (.key_secret)"
        )
    return public, secret


def load_public_certificate(path: str, what: str) -> bytes:
    """The public key of a ``zmq.auth`` certificate file (public or secret); a
    :class:`~zmq_rl.config.ConfigError` naming ``what`` and the path otherwise."""
    return _read_certificate(path, what)[0]


def _read_certificate(path: str, what: str) -> tuple[bytes, bytes | None]:
    import zmq.auth

    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(what, path, f"not a readable CURVE certificate ({detail})") from None
    if not public:
        raise ConfigError(what, path, "not a CURVE certificate (no public-key line)")
    return public, secret


def apply_curve_server(sock: zmq.Socket, keys: CurveServerKeys) -> None:
    """Make ``sock`` a CURVE server (peers are checked by the ZAP authenticator)."""
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public
    sock.curve_server = True


def apply_curve_client(sock: zmq.Socket, keys: CurveClientKeys) -> None:
    """Make ``sock`` a CURVE client that only talks to the learner's key."""
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public
    sock.curve_serverkey = keys.server_public


def start_authenticator(ctx: zmq.Context, keys: CurveServerKeys):  # -> ThreadAuthenticator
    """Start pyzmq's ZAP authenticator accepting only the keys in ``authorized_dir``;
    every key it refuses is logged with the peer's address (:class:`HandshakeWatch`
    rate-limits the lines, once :func:`bind_learner_sockets` made it)."""
    from zmq.auth.thread import ThreadAuthenticator
    from zmq.utils import z85

    if not os.path.isdir(keys.authorized_dir):
        raise ConfigError("curve_authorized_keys", keys.authorized_dir, "is not a directory")

    class LoggingAuthenticator(ThreadAuthenticator):
        watch: HandshakeWatch | None = None
        _address = _key = ""

        async def handle_zap_message(self, msg: list[bytes]) -> None:
            self._address = msg[3].decode("utf-8", "replace") if len(msg) > 3 else "unknown"
            self._key = ""
            await super().handle_zap_message(msg)

        async def _authenticate_curve(self, domain: str, client_key: bytes) -> tuple[bool, bytes]:
            self._key = z85.encode(client_key).decode() if client_key else ""
            return await super()._authenticate_curve(domain, client_key)

        def _send_zap_reply(self, request_id: bytes, status_code: bytes, *args: Any, **kw: Any):
            if status_code != b"200" and self.watch is not None:
                peer = self._address.removeprefix("::ffff:")
                self.watch.denied(peer, f"CURVE key {self._key or '?'} is not authorised")
            return super()._send_zap_reply(request_id, status_code, *args, **kw)

    auth = LoggingAuthenticator(ctx, log=logging.getLogger("zmq_rl.auth"))
    auth.start()
    auth.configure_curve(domain="*", location=keys.authorized_dir)
    return auth


HANDSHAKE_FAILED_EVENTS = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)
"""The socket-monitor events an actor watches to report a failed CURVE handshake."""


def handshake_failure(event: dict[str, Any], endpoint: str) -> str:
    """What a failed security handshake (a socket monitor ``event``) at ``endpoint``
    means, for the actor's ``auth_failed`` error."""
    detail = {
        zmq.EVENT_HANDSHAKE_FAILED_AUTH: "the learner refused this actor's CURVE key",
        zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "security mismatch (one side uses CURVE, "
        "the other not, or the learner's public key is wrong)",
    }.get(event["event"], "the security handshake failed (wrong learner key?)")
    return f"{detail} at {endpoint} (handshake event {event['event']}, value {event['value']})"


HANDSHAKE_LOG_EVERY_S = 10.0
"""A host whose CURVE handshakes fail is logged at most once per this many seconds
(the line says how many failed since the previous one)."""
HANDSHAKE_LOG_HOSTS = 1024
"""Hosts remembered for that rate limit (the oldest are forgotten first)."""
HANDSHAKE_FAILURE_KINDS = {
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "key_refused",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "bad_handshake",
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "bad_handshake",
}
"""Socket-monitor event -> the ``auth/handshake_failed/<kind>`` counter's kind."""


class HandshakeWatch:
    """Logs and counts failed CURVE handshakes on the learner's bound sockets.

    libzmq reports a failed handshake only to a socket monitor, which names the
    learner's own endpoint, not the peer. So:

    * a peer whose key the ZAP authenticator refuses is logged by the authenticator
      (:func:`start_authenticator`), which knows its address and key;
    * any other failure (a peer without CURVE, or holding the wrong learner key) is
      seen by a thread reading the monitors: on ``ACCEPTED`` it looks up the new
      connection's peer address; the ``HANDSHAKE_FAILED_*`` event is followed at once
      by that connection's ``DISCONNECTED``, which names it (``unknown`` when libzmq
      closed it before the address was read: a local peer failing within a
      millisecond).

    Every failure is counted in :attr:`failures` by kind (``key_refused``,
    ``bad_handshake``; the learner's ``auth/handshake_failed/<kind>`` counters); a
    host is logged at most once per :data:`HANDSHAKE_LOG_EVERY_S` (the line says how
    many failed since the previous one).
    """

    def __init__(self, sockets: dict[str, zmq.Socket]) -> None:
        import threading

        self.failures: dict[str, int] = {}
        self._lock = threading.Lock()
        self._monitors = {
            sock.get_monitor_socket(
                zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | HANDSHAKE_FAILED_EVENTS
            ): name
            for name, sock in sockets.items()
        }
        self._sockets = list(sockets.values())
        self._peers: dict[int, str] = {}  # descriptor -> peer address
        self._failed: dict[zmq.Socket, str] = {}  # monitor -> detail, until DISCONNECTED
        self._logged: dict[str, tuple[float, int]] = {}  # host -> (last line, failures since)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="zmq_rl-handshakes", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and the monitors (before the watched sockets close).

        Order matters: a watched socket's ``disable_monitor`` sends a last
        ``MONITOR_STOPPED`` event to its monitor PAIR, and a PAIR whose peer is gone
        blocks on send, so the monitors are closed only after monitoring stopped (a
        clean-clone CI run hung here once when the thread had closed them first)."""
        self._stop.set()
        self._thread.join(timeout=2.0)
        for sock in self._sockets:
            with contextlib.suppress(zmq.ZMQError):
                sock.disable_monitor()
        for monitor in self._monitors:
            monitor.close(linger=0)

    def _run(self) -> None:
        from zmq.utils.monitor import recv_monitor_message

        poller = zmq.Poller()
        for monitor in self._monitors:
            poller.register(monitor, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                for monitor, _ in poller.poll(50):
                    self._on_event(monitor, recv_monitor_message(monitor))
        except zmq.ZMQError:  # the context is terminating
            pass

    def _on_event(self, monitor: zmq.Socket, event: dict[str, Any]) -> None:
        kind, value = event["event"], int(event["value"])
        failed = self._failed.pop(monitor, None)
        if kind == zmq.EVENT_DISCONNECTED:
            peer = self._peers.pop(value, "unknown")
            if failed is not None:
                self.denied(
                    peer,
                    "the handshake failed: no CURVE, or the wrong learner key "
                    f"({failed}) on the {self._monitors[monitor]} socket",
                )
            return
        if failed is not None:  # its DISCONNECTED did not follow at once
            self.denied("unknown", f"the handshake failed ({failed})")
        if kind == zmq.EVENT_ACCEPTED:
            self._peers[value] = _peer_address(value)
            while len(self._peers) > HANDSHAKE_LOG_HOSTS:  # descriptors never closed?
                del self._peers[next(iter(self._peers))]
        elif kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            self._count("key_refused")  # logged by the authenticator, which knows the key
        elif kind in HANDSHAKE_FAILURE_KINDS:
            self._count("bad_handshake")
            self._failed[monitor] = _failure_detail(event)

    def _count(self, kind: str) -> None:
        with self._lock:
            self.failures[kind] = self.failures.get(kind, 0) + 1

    def denied(self, peer: str, what: str) -> None:
        """Log that ``peer`` (``host:port``) was refused because of ``what``, at most
        once per host per :data:`HANDSHAKE_LOG_EVERY_S` (thread-safe)."""
        host = peer.rsplit(":", 1)[0] if ":" in peer else peer
        now = time.monotonic()
        with self._lock:
            last, since = self._logged.pop(host, (-HANDSHAKE_LOG_EVERY_S, 0))
            if now - last < HANDSHAKE_LOG_EVERY_S:
                self._logged[host] = (last, since + 1)
                return
            self._logged[host] = (now, 0)
            while len(self._logged) > HANDSHAKE_LOG_HOSTS:
                del self._logged[next(iter(self._logged))]
        more = f"; {since} more failure(s) from {host} since the last line" if since else ""
        log.warning("refused a connection from %s: %s%s", peer, what, more)


def _failure_detail(event: dict[str, Any]) -> str:
    """libzmq's reason for a failed handshake, as a short name."""
    value = int(event["value"])
    if event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return f"ZAP status {value}"
    try:
        return str(zmq.Event(value).name).lower()
    except ValueError:
        return f"libzmq code {value}"


def _peer_address(fd: int) -> str:
    """``host:port`` of the TCP peer on descriptor ``fd`` (``unknown`` if gone)."""
    import socket as pysocket

    try:
        with pysocket.socket(fileno=os.dup(fd)) as sock:
            peer = sock.getpeername()
    except OSError:
        return "unknown"
    if isinstance(peer, tuple) and len(peer) >= 2:
        host = str(peer[0]).removeprefix("::ffff:")  # an IPv4 peer on the IPv6 socket
        host = f"[{host}]" if ":" in host else host
        return f"{host}:{peer[1]}"
    return str(peer)


_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)  # plain ints: enum arithmetic costs ~1 us


def readable(sock: zmq.Socket) -> bool:
    """Whether a message can be received now (cheaper than a poll; an actor asks
    several times per step)."""
    return bool(sock.getsockopt(_EVENTS) & _POLLIN)


@dataclass
class LearnerSockets:
    """The learner's three bound sockets (and the CURVE authenticator, when on)."""

    control: zmq.Socket | None  # ROUTER at port (None on learner ranks > 0)
    experience: zmq.Socket  # PULL at port + 1 (rank r > 0: port + 2 + r)
    weights: zmq.Socket | None  # PUB at port + 2 (None on learner ranks > 0)
    auth: Any = None
    handshakes: HandshakeWatch | None = None  # with CURVE: failed handshakes logged

    def all(self) -> tuple[zmq.Socket | None, ...]:
        """(control, experience, weights)."""
        return (self.control, self.experience, self.weights)

    def close(self) -> None:
        """Close every socket (linger 0) and stop the authenticator."""
        if self.handshakes is not None:
            self.handshakes.stop()
            self.handshakes = None
        for sock in self.all():
            if sock is not None:
                sock.close(linger=0)
        if self.auth is not None:
            self.auth.stop()
            self.auth = None


def _bind_advice(errno_: int) -> str:
    """What to do about a bind that failed with ``errno_``."""
    if errno_ == errno.EADDRINUSE:
        return "choose another --port or stop the other learner"
    if errno_ in (errno.EADDRNOTAVAIL, errno.ENODEV):
        return "--host must be an address or name of this machine; 0.0.0.0 binds all of them"
    if errno_ == errno.EACCES:
        return "ports below 1024 need privileges: choose another --port"
    return "check --host and --port"


def bind_learner_sockets(
    ctx: zmq.Context,
    cfg: Any,
    max_message_bytes: int,
    control_max_bytes: int | None = None,
    rank: int = 0,
) -> LearnerSockets:
    """Create and bind ROUTER, PULL and PUB for a :class:`~zmq_rl.config.LearnerConfig`,
    with CURVE when it names a secret key. OSError naming the ports when one is taken.

    ``max_message_bytes`` limits what PULL takes, ``control_max_bytes`` (default:
    the same) what ROUTER takes. HWMs count frames, not bytes: PULL's and ROUTER's
    receive HWMs are chosen so that what a stalled learner buffers per peer stays
    near :data:`EXPERIENCE_BUFFER_BYTES` and :data:`CONTROL_BUFFER_BYTES` (PUSH
    senders block, nothing is dropped; a control peer past its HWM waits in TCP).
    A learner rank > 0 (``num_learners``) binds only its PULL, at
    ``cfg.experience_port(rank)``.
    """
    control_max = control_max_bytes or max_message_bytes
    control_hwm = max(CONTROL_MIN_HWM, min(CONTROL_HWM, CONTROL_BUFFER_BYTES // control_max))
    receive = SocketOptions(rcvhwm=control_hwm, max_message_bytes=control_max)
    rcvhwm = max(4, min(EXPERIENCE_HWM, EXPERIENCE_BUFFER_BYTES // max_message_bytes))
    pull = SocketOptions(rcvhwm=rcvhwm, max_message_bytes=max_message_bytes)
    leader = rank == 0
    sockets = LearnerSockets(
        control=make_socket(ctx, zmq.ROUTER, receive) if leader else None,
        experience=make_socket(ctx, zmq.PULL, pull),
        weights=make_socket(ctx, zmq.PUB, SocketOptions(sndhwm=WEIGHTS_HWM)) if leader else None,
    )
    named = {
        name: sock
        for name, sock in zip(("control", "experience", "weights"), sockets.all(), strict=True)
        if sock is not None
    }
    try:
        if cfg.curve_secret_key:
            public, secret = load_secret_certificate(cfg.curve_secret_key, "curve_secret_key")
            keys = CurveServerKeys(public, secret, cfg.curve_authorized_keys)
            sockets.auth = start_authenticator(ctx, keys)
            for sock in named.values():
                apply_curve_server(sock, keys)
            sockets.handshakes = HandshakeWatch(named)
            sockets.auth.watch = sockets.handshakes
            log.info("CURVE on: accepting actors whose keys are in %s", cfg.curve_authorized_keys)
        if leader:
            sockets.control.bind(tcp_endpoint(cfg.host, cfg.port))
        sockets.experience.bind(tcp_endpoint(cfg.host, cfg.experience_port(rank)))
        if leader:
            sockets.weights.bind(tcp_endpoint(cfg.host, cfg.weights_port()))
    except zmq.ZMQError as exc:
        sockets.close()
        ports = (
            f"ports {cfg.port}-{cfg.port + 2}" if leader else f"port {cfg.experience_port(rank)}"
        )
        raise OSError(f"cannot bind {cfg.host} {ports}: {exc} ({_bind_advice(exc.errno)})") from exc
    except BaseException:
        sockets.close()
        raise
    if leader:
        log.info(
            "learner listening on %s (control), %d (experience), %d (weights)",
            tcp_endpoint(cfg.host, cfg.port),
            cfg.experience_port(),
            cfg.weights_port(),
        )
    else:
        log.info("learner rank %d: experience on %d", rank, cfg.experience_port(rank))
    return sockets
