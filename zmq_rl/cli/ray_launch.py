"""``zmq-rl ray``: the learner on the Ray driver, actors as Ray actors across the cluster.

Ray places and restarts the actor processes; it carries no experience. Each Ray
actor (:class:`ActorProcess`) starts one ``zmq-actor`` process on its node, which
registers with the learner over the usual ZeroMQ protocol (control, experience and
weights sockets on the driver's node) exactly like any other actor. When the
``zmq-actor`` process fails, its Ray actor exits, and Ray restarts it (up to
``--actor-restarts`` times, ``max_restarts``): the new one starts a new
``zmq-actor``, which joins as a late joiner. When the Ray worker itself dies
(``kill -9``, a lost node), its ``zmq-actor`` notices that its parent is gone and
leaves cleanly (``--parent-pid``), and Ray restarts the worker the same way.

``pip install 'zmq_rl[ray]'`` adds Ray; zmq_rl itself must be installed on every
node (the same version), at the path ``--actor-command`` names (default: the
driver's ``zmq-actor``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shlex
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from zmq_rl.config import ConfigError

from ..run.common import CliFailure, release_run_dir
from ..run.fleet import FleetLearner
from .commands import RUN_DEFAULTS, build_parser, non_negative, subcommand, subparser
from .exits import EXIT_INTERRUPTED, setup_logging
from .flags import LOG_LEVELS
from .learner import LEARNER_SECTIONS, add_learner_flags, configs_from_args, preset_note
from .slurm import console_command

log = logging.getLogger(__name__)

__all__ = ["ActorProcess", "RayActors", "parse_resources"]

RAY_DEFAULTS = {**RUN_DEFAULTS, "host": "0.0.0.0"}
"""``zmq-rl run``'s defaults, and the learner binds every interface (Ray actors on other
nodes connect to it)."""
STATUS_POLL_S = 1.0
STATUS_TIMEOUT_S = 10.0
STOP_WAIT_S = 15.0
CONFIG_ERROR = 2
CLEAN_EXITS = (0, EXIT_INTERRUPTED, 143)


class ActorProcess:
    """The body of one Ray actor: a ``zmq-actor`` child process, watched.

    Created by Ray on some node (``ray.remote(ActorProcess).options(...)``). The
    child gets ``--parent-pid`` of this worker, so it exits when the worker dies.
    A child that exits with an error (anything but 0, 130, 143 and 2) makes this
    worker exit too, so that Ray restarts the actor; 0 (the run is over), 130/143
    (stopped) and 2 (a configuration error, which a restart would repeat) leave the
    actor alive with the exit code in :meth:`status`.
    """

    def __init__(self, index: int, command: Sequence[str], log_path: str = "") -> None:
        import ray

        self.index = index
        self.started_at = time.time()
        restarted = ray.get_runtime_context().was_current_actor_reconstructed
        self.log_file: Any = None
        out: Any = None
        if log_path and Path(log_path).parent.is_dir():  # the run dir is visible here
            self.log_file = open(log_path, "ab")  # noqa: SIM115 (closed in stop())
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            header = f"=== zmq-rl ray: actor {index}, worker pid {os.getpid()}, {stamp} ===\n"
            self.log_file.write(header.encode())
            self.log_file.flush()
            out = self.log_file
        self.proc = subprocess.Popen(
            # --actor-id: the first start asks for its index (its seed follows from it); a
            # restarted one takes any free id (its predecessor's may still be taken).
            # --parent-pid: the child leaves when this worker dies.
            [
                *command,
                "--actor-id",
                str(-1 if restarted else index),
                "--parent-pid",
                str(os.getpid()),
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT if out is not None else None,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self._watch = threading.Thread(target=self._wait_child, name="zmq-actor", daemon=True)
        self._watch.start()

    def _wait_child(self) -> None:
        code = self.proc.wait()
        if code in CLEAN_EXITS or code == CONFIG_ERROR:
            return
        log.warning(
            "zmq-actor %d exited with %d: ending this Ray actor for a restart", self.index, code
        )
        os._exit(1)  # Ray sees the worker die and restarts the actor (max_restarts)

    def status(self) -> dict[str, Any]:
        """Where this actor runs and how its ``zmq-actor`` is doing."""
        import ray

        return {
            "index": self.index,
            "node": ray.util.get_node_ip_address(),
            "worker_pid": os.getpid(),
            "pid": self.proc.pid,
            "returncode": self.proc.poll(),
            "started_at": self.started_at,
        }

    def stop(self, timeout: float = STOP_WAIT_S) -> int | None:
        """SIGTERM the ``zmq-actor`` (it says bye), wait, SIGKILL if needed; its exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        if self.log_file is not None:
            self.log_file.close()
            self.log_file = None
        return self.proc.returncode


