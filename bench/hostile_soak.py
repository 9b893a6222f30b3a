"""Hostile soak: a live CartPole run under every kind of hostile input at once (issue 19).

A real ``zmq-learner`` process trains CartPole-v1 with two real ``zmq-actor``
processes while this script, as the hostile peers, sends:

* **experience fuzz** (``--experience`` messages, every class of
  ``tests/test_hostile_learner_fuzz.py``'s ``ExperienceFuzzer``) on a raw PUSH;
* **control fuzz** (``--control`` messages, every class of its ``ControlFuzzer``, plus
  hellos asking for 4096 envs) on a raw DEALER;
* **hello storms**: ``--storm`` connections that each say one valid hello and then
  nothing (the first ``max_actors - 2`` are welcomed, the rest refused ``full``);
* **oversized frames** (``--oversize-mb``) on PULL and ROUTER, and 8 MB hellos
  carrying a 1M-element Box space, each from a connection of its own (libzmq drops
  the connection: they never reach the learner's code, so they are not counted);
* **forged fragments** (valid fragments as actor 0 with a guessed session token and a
  huge ``seq``).

It prints the ledger (messages sent per kind; the learner's counters per reason),
each good actor's steps sent vs received, the longest gap between two broadcasts
(``broadcast_every`` 1: between two updates) during the fuzz and overall, the final
evaluation against a run without fuzz (``--no-baseline`` skips it), and the
learner's RSS before the fuzz, at its peak and after. Exit status 1 when a check
fails (``--no-check``: report only). Full size::

    python bench/hostile_soak.py

Small (what ``tests/test_hostile_soak.py`` runs)::

    python bench/hostile_soak.py --small --no-baseline
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import _util
import numpy as np
import zmq

ROOT = _util.ROOT
LEARNER_START_S = 600.0
RUN_ID = re.compile(r"run id ([0-9a-f]+)")


# --------------------------------------------------------------------------- processes


def start_learner(
    port: int, run_dir: Path, steps: int, seed: int, epochs: int
) -> subprocess.Popen[bytes]:
    """``zmq-learner`` for CartPole-v1 (its preset; ``epochs`` PPO epochs, 0: the
    preset's), training the whole budget, evaluating only at the end; its log in
    ``run_dir/learner.log``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log = open(run_dir / "learner.log", "wb")  # noqa: SIM115 - lives as long as the process
    cmd = [sys.executable, "-m", "zmq_rl.cli.learner", "--env-id", "CartPole-v1"]
    cmd += ["--port", str(port), "--total-env-steps", str(steps), "--seed", str(seed)]
    cmd += ["--run-dir", str(run_dir / "run"), "--target-return", "inf", "--eval-every", "0"]
    cmd += ["--actor-timeout", "10", "--no-tensorboard", "--torch-threads", "1"]
    cmd += ["--starvation-timeout", "600"]  # actors start slowly on a loaded machine
    cmd += ["--log-level", "info"]  # the run id is logged at INFO
    if epochs:
        cmd += ["--num-epochs", str(epochs)]
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)


def start_actors(port: int, count: int, run_dir: Path) -> list[subprocess.Popen[bytes]]:
    procs = []
    for i in range(count):
        log = open(run_dir / f"actor-{i}.log", "wb")  # noqa: SIM115
        cmd = [sys.executable, "-m", "zmq_rl.cli.actor", "--learner", f"127.0.0.1:{port}"]
        cmd += ["--seed", str(100 + i), "--torch-threads", "1"]
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT))
    return procs


