"""The command-line programs: flags generated from the configs, TOML files, errors,
and real runs of ``zmq-rl run`` / ``eval`` / ``plot`` and ``zmq-learner`` / ``zmq-actor``.

Commands are run in-process where nothing but parsing happens, and as
subprocesses (``python -m zmq_rl.cli...``, from the repository root so that the
stub env ``tests.stub_env:Stub-v0`` imports) where processes, sockets and exit
codes are what is tested. Every wait is bounded.
"""

from __future__ import annotations

import configparser
import csv
import dataclasses
import importlib
import json
import math
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import STUB_ENV_ID, free_port_block
from zmq_rl.cli import actor as actor_cli
from zmq_rl.cli import learner as learner_cli
from zmq_rl.cli import main as main_cli
from zmq_rl.cli.flags import LOG_LEVELS, dump_toml, flag_name, load_toml
from zmq_rl.config import ActorConfig, LearnerConfig, PolicyConfig, PPOConfig
from zmq_rl.learner.metrics import MetricsWriter, tensorboard_available

ROOT = Path(__file__).resolve().parents[1]
RUN_TIMEOUT_S = 180
"""Bound on one tiny run: three Python processes importing torch on a busy 2-core box."""
LEARNER_CONFIGS = (LearnerConfig, PPOConfig, PolicyConfig)


def _fields(*classes: type) -> list[str]:
    return [f.name for cls in classes for f in dataclasses.fields(cls)]


def _has_flag(text: str, flag: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text) is not None


