"""The learning side: the learner loop, ingest of experience, membership, learner ranks,
the run log, checkpoints and evaluation.

Imports the wire and rl wings, never the actor wing.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any


def __getattr__(name: str) -> Any:
    """``zmq_rl.learner.NAME`` for a name of the old module ``zmq_rl/learner.py``, now
    ``zmq_rl.learner.loop``: imported on first use, so that importing one module of this
    wing neither loads the others nor makes an import cycle (a deprecated path, docs/api.md)."""
    if name.startswith("__") or (Path(__file__).parent / f"{name}.py").exists():
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(".loop", __name__), name)
