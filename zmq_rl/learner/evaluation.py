"""Deterministic evaluation of a policy on fresh gymnasium envs (no sockets), in this
process (:func:`evaluate_policy`) or off the training path (:class:`BackgroundEvaluator`)."""

from __future__ import annotations

import contextlib
import functools
import json
import multiprocessing as mp
import signal
import sys
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from ..config import PolicyConfig
from ..envs import EnvStepper, build_env, env_shape, import_callable
from ..envs.multi_agent import agent_spaces, is_turn_based
from ..envs.seeding import env_seeds
from ..envs.stepping import steps_wait
from ..rl.device import import_torch, set_compute_threads
from ..rl.installs import TorchMissing, torch_installed
from ..rl.masking import check_observation_mask, random_allowed_action
from ..rl.numpy_mlp import NumpyMLP, mlp_dims, rng_of
from ..rl.numpy_nets import NumpyNetwork
from ..rl.weights import is_recurrent
from ..wire.spaces import batch_obs, env_actions

if TYPE_CHECKING:
    from ..rl.policy import Policy

NUMPY_NETWORKS = (NumpyMLP, NumpyNetwork)
"""Networks that act in numpy (:mod:`zmq_rl.rl.numpy_nets`): evaluated without torch."""


def evaluate_policy(
    policy: Policy | NumpyMLP | NumpyNetwork | Sequence[Any],
    env_id: str,
    episodes: int,
    seed: int = 0,
    env_kwargs: Mapping[str, Any] | None = None,
    wrappers: Sequence[str] = (),
    deterministic: bool = True,
    opponent: str | Policy = "random",
    by_agent: dict[int, float] | None = None,
    outcomes: dict[int, dict[str, int]] | None = None,
    episodes_played: list[tuple[float, int]] | None = None,
) -> tuple[float, float]:
    """Mean and std of the return of ``episodes`` deterministic episodes
    (``deterministic`` False: actions sampled from the policy, seeded by ``seed``
    without touching the caller's torch RNG; for envs where the mode gets stuck).

    All episodes run in lockstep (one env each, one batched forward per step), so
    evaluating 20 CartPole episodes costs about as many forwards as one episode.
    Actions are the policy's mode (argmax / mean), clipped to Box bounds
    (:func:`zmq_rl.wire.spaces.env_actions`); a recurrent policy carries its state per
    episode from zeros. The envs are built by :func:`~zmq_rl.envs.make_env` with
    ``env_kwargs`` and ``wrappers``. A multi-agent env's episode scores the mean
    return of its agents, each acted for by ``policy`` (:func:`_evaluate_agents`);
    ``policy`` may then be a list of one policy per agent index (a run of several
    policies: each agent acts by its own). A turn-based game's other seats are
    played by ``opponent`` (:func:`opponent_player`). ``by_agent`` (a dict to fill;
    multi-agent envs) gets each agent index's mean return: its agent's, or the
    policy's in that seat of a turn-based game. ``outcomes`` (a dict to fill;
    turn-based games) gets each seat's ``{"wins": W, "draws": D, "losses": L}`` of
    the policy, read from the sign of its return in each game (+1 / 0 / -1 in
    PettingZoo's classic games). ``episodes_played`` (a list to fill; multi-agent
    envs) gets each episode's ``(score, length)``, its length the env steps (moves,
    in a turn-based game) it took.

    The plain MLP's mode is computed in numpy (:func:`~zmq_rl.rl.numpy_mlp.mode_mlp`),
    whether ``policy`` is its torch module or a torch-free
    :class:`~zmq_rl.rl.numpy_mlp.NumpyMLP` (the background evaluator's), so both score
    a policy alike. ``policy`` may be any numpy network (:data:`NUMPY_NETWORKS`,
    ``zmq-rl eval`` on a host without torch): then torch is not imported.
    """
    envs = [build_env(env_id, env_kwargs, wrappers) for _ in range(episodes)]
    by_agent = {} if by_agent is None else by_agent
    played = episodes_played
    policies = list(policy) if isinstance(policy, Sequence) else [policy]
    if all(isinstance(p, NUMPY_NETWORKS) for p in policies):  # torch is not imported
        with _numpy_streams(policies, seed, deterministic):
            return _evaluate(
                policy, envs, seed, deterministic, opponent, by_agent, outcomes, played
            )
    import torch

    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return _evaluate(policy, envs, seed, deterministic, opponent, by_agent, outcomes, played)


