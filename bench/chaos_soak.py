"""Chaos soak on a network: a learner and three actors on separate network-namespace
hosts, CartPole-v1, under a seeded schedule of process and network faults.

The short form is tests/test_chaos_netns.py (60 s of faults, in ``.ci/run``); the
long form and the fault-free baselines are this script (as root)::

    .venv/bin/python bench/chaos_soak.py --seconds 600 --seed 1              # long form
    .venv/bin/python bench/chaos_soak.py --seconds 600 --seed 1 --no-faults  # its baseline
    .venv/bin/python bench/chaos_soak.py --seconds 60 --seeds 0 1 2 3 4 --no-faults

(or ``ZMQ_RL_CHAOS_SECONDS=600 ZMQ_RL_CHAOS_SEED=1 pytest -s tests/test_chaos_netns.py``).
Each soak prints its schedule, what was applied when, and the ledger; the script
writes every soak's result to ``bench/results/chaos-soak-<seconds>s[-nofaults].json``.

**Hosts.** tests/netns.py's :class:`~tests.netns.Topology` with hosts ``l`` (the
learner: ``zmq-learner --host <its address> --port 5555``; the port space is the
namespace's own) and ``a1`` .. ``a3`` (one ``zmq-actor`` each). Needs root,
iproute2 and ``tc``; :func:`unavailable` says why not.

**Actor supervision.** Each actor runs inside a small bash restart loop on its host
(:func:`actor_loop_script`, the loop of ``bin/zmq-rl-tmux``'s actor panes): a failed
actor (any exit but 0, 2, 130, 143; a ``kill -9`` is 137) is started again after
``RESTART_BACKOFF_S``, at most ``MAX_RESTARTS`` times. That stands in for the
operator's tmux or systemd (``Restart=on-failure``) on a real actor machine; the
soak itself never restarts an actor (it only tells the loops, once the learner has
exited, that the run is over). The loop echoes ``chaos-actor-pid N`` before each
start, so every actor process is known (the ledger and the leftover check).

**Speed and budget.** The actors step ``bench.chaos_soak:SlowCartPole-v1``:
CartPole-v1 (same dynamics, spaces, 500-step limit) paced to one step per
``STEP_S`` (1.5 ms) in each actor process, so a run cannot go faster than
``len(ACTOR_HOSTS) / STEP_S`` = 2,000 steps/s whatever the CPU (fault-free it makes
1,700-1,900 here). The budget is ``BUDGET_FRACTION`` (all) of that cap times the
schedule's length: 120,000 steps for 60 s. A run cannot spend it before the schedule
ends (the cap is the simulators' own pace), so the whole schedule is always applied;
the soak records that it was (``schedule_completed``). (Until rows batches, a faulted
actor stalled every update and 35 % of the cap was enough; the learner now trains on
with the actors that deliver, and took 41,856 steps in 40 s of a 60 s schedule.) The learner
trains and evaluates on plain CartPole-v1 (it checks the actors' spaces, not their
env ids), with ``preset:CartPole-v1``'s PPO settings except ``num_envs`` 2 per actor
(6 slots, 192 steps per update: on this small budget it learns more reliably than
4), ``actor_timeout`` 3 s and ``checkpoint_every`` 10.

**Faults** (:func:`make_schedule`; at most one at a time per host, 1-3 s between
starts): ``kill -9`` of the actor process on a random actor host (its loop restarts
it); SIGSTOP of one for 0.5-5 s, then SIGCONT; a cut of a random host's link (the
learner's too) for 1-6 s (:meth:`Topology.cut` / ``restore``); 50 ms delay and 2 %
loss in each direction of a random host's link for 3-10 s (:class:`Net`: tc netem
on both ends of its veth pair, or, where the kernel has no netem, the user-space
:func:`relay`), then removed; and once, at 40 % of the schedule (after a checkpoint
exists), ``kill -9`` of the learner and, 0.5-2 s later, ``zmq-learner --resume
RUN_DIR`` on the same host and port (the actors register again by themselves). The
first four faults are the four kinds in a seeded order, so even a short schedule has
each. Every fault ends by the schedule's end; the run then finishes fault-free.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python bench/chaos_soak.py`
    sys.path.insert(0, str(ROOT))

STEP_S = 0.0015
"""Pace of SlowCartPole-v1: the steps of all its envs in one process are spaced
``STEP_S`` apart, so an actor makes at most 1 / STEP_S steps per second."""
PACE_SLACK_S = 0.05
"""How far a process that fell behind (paused, busy) may catch up at once."""
_next_step = [0.0]


class SlowCartPoleEnv(CartPoleEnv):
    """CartPole-v1 paced to one step per ``STEP_S`` per process: a slow simulator.
    A step waits for its turn on a per-process clock (so the actor's own overhead
    counts in, and the cap is reached when the CPU allows)."""

    def step(self, action):
        now = time.monotonic()
        turn = max(_next_step[0], now - PACE_SLACK_S)
        if turn > now:
            time.sleep(turn - now)  # the simulator's step time
        _next_step[0] = turn + STEP_S
        return super().step(action)


if "SlowCartPole-v1" not in gym.registry:
    gym.register(
        "SlowCartPole-v1",
        entry_point=SlowCartPoleEnv,
        max_episode_steps=500,
        reward_threshold=475.0,
    )

SLOW_CARTPOLE_ID = "bench.chaos_soak:SlowCartPole-v1"
HOSTS = ("l", "a1", "a2", "a3")
ACTOR_HOSTS = HOSTS[1:]
PORT = 5555
NUM_ENVS = 2
NUM_STEPS = 32
ROLLOUT_STEPS = len(ACTOR_HOSTS) * NUM_ENVS * NUM_STEPS
"""Env steps of one update at full membership (3 actors x 2 envs x 32 steps)."""
STEPS_PER_S_CAP = len(ACTOR_HOSTS) / STEP_S
BUDGET_FRACTION = 1.0
"""The budget is this fraction of the cap times the schedule (see the module's doc)."""
ACTOR_TIMEOUT_S = 3.0
CHECKPOINT_EVERY = 10
EVAL_EPISODES = 20
LEARNER_TIMEOUT_S = 30.0
"""Actors give up on a silent learner after this (their loop then restarts them)."""
REGISTER_TIMEOUT_S = 20.0
"""Actors wait this long for a welcome (after a learner restart too)."""
RESTART_BACKOFF_S = 0.5
MAX_RESTARTS = 200
DELAY_S = 0.05
LOSS = 0.02
NETEM = ("delay", f"{DELAY_S * 1000:.0f}ms", "loss", f"{LOSS:.0%}")
"""netem's arguments: ``delay 50ms loss 2%``."""
LEARNER_KILL_AT = 0.4
"""The learner is killed at this fraction of the schedule."""
START_S = 90.0
"""Bound on the learner starting and the first update (imports on a busy 2-core box)."""
END_S = 120.0
"""Bound on the run's end after the schedule, beyond its remaining budget's time."""
EXIT_S = 60.0
"""Bound on the actor loops exiting after the learner did."""
POLL_S = 0.05
KINDS = ("kill", "stop", "cut", "netem")
KIND_WEIGHTS = (3, 3, 2, 2)
RESUMED = r"resumed (\S+) at update (\d+), version (\d+)"
ACTOR_PID = re.compile(r"^chaos-actor-pid (\d+)$", re.M)


def budget_for(seconds: float) -> int:
    """The env-step budget of a soak of ``seconds``: ``BUDGET_FRACTION`` of what the
    speed cap allows in that time, in whole rollouts (at least 60 of them)."""
    steps = int(BUDGET_FRACTION * STEPS_PER_S_CAP * seconds)
    return max(60, steps // ROLLOUT_STEPS) * ROLLOUT_STEPS


# -- the schedule ---------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """One fault: ``kind`` on ``host`` at ``at`` seconds into the schedule, lasting
    ``duration`` (for ``learner``: how long it stays down before the resume)."""

    at: float
    kind: str
    host: str
    duration: float = 0.0

    def describe(self) -> str:
        what = {
            "kill": f"kill -9 the actor on {self.host}",
            "stop": f"SIGSTOP the actor on {self.host} for {self.duration:.1f}s",
            "cut": f"cut {self.host}'s link for {self.duration:.1f}s",
            "netem": f"netem {' '.join(NETEM)} on {self.host} for {self.duration:.1f}s",
            "learner": f"kill -9 the learner, resume {self.duration:.1f}s later",
        }[self.kind]
        return f"{self.at:6.1f}s {what}"


def make_schedule(seconds: float, seed: int) -> list[Fault]:
    """The seeded fault schedule of a soak of ``seconds`` (see the module's doc)."""
    rng = random.Random(seed)
    first = list(KINDS)
    rng.shuffle(first)
    busy_until = dict.fromkeys(HOSTS, 0.0)
    faults: list[Fault] = []
    learner_done = False
    t = rng.uniform(1.0, 3.0)
    while t < seconds - 1.0:
        if not learner_done and t >= LEARNER_KILL_AT * seconds:
            faults.append(Fault(round(t, 2), "learner", "l", round(rng.uniform(0.5, 2.0), 2)))
            learner_done = True
        else:
            kind = first[0] if first else rng.choices(KINDS, KIND_WEIGHTS)[0]
            targets = ACTOR_HOSTS if kind in ("kill", "stop") else HOSTS
            free = [h for h in targets if busy_until[h] <= t]
            if free:
                host = rng.choice(free)
                duration = {
                    "kill": 0.0,
                    "stop": rng.uniform(0.5, 5.0),
                    "cut": rng.uniform(1.0, 6.0),
                    "netem": rng.uniform(3.0, 10.0),
                }[kind]
                duration = round(min(duration, seconds - t), 2)
                # A killed actor is left alone while its loop restarts it.
                busy_until[host] = t + (duration if kind != "kill" else 4.0)
                faults.append(Fault(round(t, 2), kind, host, duration))
                if first:
                    first.pop(0)
        t += rng.uniform(1.0, 3.0)
    return faults


# -- the network ------------------------------------------------------------------------


def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)}: {result.stderr.strip()}")
    return result


def unavailable() -> str:
    """Why the soak cannot run here ('' when it can): tests/netns.py's reasons, or no
    ``tc``. (Whether netem works is probed on the topology: :meth:`Net.choose_degrade`.)"""
    from tests.netns import unavailable as netns_unavailable

    reason = netns_unavailable()
    if reason:
        return reason
    if shutil.which("tc") is None:
        return "the tc command (iproute2) is not installed"
    return ""


class Net:
    """The topology plus a lossy, slow link on demand (:meth:`degrade` /
    :meth:`heal`). Host ``name``'s veth pair is ``eth0`` in its namespace and its
    bridge port ``p<i>`` in the bridge's namespace.

    Two ways to degrade a link, chosen once by :meth:`choose_degrade` (``self.degrade_by``):

    * ``netem``: ``tc qdisc add dev <veth> root netem delay 50ms loss 2%`` on both ends
      of the pair (``root`` shapes egress, so both directions: 100 ms more round trip,
      2 % loss each way); removed with ``tc qdisc del``.
    * ``relay`` where the kernel has no ``sch_netem`` (``CONFIG_NET_SCH_NETEM`` unset,
      as on the 2-core development VM): the same delay and loss in user space. The
      host's port leaves the bridge; a new veth pair ``q<i>``/``r<i>`` joins it with
      ``q<i>``; :func:`relay` (a process in the bridge's namespace) forwards every
      frame between ``p<i>`` and ``r<i>`` 50 ms late and drops 2 % in each direction
      (at random, seeded; a dropped GSO frame is a burst of segments). Healing puts
      the port back on the bridge, stops the relay (frames still queued in it are
      lost too) and deletes the pair.
    """

    def __init__(self, tag: str, procs: Any, seed: int) -> None:
        from tests.netns import Topology

        self.topo = Topology(HOSTS, tag=tag).up()
        self.procs = procs
        self.seed = seed
        self.degrade_by = ""
        self.relays: dict[str, Any] = {}

    def _ends(self, host: str) -> list[tuple[str, str]]:
        return [(self.topo.ns(host), "eth0"), (self.topo.bridge_ns, self.topo.port(host))]

    def _netem_on(self, host: str) -> None:
        for ns, dev in self._ends(host):
            _run(
                ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "netem"]
                + list(NETEM)
            )

    def _netem_off(self, host: str) -> None:
        for ns, dev in self._ends(host):
            _run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root"], False)

    def choose_degrade(self) -> str:
        """Probe netem on host ``l``'s link: ``netem`` if it works, else ``relay``.
        Returns a line saying which and why."""
        try:
            self._netem_on(HOSTS[0])
        except RuntimeError as exc:
            self.degrade_by = "relay"
            return f"degraded links by the user-space relay: tc netem failed here ({exc})"
        finally:
            self._netem_off(HOSTS[0])
        self.degrade_by = "netem"
        return "degraded links by tc netem"

    def _br(self, *args: str) -> None:
        _run(["ip", "-n", self.topo.bridge_ns, *args])

    def degrade(self, host: str) -> None:
        """50 ms more delay and 2 % loss each way on ``host``'s link."""
        if self.degrade_by == "netem":
            self._netem_on(host)
            return
        from tests.test_faults import wait_line

        i = HOSTS.index(host)
        port, q, r = self.topo.port(host), f"q{i}", f"r{i}"
        self._br("link", "add", q, "type", "veth", "peer", "name", r)
        for dev in (q, r, port):
            self._br("link", "set", dev, "promisc", "on", "up")
        proc = self.procs.start(
            f"relay-{host}-{len(self.procs.all)}",
            [
                sys.executable,
                str(Path(__file__).resolve()),
                "relay",
                port,
                r,
                "--delay",
                str(DELAY_S),
                "--loss",
                str(LOSS),
                "--seed",
                str(self.seed * 1000 + len(self.procs.all)),
            ],
            prefix=["ip", "netns", "exec", self.topo.bridge_ns],
        )
        self.relays[host] = proc
        wait_line(proc, r"^relay ready", 30, self.procs)
        self._br("link", "set", port, "nomaster")
        self._br("link", "set", q, "master", "br0")

    def heal(self, host: str) -> str:
        """Undo :meth:`degrade`; returns the relay's counts (or '')."""
        if self.degrade_by == "netem":
            self._netem_off(host)
            return ""
        i = HOSTS.index(host)
        port, q = self.topo.port(host), f"q{i}"
        self._br("link", "set", q, "nomaster")
        self._br("link", "set", port, "master", "br0")
        self._br("link", "set", port, "promisc", "off")
        proc = self.relays.pop(host)
        proc.signal(signal.SIGTERM)
        code = _wait(proc, 10)
        _run(["ip", "-n", self.topo.bridge_ns, "link", "del", q], check=False)
        counts = proc.find(r"^relay done: (.*)$")
        return f"relay exit {code}: {counts.group(1) if counts else '?'}"

    def pids(self) -> dict[str, list[int]]:
        """Processes still running in each namespace."""
        out = {}
        for ns in self.topo.created:
            result = _run(["ip", "netns", "pids", ns], check=False)
            out[ns] = [int(p) for p in result.stdout.split()]
        return out

    def close(self) -> None:
        self.topo.close()


