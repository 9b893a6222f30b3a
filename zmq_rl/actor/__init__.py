"""The acting side: the actor client, its sender and weights subscriber, the embeddable
Agent, the gym actor loop and batched inference.

Imports the wire, envs and rl wings, never the learner wing.
"""

from __future__ import annotations

from typing import Any

from .._moved import moved_attribute


def __getattr__(name: str) -> Any:
    """``zmq_rl.actor.NAME`` for a name of the old module ``zmq_rl/actor.py``, now
    :mod:`zmq_rl.actor.gym_actor`, with a DeprecationWarning; imported on first use, so that
    importing one module of this wing neither loads the others nor makes an import cycle
    (:func:`zmq_rl._moved.moved_attribute`)."""
    return moved_attribute(__name__, name)
