"""Issue 44 section 4: a newcomer's multi-agent run works and tells the truth.

What a first PettingZoo run meets: an env id whose package is missing, the
evaluation and the curve of pursuit, what ``zmq-rl eval`` of a game says, the files a
self-play run keeps, the actors' learner timeout from ``zmq-rl run``, and the Python
API on multi-agent policies and user envs. The install of the extra itself is
tested in tests/test_install_scripts.py (a fresh venv).
"""

from __future__ import annotations

import importlib.abc
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import zmq_rl_command
from tests.ports import free_port_block
from zmq_rl.envs import EnvBuildError, env_shape

ROOT = Path(__file__).resolve().parents[1]
RUN_TIMEOUT_S = 180


class _Missing(importlib.abc.MetaPathFinder):
    """Imports of ``package`` fail as when it is not installed."""

    def __init__(self, package: str) -> None:
        self.package = package

    def find_spec(self, name, path=None, target=None):
        if name == self.package or name.startswith(self.package + "."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def test_a_pettingzoo_env_without_pettingzoo_says_what_to_install(monkeypatch) -> None:
    """It said ``NameNotFound: Environment pettingzoo.sisl.pursuit_v5 doesn't exist``."""
    for name in [m for m in sys.modules if m == "pettingzoo" or m.startswith("pettingzoo.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_Missing("pettingzoo"), *sys.meta_path])
    with pytest.raises(EnvBuildError) as caught:
        env_shape("pettingzoo.sisl.pursuit_v5")
    message = str(caught.value)
    assert "pettingzoo is not installed: pip install 'zmq_rl[multi-agent]'" in message
    assert "NameNotFound" not in message and "\n" not in message


# -- pursuit's evaluations and the training curve ----------------------------------------


PURSUIT = "pettingzoo.sisl.pursuit_v5"


def test_pursuit_takes_its_preset_which_samples_its_evaluations() -> None:
    """Pursuit evaluated by the policy's mode, which docs/multi_agent.md itself says
    scores like random (-46.9 +- 0.4 where training reached -39): its preset samples,
    with the budget the docs measured; a flag brings the mode back."""
    from zmq_rl.cli import learner as learner_cli
    from zmq_rl.run.session import preset_line

    args, cfg, _, _ = learner_cli.resolve(["--env", PURSUIT, "--run-dir", ""])
    assert args.applied_preset == PURSUIT
    assert cfg.eval_deterministic is False and cfg.total_env_steps == 400_000
    assert "evaluations sample actions" in preset_line(PURSUIT, cfg)
    argv = ["--env", PURSUIT, "--run-dir", "", "--eval-deterministic"]
    args, cfg, _, _ = learner_cli.resolve(argv)
    assert cfg.eval_deterministic is True
    args, cfg, _, _ = learner_cli.resolve(["--env", PURSUIT, "--run-dir", "", "--no-preset"])
    assert args.applied_preset is None and cfg.eval_deterministic is True
    # a game keeps the mode: its evaluations are against an opponent, not stuck
    args, cfg, _, _ = learner_cli.resolve(
        ["--env", "pettingzoo.classic.connect_four_v3", "--run-dir", ""]
    )
    assert args.applied_preset is None and cfg.eval_deterministic is True


_zmq_rl = zmq_rl_command


def test_the_curve_starts_with_the_first_episode_that_ended(tmp_path) -> None:
    """Updates before any episode ended recorded ``charts/mean_return`` 0.0 (~27k
    agent steps of pursuit: a perfect score there). MountainCar's random episodes last
    200 steps: the first six updates of 32 steps come before any ends."""
    run_dir = tmp_path / "run"
    done = _zmq_rl(
        "run", "--env", "MountainCar-v0", "--actors", "1", "--num-envs", "1",
        "--num-steps", "32", "--total-env-steps", "320", "--num-epochs", "1",
        "--eval-episodes", "1", "--port", str(free_port_block(3)), "--run-dir", str(run_dir),
        "--no-plot", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in rows if "charts/episodes" in r]
    assert len(updates) == 10
    for row in updates:
        assert ("charts/mean_return" in row) == (row["charts/episodes"] > 0), row
    assert "charts/mean_return" not in updates[0]
    assert updates[-1]["charts/mean_return"] == -200.0
    from zmq_rl.cli.plot import read_run

    curve = read_run(run_dir)
    first = next(r["env_steps"] for r in updates if r["charts/episodes"])
    assert curve.train_steps[0] == first > updates[0]["env_steps"]
    assert 0.0 not in curve.train_return


# -- zmq-rl eval of a game --------------------------------------------------------------


TICTACTOE = "pettingzoo.classic.tictactoe_v3"


def _saved_game_policy(folder: Path, config_toml: str = "") -> Path:
    """A (random, seeded) tic-tac-toe policy saved as a run saves it; with
    ``config_toml``, the run dir's config.toml beside it."""
    import torch

    from zmq_rl.config import PolicyConfig
    from zmq_rl.learner.checkpoint import save_policy
    from zmq_rl.rl.policy import build_policy

    folder.mkdir(parents=True, exist_ok=True)
    shape = env_shape(TICTACTOE)
    cfg = PolicyConfig(hidden_sizes=(16,))
    torch.manual_seed(0)
    net = build_policy(shape.observation_space, shape.action_space, cfg)
    save_policy(folder / "policy.pt", net, cfg, TICTACTOE, 5)
    if config_toml:
        (folder / "config.toml").write_text(config_toml)
    return folder / "policy.pt"


def test_eval_of_a_game_says_against_whom_and_each_seats_results(tmp_path) -> None:
    """It printed one mean over both seats ("0.42 over 40 episodes") and did not say
    against whom."""
    path = _saved_game_policy(tmp_path / "run")
    done = _zmq_rl("eval", str(path), "--episodes", "20", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0] == f"{TICTACTOE} against random legal moves (seats alternate; deterministic):"
    seats = [re.fullmatch(
        r"  as (player_\d)( \(moves first\))?: (\d+) wins?, (\d+) draws?, (\d+) loss(?:es)? "
        r"in 10 games \(mean return (-?[\d.]+)\)", line) for line in lines[1:3]]  # fmt: skip
    assert all(seats), lines
    assert [m.group(1) for m in seats] == ["player_1", "player_2"]
    assert seats[0].group(2) and not seats[1].group(2)
    for m in seats:
        wins, draws, losses = (int(m.group(k)) for k in (3, 4, 5))
        assert wins + draws + losses == 10
        assert float(m.group(6)) == pytest.approx((wins - losses) / 10)
    assert lines[3].startswith(f"{TICTACTOE}: mean return ") and "over 20 episodes" in lines[3]
    other = _zmq_rl(
        "eval", str(path), "--episodes", "4", "--opponent", f"policy:{path}", cwd=tmp_path
    )
    assert other.returncode == 0, other.stderr
    assert other.stdout.startswith(f"{TICTACTOE} against policy:{path} (seats alternate;")


def test_eval_samples_where_its_run_sampled(tmp_path) -> None:
    """``zmq-rl eval`` of a pursuit run played the mode its run did not evaluate with:
    it plays as the run's config.toml says, and says how."""
    sampled = _saved_game_policy(tmp_path / "a", "[learner]\neval_deterministic = false\n")
    done = _zmq_rl("eval", str(sampled.parent), "--episodes", "2", "--seed", "3", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "(seats alternate; sampled actions, seed 3):" in done.stdout.splitlines()[0]
    mode = _zmq_rl("eval", str(sampled), "--episodes", "2", "--deterministic", cwd=tmp_path)
    assert "(seats alternate; deterministic):" in mode.stdout.splitlines()[0], mode


# -- the files a self-play run keeps ------------------------------------------------------


def test_every_nth_checkpoint_is_kept_for_good(tmp_path) -> None:
    """The learner kept only its newest 3 checkpoints: following a self-play run's
    strength meant copying files as it went. ``--keep-checkpoint-every N`` keeps every
    checkpoint of an update that is a multiple of N as well."""
    run_dir = tmp_path / "run"
    done = _zmq_rl(
        "run", "--env", "tests.stub_env:Stub-v0", "--actors", "1", "--num-envs", "1",
        "--num-steps", "8", "--fragment-length", "8", "--total-env-steps", "80",
        "--num-epochs", "1", "--eval-episodes", "1", "--checkpoint-every", "1",
        "--keep-checkpoint-every", "4", "--port", str(free_port_block(3)),
        "--run-dir", str(run_dir), "--no-plot", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    kept = sorted(p.name for p in (run_dir / "checkpoints").glob("ckpt-*.pt"))
    assert kept == [f"ckpt-{u:08d}.pt" for u in (4, 8, 9, 10)], kept
    ladder = _zmq_rl("ladder", str(run_dir), "--help", cwd=tmp_path)
    assert "--keep-checkpoint-every" in ladder.stdout


def test_zmq_rl_run_sets_its_actors_learner_timeout(tmp_path) -> None:
    """Only ``zmq-actor --learner-timeout`` set it: the local actors of ``zmq-rl run``
    always gave up after 60 s of a silent learner."""
    import signal
    import time

    import psutil

    run = subprocess.Popen(
        [sys.executable, "-m", "zmq_rl", "run", "--env", "tests.stub_env:Stub-v0"]
        + ["--actors", "1", "--total-env-steps", "10000000", "--run-dir", ""]
        + ["--port", str(free_port_block(3)), "--actor-learner-timeout", "7.5"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        actor = None
        while actor is None and time.monotonic() < deadline and run.poll() is None:
            children = psutil.Process(run.pid).children(recursive=True)
            actor = next((c for c in children if "zmq_rl.cli.actor" in c.cmdline()), None)
            time.sleep(0.1)
        assert actor is not None, "no actor process"
        line = actor.cmdline()
        assert line[line.index("--learner-timeout") + 1] == "7.5", line
    finally:
        run.send_signal(signal.SIGINT)
        try:
            run.wait(60)
        except subprocess.TimeoutExpired:
            run.kill()
            run.wait()
    bad = _zmq_rl("run", "--actor-learner-timeout", "0", cwd=tmp_path)
    assert bad.returncode == 2 and "must be > 0" in bad.stderr, bad.stderr


# -- the benchmarks: --port and --out ------------------------------------------------------


BENCH = ROOT / "bench"
HELP_ARGS = {"connect_four.py": ["train", "--help"]}
"""Scripts whose flags live on a subcommand."""


def test_every_bench_script_takes_port_and_out() -> None:
    """``bench/multi_agent.py`` picked its own port and wrote into the checkout; every
    bench script now takes ``--port`` and ``--out`` (their ``--help`` says so; run
    together, they take about as long as the slowest)."""
    scripts = sorted(p for p in BENCH.glob("*.py") if not p.name.startswith("_"))
    procs = {
        p.name: subprocess.Popen(
            [sys.executable, str(p), *HELP_ARGS.get(p.name, ["--help"])],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for p in scripts
    }
    missing = {}
    try:
        for name, proc in procs.items():
            out, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
            if proc.returncode != 0 or "--port" not in out or "--out" not in out:
                missing[name] = out[-500:]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert len(scripts) > 30 and not missing, missing


def test_bench_multi_agent_binds_from_port_and_writes_only_under_out(tmp_path) -> None:
    """A tiny ``bench/multi_agent.py`` run (the test env of several agents): its
    results, run directory and the run's ports are where ``--out`` and ``--port``
    say, and nothing is written into the checkout."""
    port = free_port_block(3)
    out = tmp_path / "results" / "ma.json"
    before = {p: p.stat().st_mtime for p in (ROOT / "bench" / "results").glob("multi_agent-*")}
    command = [sys.executable, str(BENCH / "multi_agent.py")]
    command += ["--env", "tests.agent_envs:coming_and_going", "--seeds", "0", "--actors", "1"]
    command += ["--total-env-steps", "1024", "--eval-every", "1", "--eval-episodes", "1"]
    command += ["--random-episodes", "1", "--port", str(port), "--out", str(out)]
    done = subprocess.run(
        command,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["runs"][0]["curve"], result
    run_dir = tmp_path / "results" / "ma-runs" / "agent_envs:coming_and_going-seed0"
    config = (run_dir / "config.toml").read_text()
    bound = int(re.search(r"^port = (\d+)$", config, re.M).group(1))
    assert port <= bound < port + 1000, (port, bound)
    assert not (ROOT / "runs" / "multi_agent").exists() or not any(
        "coming_and_going" in p.name for p in (ROOT / "runs" / "multi_agent").iterdir()
    )
    after = {p: p.stat().st_mtime for p in (ROOT / "bench" / "results").glob("multi_agent-*")}
    assert after == before


# -- the Python API ----------------------------------------------------------------------


def test_the_python_api_takes_an_env_factory_and_says_why_not_an_instance(tmp_path) -> None:
    """An env instance or class was refused with "must be a non-empty gymnasium id" and
    no reason. A class (or function) of a module now trains (real actor processes
    build it by the name it is given); an instance, a lambda and a class of the
    script that was run are refused saying why."""
    import gymnasium as gym

    import zmq_rl
    from tests.stub_env import StubEnv
    from zmq_rl.config import ConfigError

    result = zmq_rl.train(
        StubEnv, run_dir=tmp_path / "run", num_actors=1, num_envs=1, num_steps=8,
        fragment_length=8, total_env_steps=64, num_epochs=1, eval_episodes=1,
        port=free_port_block(), verbose=False,
    )  # fmt: skip
    assert result.stop_reason == "budget spent"
    assert result.report.env_steps_consumed == 64
    assert 'env_id = "tests.stub_env:StubEnv"' in (tmp_path / "run" / "config.toml").read_text()
    cases = [
        (gym.make("CartPole-v1"), "an env instance cannot be used", "pass that id"),
        (lambda: StubEnv(), "actor processes build the env by name", "module"),
        (type("Local", (gym.Env,), {"__module__": "__main__"}), "(__main__)", "my_envs.py"),
    ]
    for env, why, hint in cases:
        with pytest.raises(ConfigError) as caught:
            zmq_rl.train(env, run_dir="", verbose=False)
        assert caught.value.field == "env" and why in str(caught.value), caught.value
        assert hint in str(caught.value)


def test_evaluate_policy_plays_pettingzoo_policies(tmp_path) -> None:
    """``zmq_rl.evaluate_policy`` refused a multi-agent policy ("this command runs
    single-agent envs", from a Python call) although ``zmq-rl eval`` plays it."""
    import zmq_rl

    path = _saved_game_policy(tmp_path / "run")
    mean, std = zmq_rl.evaluate_policy(path, n_eval_episodes=6, seed=3)
    returns, lengths = zmq_rl.evaluate_policy(
        path, n_eval_episodes=6, seed=3, return_episode_rewards=True
    )
    assert len(returns) == 6 and set(returns) <= {-1.0, 0.0, 1.0}
    assert all(5 <= n <= 9 for n in lengths)  # tic-tac-toe games of 5 to 9 moves
    assert mean == pytest.approx(sum(returns) / 6)
    # the same deterministic player in both seats: each game is played mirrored
    mirror, _ = zmq_rl.evaluate_policy(path, n_eval_episodes=4, seed=3, opponent=f"policy:{path}")
    assert mirror == 0.0


def test_predict_without_the_mask_names_the_key(tmp_path) -> None:
    """``predict`` of a masked policy without ``action_mask`` raised a bare
    ``KeyError: 'action_mask'``."""
    import numpy as np

    import zmq_rl

    policy = zmq_rl.load_policy(_saved_game_policy(tmp_path / "run"))
    board = np.zeros((3, 3, 2), np.int8)
    with pytest.raises(ValueError) as caught:
        policy.predict({"observation": board})
    message = str(caught.value)
    assert "no 'action_mask' key" in message and "the env's action mask" in message
    with pytest.raises(ValueError, match="is a Dict: pass a dict with the keys"):
        policy.predict(board)
    action, _ = policy.predict({"observation": board, "action_mask": np.ones(9, np.int8)})
    assert 0 <= int(action) < 9


def test_the_export_table_says_what_a_dict_policys_onnx_takes(tmp_path) -> None:
    """docs/api.md said the ONNX input is ``obs`` float32; a Dict policy's graph takes
    one input per key, in the dtype that travels for it."""
    pytest.importorskip("onnx", reason="ONNX export needs onnx: pip install 'zmq_rl[export]'")
    ort = pytest.importorskip("onnxruntime", reason="needs onnxruntime (zmq_rl[export])")
    import zmq_rl

    row = next(
        line for line in (ROOT / "docs" / "api.md").read_text().splitlines()
        if line.startswith("| `onnx` |")
    )  # fmt: skip
    assert "a Dict observation: one input per key" in row and "`MultiBinary` int8" in row
    out = tmp_path / "policy.onnx"
    zmq_rl.export_policy(_saved_game_policy(tmp_path / "run"), "onnx", out)
    inputs = {i.name: i.type for i in ort.InferenceSession(str(out)).get_inputs()}
    assert inputs == {"action_mask": "tensor(int8)", "observation": "tensor(int8)"}, inputs
