"""The learning side: the learner loop, ingest of experience, membership, learner ranks,
the run log, checkpoints and evaluation, and what they write: the run's report and its
metric sinks.

Imports the wire, envs and rl wings, never the actor wing.
"""

from __future__ import annotations

from typing import Any

from .._moved import moved_attribute


def __getattr__(name: str) -> Any:
    """``zmq_rl.learner.NAME`` for a name of the old module ``zmq_rl/learner.py``, now
    :mod:`zmq_rl.learner.loop`, with a DeprecationWarning; imported on first use, so that
    importing one module of this wing neither loads the others nor makes an import cycle
    (:func:`zmq_rl._moved.moved_attribute`)."""
    return moved_attribute(__name__, name)
