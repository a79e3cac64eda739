"""A real one-machine Slurm cluster for the tests: Debian's munged, slurmctld and slurmd (Slurm 22.05), started from a
slurm.conf in a temporary directory and stopped at the end, jobs and daemons, also when a test fails.

Everything it writes (config, munge key and socket, state, spool, logs) is under that directory, and its ports are
free ones picked at start, so it touches no system-wide Slurm or munge set-up. The node declares 4 CPUs
(`SlurmdParameters=config_overrides` lets slurmd accept more than the machine has) and the partition oversubscribes,
so `srun -n 3` fits a 2-core machine.
"""

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")


class SlurmUnavailable(Exception):
    """Why this machine cannot run the cluster (the tests skip with it)."""


def _free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port_run(n):
    """The first of n consecutive free ports (SlurmClusterResolver gives task i the port port_base + i)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n > 65535:
            continue
        try:
            socks = []
            for p in range(base, base + n):
                socks.append(socket.socket())
                socks[-1].bind(("", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports")


def _tail(path, lines=15):
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class SlurmCluster:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.conf = self.root / "slurm.conf"
        self.host = socket.gethostname().split(".")[0]
        self.procs = {}
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))

    # -- start --------------------------------------------------------------------------------------------------
    def start(self, timeout=30):
        missing = [d for d in (*DAEMONS, "srun", "sbatch", "sinfo", "scancel") if not shutil.which(d)]
        if missing:
            raise SlurmUnavailable(f"not installed: {', '.join(missing)} (apt-get install slurmd slurmctld munge)")
        if os.geteuid() != 0:
            raise SlurmUnavailable("slurmd must run as root to start jobs, and this is not root")
        for d in ("state", "spool", "munge"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        (self.root / "munge").chmod(0o700)
        self._munge_key()
        self._write_conf(*_free_ports(2))
        try:
            self._spawn("munged", ["munged", "-F", "-f", "-S", str(self.socket), f"--key-file={self.root}/munge/munge.key",
                                   f"--pid-file={self.root}/munge/munged.pid", f"--log-file={self.root}/munged.log",
                                   f"--seed-file={self.root}/munge/seed"])  # fmt: skip
            self._wait(lambda: self.socket.exists(), 10, "munged did not create its socket")
            self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
            self._spawn("slurmd", ["slurmd", "-D", "-f", str(self.conf)])
            self._wait(lambda: self.node_state() == "idle", timeout, f"the node is not idle after {timeout} s")
        except SlurmUnavailable:
            self.stop()
            raise
        return self

    @property
    def socket(self):
        return self.root / "munge" / "munge.socket"

    def _munge_key(self):
        key = self.root / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
        key.chmod(0o600)

    def _write_conf(self, ctld_port, slurmd_port):
        r = self.root
        self.conf.write_text(
            f"""ClusterName=runnertests
SlurmctldHost={self.host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.socket}
CredType=cred/munge
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/slurmctld.log
SlurmdLogFile={r}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=5
NodeName={self.host} CPUs=4 State=UNKNOWN
PartitionName=runner Nodes={self.host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""
        )

    def _spawn(self, name, argv):
        out = open(self.root / f"{name}.out", "wb")
        self.procs[name] = subprocess.Popen(
            argv, cwd=self.root, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        out.close()

    def _wait(self, ready, timeout, what):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                raise SlurmUnavailable(f"{dead[0]} exited with {self.procs[dead[0]].returncode}\n{self.logs()}")
            if ready():
                return
            time.sleep(0.3)
        raise SlurmUnavailable(f"{what}\n{self.logs()}")

    def logs(self):
        names = ["munged.log", "munged.out", "slurmctld.log", "slurmctld.out", "slurmd.log", "slurmd.out"]
        return "\n".join(f"--- {n}\n{_tail(self.root / n)}" for n in names if (self.root / n).exists())

    # -- use ----------------------------------------------------------------------------------------------------
    def node_state(self):
        proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=self.env, capture_output=True, text=True, timeout=10)
        return proc.stdout.strip()

    def jobs(self):
        proc = subprocess.run(["squeue", "-h", "-o", "%i %T"], env=self.env, capture_output=True, text=True, timeout=10)
        return proc.stdout.split("\n") if proc.stdout.strip() else []

    def job_state(self, job):
        """(JobState, ExitCode) of a job slurmctld still remembers (MinJobAge, 300 s): no accounting needed."""
        proc = subprocess.run(["scontrol", "show", "job", str(job)], env=self.env, capture_output=True, text=True, timeout=10)
        fields = dict(f.split("=", 1) for f in proc.stdout.split() if "=" in f)
        return fields.get("JobState"), fields.get("ExitCode")

    # -- stop ---------------------------------------------------------------------------------------------------
    def stop(self):
        """Cancel every job, then stop the daemons' process groups; kill whatever of the cluster is left."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            subprocess.run(["scancel", "--full", "--user=root"], env=self.env, capture_output=True, timeout=10)
            deadline = time.monotonic() + 15
            while self.jobs() and time.monotonic() < deadline:
                time.sleep(0.3)
        for name in reversed(DAEMONS):
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for pid in self.leftovers():  # slurmstepd and job tasks live in sessions of their own
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def leftovers(self):
        """PIDs of processes of this cluster still alive: daemons, slurmstepd, job tasks (they carry SLURM_CONF)."""
        mark, found = str(self.conf).encode(), []
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) == os.getpid():
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read()
                with open(f"/proc/{pid}/environ", "rb") as f:
                    environ = f.read()
                with open(f"/proc/{pid}/stat", "rb") as f:
                    zombie = f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
            except OSError:
                continue
            if not zombie and (mark in cmdline or b"SLURM_CONF=" + mark in environ or str(self.root).encode() in cmdline):
                found.append(int(pid))
        return found
