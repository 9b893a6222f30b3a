"""The experience side of an actor: the lockstep buffer, fragments, back-pressure.

:class:`ExperienceSender` turns recorded steps into :class:`~zmq_rl.wire.protocol.Fragment`
messages (each carrying a lockstep flush of a group of slots, ``[T, B]`` arrays, and
the registration's session token) on the actor's PUSH socket and applies the staleness valve
(:class:`~zmq_rl.wire.valve.ActorThrottle`). It knows nothing of the control channel:
when PUSH is full it calls the ``wait_for_room`` callback of its
:class:`~zmq_rl.actor.client.ActorClient`, which serves control and heartbeats and says
whether to keep waiting. No RL here: arrays are moved and counted, never read.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import zmq

from ..wire.protocol import Fragment, RunSettings, StepArrays, encode, slots_per_fragment
from ..wire.spaces import Value, as_value, map_value, value_problem
from ..wire.valve import ActorThrottle

__all__ = ["ExperienceSender", "LockstepBuffer"]


def _only_if_some_invalid(valid: np.ndarray) -> np.ndarray | None:
    """A copy of ``valid`` when some row is not valid; None (the wire's "all valid",
    sent as no field) otherwise."""
    return None if valid.all() else valid.copy()


class LockstepBuffer:
    """Preallocated ``[T, num_envs]`` step arrays that :meth:`ExperienceSender.step`
    fills one row at a time, plus each slot's final observations by row and the
    recurrent state each slot acted from at row 0 (``state_size`` > 0 only)."""

    def __init__(self, length: int, obs: Value, actions: Any, state_size: int = 0) -> None:
        actions = np.asarray(actions)
        num_envs = actions.shape[0]
        self.steps = StepArrays.allocate((length, num_envs), obs, actions, 1)
        self.next_obs = map_value(np.empty_like, obs)
        self.final: list[dict[int, Value]] = [{} for _ in range(num_envs)]
        self.state = np.zeros((num_envs, state_size), np.float32) if state_size else None
        self.valid = np.ones((length, num_envs), bool)  # rows of a live agent (multi-agent)
        self.size = 0

    def add(
        self,
        steps: StepArrays,
        final_obs: Mapping[int, Value] | None,
        state: Any = None,
        valid: Any = None,
    ) -> int:
        """Record one step of every slot (any array-likes of the right shapes); keep
        the final observation of each slot whose episode was truncated (and not
        terminated) in this step, and at row 0 the policy state the step acted from;
        ``valid`` (None: all) marks the slots whose row is a live agent's step.
        Returns how many slots ended an episode."""
        t = self.size
        self.steps.write(t, steps)
        self.valid[t] = True if valid is None else valid
        if t == 0 and self.state is not None:
            if state is None:
                raise ValueError(
                    "the learner's policy is recurrent (state_size "
                    f"{self.state.shape[1]}): step() needs the state each slot acted from"
                )
            self.state[...] = state
        terminated, truncated = self.steps.terminated[t], self.steps.truncated[t]
        if final_obs:
            for slot, last in final_obs.items():
                if truncated[slot] and not terminated[slot]:
                    self.final[slot][t] = map_value(np.array, as_value(last))
        self.size = t + 1
        return int(np.count_nonzero(terminated | truncated))

    def reset(self) -> None:
        """Forget the buffered rows (after they were sent)."""
        self.size = 0
        for entry in self.final:
            entry.clear()


class ExperienceSender:
    """Sends an actor's experience as fragments and keeps the per-slot counts.

    ``stats`` and ``rejects`` are the client's counters (shared, so the bye
    reports them); ``wait_for_room()`` is called while PUSH is at its HWM and
    returns False to give up on the fragment (the learner asked for shutdown or
    restarted).
    """

    def __init__(
        self,
        stats: dict[str, float],
        rejects: Counter[str],
        wait_for_room: Callable[[], bool],
        num_envs: int,
    ) -> None:
        self.stats = stats
        for key in ("steps_sent", "fragments_sent", "episodes_completed"):
            stats.setdefault(key, 0)
        self.rejects = rejects
        self.wait_for_room = wait_for_room
        self.num_envs = num_envs
        self.seq = 0  # next fragment's seq in this registration
        self.token = b""
        self.slot_steps = np.zeros(num_envs, np.int64)  # steps per slot since the welcome
        self.sent_steps = np.zeros(num_envs, np.int64)  # of those, sent (PUSH took them)
        self.throttle = ActorThrottle.disabled()
        self.fragment_length = 1
        self.state_size = 0
        self.group = 1  # slots per fragment
        self.observation_space: gym.Space | None = None
        self.actor_id = -1
        self.run_id = ""
        self.socket: zmq.Socket | None = None
        self.buffer: LockstepBuffer | None = None

    @property
    def last_seq(self) -> int:
        """The ``seq`` of the last fragment sent in this registration (-1: none)."""
        return self.seq - 1

    def start(
        self,
        socket: zmq.Socket,
        settings: RunSettings,
        *,
        actor_id: int,
        run_id: str,
        token: bytes,
        base_version: int,
        observation_space: gym.Space | None,
        action_space: gym.Space | None = None,
        grant: int | None = None,
    ) -> None:
        """Begin a registration: a new connected PUSH socket (the old one is closed),
        the welcome's settings, session token and grant (None: the valve follows
        ``steps_per_broadcast`` and ``max_lead_steps``); sequence numbers start at 0."""
        self.close(linger=0)
        self.num_envs = settings.num_envs
        self.seq = 0
        self.token = token
        self.slot_steps = np.zeros(self.num_envs, np.int64)
        self.sent_steps = np.zeros(self.num_envs, np.int64)
        self.throttle = ActorThrottle.from_settings(settings, base_version, grant)
        self.fragment_length = settings.fragment_length
        self.state_size = settings.state_size
        self.observation_space = observation_space
        self.group = (
            slots_per_fragment(observation_space, action_space, self.fragment_length)
            if observation_space is not None and action_space is not None
            else self.num_envs
        )
        self.actor_id, self.run_id = actor_id, run_id
        self.socket = socket
        self.buffer = None

    def rebase(self, base_version: int) -> None:
        """Adopt a later base version from the learner (its heartbeat's
        ``base_version``): the learner consumes this actor's slots from then on."""
        if base_version > self.throttle.base_version:
            self.throttle = dataclasses.replace(self.throttle, base_version=base_version)

    def regrant(self, grant: int) -> None:
        """Adopt a larger grant from the learner (its heartbeat's ``grant``): the steps
        per slot this registration may have recorded (docs/protocol.md section 5.4)."""
        self.throttle = self.throttle.regrant(grant)

    def close(self, linger: int | None = None) -> None:
        """Close the PUSH socket (``linger`` None: its own linger, so queued fragments
        still leave)."""
        if self.socket is not None:
            self.socket.close(linger=linger)
            self.socket = None

    def should_pause(self, version: int) -> bool:
        """Whether the valve says: wait for newer weights than ``version``.

        Counts the steps of the least-advanced slot, so a slot that lags can always
        catch up (the learner never waits on a paused slot). A pausing sender first
        flushes its partly filled fragments: the learner may need those rows before
        it can publish the version that lets the actor go on.
        """
        paused = self.throttle.should_pause(int(self.slot_steps.min()), version)
        if paused:
            self.flush(version)
        return paused

    def impossible_version(self, version: int) -> bool:
        """Whether weights of ``version`` prove that the learner consumed more from
        some slot than this actor sent on it since its welcome: it trained on without
        this actor, whose registration is therefore gone (:meth:`ActorThrottle.
        impossible_for_member`)."""
        if not self.sent_steps.size:
            return False
        return self.throttle.impossible_for_member(version, int(self.sent_steps.min()))

    def step(
        self,
        steps: StepArrays,
        next_obs: Value,
        final_obs: Mapping[int, Value] | None,
        version: int,
        state: Any = None,
        valid: Any = None,
    ) -> None:
        """Record one step of every slot (``valid``: which rows are live agents' steps,
        None: all); send the buffered rows of every slot once ``fragment_length``
        steps are buffered."""
        if self.buffer is None:
            self.buffer = LockstepBuffer(
                self.fragment_length, as_value(steps.obs), steps.actions, self.state_size
            )
        buffer = self.buffer
        self.stats["episodes_completed"] += buffer.add(steps, final_obs, state, valid)
        if type(buffer.next_obs) is np.ndarray:
            buffer.next_obs[...] = next_obs
        else:
            map_value(
                lambda mine, theirs: mine.__setitem__(Ellipsis, theirs), buffer.next_obs, next_obs
            )
        self.slot_steps += 1
        if buffer.size == self.fragment_length:
            self.flush(version)

    def flush(self, version: int) -> None:
        """Send whatever :meth:`step` has buffered: one fragment per group of slots
        (all of them unless the fragment would exceed about 1 MiB)."""
        buffer = self.buffer
        if buffer is None or buffer.size == 0:
            return
        rows = slice(0, buffer.size)
        for first in range(0, self.num_envs, self.group):
            cols = slice(first, min(self.num_envs, first + self.group))
            final = {
                (t, b): last
                for b, slot in enumerate(range(cols.start, cols.stop))
                for t, last in buffer.final[slot].items()
            }
            self.send(
                np.arange(cols.start, cols.stop),
                buffer.steps.select((rows, cols)),
                map_value(lambda a, c=cols: a[c], buffer.next_obs),
                final,
                version,
                None if buffer.state is None else buffer.state[cols],
                _only_if_some_invalid(buffer.valid[rows, cols]),
            )
        buffer.reset()

    def send_fragment(
        self,
        slot: int,
        steps: StepArrays,
        next_obs: Value,
        final_obs: Mapping[int, Value] | None,
        version: int,
        state: Any = None,
        valid: Any = None,
    ) -> None:
        """Send T >= 1 consecutive steps of one slot now (not through the buffer):
        a fragment of one slot, rows ``[T]`` widened to ``[T, 1]`` (``valid``: ``[T]``
        bool, None: every row valid)."""
        self.stats["episodes_completed"] += int((steps.terminated | steps.truncated).sum())
        self.slot_steps[slot] += steps.length
        column = steps.select((slice(None), np.newaxis))
        self.send(
            np.array([slot]),
            column,
            map_value(lambda a: np.asarray(a)[np.newaxis], as_value(next_obs)),
            {(int(t), 0): last for t, last in (final_obs or {}).items()},
            version,
            None if state is None else np.asarray(state, np.float32).reshape(1, -1),
            None if valid is None else _only_if_some_invalid(np.asarray(valid, bool)[:, None]),
        )

    def send(
        self,
        slots: np.ndarray,
        steps: StepArrays,
        next_obs: Value,
        final: Mapping[tuple[int, int], Value],
        version: int,
        state: np.ndarray | None = None,
        valid: np.ndarray | None = None,
    ) -> None:
        """Check and send one fragment of ``slots`` (``[T, B]`` rows; ``final`` maps
        ``(t, b)`` cells to final observations; ``valid``, ``[T, B]`` bool or None:
        which rows are live agents' steps); count it once PUSH took it."""
        if self.socket is None:
            raise RuntimeError("register() first")
        width = len(slots)
        cells = sorted(final)
        self.check_outgoing(slots, steps, cells, state)
        index = np.asarray([t * width + b for t, b in cells], np.int32)
        fragment = Fragment(
            **steps.step_arrays(),
            actor_id=self.actor_id,
            version=version,
            seq=self.seq,
            run_id=self.run_id,
            token=self.token,
            slots=slots.astype(np.int32),
            next_obs=next_obs,
            final_obs_index=index,
            final_obs=(
                map_value(lambda *rows: np.stack(rows), *(as_value(final[c]) for c in cells))
                if cells
                else map_value(lambda a: np.zeros((0, *a.shape[1:]), a.dtype), next_obs)
            ),
            state=state,
            sent_at=time.time(),
            valid=valid,
        )
        if not self._push(encode(fragment)):
            return
        self.seq += 1
        self.sent_steps[slots] += fragment.length
        self.stats["steps_sent"] += fragment.length * width
        self.stats["fragments_sent"] += 1

    def check_outgoing(
        self,
        slots: np.ndarray,
        steps: StepArrays,
        final_cells: list[tuple[int, int]],
        state: np.ndarray | None = None,
    ) -> None:
        """Raise ValueError, naming the slot, for what the learner would reject."""
        where = f"slot {int(slots[0])}" if len(slots) == 1 else f"slots {slots.tolist()}"
        space = self.observation_space
        if space is not None:
            problem = value_problem(space, as_value(steps.obs), "observations", 2)
            if problem:
                raise ValueError(
                    f"{where}: {problem}: they do not match the observation space {space} "
                    "(the learner would reject them)"
                )
        needs = np.argwhere(steps.truncated & ~steps.terminated)
        needs_cells = [(int(t), int(b)) for t, b in needs]
        if needs_cells != final_cells:
            rows = [t for t, _ in needs_cells]
            given = [t for t, _ in final_cells]
            raise ValueError(
                f"{where}: rows {rows} are truncated (not terminated) and need a final "
                f"observation each; got final_obs for rows {given}"
            )
        if (state is None) != (self.state_size == 0) or (
            state is not None and state.shape != (len(slots), self.state_size)
        ):
            raise ValueError(
                f"{where}: the learner's policy takes a recurrent state of {self.state_size} "
                f"floats per slot; got {None if state is None else list(state.shape)}"
            )

    def _push(self, frame: bytes) -> bool:
        """Send a fragment, waiting while PUSH is at its HWM (never dropping it);
        False only when ``wait_for_room`` gives up."""
        sock = self.socket
        assert sock is not None
        while True:
            try:
                sock.send(frame, zmq.NOBLOCK, copy=len(frame) < 65536)
                return True
            except zmq.Again:
                pass
            if not self.wait_for_room():
                return False
            sock.poll(100, zmq.POLLOUT)
