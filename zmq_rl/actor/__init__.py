"""The acting side: the actor client, its sender and weights subscriber, the embeddable
Agent, the gym actor loop and batched inference.

Imports the wire and rl wings, never the learner wing.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any


def __getattr__(name: str) -> Any:
    """``zmq_rl.actor.NAME`` for a name of the old module ``zmq_rl/actor.py``, now
    ``zmq_rl.actor.gym_actor``: imported on first use, so that importing one module of this
    wing neither loads the others nor makes an import cycle (a deprecated path, docs/api.md)."""
    if name.startswith("__") or (Path(__file__).parent / f"{name}.py").exists():
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(".gym_actor", __name__), name)