def _evaluate(
    policy: Any,
    envs: list[Any],
    seed: int,
    deterministic: bool,
    opponent: str | Policy,
    by_agent: dict[int, float],
    outcomes: dict[int, dict[str, int]] | None,
    played: list[tuple[float, int]] | None,
) -> tuple[float, float]:
    """:func:`evaluate_policy` on built envs, by the kind of env (``played``: its
    ``episodes_played``)."""
    if is_turn_based(envs[0]):
        return _evaluate_turns(
            policy, envs, seed, deterministic, opponent, by_agent, outcomes, played
        )
    if not isinstance(envs[0], gym.Env):
        return _evaluate_agents(policy, envs, seed, deterministic, by_agent, played)
    return _evaluate_envs(policy, envs, seed, deterministic)


@contextlib.contextmanager
def _numpy_streams(policies: list[Any], seed: int, deterministic: bool) -> Any:
    """Numpy networks that sample (``deterministic`` False) draw from a stream of ``seed``
    for the evaluation's duration, and go on with their own afterwards (as the torch
    path forks torch's)."""
    if deterministic:
        yield
        return
    streams = [p.rng for p in policies]
    for i, p in enumerate(policies):
        p.rng = rng_of(seed + i)
    try:
        yield
    finally:
        for p, stream in zip(policies, streams, strict=True):
            p.rng = stream


def _act(
    policy: Policy | NumpyMLP,
    observations: list[Any],
    spaces: tuple[gym.Space, gym.Space],
    state: Any,
    rows: list[int],
    deterministic: bool,
) -> np.ndarray:
    """The env actions of ``policy`` for ``observations`` (a recurrent policy acts from
    ``state[rows]``, which it then advances). An ``action_mask`` that allows nothing is
    the env's error, as on the actors."""
    obs_space, space = spaces
    raw = batch_obs(obs_space, observations)
    check_observation_mask(obs_space, space, raw, "evaluation observation")
    if isinstance(policy, NUMPY_NETWORKS):
        return env_actions(space, _numpy_actions(policy, raw, state, rows, deterministic))
    from ..rl.numpy_act import numpy_act_support, numpy_mode

    if deterministic and state is None and numpy_act_support(policy) is None:
        return env_actions(space, numpy_mode(policy, raw))
    from ..rl.networks import obs_tensor

    batch = obs_tensor(raw)
    if state is not None:
        actions, _, _, next_state = policy.act_recurrent(
            batch, state[rows], deterministic=deterministic
        )
        state[rows] = next_state
    else:
        actions, _, _ = policy.act(batch, deterministic=deterministic)
    return env_actions(space, actions.numpy())


def _numpy_actions(
    net: Any, raw: Any, state: Any, rows: list[int], deterministic: bool
) -> np.ndarray:
    """A numpy network's policy actions for ``raw``: its mode, or a sample; a recurrent
    one acts from ``state[rows]``, which it then advances."""
    if net.state_size:
        if deterministic:
            actions, next_state = net.mode_recurrent(raw, state[rows])
        else:
            actions, _, _, next_state = net.act_recurrent(raw, state[rows])
        state[rows] = next_state
        return actions
    return net.mode(raw) if deterministic else net.act(raw)[0]


def _evaluate_envs(
    policy: Policy | NumpyMLP, envs: list[gym.Env], seed: int, deterministic: bool
) -> tuple[float, float]:
    """:func:`evaluate_policy` on single-agent envs, one episode each. Closes them."""
    episodes = len(envs)
    obs = [env.reset(seed=s)[0] for env, s in zip(envs, env_seeds(seed, episodes), strict=True)]
    returns = np.zeros(episodes, np.float64)
    active = list(range(episodes))
    space = envs[0].action_space
    obs_space = envs[0].observation_space
    scalar = isinstance(space, gym.spaces.Discrete)
    recurrent = is_recurrent(policy)
    state = policy.initial_state(episodes) if recurrent else None
    was_training = getattr(policy, "training", None)  # None: a NumpyMLP (no modes)
    if was_training is not None:
        policy.eval()
    stepper = EnvStepper(envs)  # envs that wait step together (zmq_rl.envs.stepping)
    try:
        while active:
            raw = [obs[i] for i in active]
            actions = _act(policy, raw, (obs_space, space), state, active, deterministic)
            moves = [actions[k].item() if scalar else actions[k] for k in range(len(active))]
            still = []
            for i, (o, reward, terminated, truncated, _) in zip(
                active, stepper.step(moves, active, _step), strict=True
            ):
                obs[i] = o
                returns[i] += float(reward)
                if not (terminated or truncated):
                    still.append(i)
            active = still
    finally:
        stepper.close()
        if was_training is not None:
            policy.train(was_training)
        for env in envs:
            env.close()
    return float(returns.mean()), float(returns.std())


