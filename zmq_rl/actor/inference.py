"""A simulator's side of remote inference (docs/inference.md), without torch.

:class:`InferenceClient` speaks the ``attach`` / ``infer`` / ``detach`` messages of
``zmq-rl serve`` over a DEALER socket: the reference client for Python simulators that
should not import torch, and what the tests and ``bench/inference_latency.py`` use.
(``examples/c_actor/`` is the same client in C.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgpack
import numpy as np
import zmq

from ..wire.codec import PROTOCOL_VERSION, ProtocolError
from ..wire.spaces import Value, as_value, decode_value, encode_value, map_value, space_from_spec
from ..wire.transport import SocketOptions, make_socket

__all__ = ["InferenceClient", "InferenceError", "RunOver"]


class InferenceError(RuntimeError):
    """The server answered ``error``; ``code`` says why (docs/inference.md)."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(f"inference server refused ({code}): {reason}")
        self.code = code
        self.reason = reason


class RunOver(Exception):
    """The server answered ``shutdown``: the learner ended the run."""


class InferenceClient:
    """Attach to ``zmq-rl serve`` at ``endpoint`` and ask for actions, one step of every
    slot per :meth:`infer`. Every wait is bounded by ``timeout`` seconds."""

    def __init__(
        self, endpoint: str, context: zmq.Context | None = None, timeout: float = 30.0
    ) -> None:
        self.timeout = float(timeout)
        self.socket = make_socket(
            context or zmq.Context.instance(),
            zmq.DEALER,
            SocketOptions(linger_ms=500, sndhwm=100, rcvhwm=100, max_message_bytes=64 << 20),
        )
        self.socket.connect(endpoint)
        self.attached: dict[str, Any] = {}
        self.num_envs = 0
        self.version = -1

    def _call(self, kind: str, **fields: Any) -> dict[str, Any]:
        frame = msgpack.packb({"proto": PROTOCOL_VERSION, "type": kind, **fields})
        self.socket.send(frame)
        if not self.socket.poll(int(self.timeout * 1000)):
            raise TimeoutError(f"no answer to {kind} within {self.timeout:g}s")
        body = msgpack.unpackb(self.socket.recv(), raw=False)
        if body.get("type") == "error":
            raise InferenceError(body.get("code", ""), body.get("reason", ""))
        if body.get("type") == "shutdown":
            raise RunOver(body.get("reason", ""))
        return body

    def attach(
        self,
        num_envs: int,
        observation_space: Any = None,
        action_space: Any = None,
        env_id: str = "",
    ) -> dict[str, Any]:
        """Attach with ``num_envs`` slots (spaces None: the learner's); the ``attached``
        reply, with ``observation_space`` / ``action_space`` as gymnasium spaces."""
        from ..wire.spaces import space_spec

        body = self._call(
            "attach",
            num_envs=int(num_envs),
            env_id=env_id,
            observation_space=space_spec(observation_space) if observation_space else {},
            action_space=space_spec(action_space) if action_space else {},
        )
        for name in ("observation_space", "action_space"):
            body[name] = space_from_spec(body[name], f"attached.{name}")
        self.attached, self.num_envs = body, int(body["num_envs"])
        return body

    def infer(
        self,
        obs: Any,
        reward: Any = None,
        terminated: Any = None,
        truncated: Any = None,
        final_obs: Mapping[int, Any] | None = None,
    ) -> np.ndarray:
        """The env actions for ``obs`` (every slot); from the second call on, with the
        outcome of the previous actions (``final_obs``: ``{slot: last obs}`` of each
        slot truncated and not terminated). Raises :class:`RunOver` at the run's end."""
        fields: dict[str, Any] = {"obs": encode_value(as_value(obs))}
        if reward is not None:
            fields["reward"] = encode_value(np.asarray(reward, np.float32))
            fields["terminated"] = encode_value(np.asarray(terminated, bool))
            fields["truncated"] = encode_value(np.asarray(truncated, bool))
            slots = sorted(final_obs or {})
            if slots:
                values = [as_value(final_obs[s]) for s in slots]  # type: ignore[index]
                fields["final_obs_index"] = encode_value(np.asarray(slots, np.int32))
                fields["final_obs"] = encode_value(map_value(lambda *x: np.stack(x), *values))
        body = self._call("infer", **fields)
        try:
            actions: Value = decode_value(body.get("actions"), "action.actions", (self.num_envs,))
        except ProtocolError as exc:
            raise InferenceError("bad_reply", str(exc)) from None
        self.version = int(body.get("version", -1))
        assert isinstance(actions, np.ndarray)
        return actions

    def detach(self, stats: Mapping[str, float] | None = None) -> None:
        """Detach (the server flushes this simulator's last rows and says bye)."""
        self._call("detach", stats=dict(stats or {}))

    def close(self) -> None:
        """Close the socket (without detaching: see :meth:`detach`)."""
        self.socket.close()
