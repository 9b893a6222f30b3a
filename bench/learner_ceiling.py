"""The learner's ceiling: the most env steps per second a learner can consume, fed at
line rate by replayers of recorded fragments (no envs, no inference), at an env
preset's settings, for 1..N simulated actors.

Every fleet is bounded by this number: actors can only step as fast as the learner
consumes (the staleness valve holds them otherwise). Each row starts a real
``zmq-learner`` process (``--config preset:ENV``, evaluation off, no target) and
``actors`` replayer processes. A replayer is an embedding client of the public API
(:class:`zmq_rl.actor.client.ActorClient`): it registers as an actor with the preset's
``num_envs``, records ``--record-steps`` steps of the real env once with the preset's
untrained policy (actions, log-probs and values as an actor would send them), then
replays them through ``client.step`` as fast as the valve lets it, cycling (every
slot's recording ends truncated, so no episode runs across the seam). The figure is
the learner's consumption rate between the end of the warm-up updates and the last
update (``metrics.jsonl``), with the learner's busy share (update time over wall
time) and the replayers' paused share (the valve's) beside it.

The env-only throughput of the same machine is measured too (random actions, one
process per core, the same env), so the ceiling reads as "how many cores of env
stepping this learner can keep up with".

``--base REV`` (or ``--base-tree DIR``, a checkout without git) measures an earlier
revision's learner in the same run (imported through ``PYTHONPATH`` by the learner
process only; the replayers stay this tree's), alternating base and this tree per
row, and prints the ratio per row.

    python bench/learner_ceiling.py                                 # LunarLander-v3, 1 2 actors
    python bench/learner_ceiling.py --actors 1 2 4 8 14 --device cuda
    python bench/learner_ceiling.py --base c59f877 --actors 1 2     # before / after
    python bench/learner_ceiling.py --smoke
    python bench/learner_ceiling.py -- --num-minibatches 4          # learner flags after --
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _util  # noqa: E402

HOST = "127.0.0.1"
FIELDS = ("obs", "actions", "rewards", "terminated", "truncated", "values", "log_probs", "next_obs")
"""``ActorClient.step``'s arrays, in its order (``StepArrays.STEP_FIELDS`` + ``next_obs``)."""


# -- the replayer (one simulated actor) ------------------------------------------------


def record(env_id: str, preset: str, num_envs: int, steps: int, seed: int) -> dict[str, Any]:
    """``steps`` lockstep steps of ``num_envs`` real envs acted by the preset's untrained
    policy: the arrays ``ActorClient.step`` takes, each ``[steps, num_envs, ...]``.
    The last step of every slot is marked truncated (its ``final_obs`` kept), so a
    replay that wraps around starts fresh episodes."""
    import numpy as np
    import torch

    from zmq_rl.api import make_configs
    from zmq_rl.envs import make_env
    from zmq_rl.rl.policy import build_policy

    _, _, policy_cfg = make_configs(config=f"preset:{preset}")
    envs = [make_env(env_id) for _ in range(num_envs)]
    torch.manual_seed(seed)
    policy = build_policy(envs[0].observation_space, envs[0].action_space, policy_cfg)
    obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)])
    rows: dict[str, list[Any]] = {k: [] for k in FIELDS}
    finals: list[dict[int, Any]] = []
    generator = torch.Generator().manual_seed(seed)
    for t in range(steps):
        with torch.no_grad():
            action, log_prob, value = policy.act(torch.as_tensor(obs), generator)
        nxt, rewards, terms, truncs, final = [], [], [], [], {}
        for i, env in enumerate(envs):
            o, r, term, trunc, _ = env.step(action[i].numpy())
            trunc = trunc or (t == steps - 1 and not term)
            if term or trunc:
                if trunc and not term:
                    final[i] = o
                o, _ = env.reset()
            nxt.append(o)
            rewards.append(r)
            terms.append(term)
            truncs.append(trunc)
        step = (obs, action.numpy(), rewards, terms, truncs, value.numpy(), log_prob.numpy(), nxt)
        for key, array in zip(FIELDS, step, strict=True):
            rows[key].append(np.asarray(array))
        finals.append(final)
        obs = np.stack(nxt)
    out = {k: np.stack(v) for k, v in rows.items()}
    out["rewards"] = out["rewards"].astype(np.float32)
    out["final_obs"] = finals
    out["spaces"] = (envs[0].observation_space, envs[0].action_space)
    return out


