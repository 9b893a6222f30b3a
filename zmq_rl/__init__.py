"""zmq_rl: distributed reinforcement learning over ZeroMQ (IMPALA-style actors, PPO learner).

Train from a script or a notebook::

    import zmq_rl

    result = zmq_rl.train("CartPole-v1", total_env_steps=100_000, seed=1)
    policy = zmq_rl.load_policy(result.run_dir)       # a torch.nn.Module
    action, state = policy.predict(observation)       # as SB3; state None unless recurrent
    mean, std = zmq_rl.evaluate_policy(policy, n_eval_episodes=10)
    zmq_rl.export_policy(result.run_dir, "onnx", "cartpole.onnx")

The API (docs/api.md); every name is imported on first use, so ``import zmq_rl``
stays fast and does not import torch:

Training
    train(env, **settings)        learner here + local actor processes; returns a TrainResult
                                  (train(resume=run_dir) continues a run from its checkpoint)
    run_learner(env, **settings)  a learner alone, for actors started elsewhere
    start_actors(learner, count)  actor processes for a learner (ActorProcesses)
    run_actor(learner, **settings) one actor in this process
    make_configs(env, **settings) the validated configs train() would use
    Callback                      on_update / on_evaluation / on_checkpoint hooks; False stops
    TrainResult                   report, run_dir, stop_reason, load_policy()
    ActorProcesses                what start_actors returns: wait(), stop(), a context manager

Policies
    load_policy(run_dir_or_file)  a DeployedPolicy (torch.nn.Module with predict())
    export_policy(src, fmt, out)  ONNX / TorchScript / safetensors that run without zmq_rl
    evaluate_policy(policy, env)  mean and std return over episodes (as SB3's)
    DeployedPolicy                forward = deterministic action graph; predict(obs, state)
    Prediction                    what predict returns: (action, state)
    PolicyFileError               a policy file that is missing or not zmq_rl's
    EXPORT_FORMATS                ("onnx", "torchscript", "safetensors")

Embedding (your own simulator as an actor)
    Agent(learner, obs_space, action_space, num_envs)   act(obs) / observe(...) / close()
    Decision                      what Agent.decide chose (turn-based simulators: record later)
    AgentTeam(agent, names)       act({name: obs}) / observe(...): agents by name

Environments
    make_env(env, env_kwargs, wrappers)  an env as every process of a run builds it
    build_env(env, env_kwargs, wrappers) the same, a PettingZoo env included
    env_shape(env, env_kwargs, wrappers) its spaces and agents per env (EnvShape)
    EnvBuildError                 an env (or wrapper) that cannot be built, naming it

Configuration
    LearnerConfig, PPOConfig, PolicyConfig, ActorConfig   the validated settings
    ConfigError                   a bad setting, naming the field and the value

The console scripts ``zmq-rl`` (run, eval, export, plot, keys), ``zmq-learner``
and ``zmq-actor`` are thin layers over these functions.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import _moved  # noqa: F401  (old module paths keep importing; docs/api.md)

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # training (zmq_rl.api)
    "train": "api",
    "run_learner": "api",
    "start_actors": "api",
    "run_actor": "api",
    "make_configs": "api",
    "Callback": "api",
    "TrainResult": "api",
    "ActorProcesses": "api",
    # policies (zmq_rl.serving.deploy)
    "load_policy": "serving.deploy",
    "export_policy": "serving.deploy",
    "DeployedPolicy": "serving.deploy",
    "Prediction": "serving.deploy",
    "evaluate_policy": "serving.deploy",
    "PolicyFileError": "rl.policy_file",  # (serving.deploy's, without torch)
    "EXPORT_FORMATS": "serving.deploy",
    # embedding (zmq_rl.actor.agent)
    "Agent": "actor.agent",
    "Decision": "actor.agent",
    "AgentTeam": "actor.team",
    # environments (zmq_rl.envs)
    "make_env": "envs",
    "build_env": "envs",
    "env_shape": "envs",
    "EnvShape": "envs",
    "EnvBuildError": "envs",
    # configuration (zmq_rl.config)
    "LearnerConfig": "config",
    "PPOConfig": "config",
    "PolicyConfig": "config",
    "ActorConfig": "config",
    "ConfigError": "config",
}
"""Public name -> the submodule that defines it (imported on first access)."""

__all__ = [
    "ActorConfig",
    "Agent",
    "AgentTeam",
    "ActorProcesses",
    "Callback",
    "ConfigError",
    "Decision",
    "DeployedPolicy",
    "EXPORT_FORMATS",
    "EnvBuildError",
    "EnvShape",
    "LearnerConfig",
    "PPOConfig",
    "PolicyConfig",
    "PolicyFileError",
    "Prediction",
    "TrainResult",
    "__version__",
    "build_env",
    "env_shape",
    "evaluate_policy",
    "export_policy",
    "load_policy",
    "make_configs",
    "make_env",
    "run_actor",
    "run_learner",
    "start_actors",
    "train",
]

if TYPE_CHECKING:  # for type checkers and IDEs; at run time __getattr__ imports lazily
    from .actor.agent import Agent, Decision
    from .actor.team import AgentTeam
    from .api import (
        ActorProcesses,
        Callback,
        TrainResult,
        make_configs,
        run_actor,
        run_learner,
        start_actors,
        train,
    )
    from .config import ActorConfig, ConfigError, LearnerConfig, PolicyConfig, PPOConfig
    from .envs import EnvBuildError, EnvShape, build_env, env_shape, make_env
    from .rl.policy_file import PolicyFileError
    from .serving.deploy import (
        EXPORT_FORMATS,
        DeployedPolicy,
        Prediction,
        evaluate_policy,
        export_policy,
        load_policy,
    )


def __getattr__(name: str) -> Any:
    """Import a public name's submodule on first access (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'zmq_rl' has no attribute {name!r}")
    try:
        imported = importlib.import_module(f".{module}", __name__)
    except ModuleNotFoundError as exc:
        if exc.name != "torch":
            raise
        from .rl.installs import TorchMissing, require_torch

        require_torch(f"zmq_rl.{name}")  # one line naming the install (an actor host)
        raise TorchMissing(str(exc)) from None  # (torch found, yet not importable)
    value = getattr(imported, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
