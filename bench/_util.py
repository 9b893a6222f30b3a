"""Shared helpers of the benchmark scripts (not part of the package).

Every script prints its figures and writes one JSON file: by default
``bench/results/<name>.json`` (``<name>.smoke.json`` with ``--smoke``, so a smoke
run never overwrites a full one), or ``--out PATH``; with ``--out``, whatever else
it writes (run directories, pictures) goes beside that file, never into the
checkout (:func:`runs_root`, :func:`figure_path`). Every script takes ``--port N``:
the learners it starts bind blocks of ports from N on (:func:`free_port_block`),
its child processes pick theirs in N..N+999 (``ZMQ_RL_TEST_PORTS``); without it,
free blocks anywhere in that variable's range (20000-32767 by default).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
BENCH_VENV_PYTHON = ROOT / ".venv-bench" / "bin" / "python"

if str(ROOT) not in sys.path:  # run as `python bench/x.py` from anywhere
    sys.path.insert(0, str(ROOT))

from zmq_rl.wire import ports as _ports  # noqa: E402

PORT_SPAN = 1000
"""``--port N``: the ports of a benchmark lie in N..N+999."""
_next_port = [0]
"""The next port :func:`free_port_block` tries after ``--port`` (0: no ``--port``)."""


def free_port_block(size: int = 3) -> int:
    """The first port of ``size`` free consecutive ports: after ``--port N`` the lowest
    free block from N on, each block after the last one handed out; otherwise a
    free block anywhere in ``ZMQ_RL_TEST_PORTS``'s range
    (:func:`zmq_rl.wire.ports.free_port_block`)."""
    if not _next_port[0]:
        return _ports.free_port_block(size)
    stop = _port_stop()
    while _next_port[0] + size <= stop:
        base = _next_port[0]
        _next_port[0] += size
        try:
            if _ports.free_port_block(size, base, base + size + 1) == base:
                return base
        except RuntimeError:
            continue
    raise RuntimeError(f"--port: no block of {size} free ports left below {stop}")


def _port_stop() -> int:
    return _ports.port_range()[1]


class _PortAction(argparse.Action):
    """``--port N``: learners from N on, child processes' picks in N..N+999."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        port = int(values)
        if port and not 1024 <= port <= 65536 - 16:
            parser.error(f"--port {port}: must be 0 or in 1024..65520")
        setattr(namespace, self.dest, port)
        if port:
            _next_port[0] = port
            os.environ[_ports.PORT_RANGE_ENV] = f"{port}-{min(port + PORT_SPAN, 65536)}"


def add_port_flag(parser: Any, binds: bool = True) -> None:
    """``--port N`` (see the module doc); ``binds`` False: the script starts no
    learner and binds nothing (the flag is accepted so that every script takes it)."""
    parser.add_argument(
        "--port",
        type=int,
        default=0,
        action=_PortAction,
        metavar="N",
        help=(
            "the learners this benchmark starts bind ports from N on, and its child "
            "processes pick theirs in N..N+999 (default 0: free ports anywhere in "
            "ZMQ_RL_TEST_PORTS's range, 20000-32767)"
            if binds
            else "accepted for a uniform interface: this script binds no port"
        ),
    )


def add_common_flags(parser: Any, smoke: bool = True, binds: bool = True) -> None:
    """``--smoke`` (unless ``smoke`` is False), ``--out`` and ``--port``."""
    if smoke:
        parser.add_argument("--smoke", action="store_true", help="a few seconds; checks it runs")
    parser.add_argument(
        "--out",
        default="",
        help="JSON output (default bench/results/NAME.json); run directories and "
        "pictures go beside it, not into the checkout",
    )
    add_port_flag(parser, binds)


def runs_root(name: str, args: Any) -> Path:
    """Where a benchmark keeps its run directories: beside ``--out`` (``OUT-runs/``),
    else ``runs/NAME`` in the checkout."""
    if getattr(args, "out", ""):
        out = Path(args.out)
        return out.parent / f"{out.stem}-runs"
    return ROOT / "runs" / name


def figure_path(name: str, args: Any) -> Path:
    """Where a benchmark draws picture ``NAME.png``: beside ``--out``, else ``docs/img``."""
    if getattr(args, "out", ""):
        return Path(args.out).parent / f"{name}.png"
    return ROOT / "docs" / "img" / f"{name}.png"


def result_path(name: str, args: Any) -> Path:
    if args.out:
        return Path(args.out)
    return RESULTS / (f"{name}.smoke.json" if args.smoke else f"{name}.json")


def round_order(items: Sequence[Any], round_index: int) -> list[Any]:
    """``items`` in the order round ``round_index`` measures them: reversed every other
    round, so that no variant always runs first (caches warming, the box's drift)."""
    return list(items) if round_index % 2 == 0 else list(items)[::-1]


def ab_rounds(
    rounds: int, order: tuple[Any, Any], measure: Any, over: tuple[Any, Any], what: str
) -> tuple[list[dict[str, Any]], list[float]]:
    """An A/B in one run: each round measures the two variants in ``order`` (flipped
    every other round), ``measure(variant)`` returning a row with ``steps_per_s``.
    Returns the rows in measurement order and, per round, the steps/s ratio
    ``over[0] / over[1]`` (printed as ``what``)."""
    rows: list[dict[str, Any]] = []
    ratios: list[float] = []
    for r in range(rounds):
        pair = {v: measure(v) for v in round_order(order, r)}
        rows.extend(pair.values())
        ratios.append(pair[over[0]]["steps_per_s"] / max(pair[over[1]]["steps_per_s"], 1e-9))
        print(f"round {r}: {what} steps/s ratio {ratios[-1]:.3f}", flush=True)
    return rows, ratios


