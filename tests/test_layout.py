"""The layout of zmq_rl (issue 27, docs/design.md): wings that import only downwards.

Reads every import of every module of zmq_rl/ with ``ast`` (nothing is executed;
function-level and ``TYPE_CHECKING`` imports count too, since they are dependencies
all the same) and checks three rules:

- no import cycle between modules;
- a module imports only modules of a lower rank (``RANKS``) or of its own wing: ``wire``
  at the bottom, ``rl`` above it, ``actor`` and ``learner`` above both and never
  importing each other, ``run`` above them, ``api``, ``conformance`` and ``cli`` on top;
- no module outside ``zmq_rl/cli/`` imports ``zmq_rl.cli`` (``python -m zmq_rl``,
  ``__main__``, is the one door into it).

It also checks that the old flat module paths still import (deprecated re-exports that
warn, docs/api.md), that no module stands outside a wing but the face and the ground,
and that importing one wing does not drag in the others.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from zmq_rl._moved import FORMER_MODULES, MOVED_NAMES, OLD_PATHS, REMOVED_IN

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "zmq_rl"

RANKS: dict[str, int] = {
    # the old-path shims: they name the new paths as strings and import nothing of zmq_rl
    "_moved": 0,
    # the ground: settings, the sparse-log rule, presets
    "config": 1,
    "sparse_log": 1,
    "presets": 1,
    # the wire (bytes, messages, spaces, sockets), the configs' TOML form
    "wire": 2,
    "config_toml": 2,
    # environments (the factory, registered ids, multi-agent slots, seeds, scripted
    # players) beside the learning maths (and where torch runs): neither imports the other
    "envs": 3,
    "rl": 3,
    # the two sides of the system: never import each other
    "actor": 4,
    "learner": 4,
    # products built on both sides: serving and deploying a trained policy
    "serving": 5,
    # the engine of a run
    "run": 6,
    # the faces: Python API, conformance tool, command line
    "api": 7,
    "conformance": 7,
    "zmq_rl": 8,
    "cli": 8,
    "__main__": 9,
}
"""Rank of each wing (a sub-package) or top-level module of zmq_rl."""

TOP_LEVEL = {"__init__", "__main__", "_moved", "api", "config", "config_toml", "sparse_log"}
"""The only modules outside a wing (issue 42): the package and ``python -m zmq_rl``,
the Python face, the ground the wire stands on, and the old-path shims."""

KNOWN_AGAINST: dict[tuple[str, str], str] = {}
"""Imports against the wings that the seams of issue 27 still have to remove; each one
removed must leave this table too (the test fails on a stale entry)."""

KNOWN_CYCLES: dict[frozenset[str], str] = {
}
"""Import cycles still to untie (same rule: a stale entry fails)."""


def modules() -> dict[str, Path]:
    """Every module of zmq_rl by dotted name (a package by its own name)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the modules of zmq_rl it imports (its own parent packages left out)."""
    edges: dict[str, set[str]] = {name: set() for name in mods}
    for name, path in mods.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[: len(package) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                targets = [module] + [f"{module}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                if target in mods and target != name and not name.startswith(target + "."):
                    edges[name].add(target)
    return edges


def wing(module: str) -> str:
    """The wing (sub-package) or top-level module a module belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def cycles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


@pytest.fixture(scope="module")
def edges() -> dict[str, set[str]]:
    return imports(modules())