# -- processes -------------------------------------------------------------------------


def actor_loop_script(actor_cmd: list[str], stop_file: Path) -> str:
    """A bash restart loop around ``actor_cmd`` (bin/zmq-rl-tmux's actor pane loop,
    with a fixed backoff): restart after a failure, not after 0 / 2 / 130 / 143, and
    not once ``stop_file`` exists (the soak creates it when the learner has exited,
    as an operator stops the units when a run is over)."""
    return "\n".join(
        [
            "restarts=0",
            "while :; do",
            f'    (echo "chaos-actor-pid $BASHPID"; exec {shlex.join(actor_cmd)})',
            "    status=$?",
            "    case $status in 0 | 2 | 130 | 143) break ;; esac",
            f"    if [ -e {shlex.quote(str(stop_file))} ]; then",
            '        echo "chaos-loop: exit status $status; the run is over: not restarted"; break',
            "    fi",
            f"    if ((restarts >= {MAX_RESTARTS})); then",
            '        echo "chaos-loop: exit status $status; restarts exhausted"; break',
            "    fi",
            "    restarts=$((restarts + 1))",
            '    echo "chaos-loop: exit status $status; restart $restarts'
            f' in {RESTART_BACKOFF_S}s"',
            f"    sleep {RESTART_BACKOFF_S}",
            "done",
            'echo "chaos-loop: done, exit status $status"',
            "exit $status",
        ]
    )