def add_report_section(run_dir: Path, key: str, section: Mapping[str, Any]) -> bool:
    """Add ``section`` to ``run_dir/report.json`` under ``key`` (atomically); False when
    there is no report (an aborted run)."""
    path = run_dir / "report.json"
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    report[key] = dict(section)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=2, default=float))
    os.replace(tmp, path)
    return True


def parse_resources(items: Sequence[str]) -> dict[str, float]:
    """``["gpu_node=1", "big=0.5"]`` -> ``{"gpu_node": 1.0, "big": 0.5}`` (Ray custom
    resources of each actor); a bad item is a :class:`ConfigError` naming it."""
    out: dict[str, float] = {}
    for item in items:
        name, sep, amount = item.partition("=")
        try:
            value = float(amount)
        except ValueError:
            value = -1.0
        if not sep or not name or value < 0:
            raise ConfigError("actor_resources", item, "must be NAME=AMOUNT with AMOUNT >= 0")
        out[name] = value
    return out


class RayActors:
    """Start ``count`` Ray actors around a learner run, watch them, stop them.

    A context manager (``around_run`` of :func:`~zmq_rl.run.session.train`): on
    enter it creates the actors (each starts its ``zmq-actor``); a monitor thread
    polls their status, logs every restart Ray made (a new worker pid) and stops
    the run with an error when a ``zmq-actor`` exits with a configuration error;
    on exit it stops them and adds a ``ray`` section to ``report.json``.
    """

    def __init__(
        self,
        learner: FleetLearner,
        count: int,
        command: Sequence[str],
        *,
        log_dir: Path | None,
        num_cpus: float,
        resources: dict[str, float],
        max_restarts: int,
        spread: bool = True,
    ) -> None:
        import ray

        self.learner = learner
        self.count = count
        self.command = list(command)
        self.log_dir = log_dir
        remote = ray.remote(ActorProcess).options(
            num_cpus=num_cpus,
            resources=resources or None,
            max_restarts=max_restarts,
            max_task_retries=0,
            scheduling_strategy="SPREAD" if spread else "DEFAULT",
        )
        self._remote = remote
        self.handles: list[Any] = []
        self.history: dict[int, list[dict[str, Any]]] = {i: [] for i in range(count)}
        self.failure = ""
        self._stop = threading.Event()
        self._monitor: threading.Thread | None = None
        self.settings = {
            "actors": count,
            "num_cpus": num_cpus,
            "resources": resources,
            "max_restarts": max_restarts,
        }

    def __enter__(self) -> RayActors:
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        for i in range(self.count):
            log_path = str(self.log_dir / f"actor-{i}.log") if self.log_dir else ""
            self.handles.append(self._remote.remote(i, self.command, log_path))
        self._monitor = threading.Thread(target=self._watch, name="ray-actors", daemon=True)
        self._monitor.start()
        return self

    def statuses(self, timeout: float = STATUS_TIMEOUT_S) -> list[dict[str, Any] | None]:
        """Each actor's :meth:`ActorProcess.status` (None: dead for good or not
        answering within ``timeout``)."""
        import ray

        refs = [h.status.remote() for h in self.handles]
        out: list[dict[str, Any] | None] = []
        for ref in refs:
            try:
                out.append(ray.get(ref, timeout=timeout))
            except Exception:  # restarting (RayActorError), gone, or slow
                out.append(None)
        return out

    def _watch(self) -> None:
        # The first look at once: it waits for the actors' first workers, which are then
        # known before any could be killed (a restart is a worker pid not seen before).
        self._record()
        while not self._stop.wait(STATUS_POLL_S):
            self._record()

    def _record(self) -> None:
        """Note each actor's worker (a new worker pid: Ray restarted it) and a
        configuration error (which stops the run)."""
        for status in self.statuses():
            if status is None:
                continue
            seen = self.history[status["index"]]
            if not seen or seen[-1]["worker_pid"] != status["worker_pid"]:
                if seen:
                    log.warning(
                        "Ray restarted actor %d: worker pid %d on %s, zmq-actor pid %d",
                        status["index"],
                        status["worker_pid"],
                        status["node"],
                        status["pid"],
                    )
                seen.append({k: status[k] for k in ("worker_pid", "pid", "node", "started_at")})
            if status["returncode"] == CONFIG_ERROR and not self.failure:
                self.failure = (
                    f"actor {status['index']} on {status['node']} exited with status 2 "
                    "(a configuration error): see its log"
                )
                log.error("%s; stopping the run", self.failure)
                self.learner.request_stop(self.failure)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        import ray

        self._stop.set()
        if self._monitor is not None:
            self._monitor.join(STATUS_TIMEOUT_S + STATUS_POLL_S)
            # A restart since the monitor's last look (the run may end within a poll of
            # it) still belongs in the report.
            self._record()
        refs = [h.stop.remote() for h in self.handles]
        with contextlib.suppress(Exception):
            ray.wait(refs, num_returns=len(refs), timeout=STOP_WAIT_S + 5)
        for handle in self.handles:
            with contextlib.suppress(Exception):
                ray.kill(handle, no_restart=True)
        run_dir = self.learner.cfg.run_dir
        if run_dir:
            add_report_section(Path(run_dir), "ray", self.summary())
        if self.failure and exc_type is None:
            raise CliFailure(self.failure)

    def restarts(self) -> int:
        """Restarts Ray made, as seen by the monitor (new worker pids)."""
        return sum(max(0, len(seen) - 1) for seen in self.history.values())

    def summary(self) -> dict[str, Any]:
        """The ``ray`` section of ``report.json``: settings, each actor's workers."""
        return {
            **self.settings,
            "restarts": self.restarts(),
            "workers": {str(i): seen for i, seen in self.history.items()},
            "failure": self.failure,
        }


