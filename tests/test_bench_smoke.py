"""Every benchmark script runs with ``--smoke`` and writes its JSON (so they cannot rot).

The smoke runs start together, as subprocesses, the first time any test here
needs one (they mostly wait on process start-up and timers, so together they take
about as long as the slowest alone); each test then waits for its own, bounded.
The Stable-Baselines3 / Sample Factory parts are optional: they run when
``stable_baselines3`` is importable here or in ``.venv-bench`` and are checked only
then (Sample Factory is skipped by ``--smoke`` itself: its start-up alone is too
slow). Figures measured in a smoke run mean nothing; only shapes and invariants
(no lost fragment, every frame received) are checked.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.process_groups import ProcessGroups, run_in_group

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
SCRIPTS = (
    "transport",
    "throughput",
    "time_to_solve",
    "time_to_score",
    "fan_in",
    "broadcast",
    "actor_loop",
    "actor_footprint",
    "launch",
    "eval_overhead",
    "inference_latency",
    "ingest_ab",
    "learner_ranks",
    "learner_ceiling",
    "scaling",
    "fleet",
    "update_cost",
    "policies",
)
TIMEOUT_S = 150.0

sys.path.insert(0, str(BENCH))


class SmokeRuns:
    """All smoke runs, started together on first use; each in a process group of its
    own that dies with the test (:class:`~tests.process_groups.ProcessGroups`: a script
    that timed out is killed with its children, e.g. the ``zmq-rl serve`` of
    ``inference_latency.py``, and all of them if the test process itself is killed)."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.groups = ProcessGroups()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, Path] = {}
        self.started = 0.0

    def start(self) -> None:
        if self.procs:
            return
        self.started = time.monotonic()
        for name in SCRIPTS:
            log = self.out_dir / f"{name}.log"
            self.logs[name] = log
            with open(log, "wb") as fh:
                self.procs[name] = self.groups.popen(
                    [
                        sys.executable,
                        str(BENCH / f"{name}.py"),
                        "--smoke",
                        "--out",
                        str(self.out_dir / f"{name}.json"),
                    ],
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    cwd=ROOT,
                )

    def result(self, name: str) -> dict[str, Any]:
        self.start()
        proc = self.procs[name]
        remaining = max(1.0, TIMEOUT_S - (time.monotonic() - self.started))
        try:
            code = proc.wait(remaining)
        except subprocess.TimeoutExpired:
            self.groups.kill(proc)  # the script and every child it started
            pytest.fail(f"{name}.py --smoke did not finish in {TIMEOUT_S:.0f}s:\n{self.tail(name)}")
        assert code == 0, f"{name}.py --smoke exited {code}:\n{self.tail(name)}"
        path = self.out_dir / f"{name}.json"
        assert path.is_file(), f"{name}.py --smoke wrote no JSON:\n{self.tail(name)}"
        data = json.loads(path.read_text())
        for key in ("benchmark", "smoke", "command", "date", "machine"):
            assert key in data, key
        assert data["benchmark"] == name and data["smoke"] is True
        return data

    def tail(self, name: str) -> str:
        return self.logs[name].read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        """Kill every script's group (a script that exited may have left children)."""
        self.groups.close()


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory):
    runs = SmokeRuns(tmp_path_factory.mktemp("bench-smoke"))
    yield runs
    runs.stop()


@pytest.fixture(scope="module")
def sb3_available() -> bool:
    import _util

    return _util.bench_python("stable_baselines3") is not None


def test_transport_smoke(smoke: SmokeRuns) -> None:
    data = smoke.result("transport")
    assert [(row["T"], row["envs"]) for row in data["summary"]] == [(64, 8), (64, 32)]
    for row in data["summary"]:
        for key in ("raw_transitions_per_s", "project_transitions_per_s", "project_vs_raw"):
            assert row[key] > 0, key
    assert {run["variant"] for run in data["runs"]} == {"raw", "project"}
    for run in data["runs"]:
        assert run["completed"] and run["received"] > 0
        if run["variant"] == "project":  # every row received was validated and taken
            assert run["consumed_rows"] > 0
    payloads = [row["payload"] for row in data["ingest"]]
    assert payloads == ["CartPole", "CartPole", "Atari 84x84x4 uint8"]
    assert all(row["transitions_per_s"] > 0 for row in data["ingest"])
    assert set(data["target"]) == {"ratio", "cartpole_ingest", "atari_ingest"}