@dataclass
class Result:
    """What one soak produced (JSON-able)."""

    seconds: float
    seed: int
    faults_on: bool
    budget: int
    schedule: list[dict[str, Any]] = field(default_factory=list)
    applied: list[str] = field(default_factory=list)
    schedule_completed: bool = False
    consumed_at_schedule_end: int = 0
    degrade_by: str = ""
    learner_codes: list[int | None] = field(default_factory=list)
    loop_codes: dict[str, int | None] = field(default_factory=dict)
    actor_pids: dict[str, list[int]] = field(default_factory=dict)
    learner_pids: list[int] = field(default_factory=list)
    left_running: list[int] = field(default_factory=list)
    left_in_namespaces: dict[str, list[int]] = field(default_factory=dict)
    resumed: bool = False
    report: dict[str, Any] = field(default_factory=dict)
    ledger: dict[str, Any] = field(default_factory=dict)
    final_return: float | None = None
    wall_seconds: float = 0.0
    schedule_seconds: float = 0.0
    error: str = ""
    logs: str = ""


class Soak:
    """One soak: build the network, start the processes, apply the schedule, wait for
    the end, collect. :meth:`run` always removes the network and every process."""

    def __init__(self, seconds: float, seed: int, work_dir: Path, faults: bool = True) -> None:
        from tests.test_faults import Procs

        self.seconds = seconds
        self.seed = seed
        self.work_dir = work_dir
        self.run_dir = work_dir / "run"
        self.stop_file = work_dir / "run-is-over"
        self.procs = Procs(work_dir)
        self.schedule = make_schedule(seconds, seed) if faults else []
        self.result = Result(seconds, seed, faults, budget_for(seconds))
        self.result.schedule = [asdict(f) for f in self.schedule]
        self.net: Net | None = None
        self.learner: Any = None
        self.loops: dict[str, Any] = {}
        self.undo: list[tuple[float, str, Any]] = []

    # ---- processes

    def address(self) -> str:
        assert self.net is not None
        return self.net.topo.address("l")

    def learner_argv(self) -> list[str]:
        from tests.test_faults import LEARNER

        flags = {
            "config": "preset:CartPole-v1",
            "env": "CartPole-v1",
            "num_actors": len(ACTOR_HOSTS),
            "num_envs": NUM_ENVS,
            "num_steps": NUM_STEPS,
            "total_env_steps": self.result.budget,
            "seed": self.seed,
            "eval_every": 0,
            "eval_episodes": EVAL_EPISODES,
            "actor_timeout": ACTOR_TIMEOUT_S,
            "checkpoint_every": CHECKPOINT_EVERY,
            "starvation_timeout": 60,
            "host": self.address(),
            "port": PORT,
            "run_dir": self.run_dir,
            "log_level": "info",
        }
        argv = [f"--{k.replace('_', '-')}={v}" for k, v in flags.items()]
        return [*LEARNER, *argv, "--no-tensorboard"]

    def resume_argv(self) -> list[str]:
        from tests.test_faults import LEARNER

        return [
            *LEARNER,
            "--resume",
            str(self.run_dir),
            "--host",
            self.address(),
            "--port",
            str(PORT),
            "--log-level",
            "info",
            "--no-tensorboard",
        ]

    def actor_argv(self) -> list[str]:
        from tests.test_faults import ACTOR

        return [
            *ACTOR,
            "--learner",
            f"{self.address()}:{PORT}",
            "--env",
            SLOW_CARTPOLE_ID,
            "--register-timeout",
            str(REGISTER_TIMEOUT_S),
            "--learner-timeout",
            str(LEARNER_TIMEOUT_S),
            "--log-level",
            "info",
        ]

    def start_learner(self, name: str, argv: list[str]) -> Any:
        assert self.net is not None
        self.learner = self.procs.start(name, argv, prefix=self.net.topo.prefix("l"))
        self.result.learner_pids.append(self.learner.pid)
        return self.learner

    def actor_process(self, host: str) -> Any:
        """The actor process the loop on ``host`` runs now (None between restarts)."""
        import psutil

        try:
            children = psutil.Process(self.loops[host].pid).children()
        except psutil.NoSuchProcess:
            return None
        # The loop's child is the subshell that exec'd zmq-actor; skip a `sleep`.
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                if "sleep" not in child.name():
                    return child
        return None

    # ---- faults

    def apply(self, fault: Fault, t0: float) -> str:
        import psutil

        from tests.test_faults import checkpoints, wait_until

        assert self.net is not None
        if fault.kind in ("kill", "stop"):
            victim = self.actor_process(fault.host)
            if victim is None:
                return f"{fault.host}: no actor process (between restarts); skipped"
            try:
                if fault.kind == "kill":
                    victim.send_signal(signal.SIGKILL)
                    return f"kill -9 pid {victim.pid} on {fault.host}"
                victim.send_signal(signal.SIGSTOP)
            except psutil.NoSuchProcess:
                return f"{fault.host}: pid {victim.pid} gone before the fault; skipped"
            self.undo.append((t0 + fault.at + fault.duration, "cont", victim))
            return f"SIGSTOP pid {victim.pid} on {fault.host} for {fault.duration:.1f}s"
        if fault.kind == "cut":
            self.net.topo.cut(fault.host)
            self.undo.append((t0 + fault.at + fault.duration, "restore", fault.host))
            return f"cut {fault.host} for {fault.duration:.1f}s"
        if fault.kind == "netem":
            self.net.degrade(fault.host)
            self.undo.append((t0 + fault.at + fault.duration, "heal", fault.host))
            how = self.net.degrade_by
            return f"{how}: {' '.join(NETEM)} on {fault.host} for {fault.duration:.1f}s"
        assert fault.kind == "learner"
        wait_until(
            lambda: checkpoints(self.run_dir), 30, "a checkpoint", self.procs, [self.learner]
        )
        first = self.learner
        first.popen.kill()
        code = first.wait(10)
        self.result.learner_codes.append(code)
        time.sleep(fault.duration)  # the fault itself: how long the learner stays down
        self.start_learner("learner-resumed", self.resume_argv())
        return f"kill -9 learner pid {first.pid} (exit {code}); resumed {fault.duration:.1f}s later"

    def undo_due(self, now: float, everything: bool = False) -> None:
        assert self.net is not None
        keep = []
        for due, what, target in self.undo:
            if due > now and not everything:
                keep.append((due, what, target))
                continue
            if what == "cont":
                with contextlib.suppress(Exception):
                    target.send_signal(signal.SIGCONT)
            elif what == "restore":
                self.net.topo.restore(target)
            else:
                counts = self.net.heal(target)
                what += f" ({counts})" if counts else ""
            self.result.applied.append(
                f"{time.monotonic() - self.t0:6.1f}s undo {what} {_name(target)}"
            )
        self.undo = keep

    def run_schedule(self) -> None:
        """Apply the schedule; stop early if the run ended (then the budget did not
        need the whole schedule: ``schedule_completed`` stays False)."""
        self.t0 = time.monotonic()
        t0 = self.t0
        for fault in self.schedule:
            while time.monotonic() < t0 + fault.at:
                self.undo_due(time.monotonic())
                if not self.learner.alive():
                    self.undo_due(0, everything=True)
                    return
                time.sleep(POLL_S)  # the schedule's gap
            if not self.learner.alive():
                self.undo_due(0, everything=True)
                return
            what = self.apply(fault, t0)
            self.result.applied.append(f"{time.monotonic() - t0:6.1f}s {what}")
        end = t0 + self.seconds
        while time.monotonic() < end and self.learner.alive():
            self.undo_due(time.monotonic())
            time.sleep(POLL_S)  # the rest of the schedule
        completed = self.learner.alive()
        self.result.consumed_at_schedule_end = _consumed(self.run_dir)
        self.undo_due(0, everything=True)
        self.result.schedule_completed = completed
        self.result.schedule_seconds = time.monotonic() - t0

    # ---- the whole soak

    def run(self) -> Result:
        from tests.test_faults import wait_update

        started = time.monotonic()
        try:
            try:
                self.net = Net(f"{os.getpid()}c{self.seed}", self.procs, self.seed)
            except RuntimeError as exc:
                raise NetworkUnavailable(f"cannot build the test network: {exc}") from exc
            self.result.degrade_by = self.net.choose_degrade()
            self.start_learner("learner", self.learner_argv())
            for host in ACTOR_HOSTS:
                script = actor_loop_script(self.actor_argv(), self.stop_file)
                self.loops[host] = self.procs.start(
                    f"loop-{host}", ["bash", "-c", script], prefix=self.net.topo.prefix(host)
                )
            wait_update(self.run_dir, 1, START_S, self.procs, [self.learner])
            self.run_schedule()
            self.finish()
        except BaseException as exc:  # a failed wait (pytest.fail) or a crash: keep logs
            self.result.error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self.result.logs = self.procs.logs()
            self.result.wall_seconds = time.monotonic() - started
            try:
                self.procs.close()
            finally:
                if self.net is not None:
                    self.net.close()
        return self.result

    def finish(self) -> None:
        from tests.test_faults import read_report, still_running

        assert self.net is not None
        result = self.result
        remaining = result.budget - _consumed(self.run_dir)
        bound = END_S + max(0, remaining) / STEPS_PER_S_CAP
        code = _wait(self.learner, bound)
        result.learner_codes.append(code)
        self.stop_file.touch()
        for host, loop in self.loops.items():
            result.loop_codes[host] = _wait(loop, EXIT_S)
        for host, loop in self.loops.items():
            result.actor_pids[host] = [int(p) for p in ACTOR_PID.findall(loop.text())]
        result.resumed = bool(re.search(RESUMED, self.learner.text()))
        everyone = [
            *result.learner_pids,
            *(loop.pid for loop in self.loops.values()),
            *(p for pids in result.actor_pids.values() for p in pids),
        ]
        result.left_running = still_running(everyone)
        result.left_in_namespaces = {ns: p for ns, p in self.net.pids().items() if p}
        if (self.run_dir / "report.json").is_file():
            result.report = read_report(self.run_dir)
            result.ledger = make_ledger(result.report, result.actor_pids)
            evaluations = result.report.get("evaluations") or []
            if evaluations:
                result.final_return = float(evaluations[-1]["mean_return"])


