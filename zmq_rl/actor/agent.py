"""``zmq_rl.Agent``: a simulator's whole actor side in three calls.

:class:`~zmq_rl.actor.client.ActorClient` is the low-level layer: the simulator loads
weights, checks the staleness valve, runs the policy and hands nine arrays to
``step``. An :class:`Agent` does all of that itself::

    with Agent("learner-host:5555", obs_space, act_space, num_envs=4) as agent:
        obs = sim.reset()
        while not agent.shutdown_requested:
            actions = agent.act(obs)                       # env actions, [4, ...]
            next_obs, rewards, terminated, truncated, final_obs = sim.step(actions)
            agent.observe(rewards, terminated, truncated, next_obs, final_obs)
            obs = next_obs

:meth:`Agent.act` serves control and loads the newest weights without blocking, waits
while the staleness valve says so (and only then), runs the learner's network (built
from the welcome; a recurrent one carries its state per slot, reset where an episode
ended), and returns the env's actions (``zmq_rl.wire.spaces.env_actions``: discrete
``start`` added, boxes clipped) while it records the policy's. :meth:`Agent.observe`
records the step. docs/embedding.md describes the contract.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self

import numpy as np

from ..rl.device import import_torch
from ..rl.installs import require_torch
from ..rl.masking import check_action_mask, mask_key, mask_nvec
from ..rl.numpy_mlp import NumpyMLP, rng_of
from ..rl.numpy_nets import NumpyNetwork, acting_network
from ..rl.weights import WeightsMismatch, policy_config_from
from ..wire.protocol import FEATURE_POLICIES, Weights, Welcome
from ..wire.spaces import Value, as_value, env_actions, map_value, wire_dtype
from .client import ActorClient
from .keepalive import KeepAlive

if TYPE_CHECKING:
    from ..rl.policy import Policy

__all__ = ["PAUSE_WAIT_S", "Agent", "Decision", "PolicyRunner", "coerce_value"]

log = logging.getLogger("zmq_rl.agent")

PAUSE_WAIT_S = 0.05
"""How long a paused agent blocks on SUB before re-checking control: short, so a
shutdown or a learner restart is noticed within a step's time."""


