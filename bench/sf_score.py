"""Sample Factory 2.1.1 to a score, with a periodic deterministic evaluation bolted on.

Run by ``bench/time_to_score.py`` under an interpreter that has ``sample_factory``
(``.venv-bench``); standalone (it does not import zmq_rl).

Sample Factory has no periodic deterministic evaluation, so this script is two
processes of one process group:

* the trainer (``sf_score.py train ...``, a child): ``sf_examples/train_gym_env.py``
  with its CartPole command line's settings (APPO, no RNN, 20 envs per worker, 2
  policy workers, no V-trace, batch 512, reward scale 0.1) for another gymnasium env
  id (the example registers only CartPole-v1; the same ``gym.make`` factory is
  registered for ``--env``), ``--save_every_sec 5`` (the example's 10 halved, so that
  a checkpoint lands near every evaluation point) and ``--device cpu``;
* the watcher (this process): polls the trainer's checkpoint directory and, each time
  the newest checkpoint's ``env_steps`` has crossed the next multiple of
  ``--eval-every-steps``, loads it into SF's own actor-critic (``create_actor_critic``,
  its observation normaliser included) and plays ``--episodes`` deterministic
  episodes (argmax of the action distribution, as ``sf_examples.enjoy`` with
  ``--eval_deterministic``) on that many lockstep envs with batched forwards, like the
  other sides. It prints ``EVAL <mean> after <steps> steps`` or, at the target,
  ``SOLVED ...`` and stops the trainer.

Checkpoints are written on a timer, so an evaluation happens at the first checkpoint
at or past each multiple (its env-step count is reported); the watcher's evaluation
competes with the trainer for the CPUs, as the other sides' evaluations do.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

T_IMPORT = time.monotonic()

SF_EXAMPLE_FLAGS = [
    "--algo=APPO",
    "--use_rnn=False",
    "--num_envs_per_worker=20",
    "--policy_workers_per_policy=2",
    "--recurrence=1",
    "--with_vtrace=False",
    "--batch_size=512",
    "--reward_scale=0.1",
    "--save_every_sec=5",
    "--experiment_summaries_interval=10",
    "--device=cpu",
]
"""sf_examples/train_gym_env.py's CartPole command line (``--save_every_sec`` 5, not 10)."""

CHECKPOINT = re.compile(r"checkpoint_(\d+)_(\d+)\.pth$")


def sf_argv(env: str, seed: int, budget: int, train_dir: str) -> list[str]:
    return [
        *SF_EXAMPLE_FLAGS,
        f"--env={env}",
        f"--experiment=score_{env}",
        f"--train_dir={train_dir}",
        f"--seed={seed}",
        f"--train_for_env_steps={budget}",
    ]


def register(env: str) -> None:
    """The example's own (picklable) factory, registered for ``env``."""
    from sample_factory.envs.env_utils import register_env
    from sf_examples.train_gym_env import make_gym_env_func

    register_env(env, make_gym_env_func)


def train(argv: list[str], env: str) -> int:
    from sample_factory.cfg.arguments import parse_full_cfg, parse_sf_args
    from sample_factory.train import run_rl

    register(env)
    parser, _ = parse_sf_args(argv=argv)
    return run_rl(parse_full_cfg(parser, argv))


def evaluate(model, rnn_size: int, env_id: str, episodes: int, seed: int) -> float:
    """Mean return of ``episodes`` deterministic episodes on lockstep envs."""
    import gymnasium as gym
    import numpy as np
    import torch
    from sample_factory.algo.utils.action_distributions import argmax_actions
    from sample_factory.algo.utils.rl_utils import prepare_and_normalize_obs

    envs = [gym.make(env_id) for _ in range(episodes)]
    obs = [env.reset(seed=seed + i)[0] for i, env in enumerate(envs)]
    returns = np.zeros(episodes)
    live = list(range(episodes))
    with torch.no_grad():
        while live:
            batch = {"obs": torch.as_tensor(np.stack([obs[i] for i in live]), dtype=torch.float32)}
            rnn = torch.zeros([len(live), rnn_size])
            model(prepare_and_normalize_obs(model, batch), rnn)
            actions = argmax_actions(model.action_distribution()).cpu().numpy()
            still = []
            for i, action in zip(live, actions, strict=True):
                obs[i], reward, term, trunc, _ = envs[i].step(int(action))
                returns[i] += reward
                if not (term or trunc):
                    still.append(i)
            live = still
    for env in envs:
        env.close()
    return float(returns.mean())


TRAIN_RETURN = re.compile(r"Avg episode reward: \[\(0, '(-?[\d.]+)'\)\]")


def train_return(log_path: str) -> float:
    """The trainer's latest logged mean return of its (stochastic) training episodes;
    nan before the first or when its output is not logged."""
    try:
        with open(log_path, "rb") as fh:
            fh.seek(max(0, os.path.getsize(log_path) - 20_000))
            found = TRAIN_RETURN.findall(fh.read().decode(errors="replace"))
    except OSError:
        return float("nan")
    return float(found[-1]) if found else float("nan")


