# %% [markdown]
# # Train CartPole from Python
#
# The Python API of zmq_rl (docs/api.md), cell by cell: run it as a script
# (`python examples/train_cartpole.py`) or open it as a notebook (VS Code and
# Jupytext read the `# %%` cells). It trains CartPole-v1 with a learner in this
# process and two actor processes, stops once an evaluation averages 475, then
# loads the policy, plays it and exports it to ONNX.
#
# `TOTAL_ENV_STEPS` (environment variable) overrides the budget (the test runs this
# file with a tiny one), `PORT` the learner's port (default 5555).

# %%
import os

import numpy as np

import zmq_rl

TOTAL_ENV_STEPS = int(os.environ.get("TOTAL_ENV_STEPS", "100000"))
RUN_DIR = os.environ.get("RUN_DIR")  # None: a new runs/CartPole-v1-<timestamp>
PORT = int(os.environ.get("PORT", "5555"))


# %% [markdown]
# A callback sees every update and every evaluation; returning `False` from any
# hook stops the run (the policy and report are still written).


# %%
class PrintEvaluations(zmq_rl.Callback):
    """Print each evaluation as it is reported."""

    def on_evaluation(self, result):
        print(f"evaluation after {result['env_steps']:,} steps: {result['mean_return']:.1f}")


# %% [markdown]
# Train. CartPole-v1 has a tuned preset (its budget, hyper-parameters and the
# target return 475); keyword arguments override any setting by its name.

# %%
result = zmq_rl.train(
    "CartPole-v1",
    total_env_steps=TOTAL_ENV_STEPS,
    seed=1,
    run_dir=RUN_DIR,
    port=PORT,
    callbacks=[PrintEvaluations()],
    starvation_timeout=300.0,  # generous: a busy machine may be slow to start the actors
    verbose=False,
)
print(f"stopped: {result.stop_reason}; run dir {result.run_dir}")
print(f"last evaluation: {result.last_evaluation['mean_return']:.1f}")

# %% [markdown]
# Load the trained policy: a plain `torch.nn.Module` with `predict()`.

# %%
policy = zmq_rl.load_policy(result.run_dir)
env = policy.make_env()  # the env it was trained on (kwargs and wrappers included)
returns = []
for episode in range(5):
    obs, _ = env.reset(seed=100 + episode)
    total, done = 0.0, False
    while not done:
        action, _ = policy.predict(obs)  # (action, state), as Stable-Baselines3
        obs, reward, terminated, truncated, _ = env.step(int(action))
        total += float(reward)
        done = terminated or truncated
    returns.append(total)
print(f"5 episodes with predict(): mean return {np.mean(returns):.1f}")
mean, std = zmq_rl.evaluate_policy(policy, n_eval_episodes=5, seed=100)  # episodes in one call
print(f"evaluate_policy: {mean:.1f} ± {std:.1f}")

# %% [markdown]
# Export it for a program without zmq_rl (docs/embedding.md: ONNX from C).

# %%
path = zmq_rl.export_policy(result.run_dir, "onnx", result.run_dir / "policy.onnx")
print(f"exported {path}")
