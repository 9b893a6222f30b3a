"""Old module paths and names of zmq_rl that keep importing after the layouts of
issues 27 and 42, each with a :class:`DeprecationWarning` naming the new path.

zmq_rl was one flat folder; its modules now live in wings (docs/design.md). Code that
imports an old path (``zmq_rl.protocol``, ``zmq_rl.client``, ...) gets the very module
object of the new path, so its names, its private names and monkeypatching behave as
before. ``zmq_rl.wire``, ``zmq_rl.actor`` and ``zmq_rl.learner`` are packages now: their
``__getattr__`` forwards the old modules' names (:data:`FORMER_MODULES`), and a module
whose names moved out hands them on the same way (:data:`MOVED_NAMES`). The old paths
are deprecated (docs/api.md, "Old import paths") and go in zmq_rl :data:`REMOVED_IN`.

This module imports nothing of zmq_rl by name: the new paths are strings, imported on
first use, so every wing can ask it without an import against the wings.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

REMOVED_IN = "0.3.0"
"""The release that removes the old paths (docs/api.md says so)."""

OLD_PATHS: dict[str, str] = {
    "zmq_rl.protocol": "zmq_rl.wire.protocol",
    "zmq_rl.spaces": "zmq_rl.wire.spaces",
    "zmq_rl.transport": "zmq_rl.wire.transport",
    "zmq_rl.valve": "zmq_rl.wire.valve",
    "zmq_rl.advantages": "zmq_rl.rl.advantages",
    "zmq_rl.normalization": "zmq_rl.rl.normalization",
    "zmq_rl.targets": "zmq_rl.rl.targets",
    "zmq_rl.ppo": "zmq_rl.rl.ppo",
    "zmq_rl.trainer": "zmq_rl.rl.trainer",
    "zmq_rl.rollout": "zmq_rl.rl.rollout",
    "zmq_rl.distributed": "zmq_rl.rl.distributed",
    "zmq_rl.policy": "zmq_rl.rl.policy",
    "zmq_rl.networks": "zmq_rl.rl.networks",
    "zmq_rl.cnn": "zmq_rl.rl.cnn",
    "zmq_rl.client": "zmq_rl.actor.client",
    "zmq_rl.sender": "zmq_rl.actor.sender",
    "zmq_rl.subscriber": "zmq_rl.actor.subscriber",
    "zmq_rl.agent": "zmq_rl.actor.agent",
    "zmq_rl.inference": "zmq_rl.actor.inference",
    "zmq_rl.ingest": "zmq_rl.learner.ingest",
    "zmq_rl.membership": "zmq_rl.learner.membership",
    "zmq_rl.learner_ranks": "zmq_rl.learner.ranks",
    "zmq_rl.runlog": "zmq_rl.learner.runlog",
    "zmq_rl.checkpoint": "zmq_rl.learner.checkpoint",
    "zmq_rl.evaluation": "zmq_rl.learner.evaluation",
    "zmq_rl.conformance.cli": "zmq_rl.cli.conformance",
    "zmq_rl.cli.training": "zmq_rl.run.session",
    "zmq_rl.cli.local": "zmq_rl.run.local_actors",
    "zmq_rl.cli.progress": "zmq_rl.run.progress",
    "zmq_rl.cli.common": "zmq_rl.run.common",
    # issue 42: every top-level module in a wing
    "zmq_rl.multi_agent": "zmq_rl.envs.multi_agent",
    "zmq_rl.baselines": "zmq_rl.envs.baselines",
    "zmq_rl.seeding": "zmq_rl.envs.seeding",
    "zmq_rl.device": "zmq_rl.rl.device",
    "zmq_rl.metrics": "zmq_rl.learner.metrics",
    "zmq_rl.report": "zmq_rl.learner.report",
    "zmq_rl.deploy": "zmq_rl.serving.deploy",
    "zmq_rl.serve": "zmq_rl.serving.serve",
}
"""Old module path -> the module it is now."""

FORMER_MODULES: dict[str, str] = {
    "zmq_rl.wire": "zmq_rl.wire.codec",
    "zmq_rl.actor": "zmq_rl.actor.gym_actor",
    "zmq_rl.learner": "zmq_rl.learner.loop",
}
"""A package that was a module (``zmq_rl/wire.py``) -> the module that holds the old
module's names now: ``zmq_rl.wire.ProtocolError`` still finds them."""

MOVED_NAMES: dict[str, dict[str, str]] = {
    "zmq_rl.config": {"ActorThrottle": "zmq_rl.wire.valve"},
    "zmq_rl.rl.rollout": {
        name: "zmq_rl.learner.queues" for name in ("SlotQueues", "_SlotQueue", "_continues")
    },
    "zmq_rl.run.common": {
        name: "zmq_rl.cli.exits"
        for name in (
            "EXIT_FAILED",
            "EXIT_CONFIG",
            "EXIT_INTERRUPTED",
            "error",
            "guard",
            "setup_logging",
            "sigterm_as_interrupt",
        )
    },
}
"""A module -> its names that moved out -> the module each is in now."""


def deprecated(old: str, new: str, stacklevel: int) -> None:
    """Warn that ``old`` is a deprecated path of ``new``, attributed to the code that
    used the old path (``stacklevel`` as :func:`warnings.warn` counts it from the caller;
    importlib's own frames are skipped)."""
    warnings.warn(
        f"{old} is deprecated, use {new} (the old path goes in zmq_rl {REMOVED_IN}; "
        "docs/api.md, 'Old import paths')",
        DeprecationWarning,
        stacklevel=stacklevel + 1,
    )


def moved_attribute(module: str, name: str) -> Any:
    """``module.name`` for a name that moved out of ``module`` (:data:`MOVED_NAMES`, or
    any name of a package's former module, :data:`FORMER_MODULES`), with a
    :class:`DeprecationWarning` naming where it is now; the module-level
    ``__getattr__`` (PEP 562) of such a module returns this. Any other name is an
    :class:`AttributeError`, as is a submodule not imported yet (the import system
    then imports it)."""
    new = MOVED_NAMES.get(module, {}).get(name)
    if new is None and module in FORMER_MODULES and not _dunder_or_submodule(module, name):
        new = FORMER_MODULES[module]
    if new is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(new), name)
    deprecated(f"{module}.{name}", f"{new}.{name}", stacklevel=3)  # past __getattr__
    return value


def _dunder_or_submodule(package: str, name: str) -> bool:
    """Whether ``name`` is a dunder or one of ``package``'s own modules (its files), so
    that looking it up neither imports the former module nor shadows a submodule."""
    if name.startswith("__"):
        return True
    init = getattr(sys.modules.get(package), "__file__", None)
    if init is None:
        return False
    folder = Path(init).parent
    return (folder / f"{name}.py").exists() or (folder / name / "__init__.py").exists()


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module path as the module it moved to (the same object), with a
    :class:`DeprecationWarning` on the first import of the old path in a process."""

    def find_spec(self, fullname, path=None, target=None):  # noqa: D102 (importlib hook)
        if fullname not in OLD_PATHS:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec) -> ModuleType:  # noqa: D102 (importlib hook)
        module = importlib.import_module(OLD_PATHS[spec.name])
        deprecated(spec.name, OLD_PATHS[spec.name], stacklevel=2)  # the importer
        return module

    def exec_module(self, module: ModuleType) -> None:  # noqa: D102 (importlib hook)
        """Nothing to run: the module already ran under its new path."""


def install() -> None:
    """Put the alias finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Alias())


install()
