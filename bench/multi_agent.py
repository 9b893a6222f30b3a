"""Multi-agent learning: a cooperative PettingZoo env with one shared policy, over seeds.

    python bench/multi_agent.py --env pettingzoo.sisl.pursuit_v5 --seeds 0 1 2 \
        --total-env-steps 400000 --eval-every 40 --plot

Each seed is one ``zmq-rl run --env ENV --actors A --seed S --total-env-steps N
--eval-every E --target-return inf --no-eval-deterministic`` (a learner and A actor
processes over tcp), one after the other. Env steps are *agent* steps (every live
agent's step is one row; docs/multi_agent.md). The curve is every evaluation of the
run (episodes scored as the mean return of their agents) against agent steps, read
from ``report.json``. Evaluations sample the policy's actions (seeded): a
deterministic pursuer gets stuck against walls and scores like a random one
(``--deterministic`` to see it). The baseline is the same score of uniformly random
actions on the same env (``--random-episodes`` episodes, seeded). Results go to
``bench/results/multi_agent-<env>.json`` and a markdown row is printed; ``--plot``
draws the curves with the baseline to ``docs/img/multi_agent-<env>.png``; the run
directories are ``runs/multi_agent/<env>-seedS``. With ``--out PATH`` all three go
outside the checkout: the results to PATH, the runs to ``PATH-runs/`` and the
picture beside PATH. ``--port N``: the runs' learners bind ports from N on.
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

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _util import (  # noqa: E402
    add_common_flags,
    figure_path,
    free_port_block,
    machine_info,
    runs_root,
)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from zmq_rl.envs import build_env  # noqa: E402
from zmq_rl.envs.multi_agent import agent_spaces  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def random_score(env_id: str, episodes: int, seed: int) -> tuple[float, float]:
    """Mean and std over ``episodes`` of the mean agent return under uniformly random
    actions (each agent's action space sampled, seeded)."""
    scores = []
    for episode in range(episodes):
        env = build_env(env_id)
        _, space, agents = agent_spaces(env, env_id)
        space.seed(seed + episode)
        returns = dict.fromkeys(agents, 0.0)
        env.reset(seed=seed + episode)
        while env.agents:
            _, rewards, _, _, _ = env.step({a: space.sample() for a in env.agents})
            for agent, reward in rewards.items():
                returns[agent] += float(reward)
        env.close()
        scores.append(statistics.fmean(returns.values()))
    return statistics.fmean(scores), statistics.pstdev(scores)


def run_seed(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """One training run; its evaluations and wall time."""
    run_dir = runs_root("multi_agent", args) / f"{args.env.rsplit('.', 1)[-1]}-seed{seed}"
    cmd = [sys.executable, "-m", "zmq_rl", "run", "--env", args.env]
    cmd += ["--actors", str(args.actors), "--seed", str(seed)]
    cmd += ["--total-env-steps", str(args.total_env_steps), "--eval-every", str(args.eval_every)]
    cmd += ["--eval-episodes", str(args.eval_episodes), "--target-return", "inf"]
    cmd += ["--eval-deterministic" if args.deterministic else "--no-eval-deterministic"]
    cmd += ["--port", str(free_port_block()), "--run-dir", str(run_dir), "--no-plot"]
    if run_dir.exists():
        shutil.rmtree(run_dir)
    started = time.monotonic()
    subprocess.run(cmd, cwd=ROOT, check=True)
    wall = time.monotonic() - started
    report = json.loads((run_dir / "report.json").read_text())
    curve = [(int(e["env_steps"]), float(e["mean_return"])) for e in report["evaluations"]]
    return {"seed": seed, "wall_seconds": wall, "curve": curve, "command": " ".join(cmd)}


def plot(
    path: Path, env: str, runs: list[dict[str, Any]], random_mean: float, sampled: bool
) -> None:
    """The seeds' evaluation curves and the random baseline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for run in runs:
        steps, scores = zip(*run["curve"], strict=True)
        ax.plot(steps, scores, marker=".", label=f"seed {run['seed']}")
    ax.axhline(random_mean, color="grey", linestyle="--", label="uniform random")
    ax.set_xlabel("agent steps")
    how = "sampled actions" if sampled else "deterministic"
    ax.set_ylabel(f"mean agent return (eval, {how})")
    ax.set_title(f"{env}, one shared policy")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_flags(parser, smoke=False)
    parser.add_argument("--env", default="pettingzoo.sisl.pursuit_v5")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--total-env-steps", type=int, default=600_000)
    parser.add_argument("--eval-every", type=int, default=40)
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--random-episodes", type=int, default=20)
    parser.add_argument(
        "--deterministic",
        action="store_true",
        help="evaluate with the policy's mode (pursuit's pursuers get stuck with it: "
        "the default samples, --no-eval-deterministic)",
    )
    parser.add_argument("--plot", action="store_true")
    args = parser.parse_args(argv)
    name = args.env.rsplit(".", 1)[-1]
    random_mean, random_std = random_score(args.env, args.random_episodes, 10_000)
    runs = [run_seed(args, seed) for seed in args.seeds]
    finals = [run["curve"][-1][1] for run in runs]
    firsts = [run["curve"][0][1] for run in runs]
    result = {
        "env": args.env,
        "args": vars(args),
        "random": {"mean": random_mean, "std": random_std, "episodes": args.random_episodes},
        "runs": runs,
        "final_mean": float(np.mean(finals)),
        "final_std": float(np.std(finals)),
        "machine": machine_info(),
    }
    out = Path(args.out) if args.out else RESULTS / f"multi_agent-{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    if args.plot:
        path = figure_path(f"multi_agent-{name}", args)
        plot(path, args.env, runs, random_mean, not args.deterministic)
    print("| env | seeds | agent steps | random | first eval | final eval | wall per run |")
    print("|---|---|---|---|---|---|---|")
    print(
        f"| {name} | {len(runs)} | {args.total_env_steps:,} | {random_mean:.1f} ± {random_std:.1f} "
        f"| {np.mean(firsts):.1f} | {np.mean(finals):.1f} ± {np.std(finals):.1f} "
        f"({', '.join(f'{f:.1f}' for f in finals)}) "
        f"| {statistics.fmean(r['wall_seconds'] for r in runs):.0f} s |"
    )


if __name__ == "__main__":
    main()
