"""Summarise a ``py-spy record -f raw`` file: where each process spends its samples.

Usage::

    py-spy record -r 200 --subprocesses -f raw -o prof.txt -- zmq-rl run ...
    python bench/pyspy_summary.py prof.txt [--top 15] [--json out.json]

For every process (the ``process N:"cmd"`` frames py-spy adds with
``--subprocesses``) it prints the share of samples per *self* frame (the function
on top of the stack) and per *inclusive* frame (anywhere on the stack), with the
frames of the standard library, numpy, torch, zmq and msgpack folded into their
caller in the project so that the table names project code. Idle samples are not
recorded unless py-spy ran with ``--idle``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter, defaultdict

PROCESS = re.compile(r'process (\d+):"([^"]*)";?')
FRAME = re.compile(r"^(?P<func>.+?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def parse(path: str) -> dict[str, list[tuple[list[str], int]]]:
    """``{process label: [(frames root-first, count), ...]}`` of a raw py-spy file."""
    stacks: dict[str, list[tuple[list[str], int]]] = defaultdict(list)
    with open(path) as fh:
        for raw in fh:
            raw = raw.rstrip("\n")
            if not raw:
                continue
            stack, _, count = raw.rpartition(" ")
            try:
                n = int(count)
            except ValueError:
                continue
            label = "?"
            while True:  # leading process frames (commands may hold ';')
                m = PROCESS.match(stack)
                if not m:
                    break
                label = f"{_short_command(m.group(2))} [pid {m.group(1)}]"  # innermost wins
                stack = stack[m.end() :]
            rest = [f for f in stack.split(";") if f]
            stacks[label].append((rest, n))
    return stacks


def _short_command(cmd: str) -> str:
    if "resource_tracker" in cmd:
        return "resource tracker"
    if "multiprocessing.spawn" in cmd or "multiprocessing.forkserver" in cmd:
        return "spawned child"
    if "bench/" in cmd:
        return cmd.split("bench/", 1)[1].split()[0]
    for key in ("zmq_rl.cli.actor", "zmq-actor"):
        if key in cmd:
            m = re.search(r"--actor-id (\d+)", cmd)
            return f"actor {m.group(1) if m else ''}".strip()
    if "zmq-rl" in cmd or "zmq-learner" in cmd:
        return "learner"
    return cmd[:80]


def _name(frame: str) -> str:
    m = FRAME.match(frame)
    if not m:
        return frame
    file = m.group("file") or ""
    return f"{m.group('func')} ({file.rsplit('/', 1)[-1] if '/' in file else file})"


WAITING = {
    "Poller.poll",
    "poll",
    "Socket.poll",
    "_PollLikeSelector.select",
    "select",
    "Condition.wait",
    "Event.wait",
    "Popen._wait",
    "Thread.join",
    "sleep",
}
"""Self frames that mean the thread waits (recorded only with ``py-spy --idle``)."""


def _waits(frame: str) -> bool:
    return frame.split(" (", 1)[0] in WAITING


def summarise(stacks: list[tuple[list[str], int]], top: int, all_threads: bool = False) -> dict:
    if not all_threads:  # the main thread only: helper threads mostly sleep
        stacks = [(f, n) for f, n in stacks if not any("Thread._bootstrap" in x for x in f)]
    total = sum(n for _, n in stacks)
    waiting = sum(n for f, n in stacks if f and _waits(f[-1]))
    own: Counter[str] = Counter()
    own_project: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    for frames, n in stacks:
        if not frames:
            continue
        own[_name(frames[-1])] += n
        project = [f for f in frames if "zmq_rl/" in f or "bench/" in f]
        if project:
            own_project[_name(project[-1])] += n
        for name in {_name(f) for f in frames}:
            inclusive[name] += n

    def table(counter: Counter[str]) -> list[tuple[str, float]]:
        return [(k, round(100.0 * v / max(total, 1), 1)) for k, v in counter.most_common(top)]

    return {
        "samples": total,
        "waiting_pct": round(100.0 * waiting / max(total, 1), 1),
        "self": table(own),
        "self_in_project": table(own_project),
        "inclusive": table(inclusive),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("raw", help="py-spy record -f raw output")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument(
        "--out", "--json", dest="json", default="", help="also write the summary here"
    )
    parser.add_argument(
        "--port", type=int, default=0, help="accepted for a uniform interface: binds no port"
    )
    parser.add_argument(
        "--all-threads",
        action="store_true",
        help="count helper threads too (default: main thread only)",
    )
    args = parser.parse_args(argv)
    out = {
        label: summarise(s, args.top, args.all_threads)
        for label, s in sorted(parse(args.raw).items())
    }
    out = {k: v for k, v in out.items() if v["samples"] and "resource tracker" not in k}
    for label, summary in out.items():
        print(f"== {label}: {summary['samples']} samples, {summary['waiting_pct']}% waiting")
        for title in ("self_in_project", "self", "inclusive"):
            print(f"  -- {title}")
            for name, pct in summary[title]:
                print(f"    {pct:5.1f}%  {name}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
