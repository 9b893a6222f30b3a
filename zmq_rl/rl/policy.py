"""The actor-critic network shared by actors (sampling) and the learner (PPO).

This module holds no socket code. It provides:

* :func:`build_policy`, which derives the whole architecture from the gymnasium
  spaces and a :class:`~zmq_rl.config.PolicyConfig`, so that an actor process can
  build a network identical to the learner's and load broadcast weights into it;
* :class:`ActorCritic`, an MLP actor-critic for float ``Box`` observations and
  ``Discrete`` (categorical) or ``Box`` (diagonal Gaussian) actions (every other
  supported space, and the recurrent ``policy_type`` s, are built by
  :mod:`zmq_rl.rl.networks`). Its sampling
  path :meth:`ActorCritic.act` avoids ``torch.distributions`` (whose object
  construction and argument validation cost ~140 us per call) and computes the
  same log-densities in closed form as :meth:`ActorCritic.evaluate_actions`;
* :func:`export_weights` / :func:`import_weights`, a bit-exact, Python-object-free
  (de)serialisation of a module's ``state_dict`` to ``(name, numpy array)`` pairs
  that any transport can frame.

Architecture and initialisation follow CleanRL's ``ppo.py`` / ``ppo_continuous_action.py``
and Stable-Baselines3: separate actor and critic trunks by default, orthogonal
weights with gain ``sqrt(2)`` in hidden layers, ``0.01`` on the policy head and
``1.0`` on the value head, zero biases, and a state-independent ``log_std``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import gymnasium
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from zmq_rl.config import ConfigError, PolicyConfig
from zmq_rl.rl.layers import layer as _layer
from zmq_rl.rl.layers import trunk as _trunk
from zmq_rl.rl.normalization import merge_moments
from zmq_rl.rl.numpy_mlp import OBS_CLIP, OBS_NORM_EPS, mlp_dims
from zmq_rl.rl.weights import WeightsMismatch, check_arrays, is_recurrent, policy_config_from

if TYPE_CHECKING:
    from zmq_rl.wire.protocol import Welcome

__all__ = [
    "ActorCritic",
    "Policy",
    "WeightsMismatch",
    "build_policy",
    "check_weights",
    "export_weights",
    "import_weights",
    "is_recurrent",
]

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_ACTIVATION_FNS = {"tanh": torch.tanh, "relu": torch.relu}


def _gaussian_log_prob(
    actions: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor
) -> torch.Tensor:
    """Log-density of a diagonal Gaussian, summed over the action dimension: ``[B]``.

    ``log N(a; mu, sigma) = -((a - mu) / sigma)^2 / 2 - log sigma - log sqrt(2 pi)``,
    the same expression ``torch.distributions.Normal.log_prob`` evaluates.
    """
    z = (actions - mean) * torch.exp(-log_std)
    return (-0.5 * z.square() - log_std - _LOG_SQRT_2PI).sum(dim=-1)


class ActorCritic(nn.Module):
    """An MLP actor-critic over flat observations.

    Args:
      obs_dim: length of the flattened observation vector.
      action_dim: number of actions (``Discrete``) or of action dimensions (``Box``).
      discrete: ``True`` for a categorical policy over ``action_dim`` logits,
        ``False`` for a diagonal Gaussian with a learnable, state-independent
        ``log_std`` of length ``action_dim``.
      cfg: hidden widths, activation, shared trunk, initialisation.

    Prefer :func:`build_policy`, which derives these from gymnasium spaces. The
    constructor is deterministic given the global torch RNG state, and the
    parameter names depend only on the arguments, so two processes that build from
    the same spaces and config can exchange weights with :func:`export_weights` /
    :func:`import_weights`.

    All methods are batch-first: ``obs`` is ``[B, *obs_shape]`` (any trailing
    shape whose size is ``obs_dim``; it is flattened and cast to the parameters'
    dtype) on the module's device.
    """

    def __init__(self, obs_dim: int, action_dim: int, discrete: bool, cfg: PolicyConfig) -> None:
        super().__init__()
        cfg.validate()
        if obs_dim < 1 or action_dim < 1:
            raise ValueError(f"obs_dim and action_dim must be >= 1, got {obs_dim}, {action_dim}")
        self.obs_dim = int(obs_dim)
        self.action_dim = int(action_dim)
        self.discrete = bool(discrete)
        self.shared_trunk = bool(cfg.shared_trunk)
        self._activation = _ACTIVATION_FNS[cfg.activation]
        self.activation_name = cfg.activation
        width = cfg.hidden_sizes[-1]
        if self.shared_trunk:
            self.trunk = _trunk(self.obs_dim, cfg)
        else:
            self.actor_trunk = _trunk(self.obs_dim, cfg)
            self.critic_trunk = _trunk(self.obs_dim, cfg)
        self.policy_head = _layer(width, self.action_dim, 0.01, cfg.ortho_init)
        self.value_head = _layer(width, 1, 1.0, cfg.ortho_init)
        if not self.discrete:
            self.log_std = nn.Parameter(torch.full((self.action_dim,), float(cfg.log_std_init)))
        self.normalize_obs = bool(cfg.normalize_obs)
        if self.normalize_obs:
            # Buffers, not parameters: they travel with every weights message and
            # checkpoint, so actors and evaluation normalise exactly as the learner.
            self.register_buffer("obs_mean", torch.zeros(self.obs_dim, dtype=torch.float64))
            self.register_buffer("obs_var", torch.ones(self.obs_dim, dtype=torch.float64))
            self.register_buffer("obs_count", torch.zeros((), dtype=torch.float64))

    @torch.no_grad()
    def update_obs_stats(self, obs: np.ndarray) -> None:
        """Fold a batch of observations ``[N, *obs_shape]`` into the running mean and
        variance (Chan et al.'s parallel algorithm; no-op without ``normalize_obs``)."""
        if not self.normalize_obs:
            return
        batch = np.asarray(obs, np.float64).reshape(-1, self.obs_dim)
        mean, var, count = merge_moments(
            self.obs_mean.cpu().numpy(),
            self.obs_var.cpu().numpy(),
            float(self.obs_count),
            batch.mean(axis=0),
            batch.var(axis=0),
            batch.shape[0],
        )
        self.obs_mean.copy_(torch.from_numpy(mean))
        self.obs_var.copy_(torch.from_numpy(var))
        self.obs_count.fill_(count)

    # -- forward pieces -------------------------------------------------------------

    def flat_obs(self, obs: torch.Tensor) -> torch.Tensor:
        """The trunks' input: ``[B, *obs_shape]`` -> ``[B, obs_dim]`` in the parameters'
        dtype, normalised and clipped with ``normalize_obs`` (no parameter takes part,
        so closed-form gradients, :mod:`zmq_rl.rl.analytic`, start from it)."""
        flat = obs.reshape(obs.shape[0], -1)
        if flat.shape[1] != self.obs_dim:
            raise ValueError(
                f"observation batch of shape {tuple(obs.shape)} does not flatten to "
                f"[B, {self.obs_dim}]"
            )
        dtype = self.policy_head.weight.dtype
        flat = flat if flat.dtype == dtype else flat.to(dtype)
        if self.normalize_obs:
            std = torch.sqrt(self.obs_var + OBS_NORM_EPS).to(dtype)
            flat = ((flat - self.obs_mean.to(dtype)) / std).clamp_(-OBS_CLIP, OBS_CLIP)
        return flat

    def run_trunk(self, trunk: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
        """Apply a trunk with ``F.linear`` and the activation function directly.

        Equivalent to ``trunk(x)`` but skips ``nn.Module.__call__`` per layer, which
        halves the cost of the small-batch forward pass on the actor's hot path.
        """
        for layer in trunk:
            if isinstance(layer, nn.Linear):
                x = self._activation(F.linear(x, layer.weight, layer.bias))
        return x

    def _value_of(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(h, self.value_head.weight, self.value_head.bias).squeeze(-1)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Distribution parameters and values: (logits ``[B, n]`` or mean ``[B, act_dim]``,
        value ``[B]``). Computing both in one call shares the trunk when it is shared."""
        x = self.flat_obs(obs)
        head = self.policy_head
        if self.shared_trunk:
            h = self.run_trunk(self.trunk, x)
            return F.linear(h, head.weight, head.bias), self._value_of(h)
        pi = F.linear(self.run_trunk(self.actor_trunk, x), head.weight, head.bias)
        return pi, self._value_of(self.run_trunk(self.critic_trunk, x))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """State values ``V(obs)``, ``[B]`` (bootstrap values for the learner)."""
        x = self.flat_obs(obs)
        trunk = self.trunk if self.shared_trunk else self.critic_trunk
        return self._value_of(self.run_trunk(trunk, x))

    # -- sampling (actor hot path) ----------------------------------------------------

    @torch.no_grad()
    def act(
        self,
        obs: torch.Tensor,
        generator: torch.Generator | None = None,
        deterministic: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample actions for a batch of observations: (action, log_prob, value).

        The actor's hot path, so it builds no ``torch.distributions`` objects and no
        autograd graph. ``generator`` (on the module's device) makes sampling
        reproducible per actor independently of the global RNG; ``deterministic``
        returns the mode (argmax of the logits / the Gaussian mean).

        Returns ``action`` as int64 ``[B]`` (Discrete) or float32 ``[B, act_dim]``
        (Box; the raw, *unclipped* Gaussian sample -- clipping to the env's bounds
        is the caller's job, and the log-probability is of this unclipped sample, so
        it matches :meth:`evaluate_actions` on the stored action), and ``log_prob``
        and ``value`` as float ``[B]``.
        """
        params, value = self(obs)
        if self.discrete:
            log_p = F.log_softmax(params, dim=-1)
            if deterministic:
                action = params.argmax(dim=-1)
            else:
                # Gumbel-max: argmax(logits + G), G = -log(E), E ~ Exp(1), is an exact
                # sample of softmax(logits) and ~2.5x cheaper than torch.multinomial.
                e = torch.empty_like(params).exponential_(generator=generator)
                action = (params - e.log()).argmax(dim=-1)
            log_prob = log_p.gather(-1, action.unsqueeze(-1)).squeeze(-1)
            return action, log_prob, value
        # With a = mu + sigma * z, the log-density is -z^2/2 - log sigma - log sqrt(2 pi)
        # per dimension; using z directly saves recomputing (a - mu) / sigma (the two
        # agree to float rounding, ~1e-7).
        log_norm = self.log_std.sum() + _LOG_SQRT_2PI * self.action_dim
        if deterministic:
            return params.clone(), (-log_norm).expand(params.shape[0]).clone(), value
        noise = torch.randn(
            params.shape, generator=generator, dtype=params.dtype, device=params.device
        )
        action = torch.addcmul(params, self.log_std.exp(), noise)
        log_prob = noise.square().sum(dim=-1).mul_(-0.5).sub_(log_norm)
        return action, log_prob, value

    # -- learner --------------------------------------------------------------------

    def evaluate_actions(
        self, obs: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-probability, entropy and value of given actions, ``[B]`` each, with grad.

        The learner's forward pass for the PPO loss; it evaluates the same densities
        :meth:`act` samples from (their log-probs agree to float rounding).
        ``actions`` is ``[B]`` (Discrete; any integer or integral float dtype) or
        ``[B, act_dim]`` (Box; unclipped samples).
        """
        params, value = self(obs)
        if self.discrete:
            log_p = F.log_softmax(params, dim=-1)
            index = actions.reshape(-1, 1).long()
            log_prob = log_p.gather(-1, index).squeeze(-1)
            entropy = -(log_p.exp() * log_p).sum(dim=-1)
            return log_prob, entropy, value
        log_std = self.log_std.expand_as(params)
        actions = actions.reshape(params.shape).to(params.dtype)
        log_prob = _gaussian_log_prob(actions, params, log_std)
        entropy = (0.5 + _LOG_SQRT_2PI + log_std).sum(dim=-1)
        return log_prob, entropy, value


def build_policy(
    observation_space: gymnasium.Space, action_space: gymnasium.Space, cfg: PolicyConfig
) -> Policy:
    """Build the actor-critic for an environment's spaces.

    The architecture is a function of the spaces and ``cfg`` alone, which is what
    lets an actor build a network identical to the learner's from the run config
    and then load broadcast weights into it.

    ``cfg.policy_type`` ``lstm`` / ``gru`` builds a
    :class:`~zmq_rl.rl.networks.RecurrentActorCritic`. Otherwise a float ``Box``
    observation with a ``Discrete`` (from 0) or 1-D ``Box`` action builds the
    :class:`ActorCritic` MLP, and every other supported combination a
    :class:`~zmq_rl.rl.networks.StructuredActorCritic`: observations ``Box``,
    ``Discrete``, ``MultiDiscrete``, ``MultiBinary`` and ``Dict`` / ``Tuple`` of
    those; actions ``Discrete``, ``MultiDiscrete``, ``MultiBinary`` or ``Box``
    (policy actions: 0-based indices, see :func:`zmq_rl.wire.spaces.env_actions`).
    Anything else raises :class:`ValueError` naming the space.

    With ``cfg.factory`` set (``"package.module:callable"``) the callable builds the
    network instead: ``callable(observation_space, action_space, cfg) -> nn.Module``
    following the interface checked by :func:`check_policy_interface`.
    """
    if cfg.factory:
        module = load_factory(cfg.factory)(observation_space, action_space, cfg)
        check_policy_interface(module, cfg.factory)
        return module
    from .networks import RecurrentActorCritic, StructuredActorCritic

    if cfg.policy_type in ("lstm", "gru"):
        return RecurrentActorCritic(observation_space, action_space, cfg)
    # A float Box (not an image) with a Discrete or 1-D Box action; integer boxes go to
    # the structured network, which normalises float parts only.
    dims = mlp_dims(observation_space, action_space, cfg)
    if dims is not None:
        return ActorCritic(*dims, cfg)
    return StructuredActorCritic(observation_space, action_space, cfg)


def policy_from_welcome(welcome: Welcome, policy_id: str = "") -> Policy:
    """Build the learner's network from a :class:`~zmq_rl.wire.protocol.Welcome` and load
    its weights: what an embedding actor needs to start acting (``policy_id``: that
    policy of a several-policy run, from ``policies`` and ``policy_weights``)."""
    settings = welcome.settings
    policy = build_policy(
        settings.observation_space, settings.action_space, policy_config_from(settings, policy_id)
    )
    weights = welcome.weights
    if policy_id:
        weights = next(w for w in welcome.policy_weights if w.policy == policy_id)
    import_weights(policy, weights.tensors)
    policy.eval()
    return policy


@runtime_checkable
class Policy(Protocol):
    """What the learner and the actors need of a network (a ``torch.nn.Module``):
    :class:`ActorCritic` is one, a ``--factory`` may return another.

    Everything in its ``state_dict`` is broadcast to actors (parameters and persistent
    buffers). Optional: ``update_obs_stats(obs_batch)``, called by the learner on every
    rollout before the update.

    A recurrent policy (``state_size > 0``) has :data:`RECURRENT_METHODS`
    (``initial_state``, ``act_recurrent``, ``evaluate_sequence``) instead; see
    :class:`zmq_rl.rl.networks.RecurrentActorCritic` and docs/embedding.md.
    """

    def act(
        self,
        obs: torch.Tensor,
        generator: torch.Generator | None = None,
        deterministic: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample (or, deterministic, take the mode of) actions: (action, log_prob, value)."""
        ...

    def evaluate_actions(
        self, obs: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(log_prob, entropy, value) of given actions, with grad."""
        ...

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """State values ``V(obs)``, ``[B]``."""
        ...


_POLICY_METHODS = tuple(
    name for name, member in vars(Policy).items() if callable(member) and not name.startswith("_")
)


class FactoryError(ConfigError):
    """A ``--factory`` that cannot serve as a policy (a config error of field ``factory``)."""

    def __init__(self, spec: str, reason: str) -> None:
        super().__init__("factory", spec, reason)


def load_factory(spec: str):  # -> Callable[..., nn.Module]
    """Import ``"package.module:callable"``; :class:`FactoryError` on failure.

    The working directory is searched last (as ``python -m`` would search it
    first): a console script's ``sys.path`` starts at its own bin folder, and a user
    running ``zmq-learner --factory my_policy:make`` from their project expects their
    ``my_policy.py`` to be found, while an installed package of the same name wins.
    """
    import importlib
    import os
    import sys

    module_name, _, attr = spec.partition(":")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise FactoryError(spec, f"cannot import {module_name!r}: {exc}") from exc
    factory = getattr(module, attr, None)
    if factory is None or not callable(factory):
        raise FactoryError(spec, f"{module_name} has no callable {attr!r}")
    return factory


RECURRENT_METHODS = ("initial_state", "act_recurrent", "evaluate_sequence")
"""What a recurrent policy (``state_size > 0``) needs instead of :class:`Policy`'s
methods (docs/embedding.md, "Custom policies")."""


def check_policy_interface(module: object, spec: str) -> None:
    """Raise :class:`FactoryError` naming what ``module`` lacks to serve as a policy.

    A policy is an ``nn.Module`` that satisfies :class:`Policy`; a recurrent one
    (``state_size`` an int > 0) has :data:`RECURRENT_METHODS` instead.
    """
    if not isinstance(module, nn.Module):
        raise FactoryError(spec, f"returned {type(module).__name__}, not a torch.nn.Module")
    size = getattr(module, "state_size", 0)
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise FactoryError(
            spec, f"returned a module whose state_size is {size!r}, not an integer >= 0"
        )
    needed = RECURRENT_METHODS if size > 0 else _POLICY_METHODS
    if size == 0 and isinstance(module, Policy):
        return
    missing = [m for m in needed if not callable(getattr(module, m, None))]
    if missing:
        kind = "a recurrent policy" if size > 0 else "a policy"
        raise FactoryError(
            spec,
            f"returned {type(module).__name__}, which lacks "
            f"{', '.join(missing)}; {kind} needs {', '.join(needed)} "
            "(see docs/embedding.md, 'Custom policies')",
        )


# -- weights --------------------------------------------------------------------------


# numpy has no bfloat16; every other dtype a state_dict normally holds maps 1:1.
_TORCH_TO_NUMPY: dict[torch.dtype, np.dtype] = {
    torch.float64: np.dtype(np.float64),
    torch.float32: np.dtype(np.float32),
    torch.float16: np.dtype(np.float16),
    torch.int64: np.dtype(np.int64),
    torch.int32: np.dtype(np.int32),
    torch.int16: np.dtype(np.int16),
    torch.int8: np.dtype(np.int8),
    torch.uint8: np.dtype(np.uint8),
    torch.bool: np.dtype(np.bool_),
}


def _numpy_dtype(name: str, dtype: torch.dtype) -> np.dtype:
    try:
        return _TORCH_TO_NUMPY[dtype]
    except KeyError:
        raise WeightsMismatch(
            f"tensor {name!r} has dtype {dtype} with no numpy equivalent"
        ) from None


def export_weights(module: nn.Module) -> list[tuple[str, np.ndarray]]:
    """Snapshot a module's ``state_dict`` as ``(name, array)`` pairs, in order.

    Every array is a C-contiguous numpy *copy* on the CPU with the tensor's exact
    dtype and bits (float32 stays float32), so it can be framed by any transport
    without Python-object serialisation and is not changed by later optimiser
    steps. Works for modules on any device (tensors are moved with
    ``.detach().cpu()``).
    """
    out: list[tuple[str, np.ndarray]] = []
    for name, tensor in module.state_dict().items():
        _numpy_dtype(name, tensor.dtype)
        array = tensor.detach().cpu().numpy()
        out.append((name, np.array(array, copy=True, order="C")))
    return out


def check_weights(
    module: nn.Module,
    weights: Sequence[tuple[str, np.ndarray]],
    targets: Mapping[str, torch.Tensor] | None = None,
) -> dict[str, np.ndarray]:
    """Check that ``(name, array)`` pairs would load into ``module`` (by
    :func:`import_weights`), without touching it: the names exactly those of
    ``module.state_dict()`` (no missing, unexpected or duplicate one), each a numpy
    array of exactly the tensor's shape and dtype. No broadcasting and no reshaping:
    a scalar ``[]`` is not a ``[1]`` tensor, nor the reverse (docs/protocol.md
    section 4.2). Raises :class:`WeightsMismatch` naming the tensor and both shapes;
    returns the arrays by name. Callers validate this way before they move anything
    (an actor's version) so that a refused message changes nothing."""
    if targets is None:
        targets = module.state_dict()
    layout = {name: (tuple(t.shape), _numpy_dtype(name, t.dtype)) for name, t in targets.items()}
    return check_arrays(layout, weights)


def import_weights(module: nn.Module, weights: Sequence[tuple[str, np.ndarray]]) -> None:
    """Load ``(name, array)`` pairs (from :func:`export_weights`) into ``module`` in place.

    Strict and atomic: the names must be exactly those of ``module.state_dict()``
    (no missing, unexpected or duplicate ones) and each array must have the same
    shape and dtype as the module's tensor, else :class:`WeightsMismatch` names the
    tensor(s) and both shapes/dtypes and the module is left unchanged. Values are
    copied without grad into the existing tensors on the module's device, so
    optimiser references and the module's device stay valid. Never unpickles.
    """
    targets = module.state_dict()
    seen = check_weights(module, weights, targets)
    with torch.no_grad():
        for name, target in targets.items():
            array = seen[name]
            # from_numpy needs a writable, contiguous array (frames from a socket are
            # read-only); copy only when necessary.
            if not (array.flags.writeable and array.flags.c_contiguous):
                array = np.array(array, copy=True, order="C")
            target.copy_(torch.from_numpy(array))
