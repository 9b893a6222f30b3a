"""Fan-in: many actor processes against one learner, for minutes.

One real :class:`~zmq_rl.learner.loop.Learner` (its own process, started with
``spawn``) trains PPO on CartPole-v1-shaped experience from ``--actors``
lightweight actor processes (``fork``-ed from this process, which imported numpy,
pyzmq and zmq_rl.actor.client but created no ZeroMQ context). Each actor is an
:class:`~zmq_rl.actor.client.ActorClient` with ``--envs`` slots and a trivial policy
(random actions, random observations, an episode end with probability 1/200 per
step): no torch, no env, so that 64 of them fit on a small machine and the
learner is what is measured. The actors obey the staleness valve exactly as the
built-in actor does (``should_pause`` / ``wait_for_weights``).

Learner configuration: ``num_steps`` 32, ``fragment_length`` 32, PPO 1 epoch with
one minibatch per rollout, ``broadcast_every`` 1, no evaluation, no run dir.

Reported:

* fragments (messages) and env steps per second consumed, after a warm-up;
* latency from ``Fragment.sent_at`` (the actor's ``time.time()`` when it built
  the fragment) to the learner receiving it (``SlotQueues.push``) and to its
  consumption (the rollout that takes its last row, ``SlotQueues.take``), p50 /
  p99 / max, from fixed-size log histograms (no growth in the learner);
* learner RSS every ``--rss-interval`` s (psutil): baseline = median of the
  first 10 s after the warm-up; flat when every later sample is within +-10%;
* losses: per actor, fragments sent (the actor's own count, and the one in its
  bye) vs fragments received by the learner, the learner's ``seq_gaps`` counter,
  and every rejected / discarded counter.

    python bench/fan_in.py                    # 64 actors, 5 minutes
    python bench/fan_in.py --smoke            # 8 actors, 0.2 minutes
"""

from __future__ import annotations

import argparse
import logging
import math
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import contextlib

import _util  # noqa: E402

EPISODE_END_P = 1 / 200
LEARNER = {
    "num_steps": 32,
    "fragment_length": 32,
    "num_epochs": 1,
    "minibatch_size": 1 << 20,
    "broadcast_every": 1,
}


class LogHistogram:
    """Counts of positive values in log-spaced bins (1 us .. 1000 s, 2% wide)."""

    LO, HI, RATIO = 1e-6, 1e3, 1.02

    def __init__(self) -> None:
        import numpy as np

        self.nbins = int(math.log(self.HI / self.LO) / math.log(self.RATIO)) + 2
        self.counts = np.zeros(self.nbins, np.int64)
        self.counts[:] = 0  # touch the pages now: RSS must not grow later
        self.n = 0
        self.max = 0.0

    def add(self, value: float) -> None:
        if value <= self.LO:
            index = 0
        else:
            index = min(self.nbins - 1, int(math.log(value / self.LO) / math.log(self.RATIO)) + 1)
        self.counts[index] += 1
        self.n += 1
        if value > self.max:
            self.max = value

    def percentile(self, q: float) -> float:
        if not self.n:
            return math.nan
        rank = q / 100.0 * self.n
        seen = 0
        for index, count in enumerate(self.counts.tolist()):
            seen += count
            if seen >= rank and count:
                return self.LO * self.RATIO ** max(index - 0.5, 0)
        return self.max

    def summary(self) -> dict[str, float]:
        return {
            "count": self.n,
            "p50_ms": 1e3 * self.percentile(50),
            "p99_ms": 1e3 * self.percentile(99),
            "max_ms": 1e3 * self.max,
        }


# ------------------------------------------------------------------ the learner process


