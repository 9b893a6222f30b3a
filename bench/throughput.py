"""End-to-end throughput: env steps per second consumed by the learner, CartPole-v1.

The learner runs in this process (``Learner.run``); ``A`` actor processes
(``GymActor``, started with multiprocessing ``spawn``) step ``E`` envs each, for
every ``A`` in ``--actors`` and ``E`` in ``--envs``. Throughput configuration
(stated in the JSON): ``num_steps`` 64, ``fragment_length`` 64, PPO
``num_epochs`` 1 with one minibatch per rollout (``minibatch_size`` 65536, capped
at the rollout), ``broadcast_every`` 1, no evaluation, no run directory, torch 1
thread (the defaults of ``torch_threads``). The rate is the slope of
``env_steps`` over the learner's ``on_update`` rows after ``--warmup`` seconds,
over ``--window`` seconds; then the learner is asked to stop.

In the same run, when the packages are importable (here or in ``.venv-bench``):

* Stable-Baselines3 PPO, zoo hyperparameters (``bench/sb3_ppo.py throughput``):
  training env steps per second of ``model.learn``;
* Sample Factory's APPO CartPole example (``python -m sf_examples.train_gym_env``
  with the example's flags plus ``--device=cpu``, ``--train_dir`` and
  ``--train_for_env_steps``, stopped after ``--sf-seconds`` at the latest): its
  steady frames per second (slope of the "Total num frames" reports after the
  first one), and its own final FPS line when it finished by itself.

Then ``--rounds`` rounds alternate the project's best grid configuration, SF and
SB3, and the ratios are taken per round (the machine may be shared).

    python bench/throughput.py
    python bench/throughput.py --smoke
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import math
import multiprocessing as mp
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _util  # noqa: E402

THROUGHPUT = {
    "num_steps": 64,
    "fragment_length": 64,
    "num_epochs": 1,
    "minibatch_size": 65536,
    "broadcast_every": 1,
    "torch_threads": 1,
}
SF_FLAGS = [
    "--algo=APPO",
    "--use_rnn=False",
    "--num_envs_per_worker=20",
    "--policy_workers_per_policy=2",
    "--recurrence=1",
    "--with_vtrace=False",
    "--batch_size=512",
    "--reward_scale=0.1",
    "--save_every_sec=10",
    "--experiment_summaries_interval=10",
    "--experiment=example_gym_cartpole-v1",
    "--env=CartPole-v1",
]
"""The CartPole command line in sf_examples/train_gym_env.py (Sample Factory 2.1.1)."""


LIKE_FOR_LIKE: dict[str, dict[str, Any]] = {
    "sf": {
        "actors": 2,
        "envs": 20,
        "learner": {"num_steps": 32, "fragment_length": 32},
        "ppo": {"num_epochs": 1, "minibatch_size": 512},
        "why": "SF's CartPole example: 2 workers (its default, one per core) x 20 envs, "
        "rollout 32, batch_size 512, 1 epoch (its default)",
    },
    "sb3": {
        "actors": 2,
        "envs": 4,
        "learner": {"num_steps": 32, "fragment_length": 32},
        "ppo": {"num_epochs": 20, "minibatch_size": 256},
        "why": "rl-baselines3-zoo's CartPole-v1 PPO: 8 envs, n_steps 32, batch_size 256, "
        "n_epochs 20 (the project's CartPole preset)",
    },
}
"""The project at each baseline's own learner settings (issue 13, item 2): the same
rollout size, epochs and minibatch, so the same gradient steps per env step."""


def grad_steps_per_1k(rollout_rows: int, epochs: int, minibatch: int) -> float:
    """Gradient steps per 1,000 env steps of a PPO learner that runs ``epochs`` passes
    of ``ceil(rows / minibatch)`` minibatches over each rollout of ``rollout_rows``."""
    return 1000.0 * epochs * math.ceil(rollout_rows / min(minibatch, rollout_rows)) / rollout_rows


SF_GRAD_STEPS_PER_1K = grad_steps_per_1k(512, 1, 512)
"""SF APPO trains one epoch of one 512-transition batch per 512 env steps."""
SB3_GRAD_STEPS_PER_1K = grad_steps_per_1k(8 * 32, 20, 256)
"""SB3 zoo: 20 epochs of one 256-transition minibatch per 256-step rollout."""


def project_grad_steps_per_1k(actors: int, envs: int, learner: dict, ppo: dict) -> float:
    """Gradient steps per 1k env steps of a project run (THROUGHPUT overridden)."""
    rows = actors * envs * learner.get("num_steps", THROUGHPUT["num_steps"])
    epochs = ppo.get("num_epochs", THROUGHPUT["num_epochs"])
    return grad_steps_per_1k(rows, epochs, ppo.get("minibatch_size", THROUGHPUT["minibatch_size"]))


def run_like_for_like(
    name: str, warmup: float, window: float, device: str = "auto"
) -> dict[str, Any]:
    """The project at ``LIKE_FOR_LIKE[name]``'s settings, the learner on ``device``."""
    spec = LIKE_FOR_LIKE[name]
    res = run_project(
        spec["actors"], spec["envs"], warmup, window, spec["learner"], spec["ppo"], device
    )
    res["grad_steps_per_1k"] = project_grad_steps_per_1k(
        spec["actors"], spec["envs"], spec["learner"], spec["ppo"]
    )
    return res