def test_throughput_smoke(smoke: SmokeRuns, sb3_available: bool) -> None:
    data = smoke.result("throughput")
    (cell,) = data["grid"]
    assert cell["actors"] == 1 and cell["num_envs"] == 8
    assert cell["steps_per_s"] > 0 and cell["updates"] > 0
    assert data["summary"]["project_best_steps_per_s"] > 0
    assert data["config"]["throughput"]["num_epochs"] == 1
    # Like for like (issue 13): the project at SF's and SB3 zoo's learner settings, each
    # row with its gradient steps per 1k env steps (SF 1 epoch of 512; zoo 20 of 256).
    round0 = data["rounds"][0]
    for name in ("sf", "sb3"):
        assert round0[f"project_at_{name}_settings"]["steps_per_s"] > 0
    grad = data["summary"]["grad_steps_per_1k"]
    assert grad["sf"] == pytest.approx(1000 / 512) and grad["sb3"] == pytest.approx(20_000 / 256)
    sb3 = data["rounds"][0].get("sb3")
    if sb3_available:
        assert sb3 and sb3["ok"] and sb3["steps_per_s"] > 0, sb3
    else:
        assert sb3 is None


def test_sf_log_parser() -> None:
    """Sample Factory does not run in --smoke; its log parsing is checked here."""
    import throughput

    log = (
        "\x1b[36m[2026-12-02 13:43:02,617][22756] Fps is (10 sec: nan, 60 sec: nan, 300 sec: "
        "nan). Total num frames: 40960. Throughput: 0: nan.\x1b[0m\n"
        "\x1b[36m[2026-12-02 13:43:07,617][22756] Fps is (10 sec: 10854.6, 60 sec: 10854.6, "
        "300 sec: 10854.6). Total num frames: 95232. Throughput: 0: 13024.3.\x1b[0m\n"
        "\x1b[36m[2026-12-02 13:43:12,617][22756] Fps is (10 sec: 10956.8). Total num frames: "
        "150528. Throughput\x1b[0m\n"
        "\x1b[37m\x1b[1m[2026-12-02 13:43:27,128][22756] Collected {0: 300544}, FPS: 9061.1\n"
    )
    reports = throughput.SF_REPORT.findall(log)
    assert [int(n) for _, n in reports] == [40960, 95232, 150528]
    assert throughput.SF_FINAL.search(log).groups() == ("300544", "9061.1")


def test_time_to_solve_smoke(smoke: SmokeRuns, sb3_available: bool) -> None:
    data = smoke.result("time_to_solve")
    (run,) = data["zmq_rl"]
    assert run["first_update_s"] and run["first_update_s"] > 0, run
    assert run["evaluations"] >= 1 or run["solved"], run
    assert data["summary"]["target_return"] == 100.0
    if sb3_available:
        (sb3,) = data["sb3"]
        assert sb3["learn_start_s"] and sb3["learn_start_s"] > 0, sb3
    else:
        assert data["sb3"] == []


def test_time_to_score_smoke(smoke: SmokeRuns) -> None:
    """Acrobot-v1 to -400, one seed, the project side only (SB3 and SF are not run by
    --smoke, installed or not, and are reported as not measured only when asked for)."""
    data = smoke.result("time_to_score")
    assert data["config"]["envs"] == {"Acrobot-v1": {"target": -400.0, "cadence_env_steps": 8192}}
    assert data["config"]["sides"] == ["zmq"]
    (run,) = data["runs"]["Acrobot-v1"]["zmq"]
    assert run["start_s"] and run["start_s"] > 0, run  # it trained
    if run["solved"]:
        assert 0 < run["solve_s"] <= data["config"]["cap_s"], run
        assert run["env_steps_at_solve"] > 0 and run["evaluations"], run
        assert run["unsolved"] is None
    else:  # a loaded machine may hit the cap; anything else (a crash) fails here
        assert run["unsolved"] == "cap", run
        assert run["solve_s"] is None, run  # infinitely slow: null in strict JSON
    summary = data["summary"]["Acrobot-v1"]["zmq"]
    assert summary["runs"] == 1 and summary["solved"] == int(run["solved"])