def coerce_value(space: Any, value: Any) -> Value:
    """``value`` (array-likes, nested like ``space``) as arrays of the dtypes that travel
    for ``space`` (a Box's own dtype; int64 indices; int8 binaries), so that float64
    observations of a float32 box are not refused. Shapes are left to the client's
    check, which names the slot and the field."""
    from gymnasium import spaces

    if isinstance(space, spaces.Dict):
        if not isinstance(value, Mapping):
            raise ValueError(f"observation: expected a dict with keys {list(space.spaces)}")
        return {k: coerce_value(s, value[k]) for k, s in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        if not isinstance(value, (tuple, list)) or len(value) != len(space.spaces):
            raise ValueError(f"observation: expected a tuple of {len(space.spaces)} parts")
        return tuple(coerce_value(s, v) for s, v in zip(space.spaces, value, strict=True))
    return np.asarray(value, wire_dtype(space))


def _tensors(value: Value) -> Any:
    import torch

    return map_value(lambda a: torch.from_numpy(np.ascontiguousarray(a)), value)


def _rows(obs: Value, rows: np.ndarray) -> Value:
    """Rows ``rows`` of every leaf of ``obs``."""
    return map_value(lambda a: a[rows], obs)


class PolicyRunner:
    """The learner's network on this side of the wire: built from a welcome, loaded
    with broadcast weights, run on batches of observations (with the recurrent state
    of every row for a policy whose ``state_size`` > 0). Shared by :class:`Agent` and
    the inference server (:mod:`zmq_rl.serving.serve`).

    Every shipped network -- the MLP, the structured and recurrent ones, the CNNs of
    the pixel presets and the board networks (:func:`~zmq_rl.rl.numpy_nets.numpy_network`)
    -- is held and run in numpy, and torch is not imported: an actor host needs no
    torch (``pip install zmq_rl``), starts ~1.4 s of CPU sooner and ~190 MB lighter,
    and a torch host samples exactly as a torch-free one for the same seed. Where
    torch is installed and faster (:data:`~zmq_rl.rl.numpy_nets.TORCH_FIRST`), or the
    network is a custom factory that only torch builds, the network is a torch module
    from the start; without torch a custom factory is refused with one line
    (:class:`~zmq_rl.rl.installs.TorchMissing`). The torch module of a numpy network
    is built from the current weights the first time :attr:`policy` is read, and from
    then on holds them (sampling goes on in numpy on its memory, with the same random
    stream)."""

    def __init__(self, welcome: Welcome, seed: int, policy_id: str = "") -> None:
        settings = welcome.settings
        self.policy_id = policy_id
        """Which policy of a several-policy run this is ("": the run's one policy)."""
        self.run_id = welcome.run_id
        self.version = welcome.weights.version
        self.observation_space = settings.observation_space
        self.action_space = settings.action_space
        self._seed = int(seed)
        self._cfg = policy_config_from(settings, policy_id)
        weights = welcome.weights
        if policy_id:
            weights = next(w for w in welcome.policy_weights if w.policy == policy_id)
        self._policy: Policy | None = None
        self._generator: Any = None
        self.net: NumpyNetwork | NumpyMLP | None = acting_network(
            self.observation_space, self.action_space, self._cfg, rng_of(self._seed)
        )
        """The network in numpy (None: a torch module acts, :attr:`policy`)."""
        self._numpy_holds = self.net is not None
        if self.net is not None:
            self.net.load(weights.tensors)
        else:
            self._build_torch(weights.tensors)
        size = self.net.state_size if self.net is not None else self.policy_state_size()
        if size != settings.state_size:
            raise ValueError(
                f"the policy built from the welcome has state_size {size}, the learner "
                f"announced state_size {settings.state_size}"
            )
        self.state_size = size

    def policy_state_size(self) -> int:
        """The torch module's ``state_size`` (0: feed-forward)."""
        return int(getattr(self.policy, "state_size", 0) or 0)

    @property
    def mlp(self) -> NumpyNetwork | NumpyMLP | None:
        """The numpy network while it holds the weights (no torch module was asked
        for); None after, or when a torch module acts."""
        return self.net if self._numpy_holds else None

    @property
    def policy(self) -> Policy:
        """The torch module of the network, with the newest loaded weights (for a numpy
        network built, and torch imported, the first time it is read)."""
        if self._policy is None:
            assert self.net is not None
            self._build_torch(self.net.named_arrays())
        assert self._policy is not None
        return self._policy

    @policy.setter
    def policy(self, policy: Policy) -> None:
        self._policy, self.net, self._numpy_holds = policy, None, False

    def _build_torch(self, tensors: list[tuple[str, np.ndarray]]) -> None:
        """Build the torch module, load ``tensors`` into it and let it hold the weights
        from now on; a numpy network goes on sampling (with the random stream it had)
        on the module's memory."""
        if self.net is not None:  # (without one, acting_network found torch installed)
            require_torch("the torch module of the network (Agent.policy)")
        import_torch()  # the actor's thread count applies (set_compute_threads)
        from ..rl.policy import build_policy, import_weights

        policy = build_policy(self.observation_space, self.action_space, self._cfg)
        import_weights(policy, tensors)
        policy.eval()
        if self.net is not None:
            self.net.bind({k: t.numpy() for k, t in policy.state_dict().items()})
        self._policy, self._numpy_holds = policy, False

    def check(self, tensors: list[tuple[str, np.ndarray]]) -> None:
        """Raise :class:`~zmq_rl.rl.weights.WeightsMismatch` unless ``tensors`` fit the
        network exactly (docs/protocol.md section 4.2)."""
        if self._numpy_holds:
            self.net.check(tensors)  # type: ignore[union-attr]
        else:
            from ..rl.policy import check_weights

            check_weights(self.policy, tensors)

    def named_weights(self) -> list[tuple[str, np.ndarray]]:
        """The current weights as ``(name, array)`` copies in ``state_dict`` order."""
        if self._numpy_holds:
            return self.net.named_arrays()  # type: ignore[union-attr]
        from ..rl.policy import export_weights

        return export_weights(self.policy)

    def load_tensors(self, tensors: list[tuple[str, np.ndarray]]) -> None:
        """Load ``(name, array)`` pairs, all or nothing (WeightsMismatch: none)."""
        if self._numpy_holds:
            self.net.load(tensors)  # type: ignore[union-attr]
        else:
            from ..rl.policy import import_weights

            import_weights(self.policy, tensors)

    def check_mask(self, obs: Value, where: str = "observation") -> None:
        """Refuse (:class:`~zmq_rl.rl.masking.ActionMaskError`, naming ``<where>.action_mask``
        and the slot) observations to act on whose ``action_mask`` allows no action in
        some row: the env is in error, and nothing is sampled or sent for it. A no-op
        for spaces without a mask."""
        if self._mask is not None:
            key, nvec = self._mask
            check_action_mask(obs[key], nvec, f"{where}.{key}")

    @functools.cached_property
    def _mask(self) -> tuple[str, np.ndarray] | None:
        """The observation's mask key and the action components' sizes, worked out
        once (None: the spaces have no mask)."""
        key = mask_key(self.observation_space, self.action_space)
        return None if key is None else (key, mask_nvec(self.action_space))

    def load(self, weights: Weights) -> bool:
        """Load ``weights`` when they are newer than the loaded ones; False (the old
        weights stay) when their tensors do not fit the network."""
        if weights.version <= self.version:
            return True
        try:
            self.load_tensors(weights.tensors)
        except WeightsMismatch as exc:
            log.warning("weights version %d do not fit the network: %s", weights.version, exc)
            return False
        self.version = weights.version
        return True

    def initial_state(self, batch: int) -> np.ndarray:
        """Zero recurrent states for ``batch`` rows (``[batch, 0]`` when feed-forward)."""
        return np.zeros((batch, self.state_size), np.float32)

    def act(
        self, obs: Value, state: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        """Sample actions for a batch: the policy's actions, log-probs, values and (a
        recurrent policy only) the next state of every row; ``state`` is the state each
        row acts from (rows of episodes that just began zeroed by the caller)."""
        net = self.net
        if net is not None:
            if not self.state_size:
                return (*net.act(obs), None)
            assert state is not None
            action, log_prob, value, next_state = net.act_recurrent(obs, state)  # type: ignore
            return action, log_prob, value, next_state.astype(np.float32)
        torch = import_torch()
        if self._generator is None:
            self._generator = torch.Generator().manual_seed(self._seed)
        with torch.inference_mode():
            obs_t = _tensors(obs)
            if self.state_size:
                assert state is not None
                action, log_prob, value, next_state = self.policy.act_recurrent(
                    obs_t, torch.from_numpy(state), self._generator
                )
                next_np = next_state.numpy().astype(np.float32, copy=True)
            else:
                action, log_prob, value = self.policy.act(obs_t, self._generator)
                next_np = None
        return action.numpy(), log_prob.numpy(), value.numpy(), next_np


@dataclass(frozen=True)
class Decision:
    """What :meth:`Agent.decide` chose for a batch of rows: ``env_actions`` to apply
    (discrete ``start`` added, boxes clipped), and what :meth:`Agent.record` needs of
    them later: the policy's ``actions``, ``values``, ``log_probs`` and the policy
    ``version`` that chose them."""

    env_actions: np.ndarray
    actions: np.ndarray
    values: np.ndarray
    log_probs: np.ndarray
    version: int


class Agent:
    """A simulator's actor: register, act, observe, close (the module's docstring).

    ``learner`` is ``HOST[:PORT]``; the spaces are gymnasium spaces, sent in the
    hello so the learner refuses a mismatch (None: take the learner's); ``num_envs``
    slots act in lockstep (0: the learner's ``num_envs``). ``seed`` seeds sampling
    (-1: the run's seed + 1 + the actor id, as the built-in actor). ``client_options``
    go to :class:`~zmq_rl.actor.client.ActorClient` (``env_id``, ``actor_id``, ``context``,
    ``register_timeout``, ``learner_timeout``, ``curve``, ...). The constructor
    registers (blocking up to ``register_timeout``) and raises what
    :meth:`ActorClient.register` raises; from the welcome on the agent heartbeats, on a
    thread until the first :meth:`act` (or :meth:`decide`), so the learner keeps the
    registration however long the networks and the simulator take to build.
    """

    def __init__(
        self,
        learner: str,
        observation_space: Any = None,
        action_space: Any = None,
        num_envs: int = 1,
        *,
        seed: int = -1,
        **client_options: Any,
    ) -> None:
        client_options.setdefault("env_id", "")
        # Weights that do not fit the network are refused before the client adopts
        # their version (docs/protocol.md section 4.2).
        client_options.setdefault("weights_check", self._check_weights)
        client_options.setdefault("features", [FEATURE_POLICIES])  # it runs several
        self._client = ActorClient(
            learner,
            observation_space=observation_space,
            action_space=action_space,
            num_envs=num_envs,
            **client_options,
        )
        self._keepalive: KeepAlive | None = None
        try:
            welcome = self._client.register()
            # Alive from the welcome on: a heartbeat now (the learner knows it is a live
            # actor building, not a bare hello), then on a thread while the networks (and
            # the caller's envs) are built, until the first use of the client
            # (docs/protocol.md §5.5).
            self._client.serve_control()
            self._keepalive = self._client.keepalive().start()
            settings = welcome.settings
            self.seed = int(seed) if seed >= 0 else settings.seed + 1 + self._client.actor_id
            self._build_runners(welcome)
        except BaseException:
            self._release()
            self._client.close()
            raise
        self.welcome = welcome
        self._pending: tuple[Value, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        self._recording = True
        log.info(
            "agent %d: %d slots, seed %d, policy version %d",
            *(self.actor_id, self.num_envs, self.seed, self.runner.version),
        )

    @property
    def client(self) -> ActorClient:
        """The connection (:class:`~zmq_rl.actor.client.ActorClient`). From the welcome
        until the first :meth:`act`, :meth:`decide`, :meth:`record`, :meth:`flush` or
        :meth:`close` a thread heartbeats on it while the caller builds its simulator
        (:class:`~zmq_rl.actor.keepalive.KeepAlive`); reading this property stops that
        thread first, so the caller may use the client from then on."""
        self._release()
        return self._client

    def _release(self) -> None:
        """Stop the keep-alive thread (if it runs): the client is this thread's again."""
        keepalive, self._keepalive = self._keepalive, None
        if keepalive is not None:
            keepalive.stop()

    def _build_runners(self, welcome: Welcome) -> None:
        """The networks of ``welcome``'s run: one, or one per policy (a several-policy
        run), and which of them acts for each slot (slot ``s`` is agent
        ``s % agents_per_env``, whose policy ``policy_map`` names)."""
        settings = welcome.settings
        ids = settings.policy_ids
        self.runners = {pid: PolicyRunner(welcome, self.seed + i, pid) for i, pid in enumerate(ids)}
        self.runner = next(iter(self.runners.values())) if ids else PolicyRunner(welcome, self.seed)
        slots = np.arange(self._client.num_envs)
        self._slot_runner = (
            np.asarray([ids.index(settings.policy_of_slot(int(s))) for s in slots], np.int64)
            if ids
            else None
        )
        self._state = self.runner.initial_state(self._client.num_envs)

    # ------------------------------------------------------------------ properties

    @property
    def num_envs(self) -> int:
        """The number of slots (the learner's ``num_envs`` when 0 was asked for)."""
        return self._client.num_envs

    @property
    def actor_id(self) -> int:
        """The id the learner's welcome gave this actor."""
        return self._client.actor_id

    @property
    def observation_space(self) -> Any:
        """The run's observation space (the learner's)."""
        return self.runner.observation_space

    @property
    def action_space(self) -> Any:
        """The run's action space (the learner's; :meth:`act` returns its values)."""
        return self.runner.action_space

    @property
    def settings(self) -> Any:
        """The welcome's :class:`~zmq_rl.wire.protocol.RunSettings`."""
        return self._client.settings

    @property
    def policy(self) -> Policy:
        """The local copy of the learner's network (always the newest loaded weights);
        in a several-policy run the first policy's (:attr:`policies` has each)."""
        return self.runner.policy

    @property
    def policies(self) -> dict[str, Policy]:
        """Each policy's local network by policy id (several-policy runs; ``{}``
        otherwise)."""
        return {pid: runner.policy for pid, runner in self.runners.items()}

    @property
    def shutdown_requested(self) -> bool:
        """Whether the learner said the run is over: stop stepping, then :meth:`close`."""
        return self._client.shutdown_requested

    @property
    def stats(self) -> dict[str, float]:
        """The client's counters (steps_sent, fragments_sent, ...; sent in the bye)."""
        return self._client.stats

    # ------------------------------------------------------------------ the loop

    def act(self, obs: Any) -> np.ndarray:
        """The env actions for ``obs`` (a value of the observation space with leading
        dimension ``num_envs``): ``[num_envs, ...]``.

        Serves control and loads the newest weights (never waits for them), then,
        while the staleness valve says wait (or the link is paused, or the learner
        restarted), waits for weights in :data:`PAUSE_WAIT_S` steps; that is the only
        time it blocks. After a shutdown request it still returns the policy's
        actions, but nothing more is recorded. Call :meth:`observe` with the step's
        outcome before the next ``act``.
        """
        if self._pending is not None:
            raise RuntimeError("act() called twice: observe() the previous step first")
        obs = self._ready_to_act(obs)
        state = self._state if self.runner.state_size else None
        if self._slot_runner is None:
            actions, log_probs, values, next_state = self.runner.act(obs, state)
        else:
            actions, log_probs, values = self._act_per_policy(obs, self._slot_runner)
            next_state = None
        self._pending = (obs, actions, values, log_probs, self._state)
        if next_state is not None:
            self._state = next_state
        return env_actions(self.action_space, actions)

    def observe(
        self,
        rewards: Any,
        terminated: Any,
        truncated: Any,
        next_obs: Any,
        final_obs: Mapping[int, Any] | None = None,
        valid: Any = None,
    ) -> None:
        """Record the outcome of the last :meth:`act`'s actions: ``rewards``,
        ``terminated``, ``truncated`` (``[num_envs]``), ``next_obs`` (the reset
        observation where an episode ended) and ``final_obs`` (``{slot: obs}``: the
        true last observation of each slot truncated and not terminated). A recurrent
        policy's state is zeroed for every slot whose episode ended.

        ``valid`` (multi-agent simulators; None: every slot) is False for each slot
        that held no live agent when :meth:`act` was called (its agent finished
        earlier in the episode, or none has taken the slot yet): its action was not
        used, its reward is 0 and it ends nothing; the learner leaves such rows out
        of training and of every count (docs/protocol.md section 4.1.4). Needs a
        learner whose welcome says ``agents_per_env`` > 1."""
        if self._pending is None:
            raise RuntimeError("observe() without act(): call act() first")
        obs, actions, values, log_probs, state = self._pending
        self._pending = None
        terminated = np.asarray(terminated, bool)
        truncated = np.asarray(truncated, bool)
        space = self.observation_space
        if self.runner.state_size:
            self._state[terminated | truncated] = 0.0
        if self.client.shutdown_requested:
            return
        self.client.step(
            obs,
            actions,
            np.asarray(rewards, np.float32),
            terminated,
            truncated,
            values,
            log_probs,
            coerce_value(space, as_value(next_obs)),
            {int(k): coerce_value(space, as_value(v)) for k, v in (final_obs or {}).items()},
            state if self.runner.state_size else None,
            **({} if valid is None else {"valid": valid}),
        )

    # -------------------------------------------- acting and recording apart

    def decide(self, obs: Any, slots: Any = None) -> Decision:
        """The policy's choice for a batch of observations (any number of rows, not
        necessarily ``num_envs``), **without recording anything**: for simulators in
        which the outcome of an action is known only later, such as turn-based games
        (an agent's reward arrives after the other players moved). Serves control,
        loads weights and waits on the staleness valve exactly as :meth:`act`. Record
        the rows with :meth:`record` once their outcomes are known. Feed-forward
        policies only (a recurrent state needs :meth:`act`'s per-slot bookkeeping).

        ``slots`` (one slot number per row) says whose rows they are: a run of
        several policies needs it, so that each row is decided by its slot's
        policy; :attr:`Decision.version` is then the oldest version among them."""
        if self.runner.state_size:
            raise RuntimeError("decide() needs a feed-forward policy; use act()/observe()")
        obs = self._ready_to_act(obs)
        if self._slot_runner is None:
            actions, log_probs, values, _ = self.runner.act(obs, None)
            version = self.runner.version
        else:
            if slots is None:
                raise ValueError(
                    "decide() in a run of several policies needs slots= (the slot of each "
                    "row), so that each row is decided by its agent's policy"
                )
            actions, log_probs, values = self._act_per_policy(
                obs, self._slot_runner[np.asarray(slots, np.int64)]
            )
            version = min(r.version for r in self.runners.values())
        return Decision(
            env_actions(self.action_space, actions), actions, values, log_probs, version
        )

    def _act_per_policy(
        self, obs: Value, owner: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Actions, log-probs and values of rows whose policies are ``owner`` (an index
        into :attr:`runners` per row): one batched forward per policy."""
        out: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        for i, runner in enumerate(self.runners.values()):
            rows = np.flatnonzero(owner == i)
            if not rows.size:
                continue
            mine = obs if rows.size == len(owner) else _rows(obs, rows)
            actions, log_probs, values, _ = runner.act(mine, None)
            if out is None:
                out = (
                    np.empty((len(owner), *actions.shape[1:]), actions.dtype),
                    np.empty(len(owner), np.float32),
                    np.empty(len(owner), np.float32),
                )
            out[0][rows], out[1][rows], out[2][rows] = actions, log_probs, values
        assert out is not None, "no rows to act on"
        return out

    def record(
        self,
        obs: Any,
        actions: Any,
        rewards: Any,
        terminated: Any,
        truncated: Any,
        values: Any,
        log_probs: Any,
        next_obs: Any,
        final_obs: Mapping[int, Any] | None = None,
        valid: Any = None,
        version: int | None = None,
    ) -> None:
        """Record one step of every slot (leading dimension ``num_envs``) whose actions
        came from :meth:`decide`: ``actions``, ``values`` and ``log_probs`` are the
        decision's (the *policy's* actions, not the env's), ``version`` the oldest
        :attr:`Decision.version` among the rows (a row is never tagged newer than the
        weights that chose it). The rest is as :meth:`observe`, ``valid`` included.
        Nothing is recorded after a shutdown request."""
        if self.client.shutdown_requested:
            return
        space = self.observation_space
        self.client.step(
            coerce_value(space, as_value(obs)),
            np.asarray(actions),
            np.asarray(rewards, np.float32),
            np.asarray(terminated, bool),
            np.asarray(truncated, bool),
            np.asarray(values, np.float32),
            np.asarray(log_probs, np.float32),
            coerce_value(space, as_value(next_obs)),
            {int(k): coerce_value(space, as_value(v)) for k, v in (final_obs or {}).items()},
            None,
            version=version,
            valid=valid,
        )

    def flush(self) -> None:
        """Send the partly filled fragments now (before stopping on your own)."""
        self.client.flush()

    def close(self, extra_stats: Mapping[str, float] | None = None) -> None:
        """Say bye (with :attr:`stats` plus ``extra_stats``) and close the sockets."""
        self.client.close(extra_stats)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _ready_to_act(self, obs: Any) -> Value:
        """Serve control and load the newest weights; wait while the valve (or a link
        pause, or a re-registration) says so; ``obs`` coerced to the space and its
        action mask checked."""
        client = self.client
        self._load(client.poll())
        while not client.shutdown_requested and client.should_pause():
            self._load(client.wait_for_weights(PAUSE_WAIT_S))
        obs = coerce_value(self.observation_space, as_value(obs))
        self.runner.check_mask(obs)
        return obs

    def _check_weights(self, weights: Weights) -> None:
        """Raise :class:`~zmq_rl.rl.weights.WeightsMismatch` when ``weights`` (of the
        current run) do not fit the network exactly (the client's ``weights_check``)."""
        runner = self._runner_of(weights)
        if runner is not None and weights.run_id == runner.run_id:
            runner.check(weights.tensors)

    def _runner_of(self, weights: Weights) -> PolicyRunner | None:
        """The network ``weights`` are for (None before the welcome, or for a policy
        this agent does not run)."""
        if weights.policy:
            return getattr(self, "runners", {}).get(weights.policy)
        return getattr(self, "runner", None)

    def _load(self, weights: Weights | None) -> None:
        """Load ``weights`` and every other policy's the client has ready (a
        several-policy run delivers one policy's weights per :meth:`ActorClient.poll`)."""
        while weights is not None:
            self._load_one(weights)
            weights = self.client.poll() if self.client.weights_ready() else None

    def _load_one(self, weights: Weights) -> None:
        if weights.run_id != self.runner.run_id and self.client.welcome is not None:
            # Registered again with a restarted learner: its network may differ.
            self.welcome = self.client.welcome
            self._build_runners(self.welcome)
            return
        runner = self._runner_of(weights)
        if runner is None or not runner.load(weights):
            self.client.reject_weights(weights, WeightsMismatch("weights do not fit the network"))