def _step(env: gym.Env, action: Any) -> tuple[Any, ...]:
    """One step of an evaluation episode (no reset: an ended episode stops)."""
    return env.step(action)


def _evaluate_agents(
    policy: Policy | Sequence[Policy],
    envs: list[Any],
    seed: int,
    deterministic: bool,
    by_index: dict[int, float],
    played: list[tuple[float, int]] | None = None,
) -> tuple[float, float]:
    """Mean and std over ``envs`` (one episode each, in lockstep) of the mean return
    of each episode's agents: every live agent acts by the policy (its mode when
    ``deterministic``), a recurrent policy's state is carried per agent from zeros.
    ``by_index`` gets each agent index's mean return over the episodes it took part
    in. Closes the envs."""
    obs_space, space, agents = agent_spaces(envs[0], "evaluation env")
    slot_of = {agent: i for i, agent in enumerate(agents)}
    k, scalar = len(agents), isinstance(space, gym.spaces.Discrete)
    by_agent = _per_agent(policy, k)
    recurrent = is_recurrent(by_agent[0])  # several policies are feed-forward
    state = by_agent[0].initial_state(len(envs) * k) if recurrent else None
    returns = np.zeros((len(envs), k), np.float64)
    seen = np.zeros((len(envs), k), bool)  # agents that took part in each episode
    lengths = np.zeros(len(envs), np.int64)
    obs = [env.reset(seed=s)[0] for env, s in zip(envs, env_seeds(seed, len(envs)), strict=True)]
    was_training = _eval_modes(by_agent)
    try:
        while True:
            cells = [(e, agent) for e, env in enumerate(envs) for agent in env.agents]
            cells = [(e, agent) for e, agent in cells if agent in obs[e]]
            if not cells:
                break
            chosen: list[dict[Any, Any]] = [{} for _ in envs]
            for acting in {id(p): p for p in by_agent}.values():
                mine = [c for c in cells if by_agent[slot_of[c[1]]] is acting]
                if not mine:
                    continue
                raw = [obs[e][agent] for e, agent in mine]
                rows = [e * k + slot_of[agent] for e, agent in mine]
                actions = _act(acting, raw, (obs_space, space), state, rows, deterministic)
                for (e, agent), action in zip(mine, actions, strict=True):
                    chosen[e][agent] = action.item() if scalar else action
            for e, env in enumerate(envs):
                if not chosen[e]:
                    continue
                obs[e], rewards, _, _, _ = env.step(chosen[e])
                lengths[e] += 1
                for agent, reward in rewards.items():
                    returns[e, slot_of[agent]] += float(reward)
                    seen[e, slot_of[agent]] = True
    finally:
        _restore_modes(by_agent, was_training)
        for env in envs:
            env.close()
    scores = (returns * seen).sum(axis=1) / np.maximum(seen.sum(axis=1), 1)
    for i in np.flatnonzero(seen.any(axis=0)):
        by_index[int(i)] = float(returns[seen[:, i], i].mean())
    if played is not None:
        played.extend((float(s), int(n)) for s, n in zip(scores, lengths, strict=True))
    return float(scores.mean()), float(scores.std())


