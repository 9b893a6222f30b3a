"""Long links: env steps/s over a 200 ms round trip with the default ``--max-lead-steps``,
with the value the learner suggests, and over loopback.

The hosts are network namespaces (``tests/netns.py``): the learner on one, its actors
on another. The 200 ms round trip is ``tc netem delay 100ms`` on both hosts' ``eth0``
where the kernel has netem, else a userspace delay line on a third host
(:class:`tests.netns.DelayLine`: a TCP relay that holds every byte 100 ms in each
direction; the actors connect to it). Which one was used is in the JSON (``link``).
The runs, one after the other, are each ``zmq-learner`` plus ``--actors`` ``zmq-actor``
processes on CartPole-v1 with the learner's defaults otherwise:

* ``loopback``: learner and actors on one host, 127.0.0.1;
* ``long_default``: over the long link, the default lead (``2 * steps_per_broadcast``);
* ``long_suggested``: over the long link with the ``--max-lead-steps`` that the learner
  of ``long_default`` suggested (its report's ``suggested_max_lead_steps``, the largest
  over its actors; the same value its once-per-actor log line names);
* ``loopback_suggested`` (not with ``--smoke``): loopback with that lead, to tell the
  link's share of the gain from the lead's.

Each run measures for ``--window`` seconds after ``--warmup`` seconds of training,
then the learner gets SIGINT (it stops its actors and writes ``report.json``). steps/s
is env steps consumed between the first update row after the warm-up and the last row,
over their wall time (``metrics.jsonl``); start-up is not in it. Every wait has a
deadline and every process and namespace is removed at the end, also on an error.

Needs root and iproute2 (network namespaces); says why and exits 0 without them.

    sudo python bench/long_link.py            # the table in docs/multi-host.md
    sudo python bench/long_link.py --smoke    # about 30 s: checks that it runs
                                              # (it overlaps the first two runs)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _util  # noqa: E402

from tests.netns import Topology, netem_unavailable  # noqa: E402
from tests.netns import unavailable as netns_unavailable  # noqa: E402

BIN = Path(sys.executable).parent
ONE_WAY_S = 0.1
"""Delay added in each direction: a 200 ms round trip."""
START_S = 90.0
"""Bound on a learner's first update after its start (torch imports on a busy box)."""
STOP_S = 30.0
"""Bound on every process exiting after the learner's SIGINT."""
DEFAULT_LEAD = 64
"""The learner's default max_lead_steps for CartPole's defaults: 2 * num_steps (32)."""


def run_bound_s(warmup: float, window: float) -> float:
    """The longest one run can take: start-up, warm-up, window, stop (then it is killed)."""
    return START_S + warmup + window + 2 * STOP_S


ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
ADVICE = re.compile(r"--max-lead-steps (\d+) would cover its round trip")


def unavailable() -> str:
    """Why the benchmark cannot run here ('' when it can)."""
    return netns_unavailable()


def _script(name: str, module: str) -> list[str]:
    exe = BIN / name
    return [str(exe)] if exe.is_file() else [sys.executable, "-m", module]


@dataclass
class Run:
    """One measured configuration and what came out of it."""

    name: str
    max_lead_steps: int  # 0: the learner's default
    long_link: bool
    result: dict[str, Any] = field(default_factory=dict)


@dataclass
class Live:
    """The processes of one run while it runs."""

    run: Run
    run_dir: Path
    begun: float
    learner: subprocess.Popen[bytes]
    actors: list[subprocess.Popen[bytes]] = field(default_factory=list)
    relay: subprocess.Popen[bytes] | None = None
    first_at: float | None = None  # when its first update row appeared
    stop_at: float = 0.0
    stopped_in: float = 0.0
    codes: list[int] = field(default_factory=list)


