"""The wire: bytes, messages, observation/action spaces, sockets and flow control.

The bottom wing: it imports only the ground below it, the settings (and the old-path
shims); see docs/design.md, the layout.
"""

from __future__ import annotations

from typing import Any

from .._moved import moved_attribute


def __getattr__(name: str) -> Any:
    """``zmq_rl.wire.NAME`` for a name of the old module ``zmq_rl/wire.py``, now
    :mod:`zmq_rl.wire.codec`, with a DeprecationWarning; imported on first use, so that
    importing one module of this wing neither loads the others nor makes an import cycle
    (:func:`zmq_rl._moved.moved_attribute`)."""
    return moved_attribute(__name__, name)