def _evaluate_turns(
    policy: Policy | Sequence[Policy],
    envs: list[Any],
    seed: int,
    deterministic: bool,
    opponent: str | Policy = "random",
    by_seat: dict[int, float] | None = None,
    outcomes: dict[int, dict[str, int]] | None = None,
    played: list[tuple[float, int]] | None = None,
) -> tuple[float, float]:
    """A turn-based game's evaluation: episode ``i`` (one per env) seats the policy as
    possible agent ``i % agents`` and every other seat is played by ``opponent``
    (:func:`opponent_player`; by default uniformly random legal moves), seeded; the
    score is the policy's return (in a zero-sum game: +1 win, 0 draw, -1 loss, as
    the game pays). Mean and std over the episodes (``by_seat`` gets each seat's,
    ``outcomes`` each seat's wins, draws and losses by the sign of the score).
    Closes the envs."""
    by_seat = {} if by_seat is None else by_seat
    obs_space, space, agents = agent_spaces(envs[0], "evaluation env")
    other = opponent_player(opponent, obs_space, space, deterministic)
    rng = np.random.default_rng(seed)
    scalar = isinstance(space, gym.spaces.Discrete)
    scores = np.zeros(len(envs), np.float64)
    moves = np.zeros(len(envs), np.int64)
    by_agent = _per_agent(policy, len(agents))
    was_training = _eval_modes(by_agent)
    try:
        for i, (env, episode_seed) in enumerate(zip(envs, env_seeds(seed, len(envs)), strict=True)):
            seat, acting = agents[i % len(agents)], by_agent[i % len(agents)]
            env.reset(seed=episode_seed)
            for agent in env.agent_iter():
                obs, reward, terminated, truncated, _ = env.last()
                if agent == seat:
                    scores[i] += float(reward)
                if terminated or truncated:
                    env.step(None)
                    continue
                moves[i] += 1
                if agent == seat:
                    action = _act(acting, [obs], (obs_space, space), None, [], deterministic)[0]
                    env.step(action.item() if scalar else action)
                else:
                    env.step(other(obs, rng))
    finally:
        _restore_modes(by_agent, was_training)
        for env in envs:
            env.close()
    seats = np.arange(len(envs)) % len(agents)
    for seat in np.unique(seats):
        mine = scores[seats == seat]
        by_seat[int(seat)] = float(mine.mean())
        if outcomes is not None:
            outcomes[int(seat)] = {
                "wins": int((mine > 0).sum()),
                "draws": int((mine == 0).sum()),
                "losses": int((mine < 0).sum()),
            }
    if played is not None:
        played.extend((float(s), int(n)) for s, n in zip(scores, moves, strict=True))
    return float(scores.mean()), float(scores.std())


def opponent_player(
    spec: str | Policy,
    observation_space: gym.Space,
    action_space: gym.Space,
    deterministic: bool = True,
) -> Callable[[Any, np.random.Generator], Any]:
    """The player of a turn-based game's other seats in evaluations
    (``--eval-opponent``), a callable ``(observation, rng) -> action``:

    * ``"random"``: uniformly random legal moves (the ``action_mask``);
    * ``"policy:PATH"``: a saved policy (``policy.pt``, ``policy-best.pt``,
      ``policy-<id>.pt``: a chosen snapshot of a run), acting by its mode (sampled
      when ``deterministic`` is False);
    * ``"module.path:name"``: a scripted player, such as connect four's
      ``zmq_rl.envs.baselines:one_ply_move``.

    A network (a :class:`~zmq_rl.rl.policy.Policy`, e.g. a checkpoint's) plays as a
    snapshot does. A file that is no policy of these spaces, or a player that does
    not import, is a :class:`~zmq_rl.config.ConfigError` naming ``eval_opponent``."""
    from ..config import ConfigError

    spaces = (observation_space, action_space)
    if not isinstance(spec, str):
        return _network_player(spec, spaces, deterministic)
    if spec == "random":
        return lambda obs, rng: _random_legal(obs, action_space, rng)
    if not spec.startswith("policy:"):
        return import_callable(spec, "eval_opponent")
    path = spec.removeprefix("policy:")
    if not torch_installed():  # a host without torch: the file's network in numpy
        from ..rl.policy_file import PolicyFileError, numpy_policy, read_saved_policy

        try:
            net: Any = numpy_policy(read_saved_policy(path), observation_space, action_space)
        except (PolicyFileError, TorchMissing, ValueError) as exc:
            raise ConfigError(
                "eval_opponent", spec, f"not a policy file of this env's spaces: {exc}"
            ) from None
        return _network_player(net, spaces, deterministic)
    import torch

    from ..rl.policy import build_policy

    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except OSError as exc:
        raise ConfigError("eval_opponent", spec, f"cannot read it: {exc.strerror}") from None
    except Exception as exc:  # noqa: BLE001 - not a torch file, truncated, pickled objects
        raise ConfigError(
            "eval_opponent",
            spec,
            f"not a policy file (torch.load refused it: {type(exc).__name__}); give a "
            "policy.pt, policy-best.pt or policy-<id>.pt a run wrote",
        ) from None
    try:
        cfg = json.loads(saved["policy_config"])
        net = build_policy(
            observation_space,
            action_space,
            PolicyConfig(**{**cfg, "hidden_sizes": tuple(cfg["hidden_sizes"])}),
        )
        net.load_state_dict(saved["policy"])
    except (OSError, RuntimeError, KeyError, TypeError, ValueError) as exc:
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            "eval_opponent", spec, f"not a policy file of this env's spaces: {why}"
        ) from None
    return _network_player(net.eval(), spaces, deterministic)