def watch(args: argparse.Namespace) -> dict:
    import torch
    from sample_factory.algo.utils.make_env import make_env_func_batched
    from sample_factory.cfg.arguments import parse_full_cfg, parse_sf_args
    from sample_factory.model.actor_critic import create_actor_critic
    from sample_factory.model.model_utils import get_rnn_size
    from sample_factory.utils.attr_dict import AttrDict

    torch.set_num_threads(1)
    train_dir = args.train_dir or tempfile.mkdtemp(prefix="sf-score-")
    argv = sf_argv(args.env, args.seed, args.budget, train_dir)
    register(args.env)
    parser, _ = parse_sf_args(argv=argv)
    cfg = parse_full_cfg(parser, argv)
    probe = make_env_func_batched(
        cfg, env_config=AttrDict(worker_index=0, vector_index=0, env_id=0)
    )
    model = create_actor_critic(cfg, probe.observation_space, probe.action_space)
    model.eval()
    probe.close()
    ckpt_dir = os.path.join(train_dir, f"score_{args.env}", "checkpoint_p0")

    # SIGTERM (the parent's stop) must run the finally below, which ends the trainer.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    os.makedirs(train_dir, exist_ok=True)
    log_path = os.path.join(train_dir, "trainer.log")
    log = None if args.trainer_log else open(log_path, "wb")  # noqa: SIM115 (closed below)
    trainer = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "train", "--env", args.env, "--", *argv],
        stdout=log,
        stderr=subprocess.STDOUT if log else None,
        start_new_session=True,  # its group (SF's workers too) is ended as one below
    )
    print("START learning", flush=True)
    evaluations: list[dict] = []
    next_at = args.eval_every_steps
    solved = False
    eval_seconds = 0.0
    try:
        while trainer.poll() is None and not solved:
            newest = None
            for path in glob.glob(os.path.join(ckpt_dir, "checkpoint_*.pth")):
                m = CHECKPOINT.search(path)
                if m and (newest is None or int(m.group(2)) > newest[0]):
                    newest = (int(m.group(2)), path)
            if newest is None or newest[0] < next_at:
                time.sleep(0.2)  # polling a directory another process writes; no event to wait on
                continue
            steps, path = newest
            try:  # SF's own checkpoint (numpy scalars in it): not weights-only
                state = torch.load(path, map_location="cpu", weights_only=False)
            except (OSError, EOFError, RuntimeError):  # removed or replaced meanwhile
                continue
            start = time.monotonic()
            model.load_state_dict(state["model"])
            mean = evaluate(model, get_rnn_size(cfg), args.env, args.episodes, args.seed + 10_000)
            eval_seconds += time.monotonic() - start
            train = train_return(log_path)
            evaluations.append({"env_steps": steps, "mean_return": mean, "train_return": train})
            solved = mean >= args.target
            print(
                f"{'SOLVED' if solved else 'EVAL'} {mean:.1f} after {steps} steps "
                f"(training episodes {train:.1f})",
                flush=True,
            )
            next_at = (steps // args.eval_every_steps + 1) * args.eval_every_steps
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second stop must not cut this short
        for sig in (signal.SIGINT, signal.SIGKILL):
            if trainer.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(trainer.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                trainer.wait(4)  # inside the parent's 10 s grace before its SIGKILL
        with contextlib.suppress(ProcessLookupError):  # SF's workers, whatever happened
            os.killpg(trainer.pid, signal.SIGKILL)
        if log is not None:
            log.close()
        if not args.train_dir:
            import shutil

            shutil.rmtree(train_dir, ignore_errors=True)
    hits = [e for e in evaluations if e["mean_return"] >= args.target]
    return {
        "solved": bool(hits),
        "env_steps_at_solve": hits[0]["env_steps"] if hits else None,
        "evaluations": evaluations,
        "eval_seconds": eval_seconds,
        "trainer_returncode": trainer.returncode,
        "command": "python -m sf_examples.train_gym_env " + " ".join(argv[:-2]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("score", "train"))
    parser.add_argument("--env", default="Acrobot-v1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", type=float, default=-100.0)
    parser.add_argument("--budget", type=int, default=1_000_000)
    parser.add_argument("--eval-every-steps", type=int, default=40_960)
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--train-dir", default="", help="kept if given (default: a temp dir)")
    parser.add_argument("--trainer-log", action="store_true", help="trainer output to stdout")
    parser.add_argument("--out", default="", help="score: also write the RESULT JSON here")
    parser.add_argument(
        "--port", type=int, default=0, help="accepted for a uniform interface: binds no port"
    )
    args, rest = parser.parse_known_args()
    from sb3_ppo import gym_id  # (bench/ is on the path: this script's folder)

    args.env = gym_id(args.env)  # LunarLander-v3 is LunarLander-v2 in gymnasium 0.29
    if args.mode == "train":
        return train([a for a in rest if a != "--"], args.env)
    result = watch(args)
    print("RESULT " + json.dumps(result), flush=True)
    if args.out:
        with open(args.out, "w") as out:
            out.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