class NetworkUnavailable(RuntimeError):
    """The namespaces could not be built here (the message says why)."""


def _name(target: Any) -> str:
    return target if isinstance(target, str) else f"pid {target.pid}"


def _wait(proc: Any, timeout: float) -> int | None:
    """``proc``'s exit code, None if it is still running after ``timeout``."""
    try:
        return proc.popen.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


def _consumed(run_dir: Path) -> int:
    from tests.test_faults import metrics_rows

    rows = metrics_rows(run_dir)
    return int(rows[-1].get("env_steps", 0)) if rows else 0


# -- the ledger ---------------------------------------------------------------------------


def make_ledger(report: dict[str, Any], actor_pids: dict[str, list[int]]) -> dict[str, Any]:
    """Where the steps went. Per actor host: its processes, those that said bye, the
    steps they sent (their bye stats: what a killed process sent is unknown), and
    what the learner received from and consumed of all of that host's processes
    (summed over every registration line in the report). Then the learner's counters:
    received (and how much of it is in no line: a resumed learner does not keep the
    lines of the registrations live at its checkpoint), consumed, discarded by reason,
    rejected by reason."""
    lines = [*report["actor_stats"].values(), *report["departed_actors"]]
    per_host: dict[str, dict[str, int]] = {}
    for host, pids in actor_pids.items():
        mine = [line for line in lines if line.get("pid") in set(pids)]
        byes = {line["pid"]: line for line in mine if line.get("said_bye")}
        per_host[host] = {
            "processes": len(pids),
            "registrations": len(mine),
            "said_bye": len(byes),
            "sent (bye stats)": sum(int(line.get("actor/steps_sent", 0)) for line in byes.values()),
            "received": sum(int(line.get("steps_received", 0)) for line in mine),
            "consumed": sum(int(line.get("steps_consumed", 0)) for line in mine),
        }
    counters = report["counters"]
    in_lines = sum(int(line.get("steps_received", 0)) for line in lines)
    discarded = {
        k.removeprefix("discarded/steps/"): v
        for k, v in sorted(counters.items())
        if k.startswith("discarded/steps/")
    }
    rejected = {
        k.removeprefix("rejected/"): v
        for k, v in sorted(counters.items())
        if k.startswith("rejected/")
    }
    return {
        "per_actor_host": per_host,
        "received/steps": counters.get("received/steps", 0),
        # A resumed learner keeps its own actor lines, not the checkpoint's: what the
        # registrations live at that checkpoint had received is in no line.
        "received/steps in no report line": counters.get("received/steps", 0) - in_lines,
        "consumed/steps": counters.get("consumed/steps", 0),
        "discarded/steps": discarded,
        "rejected": rejected,
        "actors/declared_dead": counters.get("actors/declared_dead", 0),
        "learner/resumes": counters.get("learner/resumes", 0),
        "experience/seq_gaps": counters.get("experience/seq_gaps", 0),
        "env_steps_consumed": report.get("env_steps_consumed", 0),
        "updates_completed": report.get("updates_completed", 0),
    }


