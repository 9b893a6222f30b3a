"""Trained policies outside training: load one (:func:`load_policy`), act with it
(:meth:`DeployedPolicy.predict`), measure it (:func:`evaluate_policy`), and export it
(:func:`export_policy`) to a file that runs without zmq_rl -- ONNX, TorchScript, or
safetensors weights.

A run writes ``policy.pt`` (tensors, the policy config as JSON, the env id,
``gym.make`` kwargs and wrappers); its checkpoints hold the same. Both are read
with ``torch.load(weights_only=True)``: nothing but tensors and primitive values
is unpickled.

:class:`DeployedPolicy` is a plain :class:`torch.nn.Module` whose ``forward`` is
the deterministic action graph: observation batch ``[B, *obs_shape]`` (float32) ->
actions (int64 ``[B]`` for Discrete, float32 ``[B, act_dim]`` clipped to the Box
bounds), observation normalisation folded in. That graph is what the exports
hold, so an exported file acts exactly as ``predict(obs, deterministic=True)``.

A recurrent policy (``--policy-type lstm`` / ``gru``) carries a state:
``forward(obs, state, episode_start)`` -> ``(action, next_state)``, with ``state``
float32 ``[B, state_size]`` (LSTM: ``[h, c]`` side by side, GRU: ``h``) and
``episode_start`` float32 ``[B]`` (1.0 where ``obs`` is the first observation of an
episode: that row's state is zeroed before acting, as the actors do). The exports
take and return the same.

A ``Dict`` observation is a dict of arrays (``predict``) or of tensors (``forward``),
one per key with the batch dim first; the exported graphs take one input per key,
named by the key, in the space's order. With an ``action_mask`` key and a Discrete /
MultiDiscrete action space (PettingZoo's convention, :mod:`zmq_rl.rl.masking`) every
action -- ``predict``, ``forward``, the exports -- is chosen among the allowed ones.
"""

from __future__ import annotations

import copy
import json
import logging
import re
import struct
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ..learner.checkpoint import config_dict
from ..rl.masking import MASK_KEY, check_observation_mask
from ..rl.networks import RecurrentActorCritic, action_mask_of, leaf_paths
from ..rl.policy import OBS_CLIP, OBS_NORM_EPS, ActorCritic, build_policy, is_recurrent
from ..rl.policy_file import (
    NOT_OURS,
    POLICY_NAME,  # noqa: F401  (defined here before rl/policy_file.py)
    PolicyFileError,
    SavedPolicy,
    policy_path,
    saved_policy,
)
from ..rl.policy_file import (
    load_error_reason as _load_error,
)
from ..wire.spaces import leaves, map_value, wire_dtype

__all__ = [
    "EXPORT_FORMATS",
    "DeployedPolicy",
    "ExportUnavailable",
    "PolicyFileError",
    "Prediction",
    "SavedPolicy",
    "evaluate_policy",
    "export_policy",
    "load_policy",
    "read_policy_file",
]

log = logging.getLogger("zmq_rl.deploy")

EXPORT_FORMATS = ("onnx", "torchscript", "safetensors")
"""The formats of :func:`export_policy` (and ``zmq-rl export --format``)."""
ONNX_OPSET = 17


class ExportUnavailable(ImportError):
    """The package an export format needs is not installed (the message says which)."""


def read_policy_file(target: str | Path) -> SavedPolicy:
    """Read a run dir's ``policy.pt``, a ``policy.pt`` or a checkpoint
    (``checkpoints/ckpt-N.pt``) with ``torch.load(weights_only=True)`` without building
    anything; PolicyFileError naming the file when it is none of those. (Without torch:
    :func:`zmq_rl.rl.policy_file.read_saved_policy`.)"""
    path = policy_path(target)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a truncated file or not a torch file at all
        raise PolicyFileError(f"{path}: {NOT_OURS}: {_load_error(exc)}") from None
    return saved_policy(path, state)


_OLD_RETURN = (
    "DeployedPolicy.predict returns (action, state), as Stable-Baselines3 does; "
    "using its result as the action itself ({use}), as when it returned the action "
    "alone, is deprecated and will stop "
    "working in a future release: write `action, state = policy.predict(obs)` "
    "(docs/api.md, 'Loading and exporting policies')"
)