def test_time_to_score_order_and_ratio() -> None:
    """Seeds rotate the sides' order; unsolved runs make a bound or no ratio; an unknown
    side or env is refused."""
    import time_to_score

    assert time_to_score.side_order(["zmq", "sb3"], 0) == ["zmq", "sb3"]
    assert time_to_score.side_order(["zmq", "sb3"], 1) == ["sb3", "zmq"]
    three = [time_to_score.side_order(["zmq", "sb3", "sf"], i)[0] for i in range(3)]
    assert sorted(three) == ["sb3", "sf", "zmq"]  # each side goes first once in 3 seeds

    def run(solve_s: float | None, unsolved: str | None = None) -> dict[str, Any]:
        return {"solved": solve_s is not None, "solve_s": solve_s, "unsolved": unsolved}

    plain = time_to_score.compare([run(10.0)], [run(40.0)], cap=100.0)
    assert plain == {"ratio": 0.25, "bound": False, "why": ""}
    capped = time_to_score.compare([run(10.0)], [run(None, "cap")], cap=100.0)
    assert capped["ratio"] == 0.1 and capped["bound"]  # theirs counted as the cap
    early = time_to_score.compare([run(10.0)], [run(None, "ended after 9s")], cap=100.0)
    assert early["ratio"] is None  # a crash is not a slow run
    assert time_to_score.compare([run(None, "cap")], [run(5.0)], cap=100.0)["ratio"] is None
    with pytest.raises(SystemExit):
        time_to_score.main(["--sides", "zmq,rllib", "--out", "/dev/null"])
    with pytest.raises(SystemExit):
        time_to_score.main(["--envs", "Pong-v5", "--out", "/dev/null"])


def test_fan_in_smoke(smoke: SmokeRuns) -> None:
    data = smoke.result("fan_in")
    losses = data["losses"]
    assert losses["actors_reporting"] == losses["actors_started"] == data["config"]["actors"]
    assert losses["fragments_sent"] > 0
    assert losses["lost_fragments"] == 0 and losses["seq_gaps"] == 0, losses
    assert not losses["bad_counters"] and not losses["actor_errors"], losses
    assert data["throughput"]["fragments_per_s"] > 0
    for key in ("received", "consumed"):
        assert data["latency"][key]["count"] > 0
        assert data["latency"][key]["p50_ms"] <= data["latency"][key]["p99_ms"]
    assert data["rss"]["samples_since_first_update"]
    assert data["rss"]["baseline_mib"] > 0


def test_broadcast_smoke(smoke: SmokeRuns) -> None:
    data = smoke.result("broadcast")
    modes = {(r["mode"], tuple(r["hidden_sizes"])) for r in data["results"]}
    assert ("idle", (64, 64)) in modes and ("busy", (64, 64)) in modes
    assert any(m == "idle" and h != (64, 64) for m, h in modes)  # the big-model path
    for result in data["results"]:
        assert result["latency"]["count"] > 0, result
        assert result["latency"]["p50_ms"] > 0
    assert data["target"]["judged_on"] == "idle mode, default MLP"


def test_actor_loop_smoke(smoke: SmokeRuns) -> None:
    data = smoke.result("actor_loop")
    (result,) = data["results"]
    assert result["envs"] == 8
    assert len(result["env_step_us"]) == 3 and all(v > 0 for v in result["env_step_us"].values())
    assert result["policy_act_us"] > 0 and result["client_step_us"] > 0
    assert result["numpy_act_us"] > 0


def test_actor_footprint_smoke(smoke: SmokeRuns) -> None:
    data = smoke.result("actor_footprint")
    (row,) = data["rows"]
    assert row["code"] == "this tree" and row["ready_s"] > 0 and row["ready_cpu_s"] > 0
    assert row["peak_rss_mb"] > 0
    assert row["torch_loaded"] is False  # the plain MLP's actor runs without torch


def test_launch_smoke(smoke: SmokeRuns) -> None:
    data = smoke.result("launch")
    assert {r["mode"] for r in data["runs"]} == {"after", "before"}
    for run in data["runs"]:
        assert 0 < run["learner_built"] <= run["first_update"], run