def _network_player(
    net: Policy, spaces: tuple[gym.Space, gym.Space], deterministic: bool
) -> Callable[[Any, np.random.Generator], Any]:
    """A player that moves by ``net`` (its mode, or sampled)."""

    def snapshot(obs: Any, rng: np.random.Generator) -> Any:
        action = _act(net, [obs], spaces, None, [], deterministic)[0]
        return action.item() if np.ndim(action) == 0 else action

    return snapshot


def _eval_modes(policies: list[Any]) -> list[bool | None]:
    """Put torch modules in eval mode; their modes before (None: a numpy network)."""
    modes = [getattr(p, "training", None) for p in policies]
    for p, mode in zip(policies, modes, strict=True):
        if mode is not None:
            p.eval()
    return modes


def _restore_modes(policies: list[Any], modes: list[bool | None]) -> None:
    for p, mode in zip(policies, modes, strict=True):
        if mode is not None:
            p.train(mode)


def _per_agent(policy: Policy | Sequence[Policy], agents: int) -> list[Policy]:
    """The policy of each agent index: ``policy`` for all, or the list as given."""
    if isinstance(policy, Sequence):
        if len(policy) != agents:
            raise ValueError(f"{len(policy)} policies for {agents} agents")
        return list(policy)
    return [policy] * agents


def _random_legal(obs: Any, space: gym.Space, rng: np.random.Generator) -> Any:
    """A uniformly random action, among the allowed ones where ``obs`` has an
    ``action_mask`` (a Discrete action space)."""
    if isinstance(obs, dict) and "action_mask" in obs and isinstance(space, gym.spaces.Discrete):
        return int(rng.choice(np.flatnonzero(np.asarray(obs["action_mask"]))))
    space.seed(int(rng.integers(2**31)))
    return space.sample()


EVAL_LANES = 4
"""Snapshots the background evaluator evaluates at once when its env's steps wait (a
simulator's tick: an evaluation of a good CartPole policy at 10 ms a step lasts 5 s,
however many episodes run at once), so that evaluations keep pace with the learner;
one when they compute (more would only share the CPU)."""


