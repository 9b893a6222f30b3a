"""Issue 44 section 4: a newcomer's multi-agent run works and tells the truth.

What a first PettingZoo run meets: an env id whose package is missing, the
evaluation and the curve of pursuit, what ``zmq-rl eval`` of a game says, the files a
self-play run keeps, the actors' learner timeout from ``zmq-rl run``, and the Python
API on multi-agent policies and user envs. The install of the extra itself is
tested in tests/test_install_scripts.py (a fresh venv).
"""

from __future__ import annotations

import importlib.abc
import sys

import pytest

from zmq_rl.envs import EnvBuildError, env_shape


class _Missing(importlib.abc.MetaPathFinder):
    """Imports of ``package`` fail as when it is not installed."""

    def __init__(self, package: str) -> None:
        self.package = package

    def find_spec(self, name, path=None, target=None):
        if name == self.package or name.startswith(self.package + "."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def test_a_pettingzoo_env_without_pettingzoo_says_what_to_install(monkeypatch) -> None:
    """It said ``NameNotFound: Environment pettingzoo.sisl.pursuit_v5 doesn't exist``."""
    for name in [m for m in sys.modules if m == "pettingzoo" or m.startswith("pettingzoo.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_Missing("pettingzoo"), *sys.meta_path])
    with pytest.raises(EnvBuildError) as caught:
        env_shape("pettingzoo.sisl.pursuit_v5")
    message = str(caught.value)
    assert "pettingzoo is not installed: pip install 'zmq_rl[multi-agent]'" in message
    assert "NameNotFound" not in message and "\n" not in message