def test_eval_overhead_smoke(smoke: SmokeRuns) -> None:
    data = smoke.result("eval_overhead")
    (results,) = data["rounds"]
    assert set(results) == {"off", "loop", "background"}
    assert results["off"]["periodic_evaluations"] == 0
    assert results["loop"]["periodic_evaluations"] >= 1  # every eval_every updates
    for result in results.values():
        assert result["steps_per_s"] > 0 and result["env_steps"] >= data["config"]["steps"] // 2
        assert result["final_eval"] is not None  # the final evaluation always runs


def test_inference_latency_smoke(smoke: SmokeRuns) -> None:
    data = smoke.result("inference_latency")
    assert [r["simulators"] for r in data["rows"]] == [1, 8]  # --smoke leaves out 64
    for row in data["rows"]:
        assert row["requests"] >= data["config"]["requests"]
        assert 0 < row["p50_ms"] <= row["p99_ms"] <= row["max_ms"]
        assert row["requests_per_s"] > 0 and row["server_cpu_ms_per_request"] > 0


def test_pyspy_summary_parses_raw(tmp_path: Path) -> None:
    import pyspy_summary

    raw = tmp_path / "x.raw"
    raw.write_text(
        'process 1:"python bench/throughput.py";process 2:"python -c from multiprocessing.spawn '
        'import spawn_main; spawn_main(1)";run (zmq_rl/actor.py:10);step (gym/core.py:5) 30\n'
        'process 1:"python bench/throughput.py";pump (zmq_rl/learner.py:3);'
        "Poller.poll (zmq/sugar/poll.py:9) 10\n"
    )
    stacks = pyspy_summary.parse(str(raw))
    assert set(stacks) == {"spawned child [pid 2]", "throughput.py [pid 1]"}
    learner = pyspy_summary.summarise(stacks["throughput.py [pid 1]"], 5)
    assert learner["waiting_pct"] == 100.0
    child = pyspy_summary.summarise(stacks["spawned child [pid 2]"], 5)
    assert child["self_in_project"][0] == ("run (actor.py)", 100.0)


def test_ingest_ab_smoke(smoke: SmokeRuns) -> None:
    data = smoke.result("ingest_ab")
    rows = data["rows"]
    assert [row["ingest_thread"] for row in rows] == [True, False]  # one round, on first
    for row in rows:
        assert row["steps_per_s"] > 0 and row["updates"] > 0, row
        assert not [k for k in row["counters"] if k.startswith("rejected")], row["counters"]
    assert data["median_ratio"] == pytest.approx(rows[0]["steps_per_s"] / rows[1]["steps_per_s"])


def test_learner_ranks_smoke(smoke: SmokeRuns) -> None:
    data = smoke.result("learner_ranks")
    rows = data["rows"]
    assert [row["num_learners"] for row in rows] == [1, 2]  # one round, one rank first
    for row in rows:
        assert row["steps_per_s"] > 0 and row["updates"] > 0, row
        assert not [k for k in row["counters"] if k.startswith("rejected")], row["counters"]
    assert data["median_ratio"] == pytest.approx(rows[1]["steps_per_s"] / rows[0]["steps_per_s"])


def test_learner_ceiling_smoke(smoke: SmokeRuns) -> None:
    """The ceiling row: a real learner fed by one replayer (8 envs) at the preset's batch
    (4,096 rows, whatever the actors), its busy share a share, the env-only rate beside."""
    data = smoke.result("learner_ceiling")
    (row,) = data["rows"]
    assert row["actors"] == 1 and row["rows_per_update"] == 4096
    assert row["steps_per_s"] > 0 and row["updates"] >= 2, row
    assert 0.0 < row["learner_busy_share"] <= 1.05, row
    assert data["env_only_steps_per_s"] > 0


def test_scaling_smoke(smoke: SmokeRuns) -> None:
    """One CartPole run to its smoke target: solved, with the ratio to the env-only
    time of the steps it took computed from the figures it prints."""
    data = smoke.result("scaling")
    (row,) = data["rows"]
    assert row["solved"] and row["steps_at_score"] > 0, row
    env_only = row["steps_at_score"] / data["env_only_steps_per_s"]
    assert row["env_only_s"] == pytest.approx(env_only)
    assert row["ratio"] == pytest.approx(row["time_to_score_s"] / env_only)
    assert 0.0 < row["learner_busy_share"] <= 1.05, row