class Prediction(tuple):
    """What :meth:`DeployedPolicy.predict` returns: the pair ``(action, state)``, as
    Stable-Baselines3's ``predict`` (``state`` is None for a feed-forward policy).

    It is a tuple: ``action, state = policy.predict(obs)``, ``[0]``, ``len()`` and
    iteration see the pair. Deprecated, for code written when ``predict`` returned
    the action alone: the uses that a pair cannot have -- ``int()``, ``float()``,
    ``operator.index``, ``numpy.asarray`` (and so ``env.step`` of a Box env),
    ``==`` / ``!=`` against a non-tuple, ``+`` / ``*`` with a non-tuple, ``bool()``
    and numpy attributes (``.shape``, ``.item()``, ``.tolist()``, ...) -- act on the
    action and warn (:class:`FutureWarning`). Indexing, ``len()`` and iteration
    cannot serve both and follow the pair.
    """

    __slots__ = ()
    __hash__ = None  # type: ignore[assignment]  (the action is a numpy array)

    def __new__(cls, action: np.ndarray, state: np.ndarray | None) -> Prediction:
        return super().__new__(cls, (action, state))

    def __getnewargs__(self) -> tuple[Any, Any]:  # copy and pickle rebuild it from these
        return self[0], self[1]

    @property
    def action(self) -> np.ndarray:
        """The action (what ``predict`` used to return alone)."""
        return self[0]

    @property
    def state(self) -> np.ndarray | None:
        """The recurrent state to pass to the next ``predict``; None when feed-forward."""
        return self[1]

    def _old(self, use: str) -> np.ndarray:
        warnings.warn(_OLD_RETURN.format(use=use), FutureWarning, stacklevel=3)
        return self[0]

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        action = self._old("numpy.asarray")
        return np.array(action, dtype=dtype, copy=True) if copy else np.asarray(action, dtype)

    def __int__(self) -> int:
        return int(self._old("int()"))

    def __float__(self) -> float:
        return float(self._old("float()"))

    def __index__(self) -> int:
        return self._old("as an index").__index__()

    def __bool__(self) -> bool:
        return bool(self._old("bool()"))

    def __eq__(self, other: object) -> Any:
        if isinstance(other, tuple):
            return tuple.__eq__(self, other)
        return self._old("==") == other

    def __ne__(self, other: object) -> Any:
        if isinstance(other, tuple):
            return tuple.__ne__(self, other)
        return self._old("!=") != other

    def __add__(self, other: Any) -> Any:
        if isinstance(other, tuple):
            return tuple.__add__(self, other)
        return self._old("+") + other

    def __radd__(self, other: Any) -> Any:
        return other + self._old("+")

    def __mul__(self, other: Any) -> Any:
        return self._old("*") * other

    def __rmul__(self, other: Any) -> Any:
        return other * self._old("*")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or not hasattr(np.ndarray, name):
            raise AttributeError(f"'Prediction' object has no attribute {name!r}")
        return getattr(self._old(f".{name}"), name)


def _rows(obs: Any) -> int:
    """The batch size of an observation batch (a tensor, or a dict / tuple of them)."""
    return int(leaves(obs)[0].shape[0])


def _flat_dict_keys(space: gym.Space) -> tuple[str, ...]:
    """The keys of a Dict observation space whose entries are all leaf spaces (what
    the exports take as one input per key); ``()`` for any other space."""
    if not isinstance(space, gym.spaces.Dict):
        return ()
    if any(isinstance(s, (gym.spaces.Dict, gym.spaces.Tuple)) for s in space.spaces.values()):
        return ()
    return tuple(space.spaces)


