"""The start-up order of a run with a fleet (docs/design.md §10, "Start-up"): the
learner's sockets are bound first (no torch), then the fleet starts, then the learner
imports torch and builds its trainer on those sockets."""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import pytest
from rich.console import Console

from tests.ports import free_port_block
from zmq_rl.config import LearnerConfig, PolicyConfig, PPOConfig
from zmq_rl.learner.ingest import bind_ingest_sockets
from zmq_rl.learner.loop import Learner
from zmq_rl.learner.report import LearnerReport
from zmq_rl.run.common import CliFailure
from zmq_rl.run.session import StartingLearner, train

ROOT = Path(__file__).resolve().parents[1]

FLEET_RUN = textwrap.dedent(
    """
    import io, json, socket, sys
    from rich.console import Console
    from zmq_rl.config import LearnerConfig, PolicyConfig, PPOConfig
    from zmq_rl.run.session import train

    seen = {}

    class Fleet:
        failure = ""

        def __init__(self, learner):
            self.learner = learner

        def __enter__(self):
            seen["torch_at_fleet_start"] = "torch" in sys.modules
            with socket.create_connection(("127.0.0.1", self.learner.cfg.port), 5):
                seen["control_port_bound"] = True
            seen["report_before"] = self.learner.report.updates_completed
            self.learner.request_stop("the fleet asked before the learner was built")
            return self

        def __exit__(self, *exc):
            seen["torch_at_fleet_stop"] = "torch" in sys.modules

        def summary(self):
            return {}

    cfg = LearnerConfig(
        env_id="CartPole-v1", num_actors=1, num_envs=2, num_steps=16, fragment_length=8,
        total_env_steps=64, port=int(sys.argv[1]), starvation_timeout=30.0,
    )
    outcome = train(
        cfg, PPOConfig(), PolicyConfig(), Console(file=io.StringIO()), around_run=Fleet
    )
    seen["stop_reason"] = outcome.report.stop_reason
    print(json.dumps(seen))
    """
)


@pytest.mark.timeout(120)
def test_a_fleet_starts_on_bound_sockets_before_torch_is_imported():
    """A fresh process: the fleet is entered with the control port bound and torch not
    imported, and a stop it asks for before the learner exists ends the run."""
    port = free_port_block()
    done = subprocess.run(
        [sys.executable, "-c", FLEET_RUN, str(port)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {
        "torch_at_fleet_start": False,
        "control_port_bound": True,
        "report_before": 0,
        "torch_at_fleet_stop": True,
        "stop_reason": "the fleet asked before the learner was built",
    }


class _Fleet:
    failure = ""
    entered = False

    def __init__(self, learner: object) -> None:
        self.learner = learner

    def __enter__(self) -> _Fleet:
        _Fleet.entered = True
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def summary(self) -> dict:
        return {}


def test_a_port_in_use_fails_before_the_fleet_starts():
    port = free_port_block()
    taken = socket.socket()
    taken.bind(("127.0.0.1", port + 1))  # the experience port
    taken.listen()
    cfg = LearnerConfig(env_id="CartPole-v1", num_actors=1, port=port)
    _Fleet.entered = False
    try:
        with pytest.raises(CliFailure, match=f"ports {port}-{port + 2}"):
            train(
                cfg,
                PPOConfig(),
                PolicyConfig(),
                Console(file=io.StringIO()),
                around_run=_Fleet,
            )
    finally:
        taken.close()
    assert not _Fleet.entered


def test_the_learner_takes_the_sockets_it_is_given_and_refuses_another_configs():
    port = free_port_block()
    cfg = LearnerConfig(env_id="CartPole-v1", num_actors=1, port=port)
    env = gym.make("CartPole-v1")
    sockets = bind_ingest_sockets(cfg, env.observation_space, env.action_space)
    with Learner(cfg, PPOConfig(), PolicyConfig(), sockets=sockets) as learner:
        assert learner.ingest.sockets is sockets
        assert learner.ingest.control is sockets.control
    assert sockets.experience.closed and sockets.control.closed  # the learner owned them

    # Another port: a closed socket frees its port a moment later (libzmq's I/O thread).
    other = LearnerConfig(
        env_id="CartPole-v1", num_actors=1, port=free_port_block(), max_message_bytes=4096
    )
    sockets = bind_ingest_sockets(other, env.observation_space, env.action_space)
    try:
        with pytest.raises(ValueError, match="message limits"):
            Learner(cfg, PPOConfig(), PolicyConfig(), sockets=sockets)
    finally:
        sockets.close()


def test_a_starting_learner_is_the_learner_once_attached():
    port = free_port_block()
    cfg = LearnerConfig(env_id="CartPole-v1", num_actors=1, port=port)
    env = gym.make("CartPole-v1")
    sockets = bind_ingest_sockets(cfg, env.observation_space, env.action_space)
    starting = StartingLearner(cfg, sockets)
    assert starting.cfg is cfg and isinstance(starting.report, LearnerReport)
    starting.actor_exited(1234)  # no learner to tell yet: nothing happens
    assert starting.learner_restarts is None
    starting.request_stop("first")
    starting.request_stop("second")  # the first reason is kept

    class Built:
        cfg = LearnerConfig(env_id="CartPole-v1", num_actors=3, port=port)
        report = LearnerReport(updates_completed=7)
        stops: list[str] = []
        closed = False

        def request_stop(self, reason: str) -> None:
            self.stops.append(reason)

        exited: list[int] = []
        learner_restarts = [{"restart": 1}]

        def actor_exited(self, pid: int) -> None:
            self.exited.append(pid)

        def close(self) -> None:
            Built.closed = True

    built = Built()
    starting.attach(built)
    assert built.stops == ["first"]
    assert starting.cfg is Built.cfg and starting.report.updates_completed == 7
    starting.actor_exited(4321)
    assert built.exited == [4321] and starting.learner_restarts == [{"restart": 1}]
    starting.request_stop("later")
    assert built.stops == ["first", "later"]
    starting.close()
    assert Built.closed and not sockets.experience.closed  # the learner's to close now
    sockets.close()

    # Other ports: closing a socket frees its port a moment later (libzmq's I/O thread).
    other = LearnerConfig(env_id="CartPole-v1", num_actors=1, port=free_port_block())
    unbuilt = StartingLearner(
        other, bind_ingest_sockets(other, env.observation_space, env.action_space)
    )
    unbuilt.close()
    assert unbuilt.sockets.experience.closed and unbuilt.sockets.control.closed
