"""Stepping several envs at once: one after another, or each in a thread of its own when
their steps wait (a simulator at a fixed tick, a socket, a remote service).

An env whose ``step`` sleeps or blocks on I/O releases the GIL, so ``n`` of them stepped
in threads cost one wait per step instead of ``n``; a CPU-bound env only pays the
threads' overhead (the GIL runs one at a time). :class:`EnvStepper` ``"auto"`` measures
which kind it has: it steps sequentially for its first :data:`PROBE_STEPS` steps (or
until they took :data:`PROBE_SECONDS`), and switches to threads when their wall time is
more than :data:`WAIT_RATIO` times the CPU time this thread spent in them *and* each
env's step waited :data:`MIN_WAIT_S` or more: on a busy CPU a process also waits for a
core (2 actors, a learner and an evaluator on 2 cores: a LunarLander step of 8 envs took
1.0-1.2 ms of wall time for 0.32 ms of CPU), but for a fraction of a millisecond per
env, not a simulator's tick (docs/benchmarks.md section 28 measures threads against
gymnasium's ``AsyncVectorEnv``, a process per env). The built-in actor and the
evaluator use it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import gymnasium as gym

__all__ = [
    "PROBE_SECONDS",
    "PROBE_STEPS",
    "STEP_MODES",
    "MIN_WAIT_S",
    "WAIT_RATIO",
    "EnvStepper",
    "Transition",
    "step_and_reset",
    "waited",
    "steps_wait",
]

log = logging.getLogger("zmq_rl.envs")

STEP_MODES = ("auto", "sequential", "threads")
"""How :class:`EnvStepper` steps its envs (``--step-envs``)."""
PROBE_STEPS = 16
"""Steps ``auto`` times before it decides."""
PROBE_SECONDS = 0.05
"""... or fewer, once they took this long (20 envs that wait 10 ms decide at once)."""
WAIT_RATIO = 2.0
"""``auto`` steps in threads when the probe's wall time is more than this many times its
CPU time (the rest of a step was spent waiting)..."""
MIN_WAIT_S = 0.001
"""... and each env's step waited this long or more (seconds; what a busy CPU adds to a
CPU-bound env's step is far less: see the module's doc)."""


def waited(wall: float, cpu: float, env_steps: int) -> bool:
    """Whether env steps that took ``wall`` seconds and ``cpu`` seconds of this thread's
    CPU, ``env_steps`` of them, waited (:data:`WAIT_RATIO`, :data:`MIN_WAIT_S`)."""
    waited = wall - cpu
    return wall > WAIT_RATIO * max(cpu, 1e-9) and waited >= MIN_WAIT_S * max(env_steps, 1)

Transition = tuple[Any, float, bool, bool, Any]
"""What a step returns per env: ``(obs, reward, terminated, truncated, final_obs)``,
with the env reset where the episode ended (``obs`` is then the reset observation and
``final_obs`` the episode's last one; None otherwise)."""


def steps_wait(
    env: gym.Env, steps: int = 5, act: Callable[[Any], Any] | None = None
) -> bool:
    """Whether ``env``'s steps wait (:data:`WAIT_RATIO`, :data:`MIN_WAIT_S`), from
    ``steps`` steps after a reset, each with the action ``act(obs)`` (default: a random
    one; the evaluator passes one its ``action_mask`` allows); the env is closed. The
    background evaluator asks, to evaluate several snapshots at once on a simulator
    that waits. An env that fails under the probe counts as one that does not wait (the
    evaluation proper then says what is wrong with it)."""
    act = act or (lambda _obs: env.action_space.sample())
    try:
        obs, _ = env.reset(seed=0)
        wall, cpu = time.perf_counter(), time.thread_time()
        for _ in range(steps):
            obs, _, terminated, truncated, _ = env.step(act(obs))
            if terminated or truncated:
                obs, _ = env.reset()
        return waited(time.perf_counter() - wall, time.thread_time() - cpu, steps)
    except Exception as exc:  # noqa: BLE001 - a probe; the evaluation itself reports errors
        log.info("could not time %s's steps (%s: %s): stepping it as one that does not wait",
                 env, type(exc).__name__, exc)  # fmt: skip
        return False
    finally:
        env.close()


def step_and_reset(env: gym.Env, action: Any) -> Transition:
    """Step ``env``; reset it where the episode ended (see :data:`Transition`)."""
    obs, reward, terminated, truncated, _ = env.step(action)
    final = None
    if terminated or truncated:
        final, (obs, _) = obs, env.reset()
    return obs, reward, terminated, truncated, final


class EnvStepper:
    """Steps a fixed list of envs, each with its action, in ``mode`` (one of
    :data:`STEP_MODES`). ``threads`` keeps one worker thread per env for its life;
    :meth:`close` stops them (not the envs)."""

    def __init__(self, envs: Sequence[gym.Env], mode: str = "auto") -> None:
        if mode not in STEP_MODES:
            raise ValueError(f"step mode {mode!r}: one of {', '.join(STEP_MODES)}")
        self.envs = list(envs)
        self.mode = mode if len(self.envs) > 1 or mode != "auto" else "sequential"
        self._pool: ThreadPoolExecutor | None = None
        self._probed = 0
        self._wall = self._cpu = 0.0
        if self.mode == "threads":
            self._start_threads()

    def step(
        self,
        actions: Sequence[Any],
        which: Sequence[int] | None = None,
        step: Callable[[gym.Env, Any], Any] = step_and_reset,
    ) -> list[Any]:
        """``step(env, action)`` for each env of ``which`` (default: all, in order)
        with its action; their results in that order."""
        envs = self.envs if which is None else [self.envs[i] for i in which]
        if self._pool is not None:
            return list(self._pool.map(step, envs, actions))
        wall, cpu = time.perf_counter(), time.thread_time()
        out = [step(env, action) for env, action in zip(envs, actions, strict=True)]
        if self.mode == "auto":
            self._probe(time.perf_counter() - wall, time.thread_time() - cpu)
        return out

    def _probe(self, wall: float, cpu: float) -> None:
        self._wall += wall
        self._cpu += cpu
        self._probed += 1
        if self._probed < PROBE_STEPS and self._wall < PROBE_SECONDS:
            return
        waits = waited(self._wall, self._cpu, self._probed * len(self.envs))
        log.info(
            "%d env(s): a step takes %.2f ms, %.2f ms of it on the CPU: stepping them %s",
            len(self.envs), 1e3 * self._wall / self._probed, 1e3 * self._cpu / self._probed,
            "in threads" if waits else "one after another",
        )  # fmt: skip
        self.mode = "threads" if waits else "sequential"
        if waits:
            self._start_threads()

    def _start_threads(self) -> None:
        self._pool = ThreadPoolExecutor(len(self.envs), thread_name_prefix="zmq-rl-env")

    def close(self) -> None:
        """Stop the worker threads (the envs stay open)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def __enter__(self) -> EnvStepper:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
