"""Weights larger than 256 MiB reach an actor (issue 19, finding 6).

A learner (in this process, driven by hand) with a CartPole policy of one shared
hidden layer pair of ``--hidden`` units (8200: 269 MB of float32 weights, over the
256 MiB that used to be the actor's fixed limit) welcomes a real ``ActorClient``
(default limits: the control socket takes the welcome whatever its size, the weights
SUB follows the learner's announced ``max_weights_bytes``), then broadcasts
``--broadcasts`` new versions; the client must load each. Prints the weights size,
the announced limit, the welcome's and each broadcast's time, and the client's
rejects (none expected). Exit 1 if a broadcast does not arrive within ``--timeout``.

    python bench/big_weights.py                  # 269 MB weights
    python bench/big_weights.py --smoke          # 1 MB: checks the script runs
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

import _util
import zmq

from tests.helpers import TIMEOUT
from zmq_rl.actor.client import ActorClient
from zmq_rl.config import LearnerConfig, PolicyConfig, PPOConfig
from zmq_rl.learner.loop import Learner


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=8200, help="units per hidden layer")
    parser.add_argument("--broadcasts", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=600.0)
    _util.add_common_flags(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        args.hidden = min(args.hidden, 256)
    ctx = zmq.Context()
    port = _util.free_port_block(3)
    cfg = LearnerConfig(
        env_id="CartPole-v1", port=port, num_actors=1, num_envs=1, starvation_timeout=TIMEOUT
    )
    policy = PolicyConfig(
        hidden_sizes=(args.hidden, args.hidden), shared_trunk=True, ortho_init=False
    )
    start = time.monotonic()
    learner = Learner(cfg, PPOConfig(num_epochs=1), policy, context=ctx)
    weights_bytes = sum(t.nbytes for _, t in learner.current_weights.tensors)
    announced = getattr(learner.settings, "max_weights_bytes", None)
    print(
        f"policy built in {time.monotonic() - start:.1f}s: {weights_bytes:,} bytes of weights "
        f"({weights_bytes / 2**20:.1f} MiB); learner announces max_weights_bytes={announced}"
    )
    client = ActorClient(
        f"127.0.0.1:{port}",
        env_id="CartPole-v1",
        observation_space=learner.settings.observation_space,
        action_space=learner.settings.action_space,
        context=ctx,
        register_timeout=args.timeout,
    )
    result: dict[str, object] = {"weights_bytes": weights_bytes, "announced": announced}
    ok = True
    try:
        registering = threading.Thread(target=client.register, daemon=True)
        t0 = time.monotonic()
        registering.start()
        while registering.is_alive() and time.monotonic() - t0 < args.timeout:
            learner.pump(20)
        result["welcome_s"] = round(time.monotonic() - t0, 2)
        ok = client.welcome is not None
        print(f"welcome received in {result['welcome_s']}s: {ok}")
        times = []
        for _ in range(args.broadcasts if ok else 0):
            learner.trainer.next_version()
            t1 = last = time.monotonic()
            learner.publish_weights()
            while client.version < learner.version and time.monotonic() - t1 < args.timeout:
                learner.pump(20)
                client.poll()
                if time.monotonic() - last > 5.0:  # PUB drops what no subscriber takes
                    learner.publish_weights()
                    last = time.monotonic()
            arrived = client.version == learner.version
            times.append(round(time.monotonic() - t1, 2))
            print(f"broadcast of version {learner.version}: arrived {arrived} in {times[-1]}s")
            ok = ok and arrived
        result.update(broadcast_s=times, client_rejects=dict(client.rejects), ok=ok)
        print(f"client rejects: {dict(client.rejects)}")
    finally:
        client.close()
        learner.close()
        ctx.destroy(linger=0)
    _util.write_result("big_weights", args, result)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