def _help(main, argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def _python(*args: str, timeout: float = RUN_TIMEOUT_S, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,
    )


def _actor_processes(port: int) -> list[psutil.Process]:
    """Live actor processes of the learner on ``port`` (started by any test)."""
    needle = f"127.0.0.1:{port}"
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = proc.info["cmdline"] or []
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if "zmq_rl.cli.actor" in cmdline and needle in cmdline:
            found.append(proc)
    return found


# -- help: generated from the dataclasses ---------------------------------------------


@pytest.mark.parametrize(
    ("main", "argv", "classes"),
    [
        (learner_cli.main, ["--help"], LEARNER_CONFIGS),
        (main_cli.main, ["run", "--help"], LEARNER_CONFIGS),
        (actor_cli.main, ["--help"], (ActorConfig,)),
    ],
    ids=["zmq-learner", "zmq-rl run", "zmq-actor"],
)
def test_help_lists_every_config_field(main, argv, classes, capsys) -> None:
    text = _help(main, argv, capsys)
    missing = [flag_name(n) for n in _fields(*classes) if not _has_flag(text, flag_name(n))]
    assert not missing, f"--help lacks {missing}"
    for flag in ("--config", "--log-level"):
        assert _has_flag(text, flag)
    squeezed = "".join(text.split())  # argparse rewraps help text, even at hyphens
    for cls in classes:  # every field's help text is there too
        for f in dataclasses.fields(cls):
            assert "".join(str(f.metadata["help"]).split()) in squeezed, f.name


def test_help_has_aliases_and_bool_negations(capsys) -> None:
    text = _help(learner_cli.main, ["--help"], capsys)
    assert _has_flag(text, "--env") and _has_flag(text, "--actors")
    assert _has_flag(text, "--no-use-vtrace") and _has_flag(text, "--no-anneal-lr")
    assert _has_flag(actor_cli.build_parser().format_help(), "--env")


def test_in_process_commands_restore_sigterm(capsys) -> None:
    before = signal.getsignal(signal.SIGTERM)
    assert learner_cli.main(["--gamma", "2"]) == 2
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("argv", [["--help"], ["eval", "--help"], ["plot", "--help"]])
def test_zmq_rl_help(argv, capsys) -> None:
    text = _help(main_cli.main, argv, capsys)
    if argv == ["--help"]:
        for name in ("run", "eval", "plot"):
            assert name in text


def test_zmq_rl_help_lists_every_subcommand_in_order_without_importing_torch() -> None:
    """``zmq-rl --help`` builds no subcommand's flags (the conformance flags import the
    learner and torch); the list keeps the registry's order, slurm and ray last."""
    code = (
        "import sys\n"
        "from zmq_rl.cli.main import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('torch' in sys.modules, 'zmq_rl.learner.ingest' in sys.modules)\n"
    )
    out = _python("-c", code, timeout=120)
    assert out.returncode == 0, out.stderr
    *text, loaded = out.stdout.strip().splitlines()
    assert loaded == "False False"
    names = [line.split()[0] for line in text if line.startswith("    ") and line[4] != " "]
    from zmq_rl.cli.commands import ORDER

    assert names == list(ORDER), names


def test_a_subcommand_parser_has_its_own_flags_only_when_named() -> None:
    from zmq_rl.cli.commands import build_parser, subparser

    def flags(parser, name):
        return {o for action in subparser(parser, name)._actions for o in action.option_strings}

    only_run = build_parser("run")
    assert "--resume" in flags(only_run, "run")
    assert flags(only_run, "slurm") == {"-h", "--help"}
    assert "--dry-run" in flags(build_parser(), "slurm")


def test_console_scripts_point_at_mains() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    scripts = dict(
        line.split("=", 1)
        for line in cfg["options.entry_points"]["console_scripts"].split("\n")
        if line.strip()
    )
    assert {k.strip() for k in scripts} == {"zmq-learner", "zmq-actor", "zmq-rl"}
    for target in scripts.values():
        module, func = target.strip().split(":")
        assert callable(getattr(importlib.import_module(module), func))


def test_python_dash_m_zmq_rl_is_zmq_rl() -> None:
    result = _python("-m", "zmq_rl", "--help", timeout=60)
    assert result.returncode == 0, result.stderr
    assert "run" in result.stdout and "plot" in result.stdout


@pytest.mark.parametrize(
    "argv", [["--help"], ["bogus"], ["run", "--total", "5"], ["keys", "--help"]]
)
def test_help_and_usage_errors_do_not_import_torch(argv) -> None:
    """Issue 29 item 9: ``zmq-rl --help`` or a typo answered in 1-2 s because building
    every subcommand's flags imported torch (through conformance); only the flags of the
    command that runs are built now."""
    probe = (
        "import sys\n"
        "from zmq_rl.cli.main import main\n"
        "try:\n"
        f"    code = main({argv!r})\n"
        "except SystemExit as exc:\n"
        "    code = exc.code\n"
        "print('code', code, 'torch' in sys.modules, 'gymnasium' in sys.modules)\n"
    )
    result = _python("-c", probe, timeout=60)
    expected = 0 if "--help" in argv else 2
    assert result.stdout.splitlines()[-1] == f"code {expected} False False", result


def test_full_parser_still_has_every_subcommands_flags() -> None:
    """``build_parser()`` (docs, tests, resume) keeps building all of them."""
    parser = main_cli.build_parser()
    assert "--total-env-steps" in main_cli.subparser(parser, "run").format_help()
    assert "actor" in main_cli.subparser(parser, "conformance").format_help()
    assert (
        "--total-env-steps"
        not in main_cli.subparser(main_cli.build_parser(None), "run").format_help()
    )


def test_an_abbreviated_flag_suggests_the_flags_it_begins(capsys) -> None:
    """``--total`` suggested ``--port`` (the closest spelling); a flag that begins
    known ones names those."""
    for argv, hint in (
        (["run", "--total", "5"], "--total: did you mean --total-env-steps?"),
        (["run", "--learning-rat", "3"], "--learning-rat: did you mean --learning-rate?"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main_cli.main(argv)
        assert exit_info.value.code == 2
        assert hint in capsys.readouterr().err


def test_subcommand_help_has_no_rest_markup(capsys) -> None:
    """``zmq-rl keys --help`` showed its docstring's raw ``code`` markup (issue 29)."""
    parser = main_cli.build_parser()
    for name in main_cli.SUBCOMMANDS:
        text = main_cli.subparser(parser, name).format_help()
        assert "``" not in text and ":func:" not in text and ":class:" not in text, name
    assert "Write DIR/NAME.key and DIR/NAME.key_secret" in " ".join(
        _help(main_cli.main, ["keys", "--help"], capsys).split()
    )


def test_export_to_an_uncreatable_path_is_one_error_line(tmp_path, capsys) -> None:
    """A 30-line traceback before (issue 29 item 13): now ``error: --out ...`` and exit 1."""
    from tests.test_export import saved_policy

    saved_policy(tmp_path, "CartPole-v1")
    (tmp_path / "a_file").write_text("")
    out = tmp_path / "a_file" / "sub" / "policy.pt"
    code = main_cli.main(["export", str(tmp_path), "--format", "torchscript", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith(f"error: --out {out}: cannot write ") and "Not a directory" in err[0]


# -- values, errors, TOML -------------------------------------------------------------


def test_flags_parse_types() -> None:
    args, cfg, ppo, policy = learner_cli.resolve(
        [
            "--env",
            "Pendulum-v1",
            "--actors",
            "3",
            "--total-env-steps",
            "1e5",
            "--hidden-sizes",
            "32, 16",
            "--no-anneal-lr",
            "--use-vtrace",
            "--target-return",
            "inf",
            "--activation",
            "relu",
            "--run-dir",
            "",
        ]
    )
    assert cfg.env_id == "Pendulum-v1" and cfg.num_actors == 3
    assert cfg.total_env_steps == 100_000 and isinstance(cfg.total_env_steps, int)
    assert policy.hidden_sizes == (32, 16) and policy.activation == "relu"
    assert ppo.anneal_lr is False and cfg.use_vtrace is True
    assert math.isinf(cfg.target_return) and cfg.run_dir == ""


def test_renamed_learner_flag_and_toml_key_still_work_with_a_warning(tmp_path, capsys) -> None:
    """``envs_per_actor`` became ``num_envs`` (one name per knob); the old flag and
    TOML key are accepted, say they are deprecated, and set the new field."""
    _, cfg, _, _ = learner_cli.resolve(["--envs-per-actor", "3", "--run-dir", ""])
    assert cfg.num_envs == 3
    # once (issue 29: three times, one per parse of the same arguments)
    assert capsys.readouterr().err.count("--envs-per-actor is deprecated; use --num-envs") == 1
    assert main_cli.main(["run", "--envs-per-actor", "3", "--total-env-steps", "1"]) == 2
    assert capsys.readouterr().err.count("--envs-per-actor is deprecated; use --num-envs") == 1
    config = tmp_path / "old.toml"
    config.write_text("[learner]\nenvs_per_actor = 5\n")
    _, cfg, _, _ = learner_cli.resolve(["--config", str(config), "--run-dir", ""])
    assert cfg.num_envs == 5
    assert capsys.readouterr().err.count("'envs_per_actor' is deprecated; use 'num_envs'") == 1
    with pytest.warns(DeprecationWarning, match="use num_envs"):
        assert LearnerConfig(envs_per_actor=2).num_envs == 2
    help_text = subprocess.run(
        [sys.executable, "-m", "zmq_rl.cli.learner", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "--num-envs" in help_text and "--envs-per-actor" not in help_text


def test_default_run_dir_is_timestamped_under_runs(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # the default run dir is created (reserved) at once
    _, cfg, _, _ = learner_cli.resolve(["--env", STUB_ENV_ID])
    assert re.fullmatch(r"runs/Stub-v0-\d{8}-\d{6}(-\d+)?", cfg.run_dir), cfg.run_dir
    assert (tmp_path / cfg.run_dir).is_dir()


@pytest.mark.parametrize(
    "main, argv",
    [(learner_cli.main, ["--gamma", "2"]), (main_cli.main, ["run", "--gamma", "2"])],
    ids=["zmq-learner", "zmq-rl run"],
)
def test_bad_value_exits_2_naming_field_and_value(main, argv, capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert re.search(r"^error: gamma=2(\.0)?: ", err, re.M), err
    assert "Traceback" not in err


def test_bad_value_exit_code_of_the_real_process() -> None:
    result = _python("-m", "zmq_rl.cli.learner", "--gamma", "2", "--port", "1", timeout=60)
    assert result.returncode == 2
    assert "gamma" in result.stderr and "2" in result.stderr
    assert "Traceback" not in result.stderr


def test_unparsable_value_is_a_usage_error(capsys) -> None:
    """Changed with issue 20: one ``error: field=value: reason`` line and a pointer to
    --help instead of the whole usage."""
    with pytest.raises(SystemExit) as exit_info:
        learner_cli.main(["--num-steps", "many"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "error: num_steps='many': not an integer",
        "try 'zmq-learner --help'",
    ], err


def test_bad_choice_is_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        learner_cli.main(["--activation", "sigmoid"])
    assert exit_info.value.code == 2
    assert "sigmoid" in capsys.readouterr().err


def test_unknown_env_is_a_config_error(capsys) -> None:
    assert learner_cli.main(["--env", "NoSuchEnv-v9", "--run-dir", ""]) == 2
    assert "env_id='NoSuchEnv-v9'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[learner]\ngamma = 0.9\nbogus_key = 1\n", "'bogus_key'"),
        ("bogus_flat = 1\n", "'bogus_flat'"),
        ("[learnr]\ngamma = 0.9\n", "[learnr]"),
        ("[ppo]\ngamma = 0.9\n", "'gamma' in [ppo]"),
        ("[learner]\ngamma = 'high'\n", "gamma='high'"),
        ("[learner\n", "invalid TOML"),
    ],
)
def test_toml_errors_name_the_key(tmp_path, capsys, text, needle) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    assert learner_cli.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and needle in err and str(path) in err, err


def test_missing_toml_file_is_a_config_error(tmp_path, capsys) -> None:
    assert learner_cli.main(["--config", str(tmp_path / "none.toml")]) == 2
    assert "none.toml" in capsys.readouterr().err


def test_toml_then_flags_precedence(tmp_path) -> None:
    path = tmp_path / "run.toml"
    path.write_text(
        "num_actors = 3\n"  # a flat key
        "[learner]\ngamma = 0.9\nenv_id = 'Acrobot-v1'\nrun_dir = ''\n"
        "[ppo]\nnum_epochs = 3\nlearning_rate = 1\n"
        "[policy]\nhidden_sizes = [32, 32]\nshared_trunk = true\n"
    )
    _, cfg, ppo, policy = learner_cli.resolve(
        ["--config", str(path), "--gamma", "0.95", "--no-shared-trunk"]
    )
    assert cfg.gamma == 0.95  # the flag beats the file
    assert policy.shared_trunk is False
    assert cfg.env_id == "Acrobot-v1" and cfg.num_actors == 3 and cfg.run_dir == ""
    assert ppo.num_epochs == 3 and ppo.learning_rate == 1.0
    assert isinstance(ppo.learning_rate, float)
    assert policy.hidden_sizes == (32, 32)
    assert cfg.gae_lambda == LearnerConfig().gae_lambda  # neither: the dataclass default


def test_toml_precedence_for_a_subcommand(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # the default run dir is created under runs/ here
    path = tmp_path / "run.toml"
    path.write_text("[learner]\neval_every = 7\ngamma = 0.9\n")
    parser = main_cli.build_parser()
    sub = main_cli.subparser(parser, "run")
    args, cfg, _, _ = learner_cli.resolve(
        ["run", "--config", str(path), "--gamma", "0.97"], parser, sub
    )
    assert cfg.eval_every == 7 and cfg.gamma == 0.97
    # Changed with issue 20: zmq-rl run has no target of its own (it was CartPole's
    # 475 for every env); with --config, no preset applies either.
    assert "target_return" not in main_cli.RUN_DEFAULTS and math.isinf(cfg.target_return)


def test_toml_round_trip(tmp_path) -> None:
    configs = {
        "learner": LearnerConfig(
            env_id='we"ird\\id', target_return=math.inf, gamma=0.5, run_dir="x"
        ),
        "ppo": PPOConfig(adam_eps=1e-8, anneal_lr=False),
        "policy": PolicyConfig(hidden_sizes=(8, 4, 2), activation="relu"),
    }
    path = tmp_path / "c.toml"
    path.write_text(dump_toml(configs, header="a\nheader", commented=("run_dir",)))
    values = load_toml(path, learner_cli.LEARNER_SECTIONS)
    assert "learner.run_dir" not in values
    for name, cfg in configs.items():
        for f in dataclasses.fields(cfg):
            if f.name != "run_dir":
                assert values[f"{name}.{f.name}"] == getattr(cfg, f.name), f.name


def test_actor_flags_and_bad_address(capsys) -> None:
    _, cfg = actor_cli.resolve(
        ["--learner", "box:6000", "--env", "CartPole-v1", "--num-envs", "3", "--actor-id", "2"]
    )
    assert (cfg.learner, cfg.env_id, cfg.num_envs, cfg.actor_id) == (
        "box:6000",
        "CartPole-v1",
        3,
        2,
    )
    assert actor_cli.main(["--learner", "box:99999"]) == 2
    assert "learner='box:99999'" in capsys.readouterr().err


def test_log_levels_are_offered() -> None:
    text = learner_cli.build_parser().format_help()
    for level in LOG_LEVELS:
        assert level in text


# -- metrics.csv ----------------------------------------------------------------------


def test_metrics_writer_widens_the_csv(tmp_path) -> None:
    with MetricsWriter(tmp_path, tensorboard=False) as writer:
        writer.write({"update": 1, "env_steps": 8, "loss": 0.5})
        writer.write({"update": 2, "env_steps": 16, "loss": 0.25, "eval/mean_return": 5.0})
        writer.write({"update": 3, "env_steps": 24, "loss": math.inf})
    with MetricsWriter(tmp_path, tensorboard=False) as writer:  # reopened: appends
        writer.write({"update": 4, "env_steps": 32, "loss": 0.125})
    with open(tmp_path / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["update", "env_steps", "loss", "eval/mean_return"]
    assert [r["update"] for r in rows] == ["1", "2", "3", "4"]
    assert rows[0]["eval/mean_return"] == "" and rows[1]["eval/mean_return"] == "5.0"
    assert rows[2]["loss"] == "inf"
    with pytest.raises(ValueError):
        writer.write({"update": 5})


@pytest.mark.skipif(tensorboard_available(), reason="tensorboard is installed")
def test_metrics_writer_tensorboard_needs_the_package(tmp_path) -> None:
    with pytest.raises(ImportError):
        MetricsWriter(tmp_path, tensorboard=True)
    assert not MetricsWriter(tmp_path).tensorboard_enabled


# -- real processes -------------------------------------------------------------------


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess, int]:
    """One tiny ``zmq-rl run`` on the stub env, shared by the tests that read its output."""
    run_dir = tmp_path_factory.mktemp("cli") / "run"
    port = free_port_block(3)
    result = _python(
        "-m",
        "zmq_rl.cli.main",
        "run",
        "--env",
        STUB_ENV_ID,
        "--total-env-steps",
        "256",
        "--num-steps",
        "8",
        "--fragment-length",
        "8",
        "--eval-episodes",
        "2",
        "--port",
        str(port),
        "--run-dir",
        str(run_dir),
        "--starvation-timeout",
        "60",
    )
    return run_dir, result, port


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_run_end_to_end(finished_run) -> None:
    run_dir, result, port = finished_run
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    for name in (
        "report.json",
        "metrics.csv",
        "metrics.jsonl",
        "learning_curve.png",
        "config.toml",
        "policy.pt",
        "logs/actor-0.log",
        "logs/actor-1.log",
    ):
        assert (run_dir / name).is_file(), name
    report = json.loads((run_dir / "report.json").read_text())
    assert report["env_steps_consumed"] == 256 and report["stop_reason"] == "budget spent"
    assert "summary" in result.stdout and str(run_dir) in result.stdout
    assert "update 4/4" in result.stdout  # the plain progress lines (stdout is a pipe)
    with open(run_dir / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    # One row per update, and one per evaluation at the env step it measured.
    evaluations = [r for r in rows if r.get("eval/mean_return")]
    assert len(rows) - len(evaluations) == report["updates_completed"]
    assert [(int(r["env_steps"]), float(r["eval/mean_return"])) for r in evaluations] == [
        (e["env_steps"], e["mean_return"]) for e in report["evaluations"]
    ]
    assert (run_dir / "learning_curve.png").read_bytes().startswith(b"\x89PNG")
    # No actor left behind: neither by the pids the learner saw, nor by command line.
    pids = [int(stats["pid"]) for stats in report["actor_stats"].values()]
    assert len(pids) == 2
    assert not [
        p
        for p in pids
        if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
    ]
    assert _actor_processes(port) == []


@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_run_config_toml_repeats_the_run(finished_run, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # the repeat's new run dir is created under runs/ here
    run_dir, result, _ = finished_run
    assert result.returncode == 0
    parser = main_cli.build_parser()
    _, cfg, ppo, policy = learner_cli.resolve(
        ["run", "--config", str(run_dir / "config.toml")],
        parser,
        main_cli.subparser(parser, "run"),
    )
    assert cfg.env_id == STUB_ENV_ID and cfg.total_env_steps == 256 and cfg.num_steps == 8
    assert cfg.run_dir != str(run_dir)  # a repeat gets its own directory
    assert (ppo, policy) == (PPOConfig(), PolicyConfig())


@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_eval_prints_mean(finished_run, capsys) -> None:
    run_dir, result, _ = finished_run
    assert result.returncode == 0
    assert main_cli.main(["eval", str(run_dir), "--episodes", "3"]) == 0
    out = capsys.readouterr().out
    # The stub env's episodes are 5 steps of reward 1 whatever the policy does.
    assert re.search(r"mean return 5\.00 ± 0\.00 over 3 episodes", out), out
    assert main_cli.main(["eval", str(run_dir / "policy.pt"), "--episodes", "1"]) == 0


@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_eval_of_a_checkpoint(finished_run, capsys) -> None:
    """Issue 20: ``zmq-rl eval`` takes a checkpoint (``trainer``/``policy_config``/
    ``learner_config`` keys) as well as a policy.pt."""
    run_dir, result, _ = finished_run
    assert result.returncode == 0
    checkpoint = sorted((run_dir / "checkpoints").glob("ckpt-*.pt"))[-1]
    assert main_cli.main(["eval", str(checkpoint), "--episodes", "2"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"Stub-v0: mean return 5\.00 ± 0\.00 over 2 episodes", out), out
    assert "policy version 4" in out and str(checkpoint) in out


@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_run_says_when_tensorboard_is_off(finished_run) -> None:
    """Issue 20: a run without the tensorboard package says so once, and how to turn
    it on, instead of silently logging nothing."""
    _, result, _ = finished_run
    assert result.returncode == 0
    lines = [line for line in result.stdout.splitlines() if "TensorBoard" in line]
    if tensorboard_available():
        assert lines == []
    else:
        assert len(lines) == 1 and "pip install 'zmq_rl[tensorboard]'" in lines[0], lines


def test_eval_of_a_dir_without_policy_fails(tmp_path, capsys) -> None:
    assert main_cli.main(["eval", str(tmp_path)]) == 1
    assert "policy.pt" in capsys.readouterr().err


@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_plot_writes_png(finished_run, tmp_path, capsys) -> None:
    run_dir, result, _ = finished_run
    assert result.returncode == 0
    out = tmp_path / "curves" / "c.png"
    assert main_cli.main(["plot", str(run_dir), str(run_dir), "--out", str(out)]) == 0
    assert out.read_bytes().startswith(b"\x89PNG")
    assert str(out) in capsys.readouterr().out
    assert main_cli.main(["plot", str(tmp_path)]) == 1  # not a run directory


@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_run_ctrl_c_stops_everything(tmp_path, learner_port) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "zmq_rl.cli.main",
            "run",
            "--env",
            STUB_ENV_ID,
            "--total-env-steps",
            "100000000",
            "--num-steps",
            "8",
            "--fragment-length",
            "8",
            "--port",
            str(learner_port),
            "--run-dir",
            str(run_dir),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S - 60
        metrics = run_dir / "metrics.jsonl"
        while not (metrics.is_file() and metrics.stat().st_size > 0):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the run never made an update"
            time.sleep(0.1)
        assert len(_actor_processes(learner_port)) == 2
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, out + err
    assert "Traceback" not in err
    assert "interrupted" in out
    assert _actor_processes(learner_port) == []
    report = json.loads((run_dir / "report.json").read_text())
    assert report["stop_reason"].startswith("interrupted")


@pytest.mark.timeout(60)
def test_actor_exits_1_when_learner_unreachable(learner_port) -> None:
    result = _python(
        "-m",
        "zmq_rl.cli.actor",
        "--learner",
        f"127.0.0.1:{learner_port}",
        "--register-timeout",
        "1",
        timeout=50,
    )
    assert result.returncode == 1, result.stderr
    assert re.search(
        r"^error: no welcome from learner at tcp://127\.0\.0\.1:\d+ within 1\.0s",
        result.stderr,
        re.M,
    ), result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_actor_refused_exits_1_and_learner_sigterm_exits_130(learner_port, tmp_path) -> None:
    learner = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "zmq_rl.cli.learner",
            "--env",
            "CartPole-v1",
            "--port",
            str(learner_port),
            "--run-dir",
            str(tmp_path / "run"),
            "--starvation-timeout",
            "120",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # The stub env's spaces differ from CartPole's: the learner refuses the actor.
        actor = _python(
            "-m",
            "zmq_rl.cli.actor",
            "--learner",
            f"127.0.0.1:{learner_port}",
            "--env",
            STUB_ENV_ID,
            "--register-timeout",
            "60",
            timeout=90,
        )
        assert actor.returncode == 1, actor.stderr
        assert "refused" in actor.stderr and "Traceback" not in actor.stderr
        assert learner.poll() is None
        learner.send_signal(signal.SIGTERM)
        out, err = learner.communicate(timeout=60)
    finally:
        if learner.poll() is None:
            learner.kill()
            learner.communicate()
    assert learner.returncode == 130, out + err
    assert "Traceback" not in err
    assert (tmp_path / "run" / "config.toml").is_file()
