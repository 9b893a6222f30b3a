"""One rule for repeated log lines: the 1st, 10th, 100th, ... occurrence is logged.

A peer that sends a bad message every millisecond must not flood the log, and an
operator must still see that it keeps happening and how often: the actor client's
rejects and link pauses, its weights re-subscriptions, the learner's rejected
messages and the inference server's refused requests all follow this rule.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["log_sparsely", "sparse"]


def sparse(count: int) -> bool:
    """Whether the ``count``-th occurrence is one to log: 1, 10, 100, 1000, ..."""
    return count > 0 and str(count).rstrip("0") == "1"


def log_sparsely(
    logger: logging.Logger,
    count: int,
    level: int,
    msg: str,
    *args: Any,
    quiet: int | None = None,
) -> None:
    """Log ``msg % args`` at ``level`` when ``count`` (how many times it happened,
    this one included) is 1, 10, 100, ...; the other occurrences at ``quiet`` (e.g.
    DEBUG), or not at all when ``quiet`` is None."""
    if sparse(count):
        logger.log(level, msg, *args)
    elif quiet is not None:
        logger.log(quiet, msg, *args)
