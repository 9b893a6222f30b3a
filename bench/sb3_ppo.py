"""Stable-Baselines3 PPO with the rl-baselines3-zoo hyperparameters (CartPole-v1 by default).

Run by ``bench/throughput.py`` and ``bench/time_to_solve.py`` under an interpreter
that has ``stable_baselines3`` (this one or ``.venv-bench``); standalone only
(it does not import zmq_rl). Zoo's ``hyperparams/ppo.yml`` for CartPole-v1::

    n_envs 8, MlpPolicy, n_steps 32, batch_size 256, gae_lambda 0.8, gamma 0.98,
    n_epochs 20, ent_coef 0.0, learning_rate lin_0.001, clip_range lin_0.2, 1e5 steps

``--env LunarLander-v3`` / ``--env Acrobot-v1`` take zoo's LunarLander-v2 / Acrobot-v1
entries (see ``ZOO``; ``bench/time_to_score.py``), with ``--eval-every-steps`` the
evaluation cadence; under gymnasium 0.29 LunarLander-v3 runs as LunarLander-v2.

Modes (one JSON line ``RESULT {...}`` at the end on stdout):

* ``throughput --steps N``: ``model.learn(N)`` with no callback; training env
  steps per second over ``learn`` (model construction excluded, reported apart).
* ``solve --seed S``: learn with an EvalCallback-equivalent -- SB3's own
  ``EvalCallback`` on a ``DummyVecEnv`` of 20 seeded CartPole-v1 envs, so the 20
  deterministic episodes run in lockstep with batched forwards exactly like the
  project's evaluation -- every 1280 env steps (``eval_freq`` 160 calls x 8 envs,
  the project's cadence of every 5 updates of 256 steps), stopping as soon as
  the mean return reaches 475 (``StopTrainingOnRewardThreshold``). Prints
  ``SOLVED <mean>`` the moment that evaluation ends, so that a parent process can
  timestamp it against the launch.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

T_IMPORT = time.monotonic()


ZOO: dict[str, dict] = {
    "CartPole-v1": {
        "n_envs": 8,
        "n_steps": 32,
        "batch_size": 256,
        "gae_lambda": 0.8,
        "gamma": 0.98,
        "n_epochs": 20,
        "ent_coef": 0.0,
        "learning_rate": "lin_1e-3",
        "clip_range": "lin_0.2",
    },
    # Zoo's LunarLander-v2 entry (the project's LunarLander-v3 preset maps the same).
    "LunarLander-v3": {
        "n_envs": 16,
        "n_steps": 1024,
        "batch_size": 64,
        "gae_lambda": 0.98,
        "gamma": 0.999,
        "n_epochs": 4,
        "ent_coef": 0.01,
    },
    # batch_size 64 and learning rate 3e-4 are SB3's defaults; normalize: VecNormalize.
    "Acrobot-v1": {
        "normalize": True,
        "n_envs": 16,
        "n_steps": 256,
        "gae_lambda": 0.94,
        "gamma": 0.99,
        "n_epochs": 4,
        "ent_coef": 0.0,
    },
}
"""rl-baselines3-zoo ``hyperparams/ppo.yml`` entries (``lin_X``: linear from X to 0)."""


def gym_id(env: str) -> str:
    """``env`` if this gymnasium registers it, else the newest registered version of
    its name (LunarLander-v3 is LunarLander-v2 in gymnasium 0.29)."""
    import gymnasium as gym

    if env in gym.registry:
        return env
    name = env.rsplit("-v", 1)[0]
    versions = sorted(
        int(k.rsplit("-v", 1)[1]) for k in gym.registry if k.rsplit("-v", 1)[0] == name
    )
    return f"{name}-v{versions[-1]}" if versions else env


def _schedule(value):
    if isinstance(value, str) and value.startswith("lin_"):
        start = float(value[4:])
        return lambda progress_remaining: progress_remaining * start
    return value


def zoo_model(seed: int, verbose: int = 0, env_id: str = "CartPole-v1"):
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    params = dict(ZOO[env_id])
    n_envs = params.pop("n_envs")
    normalize = params.pop("normalize", False)
    env = make_vec_env(gym_id(env_id), n_envs=n_envs, seed=seed)
    if normalize:
        env = VecNormalize(env)
    for key in ("learning_rate", "clip_range"):
        if key in params:
            params[key] = _schedule(params[key])
    return PPO("MlpPolicy", env, seed=seed, verbose=verbose, device="cpu", **params)


def throughput(steps: int, seed: int, env_id: str = "CartPole-v1") -> dict:
    import torch

    t0 = time.monotonic()
    model = zoo_model(seed, env_id=env_id)
    t1 = time.monotonic()
    model.learn(total_timesteps=steps)
    t2 = time.monotonic()
    done = int(model.num_timesteps)
    return {
        "steps": done,
        "learn_seconds": t2 - t1,
        "steps_per_s": done / (t2 - t1),
        "setup_seconds": t1 - t0,
        "import_seconds": t0 - T_IMPORT,
        "torch_threads": torch.get_num_threads(),
    }


def solve(
    seed: int,
    target: float,
    budget: int,
    episodes: int,
    env_id: str = "CartPole-v1",
    eval_every_steps: int = 1280,
) -> dict:
    import numpy as np
    import torch
    from stable_baselines3.common.callbacks import EvalCallback, StopTrainingOnRewardThreshold
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    model = zoo_model(seed, env_id=env_id)
    eval_env = make_vec_env(gym_id(env_id), n_envs=episodes, seed=seed + 10_000)
    if ZOO[env_id].get("normalize"):  # EvalCallback syncs the training statistics in
        eval_env = VecNormalize(eval_env, training=False, norm_reward=False)
    evaluations: list[dict] = []
    eval_seconds = [0.0]

    class Stop(StopTrainingOnRewardThreshold):
        def _on_step(self) -> bool:
            parent = self.parent
            mean = float(parent.last_mean_reward)
            evaluations.append(
                {
                    "env_steps": int(parent.num_timesteps),
                    "mean_return": mean,
                    "at": time.monotonic() - T_IMPORT,
                }
            )
            if mean >= self.reward_threshold:
                print(f"SOLVED {mean:.1f} after {parent.num_timesteps} steps", flush=True)
            else:
                print(f"EVAL {mean:.1f} after {parent.num_timesteps} steps", flush=True)
            return super()._on_step()

    class TimedEval(EvalCallback):
        def _on_step(self) -> bool:
            start = time.monotonic()
            try:
                return super()._on_step()
            finally:
                if self.eval_freq > 0 and self.n_calls % self.eval_freq == 0:
                    eval_seconds[0] += time.monotonic() - start

    callback = TimedEval(
        eval_env,
        callback_on_new_best=None,
        callback_after_eval=Stop(reward_threshold=target, verbose=0),
        n_eval_episodes=episodes,
        eval_freq=max(1, eval_every_steps // model.n_envs),
        deterministic=True,
        verbose=0,
    )
    t1 = time.monotonic()
    print("START learning", flush=True)
    model.learn(total_timesteps=budget, callback=callback)
    t2 = time.monotonic()
    solved = [e for e in evaluations if e["mean_return"] >= target]
    return {
        "solved": bool(solved),
        "env_steps_at_solve": solved[0]["env_steps"] if solved else None,
        "learn_seconds": t2 - t1,
        "eval_seconds": eval_seconds[0],
        "evaluations": evaluations,
        "n_envs_eval": int(np.asarray(episodes)),
        "torch_threads": torch.get_num_threads(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("throughput", "solve"))
    parser.add_argument("--steps", type=int, default=30_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", type=float, default=475.0)
    parser.add_argument("--budget", type=int, default=100_000)
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--env", default="CartPole-v1", choices=sorted(ZOO))
    parser.add_argument(
        "--eval-every-steps", type=int, default=1280, help="solve: evaluation cadence (env steps)"
    )
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch intra-op threads (0 = torch's default, one per core); 1 "
        "like the project's learner: on a loaded 2-core machine the default "
        "2 threads measured 35x slower (OpenMP oversubscription)",
    )
    parser.add_argument("--out", default="", help="also write the RESULT JSON here")
    parser.add_argument(
        "--port", type=int, default=0, help="accepted for a uniform interface: binds no port"
    )
    args = parser.parse_args()
    if args.torch_threads > 0:
        import torch

        torch.set_num_threads(args.torch_threads)
    if args.mode == "throughput":
        result = throughput(args.steps, args.seed, args.env)
    else:
        result = solve(
            args.seed, args.target, args.budget, args.episodes, args.env, args.eval_every_steps
        )
    print("RESULT " + json.dumps(result), flush=True)
    if args.out:
        with open(args.out, "w") as out:
            out.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