def _ray_flags(parser: argparse.ArgumentParser) -> None:
    add_learner_flags(parser, defaults=RAY_DEFAULTS)
    parser.set_defaults(log_level="info")
    parser.add_argument(
        "--actor-log-level",
        choices=LOG_LEVELS,
        default="info",
        help="log level of the actors (into RUN_DIR/logs/actor-N.log where the run dir "
        "is visible on the actor's node, else the Ray worker's log)",
    )
    group = parser.add_argument_group("ray", "the Ray cluster and the actors' placement")
    group.add_argument(
        "--address",
        default="auto",
        help="the Ray cluster: 'auto' (the one 'ray start' runs here), HOST:PORT of its "
        "head, or 'local' (start a private one in this process)",
    )
    group.add_argument(
        "--learner-address",
        default="",
        help="the address actors connect to (default: this node's IP as Ray sees it)",
    )
    group.add_argument(
        "--actor-cpus",
        type=float,
        default=1.0,
        help="Ray num_cpus of each actor (fractions allowed, e.g. 0.5)",
    )
    group.add_argument(
        "--actor-resources",
        metavar="NAME=AMOUNT",
        action="append",
        default=[],
        help="a Ray custom resource each actor needs, e.g. sim_node=1 (repeatable)",
    )
    group.add_argument(
        "--actor-restarts",
        metavar="N",
        type=non_negative(int),
        default=3,
        help="Ray max_restarts of each actor: how often Ray restarts one whose process "
        "died (-1 is not accepted: bounded, like zmq-rl run)",
    )
    group.add_argument(
        "--pack",
        dest="spread",
        action="store_false",
        help="let Ray pack actors on few nodes (default: SPREAD them across the cluster)",
    )
    group.add_argument(
        "--actor-command",
        default="",
        help="the zmq-actor command on the actors' nodes (default: the one next to this "
        "Python, which must then exist at the same path on every node)",
    )
    group.add_argument(
        "--resume",
        metavar="RUN_DIR",
        default=None,
        help="continue the run in RUN_DIR from its newest checkpoint with new Ray actors "
        "(as zmq-rl run --resume)",
    )