class DeployedPolicy(nn.Module):
    """A trained policy as a plain :class:`torch.nn.Module`.

    ``forward(obs)`` maps a float32 observation batch ``[B, *obs_shape]`` to
    deterministic actions: int64 ``[B]`` (Discrete: the argmax) or float32
    ``[B, act_dim]`` (Box: the Gaussian mean clipped to the bounds). Observation
    normalisation (``--normalize-obs``) is part of the graph, as float32 constants.
    A recurrent policy (``recurrent``, ``state_size > 0``) takes and returns its
    state: ``forward(obs, state, episode_start)`` -> ``(action, next_state)`` (see
    the module doc). :meth:`predict` is the numpy convenience around it (one
    observation or a batch; ``deterministic=False`` samples as the actors do).

    Attributes: ``network`` (the trained actor-critic), ``env_id``, ``env_kwargs``,
    ``wrappers`` (what :meth:`make_env` builds), ``observation_space``,
    ``action_space``, ``version``, ``recurrent``, ``state_size``.
    """

    def __init__(
        self,
        network: nn.Module,
        observation_space: gym.Space,
        action_space: gym.Space,
        env_id: str = "",
        env_kwargs: dict[str, Any] | None = None,
        wrappers: list[str] | None = None,
        version: int = 0,
    ) -> None:
        super().__init__()
        self.network = network.eval()
        self.observation_space = observation_space
        self.action_space = action_space
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs or {})
        self.wrappers = list(wrappers or [])
        self.version = version
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        self.multi_discrete = isinstance(action_space, gym.spaces.MultiDiscrete)
        # The network's discrete actions are 0-based (docs/protocol.md); the env's
        # begin at the space's start.
        self.action_start = int(action_space.start) if self.discrete else 0
        self.obs_keys = _flat_dict_keys(observation_space)
        self.mask_key = getattr(network, "mask_key", None)
        self.recurrent = is_recurrent(network)
        self.state_size = int(getattr(network, "state_size", 0) or 0)
        self._mlp = isinstance(network, ActorCritic)
        if self.multi_discrete:
            start = np.asarray(action_space.start, np.int64).copy()
            self.register_buffer("action_offset", torch.from_numpy(start))
        if self._mlp and network.normalize_obs:
            std = torch.sqrt(network.obs_var + OBS_NORM_EPS).to(torch.float32)
            self.register_buffer("obs_mean", network.obs_mean.to(torch.float32).clone())
            self.register_buffer("obs_std", std.clone())
        if isinstance(action_space, gym.spaces.Box):
            low = np.asarray(action_space.low, np.float32).reshape(-1)
            high = np.asarray(action_space.high, np.float32).reshape(-1)
            self.register_buffer("action_low", torch.from_numpy(low.copy()))
            self.register_buffer("action_high", torch.from_numpy(high.copy()))

    def forward(
        self,
        obs: Any,
        state: torch.Tensor | None = None,
        episode_start: torch.Tensor | None = None,
    ) -> Any:
        """Deterministic actions for a float32 observation batch (a Dict observation:
        a dict of tensors; see the class doc), among the allowed actions of an
        ``action_mask``; a recurrent policy returns ``(action, next_state)``, from
        zeros when ``state`` is None."""
        if self.recurrent:
            return self._recurrent_forward(obs, state, episode_start)
        net = self.network
        if self._mlp:
            x = obs.reshape(obs.shape[0], -1).to(net.policy_head.weight.dtype)
            if hasattr(self, "obs_mean"):
                x = ((x - self.obs_mean) / self.obs_std).clamp(-OBS_CLIP, OBS_CLIP)
            trunk = net.trunk if net.shared_trunk else net.actor_trunk
            params = F.linear(net.run_trunk(trunk, x), net.policy_head.weight, net.policy_head.bias)
            action = params.argmax(dim=-1) if self.discrete else params
        else:  # a custom factory's network: its own deterministic act()
            action = net.act(obs, deterministic=True)[0]
        return self._env_action(action)

    def _env_action(self, action: torch.Tensor) -> torch.Tensor:
        """The network's action as the env takes it: a (multi-)discrete index shifted by
        the space's start, a Box action clipped to its bounds."""
        if self.discrete:
            return action + self.action_start if self.action_start else action
        if self.multi_discrete:
            return action + self.action_offset
        if not hasattr(self, "action_high"):
            return action
        return torch.maximum(torch.minimum(action, self.action_high), self.action_low)

    def _recurrent_forward(
        self,
        obs: torch.Tensor,
        state: torch.Tensor | None,
        episode_start: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step of the recurrent policy from ``state`` (rows whose
        ``episode_start`` is 1 start from zeros): (deterministic action, next state)."""
        net = self.network
        dtype = net.value_head.weight.dtype
        if state is None:
            state = torch.zeros(_rows(obs), self.state_size, dtype=dtype)
        state = state.to(dtype)
        if episode_start is not None:
            state = state * (1.0 - episode_start.to(dtype)).unsqueeze(-1)
        if isinstance(net, RecurrentActorCritic):
            h, next_state = net.unroll(net.features(obs).unsqueeze(0), state)
            mask = action_mask_of(obs, getattr(net, "mask_key", None))
            action = net.heads.sample(net.policy_head(h[0]), deterministic=True, mask=mask)[0]
        else:  # a custom factory's recurrent network: its own act_recurrent()
            action, _, _, next_state = net.act_recurrent(obs, state, deterministic=True)
        return self._env_action(action), next_state

    def initial_state(self, batch: int | None = None) -> np.ndarray | None:
        """The state an episode starts from, as :meth:`predict` takes it: float32
        zeros ``[state_size]`` (``batch`` None) or ``[batch, state_size]``; None for
        a feed-forward policy."""
        if not self.recurrent:
            return None
        shape = (self.state_size,) if batch is None else (int(batch), self.state_size)
        return np.zeros(shape, np.float32)

    def _state_in(self, state: Any, n: int, single: bool) -> torch.Tensor:
        """``predict``'s ``state`` argument as a float32 ``[n, state_size]`` tensor."""
        if state is None:
            return torch.zeros(n, self.state_size)
        array = np.asarray(state, dtype=np.float32)
        want = (self.state_size,) if single else (n, self.state_size)
        if array.shape != want:
            raise ValueError(
                f"state of shape {array.shape} does not fit: this policy's state is "
                f"{list(want)} for {'one observation' if single else f'{n} observations'} "
                "(pass what the previous predict returned, or None at the start)"
            )
        return torch.from_numpy(array.reshape(n, self.state_size).copy())

    @staticmethod
    def _starts_in(episode_start: Any, n: int, single: bool) -> torch.Tensor:
        """``predict``'s ``episode_start`` as a float32 ``[n]`` tensor (1.0 = reset)."""
        if episode_start is None:
            return torch.zeros(n)
        array = np.asarray(episode_start)
        want = () if single else (n,)
        if array.shape != want and not (single and array.shape == (1,)):
            raise ValueError(
                f"episode_start of shape {array.shape} does not fit: it is one flag per "
                f"observation, {'a bool' if single else f'shape ({n},)'} here"
            )
        return torch.from_numpy(array.astype(np.float32).reshape(n).copy())

    def _obs_in(self, obs: Any) -> tuple[Any, bool]:
        """``predict``'s observation as a batch of tensors, and whether it was one
        observation. A Box space: float32 ``[B, *shape]``; a Dict / Tuple space: a
        value of arrays of the dtypes that travel (:func:`~zmq_rl.wire.spaces.wire_dtype`),
        whose ``action_mask`` must allow an action in every row
        (:class:`~zmq_rl.rl.masking.ActionMaskError` otherwise)."""
        space = self.observation_space
        if isinstance(space, gym.spaces.Box) or not isinstance(
            space, (gym.spaces.Dict, gym.spaces.Tuple)
        ):
            array = np.asarray(obs, dtype=np.float32)
            single = array.shape == tuple(space.shape or ())
            return torch.from_numpy(array[None] if single else array), single
        from ..actor.agent import coerce_value

        if isinstance(space, gym.spaces.Dict):
            if not isinstance(obs, Mapping):
                raise ValueError(
                    f"observation: a {type(obs).__name__}, but this policy's observation space "
                    f"is a Dict: pass a dict with the keys {', '.join(map(repr, space.spaces))}"
                )
            missing = [key for key in space.spaces if key not in obs]
            if missing:
                mask = " (the env's action mask: pass the observation as the env returns it)"
                raise ValueError(
                    f"observation: no {', '.join(map(repr, missing))} key, which this policy's "
                    f"observation space has (keys {', '.join(map(repr, space.spaces))})"
                    + (mask if MASK_KEY in missing else "")
                )
        value = coerce_value(space, obs)
        first_space = leaf_paths(space)[0][1]
        single = leaves(value)[0].shape == tuple(first_space.shape or ())
        if single:
            value = map_value(lambda a: a[None], value)
        check_observation_mask(space, self.action_space, value)
        return map_value(lambda a: torch.from_numpy(np.ascontiguousarray(a)), value), single

    @torch.no_grad()
    def predict(
        self,
        obs: Any,
        state: Any = None,
        episode_start: Any = None,
        deterministic: bool = True,
    ) -> Prediction:
        """``(action, state)`` for one observation (shaped as the observation space)
        or a batch of them, as Stable-Baselines3's (and SB3-contrib's
        ``RecurrentPPO``) ``predict``; unpack it: ``action, state = policy.predict(obs)``.

        ``action`` is numpy: an int64 scalar / ``[B]`` (Discrete), int64 ``[K]`` /
        ``[B, K]`` (MultiDiscrete) or float32 ``[act_dim]`` / ``[B, act_dim]`` (Box,
        clipped to its bounds). A Dict observation is a dict of arrays (one
        observation, or a batch with the batch dim first); its ``action_mask``, if
        any, restricts every action to the allowed ones, and a row that allows none
        raises :class:`~zmq_rl.rl.masking.ActionMaskError`. ``state`` is
        None for a feed-forward policy; a recurrent one returns its next state
        (float32 ``[state_size]`` / ``[B, state_size]``) to pass back with the next
        observation, with ``episode_start`` (a bool, or ``[B]`` bools) True where the
        observation begins an episode (that row's state is reset to zeros). ``state``
        None is the start of an episode; a feed-forward policy ignores
        ``episode_start``. ``deterministic=False`` samples from the policy (as an
        actor does).

        The result is a :class:`Prediction`; using it as the action itself (the
        old return value) still works for ``int()``, ``numpy.asarray``,
        ``.shape`` etc. with a :class:`FutureWarning`. ``predict(obs, False)``,
        the old positional ``deterministic``, warns and samples.
        """
        if isinstance(state, (bool, np.bool_)):
            warnings.warn(
                "predict(obs, deterministic) with deterministic as the second positional "
                "argument is deprecated (it is `state` now, as in Stable-Baselines3): "
                "write predict(obs, deterministic=...)",
                FutureWarning,
                stacklevel=3,
            )
            state, deterministic = None, bool(state)
        batch, single = self._obs_in(obs)
        n = _rows(batch)
        next_state = None
        if self.recurrent:
            state_in = self._state_in(state, n, single)
            starts = self._starts_in(episode_start, n, single)
            if deterministic:
                action, next_state = self(batch, state_in, starts)
            else:
                state_in = state_in * (1.0 - starts).unsqueeze(-1)
                action, _, _, next_state = self.network.act_recurrent(batch, state_in)
                action = self._env_action(action)
            next_state = next_state.to(torch.float32).numpy()
            if single:
                next_state = next_state[0]
        else:
            if state is not None:
                raise ValueError(
                    f"state={type(state).__name__}: this policy is feed-forward and has no "
                    "state; pass None (what its predict returns as the state)"
                )
            sampled = None if deterministic else self.network.act(batch)[0]
            action = self(batch) if sampled is None else self._env_action(sampled)
        out = action.numpy()
        return Prediction(out[0] if single else out, next_state)

    def make_env(self, **make_kwargs: Any) -> gym.Env:
        """The env this policy was trained on (same kwargs and wrappers);
        ``make_kwargs`` such as ``render_mode="human"`` are added."""
        from ..envs import make_env

        return make_env(self.env_id, self.env_kwargs, self.wrappers, **make_kwargs)


def load_policy(target: str | Path, env_id: str = "") -> DeployedPolicy:
    """Load a trained policy: ``target`` is a run directory, its ``policy.pt``, or a
    checkpoint (``RUN_DIR/checkpoints/ckpt-N.pt``).

    The env is made once (with the run's ``env_kwargs`` and wrappers) for its
    spaces (a multi-agent env's: the policy acts for one agent); ``env_id``
    overrides the saved id (a variant with the same spaces).
    Returns a :class:`DeployedPolicy`, a ``torch.nn.Module`` in eval mode with
    :meth:`~DeployedPolicy.predict`. Raises :class:`PolicyFileError` for a missing
    or foreign file or weights that do not fit the env, and
    :class:`~zmq_rl.envs.EnvBuildError` when the env cannot be made.
    """
    from ..envs import env_shape

    saved = read_policy_file(target)
    env_id = env_id or saved.env_id
    shape = env_shape(env_id, saved.env_kwargs, saved.wrappers)  # a multi-agent env's too
    spaces = (shape.observation_space, shape.action_space)
    try:
        network = build_policy(*spaces, saved.config)
        network.load_state_dict(saved.weights)
    except (RuntimeError, ValueError, TypeError) as exc:
        trained = f" (it was trained on {saved.env_id})" if env_id != saved.env_id else ""
        raise PolicyFileError(
            f"{saved.path}: the weights do not fit env {env_id}{trained}: {_misfit(exc)}"
        ) from None
    network.eval()
    deployed = DeployedPolicy(
        network, *spaces, env_id, saved.env_kwargs, saved.wrappers, saved.version
    )
    deployed.eval()
    deployed.source = saved  # type: ignore[attr-defined]  (path and config, for callers)
    return deployed


_SIZE_MISMATCH = re.compile(
    r"size mismatch for (\S+): copying a param with shape torch\.Size\((\[[^\]]*\])\) from "
    r"checkpoint, the shape in current model is torch\.Size\((\[[^\]]*\])\)"
)


def _misfit(exc: BaseException) -> str:
    """Why saved weights do not fit a network, in one line: the first tensor whose
    shape differs (``load_state_dict``'s message is a header, ``Error(s) in loading
    state_dict for ActorCritic:``, then one line per tensor), or the first line that
    says something."""
    text = str(exc)
    found = _SIZE_MISMATCH.search(text)
    if found:
        name, saved, wanted = found.groups()
        more = len(_SIZE_MISMATCH.findall(text)) - 1
        others = f" (and {more} more tensors)" if more else ""
        return f"{name} is {saved} in the file, {wanted} for this env's spaces{others}"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith("Error(s) in loading")] or lines
    return lines[0] if lines else type(exc).__name__