def test_fleet_smoke(smoke: SmokeRuns) -> None:
    """CartPole whose steps wait 2 ms, 1 and 2 actors to the smoke target: each row solved
    (or the cap on a loaded machine), with the figures the table is made of."""
    import fleet

    data = smoke.result("fleet")
    assert data["wait_ms"] == 2.0 and [r["actors"] for r in data["rows"]] == [1, 2]
    for row in data["rows"]:
        assert row["solved"] or row["time_to_score_s"] is None, row  # null: the cap
        if row["solved"]:
            assert row["steps_at_score"] > 0 and 0 < row["learner_busy_share"] <= 1.05, row
    lines = fleet.table(data["rows"], [1, 2])
    assert [line[1] for line in lines] == [1, 2] and lines[0][4] == "1.00"
    assert fleet.wait_flags(10, Path(fleet.BENCH).parent) == [
        "--wrapper", "zmq_rl.envs:StepDelay(seconds=0.01)",
    ]  # fmt: skip


def test_a_score_that_came_between_progress_lines_is_timed_by_its_update() -> None:
    """A background evaluation at the score that came in between progress lines stops
    the run before the next line (and "stopping" is INFO, below the benchmark's log
    level): its time is the launch's clock at the update it came with. Before, such a
    run counted as never solved."""
    import math

    import scaling

    metrics = [{"update": 1, "wall_seconds": 1.5}, {"update": 40, "wall_seconds": 9.5}]
    hit = {"updates": 10, "reported_at_update": 40, "mean_return": 500.0}
    assert scaling.arrival_s(hit, metrics, first_update=4.0) == pytest.approx(12.0)
    assert math.isinf(scaling.arrival_s(hit, metrics, first_update=math.nan))
    assert math.isinf(scaling.arrival_s({**hit, "reported_at_update": 41}, metrics, 4.0))


def test_update_cost_smoke(smoke: SmokeRuns) -> None:
    """Both heads timed with closed-form gradients and with autograd, per step."""
    data = smoke.result("update_cost")
    assert sorted(r["action"] for r in data["rows"]) == ["box", "discrete"]
    for row in data["rows"]:
        assert row["analytic_step_ms"] > 0 and row["autograd_step_ms"] > 0, row
        assert row["steps_per_update"] == 4 * 4, row  # 4,096 rows in minibatches of 1,024


def test_update_cost_compares_revisions(tmp_path: Path) -> None:
    """``--base-tree``: each tree's update timed in its own process, both rows filled
    (this tree against itself, so the figures only need to exist)."""
    out = tmp_path / "update_cost.json"
    done = run_in_group(  # the trees' timing processes die with it
        [sys.executable, str(BENCH / "update_cost.py"), "--smoke", "--actions", "discrete",
         "--base-tree", str(ROOT), "--out", str(out)],
        TIMEOUT_S, cwd=ROOT, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (row,) = json.loads(out.read_text())["rows"]
    assert row["base_ms"] > 0 and row["this_ms"] > 0 and row["ratio"] > 0, row
    assert [len(v) for v in row["rounds_ms"].values()] == [1, 1], row


def test_update_cost_refuses_to_time_another_trees_code(tmp_path: Path) -> None:
    """A child that imported zmq_rl from somewhere else than the tree it was asked to
    time stops, naming both: a revision comparison never times one tree twice."""
    import update_cost

    with pytest.raises(SystemExit, match="not the code in"):
        update_cost.measure_tree(str(tmp_path), "discrete", 1024)


@pytest.mark.parametrize(
    ("cores", "counts"), [(2, [1, 2]), (16, [1, 2, 4, 8, 14]), (8, [1, 2, 4, 6])]
)
def test_scaling_actor_counts_reach_the_cores(cores: int, counts: list[int]) -> None:
    import scaling

    assert scaling.default_actor_counts(cores) == counts


def test_policies_smoke(smoke: SmokeRuns) -> None:
    """One pair of roles runs: one shared policy, then two; both report, the two
    policies each with their own return."""
    data = smoke.result("policies")
    runs = {r["policies"]: r for r in data["runs"]}
    assert set(runs) == {"shared", "map"} and all(r["steps_per_s"] > 0 for r in runs.values())
    assert set(runs["map"]["per_policy"]) == {"red", "blue"} and not runs["shared"]["per_policy"]
