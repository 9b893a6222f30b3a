"""Multi-agent (PettingZoo) envs as slots: naming them, the slots' bookkeeping for
agents that appear and leave, the ``valid`` rows on the wire, and evaluation."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest

pytest.importorskip("pettingzoo")

from tests.agent_envs import ComingAndGoing  # noqa: E402
from zmq_rl.envs import EnvBuildError, build_env, env_shape, make_env  # noqa: E402
from zmq_rl.envs.multi_agent import AgentSpaceMismatch, ParallelSlots, agent_spaces  # noqa: E402
from zmq_rl.wire.protocol import Fragment, ProtocolError, decode, encode  # noqa: E402


def _run_slots(envs: list[ComingAndGoing], steps: int, seed: int = 0):
    """Step ``envs`` through ParallelSlots with random actions; every row by slot."""
    slots = ParallelSlots(envs, envs[0].possible_agents)
    rng = np.random.default_rng(seed)
    slots.reset([seed + i for i in range(len(envs))])
    rows = defaultdict(list)
    for _ in range(steps):
        actions = rng.integers(0, 3, slots.num_slots)
        out = slots.step(actions)
        for slot in range(slots.num_slots):
            rows[slot].append(
                (
                    bool(out.valid[slot]),
                    float(out.rewards[slot]),
                    bool(out.terminated[slot]),
                    bool(out.truncated[slot]),
                    slot in out.final_obs,
                )
            )
    return slots, rows


def test_pettingzoo_envs_are_named_like_gymnasium_ones():
    shape = env_shape("pettingzoo.sisl.pursuit_v5")
    assert shape.agents_per_env == 8 and shape.action_space.n == 5
    assert env_shape("tests.agent_envs:coming_and_going").agents_per_env == 4
    assert env_shape("CartPole-v1").agents_per_env == 1
    with pytest.raises(EnvBuildError, match="multi-agent"):
        make_env("tests.agent_envs:coming_and_going")


def test_a_turn_based_game_stays_an_aec_env_with_a_slot_per_seat():
    from zmq_rl.envs.multi_agent import is_turn_based

    c4 = "pettingzoo.classic.connect_four_v3"
    assert is_turn_based(build_env(c4)) and env_shape(c4).agents_per_env == 2
    assert not is_turn_based(build_env("pettingzoo.sisl.pursuit_v5"))


def test_agents_with_different_spaces_are_named():
    env = build_env("pettingzoo.test.example_envs.generated_agents_parallel_v0")
    with pytest.raises(AgentSpaceMismatch, match="possible_agents"):
        agent_spaces(env, "gen")


def test_rows_of_agents_that_come_and_go_match_the_envs_ledger():
    """No lost or invented rows: every valid row is one agent step the env ran, in
    order, with its reward and ending; rows that are not valid carry nothing."""
    envs = [ComingAndGoing(max_cycles=9) for _ in range(3)]
    slots, rows = _run_slots(envs, 400)
    k = slots.agents_per_env
    assert sum(env.episodes for env in envs) > 30  # many episodes, births and deaths
    for e, env in enumerate(envs):
        expected = defaultdict(list)
        for agent, reward, term, trunc in env.ledger:
            expected[agent].append((reward, term, trunc))
        for i, agent in enumerate(env.possible_agents):
            column = rows[e * k + i]
            got = [(r, t, u) for valid, r, t, u, _ in column if valid]
            assert got == expected[agent], (e, agent)
            assert any(not valid for valid, *_ in column)  # it did wait, empty
            for (valid, r, t, u, final), (next_valid, *_) in zip(column, column[1:], strict=False):
                if not valid:
                    assert (r, t, u) == (0.0, False, False)
                if valid and not next_valid:
                    assert t or u  # an agent's last row ends its episode
                assert final == (u and not t)
    valid_rows = sum(valid for column in rows.values() for valid, *_ in column)
    assert valid_rows == sum(len(env.ledger) for env in envs)


def test_a_slot_without_an_agent_shows_a_live_agents_observation():
    env = ComingAndGoing(mask=True)
    slots = ParallelSlots([env], env.possible_agents)
    obs = slots.reset([3])
    live = np.flatnonzero(slots.alive)
    assert live.size < 4  # some agents come later
    assert (obs["action_mask"] == 1).all()  # a policy can act on every slot


def test_valid_rows_travel_and_are_checked():
    def fragment(valid, rewards=(1.0, 0.0), terminated=(True, False)):
        return Fragment.for_slot(
            0,
            obs=np.zeros((2, 3), np.float32),
            actions=np.zeros(2, np.int64),
            rewards=np.asarray(rewards, np.float32),
            terminated=np.asarray(terminated),
            truncated=np.zeros(2, bool),
            values=np.zeros(2, np.float32),
            log_probs=np.zeros(2, np.float32),
            next_obs=np.zeros(3, np.float32),
            valid=valid,
            actor_id=0,
            version=0,
            seq=0,
            run_id="r",
            token=b"t" * 16,
        )

    back = decode(encode(fragment([True, False])))
    assert back.valid.tolist() == [[True], [False]]
    assert decode(encode(fragment([True, True]))).valid is None  # all valid: as absent
    with pytest.raises(ProtocolError, match=r"fragment.rewards\[1, 0\]"):
        decode(encode(fragment([True, False], rewards=(1.0, 2.0))))
    with pytest.raises(ProtocolError, match=r"fragment.valid\[0, 0\].*end its episode"):
        decode(encode(fragment([True, False], terminated=(False, False))))


def test_a_client_refuses_rows_that_are_not_valid_for_a_single_agent_learner():
    from types import SimpleNamespace

    from zmq_rl.actor.client import ActorClient
    from zmq_rl.wire.protocol import StepArrays

    client = ActorClient.__new__(ActorClient)
    client._open = None
    steps = StepArrays(*(np.zeros(2, t) for t in (np.float32, np.int64, np.float32)),
                       np.zeros(2, bool), np.zeros(2, bool), np.zeros(2, np.float32),
                       np.zeros(2, np.float32))  # fmt: skip
    client.settings = SimpleNamespace(agents_per_env=1)
    with pytest.raises(ValueError, match="agents_per_env"):
        client._rows_valid([True, False], steps)
    client.settings = SimpleNamespace(agents_per_env=2)
    assert client._rows_valid([True, False], steps).tolist() == [True, False]
    steps.rewards[1] = 1.0
    with pytest.raises(ValueError, match="slot 1: a row that is not valid must have reward 0"):
        client._rows_valid([True, False], steps)
    steps.rewards[1] = 0.0
    client._rows_valid([True, True], steps)  # slot 1 now open (its episode goes on) ...
    with pytest.raises(ValueError, match="slot 1: its previous row did not end"):
        client._rows_valid([True, False], steps)  # ... so it cannot go empty unannounced


@pytest.mark.timeout(300)
@pytest.mark.parametrize("batch_mode", ["rows", "slots"])
def test_a_real_run_of_agents_that_come_and_go_learns_and_counts_agent_steps(
    tmp_path, capsys, batch_mode
):
    """``zmq-rl run`` on a PettingZoo env whose agents appear and leave mid-episode:
    a learner and two actor processes over tcp. Rows of empty slots are not env steps
    (each update consumes fewer than num_steps x slots), the budget is met in agent
    steps, and the shared policy learns (random play scores about 1/3 per step).

    Rows batches spend the budget exactly: the last batch ends at the budget's last
    agent step, however many of its rows are not valid (issue 44 section 3, issue 45
    N12: runs stopped up to a segment short). Every slot's rollouts are whole: the run
    ends before the first one whose agent steps, counted once it is queued, would
    overrun the budget (not before one whose rows would)."""
    import re

    from tests.conftest import free_port_block
    from zmq_rl.cli import main as main_cli

    run_dir = tmp_path / "run"
    argv = ["run", "--env", "tests.agent_envs:coming_and_going", "--actors", "2"]
    argv += ["--num-envs", "2", "--num-steps", "32", "--total-env-steps", "16000"]
    argv += ["--eval-episodes", "20", "--port", str(free_port_block())]
    argv += ["--run-dir", str(run_dir), "--no-plot", "--batch-mode", batch_mode]
    argv += ["--log-level", "info"]
    rc = main_cli.main(argv)
    err = capsys.readouterr().err
    assert rc == 0, err
    report = json.loads((run_dir / "report.json").read_text())
    assert report["stop_reason"] == "budget spent"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [int(r["env_steps"]) for r in rows if "env_steps" in r and "losses/policy_loss" in r]
    per_update = np.diff([0, *steps])
    assert len(per_update) >= 20, rows[:2]
    slots = 2 * 2 * 4  # actors x envs x possible agents
    assert (per_update < 32 * slots).all() and (per_update > 0).all(), per_update
    consumed = report["env_steps_consumed"]
    assert consumed == steps[-1] == report["counters"]["consumed/steps"]
    if batch_mode == "rows":
        assert consumed == 16000, per_update[-3:]
    elif consumed < 16000:  # the declined rollout's agent steps would have overrun
        ended = re.search(r"ends the run at (\d+) of total_env_steps=16000: the next "
                          r"update's (\d+) env steps would overrun", err)  # fmt: skip
        assert ended, err[-2000:]
        assert int(ended[1]) == consumed
        declined = int(ended[2])
        assert consumed + declined > 16000 and declined < 32 * slots  # rows: not steps
    evaluation = report["evaluations"][-1]
    assert evaluation["mean_return"] >= 3.0, report["evaluations"]  # random: ~1.5


class _Counted:
    """Wraps a PettingZoo AEC env: counts each agent's moves and sums its rewards."""

    def __init__(self, env):
        self.env = env
        self.moves = defaultdict(int)
        self.earned = defaultdict(float)
        self.games = 0
        self.skip = set()  # seats an opponent plays this game: not counted

    def __getattr__(self, name):
        return getattr(self.env, name)

    def reset(self, seed=None, options=None):
        self.games += 1
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        if action is not None and self.env.agent_selection not in self.skip:
            self.moves[self.env.agent_selection] += 1
        self.env.step(action)
        for agent, reward in self.env.rewards.items():
            if agent not in self.skip:
                self.earned[agent] += float(reward)