def _actor_main(port: int, num_envs: int) -> None:
    logging.basicConfig(level=logging.WARNING)
    from zmq_rl.actor.gym_actor import GymActor
    from zmq_rl.config import ActorConfig

    GymActor(ActorConfig(learner=f"127.0.0.1:{port}", num_envs=num_envs)).run()


def run_project(
    actors: int,
    envs: int,
    warmup: float,
    window: float,
    learner_changes: dict[str, Any] | None = None,
    ppo_changes: dict[str, Any] | None = None,
    device: str = "auto",
    policy_changes: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One measurement of ``actors`` x ``envs`` at the throughput configuration with the
    learner on ``device``, ``learner_changes`` / ``ppo_changes`` / ``policy_changes``
    overriding LearnerConfig / PPOConfig / PolicyConfig fields."""
    import psutil

    from zmq_rl.config import LearnerConfig, PolicyConfig, PPOConfig
    from zmq_rl.learner.loop import Learner

    # A learner binds port .. port + 2; with N learner ranks, up to port + 2 + N.
    port = _util.free_port_block(3 + (learner_changes or {}).get("num_learners", 1))
    cfg = LearnerConfig(
        num_actors=actors,
        num_envs=envs,
        num_steps=THROUGHPUT["num_steps"],
        fragment_length=THROUGHPUT["fragment_length"],
        total_env_steps=10**12,
        broadcast_every=THROUGHPUT["broadcast_every"],
        eval_every=0,
        eval_episodes=1,
        checkpoint_every=0,
        run_dir="",
        port=port,
        torch_threads=THROUGHPUT["torch_threads"],
        device=device,
    )
    cfg = dataclasses.replace(cfg, **(learner_changes or {}))
    ppo = PPOConfig(
        num_epochs=THROUGHPUT["num_epochs"], minibatch_size=THROUGHPUT["minibatch_size"]
    )
    ppo = dataclasses.replace(ppo, **(ppo_changes or {}))
    rows: list[tuple[float, int]] = []
    marks: dict[str, Any] = {}
    procs: list[Any] = []

    def cpu_seconds() -> float:
        total = 0.0
        for p in [psutil.Process(), *(psutil.Process(q.pid) for q in procs)]:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
        return total

    def on_update(row: dict[str, Any]) -> None:
        now = time.monotonic()
        rows.append((now, int(row["env_steps"])))
        first = marks.setdefault("first", now)
        if "window_start" not in marks and now - first >= warmup:
            marks["window_start"] = now
            marks["cpu_start"] = cpu_seconds()
            psutil.cpu_percent(None)
        if "window_start" in marks and now - marks["window_start"] >= window:
            if "cpu_end" not in marks:
                marks["cpu_end"] = cpu_seconds()
                marks["system_cpu_percent"] = psutil.cpu_percent(None)
            learner.request_stop("benchmark window done")

    policy = dataclasses.replace(PolicyConfig(), **(policy_changes or {}))
    learner = Learner(cfg, ppo, policy, on_update=on_update)
    ctx = mp.get_context("spawn")
    procs.extend(ctx.Process(target=_actor_main, args=(port, envs)) for _ in range(actors))
    t_launch = time.monotonic()
    for p in procs:
        p.start()
    try:
        report = learner.run()
    finally:
        learner.close()
        for p in procs:
            p.join(20)
            if p.is_alive():
                p.kill()
    inside = [r for r in rows if r[0] >= marks.get("window_start", float("inf"))]
    if len(inside) < 2:
        inside = rows[len(rows) // 2 :]
    (t0, s0), (t1, s1) = inside[0], inside[-1]
    span = max(t1 - t0, 1e-9)
    return {
        "actors": actors,
        "num_envs": envs,
        "slots": actors * envs,
        "device": report.device,
        "steps_per_s": (s1 - s0) / span,
        "window_seconds": span,
        "updates": report.updates_completed,
        "updates_per_s": sum(1 for r in inside[1:]) / span,
        "env_steps": report.env_steps_consumed,
        "launch_to_first_update_s": marks.get("first", t_launch) - t_launch,
        "cpu_cores_busy": (marks.get("cpu_end", 0.0) - marks.get("cpu_start", 0.0)) / span,
        "system_cpu_percent": marks.get("system_cpu_percent"),
        "stop_reason": report.stop_reason,
        "counters": {
            k: v
            for k, v in report.counters.items()
            if "seq_gaps" in k or k.startswith(("rejected", "discarded"))
        },
    }


# ------------------------------------------------------------------ baselines


def run_sb3(python: str, steps: int) -> dict[str, Any]:
    import json

    cmd = [python, str(Path(__file__).with_name("sb3_ppo.py")), "throughput", "--steps", str(steps)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    for line in done.stdout.splitlines()[::-1]:
        if line.startswith("RESULT "):
            return {"ok": True, **json.loads(line[len("RESULT ") :])}
    return {"ok": False, "error": (done.stdout + done.stderr)[-2000:]}


SF_REPORT = re.compile(
    r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]\[\d+\] Fps is .*?Total num frames: (\d+)"
)
SF_FINAL = re.compile(r"Collected \{0: (\d+)\}, FPS: ([\d.]+)")


def run_sf(python: str, seconds: float, frames: int) -> dict[str, Any]:
    """The SF example until ``frames`` env frames or ``seconds`` of wall time, whichever
    first (its ``--train_for_seconds`` never fires in 2.1.1: ``total_train_seconds`` is
    never advanced), in its own process group, which is always killed at the end."""
    import signal

    train_dir = tempfile.mkdtemp(prefix="sf-bench-")
    cmd = [
        python,
        "-m",
        "sf_examples.train_gym_env",
        *SF_FLAGS,
        "--device=cpu",
        f"--train_dir={train_dir}",
        f"--train_for_env_steps={frames}",
    ]
    log_path = Path(train_dir) / "stdout.txt"
    timed_out = False
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, cwd=train_dir, start_new_session=True
        )
        try:
            proc.wait(seconds)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            for sig, wait in ((signal.SIGINT, 10), (signal.SIGKILL, 10)):
                if proc.poll() is not None:
                    break
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(wait)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    pass
            with contextlib.suppress(ProcessLookupError):  # its workers, whatever happened
                os.killpg(proc.pid, signal.SIGKILL)
    text = log_path.read_text(errors="replace")
    shutil.rmtree(train_dir, ignore_errors=True)
    reports = [
        (datetime.strptime(ts, "%Y-%m-%d %H:%M:%S,%f").timestamp(), int(n))
        for ts, n in SF_REPORT.findall(text)
    ]
    final = SF_FINAL.search(text)
    result: dict[str, Any] = {
        "returncode": proc.returncode,
        "timed_out": timed_out,
        "reports": reports,
        "command": " ".join(cmd[1:]),
    }
    steady = [r for r in reports if r[1] > 0]
    if len(steady) >= 3:
        steady = steady[1:]  # the first report includes the start-up burst
    if len(steady) >= 2:
        (t0, f0), (t1, f1) = steady[0], steady[-1]
        result["steady_frames_per_s"] = (f1 - f0) / max(t1 - t0, 1e-9)
        result["steady_window_s"] = t1 - t0
    if final:
        result["final_frames"] = int(final.group(1))
        result["final_fps"] = float(final.group(2))
    result["ok"] = "steady_frames_per_s" in result
    if not result["ok"]:
        result["error"] = text[-3000:]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _util.add_common_flags(parser)
    parser.add_argument("--actors", default="1,2,4")
    parser.add_argument("--envs", default="1,8,32")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--window", type=float, default=6.0)
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="rounds of (project best config, SF, SB3) after the grid",
    )
    parser.add_argument("--sb3-steps", type=int, default=30_000)
    parser.add_argument("--sf-frames", type=int, default=400_000, help="SF's --train_for_env_steps")
    parser.add_argument(
        "--sf-seconds",
        type=float,
        default=75.0,
        help="wall limit of an SF run (its frames/s are taken from its reports)",
    )
    parser.add_argument("--no-baselines", action="store_true", help="skip SB3 and SF")
    parser.add_argument(
        "--device", default="auto", help="the learner's device: auto, cpu, cuda or cuda:N"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.actors, args.envs, args.warmup, args.window = "1", "8", 0.5, 1.5
        args.rounds, args.sb3_steps = 1, 2048
        args.sf_frames, args.sf_seconds = 30_000, 25.0
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    grid = []
    for a in (int(x) for x in args.actors.split(",")):
        for e in (int(x) for x in args.envs.split(",")):
            res = run_project(a, e, args.warmup, args.window, device=args.device)
            grid.append(res)
            print(
                f"project {a} actor(s) x {e:>2} envs: {_util.fmt_rate(res['steps_per_s'])} "
                f"steps/s  (cpu {res['cpu_cores_busy']:.2f} cores, {res['updates']} updates)",
                flush=True,
            )
    best = max(grid, key=lambda r: r["steps_per_s"])

    sb3_python = None if args.no_baselines else _util.bench_python("stable_baselines3")
    sf_python = None if args.no_baselines else _util.bench_python("sample_factory", "sf_examples")
    baselines: dict[str, Any] = {
        "sb3": {"python": sb3_python, "available": sb3_python is not None},
        "sf": {"python": sf_python, "available": sf_python is not None},
    }
    if args.smoke and sf_python:
        sf_python = None  # its start-up alone takes 10-25 s on a 2-core machine
        baselines["sf"]["skipped"] = "--smoke (SF start-up alone takes 10-25 s here)"
    if sb3_python:
        baselines["sb3"]["versions"] = _util.package_versions(
            sb3_python, ["stable-baselines3", "torch", "gymnasium", "numpy"]
        )
    if sf_python:
        baselines["sf"]["versions"] = _util.package_versions(
            sf_python, ["sample-factory", "torch", "gymnasium", "numpy"]
        )
    rounds = []
    for r in range(args.rounds):
        entry: dict[str, Any] = {"round": r}
        entry["project"] = (
            best
            if args.smoke
            else run_project(
                best["actors"], best["num_envs"], args.warmup, args.window, device=args.device
            )
        )
        print(
            f"round {r}: project {best['actors']}x{best['num_envs']}: "
            f"{_util.fmt_rate(entry['project']['steps_per_s'])} steps/s",
            flush=True,
        )
        for name in ("sf", "sb3"):
            if (sf_python if name == "sf" else sb3_python) or args.smoke:
                like = run_like_for_like(name, args.warmup, args.window, args.device)
                entry[f"project_at_{name}_settings"] = like
                print(
                    f"round {r}: project at {name.upper()}'s settings "
                    f"({like['actors']}x{like['num_envs']}, "
                    f"{like['grad_steps_per_1k']:.1f} grad steps/1k): "
                    f"{_util.fmt_rate(like['steps_per_s'])} steps/s",
                    flush=True,
                )
        if sf_python:
            entry["sf"] = run_sf(sf_python, args.sf_seconds, args.sf_frames)
            print(
                f"round {r}: Sample Factory APPO: "
                f"{_util.fmt_rate(entry['sf'].get('steady_frames_per_s', float('nan')))} "
                f"frames/s (its final FPS {entry['sf'].get('final_fps', 'n/a')})",
                flush=True,
            )
        if sb3_python:
            entry["sb3"] = run_sb3(sb3_python, args.sb3_steps)
            print(
                f"round {r}: SB3 PPO zoo: "
                f"{_util.fmt_rate(entry['sb3'].get('steps_per_s', float('nan')))} steps/s",
                flush=True,
            )
        rounds.append(entry)

    def ratios(key: str, field: str, project: str = "project") -> list[float]:
        return [
            e[project]["steps_per_s"] / e[key][field]
            for e in rounds
            if key in e and project in e and e[key].get(field)
        ]

    def like_grad(name: str) -> float:
        spec = LIKE_FOR_LIKE[name]
        return project_grad_steps_per_1k(spec["actors"], spec["envs"], spec["learner"], spec["ppo"])

    def like_rate(name: str) -> float:
        return _util.median(
            [
                e[f"project_at_{name}_settings"]["steps_per_s"]
                for e in rounds
                if f"project_at_{name}_settings" in e
            ]
        )

    sf_ratio = _util.median(ratios("sf", "steady_frames_per_s"))
    sb3_ratio = _util.median(ratios("sb3", "steps_per_s"))
    summary = {
        "best_config": {"actors": best["actors"], "num_envs": best["num_envs"]},
        "project_best_steps_per_s": _util.median([e["project"]["steps_per_s"] for e in rounds]),
        "sf_frames_per_s": _util.median(
            [e["sf"]["steady_frames_per_s"] for e in rounds if e.get("sf", {}).get("ok")]
        ),
        "sb3_steps_per_s": _util.median(
            [e["sb3"]["steps_per_s"] for e in rounds if e.get("sb3", {}).get("ok")]
        ),
        "project_vs_sf": sf_ratio,
        "project_vs_sb3": sb3_ratio,
        "grad_steps_per_1k": {
            "project_best": project_grad_steps_per_1k(best["actors"], best["num_envs"], {}, {}),
            "project_at_sf_settings": like_grad("sf"),
            "sf": SF_GRAD_STEPS_PER_1K,
            "project_at_sb3_settings": like_grad("sb3"),
            "sb3": SB3_GRAD_STEPS_PER_1K,
        },
        "project_at_sf_settings_steps_per_s": like_rate("sf"),
        "project_at_sb3_settings_steps_per_s": like_rate("sb3"),
        "like_for_like_vs_sf": _util.median(
            ratios("sf", "steady_frames_per_s", "project_at_sf_settings")
        ),
        "like_for_like_vs_sb3": _util.median(
            ratios("sb3", "steps_per_s", "project_at_sb3_settings")
        ),
        "sf_reference_not_measured_here": 7800.0,
        "sb3_reference_not_measured_here": 4300.0,
    }
    print()
    _util.print_table(
        ["actors", "envs/actor", "steps/s", "cpu cores busy", "first update after"],
        [
            [
                g["actors"],
                g["num_envs"],
                _util.fmt_rate(g["steps_per_s"]),
                f"{g['cpu_cores_busy']:.2f}",
                f"{g['launch_to_first_update_s']:.1f}s",
            ]
            for g in grid
        ],
    )
    print(
        f"\nproject best ({best['actors']}x{best['num_envs']}): "
        f"{_util.fmt_rate(summary['project_best_steps_per_s'])} steps/s; SF "
        f"{_util.fmt_rate(summary['sf_frames_per_s'])} frames/s; SB3 "
        f"{_util.fmt_rate(summary['sb3_steps_per_s'])} steps/s"
    )
    g = summary["grad_steps_per_1k"]
    print("\nlike for like (the same learner work per env step, medians over the rounds):")
    _util.print_table(
        ["system", "settings", "grad steps / 1k env steps", "env steps/s"],
        [
            [
                "zmq_rl",
                f"best grid {best['actors']}x{best['num_envs']}, 1 epoch",
                f"{g['project_best']:.2f}",
                _util.fmt_rate(summary["project_best_steps_per_s"]),
            ],
            [
                "zmq_rl",
                "SF's",
                f"{g['project_at_sf_settings']:.2f}",
                _util.fmt_rate(summary["project_at_sf_settings_steps_per_s"]),
            ],
            [
                "Sample Factory",
                "its example",
                f"{g['sf']:.2f}",
                _util.fmt_rate(summary["sf_frames_per_s"]),
            ],
            [
                "zmq_rl",
                "SB3 zoo's",
                f"{g['project_at_sb3_settings']:.2f}",
                _util.fmt_rate(summary["project_at_sb3_settings_steps_per_s"]),
            ],
            ["SB3", "zoo", f"{g['sb3']:.2f}", _util.fmt_rate(summary["sb3_steps_per_s"])],
        ],
    )
    print(
        f"like for like: {summary['like_for_like_vs_sf']:.2f}x SF, "
        f"{summary['like_for_like_vs_sb3']:.2f}x SB3"
    )
    if sf_python:
        ok = sf_ratio >= 1.5
        print(f"target: project >= 1.5 x SF: {sf_ratio:.2f}x -> {'MET' if ok else 'MISSED'}")
    else:
        print(
            "Sample Factory not importable: compare with the reference 7,800 frames/s "
            "(not measured here)"
        )
    _util.write_result(
        "throughput",
        args,
        {
            "config": {
                "throughput": THROUGHPUT,
                "actors": args.actors,
                "envs": args.envs,
                "warmup": args.warmup,
                "window": args.window,
                "rounds": args.rounds,
                "sb3_steps": args.sb3_steps,
                "sf_seconds": args.sf_seconds,
                "sf_frames": args.sf_frames,
                "sf_flags": SF_FLAGS,
            },
            "grid": grid,
            "rounds": rounds,
            "baselines": baselines,
            "summary": summary,
            "target": {
                "project_vs_sf_min": 1.5,
                "met": bool(sf_python) and sf_ratio >= 1.5 if sf_python else None,
            },
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