def write_result(name: str, args: Any, data: dict[str, Any]) -> Path:
    """Write ``data`` plus the machine description and the command line."""
    path = result_path(name, args)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": name,
        "smoke": bool(args.smoke),
        "command": "python " + " ".join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "machine": machine_info(),
        **data,
    }
    path.write_text(json.dumps(_finite(payload), indent=2, default=_json_default) + "\n")
    print(f"wrote {path}")
    return path


def _finite(value: Any) -> Any:
    """``value`` with every NaN / infinity replaced by None (strict JSON)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


@contextlib.contextmanager
def revision_trees(base: str, base_tree: str) -> Any:
    """``{name: tree}`` to measure: this tree, and an earlier revision's when ``base``
    (a commit: checked out with ``git worktree`` for the duration) or ``base_tree``
    (a folder holding such a checkout, e.g. one carried to a machine without git)
    is given. A tree's code runs with ``PYTHONPATH`` set to it."""
    trees: dict[str, Path] = {}
    worktree = None
    if base:
        worktree = Path(tempfile.mkdtemp(prefix="bench-base-"))
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(worktree), base],
            cwd=ROOT, check=True, capture_output=True,
        )  # fmt: skip
        trees[f"base {base}"] = worktree
    elif base_tree:
        trees[f"base {Path(base_tree).name}"] = Path(base_tree).resolve()
    trees["this tree"] = ROOT
    try:
        yield trees
    finally:
        if worktree is not None:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(worktree)],
                cwd=ROOT, check=False, capture_output=True,
            )  # fmt: skip


def python_path(tree: Path) -> str:
    """``PYTHONPATH`` that imports ``tree``'s code first, keeping what was there."""
    return os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH", "")) if p)


def add_base_flags(parser: Any) -> None:
    """``--base REV`` / ``--base-tree DIR``: also measure an earlier revision."""
    parser.add_argument("--base", default="", help="also measure this revision (git worktree)")
    parser.add_argument(
        "--base-tree", default="", help="also measure the checkout in this folder (no git)"
    )


def machine_info() -> dict[str, Any]:
    """CPU, cores, memory, load and the versions that matter."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
    }
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as fh:
            info["mem_gib"] = round(int(fh.readline().split()[1]) / 2**20, 1)
    except OSError:
        pass
    from importlib import metadata

    versions = {}
    for dist in ("torch", "numpy", "pyzmq", "msgpack", "gymnasium", "zmq_rl"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[dist] = metadata.version(dist)
    try:
        import zmq

        versions["libzmq"] = zmq.zmq_version()
    except ImportError:
        pass
    info["versions"] = versions
    return info


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile ``q`` in [0, 100] (nan for no values)."""
    if not values:
        return math.nan
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def median(values: Sequence[float]) -> float:
    return percentile(values, 50.0)


def bench_python(*modules: str) -> str | None:
    """An interpreter that imports every one of ``modules``: ``$ZMQ_RL_BENCH_PYTHON``,
    this one, or ``.venv-bench/bin/python`` (the optional comparison venv); None if
    none does."""
    candidates = [os.environ.get("ZMQ_RL_BENCH_PYTHON", ""), sys.executable, str(BENCH_VENV_PYTHON)]
    probe = (
        "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in "
        f"{list(modules)!r}))"
    )
    for python in candidates:
        if not python or not (os.path.isfile(python) or shutil.which(python)):
            continue
        try:
            ok = (
                subprocess.run([python, "-c", probe], timeout=60, capture_output=True).returncode
                == 0
            )
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        if ok:
            return python
    return None


def package_versions(python: str, dists: Sequence[str]) -> dict[str, str]:
    """Installed versions of ``dists`` as seen by ``python``."""
    code = (
        "import json, importlib.metadata as m\n"
        "out = {}\n"
        f"for d in {list(dists)!r}:\n"
        "    try: out[d] = m.version(d)\n"
        "    except m.PackageNotFoundError: pass\n"
        "print(json.dumps(out))"
    )
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return {}


def fmt_rate(x: float) -> str:
    if not math.isfinite(x):
        return "n/a"
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e3:
        return f"{x / 1e3:.1f}k"
    return f"{x:.0f}"


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A plain fixed-width table on stdout."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for n, row in enumerate(cells):
        print(
            "  ".join(
                c.rjust(w) if n and i else c.ljust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
        if n == 0:
            print("  ".join("-" * w for w in widths))


class RssSampler:
    """Samples a process's RSS from a thread: ``samples`` holds (time.monotonic(), bytes);
    with ``children``, the sum over the process and its children (learner ranks)."""

    def __init__(self, pid: int, interval: float = 1.0, children: bool = False) -> None:
        import threading

        import psutil

        self.proc = psutil.Process(pid)
        self.children = children
        self.interval = interval
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                procs = [self.proc, *(self.proc.children() if self.children else [])]
                rss = sum(p.memory_info().rss for p in procs)
                self.samples.append((time.monotonic(), rss))
            except Exception:  # noqa: BLE001 - the process may be gone
                return
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def run_with_actor_processes(
    learner: Any, target: Any, args: tuple[Any, ...], count: int, join_s: float = 30.0
) -> Any:
    """Start ``count`` spawned processes of ``target(*args)`` (actors), run the learner
    to its end, close it and reap the processes (killed after ``join_s``); the report."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=target, args=args) for _ in range(count)]
    for p in procs:
        p.start()
    try:
        return learner.run()
    finally:
        learner.close()
        for p in procs:
            p.join(join_s)
            if p.is_alive():
                p.kill()
