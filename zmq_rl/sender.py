"""The experience side of an actor: the lockstep buffer, fragments, back-pressure.

:class:`ExperienceSender` turns recorded steps into :class:`~zmq_rl.protocol.Fragment`
messages on the actor's PUSH socket and applies the staleness valve
(:class:`~zmq_rl.valve.ActorThrottle`). It knows nothing of the control channel:
when PUSH is full it calls the ``wait_for_room`` callback of its
:class:`~zmq_rl.client.ActorClient`, which serves control and heartbeats and says
whether to keep waiting. No RL here: arrays are moved and counted, never read.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import zmq

from .protocol import Fragment, RunSettings, StepArrays, encode
from .valve import ActorThrottle

__all__ = ["ExperienceSender", "LockstepBuffer"]


class LockstepBuffer:
    """Preallocated ``[T, num_envs]`` step arrays that :meth:`ExperienceSender.step`
    fills one row at a time, plus each slot's final observations by row."""

    def __init__(self, length: int, obs: Any, actions: Any) -> None:
        obs, actions = np.asarray(obs), np.asarray(actions)
        num_envs = obs.shape[0]
        self.steps = StepArrays.allocate(
            (length, num_envs), obs.shape[1:], obs.dtype, actions.shape[1:], actions.dtype
        )
        self.next_obs = np.empty_like(obs)
        self.final: list[dict[int, np.ndarray]] = [{} for _ in range(num_envs)]
        self.size = 0

    def add(self, steps: StepArrays, final_obs: Mapping[int, np.ndarray] | None) -> int:
        """Record one step of every slot (any array-likes of the right shapes); keep
        the final observation of each slot whose episode was truncated (and not
        terminated) in this step. Returns how many slots ended an episode."""
        t = self.size
        self.steps.write(t, steps)
        terminated, truncated = self.steps.terminated[t], self.steps.truncated[t]
        if final_obs:
            for slot, last in final_obs.items():
                if truncated[slot] and not terminated[slot]:
                    self.final[slot][t] = np.array(last)
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
        self.seq = np.zeros(num_envs, np.int64)  # next seq per slot, kept across registrations
        self.slot_steps = np.zeros(num_envs, np.int64)  # steps per slot since the welcome
        self.sent_steps = np.zeros(num_envs, np.int64)  # of those, sent (PUSH took them)
        self.throttle = ActorThrottle.disabled()
        self.fragment_length = 1
        self.observation_space: gym.Space | None = None
        self.actor_id = -1
        self.run_id = ""
        self.socket: zmq.Socket | None = None
        self.buffer: LockstepBuffer | None = None

    def start(
        self,
        socket: zmq.Socket,
        settings: RunSettings,
        *,
        actor_id: int,
        run_id: str,
        base_version: int,
        observation_space: gym.Space | None,
    ) -> None:
        """Begin a registration: a new connected PUSH socket (the old one is closed)
        and the welcome's settings. Sequence numbers carry on (they tell the learner
        old fragments from new ones) unless the learner assigned another number of
        slots."""
        self.close(linger=0)
        if settings.num_envs != self.num_envs:
            self.num_envs = settings.num_envs
            self.seq = np.zeros(self.num_envs, np.int64)
        self.slot_steps = np.zeros(self.num_envs, np.int64)
        self.sent_steps = np.zeros(self.num_envs, np.int64)
        self.throttle = ActorThrottle.from_settings(settings, base_version)
        self.fragment_length = settings.fragment_length
        self.observation_space = observation_space
        self.actor_id, self.run_id = actor_id, run_id
        self.socket = socket
        self.buffer = None

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
        next_obs: np.ndarray,
        final_obs: Mapping[int, np.ndarray] | None,
        version: int,
    ) -> None:
        """Record one step of every slot; send a fragment of every slot once
        ``fragment_length`` steps are buffered."""
        if self.buffer is None:
            self.buffer = LockstepBuffer(self.fragment_length, steps.obs, steps.actions)
        buffer = self.buffer
        self.stats["episodes_completed"] += buffer.add(steps, final_obs)
        buffer.next_obs[...] = next_obs
        self.slot_steps += 1
        if buffer.size == self.fragment_length:
            self.flush(version)

    def flush(self, version: int) -> None:
        """Send whatever :meth:`step` has buffered as one fragment per slot."""
        buffer = self.buffer
        if buffer is None or buffer.size == 0:
            return
        rows = slice(0, buffer.size)
        for slot in range(self.num_envs):
            self.send(
                slot,
                buffer.steps.select((rows, slot)),
                buffer.next_obs[slot],
                buffer.final[slot],
                version,
            )
        buffer.reset()

    def send_fragment(
        self,
        slot: int,
        steps: StepArrays,
        next_obs: np.ndarray,
        final_obs: Mapping[int, np.ndarray] | None,
        version: int,
    ) -> None:
        """Send T >= 1 consecutive steps of one slot now (not through the buffer)."""
        self.stats["episodes_completed"] += int((steps.terminated | steps.truncated).sum())
        self.slot_steps[slot] += steps.length
        self.send(slot, steps, next_obs, final_obs or {}, version)

    def send(
        self,
        slot: int,
        steps: StepArrays,
        next_obs: np.ndarray,
        final: Mapping[int, np.ndarray],
        version: int,
    ) -> None:
        """Check and send one fragment; count it once PUSH took it."""
        if self.socket is None:
            raise RuntimeError("register() first")
        rows = sorted(final)
        obs = steps.obs
        self.check_outgoing(slot, steps, rows)
        fragment = Fragment(
            **steps.step_arrays(),
            actor_id=self.actor_id,
            slot=slot,
            version=version,
            seq=int(self.seq[slot]),
            run_id=self.run_id,
            next_obs=np.asarray(next_obs, obs.dtype),
            final_obs_index=np.asarray(rows, np.int32),
            final_obs=(
                np.stack([np.asarray(final[r], obs.dtype) for r in rows])
                if rows
                else np.zeros((0, *obs.shape[1:]), obs.dtype)
            ),
            sent_at=time.time(),
        )
        if not self._push(encode(fragment)):
            return
        self.seq[slot] += 1
        self.sent_steps[slot] += fragment.length
        self.stats["steps_sent"] += fragment.length
        self.stats["fragments_sent"] += 1

    def check_outgoing(self, slot: int, steps: StepArrays, final_rows: list[int]) -> None:
        """Raise ValueError, naming the slot, for what the learner would reject."""
        space, obs = self.observation_space, steps.obs
        if space is not None and (obs.shape[1:] != space.shape or obs.dtype != space.dtype):
            raise ValueError(
                f"slot {slot}: observations {obs.shape[1:]} {obs.dtype} do not match the "
                f"observation space {space.shape} {space.dtype} (the learner would reject them)"
            )
        needs = np.flatnonzero(steps.truncated & ~steps.terminated).tolist()
        if needs != final_rows:
            raise ValueError(
                f"slot {slot}: rows {needs} are truncated (not terminated) and need a final "
                f"observation each; got final_obs for rows {final_rows}"
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