def _random_decisions(obs, rng):
    from zmq_rl.actor.agent import Decision

    actions = np.array([rng.choice(np.flatnonzero(m)) for m in obs["action_mask"]])
    zeros = np.zeros(len(actions), np.float32)
    return Decision(actions, actions, zeros, zeros, 0)


def _random_turn(slots, rng) -> list[int]:
    """One turn of ``slots`` (a TurnSlots) by random legal moves; the envs that moved."""
    idx, movers, obs = slots.to_move()
    if obs is not None:
        decided = _random_decisions(obs, rng)
        slots.play(idx, movers, decided.env_actions, decided)
    return idx


@pytest.mark.parametrize("opponent_share", [0.0, 0.5])
def test_turn_based_rows_match_every_move_and_result_and_chain(opponent_share):
    """Connect four, random legal moves: every move is one valid row of its agent's
    slot, in order, each game's result is in its agents' rows, a row that is not
    valid only follows a game's end, and a row's next observation is the one its
    slot's next row acted on. With opponent seats (half the games), their moves are
    never rows and every game against one is tallied."""
    from zmq_rl.envs.multi_agent import TurnSlots

    envs = [_Counted(build_env("pettingzoo.classic.connect_four_v3")) for _ in range(3)]
    slots = TurnSlots(envs, envs[0].possible_agents, opponent_share, np.random.default_rng(1))
    slots.reset([0, 1, 2])
    rng = np.random.default_rng(0)
    emitted = []
    k = slots.agents_per_env
    against = 0
    for _ in range(120):
        for e, env in enumerate(envs):
            env.skip = {a for i, a in enumerate(env.possible_agents) if slots.opponent[e * k + i]}
        for _ in range(slots.agents_per_env):
            idx = _random_turn(slots, rng)
            against += sum(
                bool(slots.opponent[e * k : e * k + k].any()) for e in idx if slots._over[e]
            )
        emitted.append(slots.emit(np.int64(0)))
    assert sum(env.games for env in envs) > 15
    for slot in range(slots.num_slots):
        env, agent = envs[slot // k], envs[0].possible_agents[slot % k]
        column = [(r.valid[slot], r, slot) for r in emitted]
        kept = list(slots.final[slot]) + ([slots.held[slot]] if slots.held[slot] else [])
        assert sum(v for v, _, _ in column) + len(kept) == env.moves[agent]
        rewards = sum(float(r.rewards[slot]) for v, r, _ in column if v)
        rewards += sum(row.reward for row in slots.final[slot])
        assert rewards == pytest.approx(env.earned[agent])  # every result reached its rows
        ends = sum(bool(r.terminated[slot]) for v, r, _ in column if v)
        ends += sum(row.terminated for row in slots.final[slot])
        if not opponent_share:
            assert ends == env.games - (1 if env.agents else 0)
        for (v, r, _), (v_next, r_next, _) in zip(column, column[1:], strict=False):
            mask = r.obs["action_mask"][slot]
            if v:
                assert mask[r.actions[slot]] == 1  # the move was legal where it was made
            if v and not r.terminated[slot]:
                assert v_next  # a game in progress never leaves its slot empty
                for key in ("observation", "action_mask"):
                    assert (r.next_obs[key][slot] == r_next.obs[key][slot]).all()
            if not v:
                assert r.rewards[slot] == 0 and not r.terminated[slot]
            if not v_next:
                assert not v or r.terminated[slot] or r.truncated[slot]
    assert any(not r.valid.all() for r in emitted)  # first rounds of games: not valid
    assert sum(slots.results.values()) == against  # one result per game against the pool
    assert (against > 10) == bool(opponent_share)


@pytest.mark.parametrize(
    "network",
    [[], ["--factory", "zmq_rl.rl.boards:drop_game_cnn"]],
    ids=["mlp", "drop_game"],
)
def test_a_real_run_of_connect_four_by_self_play(tmp_path, capsys, network):
    """``zmq-rl run`` on a turn-based PettingZoo game: one shared policy plays both
    seats in every game over tcp; evaluations play it against random legal moves.
    A factory's network (``zmq_rl.rl.boards:drop_game_cnn``, the benchmark's, a module
    of its own rather than the built-in structured one) runs the same way, with the
    opponent pool's snapshots built by the actors from the same factory, and the saved
    policy loads and keeps to the action mask. (``board_cnn`` is the built-in network
    with another encoder part: tests/test_board_cnn.py.)"""
    from tests.conftest import free_port_block
    from zmq_rl.cli import main as main_cli

    run_dir = tmp_path / "run"
    argv = ["run", "--env", "pettingzoo.classic.connect_four_v3", "--actors", "1"]
    argv += ["--num-envs", "4", "--total-env-steps", "6000", "--eval-episodes", "20"]
    argv += ["--port", str(free_port_block()), "--run-dir", str(run_dir), "--no-plot"]
    if network:
        argv += [*network, "--opponent-pool", "2", "--opponent-every", "2"]
    assert main_cli.main(argv) == 0, capsys.readouterr().err
    report = json.loads((run_dir / "report.json").read_text())
    assert report["stop_reason"] == "budget spent"
    assert report["env_steps_consumed"] == 6000  # moves; the last batch ends at the budget's
    assert report["evaluations"] and -1.0 <= report["evaluations"][-1]["mean_return"] <= 1.0
    assert report["episodes_completed"] > 100
    if network:
        from zmq_rl import load_policy

        policy = load_policy(run_dir)  # the factory rebuilds it outside the run
        board = np.zeros((2, 6, 7, 2), np.int8)
        board[:, 5, 0:6, 0] = 1  # bottom row full but for the last column ...
        board[1, 5, 6, 1] = 1  # ... which only board 1 has filled
        mask = np.ones((2, 7), np.int8)
        mask[1] = 0
        mask[1, 2] = 1  # board 1: one legal column
        actions, _ = policy.predict({"action_mask": mask, "observation": board})
        assert actions.shape == (2,) and actions[1] == 2  # within the mask


def test_the_opponent_pool_keeps_spaced_snapshots_and_plays_legal_moves():
    """Snapshots every ``every`` versions (the first at once), the newest ``size``
    kept, the opponent drawn among them, its moves within the action mask."""
    import torch

    from zmq_rl.actor.agent import PolicyRunner
    from zmq_rl.actor.opponents import OpponentPool
    from zmq_rl.config import LearnerConfig, PolicyConfig
    from zmq_rl.learner.settings import run_settings
    from zmq_rl.rl.policy import build_policy, export_weights
    from zmq_rl.wire.protocol import Weights, Welcome

    c4 = "pettingzoo.classic.connect_four_v3"
    shape = env_shape(c4)
    spaces = (shape.observation_space, shape.action_space)
    cfg = LearnerConfig(env_id=c4)
    net = build_policy(*spaces, PolicyConfig())
    welcome = Welcome(
        actor_id=0, run_id="r", base_version=0, experience_port=1, weights_port=2,
        settings=run_settings(cfg, *spaces, PolicyConfig(), agents_per_env=2),
        weights=Weights(version=0, run_id="r", tensors=export_weights(net)),
    )  # fmt: skip
    acting = PolicyRunner(welcome, seed=0)
    pool = OpponentPool(size=3, every=5, welcome=welcome, seed=0)
    for version in range(0, 31):
        with torch.no_grad():
            for p in acting.policy.parameters():
                p.add_(0.01)  # the acting policy learns
        acting.version = version
        pool.offer(acting)
    assert list(pool.snapshots) == [20, 25, 30]  # every 5 versions, newest 3
    assert sorted(pool.runners) == [20, 25, 30]
    assert {pool.choose() for _ in range(60)} == {20, 25, 30}  # uniform: each drawn
    first = pool.runners[20].policy.state_dict()
    later = pool.runners[30].policy.state_dict()
    assert any((first[k] != later[k]).any() for k in first)  # frozen copies, not views
    env = build_env(c4)
    env.reset(seed=0)
    for _ in range(6):  # fill column 3
        env.step(3)
    obs = env.observe(env.agent_selection)
    assert obs["action_mask"][3] == 0
    batch = {k: np.stack([v] * 64) for k, v in obs.items()}
    moves = pool.act(batch, np.repeat([20, 25, 30, 30], 16))
    assert moves.shape == (64,) and (moves != 3).all()
    # Versions skipped (newest wins, docs/protocol.md 4.4): one snapshot per span of
    # ``every`` versions, at the first version loaded in it; a restart into an older
    # version takes none until the next span past the newest snapshot.
    spans = OpponentPool(size=8, every=10, welcome=welcome, seed=0)
    for version in (0, 10, 23, 31, 38, 40, 45, 38, 47, 52):
        acting.version = version
        spans.offer(acting)
    assert list(spans.snapshots) == [0, 10, 23, 31, 40, 52]


def test_snapshot_choices_latest_and_by_win_rate():
    """``latest`` always draws the newest snapshot; ``win_rate`` draws the snapshots
    the policy beats least most often (PFSP weights (1 - score)^2), never none; the
    results per snapshot reach the bye's stats."""
    from collections import deque

    from zmq_rl.actor.opponents import OpponentPool

    def pool_of(choice):
        pool = OpponentPool.__new__(OpponentPool)
        pool.choice, pool.rng, pool.results = choice, np.random.default_rng(0), {}
        pool.snapshots = deque([10, 20, 30])
        return pool

    assert {pool_of("latest").choose() for _ in range(20)} == {30}
    pool = pool_of("win_rate")
    for _ in range(40):
        pool.record(10, "win")  # beaten every time: score 41/42
        pool.record(30, "loss")  # never beaten: score 1/42
    drawn = [pool.choose() for _ in range(2000)]
    counts = {v: drawn.count(v) for v in (10, 20, 30)}
    assert counts[30] > counts[20] > counts[10] > 0, counts
    pool.record(20, "draw")
    stats = {k: v for k, v in OpponentPool.stats(pool).items() if "/vs/" in k}
    assert stats["self_play/vs/10/wins"] == 40 and stats["self_play/vs/30/losses"] == 40
    assert stats["self_play/vs/20/draws"] == 1 and stats["self_play/vs/20/wins"] == 0


def test_a_real_run_with_a_prioritised_pool_writes_the_snapshot_table(tmp_path, capsys):
    """``--opponent-pool 3 --opponent-choice win_rate``: actors play games against
    snapshots; the run dir's ``self_play.csv`` and ``report.json``'s ``self_play``
    list each snapshot played, the games adding up to the actors' own counts. Each
    actor's snapshots are one per span of ``--opponent-every 2`` versions: under grants
    an actor may skip versions (newest wins), so a snapshot's version is the first it
    loaded in its span, not always a multiple of 2."""
    import csv

    from tests.conftest import free_port_block
    from zmq_rl.cli import main as main_cli

    run_dir = tmp_path / "run"
    argv = ["run", "--env", "pettingzoo.classic.connect_four_v3", "--actors", "2"]
    argv += ["--num-envs", "4", "--total-env-steps", "8000", "--opponent-pool", "3"]
    argv += ["--opponent-every", "2", "--opponent-choice", "win_rate", "--eval-episodes", "4"]
    argv += ["--checkpoint-every", "3"]
    argv += ["--port", str(free_port_block()), "--run-dir", str(run_dir), "--no-plot"]
    assert main_cli.main(argv) == 0, capsys.readouterr().err
    report = json.loads((run_dir / "report.json").read_text())
    table = report["self_play"]
    assert len(table) >= 2, table
    for stats in report["actor_stats"].values():
        played = {int(k.split("/")[3]) for k in stats if k.startswith("actor/self_play/vs/")}
        assert len({v // 2 for v in played}) == len(played), sorted(played)
    played = sum(
        stats[f"actor/self_play/{k}"] for stats in report["actor_stats"].values()
        for k in ("wins", "draws", "losses")
    )  # fmt: skip
    assert sum(row["games"] for row in table) == played > 0
    for row in table:
        assert row["wins"] + row["draws"] + row["losses"] == row["games"]
        assert (row["elo_gap"] > 0) == (row["score"] > 0.5) or row["score"] == 0.5
    with (run_dir / "self_play.csv").open() as f:
        assert [int(r["games"]) for r in csv.DictReader(f)] == [r["games"] for r in table]
    # zmq-rl ladder: a round robin of its checkpoints and policy.pt, one per version.
    assert main_cli.main(["ladder", str(run_dir), "--games", "4", "--points", "3"]) == 0
    with (run_dir / "ladder.csv").open() as f:
        rows = list(csv.DictReader(f))
    versions = [int(r["version"]) for r in rows]
    assert len(rows) >= 3 and len(set(versions)) == len(rows), rows
    assert all(int(r["games"]) == 4 * (len(rows) - 1) for r in rows)
    assert [float(r["elo"]) for r in rows] == sorted(float(r["elo"]) for r in rows)
    assert min(versions) in [v for v, r in zip(versions, rows, strict=True) if float(r["elo"]) == 0]


def test_elo_ratings_recover_known_strengths():
    """Players of Elo 0, 100 and 200 meeting with the logistic model's expected scores
    come out at their ratings (within the half game of prior per pair), the first at 0;
    a clean sweep stays finite."""
    from zmq_rl.learner.self_play import elo_ratings

    elo = np.array([0.0, 100.0, 200.0])
    expected = 1 / (1 + 10 ** ((elo[None, :] - elo[:, None]) / 400))
    games = 1000 * (1 - np.eye(3))
    np.testing.assert_allclose(elo_ratings(expected * games, games), elo, atol=2.0)
    sweep = elo_ratings(np.array([[0, 10.0], [0, 0]]), np.array([[0, 10], [10, 0]]))
    assert sweep[0] == 0 and -1000 < sweep[1] < -300


def test_the_snapshot_table_adds_actors_and_rates_by_score():
    from zmq_rl.learner.self_play import self_play_table

    stats = {
        "0": {"actor/self_play/vs/4/wins": 3, "actor/self_play/vs/4/losses": 1},
        "1": {"actor/self_play/vs/4/wins": 5, "actor/self_play/vs/4/draws": 1,
              "actor/self_play/vs/0/losses": 2, "actor/steps_sent": 9},
    }  # fmt: skip
    table = self_play_table(stats)
    assert [r["version"] for r in table] == [0, 4]
    assert table[1] == {
        "version": 4, "games": 10, "wins": 8, "draws": 1, "losses": 1, "score": 0.85,
        "elo_gap": round(400 * np.log10((8.5 + 0.5) / 11 / (1 - (8.5 + 0.5) / 11)), 1),
    }  # fmt: skip
    assert table[0]["elo_gap"] < 0 and table[0]["score"] == 0.0
    # Issue 45 N14: the keys a learner interprets; a count that does not fit is ignored
    # (docs/protocol.md 4.8), never a reason to refuse the bye or skew the table.
    stats["2"] = {"actor/self_play/vs/4/wins": -5.0, "actor/self_play/vs/4/draws": 0.5}
    assert self_play_table(stats)[1]["games"] == 10


def test_evaluations_play_the_chosen_opponent():
    """``--eval-opponent``: the one-ply player (win, else block) beats an untrained
    policy far more than random moves do; a saved policy file plays as a snapshot
    (here the same weights: an even match against itself); a file or player that
    cannot play is a ConfigError naming eval_opponent; a non-turn-based env refuses it."""
    import tempfile
    from pathlib import Path

    from zmq_rl.config import ConfigError, LearnerConfig, PolicyConfig
    from zmq_rl.learner.checkpoint import save_policy
    from zmq_rl.learner.evaluation import evaluate_policy, opponent_player
    from zmq_rl.rl.policy import build_policy

    c4 = "pettingzoo.classic.connect_four_v3"
    shape = env_shape(c4)
    spaces = (shape.observation_space, shape.action_space)
    net = build_policy(*spaces, PolicyConfig(hidden_sizes=(16,)))
    vs_random, _ = evaluate_policy(net, c4, 40, seed=3)
    one_ply = "zmq_rl.envs.baselines:one_ply_move"
    vs_one_ply, _ = evaluate_policy(net, c4, 40, seed=3, opponent=one_ply)
    assert vs_one_ply < vs_random - 0.4, (vs_one_ply, vs_random)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "policy.pt"
        save_policy(path, net, PolicyConfig(hidden_sizes=(16,)), c4, 7)
        mirror, _ = evaluate_policy(net, c4, 40, seed=3, opponent=f"policy:{path}")
        assert mirror == 0.0  # the same deterministic player in both seats: mirrored games
        cartpole = Path(tmp) / "cartpole.pt"
        cart = env_shape("CartPole-v1")
        small = build_policy(cart.observation_space, cart.action_space, PolicyConfig((16,)))
        save_policy(cartpole, small, PolicyConfig(hidden_sizes=(16,)), "CartPole-v1", 1)
        with pytest.raises(ConfigError, match="eval_opponent.*not a policy file"):
            opponent_player(f"policy:{cartpole}", *spaces)
    with pytest.raises(ConfigError, match="eval_opponent"):
        opponent_player("tests.agent_envs:TARGETS", *spaces)  # not callable
    with pytest.raises(ConfigError, match="eval_opponent"):
        LearnerConfig(eval_opponent="policy:").validate()


class _RecordingAgent:
    """A stand-in for zmq_rl.Agent (this test is about AgentTeam's bookkeeping): acts
    by a fixed rule of the observation and keeps every observe() call."""

    def __init__(self, num_envs):
        self.num_envs = num_envs
        self.steps = []

    def act(self, obs):
        return np.argmax(np.asarray(obs), axis=-1)  # the target of each slot

    def observe(self, rewards, terminated, truncated, next_obs, final_obs=None, valid=None):
        self.steps.append((rewards, terminated, truncated, dict(final_obs or {}), valid))


def test_agents_by_name_give_the_rows_parallel_slots_give():
    """AgentTeam (a simulator that names its agents) and ParallelSlots (a PettingZoo
    env the actor steps) record the same rows of the same episodes: rewards, endings,
    valid rows and final observations, step for step, over agents that come and go;
    an agent that vanishes without an ending is refused by name."""
    from zmq_rl.actor.team import AgentTeam

    seeds = [7, 8]
    slots = ParallelSlots([ComingAndGoing() for _ in seeds], ComingAndGoing().possible_agents)
    obs = slots.reset(seeds)
    fake = _RecordingAgent(8)
    team = AgentTeam(fake, ComingAndGoing().possible_agents, copies=2)
    sims = [ComingAndGoing() for _ in seeds]
    named = [sim.reset(seed=s)[0] for sim, s in zip(sims, seeds, strict=True)]
    for _ in range(120):
        step = slots.step(np.argmax(obs, axis=-1))
        obs = step.next_obs
        actions = team.act(named)
        results = [sim.step(a) for sim, a in zip(sims, actions, strict=True)]
        named = team.observe(*([r[i] for r in results] for i in range(4)))
        named = [live or sim.reset()[0] for live, sim in zip(named, sims, strict=True)]
        rewards, terminated, truncated, final_obs, valid = fake.steps[-1]
        np.testing.assert_array_equal(rewards, step.rewards)
        np.testing.assert_array_equal(terminated, step.terminated)
        np.testing.assert_array_equal(truncated, step.truncated)
        np.testing.assert_array_equal(valid, step.valid)
        assert final_obs.keys() == step.final_obs.keys()
        for slot, value in final_obs.items():
            np.testing.assert_array_equal(value, step.final_obs[slot])
    assert not all(v.all() for *_, v in fake.steps)  # agents did come and go
    lone = AgentTeam(_RecordingAgent(4), ["a", "b", "c", "d"])
    lone.act({"a": np.eye(3)[0], "b": np.eye(3)[1]})
    with pytest.raises(ValueError, match="agent 'b' .* acted but is neither observed"):
        lone.observe({"a": np.eye(3)[2]}, {"a": 1.0, "b": 0.0}, {}, {})


def test_agents_by_name_train_with_a_real_learner(start_learner, learner_port, ctx):
    """AgentTeam over zmq_rl.Agent and a learner over tcp: two simulator copies whose
    agents come and go, stepped by name until the learner ends the run; the learner
    counts no more env steps than the agents took (empty slots are no steps)."""
    from tests.helpers import TIMEOUT, wait_for
    from zmq_rl import Agent, AgentTeam
    from zmq_rl.config import LearnerConfig

    cfg = LearnerConfig(
        env_id="tests.agent_envs:coming_and_going", num_actors=1, num_envs=2, num_steps=16,
        fragment_length=8, total_env_steps=1500, port=learner_port, eval_episodes=2,
        checkpoint_every=0, starvation_timeout=TIMEOUT,
    )  # fmt: skip
    learner, run = start_learner(cfg)
    names = ComingAndGoing().possible_agents
    sims = [ComingAndGoing() for _ in range(2)]
    taken = 0
    with Agent(f"127.0.0.1:{learner_port}", None, None, 8, context=ctx) as agent:
        team = AgentTeam(agent, names, copies=2)
        obs = [sim.reset(seed=c)[0] for c, sim in enumerate(sims)]
        while not agent.shutdown_requested:
            actions = team.act(obs)
            if agent.shutdown_requested:
                break
            taken += sum(len(a) for a in actions)
            results = [sim.step(a) for sim, a in zip(sims, actions, strict=True)]
            obs = team.observe(*([r[i] for r in results] for i in range(4)))
            obs = [live or sim.reset()[0] for live, sim in zip(obs, sims, strict=True)]
    report = run.join()
    wait_for(lambda: not run.alive(), TIMEOUT, "the learner's end")
    assert report.stop_reason == "budget spent"
    assert report.env_steps_consumed == cfg.total_env_steps <= taken  # exact, in agent steps
    assert report.env_steps_consumed < report.updates_completed * 16 * 8  # rows > agent steps


def test_random_openings_start_games_at_varied_even_depths_and_keep_rows_true():
    """``opening_moves``: games start after 0, 2, 4 or 6 random legal moves (whole
    rounds: the first seat moves first), those moves are nobody's rows, and the rows
    stay true: every row that wins is a winning move of its observation, every game
    gives one win and one loss row, each mover sees its own pieces in plane 0."""
    from zmq_rl.envs.baselines import MOVER, OPPONENT, landing_row, winning_moves
    from zmq_rl.envs.multi_agent import TurnSlots

    envs = [build_env("pettingzoo.classic.connect_four_v3") for _ in range(4)]
    slots = TurnSlots(envs, envs[0].possible_agents, rng=np.random.default_rng(3), opening_moves=6)
    slots.reset([0, 1, 2, 3])
    rng = np.random.default_rng(0)
    first_depths, wins, losses = set(), 0, 0
    new_game = np.ones(slots.num_slots, bool)
    for _ in range(300):
        for _ in range(slots.agents_per_env):
            _random_turn(slots, rng)
        rows = slots.emit(np.int64(0))
        for slot in np.flatnonzero(rows.valid):
            board = rows.obs["observation"][slot]
            own, theirs = int(board[..., MOVER].sum()), int(board[..., OPPONENT].sum())
            assert own == theirs - (slot % 2)  # the mover's pieces are plane 0
            if new_game[slot] and slot % 2 == 0:
                first_depths.add(own + theirs)
            new_game[slot] = bool(rows.terminated[slot] or rows.truncated[slot])
            action = int(rows.actions[slot])
            if rows.rewards[slot] > 0:
                wins += 1
                assert action in winning_moves(board, MOVER)
            elif rows.rewards[slot] < 0:
                losses += 1
                after = board.copy()
                after[landing_row(after, action), action, MOVER] = 1
                assert winning_moves(after, OPPONENT)  # the move the opponent punished
    assert first_depths <= {0, 2, 4, 6} and len(first_depths) >= 3
    assert wins > 20 and abs(wins - losses) <= len(envs)  # a last game may be in flight


def test_random_openings_are_refused_where_they_cannot_apply():
    from zmq_rl.config import ConfigError, LearnerConfig
    from zmq_rl.learner.loop import Learner

    with pytest.raises(ConfigError, match="opening_moves"):
        LearnerConfig(opening_moves=-1).validate()
    cartpole = LearnerConfig(env_id="CartPole-v1", opening_moves=4, run_dir="")
    with pytest.raises(ConfigError, match="opening_moves.*not a turn-based game"):
        Learner(cartpole)  # refused before any socket is bound
