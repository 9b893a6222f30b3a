"""Forged weights against the real ``zmq-actor`` process, on every inference path (issue
44, section 3, first item).

docs/protocol.md section 4.2: weights whose tensors do not fit the network exactly (a
scalar ``[]`` where the network has ``[1]``, a wrong shape) are refused, counted as
``weights:wrong_tensors`` and logged naming the tensor and both shapes, and the
actor's version does not move. The report was of a fake learner that published
``value_head.bias`` as a scalar at version 10**12: the real actor's fragments carried
that version from then on and every later good version was ignored. The existing
tests (tests/test_hostile_actor.py) run a ``GymActor`` in a thread of the test; here
the console script runs as its own process, against :class:`FakeLearner` (ROUTER,
PULL and XPUB on 127.0.0.1), for each way the shipped actor acts: the plain MLP, the
recurrent network, the structured (Dict) network, a masked action space, several
policies of a multi-agent env (per-policy weights on their own topics), a turn-based
game's board network, and a custom factory that only torch builds (the torch module
path).

Each case, in one actor process:

1. welcome at version 1 (good weights); fragments of version 1 arrive;
2. a broadcast at version 10**12 whose ``[1]`` tensors are scalars ``[]`` (several
   policies: one policy's publication); the actor logs the refusal (the tensor, both
   shapes); then version 2: fragments of version 2 arrive;
3. ``refuse reregister``, and the welcome back into the same run carries weights at
   version 10**12 whose ``[1]`` tensors are ``[1, 1]``: the actor registers at
   version 2 (the welcome's weights refused), and loads version 3 when it is
   published;
4. shutdown: the actor says bye (last version 3, two updates adopted) and exits 0.

No fragment may show the forged weights: not their version, not their values (the
forged tensors hold 12345, so a value head biased by them values every state near
that) and not the lead they would allow (the valve, rows batches with ``S = L = 16``,
lets the actor record 16 rows per slot more per version; a forged version adopted
opens it, which is what would show in a run of several policies, whose fragments
carry the oldest policy's version). Every wait is bounded and on an observable event
(a log line, a message, an exit).
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

from tests.conftest import free_port_block
from tests.helpers import FakeLearnerSockets
from tests.process_groups import ProcessGroups
from zmq_rl.config import PolicyConfig, config_dict
from zmq_rl.envs.factory import env_shape
from zmq_rl.rl.numpy_nets import fresh_weights, numpy_network
from zmq_rl.wire.protocol import (
    Bye,
    Fragment,
    Hello,
    Message,
    Refuse,
    RunSettings,
    Shutdown,
    Weights,
    Welcome,
    decode,
    encode,
    policy_weights_frames,
    weights_topic,
)

ROOT = Path(__file__).resolve().parents[1]
RUN = "forged"
FORGED = 10**12
FORGED_VALUE = 12345.0
"""What every forged scalar holds: a value head biased by it values every state at
about this, far from what the good weights (biases 0) give."""
VALUE_BOUND = 1000.0
"""No fragment's ``values`` may reach this: they would be the forged weights'."""
WAIT_S = 45.0
"""Bound on each event of a case (an actor process starting on a busy 2-core box)."""
EXIT_S = 15.0
STEPS = 16
"""``steps_per_broadcast`` and ``max_lead_steps``: steps per slot each version allows."""
MOST_ROWS = 5 * STEPS
"""Rows per slot the valve allows in a case: version 2 over base 0 (``2 S + L``), then
version 3 over base 2 (``S + L``). A forged version adopted opens the valve (in a run
of several policies the valve's version is the newest policy's, while fragments carry
the oldest)."""
TORCH_FACTORY = '''
"""The built-in MLP as a custom factory: only torch builds it, so the actor acts with
a torch module (the inference path of custom networks)."""
from dataclasses import replace

from zmq_rl.rl.policy import build_policy


def mlp(observation_space, action_space, cfg):
    return build_policy(observation_space, action_space, replace(cfg, factory=""))
'''

SMALL = dict(hidden_sizes=(16, 16))


@dataclasses.dataclass(frozen=True)
class InferencePath:
    """One inference path: the env the actor steps, the network the welcome names."""

    env_id: str
    policy: PolicyConfig
    env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    policies: dict[str, PolicyConfig] = dataclasses.field(default_factory=dict)
    policy_map: tuple[str, ...] = ()  # several policies: each agent's
    numpy_like: PolicyConfig | None = None  # the numpy network whose layout a factory has


def _paths() -> list[Any]:
    lstm = PolicyConfig(**SMALL, policy_type="lstm")
    red = PolicyConfig(**SMALL)
    blue = PolicyConfig(hidden_sizes=(8,), activation="relu")
    cases = {
        "mlp": InferencePath("CartPole-v1", PolicyConfig(**SMALL)),
        "lstm": InferencePath("CartPole-v1", lstm),
        "dict": InferencePath("tests.space_envs:DictObs-v0", PolicyConfig(**SMALL)),
        "masked": InferencePath("tests.space_envs:MaskedBandit-v0", PolicyConfig(**SMALL)),
        "policies": InferencePath(
            "tests.agent_envs:coming_and_going",
            red,
            env_kwargs={"roles": True},
            policies={"red": red, "blue": blue},
            policy_map=("red", "red", "blue", "blue"),
        ),
        "board": InferencePath(
            "pettingzoo.classic.connect_four_v3",
            PolicyConfig(factory="zmq_rl.rl.boards:drop_game_cnn"),
        ),
        "torch": InferencePath(
            "CartPole-v1",
            PolicyConfig(**SMALL, factory="forged_factory:mlp"),
            numpy_like=PolicyConfig(**SMALL),
        ),
    }
    needs_pettingzoo = pytest.mark.skipif(
        _missing("pettingzoo"), reason="pettingzoo is not installed"
    )
    needs_torch = pytest.mark.skipif(_missing("torch"), reason="torch is not installed")
    marks = {"policies": needs_pettingzoo, "board": needs_pettingzoo, "torch": needs_torch}
    return [pytest.param(path, id=name, marks=marks.get(name, ())) for name, path in cases.items()]


def _missing(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is None


# -- the fake learner -------------------------------------------------------------------


class FakeLearner(FakeLearnerSockets):
    """ROUTER on ``port``, PULL on +1, XPUB on +2: enough of a learner to welcome a real
    actor process, publish what a test wants and read what the actor sends."""

    def __init__(self, ctx: zmq.Context, port: int, actor: Actor) -> None:
        super().__init__(ctx, port)
        self.actor = actor
        self.versions: list[int] = []  # of every fragment received, in order
        self.rows: Counter[int] = Counter()  # rows received per slot
        self.largest_value = 0.0  # the largest |value| of any row received
        self.seqs: list[int] = []  # their seq (counted from 0 by each registration)
        self.subscriptions: list[bytes] = []  # topics subscribed, in order
        self.control: list[tuple[bytes, Message]] = []  # not yet taken by recv_control

    def close(self) -> None:
        for sock in (self.router, self.pull, self.pub):
            sock.close(linger=0)

    def pump(self, timeout_ms: int) -> None:
        """Wait up to ``timeout_ms`` for anything, then read every socket empty."""
        poller = zmq.Poller()
        for sock in (self.router, self.pull, self.pub):
            poller.register(sock, zmq.POLLIN)
        poller.poll(timeout_ms)
        while self.pull.poll(0):
            fragment = decode(self.pull.recv(), (Fragment,))
            assert isinstance(fragment, Fragment)
            self.versions.append(fragment.version)
            self.seqs.append(fragment.seq)
            for slot in fragment.slots:
                self.rows[int(slot)] += len(fragment.rewards)
            self.largest_value = max(self.largest_value, float(np.abs(fragment.values).max()))
        while self.pub.poll(0):
            event = self.pub.recv()
            if event[:1] == b"\x01":
                self.subscriptions.append(event[1:])
        while self.router.poll(0):
            routing_id, frame = self.router.recv_multipart()
            self.control.append((routing_id, decode(frame)))

    def wait(
        self, condition: Callable[[], Any], what: str, timeout: float = WAIT_S, exited: bool = False
    ) -> Any:
        """Pump until ``condition()`` is truthy (its value), or fail naming ``what`` with
        the actor's log; fail at once if the actor exited (unless ``exited``) or
        :meth:`check` finds a sign of the forged weights."""
        deadline = time.monotonic() + timeout
        while True:
            self.check()
            if value := condition():
                return value
            if not exited and not self.actor.alive():
                pytest.fail(f"the actor exited while waiting for {what}:\n{self.actor.tail()}")
            if time.monotonic() > deadline:
                pytest.fail(f"no {what} within {timeout:.0f}s:\n{self.actor.tail()}")
            self.pump(50)

    def check(self) -> None:
        """Fail if the fragments show that the actor adopted forged weights: their
        version, values of the forged value head, or more rows than the valve allows."""
        problems = []
        if FORGED in self.versions:
            problems.append(f"a fragment carried the forged version {FORGED}")
        if self.largest_value >= VALUE_BOUND:
            problems.append(f"a fragment carried a value of {self.largest_value:g}")
        if self.rows and max(self.rows.values()) > MOST_ROWS:
            problems.append(f"rows per slot {dict(self.rows)} passed the valve's {MOST_ROWS}")
        if problems:
            pytest.fail(f"{'; '.join(problems)}:\n{self.actor.tail()}")

    def recv_control(self, kind: type[Message]) -> tuple[bytes, Any]:
        """The next control message of type ``kind`` (heartbeats and others skipped)."""

        def taken() -> tuple[bytes, Any] | None:
            while self.control:
                routing_id, message = self.control.pop(0)
                if isinstance(message, kind):
                    return routing_id, message
            return None

        return self.wait(taken, f"{kind.__name__} from the actor")

    def welcome(
        self, routing_id: bytes, settings: RunSettings, weights: list[Weights], base: int
    ) -> None:
        several = len(weights) > 1
        message = Welcome(
            actor_id=0,
            run_id=RUN,
            base_version=base,
            experience_port=self.port + 1,
            weights_port=self.port + 2,
            settings=settings,
            weights=weights[0],
            token=bytes(16),
            policy_weights=weights if several else [],
        )
        self.router.send_multipart([routing_id, encode(message)])

    def publish(self, weights: list[Weights]) -> None:
        """Publish as a learner does: one frame, or each policy on its own topic."""
        for w in weights:
            self.pub.send_multipart(policy_weights_frames(w) if w.policy else [encode(w)])

    def wait_subscribed(self, since: int, topics: list[bytes]) -> None:
        """Wait for the actor's SUB to subscribe (again) to every one of ``topics``."""
        self.wait(
            lambda: set(topics) <= set(self.subscriptions[since:]),
            f"a subscription to {topics}",
        )

    def wait_fragment(self, version: int) -> None:
        self.wait(lambda: version in self.versions, f"a fragment of version {version}")