def replay(port: int, env_id: str, preset: str, num_envs: int, steps: int, seed: int) -> None:
    """One simulated actor: register, then send the recording at line rate until the
    learner says shutdown (the valve may hold it; weights are taken and ignored)."""
    from zmq_rl.actor.client import ActorClient

    data = record(env_id, preset, num_envs, steps, seed)
    obs_space, action_space = data["spaces"]
    client = ActorClient(
        f"{HOST}:{port}",
        env_id=env_id,
        observation_space=obs_space,
        action_space=action_space,
        num_envs=num_envs,
    )
    client.register(timeout=120.0)
    t = 0
    while not client.shutdown_requested:
        client.poll()
        if client.should_pause():
            client.wait_for_weights(0.05)
            continue
        client.step(*(data[f][t] for f in FIELDS), final_obs=data["final_obs"][t] or None)
        t = (t + 1) % steps
    client.close()


# -- one measurement --------------------------------------------------------------------


def measure(
    tree: Path,
    env: str,
    actors: int,
    updates: int,
    warmup: int,
    device: str,
    learner_flags: list[str],
    record_steps: int,
) -> dict[str, Any]:
    """Run ``tree``'s learner against ``actors`` replayers; its consumption rate."""
    from zmq_rl.api import make_configs

    learner_cfg, _, _ = make_configs(config=f"preset:{env}")
    num_envs = learner_cfg.num_envs
    # Every slot's rollout grows with the replayers; a rows batch is the preset's
    # batch_rows whatever they are (a tree from before rows batches: the former).
    rows_per_update = max(actors * num_envs * learner_cfg.num_steps, learner_cfg.batch_rows)
    port = _util.free_port_block(4)
    work = Path(tempfile.mkdtemp(prefix="ceiling-"))
    cmd = [
        sys.executable,
        "-m",
        "zmq_rl.cli.learner",
        "--config",
        f"preset:{env}",
        "--num-actors",
        str(actors),
        "--eval-every",
        "0",
        "--target-return",
        "inf",
        "--total-env-steps",
        str(rows_per_update * (warmup + updates)),
        "--port",
        str(port),
        "--run-dir",
        str(work / "run"),
        "--device",
        device,
        "--torch-threads",
        "1",
        "--checkpoint-every",
        "0",
        "--log-level",
        "warning",
        "--no-tensorboard",
        *learner_flags,
    ]
    env_vars = {**os.environ, "PYTHONPATH": _util.python_path(tree)}
    ctx = mp.get_context("spawn")
    with open(work / "learner.log", "w") as log_file:
        learner = subprocess.Popen(cmd, cwd=tree, env=env_vars, stdout=log_file, stderr=log_file)
        replayers = [
            ctx.Process(target=replay, args=(port, env, env, num_envs, record_steps, 100 + i))
            for i in range(actors)
        ]
        for p in replayers:
            p.start()
        try:
            code = learner.wait(timeout=900)
        finally:
            if learner.poll() is None:
                learner.kill()
            for p in replayers:
                p.join(30)
                if p.is_alive():
                    p.kill()
    if code != 0:
        raise RuntimeError(f"learner exited {code}: {(work / 'learner.log').read_text()[-2000:]}")
    from zmq_rl.learner.metrics import is_evaluation_row

    rows = [json.loads(line) for line in (work / "run" / "metrics.jsonl").open()]
    metrics = [m for m in rows if not is_evaluation_row(m)]  # update rows
    first, last = metrics[min(warmup, len(metrics) - 2)], metrics[-1]
    span = last["wall_seconds"] - first["wall_seconds"]
    busy = sum(m.get("time/update_seconds", float("nan")) for m in metrics[warmup + 1 :])
    paused = [
        m["links/valve_paused_share_mean"]
        for m in metrics[warmup:]
        if "links/valve_paused_share_mean" in m
    ]
    return {
        "actors": actors,
        "rows_per_update": (last["env_steps"] - first["env_steps"])
        / max(1, len(metrics) - warmup - 1),
        "updates": len(metrics) - warmup - 1,
        "steps_per_s": (last["env_steps"] - first["env_steps"]) / span,
        "learner_busy_share": busy / span,
        "actors_paused_share": paused[-1] if paused else float("nan"),
    }