@subcommand(
    "ray",
    "train on a Ray cluster: the learner here (the driver), actors as Ray actors",
    _ray_flags,
    description="Train on a Ray cluster: connect to it (--address), run the learner in "
    "this process (the driver) bound to 0.0.0.0, and start --actors Ray actors, each "
    "running one zmq-actor process that connects to this node over ZeroMQ. Ray places "
    "them (--actor-cpus, --actor-resources, SPREAD) and restarts one whose process dies "
    "(--actor-restarts); experience and weights go over ZeroMQ, not through Ray. "
    "Ctrl-C or SIGTERM stops the run (report, policy, checkpoint) and the actors. "
    "Needs pip install 'zmq_rl[ray]'. " + preset_note(),
    sections=LEARNER_SECTIONS,
)
def ray_command(args: argparse.Namespace) -> int:
    """``zmq-rl ray``."""
    try:
        import ray
    except ImportError:
        raise CliFailure("Ray is not installed: pip install 'zmq_rl[ray]'") from None
    from ..run.common import require_learner_install

    require_learner_install()  # the learner runs here
    from ..run.engine import train as run_engine
    from ..run.local_actors import resume_configs
    from ..run.session import make_console, print_summary

    resources = parse_resources(args.actor_resources)
    if args.actor_cpus < 0:
        raise ConfigError("actor_cpus", args.actor_cpus, "must be >= 0")
    resume = None
    if args.resume is not None:
        ray_parser = subparser(build_parser("ray"), "ray")
        defaults = {a.dest: a.default for a in ray_parser._actions}
        cfg, ppo, policy, overrides = resume_configs(args.resume, args, defaults, LEARNER_SECTIONS)
        resume = (cfg.run_dir, overrides)
    else:
        cfg, ppo, policy = configs_from_args(args)
    if cfg.curve_secret_key:
        release_run_dir(cfg.run_dir)
        raise ConfigError(
            "curve_secret_key",
            cfg.curve_secret_key,
            "zmq-rl ray does not hand keys to Ray actors yet: use zmq-learner and start "
            "actors with --curve-secret-key (docs/clusters.md)",
        )
    setup_logging(args.log_level)
    console = make_console()
    init: dict[str, Any] = {"log_to_driver": False, "configure_logging": False}
    if args.address == "local":
        ray.init(include_dashboard=False, **init)
    else:
        try:
            ray.init(address=args.address, **init)
        except (ConnectionError, RuntimeError) as exc:
            raise CliFailure(
                f"cannot connect to the Ray cluster at {args.address!r}: {exc}"
            ) from None
    host = args.learner_address or ray.util.get_node_ip_address()
    address = f"[{host}]:{cfg.port}" if ":" in host else f"{host}:{cfg.port}"
    command = (
        shlex.split(args.actor_command) if args.actor_command else console_command("zmq-actor")
    )
    command += ["--learner", address, "--log-level", args.actor_log_level]
    log_dir = Path(cfg.run_dir).resolve() / "logs" if cfg.run_dir else None
    holder: dict[str, RayActors] = {}

    def around_run(learner: FleetLearner) -> RayActors:
        holder["actors"] = RayActors(
            learner,
            cfg.num_actors,
            command,
            log_dir=log_dir,
            num_cpus=args.actor_cpus,
            resources=resources,
            max_restarts=args.actor_restarts,
            spread=args.spread,
        )
        return holder["actors"]

    try:
        _, outcome, _ = run_engine(  # the engine of zmq-rl run, with Ray actors
            cfg,
            ppo,
            policy,
            local_actors=False,
            fleet=around_run,
            console=console,
            tensorboard=args.tensorboard,
            command="zmq-rl ray",
            resume=resume,
            preset=getattr(args, "applied_preset", None),
            resume_command="zmq-rl ray --resume",
        )
    finally:
        ray.shutdown()
    extra = {"actors": f"{cfg.num_actors} Ray actor(s) connecting to {address}"}
    if "actors" in holder:
        extra["actor restarts"] = f"{holder['actors'].restarts()} by Ray"
    if log_dir is not None:
        extra["actor logs"] = f"{log_dir} (where visible; else the Ray workers' logs)"
    print_summary(console, outcome, extra)
    return EXIT_INTERRUPTED if outcome.interrupted else 0