# -- the actor process ------------------------------------------------------------------


class Actor:
    """The ``zmq-actor`` console script (else ``python -m zmq_rl.cli.actor``) as a
    process of its own session, its output in a file."""

    def __init__(self, groups: ProcessGroups, argv: list[str], log: Path, env: dict) -> None:
        self.log = log
        script = Path(sys.executable).parent / "zmq-actor"
        command = [str(script)] if script.is_file() else [sys.executable, "-m", "zmq_rl.cli.actor"]
        with open(log, "wb") as out:
            self.proc = groups.popen(
                [*command, *argv],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def tail(self, lines: int = 40) -> str:
        body = "\n".join(self.text().splitlines()[-lines:])
        return f"--- zmq-actor (pid {self.proc.pid}, rc {self.proc.poll()}) ---\n{body}"


REGISTERED = re.compile(r"registered as actor \d+ of run \w+ \(version (\d+), base version \d+\)")
REFUSED = re.compile(r"rejected a weights message \(wrong_tensors\): (.*)")


# -- the run's settings and weights -------------------------------------------------------


@dataclasses.dataclass
class Run:
    """What the fake learner says about the run: settings, and weights of any version."""

    settings: RunSettings
    layouts: dict[str, list[tuple[str, np.ndarray]]]  # policy id ("" for one) -> tensors

    def weights(
        self, version: int, forge: str | None = None, shape: tuple[int, ...] = ()
    ) -> list[Weights]:
        """Every policy's weights at ``version``; those of policy ``forge`` (``""``:
        the run's one policy) forged (:meth:`forged`)."""
        return [
            self.forged(version, pid, shape)
            if pid == forge
            else Weights(version=version, run_id=RUN, tensors=tensors, policy=pid)
            for pid, tensors in self.layouts.items()
        ]

    def forged(self, version: int, policy: str, shape: tuple[int, ...] = ()) -> Weights:
        """Policy ``policy``'s weights at ``version`` with every ``[1]`` tensor sent in
        ``shape`` (a scalar ``[]`` by default) holding :data:`FORGED_VALUE`."""
        tensors = [
            (n, np.full(shape, FORGED_VALUE, a.dtype) if a.shape == (1,) else a)
            for n, a in self.layouts[policy]
        ]
        return Weights(version=version, run_id=RUN, tensors=tensors, policy=policy)

    def forged_tensor(self, policy: str) -> str:
        """The first ``[1]`` tensor (in ``state_dict`` order) of ``policy``: the one a
        refusal names."""
        names = [n for n, a in self.layouts[policy] if a.shape == (1,)]
        assert names, f"no [1] tensor to forge in {[n for n, _ in self.layouts[policy]]}"
        return names[0]


def make_run(path: InferencePath, hello: Hello) -> Run:
    shape = env_shape(path.env_id, path.env_kwargs)
    obs_space, act_space = shape.observation_space, shape.action_space
    rng = np.random.default_rng(0)
    configs = path.policies or {"": path.policy}
    layouts = {
        pid: fresh_weights(obs_space, act_space, path.numpy_like or cfg, rng)
        for pid, cfg in configs.items()
    }
    net = numpy_network(obs_space, act_space, path.numpy_like or path.policy, rng)
    assert net is not None
    settings = RunSettings(
        env_id=path.env_id,
        observation_space=obs_space,
        action_space=act_space,
        policy=config_dict(path.policy),
        num_steps=STEPS,
        broadcast_every=1,
        steps_per_broadcast=STEPS,
        max_lead_steps=STEPS,
        fragment_length=8,
        num_envs=hello.num_envs,
        seed=0,
        heartbeat_interval=1.0,
        state_size=net.state_size,
        max_weights_bytes=1 << 22,
        max_fragment_bytes=1 << 22,
        env_kwargs=dict(path.env_kwargs),
        agents_per_env=shape.agents_per_env,
        policy_map=list(path.policy_map),
        policies={pid: config_dict(cfg) for pid, cfg in path.policies.items()},
        batch_rows=STEPS,  # rows batches: a version never proves the actor was dropped
    )
    return Run(settings, layouts)


# -- the test ---------------------------------------------------------------------------


@pytest.fixture
def groups() -> Iterator[ProcessGroups]:
    with ProcessGroups() as started:
        yield started


@pytest.mark.parametrize("path", _paths())
def test_forged_weights_never_reach_the_actor_process(path, groups, ctx, tmp_path, request):
    """``[1]`` tensors sent as scalars in a broadcast at version 10**12, and as
    ``[1, 1]`` in a welcome back into the run at 10**12, are refused by the real actor
    process (the first logged naming the tensor and both shapes), which goes on with
    the good versions that follow and exits 0 on shutdown; no fragment shows the
    forged weights (the module docstring)."""
    (tmp_path / "forged_factory.py").write_text(TORCH_FACTORY)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)]),
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
    }
    port = free_port_block(3)
    argv = ["--learner", f"127.0.0.1:{port}", "--env", path.env_id, "--num-envs", "1"]
    argv += ["--learner-timeout", "60", "--register-timeout", "60", "--log-level", "info"]
    started = time.monotonic()
    actor = Actor(groups, argv, tmp_path / "actor.log", env)
    fake = FakeLearner(ctx, port, actor)
    try:
        routing_id, hello = fake.recv_control(Hello)
        run = make_run(path, hello)
        several = bool(path.policies)
        topics = [weights_topic(p) for p in path.policies] or [b""]
        victim = "blue" if several else ""

        # 1. Welcomed at version 1 with good weights: it acts with them.
        fake.welcome(routing_id, run.settings, run.weights(1), base=0)
        fake.wait_subscribed(0, topics)
        fake.wait_fragment(1)

        # 2. A forged broadcast at 10**12 (several policies: of one policy) is refused
        # and logged; version 2 loads.
        fake.publish([run.forged(FORGED, victim)])
        refusal = fake.wait(lambda: REFUSED.search(actor.text()), "the refusal's log line")
        line = refusal.group(1)
        tensor = run.forged_tensor(victim)
        assert f"weights version {FORGED}" in line and repr(tensor) in line, line
        assert "shape (1,)" in line and "shape ()" in line, line
        fake.publish(run.weights(2))
        fake.wait_fragment(2)

        # 3. Told to register again; the welcome into the same run carries weights at
        # 10**12 with [1, 1] for [1]: registered, but at version 2 (the weights
        # refused; the refusal is not logged, only the 1st, 10th, ... are); version 3
        # loads.
        since, rejoined = len(fake.subscriptions), len(fake.seqs)
        fake.router.send_multipart([routing_id, encode(Refuse("reregister", "forgot you"))])
        routing_id, _ = fake.recv_control(Hello)
        fake.welcome(routing_id, run.settings, run.weights(FORGED, victim, (1, 1)), base=2)
        registered = fake.wait(
            lambda: (found := REGISTERED.findall(actor.text()))[1:] and found,
            "the second registration's log line",
        )
        assert registered == ["1", "2"], registered
        fake.wait_subscribed(since, topics)
        fake.publish(run.weights(3))
        fake.wait_fragment(3)

        # 4. Shutdown: bye, exit 0, and every fragment sent before the bye arrives.
        fake.router.send_multipart([routing_id, encode(Shutdown("done", run_id=RUN))])
        _, bye = fake.recv_control(Bye)
        try:
            rc = actor.proc.wait(EXIT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the actor did not exit within {EXIT_S}s of its bye:\n{actor.tail()}")
        fake.wait(
            lambda: bye.last_seq in fake.seqs[rejoined:],
            f"the fragments up to seq {bye.last_seq}",
            EXIT_S,
            exited=True,
        )
    finally:
        fake.close()
    assert rc == 0, actor.tail()
    fake.check()
    assert set(fake.versions) == {1, 2, 3}, sorted(set(fake.versions))
    assert bye.stats["last_policy_version"] == 3, bye.stats
    assert bye.stats["policy_updates_received"] == 2, bye.stats
    assert len(REFUSED.findall(actor.text())) == 1  # logged sparsely: the 1st of 2
    print(
        f"\n{request.node.callspec.id}: {len(fake.versions)} fragments by version "
        f"{dict(sorted(Counter(fake.versions).items()))}, rows per slot {dict(fake.rows)}, "
        f"largest |value| {fake.largest_value:.2f}, {time.monotonic() - started:.1f}s"
    )