# -- evaluation ---------------------------------------------------------------------


def evaluate_policy(
    policy: DeployedPolicy | str | Path,
    env: gym.Env | str | None = None,
    n_eval_episodes: int = 10,
    deterministic: bool = True,
    *,
    seed: int | None = None,
    return_episode_rewards: bool = False,
    opponent: str = "random",
) -> tuple[float, float] | tuple[list[float], list[int]]:
    """Play ``n_eval_episodes`` episodes with a policy and return the mean and std of
    their returns, as Stable-Baselines3's ``evaluate_policy``.

    ``policy``: a :class:`DeployedPolicy`, or what :func:`load_policy` takes (a run
    directory, ``policy.pt``, a checkpoint). ``env``: a ``gymnasium.Env`` (used as
    it is and left open; its episodes must end), an env id (made with the policy's
    ``env_kwargs`` and wrappers), or None: the env the policy was trained on
    (:meth:`DeployedPolicy.make_env`). Actions come from :meth:`DeployedPolicy.predict`
    (``deterministic``: the mode; False samples), a recurrent policy's state starts
    from zeros each episode. ``seed``: episode ``i`` resets with the ``i``-th of
    :func:`zmq_rl.envs.seeding.env_seeds` ``(seed, n_eval_episodes)``, the seeds ``zmq-rl
    eval --seed`` uses, so the two agree; None resets unseeded.

    Returns ``(mean, std)`` of the undiscounted returns (``numpy.std``: population),
    or, with ``return_episode_rewards``, ``(returns, lengths)``: one float and one
    int per episode. :class:`~zmq_rl.config.ConfigError` names a bad
    ``n_eval_episodes``; :class:`ValueError` an env whose spaces are not the policy's.

    A multi-agent (PettingZoo) policy is played as ``zmq-rl eval`` plays it
    (:func:`zmq_rl.learner.evaluation.evaluate_policy`): ``env`` is then its id or None
    (each episode gets a copy of its own, played in lockstep), every agent acts by the
    policy, and an episode's return is the mean return of its agents; a turn-based
    game seats the policy in each seat in turn against ``opponent`` (``"random"``
    legal moves, ``"policy:PATH"``, or a scripted ``"module:name"``), its return the
    seat's. Its length is the env steps (moves, in a game) of the episode.
    """
    from ..config import ConfigError
    from ..envs import build_env
    from ..envs.seeding import env_seeds

    if isinstance(n_eval_episodes, bool) or not isinstance(n_eval_episodes, (int, np.integer)):
        raise ConfigError("n_eval_episodes", n_eval_episodes, "must be an integer >= 1")
    if n_eval_episodes < 1:
        raise ConfigError("n_eval_episodes", n_eval_episodes, "must be an integer >= 1")
    if not isinstance(policy, DeployedPolicy):
        policy = load_policy(policy)
    if isinstance(env, gym.vector.VectorEnv):
        raise TypeError(
            "env: a gymnasium vector env is not supported; pass one gymnasium.Env, an env "
            "id, or None (the policy's own env)"
        )
    if env is not None and not isinstance(env, (str, gym.Env)) and hasattr(env, "possible_agents"):
        raise TypeError(
            "env: a PettingZoo env instance; pass its id (or None: the policy's own env), "
            "since a multi-agent evaluation builds a copy of the env per episode"
        )
    own = env is None or isinstance(env, str)
    if own:
        built = build_env(env or policy.env_id, policy.env_kwargs, policy.wrappers)
        if not isinstance(built, gym.Env):  # a PettingZoo env: every agent by the policy
            built.close()
            return _evaluate_agents(
                policy,
                env or policy.env_id,
                n_eval_episodes,
                deterministic,
                seed,
                return_episode_rewards,
                opponent,
            )
        env = built
    elif opponent != "random":
        raise ValueError(f"opponent={opponent!r}: only a turn-based game has other seats")
    try:
        _check_spaces(policy, env)
        seeds = env_seeds(seed, n_eval_episodes) if seed is not None else [None] * n_eval_episodes
        returns: list[float] = []
        lengths: list[int] = []
        for episode_seed in seeds:
            obs, _ = env.reset(seed=episode_seed)
            state, start, done = None, True, False
            total, length = 0.0, 0
            while not done:
                action, state = policy.predict(
                    obs, state=state, episode_start=start, deterministic=deterministic
                )
                obs, reward, terminated, truncated, _ = env.step(
                    action.item() if policy.discrete else action
                )
                total += float(reward)
                length += 1
                start, done = False, bool(terminated or truncated)
            returns.append(total)
            lengths.append(length)
    finally:
        if own:
            env.close()
    if return_episode_rewards:
        return returns, lengths
    return float(np.mean(returns)), float(np.std(returns))


