"""Connect Four by self-play: a trained policy against a random and a one-ply player.

Issue 30's proof for turn-based self-play. Train three seeds, then evaluate them::

    python bench/connect_four.py train --seeds 0 1 2 --total-env-steps 2000000 \
        --extra-args "--actors 2" --plot

The settings that meet the target on 2 cores (docs/benchmarks.md §24, 22 min a seed)::

    python bench/connect_four.py train --seeds 0 1 2 --total-env-steps 3000000 \
        --extra-args "--actors 2 --num-envs 32 --num-steps 64 --num-epochs 4 \
        --minibatch-size 256 --hidden-sizes 128,128 --factory zmq_rl.rl.boards:drop_game_cnn \
        --learning-rate 3e-4 --ent-coef 0.01 --gamma 0.99 --gae-lambda 0.95 --eval-every 25 \
        --eval-episodes 40 --eval-opponent zmq_rl.envs.baselines:one_ply_move --opponent-pool 10 \
        --opponent-every 10 --opponent-share 0.5 --opening-moves 6"

or evaluate runs that already exist::

    python bench/connect_four.py eval runs/connect_four/seed0 runs/connect_four/seed1 \
        runs/connect_four/seed2 --games 200

``train`` runs, per seed and one after the other, ``zmq-rl run --env
pettingzoo.classic.connect_four_v3 --seed S --total-env-steps N --target-return inf
--port P --run-dir runs/connect_four/seed<S> --no-plot`` (plus ``--extra-args``,
split as a shell would) as a subprocess: one shared policy plays both seats. Its wall
time and every evaluation of its ``report.json`` (env steps against mean return) are
recorded (the learner's evaluations: the policy in each seat in turn against random
legal moves, scored +1 / 0 / -1); since they say nothing of play against a stronger
player, the learning curve is drawn from the run's checkpoints as well (copied to
``runs/connect_four/seed<S>-checkpoints`` while it trains, as a run keeps only its
newest few): up to ``--curve-points`` of them play ``--curve-games`` games of each
matchup (win rate against env steps). Then the final
policy is evaluated as ``eval`` does.

``eval`` loads each run's policy (``zmq_rl.load_policy``; deterministic, or sampled
with ``--sample``) and plays ``--games`` full games on the real AEC env in each of four
matchups: against a uniformly random player and against a one-ply lookahead player
(win if possible, else block the opponent's immediate win, else random), as first and
as second player. A move the action mask forbids loses that game and is counted.
The target (issue 30) is a win rate >= 95 % against random and >= 70 % against
one-ply in all four matchups.

Results go to ``bench/results/connect_four.json`` (``--out`` to change it): the
rows, the commands, the machine and, for ``train``, the curves and times; a markdown
table (win / draw / loss % per matchup, one row per run and a mean row) is printed.
``--plot`` (``train``) draws both curves to ``docs/img/connect_four.png``. The 2-core
setting of issue 30 is ``--extra-args "--actors 2"`` (as ``bench/multi_agent.py``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _util import (  # noqa: E402
    _finite,
    add_port_flag,
    figure_path,
    free_port_block,
    machine_info,
    runs_root,
)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from zmq_rl.envs.baselines import (  # noqa: E402
    COLS,
    MOVER,
    OPPONENT,
    one_ply_move,
    random_move,
    winning_moves,
)

RESULTS = ROOT / "bench" / "results"
ENV_ID = "pettingzoo.classic.connect_four_v3"


# A player: (observation dict of the agent to move, rng) -> column. An object may also
# have ``new_game()``, called before every game (a recurrent policy resets its state).
Move = Callable[[dict[str, np.ndarray], np.random.Generator], int]

OPPONENTS = ("random", "one_ply")
MATCHUPS = tuple((opp, first) for opp in OPPONENTS for first in (True, False))
TARGETS = {"random": 0.95, "one_ply": 0.70}


# --- players: zmq_rl.envs.baselines (the learner's --eval-opponent plays them too) --------------

PLAYERS: dict[str, Move] = {"random": random_move, "one_ply": one_ply_move}


# --- games on the real env ----------------------------------------------------------------


def play_games(
    policy_move: Move, opponent_move: Move, games: int, policy_first: bool, seed: int
) -> dict[str, Any]:
    """Play ``games`` full games of ``connect_four_v3`` (the AEC env, as PettingZoo
    ships it) between ``policy_move`` and ``opponent_move``, the policy moving first
    when ``policy_first``; both get the agent-to-move's observation and one rng
    seeded with ``seed`` (the same seed gives the same games).

    A column the action mask forbids loses that game for whoever played it and is
    counted in ``illegal_policy`` / ``illegal_opponent`` (a policy must not win by
    its opponent's bad moves unnoticed, nor hide its own). Returns the counts of
    wins / draws / losses from the policy's side, their rates, the mean game length
    in moves and the matchup's settings."""
    from pettingzoo.classic import connect_four_v3

    rng = np.random.default_rng(seed)
    env = connect_four_v3.env()
    wins = draws = losses = illegal_policy = illegal_opponent = 0
    lengths = []
    tactics = Tactics()
    for game in range(games):
        env.reset(seed=seed + game)
        policy_agent = env.possible_agents[0 if policy_first else 1]
        for player in (policy_move, opponent_move):
            new_game = getattr(player, "new_game", None)
            if new_game is not None:
                new_game()
        returns = dict.fromkeys(env.possible_agents, 0.0)
        moves = 0
        outcome = None
        for agent in env.agent_iter():
            obs, reward, termination, truncation, _ = env.last()
            returns[agent] += float(reward)
            if termination or truncation:
                env.step(None)
                continue
            is_policy = agent == policy_agent
            action = int((policy_move if is_policy else opponent_move)(obs, rng))
            if is_policy:
                tactics.see(obs, action)
            if not (0 <= action < COLS and obs["action_mask"][action]):
                outcome = "loss" if is_policy else "win"
                illegal_policy += is_policy
                illegal_opponent += not is_policy
                break
            env.step(action)
            moves += 1
        if outcome is None:
            score = returns[policy_agent]
            outcome = "win" if score > 0 else "loss" if score < 0 else "draw"
        wins += outcome == "win"
        draws += outcome == "draw"
        losses += outcome == "loss"
        lengths.append(moves)
    env.close()
    return {
        "games": games,
        "policy_first": policy_first,
        "seed": seed,
        "wins": wins,
        "draws": draws,
        "losses": losses,
        "win_rate": wins / games if games else math.nan,
        "draw_rate": draws / games if games else math.nan,
        "loss_rate": losses / games if games else math.nan,
        "illegal_policy": illegal_policy,
        "illegal_opponent": illegal_opponent,
        "mean_moves": statistics.fmean(lengths) if lengths else math.nan,
        **tactics.counts(),
    }


class Tactics:
    """How often the policy takes an immediate win when one exists, and, when none
    does, blocks the opponent's immediate win: the one-ply player's two rules, which a
    policy must follow to beat it (a diagnostic of play, not of the score).
    ``winning(planes, plane)`` lists the moves that complete a line of ``plane``
    (connect four's by default)."""

    def __init__(self, winning: Callable[[np.ndarray, int], list[int]] = winning_moves) -> None:
        self.winning = winning
        self.wins_available = self.wins_taken = self.blocks_needed = self.blocks_made = 0

    def see(self, obs: dict[str, np.ndarray], action: int) -> None:
        """Count the policy's ``action`` in the position ``obs``."""
        legal = set(np.flatnonzero(obs["action_mask"]).tolist())
        wins = [c for c in self.winning(obs["observation"], MOVER) if c in legal]
        if wins:
            self.wins_available += 1
            self.wins_taken += action in wins
            return
        blocks = [c for c in self.winning(obs["observation"], OPPONENT) if c in legal]
        if blocks:
            self.blocks_needed += 1
            self.blocks_made += action in blocks

    def counts(self) -> dict[str, int]:
        return {
            "wins_available": self.wins_available,
            "wins_taken": self.wins_taken,
            "blocks_needed": self.blocks_needed,
            "blocks_made": self.blocks_made,
        }


class PolicyPlayer:
    """A :class:`~zmq_rl.serving.deploy.DeployedPolicy` as a player of :func:`play_games`:
    ``predict`` on the observation dict (its ``action_mask`` masks the illegal
    columns), deterministic or sampled; a recurrent policy's state is carried
    through a game and reset by :meth:`new_game`."""

    def __init__(self, policy: Any, deterministic: bool = True) -> None:
        self.policy = policy
        self.deterministic = deterministic
        self.state: Any = None

    def new_game(self) -> None:
        """Forget the previous game's recurrent state."""
        self.state = None

    def __call__(self, obs: dict[str, np.ndarray], rng: np.random.Generator) -> int:
        """The policy's column for ``obs`` (``rng`` is unused: sampling uses torch's
        generator, seeded per matchup by :func:`evaluate_policy`)."""
        recurrent = bool(getattr(self.policy, "recurrent", False))
        action, state = self.policy.predict(
            obs,
            state=self.state if recurrent else None,
            episode_start=self.state is None if recurrent else None,
            deterministic=self.deterministic,
        )
        if recurrent:
            self.state = state
        return int(np.asarray(action).reshape(-1)[0])


def matchup_name(opponent: str, policy_first: bool) -> str:
    """``random-first``, ``one_ply-second``, ...: a matchup's key in the results."""
    return f"{opponent}-{'first' if policy_first else 'second'}"


def evaluate_player(player: Move, games: int, seed: int) -> dict[str, dict[str, Any]]:
    """Every matchup of ``player`` (random and one-ply opponents, as first and as
    second player), ``games`` games each; each matchup has its own seed derived
    from ``seed`` so that their games differ but repeat."""
    results = {}
    for k, (opponent, first) in enumerate(MATCHUPS):
        results[matchup_name(opponent, first)] = play_games(
            player, PLAYERS[opponent], games, first, seed + 100_003 * k
        )
    return results


def evaluate_policy(
    run_dir: Path, games: int, deterministic: bool, seed: int = 0
) -> dict[str, Any]:
    """Load ``run_dir``'s policy (``zmq_rl.load_policy``) and play every matchup with
    it; the row of the table, with the evaluation's wall time."""
    import torch

    import zmq_rl

    policy = zmq_rl.load_policy(run_dir)
    player = PolicyPlayer(policy, deterministic=deterministic)
    torch.manual_seed(seed)  # --sample: the policy's draws repeat too
    started = time.monotonic()
    matchups = evaluate_player(player, games, seed)
    return {
        "run_dir": display_path(run_dir),
        "deterministic": deterministic,
        "matchups": matchups,
        "meets_target": meets_target(matchups),
        "eval_seconds": time.monotonic() - started,
    }


def checkpoint_updates(path: Path) -> int:
    """The update count in a checkpoint's name (``ckpt-00000025.pt`` -> 25)."""
    return int(path.stem.rsplit("-", 1)[-1])


def steps_at_updates(run_dir: Path) -> dict[int, int]:
    """Env steps at each update of a run, from its ``metrics.jsonl`` (empty if none)."""
    steps: dict[int, int] = {}
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "update" in row and "env_steps" in row:
                steps.setdefault(int(row["update"]), int(row["env_steps"]))
    return steps


def kept_checkpoints_dir(run_dir: Path) -> Path:
    """Where :func:`keep_checkpoints` copies a run's checkpoints: beside the run
    directory (``runs/connect_four/seed0-checkpoints``)."""
    return run_dir.parent / f"{run_dir.name}-checkpoints"


def keep_checkpoints(run_dir: Path, kept: Path) -> int:
    """Copy the run's ``checkpoints/ckpt-*.pt`` not yet in ``kept`` there; the number
    copied. A run keeps only its newest few checkpoints, so this is called every
    second while it trains, to have the whole history for :func:`win_rate_curve`
    (checkpoints are written atomically; one pruned before it is copied is skipped)."""
    kept.mkdir(parents=True, exist_ok=True)
    copied = 0
    for path in sorted((run_dir / "checkpoints").glob("ckpt-*.pt")):
        target = kept / path.name
        if target.exists():
            continue
        try:
            shutil.copyfile(path, kept / f".{path.name}.tmp")
        except FileNotFoundError:
            continue
        (kept / f".{path.name}.tmp").replace(target)
        copied += 1
    return copied


def win_rate_curve(
    run_dir: Path, games: int, points: int, deterministic: bool, seed: int = 0
) -> list[dict[str, Any]]:
    """Win rates over training: up to ``points`` of the run's checkpoints (those
    :func:`keep_checkpoints` kept, else those still in the run directory; evenly
    spaced, the last always in) each play every matchup, ``games`` games each.

    This is the learning curve against both players: the run's own evaluations
    play random seats only (their return is +1 / 0 / -1 per game).
    Each point has the checkpoint's updates, its env steps (None when
    ``metrics.jsonl`` does not say) and the win rate of each matchup."""
    import torch

    import zmq_rl

    folder = kept_checkpoints_dir(run_dir)
    if not folder.is_dir():
        folder = run_dir / "checkpoints"
    checkpoints = sorted(folder.glob("ckpt-*.pt"), key=checkpoint_updates)
    if points < len(checkpoints):
        picks = np.linspace(0, len(checkpoints) - 1, max(points, 1)).round().astype(int)
        checkpoints = [checkpoints[i] for i in sorted(set(picks.tolist()))]
    steps = steps_at_updates(run_dir)
    curve = []
    for checkpoint in checkpoints:
        player = PolicyPlayer(zmq_rl.load_policy(checkpoint), deterministic=deterministic)
        torch.manual_seed(seed)
        matchups = evaluate_player(player, games, seed)
        updates = checkpoint_updates(checkpoint)
        curve.append(
            {
                "updates": updates,
                "env_steps": steps.get(updates),
                "win_rate": {name: m["win_rate"] for name, m in matchups.items()},
            }
        )
    return curve


def meets_target(matchups: dict[str, dict[str, Any]]) -> bool:
    """Issue 30's bar: win rate >= 95 % against random and >= 70 % against one-ply,
    in every matchup (as first and as second player)."""
    return all(
        matchups[matchup_name(opp, first)]["win_rate"] >= TARGETS[opp] for opp, first in MATCHUPS
    )


def mean_row(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """The mean over ``rows`` of each matchup's win / draw / loss rates."""
    out = {}
    for opp, first in MATCHUPS:
        name = matchup_name(opp, first)
        out[name] = {
            rate: statistics.fmean(row["matchups"][name][rate] for row in rows)
            for rate in ("win_rate", "draw_rate", "loss_rate")
        }
    return out


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """The table of docs/benchmarks.md: per run (and the mean), win / draw / loss %
    in each of the four matchups, and whether the run meets the target."""
    heads = [
        f"vs {'one-ply' if opp == 'one_ply' else opp}, {'first' if first else 'second'}"
        for opp, first in MATCHUPS
    ]
    lines = [
        "| run | " + " | ".join(heads) + " | target met |",
        "|---|" + "---|" * len(heads) + "---|",
    ]

    def cells(matchups: dict[str, dict[str, Any]]) -> str:
        parts = []
        for opp, first in MATCHUPS:
            m = matchups[matchup_name(opp, first)]
            parts.append(
                f"{100 * m['win_rate']:.1f} / {100 * m['draw_rate']:.1f} / "
                f"{100 * m['loss_rate']:.1f}"
            )
        return " | ".join(parts)

    for row in rows:
        met = "yes" if row["meets_target"] else "no"
        lines.append(f"| {row['run_dir']} | {cells(row['matchups'])} | {met} |")
    if rows:
        mean = mean_row(rows)
        met = "yes" if meets_target(mean) else "no"
        lines.append(f"| **mean** | {cells(mean)} | {met} |")
    lines.append("")
    lines.append("Cells: win / draw / loss % of the policy's games.")
    for row in rows:
        seen = {k: sum(m.get(k, 0) for m in row["matchups"].values()) for k in Tactics().counts()}
        lines.append(
            f"{row['run_dir']}: took {seen['wins_taken']} of {seen['wins_available']} "
            f"immediate wins, blocked {seen['blocks_made']} of {seen['blocks_needed']} "
            "immediate threats (every matchup)"
        )
    return "\n".join(lines)


# --- training runs ------------------------------------------------------------------------


def display_path(path: Path) -> str:
    """``path`` relative to the repository when it is inside it (for the results)."""
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def train_command(
    seed: int, total_env_steps: int, run_dir: Path, port: int, extra: str
) -> list[str]:
    """The ``zmq-rl run`` command line of one seed (``extra`` split as a shell would)."""
    cmd = [sys.executable, "-m", "zmq_rl", "run", "--env", ENV_ID]
    cmd += ["--seed", str(seed), "--total-env-steps", str(total_env_steps)]
    cmd += ["--target-return", "inf", "--port", str(port), "--run-dir", str(run_dir)]
    return cmd + ["--no-plot", *shlex.split(extra)]


def read_curve(run_dir: Path) -> list[tuple[int, float]]:
    """Every evaluation of a finished run (``report.json``): (env steps, mean return)."""
    report = json.loads((run_dir / "report.json").read_text())
    return [(int(e["env_steps"]), float(e["mean_return"])) for e in report.get("evaluations", [])]


def train_seed(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """Train one seed to the end of its budget (a subprocess, its checkpoints kept
    as it goes); its wall time, curve and command, or why it failed. ``--skip-done``
    reuses a finished run."""
    run_dir = runs_root("connect_four", args) / f"seed{seed}"
    if args.skip_done and (run_dir / "report.json").is_file():
        print(f"seed {seed}: reusing {display_path(run_dir)}", flush=True)
        return {
            "seed": seed,
            "run_dir": display_path(run_dir),
            "wall_seconds": None,
            "curve": read_curve(run_dir),
            "command": None,
        }
    kept = kept_checkpoints_dir(run_dir)
    for folder in (run_dir, kept):
        if folder.exists():
            shutil.rmtree(folder)  # metrics.jsonl is appended to: never mix two runs
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    cmd = train_command(seed, args.total_env_steps, run_dir, free_port_block(), args.extra_args)
    print(f"seed {seed}: {shlex.join(cmd)}", flush=True)
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.DEVNULL)
    try:
        while proc.poll() is None:
            keep_checkpoints(run_dir, kept)
            time.sleep(1.0)
    finally:
        if proc.poll() is None:  # interrupted: do not leave the run behind
            proc.terminate()
            proc.wait()
    wall = time.monotonic() - started
    keep_checkpoints(run_dir, kept)
    entry: dict[str, Any] = {
        "seed": seed,
        "run_dir": display_path(run_dir),
        "wall_seconds": wall,
        "command": shlex.join(["zmq-rl", *cmd[1:]]),
    }
    if proc.returncode != 0 or not (run_dir / "report.json").is_file():
        entry["failed"] = f"exit {proc.returncode}"
        print(f"seed {seed} FAILED (exit {proc.returncode}) after {wall:.0f}s", flush=True)
        return entry
    entry["curve"] = read_curve(run_dir)
    return entry


def plot(path: Path, runs: Sequence[dict[str, Any]]) -> None:
    """Per seed, the win rate over training against random and against one-ply
    (checkpoints, mean of the two seats) with the targets, and the run's own
    evaluation return (against random seats)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_win, ax_eval) = plt.subplots(1, 2, figsize=(11, 4))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, run in enumerate(runs):
        color = colors[i % len(colors)]
        points = [p for p in run.get("win_curve", []) if p["env_steps"] is not None]
        for opp, style in (("random", "-"), ("one_ply", "--")):
            if points:
                xs = [p["env_steps"] for p in points]
                ys = [
                    100
                    * statistics.fmean(p["win_rate"][matchup_name(opp, f)] for f in (True, False))
                    for p in points
                ]
                label = f"seed {run['seed']} vs {'one-ply' if opp == 'one_ply' else opp}"
                ax_win.plot(xs, ys, style, marker=".", color=color, label=label)
        if run.get("curve"):
            steps, scores = zip(*run["curve"], strict=True)
            ax_eval.plot(steps, scores, marker=".", color=color, label=f"seed {run['seed']}")
    for opp, style in (("random", "-"), ("one_ply", "--")):
        ax_win.axhline(100 * TARGETS[opp], color="grey", linestyle=style, linewidth=0.8)
    ax_win.set_xlabel("env steps (agent moves)")
    ax_win.set_ylabel("win rate % (mean of first and second)")
    ax_win.set_ylim(0, 100)
    ax_win.set_title("against fixed players (grey: targets)")
    ax_win.legend(fontsize=7)
    ax_eval.set_xlabel("env steps (agent moves)")
    ax_eval.set_ylabel("mean evaluation return (vs random seats)")
    ax_eval.set_title("the run's own evaluations")
    if any(run.get("curve") for run in runs):
        ax_eval.legend(fontsize=7)
    fig.suptitle("connect_four_v3, self-play with one shared policy")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_results(path: Path, args: argparse.Namespace, data: dict[str, Any]) -> None:
    """The results file: ``data`` with the command line, the date and the machine."""
    payload = {
        "benchmark": "connect_four",
        "command": "python " + shlex.join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "machine": machine_info(),
        "games": args.games,
        "deterministic": not args.sample,
        "seed": args.eval_seed,
        **data,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_finite(payload), indent=1) + "\n")
    print(f"wrote {path}", flush=True)


def results_path(args: argparse.Namespace) -> Path:
    """``--out``, else ``bench/results/connect_four.json``."""
    return Path(args.out) if args.out else RESULTS / "connect_four.json"


def cmd_eval(args: argparse.Namespace) -> dict[str, Any]:
    """``eval``: evaluate existing runs, write the results and print the table."""
    rows = [
        evaluate_policy(Path(d), args.games, not args.sample, args.eval_seed) for d in args.runs
    ]
    data = {"rows": rows, "mean": mean_row(rows) if rows else None}
    write_results(results_path(args), args, data)
    print(markdown_table(rows))
    return data


def cmd_train(args: argparse.Namespace) -> dict[str, Any]:
    """``train``: train every seed, evaluate each finished run, write the results
    (after every seed, so an interrupted benchmark keeps what finished) and print
    the table."""
    runs: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    data: dict[str, Any] = {}
    for seed in args.seeds:
        run = train_seed(args, seed)
        runs.append(run)
        if "failed" not in run:
            if args.curve_games > 0:
                run["win_curve"] = win_rate_curve(
                    ROOT / run["run_dir"],
                    args.curve_games,
                    args.curve_points,
                    not args.sample,
                    args.eval_seed,
                )
            row = evaluate_policy(
                ROOT / run["run_dir"], args.games, not args.sample, args.eval_seed
            )
            row["seed"] = seed
            row["wall_seconds"] = run["wall_seconds"]
            rows.append(row)
        walls = [r["wall_seconds"] for r in runs if r["wall_seconds"] is not None]
        data = {
            "env": ENV_ID,
            "total_env_steps": args.total_env_steps,
            "extra_args": args.extra_args,
            "runs": runs,
            "rows": rows,
            "mean": mean_row(rows) if rows else None,
            "mean_wall_seconds": statistics.fmean(walls) if walls else None,
        }
        write_results(results_path(args), args, data)
    if args.plot:
        plot(figure_path("connect_four", args), runs)
    print(markdown_table(rows))
    walls = ", ".join(
        f"seed {r['seed']}: {r['wall_seconds']:.0f} s"
        for r in rows
        if r["wall_seconds"] is not None
    )
    print(f"\nTraining wall time: {walls or 'n/a'}")
    return data


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--games", type=int, default=200, help="games per matchup")
    common.add_argument("--sample", action="store_true", help="sample the policy's moves")
    common.add_argument("--eval-seed", type=int, default=0, help="seed of the evaluation games")
    common.add_argument(
        "--out",
        default="",
        help="the results (default bench/results/connect_four.json); with it the run "
        "directories (OUT-runs/) and the picture go beside it, not into the checkout",
    )
    add_port_flag(common)
    ev = sub.add_parser("eval", parents=[common], help="evaluate existing run directories")
    ev.add_argument("runs", nargs="+", metavar="RUN_DIR")
    tr = sub.add_parser("train", parents=[common], help="train seeds, then evaluate them")
    tr.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    tr.add_argument("--total-env-steps", type=int, default=2_000_000)
    tr.add_argument("--extra-args", default="", help="more `zmq-rl run` flags, one string")
    tr.add_argument("--skip-done", action="store_true", help="reuse runs with a report.json")
    tr.add_argument("--plot", action="store_true", help="draw docs/img/connect_four.png")
    tr.add_argument(
        "--curve-games", type=int, default=50, help="games per matchup per checkpoint; 0 = none"
    )
    tr.add_argument("--curve-points", type=int, default=12, help="checkpoints on the curve")
    args = parser.parse_args(argv)
    return cmd_eval(args) if args.command == "eval" else cmd_train(args)


if __name__ == "__main__":
    main()