def summary(result: Result) -> str:
    """The printed account of one soak."""
    lines = [
        f"chaos soak: seed {result.seed}, {result.seconds:.0f}s schedule "
        f"({'faults' if result.faults_on else 'no faults'}), budget {result.budget:,} steps, "
        f"wall {result.wall_seconds:.1f}s (schedule {result.schedule_seconds:.1f}s)",
        "schedule:",
        *(f"  {Fault(**f).describe()}" for f in result.schedule),
        "applied:",
        *(f"  {line}" for line in result.applied),
        f"schedule completed before the budget: {result.schedule_completed} "
        f"({result.consumed_at_schedule_end:,} steps consumed at its end)",
        f"learner exits: {result.learner_codes}; actor loops: {result.loop_codes}",
        f"actor processes: {result.actor_pids}",
        f"left running: {result.left_running}; in namespaces: {result.left_in_namespaces}",
        "ledger: " + json.dumps(result.ledger, indent=1),
        f"stop_reason: {result.report.get('stop_reason')!r}; final evaluation return: "
        f"{result.final_return}",
    ]
    return "\n".join(lines)


# -- the relay ------------------------------------------------------------------------


def relay(a: str, b: str, delay: float, loss: float, seed: int) -> None:
    """Forward every Ethernet frame between interfaces ``a`` and ``b`` (in this
    namespace) ``delay`` seconds late, dropping each with probability ``loss``,
    until SIGTERM. Packet sockets with a virtio-net header (``PACKET_VNET_HDR``) keep
    GSO frames and partial checksums as they are, so offloads need not be switched
    off. Frames this process sent itself (``PACKET_OUTGOING``) are not forwarded."""
    import heapq
    import select
    import socket

    sol_packet, packet_vnet_hdr, eth_p_all = 263, 15, 0x0003
    socks = []
    for name in (a, b):
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(eth_p_all))
        sock.setsockopt(sol_packet, packet_vnet_hdr, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        sock.bind((name, eth_p_all))  # (Python converts to network order)
        sock.setblocking(False)
        socks.append(sock)
    other = {socks[0]: socks[1], socks[1]: socks[0]}
    rng = random.Random(seed)
    queue: list[tuple[float, int, Any, bytes]] = []
    counts = {"forwarded": 0, "dropped": 0, "send_errors": 0}
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    print(f"relay ready: {a} <-> {b}, delay {delay * 1000:.0f}ms, loss {loss:.0%}", flush=True)
    seq = 0
    while not stopping:
        wait = min(0.5, max(0.0, queue[0][0] - time.monotonic())) if queue else 0.5
        try:
            readable, _, _ = select.select(socks, [], [], wait)
        except InterruptedError:
            continue
        for sock in readable:
            for _ in range(256):
                try:
                    data, address = sock.recvfrom(1 << 17)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:  # the interface went down (a cut): nothing to read
                    break
                if address[2] == socket.PACKET_OUTGOING:
                    continue
                if rng.random() < loss:
                    counts["dropped"] += 1
                    continue
                heapq.heappush(queue, (time.monotonic() + delay, seq, other[sock], data))
                seq += 1
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, _, sock, data = heapq.heappop(queue)
            try:
                sock.send(data)
                counts["forwarded"] += 1
            except OSError:
                counts["send_errors"] += 1
    counts["lost_in_queue"] = len(queue)
    print("relay done: " + ", ".join(f"{k} {v}" for k, v in counts.items()), flush=True)


def relay_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="chaos_soak.py relay")
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--delay", type=float, default=DELAY_S)
    parser.add_argument("--loss", type=float, default=LOSS)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    relay(args.a, args.b, args.delay, args.loss, args.seed)
    return 0


