"""Custom policies through ``--factory package.module:callable``.

The factories live in a user's own module, written by the tests into a temporary
folder outside the package (``my_policies.py``), as a user's would be. A good
factory trains a short real run end to end (learner + actor processes) and its
saved policy evaluates; bad ones fail with a message naming what is wrong: the
module that does not import, the callable that is missing, the result that is not
an ``nn.Module``, or the policy methods it lacks (a :class:`ConfigError` of field
``factory``, so the command line reports it in one line with exit code 2).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.conftest import STUB_ENV_ID, free_port_block
from tests.stub_env import StubEnv
from zmq_rl.cli import main as main_cli
from zmq_rl.config import ConfigError, PolicyConfig
from zmq_rl.rl.policy import build_policy, check_policy_interface

ROOT = Path(__file__).resolve().parents[1]
RUN_TIMEOUT_S = 90.0

USER_MODULE = '''
"""A user's policies (written by tests/test_custom_policy.py)."""
import types

import torch
from torch import nn
from torch.nn import functional as F


class TinyPolicy(nn.Module):
    """Linear logits and value; counts update_obs_stats calls in a buffer."""

    def __init__(self, obs_dim, num_actions):
        super().__init__()
        self.pi = nn.Linear(obs_dim, num_actions)
        self.v = nn.Linear(obs_dim, 1)
        self.register_buffer("stats_calls", torch.zeros((), dtype=torch.int64))

    def forward(self, obs):
        x = obs.reshape(obs.shape[0], -1).float()
        return self.pi(x), self.v(x).squeeze(-1)

    def value(self, obs):
        return self(obs)[1]

    @torch.no_grad()
    def act(self, obs, generator=None, deterministic=False):
        logits, value = self(obs)
        if deterministic:
            action = logits.argmax(-1)
        else:
            action = torch.multinomial(F.softmax(logits, -1), 1, generator=generator).squeeze(-1)
        log_p = F.log_softmax(logits, -1)
        return action, log_p.gather(-1, action[:, None]).squeeze(-1), value

    def evaluate_actions(self, obs, actions):
        logits, value = self(obs)
        log_p = F.log_softmax(logits, -1)
        entropy = -(log_p.exp() * log_p).sum(-1)
        return log_p.gather(-1, actions.long()[:, None]).squeeze(-1), entropy, value

    def update_obs_stats(self, obs):
        self.stats_calls += 1


def make(observation_space, action_space, cfg):
    return TinyPolicy(int(observation_space.shape[0]), int(action_space.n))


class NoAct(TinyPolicy):
    act = None


def no_act(observation_space, action_space, cfg):
    return NoAct(int(observation_space.shape[0]), int(action_space.n))


def bare_module(observation_space, action_space, cfg):
    return nn.Linear(2, 2)


def not_a_module(observation_space, action_space, cfg):
    return types.SimpleNamespace(act=print, evaluate_actions=print, value=print)