def wait_for_run_id(log: Path, learner: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + LEARNER_START_S
    while time.monotonic() < deadline:
        found = RUN_ID.search(log.read_text(errors="replace")) if log.exists() else None
        if found:
            return found.group(1)
        if learner.poll() is not None:
            raise SystemExit(f"the learner exited {learner.returncode}:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)
    raise SystemExit(f"no run id in {log} within {LEARNER_START_S}s")


def finish(
    learner: subprocess.Popen[bytes], actors: list[subprocess.Popen[bytes]], timeout: float
) -> int:
    """Wait (bounded) for the learner and the actors; kill what is left; the learner's
    exit status."""
    try:
        code = learner.wait(timeout)
    except subprocess.TimeoutExpired:
        learner.kill()
        code = learner.wait()
    for proc in actors:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return code


class BroadcastClock:
    """A raw SUB on the weights port, timestamping every broadcast (from a thread)."""

    def __init__(self, ctx: zmq.Context, port: int) -> None:
        self.sock = ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, 100_000)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.connect(f"tcp://127.0.0.1:{port}")
        self.times: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self.sock.poll(100):
                    self.sock.recv(copy=False)
                    self.times.append(time.monotonic())
        except zmq.ZMQError:  # the context was destroyed
            pass

    def longest_gap(self, start: float = 0.0, end: float = float("inf")) -> float:
        """The longest time between two broadcasts within [start, end] (the edges
        count: a window with no broadcast at all is one gap; a window reaching past
        the last broadcast, the end of the run, ends there)."""
        if self.times:  # a window past the run's last broadcast ends there
            end = min(end, self.times[-1])
        inside = [t for t in self.times if start <= t <= end]
        edges = [max(start, self.times[0] if self.times else start), *inside]
        if end != float("inf"):
            edges.append(end)
        return max((b - a for a, b in zip(edges, edges[1:], strict=False)), default=0.0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


# --------------------------------------------------------------------------- hostile peers


def raw(ctx: zmq.Context, kind: int, endpoint: str, hwm: int = 1000) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.SNDTIMEO, 30_000)
    sock.connect(endpoint)
    return sock


def big_box_hello() -> bytes:
    """A valid hello whose observation space is a 1M-element Box (8 MB of low/high)."""
    import gymnasium as gym

    from zmq_rl.wire.protocol import Hello, encode, space_spec

    box = gym.spaces.Box(-1.0, 1.0, (1_000_000,), np.float32)
    hello = Hello(
        actor_id=-1,
        env_id="CartPole-v1",
        observation_space=space_spec(box),
        action_space={},
        num_envs=1,
        host="big",
    )
    return encode(hello)


def _hello(num_envs: int, host: str, pid: int = 0) -> bytes:
    """A CartPole hello with empty space specs (the learner checks them after the limits)."""
    from zmq_rl.wire.protocol import Hello, encode

    return encode(
        Hello(
            actor_id=-1,
            env_id="CartPole-v1",
            observation_space={},
            action_space={},
            num_envs=num_envs,
            host=host,
            pid=pid,
        )
    )


def storm_hello(i: int) -> bytes:
    return _hello(1, "storm", 10_000 + i)


def greedy_hello() -> bytes:
    return _hello(4096, "greedy")


def forged_fragment(run_id: str, r: np.random.Generator) -> bytes:
    """A protocol-valid fragment as actor 0, slot 0, with a huge seq and a guessed
    session token."""
    from tests.helpers import cartpole_fragment
    from zmq_rl.wire import protocol

    fragment = cartpole_fragment(r, run_id, actor_id=0, seq=10**9, token=r.bytes(16))
    return protocol.encode(fragment)


class Hostile:
    """Sends the hostile traffic and keeps the ledger of what it sent."""

    def __init__(self, ctx: zmq.Context, port: int, run_id: str, args: Any) -> None:
        from tests.test_hostile_learner_fuzz import ControlFuzzer, ExperienceFuzzer

        self.ctx, self.port, self.run_id, self.args = ctx, port, run_id, args
        self.control_ep = f"tcp://127.0.0.1:{port}"
        self.experience_ep = f"tcp://127.0.0.1:{port + 1}"
        self.push = raw(ctx, zmq.PUSH, self.experience_ep)
        self.dealer = raw(ctx, zmq.DEALER, self.control_ep)
        # A stranger knows no session token (protocol v2): its fragments carry none.
        self.experience = ExperienceFuzzer(args.seed + 1, run_id, {0: 4, 1: 4}, {})
        self.control = ControlFuzzer(args.seed + 2, run_id)
        self.rng = np.random.default_rng(args.seed)
        self.sent: dict[str, Counter[str]] = {
            "experience": Counter(),
            "control": Counter(),
            "dropped_by_libzmq": Counter(),
            "storm": Counter(),
        }
        self.experience_frames = 0  # parts: a PULL counts each part
        self.control_messages = 0
        self.replies: Counter[str] = Counter()
        self.storm_window: tuple[float, float] | None = None
        self._storm_socks: list[zmq.Socket] = []

    def run(self) -> tuple[float, float]:
        """Send everything; the fuzz's (start, end) on the monotonic clock."""
        args = self.args
        batch = 200
        batches = max(args.experience, args.control) // batch + 1
        storm_at = batches // 3
        start = time.monotonic()
        for b in range(batches):
            for i in range(b * batch, min((b + 1) * batch, args.experience)):
                name, parts = self.experience.generate(i)
                self.push.send_multipart(parts)
                self.sent["experience"][name] += 1
                self.experience_frames += len(parts)
                if i % 500 == 0:
                    self.push.send(forged_fragment(self.run_id, self.rng))
                    self.sent["experience"]["forged_fragment"] += 1
                    self.experience_frames += 1
            for i in range(b * batch, min((b + 1) * batch, args.control)):
                name, parts = self.control.generate(i)
                self.dealer.send_multipart(parts)
                self.sent["control"][name] += 1
                self.control_messages += 1
            if b % 10 == 0:
                self.dealer.send(greedy_hello())
                self.sent["control"]["hello_4096_envs"] += 1
                self.control_messages += 1
            if b % 25 == 5:
                self.oversized()
            if b == storm_at:
                self.storm()
            self.read_replies()
            if b % 20 == 0:
                print(
                    f"{time.strftime('%H:%M:%S')} fuzz batch {b}/{batches}: "
                    f"{self.experience_frames} experience frames, "
                    f"{self.control_messages} control messages sent",
                    flush=True,
                )
            time.sleep(args.pace)
        end = time.monotonic()
        time.sleep(1.0)
        self.read_replies()
        return start, end

    def oversized(self) -> None:
        """One oversized frame on PULL and on ROUTER and one 8 MB hello, each from its own
        connection (libzmq drops it; the ledger sockets keep theirs)."""
        size = int(self.args.oversize_mb * 1024 * 1024)
        frame = b"\x81" + b"\0" * (size - 1)
        for name, kind, endpoint, payload in (
            ("oversized_pull", zmq.PUSH, self.experience_ep, frame),
            ("oversized_router", zmq.DEALER, self.control_ep, frame),
            ("hello_1M_box", zmq.DEALER, self.control_ep, big_box_hello()),
        ):
            sock = raw(self.ctx, kind, endpoint)
            sock.send(payload)
            self.sent["dropped_by_libzmq"][name] += 1
            self._storm_socks.append(sock)  # closed at the end (its frame must leave)

    def storm(self) -> None:
        """``--storm`` connections, each saying one valid hello and then nothing."""
        t0 = time.monotonic()
        for i in range(self.args.storm):
            sock = raw(self.ctx, zmq.DEALER, self.control_ep, hwm=10)
            sock.send(storm_hello(i))
            self._storm_socks.append(sock)
        self.sent["storm"]["hello"] += self.args.storm
        self.storm_window = (t0, time.monotonic())

    def read_replies(self) -> None:
        from zmq_rl.wire.protocol import ProtocolError, decode

        while self.dealer.poll(0):
            try:
                self.replies[type(decode(self.dealer.recv())).__name__ + ":"] += 1
            except ProtocolError:
                self.replies["undecodable"] += 1

    def storm_replies(self) -> Counter[str]:
        from zmq_rl.wire.protocol import ProtocolError, Refuse, Welcome, decode

        got: Counter[str] = Counter()
        for sock in self._storm_socks:
            while sock.poll(0):
                try:
                    message = decode(sock.recv())
                except ProtocolError:
                    got["undecodable"] += 1
                    continue
                if isinstance(message, Welcome):
                    got["welcome"] += 1
                elif isinstance(message, Refuse):
                    got[f"refuse:{message.code}"] += 1
        return got

    def close(self) -> None:
        for sock in (self.push, self.dealer, *self._storm_socks):
            sock.close(linger=0)


# --------------------------------------------------------------------------- runs


def one_run(args: Any, work: Path, hostile: bool) -> dict[str, Any]:
    """One training run (with or without the hostile peers); its figures."""
    import psutil

    if hostile:  # imported before the run starts (torch and the fuzzers take a while)
        import tests.test_hostile_learner_fuzz  # noqa: F401
    ctx = zmq.Context()
    ctx.set(zmq.MAX_SOCKETS, 4 * args.storm + 1024)  # the storm's connections
    port = _util.free_port_block(3)
    run_dir = work / ("soak" if hostile else "baseline")
    learner = start_learner(port, run_dir, args.steps, args.seed, args.num_epochs)
    actors: list[subprocess.Popen[bytes]] = []
    result: dict[str, Any] = {}
    try:
        run_id = wait_for_run_id(run_dir / "learner.log", learner)
        clock = BroadcastClock(ctx, port + 2)
        actors = start_actors(port, 2, run_dir)
        deadline = time.monotonic() + LEARNER_START_S
        while len(clock.times) < 5:  # training runs
            if time.monotonic() > deadline or learner.poll() is not None:
                raise SystemExit("training did not start:\n" + tail(run_dir / "learner.log"))
            time.sleep(0.1)
        proc = psutil.Process(learner.pid)
        with _util.RssSampler(learner.pid, interval=0.1) as rss:
            time.sleep(2.0)
            before = int(np.median([b for _, b in rss.samples[-10:]]))
            if hostile:
                peers = Hostile(ctx, port, run_id, args)
                try:
                    fuzz_start, fuzz_end = peers.run()
                except zmq.Again:
                    raise SystemExit(
                        "the learner stopped reading before the fuzz ended (its budget of "
                        f"{args.steps} steps was spent: raise --steps):\n"
                        + tail(run_dir / "learner.log")
                    ) from None
                still_running = learner.poll() is None
                time.sleep(args.settle)
                after = proc.memory_info().rss if learner.poll() is None else None
                storm = peers.storm_replies()
                result.update(
                    sent={k: dict(v) for k, v in peers.sent.items()},
                    experience_frames=peers.experience_frames,
                    control_messages=peers.control_messages,
                    replies=dict(peers.replies),
                    storm_replies=dict(storm),
                    fuzz_seconds=round(fuzz_end - fuzz_start, 1),
                    run_alive_after_fuzz=still_running,
                    longest_gap_fuzz_s=round(clock.longest_gap(fuzz_start, fuzz_end), 3),
                )
                if peers.storm_window is not None:
                    s0, _ = peers.storm_window
                    result["longest_gap_storm_s"] = round(clock.longest_gap(s0, s0 + 15.0), 3)
                peers.close()
            else:
                after = None
            code = finish(learner, actors, args.timeout)
        peak = max(b for _, b in rss.samples)
        if after is None:  # (baseline) the last sample before the final evaluation
            after = rss.samples[-1][1]
        report = json.loads((run_dir / "run" / "report.json").read_text())
        result.update(
            learner_exit=code,
            longest_gap_s=round(clock.longest_gap(), 3),
            rss_mb={
                "before": round(before / 2**20, 1),
                "peak": round(peak / 2**20, 1),
                "after": round(after / 2**20, 1),
            },
            report=report,
        )
        clock.close()
        return result
    finally:
        for proc in [learner, *actors]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        ctx.destroy(linger=0)  # closes whatever an exception left open


def tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:] if path.exists() else ""


