"""The cost of one PPO update with closed-form gradients against autograd, in one
process, alternating (``PPOConfig.analytic_gradients`` on and off), on one torch thread.

A ``Trainer.update`` (eager steps: no CUDA graphs) of a LunarLander-sized rollout
(8-dim observations, 256 steps x 16 slots = 4,096 rows, 4 epochs, the 64 x 64 MLP)
with a Discrete(4) head (the LunarLander-v3 preset) and a 2-dim Box head
(LunarLanderContinuous-v3), per minibatch size: the median milliseconds per update and
per minibatch step, and the ratio.

    python bench/update_cost.py
    python bench/update_cost.py --minibatches 64 --rounds 5
    python bench/update_cost.py --smoke

With ``--base REV`` or ``--base-tree DIR`` it compares revisions instead: the
closed-form update of this tree against that of the earlier one, each round a fresh
process per tree (the tree first on ``sys.path``, the order alternating by round), the
median of each process's timed updates, then the median over rounds:

    python bench/update_cost.py --actions discrete --minibatches 64 --rounds 5 --base-tree DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

import _util  # noqa: E402

T, B, OBS_DIM = 256, 16, 8


def make_trainer(action: str, minibatch: int, analytic: bool, device: str = "cpu") -> Any:
    """A trainer of the preset's shape (Discrete(4) or a 2-dim Box head) on ``device``,
    eager steps (no CUDA graphs)."""
    import numpy as np
    from gymnasium import spaces

    from zmq_rl.config import LearnerConfig, PolicyConfig, PPOConfig
    from zmq_rl.rl.trainer import Trainer

    cfg = LearnerConfig(
        device=device, num_actors=1, num_envs=B, num_steps=T, torch_threads=1, seed=0
    )
    ppo = PPOConfig(
        num_epochs=4, minibatch_size=minibatch, analytic_gradients=analytic, cuda_graphs=False
    )
    act_space = spaces.Discrete(4) if action == "discrete" else spaces.Box(-1, 1, (2,), np.float32)
    obs_space = spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32)
    return Trainer(cfg, ppo, PolicyConfig(hidden_sizes=(64, 64)), obs_space, act_space)


def random_rollout(action: str, rng: Any) -> Any:
    """A rollout of random rows (the update's cost does not depend on their values)."""
    import numpy as np

    from zmq_rl.rl.rollout import Rollout

    if action == "discrete":
        actions = rng.integers(0, 4, (T, B)).astype(np.int64)
        log_probs = np.full((T, B), np.log(0.25), np.float32)
    else:
        actions = rng.standard_normal((T, B, 2)).astype(np.float32)
        log_probs = rng.standard_normal((T, B)).astype(np.float32) - 2.0
    return Rollout(
        slots=[(b, 0) for b in range(B)],
        obs=rng.standard_normal((T, B, OBS_DIM)).astype(np.float32),
        actions=actions,
        rewards=rng.standard_normal((T, B)).astype(np.float32),
        terminated=rng.random((T, B)) < 0.02,
        truncated=np.zeros((T, B), bool),
        values=rng.standard_normal((T, B)).astype(np.float32),
        log_probs=log_probs,
        versions=np.zeros((T, B), np.int64),
        bootstrap_obs=rng.standard_normal((B, OBS_DIM)).astype(np.float32),
        final_t=np.zeros(0, np.int64),
        final_b=np.zeros(0, np.int64),
        final_obs=np.zeros((0, OBS_DIM), np.float32),
    )


def measure(
    action: str, minibatch: int, rounds: int, device: str = "cpu", warmup: int = 2
) -> dict[str, Any]:
    """Median seconds per update, analytic and autograd, alternating update by update."""
    import numpy as np
    import torch

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    trainers = {flag: make_trainer(action, minibatch, flag, device) for flag in (True, False)}
    if trainers[True].ppo.flat is None:
        raise SystemExit(f"the closed form does not run on {device}: nothing to compare")
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    times: dict[bool, list[float]] = {True: [], False: []}
    for i in range(warmup + rounds):
        for flag, trainer in trainers.items():
            rollout = random_rollout(action, rng)
            sync()
            start = time.perf_counter()
            trainer.update(rollout, 0.0)
            sync()
            if i >= warmup:
                times[flag].append(time.perf_counter() - start)
    steps = 4 * -(-T * B // minibatch)
    fast, slow = (statistics.median(times[flag]) for flag in (True, False))
    return {
        "action": action, "minibatch": minibatch, "device": device, "steps_per_update": steps,
        "analytic_ms": 1e3 * fast, "autograd_ms": 1e3 * slow,
        "analytic_step_ms": 1e3 * fast / steps, "autograd_step_ms": 1e3 * slow / steps,
        "ratio": slow / fast,
    }  # fmt: skip


UPDATES_PER_PROCESS = 5
"""Timed updates per process and round when comparing revisions (after 2 untimed)."""


def closed_form_ms(tree: Path, action: str, minibatch: int) -> float:
    """Median milliseconds of :data:`UPDATES_PER_PROCESS` closed-form updates, measured
    in a fresh process that imports ``tree``'s zmq_rl (and checks that it did)."""
    code = (
        "import sys, json; "
        f"sys.path.insert(0, {str(BENCH)!r}); import update_cost as u; "
        f"sys.path.insert(0, {str(tree)!r}); "
        f"print(json.dumps(u.measure_tree({str(tree)!r}, {action!r}, {minibatch})))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise SystemExit(f"timing {tree} failed:\n{done.stderr[-2000:]}")
    return float(json.loads(done.stdout.strip().splitlines()[-1]))


def measure_tree(tree: str, action: str, minibatch: int) -> float:
    """In a child of :func:`closed_form_ms`: the median ms of its timed updates."""
    import numpy as np
    import torch

    import zmq_rl

    if not Path(zmq_rl.__file__).resolve().is_relative_to(Path(tree).resolve()):
        raise SystemExit(f"imported {zmq_rl.__file__}, not the code in {tree}")
    torch.set_num_threads(1)
    trainer = make_trainer(action, minibatch, True)
    rng = np.random.default_rng(0)
    times = []
    for i in range(2 + UPDATES_PER_PROCESS):
        rollout = random_rollout(action, rng)
        start = time.perf_counter()
        trainer.update(rollout, 0.0)
        if i >= 2:
            times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def compare_revisions(args: argparse.Namespace) -> int:
    """This tree's closed-form update against the base revision's, per cell."""
    rows = []
    with _util.revision_trees(args.base, args.base_tree) as trees:
        for action in args.actions:
            for minibatch in args.minibatches:
                ms: dict[str, list[float]] = {name: [] for name in trees}
                for r in range(args.rounds):
                    for name in _util.round_order(list(trees), r):
                        ms[name].append(closed_form_ms(trees[name], action, minibatch))
                base = next(name for name in trees if name != "this tree")
                this, before = (statistics.median(ms[n]) for n in ("this tree", base))
                rows.append({
                    "action": action, "minibatch": minibatch, "base": base,
                    "base_ms": before, "this_ms": this, "ratio": before / this,
                    "rounds_ms": ms,
                })  # fmt: skip
    _util.print_table(
        ["head", "minibatch", "base ms", "this tree ms", "speed-up"],
        [[r["action"], r["minibatch"], f"{r['base_ms']:.1f}", f"{r['this_ms']:.1f}",
          f"{r['ratio']:.2f}x"] for r in rows],
    )  # fmt: skip
    data = {"rows": rows, "rounds": args.rounds, "rollout_rows": T * B, "mode": "revisions"}
    _util.write_result("update_cost", args, data)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _util.add_common_flags(parser)
    _util.add_base_flags(parser)
    parser.add_argument("--minibatches", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--actions", nargs="+", default=["discrete", "box"])
    parser.add_argument("--rounds", type=int, default=7, help="timed updates per cell and mode")
    parser.add_argument(
        "--device",
        default="cpu",
        help="cpu (the closed form is a CPU path; a GPU learner's steps are CUDA graphs)",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.minibatches, args.rounds = [1024], 1
    if args.base or args.base_tree:
        return compare_revisions(args)
    rows = [
        measure(action, minibatch, args.rounds, args.device)
        for action in args.actions
        for minibatch in args.minibatches
    ]
    table = [
        [
            r["action"], r["minibatch"], f"{r['autograd_ms']:.1f}", f"{r['analytic_ms']:.1f}",
            f"{r['autograd_step_ms']:.3f}", f"{r['analytic_step_ms']:.3f}", f"{r['ratio']:.2f}x",
        ]
        for r in rows
    ]  # fmt: skip
    _util.print_table(
        ["head", "minibatch", "autograd ms", "closed form ms", "autograd ms/step",
         "closed form ms/step", "speed-up"],
        table,
    )  # fmt: skip
    data = {"rows": rows, "rounds": args.rounds, "rollout_rows": T * B}
    _util.write_result("update_cost", args, data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
