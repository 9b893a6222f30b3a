"""Several policies against one shared policy: throughput and what each learns.

    python bench/policies.py --rounds 3

For each case, ``--rounds`` interleaved pairs of the same ``zmq-rl run`` (a learner
and ``--actors`` actor processes over tcp, the same seed, budget and settings), once
with one shared policy and once with ``--policy-map``: env steps per second (the
run's own ``env_steps_consumed / wall_seconds``), the final deterministic evaluation
and each policy's mean return of its last 100 episodes (``report.json``). The pairs
alternate, so drift on a noisy machine hits both sides; the ratio is per round.
``--smoke``: one small pair of the roles case.

Cases: ``roles`` (``tests.agent_envs:coming_and_going`` with ``roles=true``: agents 2
and 3 are paid for another answer to the same observation, so one policy cannot
serve both) mapped ``agent_[01]=red,agent_[23]=blue``; ``connect_four``
(``pettingzoo.classic.connect_four_v3``, each seat its own policy) mapped
``player_0=first,player_1=second``. Results go to ``bench/results/policies.json``
(``--out``); a markdown table is printed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _util import add_common_flags, free_port_block, runs_root, write_result  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

CASES: dict[str, dict[str, Any]] = {
    "roles": {
        "env": ["--env", "tests.agent_envs:coming_and_going", "--env-kwargs", "roles=true"],
        "map": "agent_[01]=red,agent_[23]=blue",
        "args": ["--num-envs", "4", "--num-steps", "32"],
        "steps": 60_000,
    },
    "connect_four": {
        "env": ["--env", "pettingzoo.classic.connect_four_v3"],
        "map": "player_0=first,player_1=second",
        "args": ["--num-envs", "16", "--num-steps", "64", "--minibatch-size", "512"],
        "steps": 100_000,
    },
}


def run_once(case: str, mapped: bool, round_: int, args: argparse.Namespace) -> dict[str, Any]:
    """One ``zmq-rl run``; its throughput, evaluation and per-policy returns."""
    spec = CASES[case]
    smoke = "-smoke" if args.smoke else ""
    run_dir = (
        runs_root("policies", args) / f"{case}-{'map' if mapped else 'shared'}-{round_}{smoke}"
    )
    cmd = [sys.executable, "-m", "zmq_rl", "run", *spec["env"], *spec["args"]]
    cmd += ["--actors", str(args.actors), "--seed", str(args.seed)]
    cmd += ["--total-env-steps", str(args.steps or spec["steps"]), "--eval-every", "0"]
    cmd += ["--eval-episodes", "40", "--target-return", "inf", "--no-plot"]
    cmd += ["--port", str(free_port_block()), "--run-dir", str(run_dir)]
    cmd += ["--policy-map", spec["map"]] if mapped else []
    if run_dir.exists():
        shutil.rmtree(run_dir)
    started = time.monotonic()
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    launch = time.monotonic() - started
    report = json.loads((run_dir / "report.json").read_text())
    return {
        "case": case,
        "policies": "map" if mapped else "shared",
        "round": round_,
        "env_steps": report["env_steps_consumed"],
        "steps_per_s": report["env_steps_consumed"] / report["wall_seconds"],
        "eval": report["evaluations"][-1]["mean_return"],
        "per_policy": {
            pid: p["mean_recent_return"] for pid, p in report.get("policies", {}).items()
        },
        "launch_to_end_s": launch,
        "command": " ".join(cmd),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=0, help="env steps per run (0: the case's)")
    add_common_flags(parser)
    args = parser.parse_args()
    if args.smoke:  # one small pair: checks that it runs
        args.cases, args.rounds, args.steps = ["roles"], 1, 2048
    runs = []
    for case in args.cases:
        for round_ in range(args.rounds):
            order = (False, True) if round_ % 2 == 0 else (True, False)
            runs += [run_once(case, mapped, round_, args) for mapped in order]
    write_result("policies", args, {"args": vars(args), "runs": runs})
    print("| case | policies | env steps/s (median) | map / shared (per round) | final eval | "
          "per-policy return (last 100) |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for case in args.cases:
        mine = [r for r in runs if r["case"] == case]
        for kind in ("shared", "map"):
            rows = [r for r in mine if r["policies"] == kind]
            ratios = ""
            if kind == "map":
                shared = {r["round"]: r["steps_per_s"] for r in mine if r["policies"] == "shared"}
                ratios = ", ".join(f"{r['steps_per_s'] / shared[r['round']]:.2f}" for r in rows)
            per_policy = "; ".join(
                f"{pid} {statistics.fmean(r['per_policy'][pid] for r in rows):.2f}"
                for pid in rows[0]["per_policy"]
            )
            print(
                f"| {case} | {kind} | {statistics.median(r['steps_per_s'] for r in rows):,.0f} "
                f"| {ratios or '-'} | {statistics.fmean(r['eval'] for r in rows):.2f} "
                f"| {per_policy or '-'} |"
            )


if __name__ == "__main__":
    main()