class BackgroundEvaluator:
    """Evaluates snapshots of the policy in a separate, low-priority process, so that
    evaluation never stops the learner from training (nor takes the GIL from it).

    At most one snapshot is being evaluated (up to :data:`EVAL_LANES` when the env's
    steps wait: the process says how many when it starts); :meth:`submit` while they
    all run replaces the waiting one (the newest snapshot wins: an evaluation of old
    weights is worth less than a later one). :meth:`results` returns what finished, in
    submission order, each with the ``tag`` it was submitted with. The child process is
    started by :meth:`start` (the learner calls it when its run starts) or the first
    :meth:`submit`, runs with
    one torch thread at the learner's own priority (an evaluation that waits for
    idle CPU reports long after its snapshot, and a run that stops at a target
    return trains on meanwhile: docs/benchmarks.md §23), rebuilds the policy from
    the env's spaces and ``policy_cfg`` exactly as an actor does, and exits when
    :meth:`close` is called or the learner's end of the pipe closes.
    """

    def __init__(
        self,
        env_id: str,
        episodes: int,
        seed: int,
        policy_cfg: Any,
        env_kwargs: Mapping[str, Any] | None = None,
        wrappers: Sequence[str] = (),
        deterministic: bool = True,
        opponent: str = "random",
    ) -> None:
        self.env_id, self.episodes, self.seed = env_id, episodes, seed
        self.deterministic, self.opponent = deterministic, opponent
        self.env_kwargs, self.wrappers = dict(env_kwargs or {}), list(wrappers)
        self.policy_cfg = policy_cfg
        self._conn: Any = None
        self._process: Any = None
        self._in_flight = 0  # snapshots sent, not reported yet
        self._lanes = 1  # how many the process evaluates at once (it says so)
        self._waiting: tuple[Any, list[tuple[str, np.ndarray]]] | None = None
        self._used = False

    def start(self) -> None:
        """Start the child process now, if it is not running (:meth:`submit` starts it
        otherwise). The learner starts it when its run starts, so its imports
        (seconds of CPU) are done by the first evaluation instead of delaying it: on
        two busy cores the first result came ~30 updates after its snapshot. They
        share the CPU with the actors' start-up: on two cores the first update comes
        ~0.5 s later, the first results seconds sooner (docs/benchmarks.md §23)."""
        if self._process is None:
            self._start()

    def submit(self, tag: Any, weights: list[tuple[str, np.ndarray]]) -> None:
        """Evaluate ``weights`` (:func:`zmq_rl.rl.policy.export_weights` output) when the
        evaluator is free; ``tag`` comes back with the result."""
        self.start()
        self._used = True
        if self._in_flight >= self._lanes:
            self._waiting = (tag, weights)
        else:
            self._send(tag, weights)

    def drop_waiting(self) -> None:
        """Forget the snapshot waiting for its turn (the one running goes on)."""
        self._waiting = None

    def busy(self) -> bool:
        """Whether a snapshot is being evaluated or waits for its turn."""
        return self._in_flight > 0 or self._waiting is not None

    def results(self, timeout: float = 0.0) -> list[tuple[Any, float, float]]:
        """``(tag, mean, std)`` of the evaluations that finished (waiting up to
        ``timeout`` seconds for one); submits the waiting snapshot when one finished.
        RuntimeError when the evaluator process died."""
        done = []
        while self._in_flight and self._conn.poll(timeout):
            try:
                message = self._conn.recv()
            except EOFError:
                raise RuntimeError(
                    f"the evaluation process exited (code {self._process.exitcode})"
                ) from None
            if message[0] == "error":
                raise RuntimeError(f"evaluation failed in its process: {message[1]}")
            if message[0] == "lanes":
                self._lanes = int(message[1])
            else:
                done.append(message[1:])
                self._in_flight -= 1
                timeout = 0.0
            if self._waiting is not None and self._in_flight < self._lanes:
                self._send(*self._waiting)
                self._waiting = None
        return done

    def close(self) -> None:
        """Stop the child process (what it was evaluating is dropped)."""
        if self._process is not None:
            if not self._used:  # started with the run, never given work: no need to wait
                self._process.terminate()
            with contextlib.suppress(OSError):
                self._conn.send(None)
            self._process.join(5.0)
            if self._process.is_alive():
                self._process.terminate()
                self._process.join(5.0)
            self._conn.close()
            self._process = None

    def _start(self) -> None:
        from .checkpoint import config_dict

        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        env = (self.env_id, self.env_kwargs, self.wrappers)
        args = (child, env, self.episodes, self.seed, config_dict(self.policy_cfg))
        args += (self.deterministic, self.opponent)
        self._process = ctx.Process(target=_evaluate_forever, args=args, daemon=True)
        with _main_module_hidden(), _sigint_ignored():
            self._process.start()
        child.close()

    def _send(self, tag: Any, weights: list[tuple[str, np.ndarray]]) -> None:
        self._conn.send((tag, weights))
        self._in_flight += 1


