"""Where an actor's time goes: the parts of GymActor's loop, timed in one process.

No sockets and no learner: per step of ``E`` lockstep CartPole-v1 envs it times

* ``env_step``: stepping every env the way ``GymActor`` does (``gym.make`` envs:
  TimeLimit -> OrderEnforcing -> PassiveEnvChecker -> CartPoleEnv, a Python int
  action, reset on episode end), against two cheaper ways to get identical
  transitions: ``gym.make(..., disable_env_checker=True)`` and stepping
  ``env.unwrapped`` with the actor counting steps for the 500-step truncation
  itself (what a ``TimeLimit`` does);
* ``policy_act``: ``ActorCritic.act`` on the ``[E, 4]`` batch (torch, 1 thread), and
  ``numpy_act``: the same through :class:`~zmq_rl.rl.numpy_act.NumpySampler`, which
  is what the actor runs for this MLP (the loop figures use it);
* ``client_step``: ``ActorClient.step``'s work before the socket (``StepArrays.coerce``,
  ``LockstepBuffer.add`` and the counters) and, every ``T`` steps, ``encode`` of one
  fragment per slot;

Figures are microseconds per actor-loop iteration (one step of all ``E`` envs)
and per env step.

    python bench/actor_loop.py                # E = 1, 8, 32
    python bench/actor_loop.py --smoke
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _util  # noqa: E402


def _time(fn: Any, seconds: float) -> float:
    """Seconds per call of ``fn`` (best of 3 runs of ~seconds/3 each)."""
    n = 1
    while True:
        t = time.perf_counter()
        for _ in range(n):
            fn()
        dt = time.perf_counter() - t
        if dt > 0.05:
            break
        n *= 2
    per = dt / n
    reps = max(1, int(seconds / 3 / per))
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t) / reps)
    return best


def env_steppers(num_envs: int) -> dict[str, Any]:
    import gymnasium as gym
    import numpy as np

    rng = np.random.default_rng(0)

    def make_default(**kwargs: Any) -> Any:
        envs = [gym.make("CartPole-v1", **kwargs) for _ in range(num_envs)]
        for i, env in enumerate(envs):
            env.reset(seed=i)

        def step() -> None:
            actions = rng.integers(0, 2, num_envs)
            for j, env in enumerate(envs):
                _, _, term, trunc, _ = env.step(actions[j].item())
                if term or trunc:
                    env.reset()

        return step

    def make_unwrapped() -> Any:
        envs = [gym.make("CartPole-v1") for _ in range(num_envs)]
        limit = envs[0].spec.max_episode_steps
        raw = [env.unwrapped for env in envs]
        for i, env in enumerate(envs):
            env.reset(seed=i)
        elapsed = [0] * num_envs

        def step() -> None:
            actions = rng.integers(0, 2, num_envs)
            for j, env in enumerate(raw):
                _, _, term, _, _ = env.step(actions[j].item())
                elapsed[j] += 1
                if term or elapsed[j] >= limit:
                    env.reset()
                    elapsed[j] = 0

        return step

    return {
        "gym.make (GymActor today)": make_default(),
        "gym.make(disable_env_checker=True)": make_default(disable_env_checker=True),
        "env.unwrapped + own 500-step limit": make_unwrapped(),
    }


def measure(num_envs: int, seconds: float, T: int) -> dict[str, Any]:
    import gymnasium as gym
    import numpy as np
    import torch

    from zmq_rl.actor.sender import ExperienceSender
    from zmq_rl.config import PolicyConfig
    from zmq_rl.rl.numpy_act import NumpySampler
    from zmq_rl.rl.policy import build_policy
    from zmq_rl.wire.protocol import RunSettings, StepArrays

    torch.set_num_threads(1)
    out: dict[str, Any] = {"envs": num_envs}
    # The variants alternate over 5 rounds; the best round of each counts (load noise).
    steppers = env_steppers(num_envs)
    best: dict[str, float] = {}
    for _ in range(5):
        for name, fn in steppers.items():
            best[name] = min(best.get(name, float("inf")), 1e6 * _time(fn, seconds / 5))
    out["env_step_us"] = best

    probe = gym.make("CartPole-v1")
    policy = build_policy(probe.observation_space, probe.action_space, PolicyConfig())
    policy.eval()
    obs = torch.from_numpy(
        np.random.default_rng(0).standard_normal((num_envs, 4)).astype(np.float32)
    )
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        out["policy_act_us"] = 1e6 * _time(lambda: policy.act(obs, generator), seconds)
    sampler, obs_np = NumpySampler(policy, seed=0), obs.numpy()
    out["numpy_act_us"] = 1e6 * _time(lambda: sampler.act(obs_np), seconds)

    # ActorClient.step's work up to the socket: coerce the arrays (StepArrays.coerce),
    # buffer them, and every fragment_length steps build and encode one fragment per
    # slot (ExperienceSender). The socket takes every frame at once.
    class NullSocket:
        def send(self, frame: bytes, flags: int = 0, copy: bool = True) -> None:
            pass

        def close(self, linger: int | None = None) -> None:
            pass

    sender = ExperienceSender({}, Counter(), lambda: True, num_envs)
    settings = RunSettings(
        env_id="CartPole-v1",
        observation_space=probe.observation_space,
        action_space=probe.action_space,
        policy={},
        num_steps=T,
        broadcast_every=1,
        steps_per_broadcast=T,
        max_lead_steps=0,
        fragment_length=T,
        num_envs=num_envs,
        seed=0,
        heartbeat_interval=1.0,
    )
    sender.start(
        NullSocket(),
        settings,
        actor_id=0,
        run_id="x" * 12,
        token=bytes(16),
        base_version=0,
        observation_space=probe.observation_space,
        action_space=probe.action_space,
    )
    arrays = {
        "obs": obs.numpy(),
        "actions": np.zeros(num_envs, np.int64),
        "rewards": np.ones(num_envs, np.float32),
        "terminated": np.zeros(num_envs, bool),
        "truncated": np.zeros(num_envs, bool),
        "values": np.zeros(num_envs, np.float32),
        "log_probs": np.full(num_envs, -0.69, np.float32),
    }

    def client_step() -> None:
        sender.step(StepArrays.coerce(*arrays.values()), arrays["obs"], {}, 0)

    out["client_step_us"] = 1e6 * _time(client_step, seconds)
    probe.close()
    current = out["env_step_us"]["gym.make (GymActor today)"]
    best = min(out["env_step_us"].values())
    loop = current + out["numpy_act_us"] + out["client_step_us"]
    out["loop_us"] = loop
    out["loop_us_with_cheapest_env"] = loop - current + best
    out["env_steps_per_s_per_core"] = num_envs / loop * 1e6
    out["env_steps_per_s_per_core_cheapest_env"] = num_envs / out["loop_us_with_cheapest_env"] * 1e6
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _util.add_common_flags(parser)
    parser.add_argument("--envs", default="1,8,32")
    parser.add_argument("--seconds", type=float, default=3.0, help="per timed item")
    parser.add_argument("--fragment-length", type=int, default=64)
    args = parser.parse_args(argv)
    if args.smoke:
        args.envs, args.seconds = "8", 0.3
    results = [measure(int(e), args.seconds, args.fragment_length) for e in args.envs.split(",")]
    rows = []
    for r in results:
        e = r["envs"]
        env = r["env_step_us"]
        names = list(env)
        rows.append(
            [
                e,
                *(f"{env[n] / e:.1f}" for n in names),
                f"{r['policy_act_us'] / e:.1f}",
                f"{r['numpy_act_us'] / e:.1f}",
                f"{r['client_step_us'] / e:.1f}",
                _util.fmt_rate(r["env_steps_per_s_per_core"]),
                _util.fmt_rate(r["env_steps_per_s_per_core_cheapest_env"]),
            ]
        )
    _util.print_table(
        [
            "envs",
            "env: gym.make",
            "env: no checker",
            "env: unwrapped",
            "policy.act (torch)",
            "numpy act (used)",
            "client.step",
            "steps/s/core",
            "with cheapest env",
        ],
        rows,
    )
    print("(microseconds per env step; steps/s/core = envs / (env + numpy act + client) per loop)")
    _util.write_result(
        "actor_loop",
        args,
        {
            "config": {
                "envs": args.envs,
                "seconds": args.seconds,
                "fragment_length": args.fragment_length,
            },
            "results": results,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
