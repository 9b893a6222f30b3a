"""Environments a user can name: ``--env-kwargs``, ``--env module:Class`` /
``module:make_fn``, ``--wrapper`` (repeatable, in order), and clear errors when an
env cannot be built -- on the learner and on an actor.

The real-process tests run ``zmq-rl run`` (learner + supervised actor processes,
which get the env settings from the welcome, RunSettings) from a temporary working
directory that holds the user's env module, as a user would.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import msgpack
import pytest

from tests.ports import free_port_block
from zmq_rl.config import ConfigError, LearnerConfig, parse_env_kwargs
from zmq_rl.envs import EnvBuildError, make_env
from zmq_rl.wire.protocol import ProtocolError, RunSettings

ZMQ_RL = str(Path(sys.executable).with_name("zmq-rl"))
RUN_TIMEOUT = 300  # a bound only: each run takes 5-20 s on an idle machine

USER_ENV = textwrap.dedent(
    '''
    """A user's own env module (written into the test's working directory)."""
    import sys

    import gymnasium as gym
    import numpy as np


    class Corridor(gym.Env):
        """Reward 1 per step; the episode ends after exactly `length` steps."""

        observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def __init__(self, length=10):
            self.length = int(length)
            self.t = 0

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.t = 0
            return np.zeros(2, np.float32), {}

        def step(self, action):
            self.t += 1
            obs = np.full(2, self.t / self.length, np.float32)
            return obs, 1.0, self.t >= self.length, False, {}


    def make_corridor(length=10):
        return Corridor(length=length)


    class AddOne(gym.RewardWrapper):
        def reward(self, reward):
            return reward + 1.0


    class Double(gym.RewardWrapper):
        def reward(self, reward):
            return reward * 2.0


    class ActorOnly(Corridor):
        """Builds on the learner, fails in an actor process (a missing licence)."""

        def __init__(self, length=10):
            if sys.argv[0].endswith("actor.py"):
                raise RuntimeError("no simulator licence on this host")
            super().__init__(length)
    '''
)

SMALL_RUN = [
    "--actors",
    "1",
    "--num-envs",
    "2",
    "--num-steps",
    "16",
    "--fragment-length",
    "16",
    "--num-epochs",
    "1",
    "--eval-every",
    "2",
    "--eval-episodes",
    "2",
    "--checkpoint-every",
    "0",
    "--no-plot",
    "--no-tensorboard",
    "--no-eval-in-background",  # no evaluator process: fewer moving parts under load
    "--starvation-timeout",
    "180",
]


@pytest.fixture
def user_dir(tmp_path: Path) -> Path:
    (tmp_path / "user_envs.py").write_text(USER_ENV)
    return tmp_path


def zmq_rl_run(cwd: Path, *args: str, steps: int = 320) -> subprocess.CompletedProcess[str]:
    """``zmq-rl run`` in ``cwd`` with a small budget; returns the finished process."""
    command = [
        ZMQ_RL,
        "run",
        *SMALL_RUN,
        "--port",
        str(free_port_block()),
        "--total-env-steps",
        str(steps),
        "--run-dir",
        "run",
        *args,
    ]
    return subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False
    )


def report(cwd: Path) -> dict:
    return json.loads((cwd / "run" / "report.json").read_text())


def episode_returns(cwd: Path) -> list[float]:
    """The return of every episode the actors finished, as the learner received them."""
    returns = report(cwd)["episode_rewards"]
    assert returns, "no episode was finished"
    return returns


# -- parsing and building (no processes) ------------------------------------------------


def test_env_kwargs_text_forms() -> None:
    assert parse_env_kwargs("") == {}
    assert parse_env_kwargs('{"g": -5.0, "wind": true}') == {"g": -5.0, "wind": True}
    assert parse_env_kwargs("length=5, mode=rgb_array, on=true, xs=[1,2]") == {
        "length": 5,
        "mode": "rgb_array",
        "on": True,
        "xs": [1, 2],
    }
    for bad in ("length", "{not json", "[1, 2]", "1x=2", '{"a": {"nested": 1}}'):
        with pytest.raises(ConfigError) as info:
            parse_env_kwargs(bad)
        assert info.value.field == "env_kwargs"
    with pytest.raises(ConfigError, match="env_kwargs"):
        LearnerConfig(env_kwargs="length").validate()
    with pytest.raises(ConfigError, match="wrappers"):
        LearnerConfig(wrappers=("no_colon",)).validate()
    # The Python API may pass a dict and a list: stored as text and a tuple.
    cfg = LearnerConfig(env_kwargs={"length": 3}, wrappers=["a:B"]).validate()
    assert cfg.env_kwargs_map() == {"length": 3} and cfg.wrappers == ("a:B",)


def test_make_env_forms_and_errors(user_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(user_dir)
    monkeypatch.syspath_prepend(str(user_dir))
    env = make_env("user_envs:Corridor", {"length": 3}, ["user_envs:AddOne", "user_envs:Double"])
    env.reset(seed=0)
    rewards = [env.step(0)[1] for _ in range(3)]
    assert rewards == [4.0, 4.0, 4.0]  # (1 + 1) * 2: AddOne first, then Double
    assert make_env("user_envs:make_corridor", "length=4").unwrapped.length == 4
    assert make_env("CartPole-v1", "max_episode_steps=7").spec.max_episode_steps == 7
    cases = [
        ("Nope-v0", {}, [], "env_id", "Nope-v0"),
        ("CartPole-v1", {"bogus": 1}, [], "env_id", "bogus"),
        ("user_envs:Missing", {}, [], "env_id", "neither registers"),
        ("no_such_module:Env", {}, [], "env_id", "cannot import module 'no_such_module'"),
        ("CartPole-v1", {}, ["user_envs:Nope"], "wrappers", "no attribute 'Nope'"),
    ]
    for env_id, kwargs, wrappers, field, text in cases:
        with pytest.raises(EnvBuildError, match=text) as info:
            make_env(env_id, kwargs, wrappers)
        assert info.value.field == field


def test_run_settings_carry_env_kwargs_and_wrappers() -> None:
    from tests.test_protocol import make_run_settings

    settings = dataclasses.replace(
        make_run_settings(),
        env_kwargs={"length": 5, "mode": "x", "xs": [1.5, None]},
        wrappers=["a.b:C", "d:E"],
    )
    wire = msgpack.unpackb(msgpack.packb(settings.to_map()), raw=False)
    assert RunSettings.from_map(wire) == settings
    absent = {k: v for k, v in wire.items() if k not in ("env_kwargs", "wrappers")}
    old = RunSettings.from_map(absent)  # a learner from before these fields
    assert old.env_kwargs == {} and old.wrappers == []
    for key, value, reason in [
        ("env_kwargs", {"a": {"nested": 1}}, "env_kwargs.a"),
        ("env_kwargs", {"not id": 1}, "env_kwargs"),
        ("wrappers", ["nocolon"], "wrappers"),
        ("wrappers", "a:B", "wrappers"),
    ]:
        with pytest.raises(ProtocolError, match=reason):
            RunSettings.from_map({**wire, key: value})


def test_wrappers_take_keyword_arguments() -> None:
    """Issue 29 item 11: ``TimeLimit`` needs ``max_episode_steps``; a wrapper spec carries
    keyword arguments (``module:Name(key=value,...)``, rl-zoo's dotted path too), and the
    spec still passes the protocol's ``module:Name`` check (one ':')."""
    for spec in (
        "gymnasium.wrappers:TimeLimit(max_episode_steps=7)",
        "gymnasium.wrappers.TimeLimit(max_episode_steps=7)",
        {"gymnasium.wrappers.TimeLimit": {"max_episode_steps": 7}},
    ):
        cfg = LearnerConfig(wrappers=[spec]).validate()
        assert cfg.wrappers == ("gymnasium.wrappers:TimeLimit(max_episode_steps=7)",), spec
        env = make_env("CartPole-v1", {}, cfg.wrappers)
        env.reset(seed=0)
        steps, done = 0, False
        while not done:  # alternate pushes: CartPole lasts longer than 7 steps
            steps += 1
            _, _, terminated, truncated, _ = env.step(steps % 2)
            done = terminated or truncated
        assert (steps, truncated) == (7, True)
    from tests.test_protocol import make_run_settings

    settings = dataclasses.replace(make_run_settings(), wrappers=list(cfg.wrappers))
    assert RunSettings.from_map(settings.to_map()).wrappers == list(cfg.wrappers)
    for bad, reason in (
        ("gymnasium.wrappers:TimeLimit(max_episode_steps=7", "must end with"),
        ("gymnasium.wrappers:TimeLimit(7)", "not key=value"),
        ('m:W(mode="a:b")', "one ':'"),
    ):
        with pytest.raises(ConfigError, match=re.escape(reason)) as info:
            LearnerConfig(wrappers=[bad]).validate()
        assert info.value.field == "wrappers"
    with pytest.raises(EnvBuildError, match="max_episode_stepz"):
        make_env("CartPole-v1", {}, ["gymnasium.wrappers:TimeLimit(max_episode_stepz=7)"])


@pytest.mark.parametrize("name", ["NormalizeReward", "NormalizeObservation"])
def test_stateful_normalisation_wrappers_are_refused(name: str, capsys) -> None:
    """Each actor and the evaluator would keep its own running statistics (train -0.4,
    eval -38.9 in issue 29): refused, pointing at the learner's own normalisation."""
    flag = {"NormalizeReward": "--normalize-reward", "NormalizeObservation": "--normalize-obs"}
    for spec in (f"gymnasium.wrappers:{name}", f"gymnasium.wrappers.{name}(epsilon=1e-6)"):
        with pytest.raises(ConfigError, match=re.escape(flag[name])) as info:
            LearnerConfig(wrappers=[spec]).validate()
        assert info.value.field == "wrappers"
        with pytest.raises(EnvBuildError, match=re.escape(flag[name])):
            make_env("CartPole-v1", {}, [spec])
    from zmq_rl.cli import main as main_cli

    assert main_cli.main(["run", "--wrapper", f"gymnasium.wrappers:{name}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith(f"error: wrappers='gymnasium.wrappers:{name}': ")
    assert flag[name] in err[0]


def test_toml_takes_env_kwargs_and_wrappers_as_tables(tmp_path: Path) -> None:
    """``env_kwargs = {target = 18.0}`` was refused ("must be a string"), at the top level
    and in ``[learner]``; wrappers may be tables ``{"module:Name" = {key = value}}``."""
    from zmq_rl.cli.flags import ConfigFileError, load_toml
    from zmq_rl.cli.learner import LEARNER_SECTIONS

    for text in (
        "env_kwargs = {target = 18.0, xs = [1, 2], on = true}\n"
        'wrappers = [{"gymnasium.wrappers.TimeLimit" = {max_episode_steps = 5}}, "m:W"]\n',
        "[learner]\nenv_kwargs = {target = 18.0, xs = [1, 2], on = true}\n"
        'wrappers = ["gymnasium.wrappers:TimeLimit(max_episode_steps=5)", "m:W"]\n',
    ):
        path = tmp_path / "run.toml"
        path.write_text(text)
        values = load_toml(path, LEARNER_SECTIONS)
        cfg = LearnerConfig(
            env_kwargs=values["learner.env_kwargs"], wrappers=values["learner.wrappers"]
        ).validate()
        assert cfg.env_kwargs_map() == {"target": 18.0, "xs": [1, 2], "on": True}
        assert cfg.wrappers == ("gymnasium.wrappers:TimeLimit(max_episode_steps=5)", "m:W")
    path.write_text("env_kwargs = {nested = {a = 1}}\n")
    with pytest.raises(ConfigFileError, match="run.toml: env_kwargs=.*nested"):
        load_toml(path, LEARNER_SECTIONS)


# -- real processes ---------------------------------------------------------------------


def test_env_kwargs_reach_every_actor_and_the_evaluator(tmp_path: Path) -> None:
    """CartPole capped at 8 steps per episode: no episode of any actor, and no
    evaluation episode, may return more than 8 (a random policy often runs ~20)."""
    done = zmq_rl_run(
        tmp_path,
        "--env",
        "CartPole-v1",
        "--env-kwargs",
        "max_episode_steps=8",
        "--eval-in-background",  # the evaluator process builds its envs with the kwargs too
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rep = report(tmp_path)
    assert rep["episodes_completed"] >= 20
    assert max(episode_returns(tmp_path)) <= 8.0
    assert rep["evaluations"] and all(e["mean_return"] <= 8.0 for e in rep["evaluations"])


def test_user_env_class_and_wrappers_in_order(user_dir: Path) -> None:
    """``--env user_envs:Corridor`` from the working directory, its length from
    ``--env-kwargs``, and two wrappers: every training episode (actors) and every
    evaluation episode returns exactly length * (1 + 1) * 2 -- the wrong order
    would give length * 3, a missing wrapper length * 2 or length * 1."""
    done = zmq_rl_run(
        user_dir,
        "--env",
        "user_envs:Corridor",
        "--env-kwargs",
        '{"length": 5}',
        "--wrapper",
        "user_envs:AddOne",
        "--wrapper",
        "user_envs:Double",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    returns = episode_returns(user_dir)
    assert returns and all(r == 20.0 for r in returns)
    evaluations = report(user_dir)["evaluations"]
    assert evaluations and all(e["mean_return"] == 20.0 for e in evaluations)
    config = (user_dir / "run" / "config.toml").read_text()
    assert 'wrappers = ["user_envs:AddOne", "user_envs:Double"]' in config


def test_user_env_function(user_dir: Path) -> None:
    done = zmq_rl_run(user_dir, "--env", "user_envs:make_corridor", "--env-kwargs", "length=3")
    assert done.returncode == 0, done.stderr[-3000:]
    assert all(r == 3.0 for r in episode_returns(user_dir))


def test_env_that_cannot_be_built_is_named_on_the_learner(user_dir: Path) -> None:
    done = zmq_rl_run(user_dir, "--env", "user_envs:Corridor", "--env-kwargs", "width=3")
    assert done.returncode == 2
    assert "env_id='user_envs:Corridor'" in done.stderr
    assert "width" in done.stderr and "Traceback" not in done.stderr
    done = zmq_rl_run(user_dir, "--env", "CartPole-v1", "--wrapper", "user_envs:Nope")
    assert done.returncode == 2
    assert "wrappers='user_envs:Nope'" in done.stderr and "no attribute 'Nope'" in done.stderr


def test_env_that_cannot_be_built_is_named_on_the_actor(user_dir: Path) -> None:
    """The learner builds the env, the actor cannot: the actor exits 2 naming the env
    id and the reason, and the run fails at once with that error (no restarts)."""
    done = zmq_rl_run(user_dir, "--env", "user_envs:ActorOnly", "--actor-restarts", "3")
    assert done.returncode == 1, done.stderr[-3000:]
    log = (user_dir / "run" / "logs" / "actor-0.log").read_text()
    assert "env_id='user_envs:ActorOnly'" in log
    assert "no simulator licence on this host" in log
    assert "no simulator licence on this host" in done.stderr


def test_wrapper_and_env_kwargs_flags_and_toml(tmp_path: Path) -> None:
    """``--wrapper`` repeats in order; a TOML list is replaced (not extended) by flags;
    config.toml writes both back loadable."""
    from zmq_rl.cli.learner import resolve

    _, cfg, _, _ = resolve(
        ["--no-preset", "--run-dir", "", "--wrapper", "a:B", "--wrapper", "c:D",
         "--env-kwargs", "x=1"]
    )  # fmt: skip
    assert cfg.wrappers == ("a:B", "c:D") and cfg.env_kwargs_map() == {"x": 1}
    toml = tmp_path / "c.toml"
    toml.write_text('[learner]\nwrappers = ["f:G"]\nenv_kwargs = "y=2"\n')
    _, cfg, _, _ = resolve(["--config", str(toml), "--run-dir", ""])
    assert cfg.wrappers == ("f:G",) and cfg.env_kwargs_map() == {"y": 2}
    _, cfg, _, _ = resolve(["--config", str(toml), "--run-dir", "", "--wrapper", "h:I"])
    assert cfg.wrappers == ("h:I",)
    with pytest.raises(ConfigError, match="wrappers"):
        resolve(["--no-preset", "--run-dir", "", "--wrapper", "nocolon"])


def test_a_toml_run_with_table_env_kwargs_and_a_time_limit_wrapper(user_dir: Path) -> None:
    """From one TOML file with both tables: every actor's episode and every evaluation is
    cut at 5 steps of a 30-step corridor (reward 1 per step), so each return is 5."""
    (user_dir / "run.toml").write_text(
        'env_id = "user_envs:Corridor"\n'
        "env_kwargs = {length = 30}\n"
        'wrappers = [{"gymnasium.wrappers.TimeLimit" = {max_episode_steps = 5}}]\n'
    )
    done = zmq_rl_run(user_dir, "--config", "run.toml")
    assert done.returncode == 0, done.stderr[-3000:]
    returns = episode_returns(user_dir)
    assert len(returns) >= 20 and set(returns) == {5.0}
    assert all(e["mean_return"] == 5.0 for e in report(user_dir)["evaluations"])