def env_only_rate(env_id: str, seconds: float, processes: int, cpus: list[int] = ()) -> float:
    """Env steps per second of ``processes`` processes stepping ``env_id`` with random
    actions for ``seconds`` (the physical limit a fleet on this machine approaches),
    pinned to ``cpus`` when given."""
    ctx = mp.get_context("spawn")
    with ctx.Pool(processes) as pool:
        jobs = [(env_id, seconds, i, list(cpus)) for i in range(processes)]
        counts = pool.starmap(_step_randomly, jobs)
    return sum(counts) / seconds


def _step_randomly(env_id: str, seconds: float, seed: int, cpus: list[int] = ()) -> int:
    from zmq_rl.envs import make_env

    if cpus:
        os.sched_setaffinity(0, cpus)
    env = make_env(env_id)
    env.reset(seed=seed)
    env.action_space.seed(seed)
    steps, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(100):
            _, _, term, trunc, _ = env.step(env.action_space.sample())
            if term or trunc:
                env.reset()
        steps += 100
    return steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _util.add_common_flags(parser)
    parser.add_argument("--env", default="LunarLander-v3", help="an env with a shipped preset")
    parser.add_argument("--actors", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--updates", type=int, default=20, help="measured updates per row")
    parser.add_argument("--warmup", type=int, default=3, help="updates before the clock starts")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--record-steps", type=int, default=512)
    _util.add_base_flags(parser)
    parser.add_argument("learner_flags", nargs="*", help="after --: extra zmq-learner flags")
    args = parser.parse_args(argv)
    if args.smoke:
        args.actors, args.updates, args.warmup, args.record_steps = [1], 3, 1, 64

    rows: list[dict[str, Any]] = []
    with _util.revision_trees(args.base, args.base_tree) as trees:
        for i, actors in enumerate(args.actors):
            order = list(trees.items()) if i % 2 == 0 else list(reversed(trees.items()))
            for name, tree in order:
                row = measure(
                    tree, args.env, actors, args.updates, args.warmup, args.device,
                    args.learner_flags, args.record_steps,
                )  # fmt: skip
                row["learner"] = name
                rows.append(row)
                print(
                    f"{name}: {actors} actor(s): {row['steps_per_s']:,.0f} env steps/s", flush=True
                )
    cores = len(os.sched_getaffinity(0))
    env_rate = env_only_rate(args.env, 1.0 if args.smoke else 3.0, cores)
    table = []
    for row in rows:
        base = next(
            (
                r
                for r in rows
                if r["actors"] == row["actors"]
                and r["learner"] != row["learner"]
                and r["learner"].startswith("base")
            ),
            None,
        )
        ratio = row["steps_per_s"] / base["steps_per_s"] if base and row is not base else None
        table.append(
            [
                row["learner"],
                row["actors"],
                row["rows_per_update"],
                _util.fmt_rate(row["steps_per_s"]),
                f"{100 * row['learner_busy_share']:.0f}%",
                f"{100 * row['actors_paused_share']:.0f}%",
                f"{row['steps_per_s'] / env_rate:.2f}",
                "" if ratio is None else f"{ratio:.2f}x",
            ]
        )
    print(f"\n{args.env}, learner device {args.device}, flags {args.learner_flags or '(preset)'}")
    _util.print_table(
        [
            "learner",
            "actors",
            "rows/update",
            "ceiling steps/s",
            "learner busy",
            "paused",
            "x env-only",
            "vs base",
        ],
        table,
    )
    print(f"env-only (random actions, {cores} processes): {_util.fmt_rate(env_rate)} steps/s")
    _util.write_result(
        "learner_ceiling",
        args,
        {
            "env": args.env,
            "device": args.device,
            "learner_flags": args.learner_flags,
            "rows": rows,
            "env_only_steps_per_s": env_rate,
            "cores": cores,
            "machine": _util.machine_info(),
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
