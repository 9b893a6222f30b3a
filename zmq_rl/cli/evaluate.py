"""``zmq-rl eval``: load a saved policy and measure it on fresh episodes.

Loading is :func:`zmq_rl.serving.deploy.load_policy` (errors become one-line CLI failures).
The learner saves ``policy.pt`` as plain tensors plus the JSON policy config and
env id (:meth:`zmq_rl.learner.loop.Learner.save_policy`), and its checkpoints
(``checkpoints/ckpt-N.pt``, :meth:`~zmq_rl.learner.loop.Learner.checkpoint`) hold the
same policy under ``trainer``, with the configs as JSON; both load with
``torch.load(weights_only=True)``: nothing is unpickled beyond tensors and
primitive values. Any other file is refused in one line.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from zmq_rl.config import PolicyConfig

from ..run.common import CliFailure

log = logging.getLogger(__name__)

__all__ = [
    "Evaluation",
    "LoadedPolicy",
    "describe",
    "evaluate",
    "load_policy",
    "policy_path",
    "record_episodes",
    "run_deterministic",
]

POLICY_NAME = "policy.pt"


@dataclass
class LoadedPolicy:
    """A policy rebuilt from ``policy.pt``."""

    policy: Any
    env_id: str
    version: int
    config: PolicyConfig
    path: Path
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    wrappers: list[str] = field(default_factory=list)
    agent_policies: list[Any] = field(default_factory=list)
    """A run of several policies: each agent's network (from ``policy-<id>.pt``)."""


def policy_path(target: str | Path) -> Path:
    """``RUN_DIR`` -> ``RUN_DIR/policy.pt``; a file path is returned as is."""
    from zmq_rl.serving.deploy import PolicyFileError
    from zmq_rl.serving.deploy import policy_path as find

    try:
        return find(target)
    except PolicyFileError as exc:
        raise CliFailure(str(exc)) from None


def load_policy(target: str | Path, env_id: str = "") -> LoadedPolicy:
    """Rebuild the actor-critic saved at ``target``: a run dir, its ``policy.pt``, or
    one of its checkpoints (``checkpoints/ckpt-N.pt``), with
    :func:`zmq_rl.serving.deploy.load_policy`; a bad file is a :class:`CliFailure`.

    ``env_id`` overrides the saved env id (e.g. a variant with the same spaces).
    On a host without torch (``pip install zmq_rl``) the file is read without it and
    the policy is its numpy network (:func:`_load_numpy`).
    """
    from zmq_rl.rl.installs import torch_installed

    if not torch_installed():
        return _load_numpy(target, env_id)
    from zmq_rl.serving.deploy import PolicyFileError
    from zmq_rl.serving.deploy import load_policy as load

    try:
        deployed = load(target, env_id)
    except PolicyFileError as exc:
        raise CliFailure(str(exc)) from None
    saved = deployed.source
    per_agent = []
    if saved.agent_policies:  # a run of several policies: each agent plays its own
        networks = {}
        for pid in dict.fromkeys(saved.agent_policies):
            sibling = saved.path.parent / f"policy-{pid}.pt"
            try:
                networks[pid] = load(sibling, deployed.env_id).network
            except PolicyFileError as exc:
                raise CliFailure(f"{exc} (policy {pid!r} of {saved.path})") from None
        per_agent = [networks[pid] for pid in saved.agent_policies]
    return LoadedPolicy(
        deployed.network,
        deployed.env_id,
        deployed.version,
        saved.config,
        saved.path,
        deployed.env_kwargs,
        deployed.wrappers,
        per_agent,
    )


class Evaluation(NamedTuple):
    """What ``zmq-rl eval`` measured: the mean and std return (``evaluate(...)[:2]``),
    how the policy chose (its mode, or sampled), and in a turn-based game who played
    the other seats and each seat's results."""

    mean: float
    std: float
    deterministic: bool = True
    opponent: str = ""
    """A turn-based game's ``--opponent`` ("" for other envs)."""
    seats: tuple[tuple[str, dict[str, int], float], ...] = ()
    """A turn-based game: per seat, its agent name, the policy's wins, draws and
    losses there, and its mean return there."""


def run_deterministic(target: str | Path) -> bool:
    """Whether the run that saved ``target`` (a run dir, its ``policy.pt``, a
    checkpoint) evaluated with the policy's mode: its ``config.toml``'s
    ``eval_deterministic``; True when there is no such file (a policy file alone)."""
    import tomllib

    path = Path(target)
    for folder in (path, path.parent, path.parent.parent):
        config = folder / "config.toml"
        if config.is_file():
            try:
                learner = tomllib.loads(config.read_text()).get("learner", {})
            except (OSError, tomllib.TOMLDecodeError):
                return True
            return bool(learner.get("eval_deterministic", True))
    return True