@contextlib.contextmanager
def _sigint_ignored() -> Any:
    """Start a child that ignores SIGINT from its first instruction on.

    The evaluator is in the terminal's process group: Ctrl-C reaches it as well as
    the learner, and a ``KeyboardInterrupt`` traceback from it would read as a
    crash while the learner stops cleanly (and stops the evaluator: :meth:`close`).
    An ignored SIGINT is inherited across exec (Python keeps it ignored), so even
    the child's start-up imports are covered; from a thread other than the main
    one (where signal handlers cannot be changed) the child ignores it itself, a
    moment later (:func:`_evaluate_forever`).
    """
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is None  # set outside Python: not restorable
    ):
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def _main_module_hidden() -> Any:
    """Start a spawned child without re-running the ``__main__`` script in it.

    ``spawn`` normally imports the parent's main script (or ``-m`` module) in the
    child; a training script without an ``if __name__ == "__main__":`` guard (the
    Python API, a notebook's exported script) would then start a second run there.
    The child only needs :func:`_evaluate_forever`, which lives in this module.
    """
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    saved = {
        name: main.__dict__[name] for name in ("__file__", "__spec__") if name in main.__dict__
    }
    main.__dict__.pop("__file__", None)
    main.__dict__["__spec__"] = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


def _steps_wait(env: Any, seed: int) -> bool:
    """:func:`~zmq_rl.envs.stepping.steps_wait` with random actions the observation's
    ``action_mask`` allows (an env may refuse the others)."""
    rng = rng_of(seed)
    spaces = env.observation_space, env.action_space
    return steps_wait(env, act=lambda obs: random_allowed_action(*spaces, obs, rng))


def _evaluate_forever(
    conn: Any,
    env: tuple[str, dict, list],
    episodes: int,
    seed: int,
    policy: dict,
    deterministic: bool = True,
    opponent: str = "random",
) -> None:
    """The evaluator process: evaluate each snapshot received, send the result back.
    Ctrl-C is ignored: the learner stops this process (see :func:`_sigint_ignored`).

    The plain MLP's deterministic evaluation on a single-agent env runs in numpy
    (:class:`~zmq_rl.rl.numpy_mlp.NumpyMLP`) and this process never imports torch: at
    a run's launch, when the evaluator starts beside the learner and the actors, that
    is ~1.4 s of CPU they get instead (docs/benchmarks.md §23)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    set_compute_threads(1)
    policy_cfg = PolicyConfig(**{**policy, "hidden_sizes": tuple(policy["hidden_sizes"])})
    env_id, env_kwargs, wrappers = env
    shape = env_shape(env_id, env_kwargs, wrappers)
    dims = mlp_dims(shape.observation_space, shape.action_space, policy_cfg)
    numpy = dims is not None and deterministic and not shape.agents
    if not numpy:
        import_torch()  # with the one thread set above
    lanes = EVAL_LANES if not shape.agents and _steps_wait(build_env(*env), seed) else 1
    conn.send(("lanes", lanes))

    def network() -> tuple[Any, Callable[[Any], None]]:
        if numpy:
            net = NumpyMLP(dims, policy_cfg, rng_of(seed))
            return net, net.load
        from ..rl.policy import build_policy, import_weights

        net = build_policy(shape.observation_space, shape.action_space, policy_cfg)
        return net, functools.partial(import_weights, net)

    def run(net: Any, load: Callable[[Any], None], weights: Any) -> tuple[float, float]:
        load(weights)
        return evaluate_policy(
            net, env_id, episodes, seed, env_kwargs, wrappers, deterministic, opponent
        )

    free = [network() for _ in range(lanes)]
    running: deque[tuple[Any, Any, Any]] = deque()  # (tag, future, network), in order
    with ThreadPoolExecutor(lanes, thread_name_prefix="zmq-rl-eval") as pool:
        while True:
            if conn.poll(0.05 if running else None):
                try:
                    request = conn.recv()
                except EOFError:
                    return
                if request is None:
                    return
                tag, weights = request
                net = free.pop()  # the learner never has more than ``lanes`` in flight
                running.append((tag, pool.submit(run, *net, weights), net))
            while running and running[0][1].done():
                tag, future, net = running.popleft()
                free.append(net)
                try:
                    mean, std = future.result()
                except Exception as exc:  # noqa: BLE001 - reported to the learner
                    conn.send(("error", f"{type(exc).__name__}: {exc}"))
                    return
                conn.send(("done", tag, mean, std))