# -- the command ----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    global PORT
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["relay"]:
        return relay_main(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=600.0, help="schedule length")
    parser.add_argument("--seeds", "--seed", type=int, nargs="+", default=[1])
    parser.add_argument("--no-faults", action="store_true", help="an empty schedule")
    parser.add_argument("--out", default="", help="JSON (default bench/results/chaos-soak-*.json)")
    parser.add_argument("--keep", action="store_true", help="keep the work directories")
    parser.add_argument(
        "--port",
        type=int,
        default=PORT,
        metavar="N",
        help="the learner's port inside its network namespace (a port space of its own)",
    )
    args = parser.parse_args(argv)
    PORT = args.port
    reason = unavailable()
    if reason:
        print(f"chaos soak: cannot run here: {reason}", file=sys.stderr)
        return 2
    suffix = "-nofaults" if args.no_faults else ""
    out = Path(
        args.out or ROOT / "bench" / "results" / f"chaos-soak-{args.seconds:.0f}s{suffix}.json"
    )
    results = []
    for seed in args.seeds:
        work = Path(tempfile.mkdtemp(prefix=f"chaos-soak-{seed}-"))
        try:
            result = Soak(args.seconds, seed, work, faults=not args.no_faults).run()
        finally:
            if not args.keep:
                shutil.rmtree(work, ignore_errors=True)
        print(summary(result), flush=True)
        data = asdict(result)
        data.pop("logs")
        data["report"] = {k: v for k, v in result.report.items() if k != "episode_rewards"}
        results.append(data)
        out.parent.mkdir(parents=True, exist_ok=True)
        returns = [r["final_return"] for r in results if r["final_return"] is not None]
        out.write_text(
            json.dumps(
                {
                    "command": "python "
                    + shlex.join(["bench/chaos_soak.py", *(argv or sys.argv[1:])]),
                    "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
                    "final_returns": returns,
                    "final_return_mean": statistics.fmean(returns) if returns else None,
                    "results": results,
                },
                indent=1,
            )
            + "\n"
        )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