def _load_numpy(target: str | Path, env_id: str = "") -> LoadedPolicy:
    """:func:`load_policy` without torch: the file read by
    :func:`~zmq_rl.serving.policy_file.read_saved_policy`, each network a numpy one
    (:func:`~zmq_rl.serving.policy_file.numpy_policy`); a custom factory's network
    is refused in one line (exit 2)."""
    from zmq_rl.envs import env_shape
    from zmq_rl.rl.installs import TorchMissing
    from zmq_rl.rl.policy_file import PolicyFileError, numpy_policy, read_saved_policy

    try:
        saved = read_saved_policy(target)
        env_id = env_id or saved.env_id
        shape = env_shape(env_id, saved.env_kwargs, saved.wrappers)
        spaces = (shape.observation_space, shape.action_space)
        network = numpy_policy(saved, *spaces)
        networks = {}
        for pid in dict.fromkeys(saved.agent_policies):  # a run of several policies
            sibling = saved.path.parent / f"policy-{pid}.pt"
            try:
                networks[pid] = numpy_policy(read_saved_policy(sibling), *spaces)
            except PolicyFileError as exc:
                raise PolicyFileError(f"{exc} (policy {pid!r} of {saved.path})") from None
    except PolicyFileError as exc:
        raise CliFailure(str(exc)) from None
    except TorchMissing as exc:
        raise CliFailure(str(exc), 2) from None
    return LoadedPolicy(
        network,
        env_id,
        saved.version,
        saved.config,
        saved.path,
        saved.env_kwargs,
        saved.wrappers,
        [networks[pid] for pid in saved.agent_policies],
    )


def evaluate(
    loaded: LoadedPolicy,
    episodes: int,
    seed: int,
    opponent: str = "random",
    deterministic: bool = True,
) -> Evaluation:
    """The returns of ``episodes`` episodes (the learner's evaluator; actions by the
    policy's mode, or sampled and seeded when ``deterministic`` is False; a run of
    several policies plays each agent by its own; a turn-based game's other seats by
    ``opponent``, as ``--eval-opponent``, with each seat's wins, draws and losses)."""
    from zmq_rl.envs import env_shape
    from zmq_rl.learner.evaluation import evaluate_policy

    shape = env_shape(loaded.env_id, loaded.env_kwargs)
    if opponent != "random" and not shape.turn_based:
        raise CliFailure(f"--opponent {opponent}: {loaded.env_id} is not a turn-based game")
    by_seat: dict[int, float] = {}
    outcomes: dict[int, dict[str, int]] = {}
    mean, std = evaluate_policy(
        loaded.agent_policies or loaded.policy,
        loaded.env_id,
        episodes,
        seed,
        loaded.env_kwargs,
        loaded.wrappers,
        deterministic=deterministic,
        opponent=opponent,
        by_agent=by_seat,
        outcomes=outcomes,
    )
    if not shape.turn_based:
        return Evaluation(mean, std, deterministic)
    seats = tuple(
        (shape.agents[i], outcomes[i], by_seat[i])
        for i in sorted(outcomes)
        if i < len(shape.agents)
    )
    return Evaluation(mean, std, deterministic, opponent, seats)


OPPONENT_NAMES = {"random": "random legal moves"}