def _evaluate_agents(
    policy: DeployedPolicy,
    env_id: str,
    episodes: int,
    deterministic: bool,
    seed: int | None,
    return_episode_rewards: bool,
    opponent: str,
) -> tuple[float, float] | tuple[list[float], list[int]]:
    """:func:`evaluate_policy` of a multi-agent env (see there)."""
    from ..envs import env_shape
    from ..learner.evaluation import evaluate_policy as evaluate_agents

    if opponent != "random" and not env_shape(env_id, policy.env_kwargs).turn_based:
        raise ValueError(f"opponent={opponent!r}: {env_id} is not a turn-based game")
    seed = int(np.random.default_rng().integers(2**31)) if seed is None else seed
    played: list[tuple[float, int]] = []
    mean, std = evaluate_agents(
        policy.network,
        env_id,
        episodes,
        seed,
        policy.env_kwargs,
        policy.wrappers,
        deterministic=deterministic,
        opponent=opponent,
        episodes_played=played,
    )
    if return_episode_rewards:
        return [score for score, _ in played], [length for _, length in played]
    return mean, std


def _check_spaces(policy: DeployedPolicy, env: gym.Env) -> None:
    """ValueError naming the space when ``env``'s spaces are not the policy's."""
    for name in ("observation_space", "action_space"):
        mine, theirs = getattr(policy, name), getattr(env, name)
        if mine != theirs:
            raise ValueError(f"env: its {name} {theirs} is not the policy's {mine}")


