"""zmq_rl: a distributed reinforcement-learning toolkit over ZeroMQ."""

from typing import Any

__all__ = [
    "Agent",
]

_LAZY = {
    "Agent": "zmq_rl.agent",
}
"""Public names and the module that defines each: imported on first use, so that
``import zmq_rl`` (and a subpackage import) does not import torch."""


def __getattr__(name: str) -> Any:
    """Import a public name's module on first access (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'zmq_rl' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
