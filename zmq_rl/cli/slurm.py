"""``zmq-rl slurm``: write (and submit) one sbatch job that runs a whole training run.

The job is one allocation with two ``srun`` steps: the learner (one task, on the
first node of the allocation) and the actors (``--actors`` tasks, spread over the
allocation by Slurm), each actor task in a small restart loop. The learner's
address comes from the allocation (the first host of ``SLURM_JOB_NODELIST``), so
nothing is typed by hand. Everything the job needs lives in the run dir, which
must be on a file system every node sees:

* ``RUN_DIR/slurm/job.sbatch``: the batch script (readable, commented: adapt it);
* ``RUN_DIR/slurm/learner.toml``: the learner's resolved configuration;
* ``RUN_DIR/keys/``: CURVE keys made before submission (``--curve``), secrets 0600;
* ``RUN_DIR/logs/``: ``learner.log``, ``actor-N.log`` and ``job-JOBID.out``.

``scancel`` sends SIGTERM to every step: the learner writes its report, policy
and checkpoint and tells the actors to shut down. The job is requeueable: a
requeued job (``scontrol requeue``, a node failure, preemption) starts the script
again, which resumes the learner from its newest checkpoint
(``zmq-learner --resume``).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from zmq_rl.config import ConfigError, LearnerConfig, PolicyConfig, PPOConfig, replace

from ..run.common import CliFailure, release_run_dir
from .commands import RUN_DEFAULTS, non_negative, subcommand
from .flags import LOG_LEVELS, dump_toml
from .learner import LEARNER_SECTIONS, add_learner_flags, configs_from_args, preset_note

__all__ = ["SlurmJob", "console_command", "make_keys", "render_script", "write_job"]

SLURM_DEFAULTS = {**RUN_DEFAULTS, "host": "0.0.0.0"}
"""``zmq-rl run``'s defaults, and the learner binds every interface (actors on other
nodes connect to it)."""
MAX_BACKOFF_S = 30
SCRIPT_NAME = "job.sbatch"
LEARNER_TOML = "learner.toml"
JOB_ID_NAME = "job_id"


def console_command(name: str) -> list[str]:
    """How a job starts console script ``name`` (``zmq-learner``, ``zmq-actor``): the
    script next to this interpreter when it is there (a venv's ``bin/``), else this
    interpreter with ``-m``."""
    script = Path(sys.executable).parent / name
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    module = {"zmq-learner": "zmq_rl.cli.learner", "zmq-actor": "zmq_rl.cli.actor"}[name]
    return [sys.executable, "-m", module]


@dataclass
class SlurmJob:
    """Everything the batch script is made from (see :func:`render_script`)."""

    run_dir: Path
    port: int
    num_actors: int
    learner_cmd: list[str]
    actor_cmd: list[str]
    actor_args: list[str] = field(default_factory=list)
    job_name: str = "zmq-rl"
    partition: str = ""
    time_limit: str = ""
    nodes: str = ""
    learner_cpus: int = 1
    actor_cpus: int = 1
    mem_per_cpu: str = ""
    learner_gres: str = ""
    requeue: bool = True
    actor_restarts: int = 3
    actor_restart_backoff: int = 1
    log_level: str = "info"
    sbatch_args: list[str] = field(default_factory=list)
    learner_srun_args: list[str] = field(default_factory=list)
    actor_srun_args: list[str] = field(default_factory=list)


def _q(words: list[str]) -> str:
    return " ".join(shlex.quote(w) for w in words)


def render_script(job: SlurmJob) -> str:
    """The text of the batch script of ``job``: ``#SBATCH`` lines, then a bash body
    that starts the learner step and the actor step and waits for the learner."""
    logs = job.run_dir / "logs"
    sbatch = [
        f"--job-name={job.job_name}",
        f"--ntasks={job.num_actors + 1}",
        f"--output={logs}/job-%j.out",
        "--open-mode=append",
        "--requeue" if job.requeue else "--no-requeue",
    ]
    if job.nodes:
        sbatch.append(f"--nodes={job.nodes}")
    if job.partition:
        sbatch.append(f"--partition={job.partition}")
    if job.time_limit:
        sbatch.append(f"--time={job.time_limit}")
    if job.mem_per_cpu:
        sbatch.append(f"--mem-per-cpu={job.mem_per_cpu}")
    cpus = max(job.learner_cpus, job.actor_cpus)
    sbatch.append(f"--cpus-per-task={cpus}")
    if job.learner_gres:
        sbatch.append(f"--gres={job.learner_gres}")
    sbatch.extend(job.sbatch_args)
    learner_srun = [
        "--nodes=1",
        "--ntasks=1",
        f"--cpus-per-task={job.learner_cpus}",
        "--exact",
        "--kill-on-bad-exit=0",
        f"--output={logs}/learner.log",
        "--open-mode=append",
        *([f"--gres={job.learner_gres}"] if job.learner_gres else []),
        *job.learner_srun_args,
    ]
    actor_srun = [
        f"--ntasks={job.num_actors}",
        f"--cpus-per-task={job.actor_cpus}",
        "--exact",
        "--kill-on-bad-exit=0",
        f"--output={logs}/actor-%t.log",
        "--open-mode=append",
        *job.actor_srun_args,
    ]
    header = "\n".join(f"#SBATCH {a}" for a in sbatch)
    return f"""#!/bin/bash
# zmq_rl training run as one Slurm job, written by `zmq-rl slurm`
# on {time.strftime("%Y-%m-%d %H:%M:%S")}.
# Submit it with:  sbatch {job.run_dir}/slurm/{SCRIPT_NAME}
#
# One allocation, two job steps:
#   1. the learner: one task on the first node of the allocation; it binds
#      0.0.0.0:PORT..PORT+2 and trains (configuration: slurm/{LEARNER_TOML});
#   2. the actors: NUM_ACTORS tasks spread over the allocation; each connects out to
#      FIRST_NODE:PORT and is restarted (up to ACTOR_RESTARTS times, with a doubling
#      delay) when it dies; exit 0 (run over), 2 (config error) and 130/143
#      (stopped) end it for good.
# The run dir must be on a file system that every node sees.
#
# Stop:   scancel JOBID   (SIGTERM: the learner writes report.json, policy.pt and a
#                          checkpoint, tells the actors to shut down, exits 130)
# Resume: scontrol requeue JOBID   (or a new `sbatch` of this file): the script then
#         finds RUN_DIR/checkpoints/ and runs `zmq-learner --resume RUN_DIR`.
# Logs:   RUN_DIR/logs/learner.log, RUN_DIR/logs/actor-N.log, RUN_DIR/logs/job-JOBID.out
# Adapt freely: the #SBATCH lines, CPUs per step (srun --cpus-per-task), a GPU for
# the learner (--gres on the #SBATCH line and on the learner's srun).
{header}

set -u
RUN_DIR={shlex.quote(str(job.run_dir))}
PORT={job.port}
NUM_ACTORS={job.num_actors}
ACTOR_RESTARTS={job.actor_restarts}
ACTOR_RESTART_BACKOFF={job.actor_restart_backoff}
LEARNER_CMD=({_q(job.learner_cmd)})
ACTOR_CMD=({_q(job.actor_cmd)})
ACTOR_ARGS=({_q(job.actor_args)})
MAX_BACKOFF={MAX_BACKOFF_S}

# The learner runs on the first node of the allocation; actors connect to it there.
LEARNER_HOST=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
ATTEMPT=${{SLURM_RESTART_COUNT:-0}}
mkdir -p "$RUN_DIR/logs"
echo "$(date '+%F %T') job $SLURM_JOB_ID attempt $ATTEMPT:" \
    "learner on $LEARNER_HOST:$PORT, $NUM_ACTORS actor task(s)"

# A fresh start, or a requeued job continuing from its newest checkpoint.
if compgen -G "$RUN_DIR/checkpoints/ckpt-*.pt" >/dev/null; then
    echo "resuming from $RUN_DIR/checkpoints"
    LEARNER_ARGS=(--resume "$RUN_DIR" --host 0.0.0.0 --port "$PORT" --log-level {job.log_level})
else
    # An attempt that ended before its first checkpoint: keep its files aside.
    for f in config.toml metrics.jsonl metrics.csv report.json policy.pt; do
        if [ -e "$RUN_DIR/$f" ]; then mv "$RUN_DIR/$f" "$RUN_DIR/$f.attempt-$ATTEMPT"; fi
    done
    LEARNER_ARGS=(--config "$RUN_DIR/slurm/{LEARNER_TOML}" --run-dir "$RUN_DIR"
                  --log-level {job.log_level})
fi

# One actor task: run zmq-actor, restart it when it fails.
run_actor() {{
    local restart=0 delay=$ACTOR_RESTART_BACKOFF rc
    local args=()
    eval "args=($ACTOR_ARGS_Q)"
    while :; do
        echo "=== zmq-rl slurm: actor task $SLURM_PROCID on $(hostname)," \
            "start $restart, $(date '+%F %T.%N') ==="
        # The first start asks for the task's rank as its actor id (its seed follows from
        # it); a restart takes any free id: the dead one's stays taken until the learner
        # declares it dead (--actor-timeout).
        id=-1
        if [ "$restart" -eq 0 ]; then id=$SLURM_PROCID; fi
        "${{ACTOR_CMD[@]}}" --learner "$LEARNER_HOST:$PORT" --actor-id "$id" "${{args[@]}}"
        rc=$?
        case $rc in
            0 | 130 | 143) echo "actor task $SLURM_PROCID: exit $rc, done"; return 0 ;;
            2)
                echo "actor task $SLURM_PROCID: exit 2 (a configuration error): not restarted"
                return 2
                ;;
        esac
        if [ "$restart" -ge "$ACTOR_RESTARTS" ]; then
            echo "actor task $SLURM_PROCID: exit $rc; restarts exhausted"
            return "$rc"
        fi
        restart=$((restart + 1))
        echo "actor task $SLURM_PROCID: exit $rc;" \
            "restart $restart of $ACTOR_RESTARTS in ${{delay}}s"
        sleep "$delay"
        delay=$((delay * 2 > MAX_BACKOFF ? MAX_BACKOFF : delay * 2))
    done
}}
ACTOR_CMD_Q=$(printf '%q ' "${{ACTOR_CMD[@]}}")
ACTOR_ARGS_Q=$(printf '%q ' "${{ACTOR_ARGS[@]}}")
export LEARNER_HOST PORT ACTOR_RESTARTS ACTOR_RESTART_BACKOFF MAX_BACKOFF ACTOR_CMD_Q ACTOR_ARGS_Q
export -f run_actor