def summarise(soak: dict[str, Any], baseline: dict[str, Any] | None, args: Any) -> dict[str, Any]:
    """The figures and the checks of the issue's 'done when'."""
    report = soak["report"]
    counters = report["counters"]

    def total(prefix: str) -> int:
        return sum(v for k, v in counters.items() if k.startswith(prefix))

    good = {k: v for k, v in report["actor_stats"].items() if v.get("host") != "storm"}
    actors = {
        k: {
            "sent": v.get("actor/steps_sent"),
            "received": v["steps_received"],
            "fragments_sent": v.get("actor/fragments_sent"),
            "fragments_received": v["fragments_received"],
        }
        for k, v in sorted(report["actor_stats"].items())
        if k in ("0", "1")
    }
    final = report["evaluations"][-1]["mean_return"] if report["evaluations"] else None
    base_final = None
    if baseline is not None and baseline["report"]["evaluations"]:
        base_final = baseline["report"]["evaluations"][-1]["mean_return"]
    rss = soak["rss_mb"]
    checks = {
        "run_alive_after_fuzz": soak["run_alive_after_fuzz"],
        "budget_spent": report["stop_reason"] == "budget spent"
        and args.steps - report["env_steps_consumed"] < 8 * 32,
        "nothing_hostile_trained_on": counters.get("received/fragments", 0)
        == sum(a["fragments_received"] for a in actors.values()),
        "good_actors_lose_nothing": len(actors) == 2
        and all(a["sent"] == a["received"] > 0 for a in actors.values()),
        "every_experience_frame_counted": total("rejected/experience/")
        == soak["experience_frames"],
        "every_control_message_counted": total("rejected/control/")
        + counters.get("refused/too_many_envs", 0)
        == soak["control_messages"],
        "storm_gap_under_1s": soak.get("longest_gap_storm_s", 0.0) < 1.0,
        "rss_after_within_100MB": rss["after"] - rss["before"] <= 100.0,
    }
    if base_final is not None:
        checks["final_return_at_least_90pct_of_baseline"] = final is not None and (
            final >= 0.9 * base_final
        )
    return {
        "ledger": {
            "sent": soak["sent"],
            "experience_frames_sent": soak["experience_frames"],
            "control_messages_sent": soak["control_messages"],
            "counted": {
                k: v
                for k, v in sorted(counters.items())
                if k.startswith(("rejected/", "refused/", "auth/", "registered", "actors/"))
            },
            "replies_to_fuzz_dealer": soak["replies"],
            "storm_replies": soak["storm_replies"],
        },
        "good_actors": actors,
        "non_good_registrations": sorted(set(report["actor_stats"]) - set(good)),
        "fuzz_seconds": soak["fuzz_seconds"],
        "longest_update_gap_s": {
            "during_fuzz": soak["longest_gap_fuzz_s"],
            "after_storm_15s": soak.get("longest_gap_storm_s"),
            "whole_run": soak["longest_gap_s"],
            "baseline_whole_run": baseline["longest_gap_s"] if baseline else None,
        },
        "final_return": {"soak": final, "baseline": base_final},
        "env_steps_consumed": report["env_steps_consumed"],
        "stop_reason": report["stop_reason"],
        "rss_mb": rss,
        "rss_mb_baseline": baseline["rss_mb"] if baseline else None,
        "checks": checks,
        "passed": all(checks.values()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200_000, help="the run's env-step budget")
    parser.add_argument("--experience", type=int, default=20_000, help="fuzz messages to PULL")
    parser.add_argument("--control", type=int, default=20_000, help="fuzz messages to ROUTER")
    parser.add_argument("--storm", type=int, default=2_000, help="hello-storm connections")
    parser.add_argument("--oversize-mb", type=float, default=50.0, help="oversized frame size")
    parser.add_argument("--pace", type=float, default=0.05, help="seconds between batches")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds before RSS 'after'")
    parser.add_argument("--timeout", type=float, default=1800.0, help="longest a run may take")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-epochs", type=int, default=0, help="PPO epochs (0: preset's 20)")
    parser.add_argument("--small", action="store_true", help="the CI size (about a minute)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the run without fuzz")
    parser.add_argument("--no-check", action="store_true", help="exit 0 even if a check fails")
    parser.add_argument("--keep", default="", help="keep the runs' folders here")
    _util.add_common_flags(parser)
    args = parser.parse_args(argv)
    if args.small or args.smoke:
        # About 15 s of training on an idle 2-core box: the fuzz (a few seconds) must
        # end before the budget does, or the learner stops reading and the sends block.
        args.steps = min(args.steps, 120_000)
        args.num_epochs = args.num_epochs or 4
        args.experience = min(args.experience, 1_000)
        args.control = min(args.control, 1_000)
        args.storm = min(args.storm, 300)
        args.oversize_mb = min(args.oversize_mb, 2.0)
        args.settle = min(args.settle, 2.0)
        args.timeout = min(args.timeout, 300.0)
    with tempfile.TemporaryDirectory(prefix="hostile-soak-") as tmp:
        work = Path(args.keep) if args.keep else Path(tmp)
        baseline = None if args.no_baseline else one_run(args, work, hostile=False)
        soak = one_run(args, work, hostile=True)
    summary = summarise(soak, baseline, args)
    print(json.dumps(summary, indent=2))
    for name, ok in summary["checks"].items():
        print(f"{'PASS' if ok else 'FAIL'} {name}")
    _util.write_result("hostile_soak", args, {"args": vars(args), **summary})
    return 0 if summary["passed"] or args.no_check else 1


if __name__ == "__main__":
    sys.exit(main())