def learner_main(
    port: int, actors: int, envs: int, seconds: float, warmup: float, out: Any, ranks: int = 1
) -> None:
    logging.basicConfig(level=logging.WARNING)
    import numpy as np

    import zmq_rl.learner.queues as rollout_mod
    from zmq_rl.config import LearnerConfig, PolicyConfig, PPOConfig
    from zmq_rl.learner.loop import Learner

    received, consumed = LogHistogram(), LogHistogram()
    original_push = rollout_mod.SlotQueues.push
    original_take = rollout_mod._SlotQueue.take

    def push(self: Any, fragment: Any) -> None:
        received.add(time.time() - fragment.sent_at)
        original_push(self, fragment)

    def take(self: Any, n: int) -> list:
        pieces = original_take(self, n)
        now = time.time()
        for fragment, _column, _start, stop in pieces:
            if stop == fragment.length:  # its last row (of this slot) is consumed now
                consumed.add(now - fragment.sent_at)
        return pieces

    rollout_mod.SlotQueues.push = push
    rollout_mod._SlotQueue.take = take

    cfg = LearnerConfig(
        num_actors=actors,
        num_envs=envs,
        num_steps=LEARNER["num_steps"],
        fragment_length=LEARNER["fragment_length"],
        total_env_steps=10**13,
        broadcast_every=LEARNER["broadcast_every"],
        eval_every=0,
        eval_episodes=1,
        checkpoint_every=0,
        run_dir="",
        port=port,
        starvation_timeout=120.0,
        num_learners=ranks,
    )
    ppo = PPOConfig(num_epochs=LEARNER["num_epochs"], minibatch_size=LEARNER["minibatch_size"])
    rows = np.full((200_000, 3), np.nan)  # (t, env steps, fragments received); pre-touched
    state = {"n": 0, "first": None}

    def on_update(row: dict[str, Any]) -> None:
        now = time.monotonic()
        if state["first"] is None:
            state["first"] = now
            received.__init__()  # registration burst excluded from the latencies
            consumed.__init__()
        if state["n"] < len(rows):
            rows[state["n"]] = (now, row["env_steps"], learner.counters["received/fragments"])
            state["n"] += 1
        if now - state["first"] >= seconds:
            learner.request_stop("fan-in benchmark done")

    learner = Learner(cfg, ppo, PolicyConfig(), on_update=on_update)
    out.put({"kind": "ready", "pid": os.getpid()})
    t0 = time.monotonic()
    report = learner.run()
    learner.close()
    used = rows[: state["n"]]
    first = state["first"] or t0
    window = used[used[:, 0] >= first + warmup]
    if len(window) < 2:
        window = used
    span = float(window[-1, 0] - window[0, 0]) if len(window) >= 2 else math.nan
    out.put(
        {
            "kind": "report",
            "registration_s": first - t0,
            "updates": report.updates_completed,
            "env_steps": report.env_steps_consumed,
            "steps_per_s": float(window[-1, 1] - window[0, 1]) / span if span else math.nan,
            "fragments_per_s": float(window[-1, 2] - window[0, 2]) / span if span else math.nan,
            "window_s": span,
            "latency_received": received.summary(),
            "latency_consumed": consumed.summary(),
            "counters": dict(report.counters),
            "actor_stats": report.actor_stats,
            "dead_actors": report.dead_actors,
            "stop_reason": report.stop_reason,
            "episodes": report.episodes_completed,
            "episode_rewards_len": len(report.episode_rewards),
            "t_first_update": first,
        }
    )


# ------------------------------------------------------------------ the actor processes


