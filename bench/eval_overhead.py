"""What periodic evaluation costs training: LunarLander-v3 steps/s with evaluation
off, in the learner's loop, and in the background process (the default).

Each variant is one learner in this process and ``--actors`` actor processes
(``GymActor``, multiprocessing ``spawn``) with ``--envs`` envs each, the learner
defaults of ``zmq-rl run`` (32-step rollouts, 20 PPO epochs), ``--steps`` env steps,
and, where on, a ``--episodes``-episode deterministic evaluation every
``--eval-every`` updates. The figure is training steps/s: env steps consumed from
the first update to the last, over that wall time (the final evaluation, which
every variant runs after its last update, is outside it). ``--rounds`` rounds run
the three variants in rotating order, and the ratios are taken per round (the
machine may be shared).

    python bench/eval_overhead.py
    python bench/eval_overhead.py --smoke
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _util  # noqa: E402

VARIANTS = ("off", "loop", "background")


def _actor_main(port: int, num_envs: int) -> None:
    logging.basicConfig(level=logging.WARNING)
    from zmq_rl.actor.gym_actor import GymActor
    from zmq_rl.config import ActorConfig

    GymActor(ActorConfig(learner=f"127.0.0.1:{port}", num_envs=num_envs)).run()


def run_variant(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    """One run of ``variant`` (off / loop / background); its training steps/s."""
    from zmq_rl.config import LearnerConfig, PolicyConfig, PPOConfig
    from zmq_rl.learner.loop import Learner

    port = _util.free_port_block(3)
    cfg = LearnerConfig(
        env_id=args.env,
        num_actors=args.actors,
        num_envs=args.envs,
        total_env_steps=args.steps,
        eval_every=0 if variant == "off" else args.eval_every,
        eval_episodes=args.episodes,
        eval_in_background=variant == "background",
        checkpoint_every=0,
        run_dir="",
        port=port,
        seed=args.seed,
    )
    rows: list[tuple[float, int]] = []

    def on_update(row: dict[str, Any]) -> None:
        rows.append((time.monotonic(), int(row["env_steps"])))

    learner = Learner(cfg, PPOConfig(), PolicyConfig(), on_update=on_update)
    report = _util.run_with_actor_processes(learner, _actor_main, (port, args.envs), args.actors)
    (t0, s0), (t1, s1) = rows[0], rows[-1]
    periodic = [e for e in report.evaluations if e["updates"] != report.updates_completed]
    return {
        "variant": variant,
        "steps_per_s": (s1 - s0) / max(t1 - t0, 1e-9),
        "training_seconds": t1 - t0,
        "env_steps": report.env_steps_consumed,
        "periodic_evaluations": len(periodic),
        "last_periodic_eval_update": periodic[-1]["updates"] if periodic else None,
        "final_eval": report.evaluations[-1]["mean_return"] if report.evaluations else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _util.add_common_flags(parser)
    parser.add_argument("--env", default="LunarLander-v3")
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--envs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=30_000)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps, args.episodes, args.rounds, args.eval_every = 3_000, 2, 1, 2
    logging.basicConfig(level=logging.WARNING)
    rounds = []
    for r in range(args.rounds):
        order = VARIANTS[r % 3 :] + VARIANTS[: r % 3]
        results = {v: run_variant(v, args) for v in order}
        rounds.append(results)
        off = results["off"]["steps_per_s"]
        _util.print_table(
            ["round", "variant", "steps/s", "vs off", "periodic evals", "train s"],
            [
                [
                    r,
                    v,
                    _util.fmt_rate(results[v]["steps_per_s"]),
                    f"{results[v]['steps_per_s'] / off:.2f}",
                    results[v]["periodic_evaluations"],
                    f"{results[v]['training_seconds']:.1f}",
                ]
                for v in VARIANTS
            ],
        )
    ratios = {
        v: statistics.median(r[v]["steps_per_s"] / r["off"]["steps_per_s"] for r in rounds)
        for v in VARIANTS
    }
    print(
        "median ratio to evaluation off: "
        + ", ".join(f"{v} {ratios[v]:.2f}" for v in VARIANTS if v != "off")
    )
    config = {k: v for k, v in vars(args).items() if k not in ("out",)}
    _util.write_result(
        "eval_overhead",
        args,
        {"config": config, "rounds": rounds, "median_ratio_to_off": ratios},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