# -- export -----------------------------------------------------------------------------


def _example_inputs(policy: DeployedPolicy, batch: int = 2) -> tuple[torch.Tensor, ...]:
    """Inputs to trace the graph with: ``(obs,)``, or ``(obs, state, episode_start)``
    for a recurrent policy (one row resetting, one carrying its state); a Dict
    observation is one input per key (:class:`_KeyedInputs`)."""
    space = policy.observation_space
    if policy.obs_keys:
        obs: tuple[torch.Tensor, ...] = tuple(
            torch.from_numpy(
                np.stack([np.asarray(sub.sample()) for _ in range(batch)]).astype(wire_dtype(sub))
            )
            for sub in space.spaces.values()
        )
    else:
        sample = np.stack([space.sample() for _ in range(batch)]).astype(np.float32)
        obs = (torch.from_numpy(sample),)
    if not policy.recurrent:
        return obs
    state = torch.randn(batch, policy.state_size, generator=torch.Generator().manual_seed(0))
    starts = torch.zeros(batch)
    starts[0] = 1.0
    return (*obs, state, starts)


class _KeyedInputs(nn.Module):
    """A Dict-observation policy with one positional input per key (in the space's
    order), then ``state`` and ``episode_start`` for a recurrent one: what the
    exporters trace, since ONNX and TorchScript graphs take tensors, not dicts."""

    def __init__(self, policy: DeployedPolicy) -> None:
        super().__init__()
        self.policy = policy
        self.keys = policy.obs_keys

    def forward(self, *inputs: torch.Tensor) -> Any:
        obs = dict(zip(self.keys, inputs[: len(self.keys)], strict=True))
        return self.policy(obs, *inputs[len(self.keys) :])