NOT_CALLABLE = 3
'''

BROKEN_MODULE = "import package_that_does_not_exist_xyz\n"


@pytest.fixture
def user_dir(tmp_path, monkeypatch) -> Path:
    """A folder holding the user's modules, on sys.path for this process."""
    folder = tmp_path / "user"
    folder.mkdir()
    (folder / "my_policies.py").write_text(textwrap.dedent(USER_MODULE))
    (folder / "broken_policies.py").write_text(BROKEN_MODULE)
    monkeypatch.syspath_prepend(str(folder))
    yield folder
    for name in ("my_policies", "broken_policies"):
        sys.modules.pop(name, None)


def build(spec: str) -> nn.Module:
    return build_policy(StubEnv.observation_space, StubEnv.action_space, PolicyConfig(factory=spec))


def test_factory_builds_the_users_policy(user_dir) -> None:
    policy = build("my_policies:make")
    assert type(policy).__name__ == "TinyPolicy"
    check_policy_interface(policy, "my_policies:make")
    obs = torch.zeros(3, 2)
    action, log_prob, value = policy.act(obs, torch.Generator().manual_seed(0))
    assert action.shape == log_prob.shape == value.shape == (3,)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("my_policies:no_act", ["my_policies:no_act", "NoAct", "lacks act;"]),
        ("my_policies:bare_module", ["Linear", "lacks act, evaluate_actions, value"]),
        ("my_policies:not_a_module", ["SimpleNamespace", "not a torch.nn.Module"]),
        ("my_policies:missing", ["my_policies has no callable 'missing'"]),
        ("my_policies:NOT_CALLABLE", ["no callable 'NOT_CALLABLE'"]),
        ("module_that_does_not_exist_xyz:make", ["cannot import 'module_that_does_not_exist_xyz'"]),
        (
            "broken_policies:make",
            ["cannot import 'broken_policies'", "package_that_does_not_exist"],
        ),
    ],
    ids=["no-act", "no-methods", "not-a-module", "no-attr", "not-callable", "no-module", "broken"],
)
def test_bad_factories_fail_naming_what_is_wrong(user_dir, spec, expected) -> None:
    with pytest.raises(ConfigError) as info:  # a config error of field "factory": exit 2
        build(spec)
    assert info.value.field == "factory" and info.value.value == spec
    message = str(info.value)
    for part in expected:
        assert part in message, message
    if "lacks" in message:
        assert "act, evaluate_actions, value" in message  # says what a policy needs


def test_factory_in_the_working_directory_is_found(tmp_path, monkeypatch) -> None:
    """A console script's sys.path has its bin folder, not the working directory:
    ``zmq-learner --factory my_cwd_policies:make`` run from the user's project must
    still import their module."""
    (tmp_path / "my_cwd_policies.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    try:
        assert type(build("my_cwd_policies:make")).__name__ == "TinyPolicy"
        assert sys.path[-1] == str(tmp_path)  # searched last: installed packages win
    finally:
        sys.modules.pop("my_cwd_policies", None)


def test_malformed_factory_spec_is_a_config_error() -> None:
    for spec in ("no_colon", ":make", "module:"):
        with pytest.raises(ConfigError, match="package.module:callable"):
            PolicyConfig(factory=spec).validate()


def run_cli(*args: str, user: Path, timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(user), str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "zmq_rl.cli.main", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_short_run_with_a_custom_policy_completes_and_evaluates(user_dir, tmp_path) -> None:
    run_dir = tmp_path / "run"
    result = run_cli(
        "run",
        "--env", STUB_ENV_ID,
        "--factory", "my_policies:make",
        "--actors", "1",
        "--num-envs", "2",
        "--num-steps", "8",
        "--fragment-length", "8",
        "--total-env-steps", "64",
        "--eval-episodes", "2",
        "--num-epochs", "2",
        "--minibatch-size", "8",
        "--port", str(free_port_block()),
        "--run-dir", str(run_dir),
        "--no-plot",
        user=user_dir,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((run_dir / "report.json").read_text())
    assert report["updates_completed"] == 4 and report["env_steps_consumed"] == 64
    assert report["actor_stats"]["0"]["actor/policy_updates_received"] >= 1
    saved = torch.load(run_dir / "policy.pt", weights_only=True)
    assert json.loads(saved["policy_config"])["factory"] == "my_policies:make"
    # The learner called the optional update_obs_stats once per update, and the
    # buffer travelled in the saved state like any other.
    assert int(saved["policy"]["stats_calls"]) == 4
    assert main_cli.main(["eval", str(run_dir), "--episodes", "2"]) == 0


def test_bad_factory_on_the_command_line(user_dir, capsys) -> None:
    """``zmq-rl run --factory`` with a bad factory is a config error (exit 2, one line
    naming the factory and what it lacks), before any socket is bound."""
    argv = ["run", "--env", STUB_ENV_ID, "--factory", "my_policies:bare_module", "--run-dir", ""]
    assert main_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "my_policies:bare_module" in err and "lacks act, evaluate_actions, value" in err
    assert "Traceback" not in err
    argv[4] = "module_that_does_not_exist_xyz:make"
    assert main_cli.main(argv) == 2
    assert "cannot import 'module_that_does_not_exist_xyz'" in capsys.readouterr().err


def test_the_documented_example_policy_follows_the_interface() -> None:
    """``examples/custom_policy.py`` (docs/embedding.md's example): act and
    evaluate_actions agree, its normalisation buffers hold the exact moments of what it
    was fed, and a copy built on another "host" from the exported weights acts
    identically, statistics included."""
    import gymnasium as gym
    import numpy as np

    from zmq_rl.rl.policy import export_weights, import_weights

    spec = "examples.custom_policy:make"
    env = gym.make("CartPole-v1")
    cfg = PolicyConfig(factory=spec, hidden_sizes=(16, 16))
    learner_side = build_policy(env.observation_space, env.action_space, cfg)
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, (n, 4)).astype(np.float32) for n in (5, 64, 7)]
    for batch in batches:
        learner_side.update_obs_stats(batch)
    seen = np.concatenate(batches).astype(np.float64)
    np.testing.assert_allclose(learner_side.obs_mean.numpy(), seen.mean(0), rtol=1e-12)
    np.testing.assert_allclose(learner_side.obs_var.numpy(), seen.var(0), rtol=1e-10)

    actor_side = build_policy(env.observation_space, env.action_space, cfg)
    import_weights(actor_side, export_weights(learner_side))
    obs = torch.from_numpy(batches[1])
    a1, lp1, v1 = learner_side.act(obs, torch.Generator().manual_seed(3))
    a2, lp2, v2 = actor_side.act(obs, torch.Generator().manual_seed(3))
    assert torch.equal(a1, a2) and torch.equal(lp1, lp2) and torch.equal(v1, v2)
    lp, entropy, value = learner_side.evaluate_actions(obs, a1)
    torch.testing.assert_close(lp.detach(), lp1)
    torch.testing.assert_close(value.detach(), v1)
    assert bool((entropy > 0).all())