def test_the_walker_sees_relative_function_level_and_type_checking_imports(tmp_path):
    """The walker itself: a plausible bug (relative levels, nested imports) is caught."""
    pkg = tmp_path / "zmq_rl"
    (pkg / "wire").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "wire" / "__init__.py").write_text("")
    (pkg / "config.py").write_text("def f():\n    from .wire import codec\n")
    (pkg / "wire" / "codec.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..config import X\n"
    )
    found = {}
    for path in pkg.rglob("*.py"):
        parts = list(path.relative_to(tmp_path).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    got = imports(found)
    assert got["zmq_rl.config"] == {"zmq_rl.wire", "zmq_rl.wire.codec"}
    assert got["zmq_rl.wire.codec"] == {"zmq_rl.config"}
    assert cycles(got) == [frozenset({"zmq_rl.config", "zmq_rl.wire.codec"})]


def test_every_wing_and_top_level_module_has_a_rank():
    present = {wing(name) for name in modules()}
    unplaced = sorted(present - set(RANKS))
    assert not unplaced, f"place these in tests/test_layout.py RANKS and docs/design.md: {unplaced}"
    gone = sorted(set(RANKS) - present)
    assert not gone, f"no such wing or module any more, so remove it from RANKS: {gone}"


def test_every_module_but_the_face_and_the_ground_lives_in_a_wing():
    """Issue 42: no top-level module besides :data:`TOP_LEVEL`; a new module goes into
    the wing whose job it does (CONTRIBUTING.md)."""
    loose = sorted(path.stem for path in PACKAGE.glob("*.py") if path.stem not in TOP_LEVEL)
    assert not loose, f"move these into a wing (docs/design.md, 'The layout'): {loose}"


def test_no_import_cycle_between_modules(edges):
    found = set(cycles(edges))
    new = sorted(sorted(c) for c in found - set(KNOWN_CYCLES))
    assert not new, f"import cycles: {new}"
    untied = sorted(sorted(c) for c in set(KNOWN_CYCLES) - found)
    assert not untied, f"untied, so remove them from KNOWN_CYCLES: {untied}"


def test_every_import_goes_down_the_wings(edges):
    against = set()
    for src, targets in edges.items():
        for dst in targets:
            same = wing(src) == wing(dst)
            if not same and RANKS.get(wing(dst), 99) >= RANKS.get(wing(src), -1):
                against.add((src, dst))
    new = sorted(against - set(KNOWN_AGAINST))
    assert not new, f"imports against the wings (src, dst): {new}"
    gone = sorted(set(KNOWN_AGAINST) - against)
    assert not gone, f"gone, so remove them from KNOWN_AGAINST: {gone}"


def test_only_the_cli_imports_the_cli(edges):
    outside = sorted(
        (src, dst)
        for src, targets in edges.items()
        for dst in targets
        if wing(dst) == "cli" and wing(src) not in ("cli", "__main__")
        and (src, dst) not in KNOWN_AGAINST
    )
    assert not outside, f"modules outside zmq_rl/cli importing it: {outside}"


def _deprecation(old: str, new: str) -> str:
    """The warning an old path gives: it names the new path and the removal version."""
    return rf"^{re.escape(old)} is deprecated, use {re.escape(new)} \(.*{re.escape(REMOVED_IN)}"


@pytest.mark.parametrize("old", sorted(OLD_PATHS))
def test_each_old_module_path_warns_and_is_the_moved_module(old, monkeypatch):
    """Deprecated re-exports (docs/api.md): each old path is the very moved module, and
    its first import warns, naming the new path and the release that removes the old."""
    new = OLD_PATHS[old]
    monkeypatch.delitem(sys.modules, old, raising=False)  # so that this import is a first
    with pytest.warns(DeprecationWarning, match=_deprecation(old, new)) as caught:
        module = importlib.import_module(old)
    assert module is importlib.import_module(new), old
    assert caught[0].filename == importlib.__file__  # the importer's frame, not _moved's


OLD_NAMES = [
    ("zmq_rl.wire", "ProtocolError", "zmq_rl.wire.codec"),  # old zmq_rl/wire.py
    ("zmq_rl.wire", "PROTOCOL_VERSION", "zmq_rl.wire.codec"),
    ("zmq_rl.actor", "GymActor", "zmq_rl.actor.gym_actor"),  # old zmq_rl/actor.py
    ("zmq_rl.learner", "Learner", "zmq_rl.learner.loop"),  # old zmq_rl/learner.py
    ("zmq_rl.cli.common", "guard", "zmq_rl.cli.exits"),  # an old path's moved name
    *((module, name, new) for module, names in MOVED_NAMES.items() for name, new in names.items()),
]


@pytest.mark.parametrize(("module", "name", "new"), OLD_NAMES)
def test_each_old_name_warns_and_is_the_moved_name(module, name, new):
    """A name of a former module (``zmq_rl.wire.ProtocolError``) or one that moved out
    of a module (``zmq_rl.config.ActorThrottle``) is the same object, with a warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the old module path itself (zmq_rl.cli.common)
        holder = importlib.import_module(module)
    old = f"{holder.__name__}.{name}"  # zmq_rl.cli.common is zmq_rl.run.common
    with pytest.warns(DeprecationWarning, match=_deprecation(old, f"{new}.{name}")):
        value = getattr(holder, name)
    assert value is getattr(importlib.import_module(new), name)


def test_a_wing_still_imports_its_own_modules_without_a_warning():
    """``from zmq_rl.wire import protocol`` is a submodule, not a name of the former
    ``zmq_rl/wire.py``; an unknown name is an AttributeError, not a warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from zmq_rl.actor import team
        from zmq_rl.learner import metrics
        from zmq_rl.wire import protocol

        assert (protocol.__name__, team.__name__) == ("zmq_rl.wire.protocol", "zmq_rl.actor.team")
        assert metrics.__name__ == "zmq_rl.learner.metrics"
        with pytest.raises(AttributeError):
            importlib.import_module("zmq_rl.config").no_such_name  # noqa: B018
        with pytest.raises(AttributeError):
            importlib.import_module("zmq_rl.run.common").no_such_name  # noqa: B018


def test_zmq_rl_itself_uses_no_old_path():
    """Importing every module of zmq_rl by its own path gives no deprecation warning of
    zmq_rl's (a fresh process: nothing is imported yet)."""
    names = sorted(n for n in modules() if not n.endswith("__main__"))
    code = (
        "import importlib, warnings\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        f"    for name in {names!r}:\n"
        "        importlib.import_module(name)\n"
        "print([str(w.message) for w in caught if 'is deprecated, use zmq_rl' in str(w.message)])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


def test_a_wing_imports_without_the_wings_above_it():
    """Importing the wire or the actor client loads neither side above it nor torch."""
    code = (
        "import sys, zmq_rl.wire.protocol, zmq_rl.actor.client;"
        "print(sorted(m for m in sys.modules if m.startswith(('zmq_rl.learner', 'zmq_rl.cli',"
        " 'zmq_rl.actor.gym_actor', 'zmq_rl.api'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def _class_lines(path: Path, name: str) -> int:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node.end_lineno - node.lineno + 1
    raise AssertionError(f"no class {name} in {path}")


def test_ingest_keeps_two_jobs_receive_and_control():
    """The link measurement (learner/links.py) and the ranks protocol (learner/ranks.py)
    live outside Ingest, which stays under 550 lines."""
    assert _class_lines(PACKAGE / "learner" / "ingest.py", "Ingest") < 550
    source = (PACKAGE / "learner" / "ingest.py").read_text()
    for gone in ("def plan_actors", "def apply_plan", "def rank_report", "def _maybe_advise"):
        assert gone not in source, gone


def test_the_learner_keeps_one_job_the_loop():
    """Batches (learner/batches.py), evictions, the run's outputs and the env-dependent
    config checks (learner/settings.py ``check_env_settings``, run before any socket
    binds) live outside Learner, which stays under 400 lines (505 before issue 42); one
    trainer interface for one policy or several, so the loop never asks which it has."""
    assert _class_lines(PACKAGE / "learner" / "loop.py", "Learner") < 400
    source = (PACKAGE / "learner" / "loop.py").read_text()
    assert "PolicyTrainers" not in source and "isinstance(self.trainer" not in source


def test_learner_connection_keeps_one_job_the_control_channel():
    """Link health (actor/link.py), the several policies' versions (PolicyVersions,
    beside WeightsSubscriber) and the registration's wait for its welcome (Handshake)
    live outside LearnerConnection, which stays under 450 lines (618 before the cut)."""
    assert _class_lines(PACKAGE / "actor" / "client.py", "LearnerConnection") < 450
    source = (PACKAGE / "actor" / "client.py").read_text()
    for gone in ("def _check_link", "def _pause_for_link", "def _note_valve", "def _take_paused"):
        assert gone not in source, gone


def test_learner_ranks_use_no_private_member_of_the_learner():
    """LeaderRanks gets narrow callables (stop_reason, budget_spent, broadcast)."""
    tree = ast.parse((PACKAGE / "learner" / "ranks.py").read_text())
    private = sorted(
        {
            f"{node.value.id}.{node.attr}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("learner", "ingest")
            and node.attr.startswith("_")
        }
    )
    assert not private, private


def test_the_conformance_tool_drives_the_learner_through_public_hooks_only():
    """conformance/ neither subclasses a production class of the learner wing nor
    calls or overrides its private members (it uses Ingest.observer)."""
    offences = []
    for path in (PACKAGE / "conformance").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = {getattr(b, "id", getattr(b, "attr", "")) for b in node.bases}
                if bases & {"Ingest", "Learner", "Membership"}:
                    offences.append(f"{path.name}: class {node.name}({', '.join(bases)})")
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "ingest"
                and node.attr.startswith("_")
            ):
                offences.append(f"{path.name}: ingest.{node.attr}")
    assert not offences, offences


def test_every_old_module_path_is_in_the_deprecation_note():
    """docs/api.md, 'Old import paths', lists every old path that still imports, and
    the release that removes them."""
    text = (ROOT / "docs" / "api.md").read_text()
    note = text[text.index("## Old import paths") :]
    names = [f"{module}.{name}" for module, names in MOVED_NAMES.items() for name in names]
    missing = [old for old in [*OLD_PATHS, *FORMER_MODULES, *names]
               if f"`{old}`" not in note]  # fmt: skip
    assert not missing, missing
    assert f"removed in zmq_rl {REMOVED_IN}" in " ".join(note.split())


def test_no_class_hides_its_type_behind_a_getattr_proxy():
    """A class that forwards unknown attributes (``__getattr__``) hides the type of what
    it wraps from every caller (cli/local.py's ResumingLearner did): none is left.
    Module-level ``__getattr__`` (lazy imports, PEP 562) is fine, and so is the one
    deprecation shim: ``serving.deploy.Prediction`` (``predict``'s ``(action, state)``) forwards
    the action's array attributes with a FutureWarning while the old return form lasts."""
    proxies = sorted(
        f"{path.relative_to(ROOT)}: {node.name}"
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
        and any(
            isinstance(item, ast.FunctionDef) and item.name == "__getattr__" for item in node.body
        )
    )
    assert proxies == ["zmq_rl/serving/deploy.py: Prediction"], proxies



def test_no_function_of_the_ppo_module_is_over_80_lines():
    """PPOTrainer.update was 200 lines with four features braided into one loop; it is
    cut along them (plan, epochs, minibatch step, loss inputs, metrics), and no
    function of rl/ppo.py may grow back past 80 lines (docstring included)."""
    tree = ast.parse((PACKAGE / "rl" / "ppo.py").read_text())
    long = {
        node.name: node.end_lineno - node.lineno + 1
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > 80
    }
    assert not long, long
