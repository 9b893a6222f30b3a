"""Wall-clock to a score on harder envs, launch included: zmq-rl run vs SB3 PPO (zoo) vs
Sample Factory APPO (its gym example).

For every (env, seed) each side is one fresh process tree started with ``Popen`` in a
session of its own (killed as a group at the end), and the figure is the wall time from
``Popen`` to the moment its first evaluation with mean return >= the target is printed
(the parent timestamps each stdout line as it arrives, ``PYTHONUNBUFFERED=1``; see
``bench/time_to_solve.py``). Targets: LunarLander-v3 mean >= 200, Acrobot-v1 >= -100.
A run that has not reached the target by the wall cap (``--cap``, seconds per run) or
by the env-step budget is reported *unsolved* and counts as infinitely slow in the
median. The seeds alternate the order of the sides.

The evaluation protocol is the same for all sides: 20 deterministic
episodes (argmax action) on that many lockstep envs with batched forwards, every
``cadence`` env steps of training: the project preset's ``eval_every`` x its rollout
size (Acrobot-v1 10 x 4096 = 40960, LunarLander-v3 16 x 4096 = 65536), the same budget
(1e6 env steps, zoo's ``n_timesteps``) for all.

* zmq-rl: ``zmq-rl run --env E --seed S --target-return T --total-env-steps 1e6``, the
  env's shipped preset (``zmq_rl/presets/E.toml``) otherwise, whose evaluation runs in
  the background on a snapshot (``eval_in_background``); the figure is the first
  progress line showing ``eval >= T``.
* SB3: ``bench/sb3_ppo.py solve --env E``: zoo ``hyperparams/ppo.yml`` (LunarLander-v2's
  entry for v3; Acrobot-v1's with VecNormalize), SB3's ``EvalCallback`` every cadence.
* Sample Factory 2.1.1: ``bench/sf_score.py score --env E``: the gym example's settings,
  plus a watcher that evaluates its newest checkpoint at each cadence crossing (SF has
  no periodic deterministic evaluation; see that file).

SB3 and SF run in ``.venv-bench`` (or ``$ZMQ_RL_BENCH_PYTHON``), which has gymnasium
0.29: LunarLander-v3 does not exist there, so those sides run LunarLander-v2 (the same
dynamics but for v3's fixes of the wind and the leg contacts), and it needs Box2D; a
side whose interpreter cannot make the env is reported as not measured, with why.

    python bench/time_to_score.py                               # both envs, seeds 0-2, all sides
    python bench/time_to_score.py --envs Acrobot-v1 --seeds 0 --cap 600
    python bench/time_to_score.py --smoke                       # Acrobot, target -400, zmq-rl only
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _util  # noqa: E402
from time_to_solve import _timed_lines, _zmq_solved, zmq_rl_command  # noqa: E402

ENVS: dict[str, dict[str, Any]] = {
    "LunarLander-v3": {"target": 200.0, "cadence": 16 * 4096, "zmq_eval_every": 16},
    "Acrobot-v1": {"target": -100.0, "cadence": 10 * 4096, "zmq_eval_every": 10},
}
"""Target mean return and evaluation cadence (env steps; = the preset's eval_every x
2 actors x 8 envs x 256 steps)."""
ROLLOUT = 4096  # the presets' env steps per update
BUDGET = 1_000_000
SIDES = ("zmq", "sb3", "sf")
SIDE_NAMES = {"zmq": "zmq-rl run", "sb3": "SB3 PPO zoo", "sf": "Sample Factory APPO"}


def _first(lines: list[tuple[float, str]], prefix: str) -> float:
    return next((at for at, line in lines if line.startswith(prefix)), math.inf)


def _unsolved(solve_s: float, exit_s: float, cap: float, code: int | None) -> str | None:
    """None if solved, else "cap" (still training at the wall cap) or why it ended."""
    if math.isfinite(solve_s):
        return None
    if exit_s >= cap - 1.0:
        return "cap"
    return f"ended after {exit_s:.0f}s with exit code {code} (budget spent or failed)"


def run_zmq(env: str, seed: int, target: float, cadence: int, cap: float) -> dict[str, Any]:
    work = tempfile.mkdtemp(prefix="tsc-zmq-")
    run_dir = os.path.join(work, "run")
    cmd = [
        *zmq_rl_command(),
        "run",
        "--env",
        env,
        "--seed",
        str(seed),
        "--port",
        str(_util.free_port_block(3)),
        "--run-dir",
        run_dir,
        "--no-plot",
        "--log-level",
        "warning",
        "--target-return",
        str(target),
        "--total-env-steps",
        str(BUDGET),
        "--eval-every",
        str(max(1, cadence // ROLLOUT)),
    ]
    try:
        solved = _zmq_solved(target)
        lines, exit_s, code = _timed_lines(cmd, cap, work, solved, stop_after_solve=True)
        solve_s = next((at for at, line in lines if solved(line)), math.inf)
        report: dict[str, Any] = {}
        path = Path(run_dir) / "report.json"
        if path.is_file():
            report = json.loads(path.read_text())
        evaluations = report.get("evaluations", [])
        hits = [e for e in evaluations if e["mean_return"] >= target]
        return {
            "seed": seed,
            "solved": math.isfinite(solve_s),
            "solve_s": solve_s,
            "start_s": _first(lines, "update "),
            "unsolved": _unsolved(solve_s, exit_s, cap, code),
            "exit_code": code,
            "env_steps_at_solve": hits[0]["env_steps"] if hits else None,
            "evaluations": [[e["env_steps"], round(e["mean_return"], 1)] for e in evaluations],
            "command": "zmq-rl " + " ".join(cmd[len(zmq_rl_command()) :]),
            "tail": [line for _, line in lines[-6:]] if not math.isfinite(solve_s) else [],
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_other(
    side: str, python: str, env: str, seed: int, target: float, cadence: int, cap: float
) -> dict[str, Any]:
    """SB3 (``sb3_ppo.py solve``) or SF (``sf_score.py score``): ``SOLVED``/``EVAL`` lines."""
    script = {"sb3": "sb3_ppo.py", "sf": "sf_score.py"}[side]
    mode = {"sb3": "solve", "sf": "score"}[side]
    work = tempfile.mkdtemp(prefix=f"tsc-{side}-")
    cmd = [
        python,
        str(Path(__file__).with_name(script)),
        mode,
        "--env",
        env,
        "--seed",
        str(seed),
        "--target",
        str(target),
        "--budget",
        str(BUDGET),
        "--eval-every-steps",
        str(cadence),
    ]
    try:
        lines, exit_s, code = _timed_lines(
            cmd, cap, work, lambda line: line.startswith("SOLVED"), stop_after_solve=True
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    solve_s = _first(lines, "SOLVED")
    evals = [line.split() for _, line in lines if line.startswith(("EVAL ", "SOLVED "))]
    result = next((json.loads(line[7:]) for _, line in lines if line.startswith("RESULT ")), {})
    steps = next((int(e[3]) for e in evals if e[0] == "SOLVED"), None)
    return {
        "seed": seed,
        "solved": math.isfinite(solve_s),
        "solve_s": solve_s,
        "start_s": _first(lines, "START"),
        "unsolved": _unsolved(solve_s, exit_s, cap, code),
        "exit_code": code,
        "env_steps_at_solve": steps,
        "evaluations": [[int(e[3]), float(e[1])] for e in evals],
        # Sample Factory's lines also carry its training episodes' mean return
        "train_returns": [float(e[-1].rstrip(")")) for e in evals if "episodes" in e],
        "eval_seconds": result.get("eval_seconds"),
        "command": " ".join([os.path.basename(python), *cmd[1:]]),
        "tail": [line for _, line in lines[-6:]] if not math.isfinite(solve_s) else [],
    }


def side_order(sides: list[str], i: int) -> list[str]:
    """The order of ``sides`` for the ``i``-th seed: rotated by ``i``, so that with n
    sides each goes first once in n seeds (two sides alternate)."""
    return sides[i % len(sides) :] + sides[: i % len(sides)]


def probe_env(python: str, env: str) -> str | None:
    """None if ``python`` can make ``env`` (as sb3_ppo.gym_id maps it), else why not."""
    bench = str(Path(__file__).resolve().parent)
    code = (
        f"import sys; sys.path.insert(0, {bench!r}); from sb3_ppo import gym_id; "
        f"import gymnasium as gym; e = gym_id({env!r}); gym.make(e).close(); print(e)"
    )
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"probe failed: {exc}"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return f"{python} cannot make {env}: {last}"
    return None


def compare(ours: list[dict], theirs: list[dict], cap: float) -> dict[str, Any]:
    """Our median over theirs. A run unsolved at the cap counts as the cap, which makes
    the ratio an upper bound (``bound``: ours is at most this fraction); a run that ended
    unsolved before the cap (budget spent, failure) leaves the ratio undefined."""

    def times(runs: list[dict]) -> list[float] | None:
        out = []
        for r in runs:
            if r["solved"]:
                out.append(r["solve_s"])
            elif r["unsolved"] == "cap":
                out.append(math.inf)
            else:
                return None
        return out

    mine, other = times(ours), times(theirs)
    if not mine or not other:
        return {"ratio": None, "bound": False, "why": "a run ended unsolved before the cap"}
    a, b = _util.median(mine), _util.median(other)
    if not math.isfinite(a):
        return {"ratio": None, "bound": False, "why": "zmq-rl unsolved at the cap"}
    if math.isfinite(b):
        return {"ratio": a / b, "bound": False, "why": ""}
    capped = [cap if not math.isfinite(t) else t for t in other]
    return {"ratio": a / _util.median(capped), "bound": True, "why": "theirs unsolved at the cap"}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    times = [r["solve_s"] for r in runs]
    return {
        "median_s": _util.median(times) if runs else math.nan,
        "solved": sum(r["solved"] for r in runs),
        "runs": len(runs),
        "median_steps": _util.median(
            [r["env_steps_at_solve"] for r in runs if r["env_steps_at_solve"]]
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _util.add_common_flags(parser)
    parser.add_argument("--envs", default="LunarLander-v3,Acrobot-v1")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--cap", type=float, default=1800.0, help="wall cap per run, seconds")
    parser.add_argument(
        "--sides", default=None, help="any of zmq,sb3,sf (default all; --smoke: zmq)"
    )
    parser.add_argument("--target", type=float, default=None, help="override every env's")
    parser.add_argument(
        "--cadence", type=int, default=None, help="override every env's (env steps)"
    )
    args = parser.parse_args(argv)
    if args.smoke:  # a score a random policy misses and PPO reaches in a few updates
        args.envs, args.seeds, args.cap = "Acrobot-v1", "0", 100.0
        args.sides = "zmq" if args.sides is None else args.sides
        args.target = -400.0 if args.target is None else args.target
        args.cadence = 2 * ROLLOUT if args.cadence is None else args.cadence
    envs = args.envs.split(",")
    for env in envs:
        if env not in ENVS:
            parser.error(f"--envs: {env!r} is not one of {sorted(ENVS)}")
    sides = [s for s in (args.sides or ",".join(SIDES)).split(",") if s]
    for side in sides:
        if side not in SIDES:
            parser.error(f"--sides: {side!r} is not one of {SIDES}")
    seeds = [int(s) for s in args.seeds.split(",")]

    pythons: dict[str, str | None] = {}
    skipped: dict[str, dict[str, str]] = {}  # env -> side -> why
    for side, module in (("sb3", "stable_baselines3"), ("sf", "sample_factory")):
        if side in sides:
            pythons[side] = _util.bench_python(module, "gymnasium")
    for env in envs:
        skipped[env] = {}
        for side in sides:
            if side == "zmq":
                continue
            if pythons[side] is None:
                why = f"{SIDE_NAMES[side]} not importable here or in .venv-bench"
            else:
                why = probe_env(pythons[side], env) or ""
            if why:
                skipped[env][side] = why
                print(f"{env}: {SIDE_NAMES[side]} not measured: {why}", flush=True)

    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for env in envs:
        target = ENVS[env]["target"] if args.target is None else args.target
        cadence = ENVS[env]["cadence"] if args.cadence is None else args.cadence
        runs[env] = {side: [] for side in sides if side not in skipped[env]}
        active = list(runs[env])
        for i, seed in enumerate(seeds):
            for side in side_order(active, i) if active else []:
                if side == "zmq":
                    res = run_zmq(env, seed, target, cadence, args.cap)
                else:
                    python = pythons[side]
                    assert python is not None
                    res = run_other(side, python, env, seed, target, cadence, args.cap)
                runs[env][side].append(res)
                status = (
                    f"solved at {res['solve_s']:.1f}s ({res['env_steps_at_solve']} steps)"
                    if res["solved"]
                    else f"UNSOLVED ({res['unsolved']}; cap {args.cap:.0f}s)"
                )
                print(
                    f"{env} seed {seed} {SIDE_NAMES[side]}: {status}, started learning "
                    f"{res['start_s']:.1f}s, evals {res['evaluations'][-4:]}",
                    flush=True,
                )

    summary: dict[str, Any] = {}
    print()
    rows = []
    for env in envs:
        summary[env] = {side: summarise(r) for side, r in runs[env].items()}
        for other in ("sb3", "sf"):
            if other in summary[env] and "zmq" in summary[env]:
                summary[env][f"zmq_vs_{other}"] = compare(
                    runs[env]["zmq"], runs[env][other], args.cap
                )
        for side, s in summary[env].items():
            if side not in SIDES:
                continue
            rows.append(
                [
                    env,
                    SIDE_NAMES[side],
                    f"{s['median_s']:.1f}" if math.isfinite(s["median_s"]) else "unsolved",
                    f"{s['solved']}/{s['runs']}",
                    f"{s['median_steps']:.0f}" if math.isfinite(s["median_steps"]) else "-",
                ]
            )
        for side in skipped[env]:
            rows.append([env, SIDE_NAMES[side], "not measured", "-", "-"])
    _util.print_table(["env", "side", "median s to score", "scored", "median steps"], rows)
    met: dict[str, Any] = {}
    for env in envs:
        for other in ("sb3", "sf"):
            cmp = summary[env].get(f"zmq_vs_{other}")
            key = f"{env} vs {other}"
            if cmp is None or cmp["ratio"] is None:
                met[key] = None
                if cmp is not None:
                    print(f"target {env} vs {SIDE_NAMES[other]}: not judged: {cmp['why']}")
                continue
            met[key] = cmp["ratio"] <= 0.5
            print(
                f"target {env}: zmq-rl <= 0.5 x {SIDE_NAMES[other]}: "
                f"{'<= ' if cmp['bound'] else ''}{cmp['ratio']:.2f}x -> "
                f"{'MET' if met[key] else 'MISSED'}{' (' + cmp['why'] + ')' if cmp['why'] else ''}"
            )
    _util.write_result(
        "time_to_score",
        args,
        {
            "config": {
                "envs": {
                    env: {
                        "target": ENVS[env]["target"] if args.target is None else args.target,
                        "cadence_env_steps": (
                            ENVS[env]["cadence"] if args.cadence is None else args.cadence
                        ),
                    }
                    for env in envs
                },
                "seeds": seeds,
                "cap_s": args.cap,
                "budget_env_steps": BUDGET,
                "episodes": 20,
                "sides": sides,
                "pythons": pythons,
            },
            "not_measured": skipped,
            "runs": runs,
            "summary": summary,
            "target": {"zmq_rl_vs_each_max": 0.5, "met": met},
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
