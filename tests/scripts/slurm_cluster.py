"""A one-node SLURM cluster on localhost for the batch scripts' tests: munged, slurmctld and slurmd from Debian's
`munge` and `slurm-wlm`, started directly (no systemd) with every file in one temporary folder: the configuration,
the munge key and socket, the daemons' state, spool, logs and pid files. The node is this machine, declared with the
CPUs and memory the scripts' `#SBATCH` lines ask for (`SlurmdParameters=config_overrides`) and no GPU.

`why_not()` says why such a cluster cannot start here (None when it can); `Cluster.start()` raises ClusterError
naming the daemon that did not come up, with the end of its log."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

REQUIRE_ENV = "LOGIT_READOUT_REQUIRE_SLURM"
"""Set (by .ci/run) to make a cluster that cannot start a failure instead of a skip."""
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo")
NODE_CPUS, NODE_MEMORY_MB = 8, 70_000
"""What the node declares: enough for the scripts' own `#SBATCH --cpus-per-task=8 --mem=64G`."""


class ClusterError(RuntimeError):
    pass


def _which(name: str) -> str | None:
    return shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.access(p, os.X_OK)), None)


def why_not() -> str | None:
    """Why a cluster cannot start on this machine, or None."""
    missing = [p for p in PROGRAMS if _which(p) is None]
    if missing:
        return f"SLURM is not installed ({', '.join(missing)} missing): apt-get install slurm-wlm munge (.ci/run does)"
    if os.geteuid() != 0:
        return "slurmd runs jobs as their user and must start as root; these tests run as another user"
    return None


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class Cluster:
    """The cluster's folder, its environment (SLURM_CONF) and the daemons' processes."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.node = socket.gethostname().split(".")[0]
        self.procs: dict[str, subprocess.Popen] = {}
        self.conf = self.root / "slurm.conf"
        self.socket = self.root / "munge" / "munge.socket"

    @property
    def env(self) -> dict:
        """The environment every SLURM command of the tests runs in."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def log(self, name: str, lines: int = 15) -> str:
        path = self.root / "log" / f"{name}.log"
        if not path.exists():
            return f"({path} was not written)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def _write(self) -> None:
        for sub in ("munge", "state", "spool", "log", "run"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root / "munge", 0o700)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
        ctld, slurmd = _free_ports(2)
        r = self.root
        self.conf.write_text(f"""\
ClusterName=readout-test
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={ctld}
SlurmdPort={slurmd}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.socket}
CredType=cred/munge
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmdPidFile={r}/run/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
SchedulerType=sched/backfill
MinJobAge=3600
KillWait=5
InactiveLimit=0
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={NODE_CPUS} RealMemory={NODE_MEMORY_MB} State=UNKNOWN
PartitionName=test Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
""")

    def _spawn(self, name: str, argv: list[str]) -> None:
        out = open(self.root / "log" / f"{name}.stdout", "ab")
        self.procs[name] = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                            start_new_session=True)
        out.close()

    def _wait(self, name: str, ready, timeout: float) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is not None:
                raise ClusterError(f"{name} exited with {proc.returncode}: {self.log(name)}")
            if ready():
                return
            time.sleep(0.2)
        raise ClusterError(f"{name} did not come up in {timeout:.0f} s: {self.log(name)}")

    def start(self, timeout: float = 60.0) -> Cluster:
        self._write()
        r = self.root
        self._spawn("munged", [_which("munged"), "--foreground", "--force", f"--socket={self.socket}",
                               f"--key-file={r}/munge/munge.key", f"--pid-file={r}/run/munged.pid",
                               f"--log-file={r}/log/munged.log", f"--seed-file={r}/munge/munge.seed"])
        self._wait("munged", self.socket.exists, timeout)
        self._spawn("slurmctld", [_which("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        self._wait("slurmctld", lambda: self.run("scontrol", "ping", check=False).stdout.count("UP") > 0, timeout)
        self._spawn("slurmd", [_which("slurmd"), "-D", "-f", str(self.conf), "-N", self.node])
        self._wait("slurmd", lambda: "idle" in self.run("sinfo", "-h", "-o", "%T", check=False).stdout, timeout)
        return self

    def run(self, *argv: str, check: bool = True, timeout: float = 60.0, env: dict | None = None) -> subprocess.CompletedProcess:
        """A SLURM command (or any command) in the cluster's environment."""
        return subprocess.run(list(argv), capture_output=True, text=True, env={**self.env, **(env or {})}, check=check,
                              timeout=timeout)

    def stop(self) -> None:
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    def job_states(self, job: str) -> dict[str, str]:
        """Each task of job `job` (array tasks as JOB_INDEX) and its state, from scontrol (finished jobs are kept an
        hour: MinJobAge)."""
        out = self.run("scontrol", "-o", "show", "job", job, check=False).stdout
        states = {}
        for line in out.splitlines():
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            task = fields.get("ArrayTaskId")
            states[f"{fields.get('ArrayJobId', fields.get('JobId'))}_{task}" if task else fields.get("JobId")] = fields.get("JobState")
        return states

    def wait_jobs(self, jobs, timeout: float = 600.0) -> None:
        """Until no job of `jobs` is pending or running."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            out = self.run("squeue", "-h", "-j", ",".join(jobs), "-o", "%i %T", check=False).stdout
            if not out.strip():
                return
            time.sleep(1.0)
        raise ClusterError(f"jobs {', '.join(jobs)} still queued after {timeout:.0f} s: "
                           + self.run("squeue", check=False).stdout)
