"""Issue 44 section 5: one line, not a traceback.

Each mistake below printed a traceback of 33 to 63 lines (or a line that said
something else) where the docs promise one line that names the field or the env:
a mask of the wrong size, ``--policy-type lstm`` on a turn-based game, an
``--eval-opponent policy:FILE`` that is no torch file, an observation of the wrong
shape, an env that raises after the actor started collecting (called a start-up
failure without a run dir), an invalid welcome (the actor then blamed an
unreachable learner), ``zmq-rl eval --env`` on another env's spaces (cut at
``ActorCritic:``) and a ``--host`` that does not resolve ("choose another --port").
The env mistakes are the envs of ``tests/broken_envs.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq

from tests.helpers import STUB_ENV_ID, zmq_rl_command
from tests.ports import free_port_block
from zmq_rl.cli import main as main_cli
from zmq_rl.config import PolicyConfig
from zmq_rl.wire.protocol import Hello

ROOT = Path(__file__).resolve().parents[1]
RUN_TIMEOUT_S = 180
ONE_RUN = ["--actors", "1", "--total-env-steps", "2000", "--no-plot"]


def _run_in_process(argv: list[str], capsys) -> tuple[int, list[str]]:
    """``zmq-rl ARGV`` in this process: its exit code and every line it printed."""
    code = main_cli.main(argv)
    captured = capsys.readouterr()
    return code, (captured.out + captured.err).splitlines()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["--env", "tests.broken_envs:BadMask-v0"],
            "error: env_id='tests.broken_envs:BadMask-v0': its observation 'action_mask' "
            "has 3 entries, but Discrete(4) needs 4",
        ),
        (
            ["--env", "pettingzoo.classic.connect_four_v3", "--policy-type", "lstm"],
            "error: policy_type='lstm': pettingzoo.classic.connect_four_v3 is a turn-based game",
        ),
        (
            ["--env", "pettingzoo.classic.tictactoe_v3", "--eval-opponent", "policy:{text}"],
            "error: eval_opponent='policy:{text}': not a policy file (torch.load refused it",
        ),
    ],
    ids=["mask-size", "lstm-on-a-game", "opponent-not-torch"],
)
def test_what_the_learner_refuses_is_one_line_before_any_actor_starts(
    args, expected, tmp_path, capsys
) -> None:
    """They failed after the actors started (the mask when the trainer was built,
    the game in each actor's first decision, the opponent file in torch.load)."""
    text = tmp_path / "notes.pt"
    text.write_text("not a torch file\n")
    args = [a.format(text=text) for a in args]
    run_dir = tmp_path / "run"
    code, lines = _run_in_process(["run", *args, *ONE_RUN, "--run-dir", str(run_dir)], capsys)
    assert code == 2, lines
    assert len(lines) == 1 and lines[0].startswith(expected.format(text=text)), lines
    assert not run_dir.exists(), "refused before the run dir was written"


_zmq_rl = zmq_rl_command


def test_an_observation_of_the_wrong_shape_names_the_env_in_one_line(tmp_path) -> None:
    """It was 59 lines ending in ``observation batch of shape (4, 5) does not flatten
    to [B, 4]``, the env not named."""
    port = str(free_port_block(3))
    done = _zmq_rl(
        "run", "--env", "tests.broken_envs:WrongShape-v0", *ONE_RUN, "--port", port,
        "--run-dir", "", cwd=tmp_path,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "Traceback" not in out, out
    assert (
        "error: env tests.broken_envs:WrongShape-v0 returned an observation at reset of "
        "shape (5,) where its observation space says (4,)"
    ) in out, out


def test_an_env_that_raises_mid_run_is_restarted_and_said_in_one_line(tmp_path) -> None:
    """An env raising at its 51st step: without a run dir the supervisor could not
    see that the actor had started collecting, called it "a start-up failure ...
    before it started collecting" and did not restart it; and the actor's error was
    its traceback."""
    port = str(free_port_block(3))
    done = _zmq_rl(
        "run", "--env", "tests.broken_envs:RaisesAt-v0", *ONE_RUN, "--total-env-steps",
        "20000", "--port", port, "--run-dir", "", "--actor-restarts", "1",
        "--actor-restart-backoff", "0", cwd=tmp_path,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "Traceback" not in out and "start-up failure" not in out, out
    crash = (
        "error: env tests.broken_envs:RaisesAt-v0 raised RuntimeError in slot 2 at step 13 "
        "of its episode: the simulator crashed at step 51 (at "
    )
    assert out.count(crash) == 2, out  # the actor, and its restart
    assert "restarting it in 0.0s (restart 1 of 1)" in out, out
    assert "(restarts exhausted (1 of --actor-restarts 1))" in out, out


def test_an_invalid_welcome_is_said_instead_of_an_unreachable_learner(tmp_path) -> None:
    """A fake learner answers the hello with a welcome that gives other slots than
    asked for: the actor logged the reason, then ended with "no welcome ... is the
    learner running". It now ends with that reason."""
    from tests.test_hostile_actor import FakeLearner, stub_policy, stub_weights

    port = free_port_block(3)
    ctx = zmq.Context()
    fake = FakeLearner(ctx, port)
    actor = subprocess.Popen(
        [sys.executable, "-m", "zmq_rl.cli.actor", "--learner", f"127.0.0.1:{port}"]
        + ["--env", STUB_ENV_ID, "--num-envs", "2", "--register-timeout", "4"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        routing_id, hello = fake.recv_control(Hello)
        assert hello.num_envs == 2
        fake.welcome(routing_id, stub_weights(stub_policy(1), 0))  # num_envs 1
        out, _ = actor.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if actor.poll() is None:
            actor.kill()
            actor.wait()
        fake.close()
        ctx.destroy(linger=0)
    assert actor.returncode == 1, out
    last = out.strip().splitlines()[-1]
    assert last.startswith("error: no valid welcome from learner at tcp://127.0.0.1:"), out
    assert "welcome.config.num_envs: 1, the hello asked for 2" in last, out
    assert "is the learner running" not in out, out


def test_eval_on_an_env_of_other_spaces_says_which_tensor_in_one_line(tmp_path, capsys) -> None:
    """``zmq-rl eval POLICY --env OTHER`` ended at ``... for ActorCritic:``."""
    import gymnasium as gym

    from zmq_rl.learner.checkpoint import save_policy
    from zmq_rl.rl.policy import build_policy

    env = gym.make("CartPole-v1")
    cfg = PolicyConfig(hidden_sizes=(16,))
    path = tmp_path / "policy.pt"
    save_policy(path, build_policy(env.observation_space, env.action_space, cfg), cfg,
                "CartPole-v1", 3)  # fmt: skip
    code, lines = _run_in_process(["eval", str(path), "--env", "Acrobot-v1"], capsys)
    assert code == 1
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: {path}: the weights do not fit env Acrobot-v1 (it was ")
    assert (
        "trained on CartPole-v1): " in lines[0] and " is [16, 4] in the file, [16, 6] " in lines[0]
    )


def test_a_host_that_does_not_resolve_is_named_not_the_port(capsys) -> None:
    """``--host nosuchhost.invalid`` said "cannot bind ... No such device ... (choose
    another --port or stop the other learner)"."""
    port = str(free_port_block(3))
    started = time.monotonic()
    code, lines = _run_in_process(
        ["run", "--host", "nosuchhost.invalid", "--port", port, "--run-dir", "", "--no-preset"],
        capsys,
    )
    assert code == 2, lines
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: host='nosuchhost.invalid': does not resolve ("), lines
    assert lines[0].endswith(
        "give an address or name of this machine (0.0.0.0 binds all of its interfaces)"
    )
    assert "--port" not in lines[0]
    assert time.monotonic() - started < 60
