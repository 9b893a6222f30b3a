"""Launch cost: actors started after the learner is built vs before it imports torch.

Until stop 43 ``zmq-rl run`` constructed the :class:`~zmq_rl.learner.loop.Learner`
(torch, gymnasium, the policy, Adam, the sockets) and only then started its actor
processes, so the two start-ups ran one after the other. Now it binds the learner's
sockets (no torch), starts the actors, and then imports torch and builds the learner
on those sockets (docs/design.md §10, "Start-up"). This measures, each in a fresh
process (``python bench/launch.py --child MODE``), the time from the child's launch to
the learner's first update, with 2 actors x 4 envs and ``zmq-rl run``'s defaults:

* ``after``: import the learner, build it, then ``Popen`` the actors (before stop 43);
* ``before``: bind the sockets, ``Popen`` the actors, then import and build the
  learner on the sockets (``zmq-rl run`` now).

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
                    # Their own session, so it is not killed with this group: they exit
                    # when this process is gone instead (a smoke test that timed out).
                    "--parent-pid",
                    str(os.getpid()),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
            )
            for i in range(2)
        ]

    from zmq_rl.config import LearnerConfig, PolicyConfig, PPOConfig

    cfg = LearnerConfig(num_actors=2, port=port, run_dir="", checkpoint_every=0)
    sockets, procs = None, []
    if mode == "before":
        from zmq_rl.envs import env_shape
        from zmq_rl.learner.ingest import bind_ingest_sockets

        shape = env_shape(cfg.env_id)
        sockets = bind_ingest_sockets(cfg, shape.observation_space, shape.action_space)
        procs = actors()
    from zmq_rl.learner.loop import Learner

    marks: dict[str, float] = {}

    def on_update(row: dict) -> None:
        marks.setdefault("first_update", time.monotonic() - T0)
        learner.request_stop("launch benchmark done")

    learner = Learner(cfg, PPOConfig(), PolicyConfig(), on_update=on_update, sockets=sockets)
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
        [sys.executable, __file__, "--child", mode, "--child-port", str(port)],
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
    parser.add_argument("--child-port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.child_port)
        return 0
    if args.smoke:
        args.rounds = 1
    runs = []
    for r in range(args.rounds):
        for mode in _util.round_order(("after", "before"), r):
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
    # Rounds pair the two modes back to back: the median of each round's difference
    # divides out the box's drift over the run (caches warming, load).
    pairs = range(0, len(runs), 2)
    rounds = [{x["mode"]: x["first_update"] for x in runs[i : i + 2]} for i in pairs]
    saved = _util.median([r["after"] - r["before"] for r in rounds])
    print(
        f"median launch -> first update: actors after the learner is built "
        f"{summary['after']:.2f}s, bound first, then actors, then the learner (zmq-rl run) "
        f"{summary['before']:.2f}s; saved per round (median) {saved:.2f}s"
    )
    _util.write_result(
        "launch",
        args,
        {"runs": runs, "summary_first_update_s": summary, "saved_per_round_s": saved},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
