"""An env that returns NaN is named at the source (issue 29, item 4).

Before, an env whose observations turned NaN after 20 steps made the learner refuse
every fragment of its actor (``not_finite``): 67 s of ``declared dead`` /
``registering again``, then ``learner starved``, and nothing said which env, slot or
step. Now the client refuses such a step before it is buffered
(:class:`zmq_rl.actor.client.BadExperience`, for embedders too) and the built-in actor stops
with one error naming the env id, the slot, the step and the field; ``zmq-rl run``
then stops at once (a restart would run into the same value). Real processes, as a
user runs them.
"""

from __future__ import annotations

import re
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import (
    ACT_SPACE,
    OBS_SPACE,
    TIMEOUT,
    register_while_pumping,
    stub_learner_config,
)
from tests.test_user_envs import zmq_rl_run
from zmq_rl.actor.client import ActorClient, BadExperience
from zmq_rl.config import PPOConfig
from zmq_rl.learner.loop import Learner

NAN_ENV = textwrap.dedent(
    '''
    """Envs that go bad after `after` steps (written into the test's working directory)."""
    import gymnasium as gym
    import numpy as np


    class NanAfter(gym.Env):
        """Observation [t, t]; from step `after` on, `field` is NaN (obs) or huge."""

        observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def __init__(self, after=20, field="obs"):
            self.after, self.field, self.t = int(after), field, 0

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.t = 0
            return np.zeros(2, np.float32), {}

        def step(self, action):
            self.t += 1
            obs = np.full(2, self.t, np.float32)
            reward = 1.0
            if self.t >= self.after:
                if self.field == "obs":
                    obs[1] = np.nan
                else:
                    reward = 1e30
            return obs, reward, False, self.t >= 200, {}
    '''
)


@pytest.fixture
def nan_dir(tmp_path: Path) -> Path:
    (tmp_path / "nan_envs.py").write_text(NAN_ENV)
    return tmp_path


@pytest.mark.parametrize(
    ("kwargs", "field"), [("after=20", "observation"), ("after=20,field=reward", "reward")]
)
def test_env_returning_nan_is_named_and_the_run_stops_at_once(
    nan_dir: Path, kwargs: str, field: str
) -> None:
    """NaN observations (or a reward of 1e30) from step 20 on: the actor exits naming
    env id, slot, step and field, within seconds of starting to collect; the run fails
    at once with that line (no restarts, no declared-dead loop, no starvation)."""
    start = time.monotonic()
    done = zmq_rl_run(
        nan_dir, "--env", "nan_envs:NanAfter", "--env-kwargs", kwargs,
        "--eval-every", "0", "--actor-restarts", "3", steps=10_000,
    )  # fmt: skip
    elapsed = time.monotonic() - start
    assert done.returncode == 1, done.stderr[-3000:]
    expected = (
        f"env nan_envs:NanAfter returned a non-finite or out-of-range {field} in slot 0 at "
        "step 20 of its episode"
    )
    log = (nan_dir / "run" / "logs" / "actor-0.log").read_text()
    assert expected in log, log[-3000:]
    assert expected in done.stderr, done.stderr[-3000:]
    for symptom in ("declared dead", "registering again", "starved", "restarting"):
        assert symptom not in done.stderr + log, symptom
    # The run says it within 5 s of the actor starting to collect.
    collecting = re.search(r"^(\d\d):(\d\d):(\d\d) INFO .* collecting on", log, re.M)
    stopping = re.search(
        r"^(\d\d):(\d\d):(\d\d) WARNING .*stopping the run: actor 0", done.stderr, re.M
    )
    assert collecting and stopping, (log, done.stderr)
    seconds = [
        int(h) * 3600 + int(m) * 60 + int(s) for h, m, s in (collecting.groups(), stopping.groups())
    ]
    assert (seconds[1] - seconds[0]) % 86400 <= 5, (collecting.group(0), stopping.group(0))
    print(f"\nrun failed after {elapsed:.1f}s: {done.stderr.strip().splitlines()[-1][:300]}")


@pytest.fixture
def registered(ctx, learner_port):
    """A learner (not running its loop) and an ActorClient (1 stub slot) registered."""
    learner = Learner(stub_learner_config(learner_port), PPOConfig(num_epochs=1), context=ctx)
    client = ActorClient(
        f"127.0.0.1:{learner_port}",
        env_id="stub",
        observation_space=OBS_SPACE,
        action_space=ACT_SPACE,
        context=ctx,
        register_timeout=TIMEOUT,
    )
    try:
        register_while_pumping(learner, client, TIMEOUT)
        yield client
    finally:
        client.close()
        learner.close()


def test_client_refuses_a_step_the_learner_would_refuse(registered: ActorClient) -> None:
    """For embedders: ActorClient.step / send_fragment raise BadExperience naming the
    field, slot and step before anything is buffered or sent (the learner's limits)."""
    client = registered
    f32 = np.float32
    obs, nan = np.zeros((1, 2), f32), np.array([[1.0, np.nan]], f32)
    good = dict(
        actions=np.zeros(1, np.int64), rewards=np.ones(1, f32), terminated=np.zeros(1, bool),
        truncated=np.zeros(1, bool), values=np.zeros(1, f32), log_probs=np.zeros(1, f32),
    )  # fmt: skip
    client.step(obs, **good, next_obs=obs)
    cases = [
        ("next_obs", dict(good, next_obs=nan)),
        ("rewards", dict(good, rewards=np.array([1e30], f32), next_obs=obs)),
        ("values", dict(good, values=np.array([np.inf], f32), next_obs=obs)),
        ("final_obs", dict(good, truncated=np.ones(1, bool), next_obs=obs, final_obs={0: nan[0]})),
    ]
    for field, arrays in cases:
        with pytest.raises(BadExperience, match=f"slot 0, step 2 since the welcome: .*{field}"):
            client.step(obs, **arrays)
        assert int(client.sender.slot_steps[0]) == 1  # nothing was buffered
    rows = {k: np.repeat(v, 3, axis=0) for k, v in good.items()}
    rows["rewards"] = np.array([1.0, 1.0, np.nan], f32)
    with pytest.raises(BadExperience, match="slot 0, step 4 since the welcome") as info:
        client.send_fragment(0, obs=np.zeros((3, 2), f32), **rows, next_obs=obs[0])
    assert (info.value.field, info.value.slot, info.value.step) == ("rewards", 0, 4)
    assert client.stats.get("steps_sent", 0) == 0