def _traceable(policy: DeployedPolicy) -> tuple[nn.Module, tuple[str, ...]]:
    """The module the exporters trace and its input names: the policy itself (input
    ``obs``), or for a Dict observation :class:`_KeyedInputs` (one input per key).
    ValueError for a Tuple or nested Dict observation, which has no such names."""
    extra = RECURRENT_INPUTS[1:] if policy.recurrent else ()
    if policy.obs_keys:
        return _KeyedInputs(policy), (*policy.obs_keys, *extra)
    if not isinstance(policy.observation_space, gym.spaces.Box):
        raise ValueError(
            f"cannot export a policy of observation space {policy.observation_space}: the "
            "exports take a Box, or a Dict of Box / Discrete / MultiDiscrete / MultiBinary "
            "entries (one input per key)"
        )
    return policy, (RECURRENT_INPUTS if policy.recurrent else INPUTS)


INPUTS = ("obs",)
RECURRENT_INPUTS = ("obs", "state", "episode_start")
OUTPUTS = ("action",)
RECURRENT_OUTPUTS = ("action", "next_state")
"""The names of the exported graphs' inputs and outputs (ONNX names them so)."""


def _metadata(policy: DeployedPolicy, fmt: str) -> dict[str, str]:
    """What a deployment needs to know besides the graph, as strings."""
    space = policy.action_space
    if policy.discrete:
        action: dict[str, Any] = {"type": "discrete", "n": int(space.n)}
    elif policy.multi_discrete:
        action = {
            "type": "multi_discrete",
            "nvec": np.asarray(space.nvec).tolist(),
            "start": np.asarray(space.start).tolist(),
        }
    else:
        action = {
            "type": "box",
            "shape": list(space.shape),
            "low": np.asarray(space.low).tolist(),
            "high": np.asarray(space.high).tolist(),
        }
    source = getattr(policy, "source", None)
    return (
        {
            "format": f"zmq_rl-policy-{fmt}",
            "env_id": policy.env_id,
            "env_kwargs": json.dumps(policy.env_kwargs),
            "wrappers": json.dumps(policy.wrappers),
            "observation_shape": json.dumps(list(policy.observation_space.shape or ())),
            "action": json.dumps(action),
            "version": str(policy.version),
            "policy_config": json.dumps({} if source is None else config_dict(source.config)),
            "input": "obs: float32 [batch, *observation_shape]",
            "output": "action: int64 [batch] (discrete) or float32 [batch, act_dim] (box)",
        }
        | (_recurrent_metadata(policy) if policy.recurrent else {})
        | _dict_metadata(policy)
    )


def _dict_metadata(policy: DeployedPolicy) -> dict[str, str]:
    """A Dict observation's inputs (one per key: shape and dtype) and its action mask."""
    if not policy.obs_keys:
        return {}
    spaces = policy.observation_space.spaces
    entries = {
        key: {"shape": list(spaces[key].shape or ()), "dtype": wire_dtype(spaces[key]).name}
        for key in policy.obs_keys
    }
    inputs = "; ".join(f"{k}: {e['dtype']} [batch, *{e['shape']}]" for k, e in entries.items())
    if policy.recurrent:
        inputs += "; then state and episode_start (see state_size)"
    mask = (
        f"; actions are chosen among those whose {policy.mask_key} entry is 1"
        if policy.mask_key
        else ""
    )
    return {
        "observation_keys": json.dumps(entries),
        "action_mask": policy.mask_key or "",
        "input": f"one input per observation key, in this order: {inputs}{mask}",
    }


def _recurrent_metadata(policy: DeployedPolicy) -> dict[str, str]:
    """The recurrent graph's extra inputs and outputs, for a deployment to read."""
    size = policy.state_size
    cell = getattr(policy.network, "cell_type", "custom")
    layout = {"lstm": f"[h, c], {size // 2} each", "gru": "h"}.get(cell, "the network's")
    return {
        "state_size": str(size),
        "cell": cell,
        "input": (
            f"obs: float32 [batch, *observation_shape]; state: float32 [batch, {size}] "
            f"({layout}; zeros at the start); episode_start: float32 [batch] (1.0 where obs "
            "begins an episode: that row's state is reset to zeros before acting)"
        ),
        "output": (
            "action: int64 [batch] (discrete) or float32 [batch, act_dim] (box); "
            f"next_state: float32 [batch, {size}] (feed it back as state)"
        ),
    }


