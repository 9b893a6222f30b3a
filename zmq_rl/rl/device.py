"""Where the learner computes: the ``device`` setting and the host-to-device boundary.

The learner's device boundary (docs/design.md, "Devices"):

* rollouts are assembled on the host (numpy, :mod:`zmq_rl.rl.rollout`);
* each update copies the batch to the device once (:func:`to_device`), pinning the
  host copy first on CUDA so the transfer is a DMA the host does not wait on;
* the policy and the optimiser live on the device, where PPO runs;
* weights leave as CPU tensors (:func:`zmq_rl.rl.policy.export_weights`), so actors
  stay on the CPU and load them bit-exactly, and checkpoints hold CPU tensors
  (:func:`to_cpu`) that load on any device.

``device`` is ``auto`` (CUDA when available, else the CPU), ``cpu``, ``cuda`` (the
first visible GPU, ``cuda:0``) or ``cuda:N``.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from ..config import check_device_name, resolve_device
from ..wire.spaces import map_value

if TYPE_CHECKING:
    import torch

__all__ = [
    "check_device_name",
    "import_torch",
    "resolve_device",
    "set_compute_threads",
    "to_cpu",
    "to_device",
]
# check_device_name and resolve_device live with the device setting they check
# (zmq_rl.config) and are re-exported here, where they were first defined.


def to_device(value: Any, device: torch.device) -> Any:
    """A tensor (or a dict / tuple of them, :mod:`zmq_rl.wire.spaces` values) on ``device``.

    Nothing is copied for tensors already there (the CPU learner's path is unchanged).
    For CUDA, the host tensor is pinned first and copied with ``non_blocking``: the
    copy is a DMA queued on the stream, so the host goes on to pin the next tensor
    while the previous one travels, and the kernels that read it are queued behind
    it on the same stream (torch's pinned allocator keeps the staging memory alive
    until the copy is done).
    """

    def move(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.device == device:
            return tensor
        if device.type == "cuda" and tensor.device.type == "cpu":
            return tensor.pin_memory().to(device, non_blocking=True)
        return tensor.to(device)

    return map_value(move, value)


def to_cpu(state: Any) -> Any:
    """``state`` (nested dicts, lists and tuples of tensors and primitives, e.g. a
    ``state_dict`` or an optimiser's) with every tensor on the CPU: checkpoints and
    policy files load on any machine. CPU tensors are returned as they are."""
    import torch

    if isinstance(state, torch.Tensor):
        return state.detach().cpu() if state.device.type != "cpu" else state
    if isinstance(state, dict):
        return type(state)((k, to_cpu(v)) for k, v in state.items())
    if isinstance(state, (list, tuple)) and not hasattr(state, "_fields"):
        return type(state)(to_cpu(v) for v in state)
    return state


_torch_threads: int | None = None
"""The thread count :func:`set_compute_threads` asked for, applied to torch when it is
imported later (:func:`import_torch`)."""


def set_compute_threads(threads: int) -> None:
    """Run this process's math on ``threads`` cores: torch's intra-op threads and the
    BLAS that numpy's matmuls call (the learner's closed-form PPO steps,
    rl/closed_form.py, and the actors' sampling, rl/numpy_act.py: a 1,024-row
    minibatch would otherwise spread over every core).

    A process that has not imported torch does not import it here (an actor of the
    plain MLP runs without it, :mod:`zmq_rl.rl.numpy_mlp`): :func:`import_torch`
    applies the count when something needs torch after all. Without
    ``threadpoolctl`` installed, BLAS keeps its own default."""
    global _torch_threads
    _torch_threads = threads
    torch = sys.modules.get("torch")  # (None where an import of torch was refused)
    if torch is not None:
        torch.set_num_threads(threads)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(limits=threads, user_api="blas")


def import_torch() -> Any:
    """The ``torch`` module, imported now if it was not, with the thread count of
    :func:`set_compute_threads` (when it was called) applied: for the code paths of a
    torch-free actor that need torch after all (a torch copy of its network)."""
    import torch

    if _torch_threads is not None and torch.get_num_threads() != _torch_threads:
        torch.set_num_threads(_torch_threads)
    return torch