def _count(n: int, word: str) -> str:
    """``1 win``, ``2 wins``, ``0 losses``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}{'es' if word.endswith('s') else 's'}"


def describe(loaded: LoadedPolicy, result: Evaluation, episodes: int, seed: int) -> list[str]:
    """The lines ``zmq-rl eval`` prints: in a turn-based game, against whom and each
    seat's wins, draws and losses (as a board-game player reads them); then the mean
    and std return, how the actions were chosen, the version and the file."""
    how = "deterministic" if result.deterministic else f"sampled actions, seed {seed}"
    lines = []
    if result.opponent:
        who = OPPONENT_NAMES.get(result.opponent, result.opponent)
        lines.append(f"{loaded.env_id} against {who} (seats alternate; {how}):")
        for seat, (agent, counts, mean) in enumerate(result.seats):
            games = sum(counts.values())
            first = " (moves first)" if seat == 0 else ""
            tally = ", ".join(
                _count(counts[key], word)
                for key, word in (("wins", "win"), ("draws", "draw"), ("losses", "loss"))
            )
            lines.append(
                f"  as {agent}{first}: {tally} in {_count(games, 'game')} (mean return {mean:.2f})"
            )
    lines.append(
        f"{loaded.env_id}: mean return {result.mean:.2f} ± {result.std:.2f} over {episodes} "
        f"episodes ({how}; policy version {loaded.version}, {loaded.path})"
    )
    return lines


@contextlib.contextmanager
def headless_sdl() -> Iterator[None]:
    """Let pygame (the renderer of the classic-control and box2d envs) start without a
    desktop session: SDL's audio goes to its dummy driver and, where
    ``XDG_RUNTIME_DIR`` is unset or not a folder, a private one (mode 0700) is lent
    for the duration. Without them SDL prints ``error: XDG_RUNTIME_DIR is invalid or
    not set`` and a page of ALSA errors after a video that was written fine (issue 29).
    A driver the user chose is kept; the variables are restored afterwards."""
    before = {name: os.environ.get(name) for name in ("SDL_AUDIODRIVER", "XDG_RUNTIME_DIR")}
    with contextlib.ExitStack() as stack:
        os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
        if not os.path.isdir(os.environ.get("XDG_RUNTIME_DIR", "")):
            os.environ["XDG_RUNTIME_DIR"] = stack.enter_context(
                tempfile.TemporaryDirectory(prefix="zmq_rl-xdg-")  # mkdtemp: mode 0700
            )
        try:
            yield
        finally:
            for name, value in before.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def record_episodes(
    loaded: LoadedPolicy, episodes: int, seed: int, video_dir: Path
) -> tuple[float, float]:
    """Play ``episodes`` deterministic episodes one after another, recording each to
    ``video_dir`` with :class:`gymnasium.wrappers.RecordVideo`; mean and std return.

    Needs moviepy (and, for the classic-control envs, pygame to render).
    """
    if importlib.util.find_spec("moviepy") is None:
        raise CliFailure(
            "--video needs moviepy, which is not installed: pip install moviepy "
            "(classic-control envs such as CartPole also need pygame to render: "
            "pip install 'zmq_rl[video]' installs both)"
        )
    with headless_sdl():
        return _record(loaded, episodes, seed, video_dir)


def _record(loaded: LoadedPolicy, episodes: int, seed: int, video_dir: Path) -> tuple[float, float]:
    import gymnasium as gym
    import numpy as np

    from zmq_rl.envs import make_env
    from zmq_rl.envs.seeding import env_seeds
    from zmq_rl.learner.evaluation import NUMPY_NETWORKS, _numpy_actions
    from zmq_rl.rl.weights import is_recurrent
    from zmq_rl.wire.spaces import batch_obs, env_actions

    if not isinstance(loaded.policy, NUMPY_NETWORKS):
        from zmq_rl.rl.networks import obs_tensor

    try:
        env = make_env(loaded.env_id, loaded.env_kwargs, loaded.wrappers, render_mode="rgb_array")
    except Exception as exc:  # no rgb_array rendering in this env
        raise CliFailure(f"cannot render {loaded.env_id}: {exc}") from None
    env = gym.wrappers.RecordVideo(
        env,
        str(video_dir),
        episode_trigger=lambda _: True,
        name_prefix="eval",
        disable_logger=True,
    )
    scalar = isinstance(env.action_space, gym.spaces.Discrete)
    policy = loaded.policy
    recurrent = is_recurrent(policy)
    returns = []
    try:
        for episode_seed in env_seeds(seed, episodes):
            obs, _ = env.reset(seed=episode_seed)
            total, done = 0.0, False
            state = policy.initial_state(1) if recurrent else None
            while not done:
                raw = batch_obs(env.observation_space, [obs])
                if isinstance(policy, NUMPY_NETWORKS):  # a host without torch
                    action = _numpy_actions(policy, raw, state, [0], deterministic=True)
                    a = env_actions(env.action_space, action)[0]
                    obs, reward, terminated, truncated, _ = env.step(a.item() if scalar else a)
                    total += float(reward)
                    done = terminated or truncated
                    continue
                batch = obs_tensor(raw)
                if recurrent:
                    action, _, _, state = policy.act_recurrent(batch, state, deterministic=True)
                else:
                    action, _, _ = policy.act(batch, deterministic=True)
                a = env_actions(env.action_space, action.numpy())[0]
                obs, reward, terminated, truncated, _ = env.step(a.item() if scalar else a)
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
    except gym.error.DependencyNotInstalled as exc:
        raise CliFailure(f"cannot render {loaded.env_id}: {exc}") from None
    finally:
        env.close()
    return float(np.mean(returns)), float(np.std(returns))
