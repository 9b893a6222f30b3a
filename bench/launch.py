"""Launch cost: actors started after the learner is built (as ``zmq-rl run``) vs before.

``zmq-rl run`` constructs the :class:`~zmq_rl.learner.loop.Learner` (torch, gymnasium,
the policy, Adam, the sockets) and only then starts its actor processes, which in
turn import torch and gymnasium before they can say hello: the two start-ups run
one after the other. An actor that starts first simply waits (its DEALER
reconnects until the learner binds). This measures, each in a fresh process
(``python bench/launch.py --child MODE``), the time from the child's launch to
the learner's first update, with 2 actors x 4 envs and ``zmq-rl run``'s defaults:

* ``after``: import the learner, build it, then ``Popen`` the actors (today);
* ``before``: ``Popen`` the actors first, then import and build the learner.

    python bench/launch.py            # 5 rounds of both, alternating
    python bench/launch.py --smoke    # 1 round
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

T0 = time.monotonic()
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _util  # noqa: E402


def child(mode: str, port: int) -> None:
    def actors() -> list[subprocess.Popen[bytes]]:
        return [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "zmq_rl.cli.actor",
                    "--learner",
                    f"127.0.0.1:{port}",
                    "--actor-id",
                    str(i),
                    "--log-level",
                    "warning",
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
            )
            for i in range(2)
        ]

    procs = actors() if mode == "before" else []
    from zmq_rl.config import LearnerConfig, PolicyConfig, PPOConfig
    from zmq_rl.learner.loop import Learner

    marks: dict[str, float] = {}

    def on_update(row: dict) -> None:
        marks.setdefault("first_update", time.monotonic() - T0)
        learner.request_stop("launch benchmark done")

    learner = Learner(
        LearnerConfig(num_actors=2, port=port, run_dir="", checkpoint_every=0),
        PPOConfig(),
        PolicyConfig(),
        on_update=on_update,
    )
    marks["learner_built"] = time.monotonic() - T0
    if mode == "after":
        procs = actors()
    try:
        learner.run()
    finally:
        learner.close()
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    print("RESULT " + json.dumps(marks), flush=True)


def run(mode: str) -> dict:
    port = _util.free_port_block(3)
    t = time.monotonic()
    done = subprocess.run(
        [sys.executable, __file__, "--child", mode, "--port", str(port)],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    wall = time.monotonic() - t
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"launch child {mode} failed:\n{done.stdout}\n{done.stderr}")
    return {"mode": mode, **json.loads(line[7:]), "process_wall_s": wall}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _util.add_common_flags(parser)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--child", choices=("after", "before"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.port)
        return 0
    if args.smoke:
        args.rounds = 1
    runs = []
    for r in range(args.rounds):
        for mode in ("after", "before") if r % 2 == 0 else ("before", "after"):
            res = run(mode)
            runs.append(res)
            print(
                f"round {r} {mode:>6}: learner built {res['learner_built']:.1f}s, first update "
                f"{res['first_update']:.1f}s",
                flush=True,
            )
    summary = {
        m: _util.median([x["first_update"] for x in runs if x["mode"] == m])
        for m in ("after", "before")
    }
    print(
        f"median launch -> first update: actors after the learner (today) "
        f"{summary['after']:.2f}s, actors first {summary['before']:.2f}s "
        f"(saves {summary['after'] - summary['before']:.2f}s)"
    )
    _util.write_result("launch", args, {"runs": runs, "summary_first_update_s": summary})
    return 0


if __name__ == "__main__":
    sys.exit(main())