class Bench:
    """The topology, the link, and the runs on it."""

    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args = args
        self.tmp = tmp
        self.topo = Topology(["l", "wan", "a"], tag=f"ll{os.getpid() % 10000}")
        self.no_netem = ""  # why netem is not used ('' when it is)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.launched = 0

    def up(self) -> str:
        """Build the namespaces and the long link; return how the link is made."""
        self.topo.up()
        self.no_netem = netem_unavailable()
        if not self.no_netem:
            for host in ("l", "a"):
                self.topo.delay(host, ONE_WAY_S)
            return f"tc netem delay {ONE_WAY_S * 1e3:g}ms on the eth0 of both hosts"
        return (
            f"userspace delay line (tests/netns.py DelayLine), {ONE_WAY_S * 1e3:g} ms each "
            f"way, because {self.no_netem}"
        )

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        self.topo.close()

    def _start(self, host: str, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [*self.topo.prefix(host), *argv],
                cwd=_util.ROOT,
                env=ENV,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc

    def measure(self, *runs: Run) -> list[dict[str, Any]]:
        """Start the learner and actors of every run in ``runs`` (at once: only the smoke
        overlaps two), measure each, stop them; return the figures. Bounded by
        :func:`run_bound_s`."""
        launched = [self._launch(run) for run in runs]
        deadline = time.monotonic() + START_S + self.args.warmup + self.args.window
        waiting = list(launched)
        while waiting and time.monotonic() < deadline:
            for live in list(waiting):
                if live.first_at is None and _rows(live.run_dir / "metrics.jsonl"):
                    live.first_at = time.monotonic()
                since = time.monotonic() - (live.first_at or math.inf)
                if since >= self.args.warmup + self.args.window or live.learner.poll() is not None:
                    self._stop(live)
                    waiting.remove(live)
            time.sleep(0.1)  # polling files with a deadline, not synchronising
        for live in waiting:
            self._stop(live)
        return [self._collect(live) for live in launched]

    def _launch(self, run: Run) -> Live:
        args = self.args
        port = _util.free_port_block(3)
        self.launched += 1
        tag = f"{self.launched:02d}-{run.name}"  # a fresh run dir and logs per run
        run_dir = self.tmp / tag
        bind = "127.0.0.1" if not run.long_link else self.topo.address("l")
        learner_argv = [
            *_script("zmq-learner", "zmq_rl.cli.learner"),
            *("--env-id", "CartPole-v1", "--num-actors", str(args.actors)),
            *("--host", bind, "--port", str(port), "--run-dir", str(run_dir)),
            *("--total-env-steps", str(10**9), "--checkpoint-every", "0"),
            *("--log-level", "warning", "--no-tensorboard"),
        ]
        if run.max_lead_steps:
            learner_argv += ["--max-lead-steps", str(run.max_lead_steps)]
        begun = time.monotonic()
        learner = self._start("l", learner_argv, self.tmp / f"{tag}-learner.log")
        live = Live(run, run_dir, begun, learner)
        actor_host, address = "l", f"127.0.0.1:{port}"
        if run.long_link:
            actor_host, address = "a", f"{self.topo.address('l')}:{port}"
            if self.no_netem:  # the actors reach the learner through the delay line
                address = f"{self.topo.address('wan')}:{port}"
                line = [sys.executable, "-m", "tests.netns", "delay-line"]
                line += [self.topo.address("wan"), self.topo.address("l"), str(ONE_WAY_S)]
                bound = run_bound_s(args.warmup, args.window)
                line += [str(bound), *map(str, range(port, port + 3))]
                live.relay = self._start("wan", line, self.tmp / f"{tag}-line.log")
        for i in range(args.actors):
            actor_argv = [
                *_script("zmq-actor", "zmq_rl.cli.actor"),
                *("--learner", address, "--env", "CartPole-v1", "--log-level", "warning"),
                *("--register-timeout", str(START_S), "--learner-timeout", "60"),
            ]
            log = self.tmp / f"{tag}-a{i}.log"
            live.actors.append(self._start(actor_host, actor_argv, log))
        return live

    def _stop(self, live: Live) -> None:
        """SIGINT to the learner (it stops its actors, writes its report); wait for all."""
        live.stop_at = time.monotonic()
        if live.learner.poll() is None:
            live.learner.send_signal(signal.SIGINT)
        for proc in [live.learner, *live.actors]:
            try:
                live.codes.append(proc.wait(STOP_S))
            except subprocess.TimeoutExpired:
                proc.kill()
                live.codes.append(proc.wait(10))
        if live.relay is not None:  # it would relay until its bound; the run is over
            live.relay.kill()
            live.relay.wait(10)
        live.stopped_in = time.monotonic() - live.stop_at

    def _collect(self, live: Live) -> dict[str, Any]:
        figures = self._figures(live.run, live.run_dir, live.codes, live.first_at is not None)
        figures["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
        figures["start_s"] = round((live.first_at or live.stop_at) - live.begun, 2)
        figures["stop_s"] = round(live.stopped_in, 2)
        return figures

    def _figures(self, run: Run, run_dir: Path, codes: list[int], trained: bool) -> dict:
        rows = _rows(run_dir / "metrics.jsonl")
        if not trained or len(rows) < 2:
            logs = "\n".join(
                f"--- {path.name}\n{path.read_text(errors='replace')[-2000:]}"
                for path in sorted(self.tmp.glob(f"{run_dir.name}-*.log"))
            )
            raise RuntimeError(f"{run.name}: no training measured (exit codes {codes}):\n{logs}")
        start_wall = rows[0]["wall_seconds"] + self.args.warmup
        window = [r for r in rows if r["wall_seconds"] >= start_wall] or rows[-2:]
        if len(window) < 2:
            window = rows[-2:]
        steps = window[-1]["env_steps"] - window[0]["env_steps"]
        seconds = window[-1]["wall_seconds"] - window[0]["wall_seconds"]
        report = json.loads((run_dir / "report.json").read_text())
        lines = list(report["actor_stats"].values())
        log = (self.tmp / f"{run_dir.name}-learner.log").read_text(errors="replace")
        advice = [int(m.group(1)) for m in ADVICE.finditer(log)]
        suggested = [
            line["suggested_max_lead_steps"] for line in lines if "suggested_max_lead_steps" in line
        ]
        rtts = [line["rtt_ms"] for line in lines if "rtt_ms" in line]
        shares = [line["valve_paused_share"] for line in lines if "valve_paused_share" in line]
        lead = run.max_lead_steps or DEFAULT_LEAD
        return {
            "name": run.name,
            "max_lead_steps": lead,
            "long_link": run.long_link,
            "steps_per_s": steps / seconds if seconds > 0 else 0.0,
            "window_s": seconds,
            "updates_in_window": len(window) - 1,
            "policy_lag_mean": sum(r.get("charts/policy_lag_mean", 0.0) for r in window)
            / len(window),
            "rtt_ms": max(rtts) if rtts else None,
            "valve_paused_share": max(shares) if shares else None,
            "suggested_max_lead_steps": max(suggested) if suggested else None,
            "advice_logged": advice,
            "exit_codes": codes,
        }


def _rows(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = [
        json.loads(line)
        for line in path.read_text().splitlines(keepends=True)
        if line.endswith("\n")
    ]
    return [row for row in rows if "eval/mean_return" not in row]  # update rows only


def one_round(bench: Bench, smoke: bool, round_no: int) -> list[dict[str, Any]]:
    """The runs of one round; the suggested lead is this round's ``long_default``'s."""
    first = [Run("loopback", 0, False), Run("long_default", 0, True)]
    # The smoke overlaps the first two (its figures only have to exist).
    batches = [first] if smoke else [[run] for run in first]
    results = [figures for batch in batches for figures in bench.measure(*batch)]
    suggested = results[-1]["suggested_max_lead_steps"]
    if suggested is None:
        raise RuntimeError("the learner of long_default suggested no max_lead_steps")
    results += bench.measure(Run("long_suggested", suggested, True))
    if not smoke:  # how much of the gain a larger lead brings without the link
        results += bench.measure(Run("loopback_suggested", suggested, False))
    for figures in results:
        figures["round"] = round_no
        print(json.dumps(figures), flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _util.add_common_flags(parser)
    parser.add_argument("--actors", type=int, default=2, help="zmq-actor processes (4 envs each)")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds not measured")
    parser.add_argument("--window", type=float, default=30.0, help="seconds measured per run")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of every run")
    args = parser.parse_args(argv)
    if args.smoke:
        args.warmup, args.window, args.rounds = 1.0, 3.0, 1
    reason = unavailable()
    if reason:
        print(f"long_link: skipped: {reason}")
        return 0
    import tempfile

    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="long_link-") as tmp:
        bench = Bench(args, Path(tmp))
        try:
            link = bench.up()
            print(f"link: {link}", flush=True)
            for round_no in range(args.rounds):
                results += one_round(bench, args.smoke, round_no)
        finally:
            bench.close()
    print(f"\n{'round':>5} {'run':<18} {'lead':>5} {'steps/s':>8} {'of loopback':>11} ", end="")
    print(f"{'rtt ms':>7} {'paused':>6} {'lag':>5}")
    for r in results:
        loop = next(x for x in results if x["round"] == r["round"] and x["name"] == "loopback")
        share, rtt = r["valve_paused_share"], r["rtt_ms"]
        print(
            f"{r['round']:>5} {r['name']:<18} {r['max_lead_steps']:>5} {r['steps_per_s']:>8,.0f} "
            f"{100 * r['steps_per_s'] / max(loop['steps_per_s'], 1e-9):>10.1f}% "
            f"{rtt if rtt is not None else math.nan:>7.1f} "
            f"{100 * share if share is not None else math.nan:>5.0f}% "
            f"{r['policy_lag_mean']:>5.2f}"
        )
    medians = {
        name: {
            "steps_per_s": _util.median([r["steps_per_s"] for r in results if r["name"] == name]),
            "of_loopback": _util.median(
                [
                    r["steps_per_s"]
                    / max(
                        1e-9,
                        next(
                            x["steps_per_s"]
                            for x in results
                            if x["round"] == r["round"] and x["name"] == "loopback"
                        ),
                    )
                    for r in results
                    if r["name"] == name
                ]
            ),
            "max_lead_steps": sorted({r["max_lead_steps"] for r in results if r["name"] == name}),
        }
        for name in dict.fromkeys(r["name"] for r in results)
    }
    print("\nmedians over rounds:")
    for name, m in medians.items():
        print(
            f"  {name:<18} {m['steps_per_s']:>8,.0f} steps/s  {100 * m['of_loopback']:5.1f}% of "
            f"loopback  lead {m['max_lead_steps']}"
        )
    _util.write_result(
        "long_link",
        args,
        {
            "link": link,
            "rtt_ms": 2e3 * ONE_WAY_S,
            "actors": args.actors,
            "num_envs": 4,
            "env_id": "CartPole-v1",
            "warmup_s": args.warmup,
            "window_s": args.window,
            "suggested_max_lead_steps": results[2]["max_lead_steps"],
            "medians": medians,
            "runs": results,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
