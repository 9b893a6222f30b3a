"""The tests' one port helper honours ZMQ_RL_TEST_PORTS (issue 29 item 13: no knob)."""

from __future__ import annotations

import pytest

from tests import ports


def test_the_environment_variable_sets_the_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ports.PORT_RANGE_ENV, "41000-41040")
    assert ports.port_range() == (41000, 41040)
    for _ in range(20):
        base = ports.free_port_block(3)
        assert 41000 <= base <= 41040 - 3
    monkeypatch.delenv(ports.PORT_RANGE_ENV)
    assert ports.port_range() == ports.DEFAULT_RANGE == (20000, ports.LISTEN_PORTS_BELOW)


@pytest.mark.parametrize("bad", ["41000", "x-y", "50000-40000", "80-200", "41000-41001"])
def test_a_malformed_range_names_the_variable(monkeypatch, bad: str) -> None:
    monkeypatch.setenv(ports.PORT_RANGE_ENV, bad)
    with pytest.raises(ValueError, match=f"ZMQ_RL_TEST_PORTS='{bad}'"):
        ports.free_port_block()