# scancel signals every step itself; the batch shell only waits for the learner to
# finish writing its files (up to Slurm's KillWait).
trap 'echo "$(date "+%F %T") batch script: SIGTERM, waiting for the learner"' TERM

srun {_q(learner_srun)} --nodelist="$LEARNER_HOST" \\
    "${{LEARNER_CMD[@]}}" "${{LEARNER_ARGS[@]}}" &
LEARNER_PID=$!
srun {_q(actor_srun)} \\
    bash -c 'eval "ACTOR_CMD=($ACTOR_CMD_Q)"; run_actor' &
ACTORS_PID=$!

while kill -0 "$LEARNER_PID" 2>/dev/null; do wait "$LEARNER_PID"; done
wait "$LEARNER_PID"
rc=$?
echo "$(date '+%F %T') learner step ended with exit code $rc"
# The learner told the actors to shut down; stop any that still run after 20 s.
for _ in $(seq 20); do kill -0 "$ACTORS_PID" 2>/dev/null || break; sleep 1; done
if kill -0 "$ACTORS_PID" 2>/dev/null; then
    echo "actor step still running: stopping it"
    kill -TERM "$ACTORS_PID"
fi
wait "$ACTORS_PID"
exit "$rc"
"""


def make_keys(run_dir: Path) -> tuple[dict[str, str], list[str]]:
    """Make CURVE keys in ``RUN_DIR/keys`` (mode 0700; secrets 0600): the learner's
    pair and one pair shared by the job's actors, whose public key is the only one
    in ``keys/authorized``. Returns the learner's config fields and the actor flags."""
    import zmq.auth

    keys = run_dir / "keys"
    authorized = keys / "authorized"
    authorized.mkdir(parents=True, exist_ok=True)
    keys.chmod(0o700)
    for name in ("learner", "actor"):
        if not (keys / f"{name}.key_secret").exists():
            zmq.auth.create_certificates(str(keys), name)
        (keys / f"{name}.key_secret").chmod(0o600)
    shutil.copyfile(keys / "actor.key", authorized / "actor.key")
    learner = {
        "curve_secret_key": str(keys / "learner.key_secret"),
        "curve_authorized_keys": str(authorized),
    }
    actor = [
        "--curve-secret-key",
        str(keys / "actor.key_secret"),
        "--curve-server-key",
        str(keys / "learner.key"),
    ]
    return learner, actor


