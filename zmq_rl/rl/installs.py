"""What this host has installed: an actor host's ``pip install zmq_rl`` (no torch) or a
learner host's ``pip install 'zmq_rl[learner]'`` (docs/multi-host.md), and the one
line a host without torch gets for what needs it.

Light on purpose (no numpy, no gymnasium): the command line's error handling imports
it (:func:`zmq_rl.cli.exits.guard` turns :class:`TorchMissing` into that line, exit 2).
"""

from __future__ import annotations

__all__ = [
    "LEARNER_INSTALL",
    "TorchMissing",
    "module_installed",
    "needs_torch_line",
    "require_torch",
    "torch_installed",
]

LEARNER_INSTALL = "pip install 'zmq_rl[learner]'"
"""What a host without torch installs to get it (docs/multi-host.md)."""


class TorchMissing(ImportError):
    """What this process was asked for needs torch, which is not installed: the message
    is one line that names the install (:data:`LEARNER_INSTALL`)."""


def module_installed(name: str) -> bool:
    """Whether ``import <name>`` would find the module (without importing it)."""
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # an import hook that refuses it; sys.modules None
        return False


def torch_installed() -> bool:
    """Whether ``import torch`` would find torch (without importing it)."""
    return module_installed("torch")


def require_torch(what: str) -> None:
    """Raise :class:`TorchMissing` ("<what> needs torch: pip install ...") unless torch
    is installed."""
    if not torch_installed():
        raise TorchMissing(f"{what} needs torch: {LEARNER_INSTALL}")


def needs_torch_line(factory: str) -> str:
    """The one line a host without torch prints for a network only torch builds."""
    return (
        f"the run's network is a custom factory ({factory}), which needs torch on this "
        f"host: {LEARNER_INSTALL} (the shipped networks act without it)"
    )
