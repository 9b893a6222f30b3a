"""Shipped presets (``--config preset:NAME``) and the multi-run learning-curve plot.

Every preset parses as a ``--config`` file, validates, names its own env, and makes
that env; ``preset:NAME`` resolves on every learner command line, flags after it
override it, and an unknown name fails naming the shipped ones. Without
``--config``, ``zmq-rl run --env ENV`` and ``zmq-learner --env ENV`` apply ENV's
preset by themselves (``--no-preset`` not), and every preset's target return is the
one docs/learning-quality.md states. ``zmq-rl plot``'s
grouping (runs sharing a label -> mean and band) and reference lines are drawn from
synthetic run directories.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import re
import shlex
import tomllib
from pathlib import Path

import gymnasium as gym
import pytest

from tests.conftest import STUB_ENV_ID
from zmq_rl.cli import learner as learner_cli
from zmq_rl.cli import main as main_cli
from zmq_rl.cli import plot as plot_cli
from zmq_rl.cli.flags import load_toml, parse_with_config, preset_for
from zmq_rl.cli.learner import LEARNER_SECTIONS
from zmq_rl.cli.main import subparser
from zmq_rl.config import LearnerConfig, PolicyConfig, PPOConfig, replace
from zmq_rl.presets import PRESET_PREFIX, UnknownPreset, available, preset_path

EXPECTED = {
    "CartPole-v1",
    "Acrobot-v1",
    "Pendulum-v1",
    "LunarLander-v3",
    "LunarLanderContinuous-v3",
}
HAS_BOX2D = importlib.util.find_spec("Box2D") is not None
PIXELS = {"MinAtarBreakout-v1"}
"""Presets outside the learning-quality table (docs/benchmarks.md has their curve)."""
HAS_MINATAR = importlib.util.find_spec("minatar") is not None


def test_the_five_presets_ship() -> None:
    assert set(available()) >= EXPECTED
    for name in available():
        assert preset_path(name).is_file()
        assert preset_path(name).suffix == ".toml"


@pytest.mark.parametrize("name", sorted(EXPECTED | PIXELS))
def test_preset_parses_and_validates(name: str) -> None:
    path = preset_path(name)
    raw = tomllib.loads(path.read_text())
    assert set(raw) == {"learner", "ppo", "policy"}, "only the three learner tables"
    values = load_toml(path, LEARNER_SECTIONS)  # unknown keys and bad types raise here
    assert values
    args, cfg, ppo, policy = learner_cli.resolve(
        ["--config", f"{PRESET_PREFIX}{name}", "--run-dir", ""]
    )
    assert isinstance(cfg, LearnerConfig) and isinstance(ppo, PPOConfig)
    assert isinstance(policy, PolicyConfig)
    cfg.validate(), ppo.validate(), policy.validate()
    assert cfg.env_id == name, "a preset is named after its env"
    assert cfg.num_actors == 2, "presets map the zoo's n_envs onto 2 actors"
    # Every value in the file reached the configs (nothing silently dropped).
    for table, obj in (("learner", cfg), ("ppo", ppo), ("policy", policy)):
        for key, value in raw[table].items():
            got = getattr(obj, key)
            want = tuple(value) if isinstance(value, list) else value
            if isinstance(want, float) and math.isinf(want):
                assert math.isinf(got)
            else:
                assert got == want, f"{name} [{table}] {key}: {got!r} != {want!r}"
    assert cfg.num_updates() >= 10, "the budget buys a real number of updates"
    assert ppo.minibatch_size <= cfg.num_steps * cfg.nominal_slots()


@pytest.mark.parametrize("name", sorted(EXPECTED | PIXELS))
def test_preset_env_exists(name: str) -> None:
    if name.startswith("LunarLander") and not HAS_BOX2D:
        pytest.skip("Box2D is not installed (pip install 'zmq_rl[box2d]')")
    if name.startswith("MinAtar") and not HAS_MINATAR:
        pytest.skip("MinAtar is not installed (pip install 'zmq_rl[pixels]')")
    cfg = learner_cli.resolve(["--config", f"{PRESET_PREFIX}{name}", "--run-dir", ""])[1]
    env = gym.make(cfg.env_id)
    try:
        space = env.observation_space
        assert isinstance(space, gym.spaces.Box)
    finally:
        env.close()


def test_flags_after_a_preset_override_it() -> None:
    _, cfg, ppo, policy = learner_cli.resolve(
        [
            "--config",
            "preset:LunarLander-v3",
            "--seed",
            "7",
            "--gamma",
            "0.99",
            "--num-epochs",
            "2",
            "--normalize-obs",
            "--run-dir",
            "",
        ]
    )
    assert (cfg.seed, cfg.gamma, ppo.num_epochs, policy.normalize_obs) == (7, 0.99, 2, True)
    assert cfg.num_steps == 256 and ppo.ent_coef == 0.01  # the rest is the preset's


def test_preset_on_zmq_rl_run(monkeypatch) -> None:
    """``zmq-rl run --config preset:NAME`` reaches the run's configs (checked without
    training: the run body is replaced by one that records them)."""
    seen = {}

    def fake_run(args) -> int:
        seen["configs"] = learner_cli.configs_from_args(args)
        return 0

    sub = main_cli.SUBCOMMANDS["run"]
    monkeypatch.setitem(main_cli.SUBCOMMANDS, "run", dataclasses.replace(sub, run=fake_run))
    assert main_cli.main(["run", "--config", "preset:Pendulum-v1", "--run-dir", ""]) == 0
    cfg, ppo, policy = seen["configs"]
    assert cfg.env_id == "Pendulum-v1" and cfg.gamma == 0.9 and policy.normalize_obs
    # Changed with issue 20: presets carry their env's target (was inf).
    assert cfg.normalize_reward and ppo.num_epochs == 10 and cfg.target_return == -200.0


ROOT = Path(__file__).resolve().parents[1]


def _doc_targets() -> dict[str, float]:
    """``{env: target}`` from the results table of docs/learning-quality.md (the
    "target" column reads ``≥ 475 ✅``; the minus sign may be U+2212)."""
    text = (ROOT / "docs" / "learning-quality.md").read_text()
    found: dict[str, set[float]] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 8 or cells[0] not in EXPECTED:
            continue
        match = re.match(r"≥\s*([−-]?\d+(?:\.\d+)?)", cells[6])
        if match:
            found.setdefault(cells[0], set()).add(float(match.group(1).replace("−", "-")))
    assert all(len(v) == 1 for v in found.values()), f"one target per env: {found}"
    return {env: values.pop() for env, values in found.items()}


def test_every_preset_target_is_the_documented_one() -> None:
    targets = _doc_targets()
    assert set(targets) == EXPECTED, targets
    for name in EXPECTED:
        cfg = learner_cli.resolve(["--config", f"{PRESET_PREFIX}{name}", "--run-dir", ""])[1]
        assert cfg.target_return == targets[name], name


def _run_configs(argv: list[str]):
    """The configs ``zmq-rl run ARGV`` would train with, and the preset it applied."""
    parser = main_cli.build_parser()
    args = parse_with_config(parser, ["run", *argv], LEARNER_SECTIONS, subparser(parser, "run"))
    return args.applied_preset, *learner_cli.configs_from_args(args)


@pytest.mark.parametrize("name", sorted(EXPECTED | PIXELS))
def test_env_with_a_preset_gets_it_without_config(name: str) -> None:
    """Issue 20: ``--env ENV`` alone gives ENV's tuned settings and target, on both
    commands; flags still win; ``--no-preset`` gives the plain defaults."""
    want = learner_cli.resolve(["--config", f"{PRESET_PREFIX}{name}", "--run-dir", ""])
    args, cfg, ppo, policy = learner_cli.resolve(["--env", name, "--run-dir", ""])
    assert args.applied_preset == name
    assert (cfg, ppo, policy) == tuple(want[1:])
    preset, cfg, ppo, policy = _run_configs(["--env", name, "--run-dir", "", "--seed", "3"])
    assert preset == name and cfg.seed == 3
    assert (replace(cfg, seed=0), ppo, policy) == (replace(want[1], seed=0), *want[2:])
    args, cfg, ppo, _ = learner_cli.resolve(["--env", name, "--no-preset", "--run-dir", ""])
    assert args.applied_preset is None and math.isinf(cfg.target_return)
    assert ppo == PPOConfig() and cfg.num_steps == LearnerConfig().num_steps


def test_env_without_a_preset_gets_plain_defaults_and_no_early_stop() -> None:
    for argv in (["--env", STUB_ENV_ID], ["--env", "MountainCar-v0"]):
        preset, cfg, ppo, _ = _run_configs([*argv, "--run-dir", ""])
        assert preset is None and math.isinf(cfg.target_return), argv
        assert cfg.eval_every == main_cli.RUN_DEFAULTS["eval_every"] and ppo == PPOConfig()
        args, cfg, _, _ = learner_cli.resolve([*argv, "--run-dir", ""])
        assert args.applied_preset is None and math.isinf(cfg.target_return)


def test_a_config_file_turns_the_preset_off(tmp_path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text("[learner]\ngamma = 0.95\n")
    args, cfg, ppo, _ = learner_cli.resolve(
        ["--env", "CartPole-v1", "--config", str(path), "--run-dir", ""]
    )
    assert args.applied_preset is None and cfg.gamma == 0.95
    assert math.isinf(cfg.target_return) and ppo == PPOConfig()


def test_bin_train_stops_cartpole_at_475_through_its_preset() -> None:
    """bin/train runs ``zmq-rl run --env CartPole-v1 "$@"``: CartPole's preset gives
    the stop at 475 that ``zmq-rl run`` no longer has for every env."""
    lines = (ROOT / "bin" / "train").read_text().splitlines()
    line = next(line for line in lines if line.startswith("exec ") and "zmq-rl run" in line)
    argv = shlex.split(line.split("zmq-rl run", 1)[1].replace('"$@"', ""))
    preset, cfg, _, _ = _run_configs([*argv, "--run-dir", ""])
    assert preset == "CartPole-v1" and cfg.env_id == "CartPole-v1"
    assert cfg.target_return == 475.0


def test_unknown_preset_names_the_shipped_ones(capsys) -> None:
    with pytest.raises(UnknownPreset, match="CartPole-v1"):
        preset_path("CartPole-v0")
    with pytest.raises(SystemExit) as exit_info:
        main_cli.main(["run", "--config", "preset:CartPole-v0"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "unknown preset 'CartPole-v0'" in err and "did you mean 'CartPole-v1'" in err
    for name in EXPECTED:
        assert name in err


def test_a_plain_file_still_works(tmp_path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text('[learner]\nenv_id = "Acrobot-v1"\ngamma = 0.95\n')
    _, cfg, _, _ = learner_cli.resolve(["--config", str(path), "--run-dir", ""])
    assert (cfg.env_id, cfg.gamma) == ("Acrobot-v1", 0.95)


def test_run_help_says_how_to_use_presets(capsys) -> None:
    with pytest.raises(SystemExit):
        main_cli.main(["run", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "preset:NAME" in out and "--config preset:LunarLander-v3" in out
    for name in EXPECTED:
        assert name in out


ATARI = "zmq_rl.envs:AtariPong-v0"


def test_atari_preset_is_rl_zoos_ppo_atari() -> None:
    """Issue 29 item 11: Pong ran at num_steps 32 (the learner's default). The preset
    is rl-zoo's atari.yml PPO, for the module id and the bare one alike."""
    for env in (ATARI, "AtariPong-v0"):
        args, cfg, ppo, policy = learner_cli.resolve(["--env", env, "--run-dir", ""])
        assert args.applied_preset == env and cfg.env_id == env
        assert (cfg.num_actors * cfg.num_envs, cfg.num_steps) == (8, 128)
        assert (cfg.gamma, cfg.gae_lambda, cfg.total_env_steps) == (0.99, 0.95, 10_000_000)
        assert (ppo.num_epochs, ppo.minibatch_size) == (4, 256)
        assert (ppo.learning_rate, ppo.anneal_lr) == (2.5e-4, True)
        assert (ppo.clip_range, ppo.anneal_clip_range) == (0.1, True)
        assert (ppo.ent_coef, ppo.vf_coef) == (0.01, 0.5)
        assert policy.factory == "zmq_rl.rl.cnn:nature_cnn"
        cfg.validate(), ppo.validate(), policy.validate()
    assert preset_for("zmq_rl.envs:AtariBreakout-v0") is None  # not Pong's env
    assert preset_for("other.module:AtariPong-v0") is None
    _, cfg, _, _ = learner_cli.resolve(["--env", ATARI, "--num-steps", "64", "--run-dir", ""])
    assert cfg.num_steps == 64  # flags still win


def test_atari_preset_env_builds() -> None:
    if importlib.util.find_spec("ale_py") is None:
        pytest.skip("ale-py is not installed (pip install 'zmq_rl[atari]')")
    from zmq_rl.envs import make_env

    env = make_env(learner_cli.resolve(["--env", ATARI, "--run-dir", ""])[1].env_id)
    try:
        assert env.observation_space.shape == (4, 84, 84)
    finally:
        env.close()


def test_the_preset_line_gives_the_presets_budget_and_this_runs_override() -> None:
    """Issue 29 item 13: ``--total-env-steps 20000`` was printed as the preset's budget."""
    from zmq_rl.run.session import preset_line

    _, cfg, _, _ = learner_cli.resolve(["--env", "CartPole-v1", "--run-dir", ""])
    line = preset_line("CartPole-v1", cfg)
    assert "100,000 steps, target return 475)" in line and "this run" not in line
    _, cfg, _, _ = learner_cli.resolve(
        ["--env", "CartPole-v1", "--total-env-steps", "20000", "--run-dir", ""]
    )
    line = preset_line("CartPole-v1", cfg)
    assert "100,000 steps, target return 475)" in line
    assert "(this run: 20,000 steps)" in line
    line = preset_line(ATARI, learner_cli.resolve(["--env", ATARI, "--run-dir", ""])[1])
    assert line.startswith("using preset AtariPong-v0 (zmq_rl/presets/AtariPong-v0.toml")


def test_setup_cfg_ships_the_presets() -> None:
    text = (Path(__file__).resolve().parents[1] / "setup.cfg").read_text()
    assert "zmq_rl.presets = *.toml" in text


# -- zmq-rl plot: several runs -----------------------------------------------------------


def fake_run(folder: Path, final: float, scale: float = 1.0, env_id: str = "CartPole-v1") -> Path:
    """A run directory with a metrics.jsonl, a report.json and a config.toml."""
    folder.mkdir(parents=True)
    rows = [
        {"update": u, "env_steps": 100 * u, "charts/mean_return": scale * u} for u in range(1, 11)
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    evals = [
        {"env_steps": 500 * k, "mean_return": final * k / 2, "std_return": 1.0} for k in (1, 2)
    ]
    (folder / "report.json").write_text(json.dumps({"evaluations": evals}))
    (folder / "config.toml").write_text(f'[learner]\nenv_id = "{env_id}"\ntarget_return = inf\n')
    return folder


def test_plot_groups_runs_by_label_with_band_and_reference(tmp_path, capsys) -> None:
    runs = [
        fake_run(tmp_path / "a" / f"seed{i}", final=100 + 10 * i, scale=i + 1) for i in range(3)
    ]
    out = tmp_path / "grouped.png"
    argv = [*map(str, runs), "--label", "gae", "--reference", "242=zoo", "--out", str(out)]
    assert main_cli.main(["plot", *argv]) == 0  # the flags through the zmq-rl command itself
    assert out.read_bytes().startswith(b"\x89PNG")
    assert str(out) in capsys.readouterr().out

    # The aggregate itself: mean and min-max over the runs on their common x grid.
    series = [(plot_cli.read_run(r).eval_steps, plot_cli.read_run(r).eval_mean) for r in runs]
    x, mean, low, high = plot_cli._aggregate(series, "minmax")
    assert list(x) == [500.0, 1000.0]
    assert (
        list(mean) == [55.0, 110.0] and list(low) == [50.0, 100.0] and list(high) == [60.0, 120.0]
    )
    _, mean, low, high = plot_cli._aggregate(series, "std")
    assert high[1] - mean[1] == pytest.approx(math.sqrt(200.0 / 3.0))


def test_plot_group_by_parent_and_per_run_labels(tmp_path) -> None:
    runs = [
        fake_run(tmp_path / group / f"s{i}", final=50.0) for group in ("x", "y") for i in range(2)
    ]
    assert plot_cli.run_labels(runs, None, "parent") == ["x", "x", "y", "y"]
    assert plot_cli.run_labels(runs, ["one"], "none") == ["one"] * 4
    assert plot_cli.run_labels(runs, ["a", "b", "a", "b"], "none") == ["a", "b", "a", "b"]
    assert plot_cli.run_labels(runs, None, "none") is None
    assert plot_cli.main([*map(str, runs), "--label", "a", "--label", "b"]) == 1  # 2 labels, 4 runs
    assert main_cli.main(["plot", *map(str, runs), "--label", "a", "--group", "parent"]) == 1
    out = tmp_path / "parents.png"
    args = [*map(str, runs), "--group", "parent", "--band", "std", "--out", str(out)]
    assert plot_cli.main(args) == 0
    assert out.read_bytes().startswith(b"\x89PNG")
    # Runs of different lengths: the group's curve stops where the shortest does.
    short = fake_run(tmp_path / "z" / "short", final=1.0)
    rows = (short / "metrics.jsonl").read_text().splitlines()[:4]
    (short / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    grid = plot_cli._common_grid(
        [
            (plot_cli.read_run(r).train_steps, plot_cli.read_run(r).train_return)
            for r in (runs[0], short)
        ]
    )
    assert grid == [100.0, 200.0, 300.0, 400.0]


def test_plot_single_run_unchanged_and_bad_reference(tmp_path, capsys) -> None:
    run = fake_run(tmp_path / "only", final=10.0)
    assert plot_cli.main([str(run)]) == 0
    assert (run / plot_cli.CURVE_NAME).read_bytes().startswith(b"\x89PNG")
    with pytest.raises(SystemExit):
        plot_cli.main([str(run), "--reference", "high"])
    assert "expected VALUE or VALUE=LABEL" in capsys.readouterr().err


def test_plot_against_wall_time(tmp_path) -> None:
    """--x wall: the curves' x are the learner's wall seconds of each row and
    evaluation (the pixel curve of docs/benchmarks.md is drawn both ways)."""
    run = fake_run(tmp_path / "timed", final=10.0)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        row["wall_seconds"] = 2.0 * row["update"]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = json.loads((run / "report.json").read_text())
    for k, ev in enumerate(report["evaluations"]):
        ev["wall_seconds"] = 7.0 * (k + 1)
    (run / "report.json").write_text(json.dumps(report))
    curve = plot_cli.read_run(run)
    assert curve.train_wall == [2.0 * u for u in range(1, 11)] and curve.eval_wall == [7.0, 14.0]
    out = tmp_path / "wall.png"
    assert (
        main_cli.main(
            ["plot", str(run), str(run), "--label", "x", "--x", "wall", "--out", str(out)]
        )
        == 0
    )
    assert out.read_bytes().startswith(b"\x89PNG")
    with pytest.raises(ValueError, match="x must be one of"):
        plot_cli.plot_runs([run], tmp_path / "no.png", x="time")


def test_plot_ylim_fixes_the_vertical_range(tmp_path, capsys, monkeypatch) -> None:
    """--ylim LOW,HIGH: one seed's -3000 first evaluation must not squash the curves
    (the lag-table images of docs/benchmarks.md use it); a side left empty stays
    automatic; bad values are refused by name."""
    from matplotlib.figure import Figure

    assert plot_cli.parse_ylim("-400,300") == (-400.0, 300.0)
    assert plot_cli.parse_ylim("-400,") == (-400.0, None)
    assert plot_cli.parse_ylim(",300") == (None, 300.0)
    for bad, message in [
        ("-400", "expected LOW,HIGH"),
        ("a,1", "must be numbers"),
        ("5,1", "LOW must be below HIGH"),
        ("-inf,1", "finite"),
    ]:
        with pytest.raises(ValueError, match=message):
            plot_cli.parse_ylim(bad)
    seen: list[tuple[float, float]] = []
    original = Figure.savefig

    def spy(self, *args, **kwargs):
        seen.append(self.axes[0].get_ylim())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    runs = [fake_run(tmp_path / f"s{i}", final=-3000.0 if i == 0 else 100.0) for i in range(2)]
    out = tmp_path / "cut.png"
    assert (
        main_cli.main(
            ["plot", *map(str, runs), "--label", "x", "--ylim=-400,300", "--out", str(out)]
        )
        == 0
    )
    assert seen[-1] == (-400.0, 300.0)
    assert plot_cli.main([*map(str, runs), "--label", "x", "--ylim=-400,", "--out", str(out)]) == 0
    assert seen[-1][0] == -400.0 and seen[-1][1] > 0
    with pytest.raises(SystemExit):
        plot_cli.main([*map(str, runs), "--ylim", "5,1"])
    assert "LOW must be below HIGH" in capsys.readouterr().err