def write_job(
    cfg: LearnerConfig,
    ppo: PPOConfig,
    policy: PolicyConfig,
    job: SlurmJob,
    *,
    curve: bool = False,
    preset: str | None = None,
) -> Path:
    """Write ``slurm/learner.toml``, the keys (``curve``) and ``slurm/job.sbatch`` into
    the run dir; returns the script's path."""
    run_dir = job.run_dir
    (run_dir / "slurm").mkdir(parents=True, exist_ok=True)
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    if curve:
        learner_keys, actor_flags = make_keys(run_dir)
        cfg = replace(cfg, **learner_keys)
        job.actor_args = [*actor_flags, *job.actor_args]
    header = "Learner configuration of a zmq-rl slurm job (the job passes --run-dir).\n" + (
        f"Defaults from preset {preset} (zmq_rl/presets/{preset}.toml).\n" if preset else ""
    )
    toml = dump_toml({"learner": cfg, "ppo": ppo, "policy": policy}, header, ("run_dir",))
    (run_dir / "slurm" / LEARNER_TOML).write_text(toml)
    script = run_dir / "slurm" / SCRIPT_NAME
    script.write_text(render_script(job))
    script.chmod(0o755)
    return script


def submit(script: Path) -> str:
    """``sbatch --parsable SCRIPT``; the job id (``CliFailure`` when sbatch fails)."""
    if shutil.which("sbatch") is None:
        raise CliFailure(f"sbatch is not on PATH: submit {script} on a Slurm login node")
    try:
        out = subprocess.run(
            ["sbatch", "--parsable", str(script)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise CliFailure("sbatch did not answer within 60 s") from None
    if out.returncode != 0:
        raise CliFailure(f"sbatch {script} failed: {out.stderr.strip() or out.stdout.strip()}")
    return out.stdout.strip().split(";")[0]


def _positive(text: str) -> int:
    value = non_negative(int)(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1")
    return value


def _slurm_flags(parser: argparse.ArgumentParser) -> None:
    add_learner_flags(parser, defaults=SLURM_DEFAULTS)
    parser.set_defaults(log_level="info")  # the learner's log file says what it does
    parser.add_argument(
        "--actor-log-level",
        choices=LOG_LEVELS,
        default="info",
        help="log level of the actor tasks (into RUN_DIR/logs/actor-N.log)",
    )
    group = parser.add_argument_group(
        "slurm", "the job: where it runs, what it asks for, how actors are restarted"
    )
    group.add_argument(
        "--dry-run",
        action="store_true",
        help="write RUN_DIR/slurm/job.sbatch (and keys) but do not submit it",
    )
    group.add_argument(
        "--partition", default="", help="sbatch --partition (default: the cluster's)"
    )
    group.add_argument("--time", dest="time_limit", default="", help="sbatch --time, e.g. 2:00:00")
    group.add_argument(
        "--nodes", default="", help="sbatch --nodes, e.g. 4 or 2-8 (default: as Slurm places tasks)"
    )
    group.add_argument("--job-name", default="zmq-rl", help="sbatch --job-name")
    group.add_argument(
        "--learner-cpus", type=_positive, default=1, help="CPUs of the learner's task"
    )
    group.add_argument("--actor-cpus", type=_positive, default=1, help="CPUs of each actor task")
    group.add_argument("--mem-per-cpu", default="", help="sbatch --mem-per-cpu, e.g. 2G")
    group.add_argument(
        "--learner-gres",
        default="",
        help="generic resources of the learner's task, e.g. gpu:1 (the learner trains on "
        "the CPU today: this only reserves the device)",
    )
    group.add_argument(
        "--requeue",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="let Slurm requeue the job (node failure, preemption, scontrol requeue); a "
        "requeued job resumes from its newest checkpoint",
    )
    group.add_argument(
        "--actor-restarts",
        metavar="N",
        type=non_negative(int),
        default=3,
        help="restart a failed actor task's zmq-actor up to N times",
    )
    group.add_argument(
        "--actor-restart-backoff",
        metavar="SECONDS",
        type=non_negative(int),
        default=1,
        help=f"delay before an actor restart, doubled per failure (at most {MAX_BACKOFF_S} s)",
    )
    group.add_argument(
        "--curve",
        action="store_true",
        help="encrypt and authenticate with CURVE: make keys in RUN_DIR/keys before "
        "submitting (secret files 0600; the run dir must be private to you)",
    )
    for flag, dest, what in (
        ("--sbatch-arg", "sbatch_args", "an extra #SBATCH line, e.g. --sbatch-arg=--account=rl"),
        ("--learner-srun-arg", "learner_srun_args", "an extra srun flag of the learner's step"),
        ("--actor-srun-arg", "actor_srun_args", "an extra srun flag of the actors' step"),
    ):
        group.add_argument(
            flag, dest=dest, action="append", default=[], metavar="ARG", help=f"{what} (repeatable)"
        )


@subcommand(
    "slurm",
    "write and submit one sbatch job: learner on the first node, actor tasks across the allocation",
    _slurm_flags,
    description="Train on a Slurm cluster: write RUN_DIR/slurm/job.sbatch (one allocation "
    "of --actors + 1 tasks: the learner on the first node, the actors spread over the "
    "allocation and connecting to it; the address comes from SLURM_JOB_NODELIST) and "
    "submit it with sbatch (not with --dry-run). The learner flags are those of "
    "'zmq-rl run'; the learner binds 0.0.0.0 by default. RUN_DIR must be on a shared "
    "file system. scancel stops the run cleanly (report, policy, checkpoint); a requeued "
    "job resumes from its newest checkpoint. " + preset_note(),
    sections=LEARNER_SECTIONS,
)
def slurm_command(args: argparse.Namespace) -> int:
    """``zmq-rl slurm``: validate the configs, write the job, submit it."""
    cfg, ppo, policy = configs_from_args(args)
    if not cfg.run_dir:
        raise ConfigError(
            "run_dir", cfg.run_dir, "a Slurm job needs a run dir on a shared file system"
        )
    if cfg.curve_secret_key and not args.curve:
        raise ConfigError(
            "curve_secret_key",
            cfg.curve_secret_key,
            "zmq-rl slurm makes the job's keys itself: use --curve instead",
        )
    given_run_dir = cfg.run_dir
    run_dir = Path(cfg.run_dir).resolve()
    cfg = replace(cfg, run_dir=str(run_dir))
    from ..run.session import check_run_dir_is_new

    try:
        check_run_dir_is_new(str(run_dir), "sbatch RUN_DIR/slurm/job.sbatch  # resumes")
        if (run_dir / "slurm" / SCRIPT_NAME).exists():
            raise ConfigError(
                "run_dir", str(run_dir), "holds a Slurm job already (slurm/job.sbatch)"
            )
    except BaseException:
        release_run_dir(given_run_dir)
        raise
    job = SlurmJob(
        run_dir=run_dir,
        port=cfg.port,
        num_actors=cfg.num_actors,
        learner_cmd=console_command("zmq-learner"),
        actor_cmd=console_command("zmq-actor"),
        job_name=args.job_name,
        partition=args.partition,
        time_limit=args.time_limit,
        nodes=args.nodes,
        learner_cpus=args.learner_cpus,
        actor_cpus=args.actor_cpus,
        mem_per_cpu=args.mem_per_cpu,
        learner_gres=args.learner_gres,
        requeue=args.requeue,
        actor_restarts=args.actor_restarts,
        actor_restart_backoff=args.actor_restart_backoff,
        log_level=args.log_level,
        actor_args=["--log-level", args.actor_log_level],
        sbatch_args=args.sbatch_args,
        learner_srun_args=args.learner_srun_args,
        actor_srun_args=args.actor_srun_args,
    )
    script = write_job(
        cfg, ppo, policy, job, curve=args.curve, preset=getattr(args, "applied_preset", None)
    )
    print(f"job script: {script}")
    if args.dry_run:
        print(f"not submitted (--dry-run): sbatch {script}")
        return 0
    job_id = submit(script)
    (run_dir / "slurm" / JOB_ID_NAME).write_text(job_id + "\n")
    print(f"submitted job {job_id}")
    print(f"  watch:  squeue -j {job_id};  tail -f {run_dir}/logs/learner.log")
    print(f"  stop:   scancel {job_id}   (report, policy and checkpoint are written)")
    print(f"  resume: scontrol requeue {job_id}   (continues from the newest checkpoint)")
    return 0
