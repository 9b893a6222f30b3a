"""The wire: bytes, messages, observation/action spaces, sockets and flow control.

The bottom wing: it imports nothing else of zmq_rl (see docs/design.md, the layout).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any


def __getattr__(name: str) -> Any:
    """``zmq_rl.wire.NAME`` for a name of the old module ``zmq_rl/wire.py``, now
    ``zmq_rl.wire.codec``: imported on first use, so that importing one module of this
    wing neither loads the others nor makes an import cycle (a deprecated path, docs/api.md)."""
    if name.startswith("__") or (Path(__file__).parent / f"{name}.py").exists():
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(".codec", __name__), name)