def export_onnx(policy: DeployedPolicy, out: Path) -> None:
    """Write the deterministic action graph as ONNX (input ``obs``, output ``action``;
    recurrent: inputs ``obs``, ``state``, ``episode_start``, outputs ``action``,
    ``next_state``; dynamic batch size, opset :data:`ONNX_OPSET`), with the metadata as
    ``metadata_props``. Uses torch's TorchScript-based exporter, which needs the
    ``onnx`` package (``pip install 'zmq_rl[export]'``) but not onnxscript."""
    import importlib.util

    if importlib.util.find_spec("onnx") is None:
        raise ExportUnavailable(
            "ONNX export needs the onnx package: pip install 'zmq_rl[export]' (or pip "
            "install onnx); --format torchscript and safetensors need nothing more"
        )
    module, inputs = _traceable(policy)
    example = _example_inputs(policy)
    outputs = RECURRENT_OUTPUTS if policy.recurrent else OUTPUTS
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation notice
        torch.onnx.export(
            module,
            example,
            str(out),
            dynamo=False,
            input_names=list(inputs),
            output_names=list(outputs),
            dynamic_axes={name: {0: "batch"} for name in (*inputs, *outputs)},
            opset_version=ONNX_OPSET,
        )
    import onnx

    model = onnx.load(str(out))
    for key, value in _metadata(policy, "onnx").items():
        model.metadata_props.add(key=key, value=value)
    onnx.save(model, str(out))


def export_torchscript(policy: DeployedPolicy, out: Path) -> None:
    """Write the deterministic action graph as a traced TorchScript module
    (``torch.jit.load(path)(obs)``; recurrent: ``(obs, state, episode_start)`` ->
    ``(action, next_state)``; C++: ``torch::jit::load``), metadata in its
    ``extra_files["zmq_rl.json"]``."""
    module, _ = _traceable(policy)
    example = _example_inputs(policy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings on shape checks, deprecations
        frozen = copy.deepcopy(module).requires_grad_(False)  # outputs need no .detach()
        traced = torch.jit.trace(frozen, example, check_trace=False)
        extra = {"zmq_rl.json": json.dumps(_metadata(policy, "torchscript"))}
        torch.jit.save(traced, str(out), _extra_files=extra)


def _safetensors_bytes(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> bytes:
    """The safetensors format (a little-endian u64 header size, a JSON header, raw
    little-endian data), written directly so no extra package is needed."""
    dtypes = {
        torch.float32: "F32",
        torch.float64: "F64",
        torch.int64: "I64",
        torch.int32: "I32",
        torch.float16: "F16",
    }
    header: dict[str, Any] = {"__metadata__": metadata}
    chunks, offset = [], 0
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        data = tensor.numpy().astype(tensor.numpy().dtype.newbyteorder("<")).tobytes()
        header[name] = {
            "dtype": dtypes[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def export_safetensors(policy: DeployedPolicy, out: Path) -> None:
    """Write the deploy graph's tensors (actor trunk, policy head, normalisation
    constants, action bounds; no critic, no optimiser) as safetensors, with the
    architecture in the header's ``__metadata__`` so another framework can rebuild it."""
    tensors = {
        name: value
        for name, value in policy.state_dict().items()
        if "critic_trunk" not in name
        and "value_head" not in name
        and not name.startswith("network.obs_")
    }
    metadata = _metadata(policy, "safetensors")
    if policy._mlp:
        net = policy.network
        cfg = getattr(policy, "source", None)
        metadata["architecture"] = (
            f"x = obs.reshape(B, -1); x = clamp((x - obs_mean) / obs_std, -{OBS_CLIP:g}, "
            f"{OBS_CLIP:g}) if obs_mean present; for each Linear in "
            f"network.{'trunk' if net.shared_trunk else 'actor_trunk'}: x = "
            f"{cfg.config.activation if cfg else 'activation'}(x @ W.T + b); "
            "out = x @ network.policy_head.weight.T + bias; discrete: argmax(out); "
            "box: clip(out, action_low, action_high)"
        )
    Path(out).write_bytes(_safetensors_bytes(tensors, metadata))


def export_policy(
    target: str | Path | DeployedPolicy, fmt: str, out: str | Path, env_id: str = ""
) -> Path:
    """Export a trained policy (a run dir, ``policy.pt``, checkpoint, or a loaded
    :class:`DeployedPolicy`) as ``fmt`` (one of :data:`EXPORT_FORMATS`) to ``out``;
    return the path. The file needs no zmq_rl: ONNX runs in onnxruntime (C, C++,
    C#, Java, JS, ...), TorchScript in torch / libtorch; safetensors holds the
    weights and the architecture as metadata."""
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"format={fmt!r}: must be one of {', '.join(EXPORT_FORMATS)}")
    policy = target if isinstance(target, DeployedPolicy) else load_policy(target, env_id)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    {"onnx": export_onnx, "torchscript": export_torchscript, "safetensors": export_safetensors}[
        fmt
    ](policy, path)
    log.info("exported %s policy to %s", fmt, path)
    return path
