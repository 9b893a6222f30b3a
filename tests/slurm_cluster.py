"""A single-node Slurm cluster for tests: munged, slurmctld and slurmd on this machine.

Everything lives in one temporary directory (slurm.conf, the munge key and socket,
state, spool, logs); the daemons run in the foreground as children of the test and
are stopped by :meth:`SlurmCluster.stop`. Clients find the cluster through the
``SLURM_CONF`` variable of :attr:`SlurmCluster.env`. Needs root (slurmd starts job
steps as the submitting user) and Debian's ``slurm-wlm`` and ``munge``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from tests.ports import free_port_block

DAEMONS = ("munged", "slurmctld", "slurmd")
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
NODE = "localhost"
CPUS = 4
"""CPUs slurmd announces (``SlurmdParameters=config_overrides`` lets it claim more than
the machine's 2 cores): the learner's task plus two actor tasks of one CPU each."""


def missing_tools() -> list[str]:
    """The Slurm and munge programs that are not installed."""
    tools = (*DAEMONS, "sbatch", "scontrol", "scancel", "srun")
    return [t for t in tools if shutil.which(t) is None]


def skip_reason() -> str | None:
    """Why a Slurm cluster cannot be started here (None: it can)."""
    missing = missing_tools()
    if missing:
        return (
            f"{', '.join(missing)} not installed (apt-get install slurm-wlm munge; .ci/run does it)"
        )
    if os.geteuid() != 0:
        return "starting slurmd needs root"
    return None


SLURM_CONF = """\
ClusterName=zmqrltest
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
JobRequeue=1
MinJobAge=600
KillWait=30
SchedulerParameters=sched_interval=1
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    """munged + slurmctld + slurmd in ``root``; :meth:`start`, :meth:`stop`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.conf = root / "slurm.conf"
        self.munge_socket = root / "munge" / "munge.socket"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        for name in list(self.env):  # the test may itself run inside a Slurm job
            if name.startswith(("SLURM_", "SBATCH_", "SRUN_")) and name != "SLURM_CONF":
                del self.env[name]

    def start(self) -> None:
        """Write the configuration, start the three daemons and wait until the node is
        idle (bounded by :data:`READY_TIMEOUT_S`)."""
        for sub in ("state", "spool", "munge"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.root / "munge").chmod(0o700)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        base = free_port_block(2)
        self.conf.write_text(
            SLURM_CONF.format(
                node=NODE,
                ctld_port=base,
                slurmd_port=base + 1,
                munge_socket=self.munge_socket,
                root=self.root,
                cpus=CPUS,
            )
        )
        self._spawn(
            "munged",
            [
                "munged",
                "--foreground",
                "--force",
                f"--key-file={key}",
                f"--socket={self.munge_socket}",
                f"--pid-file={self.root / 'munge' / 'munged.pid'}",
                f"--log-file={self.root / 'munge' / 'munged.log'}",
                f"--seed-file={self.root / 'munge' / 'munged.seed'}",
            ],
        )
        self._wait(lambda: self.munge_socket.exists(), "munged's socket")
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._spawn("slurmd", ["slurmd", "-D", "-N", NODE, "-f", str(self.conf)])
        self._wait(self._node_idle, "the node to be idle")

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.root / f"{name}.out", "ab")  # noqa: SIM115 (the child holds it)
        self.procs[name] = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )
        log.close()

    def _wait(self, ready: object, what: str) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}: {self.logs()}")
            if ready():  # type: ignore[operator]
                return
            time.sleep(0.2)
        raise TimeoutError(f"no {what} within {READY_TIMEOUT_S:g}s: {self.logs()}")

    def _node_idle(self) -> bool:
        out = self.run("sinfo", "-h", "-N", "-o", "%T", check=False)
        return out.returncode == 0 and out.stdout.strip().startswith("idle")

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster (10 s bound)."""
        out = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=10)
        if check and out.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({out.returncode}): {out.stderr}")
        return out

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o``, as a dict (JobState, ExitCode, Restarts, ...)."""
        out = self.run("scontrol", "show", "job", "-o", job_id).stdout
        fields = {}
        for item in out.split():
            key, _, value = item.partition("=")
            fields[key] = value
        return fields

    def wait_state(self, job_id: str, states: tuple[str, ...], timeout: float) -> dict[str, str]:
        """Poll the job until its state is one of ``states``; its fields then."""
        deadline = time.monotonic() + timeout
        fields: dict[str, str] = {}
        while time.monotonic() < deadline:
            fields = self.job(job_id)
            if fields.get("JobState") in states:
                return fields
            time.sleep(0.25)
        raise TimeoutError(f"job {job_id} not in {states} within {timeout:g}s: {fields}")

    def logs(self) -> str:
        """The end of every daemon's log, for failure messages."""
        parts = []
        for name in ("slurmctld.log", "slurmd.log", "munged.out", "slurmctld.out", "slurmd.out"):
            path = self.root / name
            if path.exists():
                parts.append(f"--- {name}\n" + "\n".join(path.read_text().splitlines()[-15:]))
        return "\n".join(parts)

    def stop(self) -> None:
        """Cancel every job, stop the daemons (SIGTERM, then SIGKILL after
        :data:`STOP_TIMEOUT_S`)."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            self.run("scancel", "--user", "root", check=False)
        for name in reversed(DAEMONS):
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(STOP_TIMEOUT_S)
