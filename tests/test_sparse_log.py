"""The one rule for repeated log lines (zmq_rl/sparse_log.py) and its four users."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from zmq_rl.sparse_log import log_sparsely, sparse

PACKAGE = Path(__file__).resolve().parents[1] / "zmq_rl"


def test_sparse_is_the_powers_of_ten():
    assert [n for n in range(0, 1001) if sparse(n)] == [1, 10, 100, 1000]
    assert sparse(10**6) and not sparse(10**6 + 1) and not sparse(-10) and not sparse(110)


@pytest.mark.parametrize("quiet", [None, logging.DEBUG])
def test_log_sparsely_logs_the_1st_10th_100th_loud_and_the_rest_quiet(caplog, quiet):
    log = logging.getLogger("zmq_rl.test_sparse_log")
    with caplog.at_level(logging.DEBUG, logger=log.name):
        for count in range(1, 101):
            log_sparsely(log, count, logging.WARNING, "reject %d (%s)", count, "why", quiet=quiet)
    loud = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert loud == ["reject 1 (why)", "reject 10 (why)", "reject 100 (why)"]
    rest = [r for r in caplog.records if r.levelno != logging.WARNING]
    assert len(rest) == (0 if quiet is None else 97)
    assert all(r.levelno == logging.DEBUG for r in rest)


@pytest.mark.parametrize(
    "module", ["actor/client.py", "actor/subscriber.py", "learner/ingest.py", "serving/serve.py"]
)
def test_each_user_logs_through_the_one_helper(module):
    """No private copy of the rule is left (it was written out in four places)."""
    source = (PACKAGE / module).read_text()
    assert "log_sparsely(" in source
    assert "(1, 10, 100" not in source and "LOG_AT" not in source