def actor_main(port: int, envs: int, seed: int, out: Any) -> None:
    import numpy as np
    import zmq

    from zmq_rl.actor.client import ActorClient

    logging.basicConfig(level=logging.WARNING)
    ctx = zmq.Context()
    client = ActorClient(
        f"127.0.0.1:{port}",
        env_id="",
        observation_space=None,
        action_space=None,
        num_envs=envs,
        context=ctx,
        register_timeout=120,
        learner_timeout=120,
    )
    rng = np.random.default_rng(seed)
    error = ""
    try:
        client.register()
        n = client.num_envs
        obs = rng.standard_normal((n, 4)).astype(np.float32)
        next_obs = np.empty_like(obs)
        ones = np.ones(n, np.float32)
        no = np.zeros(n, bool)
        values = np.zeros(n, np.float32)
        log_probs = np.full(n, -0.69, np.float32)
        while True:
            client.poll()  # newest weights (a trivial policy ignores them), control
            if client.shutdown_requested:
                break
            if client.should_pause():
                client.wait_for_weights(0.05)
                continue
            actions = rng.integers(0, 2, n)
            terminated = rng.random(n) < EPISODE_END_P
            next_obs[:] = rng.standard_normal((n, 4))
            client.step(obs, actions, ones, terminated, no, values, log_probs, next_obs)
            obs, next_obs = next_obs, obs
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        error = f"{type(exc).__name__}: {exc}"
    finally:
        stats = dict(client.stats)
        actor_id = client.actor_id
        client.close()
        ctx.term()
    out.put(
        {
            "actor_id": actor_id,
            "fragments_sent": int(stats["fragments_sent"]),
            "steps_sent": int(stats["steps_sent"]),
            "error": error,
            "rejects": dict(client.rejects),
        }
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _util.add_common_flags(parser)
    parser.add_argument("--actors", type=int, default=64)
    parser.add_argument("--envs", type=int, default=4, help="slots per actor")
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=30.0, help="seconds excluded at the start")
    parser.add_argument("--rss-interval", type=float, default=2.0)
    parser.add_argument(
        "--num-learners",
        type=int,
        default=1,
        help="data-parallel learner ranks (RSS is then the sum over the ranks; latencies "
        "are rank 0's fragments)",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.actors, args.minutes, args.warmup, args.rss_interval = 8, 0.2, 3.0, 0.5
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import numpy  # noqa: F401 - imported once here, shared by the forked actors
    import psutil

    import zmq_rl.actor.client  # noqa: F401

    seconds = args.minutes * 60.0
    port = _util.free_port_block(3 + args.num_learners)
    spawn, fork = mp.get_context("spawn"), mp.get_context("fork")
    learner_out = spawn.Queue()
    learner = spawn.Process(
        target=learner_main,
        args=(port, args.actors, args.envs, seconds, args.warmup, learner_out, args.num_learners),
    )
    learner.start()
    ready = learner_out.get(timeout=120)
    actor_out = fork.Queue()
    actors = [
        fork.Process(target=actor_main, args=(port, args.envs, 1000 + i, actor_out))
        for i in range(args.actors)
    ]
    for p in actors:
        p.start()
    actor_rss = []
    with _util.RssSampler(ready["pid"], args.rss_interval, children=True) as rss:
        time.sleep(min(5.0, seconds / 2))
        for p in actors:
            with contextlib.suppress(psutil.Error):
                actor_rss.append(psutil.Process(p.pid).memory_full_info().uss)
        report = learner_out.get(timeout=seconds + 600)
    learner.join(60)
    actor_results = []
    for _ in actors:
        try:
            actor_results.append(actor_out.get(timeout=60))
        except Exception:  # noqa: BLE001 - a missing actor is reported as such
            break
    for p in actors:
        p.join(10)
        if p.is_alive():
            p.kill()

    # RSS: samples from the learner's first update + warm-up on (CLOCK_MONOTONIC is
    # shared by the processes of one machine).
    samples = rss.samples
    after = [(t, r) for t, r in samples if t >= report["t_first_update"] + args.warmup]
    first10 = [r for t, r in after if t <= after[0][0] + 10.0] if after else []
    baseline = _util.median(first10) if first10 else math.nan
    deviation = max((abs(r - baseline) / baseline for _, r in after), default=math.nan)
    t_zero = report["t_first_update"]
    rss_summary = {
        "baseline_mib": baseline / 2**20,
        "min_mib": min((r for _, r in after), default=math.nan) / 2**20,
        "max_mib": max((r for _, r in after), default=math.nan) / 2**20,
        "last_mib": (after[-1][1] / 2**20) if after else math.nan,
        "max_deviation": deviation,
        "flat_within_10pct": bool(deviation <= 0.10),
        "samples_since_first_update": [
            (round(t - t_zero, 1), round(r / 2**20, 1)) for t, r in samples
        ],
        "growth_mib_per_min": (
            (after[-1][1] - after[0][1]) / 2**20 / max((after[-1][0] - after[0][0]) / 60, 1e-9)
            if len(after) >= 2
            else math.nan
        ),
    }

    # Losses: per actor, what it sent vs what the learner received.
    per_actor = []
    stats = report["actor_stats"]
    for res in sorted(actor_results, key=lambda r: r["actor_id"]):
        rec = stats.get(str(res["actor_id"]), {})
        per_actor.append(
            {
                "actor_id": res["actor_id"],
                "sent": res["fragments_sent"],
                "sent_per_bye": rec.get("actor/fragments_sent"),
                "received": rec.get("fragments_received"),
                "said_bye": rec.get("said_bye"),
                "error": res["error"],
            }
        )
    lost = sum(max(0, a["sent"] - (a["received"] or 0)) for a in per_actor)
    counters = report["counters"]
    bad = {
        k: v
        for k, v in counters.items()
        if v
        and (
            k.startswith("rejected")
            or "seq_gaps" in k
            or (k.startswith("discarded") and "run_ended" not in k)
        )
    }
    losses = {
        "actors_reporting": len(actor_results),
        "actors_started": len(actors),
        "fragments_sent": sum(a["sent"] for a in per_actor),
        "fragments_received": sum(a["received"] or 0 for a in per_actor),
        "lost_fragments": lost,
        "seq_gaps": counters.get("experience/seq_gaps", 0),
        "bad_counters": bad,
        "actor_errors": [a for a in per_actor if a["error"]],
        "dead_actors": report["dead_actors"],
        "byes": sum(1 for a in per_actor if a["said_bye"]),
        "queued_at_end_steps": counters.get("discarded/steps/run_ended", 0),
    }
    zero_loss = (
        lost == 0
        and losses["seq_gaps"] == 0
        and not bad
        and len(actor_results) == len(actors)
        and not losses["actor_errors"]
    )
    print(
        f"{args.actors} actors x {args.envs} slots, {report['window_s']:.0f} s measured: "
        f"{_util.fmt_rate(report['fragments_per_s'])} fragments/s, "
        f"{_util.fmt_rate(report['steps_per_s'])} steps/s, {report['updates']} updates"
    )
    for key in ("latency_received", "latency_consumed"):
        lat = report[key]
        print(
            f"  {key.split('_')[1]:>9}: p50 {lat['p50_ms']:.1f} ms  p99 {lat['p99_ms']:.1f} ms"
            f"  max {lat['max_ms']:.1f} ms  ({lat['count']} fragments)"
        )
    print(
        f"  learner RSS: baseline {rss_summary['baseline_mib']:.0f} MiB, "
        f"{rss_summary['min_mib']:.0f}-{rss_summary['max_mib']:.0f} MiB, max deviation "
        f"{rss_summary['max_deviation']:.1%} ({rss_summary['growth_mib_per_min']:+.2f} MiB/min)"
    )
    print(
        f"  fragments sent {losses['fragments_sent']}, received "
        f"{losses['fragments_received']}, lost {lost}, seq gaps {losses['seq_gaps']}, "
        f"byes {losses['byes']}/{len(actors)}, bad counters {bad or 'none'}"
    )
    if actor_rss:
        print(f"  actor USS: median {_util.median(actor_rss) / 2**20:.1f} MiB")
    print(
        f"target: zero lost fragments: {'MET' if zero_loss else 'MISSED'}; RSS flat +-10%: "
        f"{'MET' if rss_summary['flat_within_10pct'] else 'MISSED'}"
    )
    _util.write_result(
        "fan_in",
        args,
        {
            "config": {
                "actors": args.actors,
                "num_envs": args.envs,
                "num_learners": args.num_learners,
                "minutes": args.minutes,
                "warmup_s": args.warmup,
                "learner": LEARNER,
                "episode_end_probability": EPISODE_END_P,
            },
            "throughput": {
                "fragments_per_s": report["fragments_per_s"],
                "steps_per_s": report["steps_per_s"],
                "window_s": report["window_s"],
                "updates": report["updates"],
                "registration_s": report["registration_s"],
            },
            "latency": {
                "received": report["latency_received"],
                "consumed": report["latency_consumed"],
            },
            "rss": rss_summary,
            "actor_uss_mib_median": _util.median(actor_rss) / 2**20 if actor_rss else None,
            "losses": losses,
            "per_actor": per_actor,
            "learner_counters": counters,
            "episode_rewards_len": report["episode_rewards_len"],
            "target": {"zero_loss": zero_loss, "rss_flat": rss_summary["flat_within_10pct"]},
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
