"""Child processes that die with the process that started them, even when it is killed with SIGKILL.

Every process the runner starts (cluster tasks, sweep jobs, the watchdog) goes through `popen`. It asks Linux
(prctl PR_SET_PDEATHSIG) to send the child SIGKILL when its parent goes away. Linux sends it when the *thread*
that forked the child exits, so call `popen` from a thread that lives as long as the child is wanted: the
runner does it from the main thread (the launcher's supervise loop, the sweep's task function, deadline()).

Also: who a process is (host, pid, start time), so a run left RUNNING by a process that is gone can be told
apart from one whose process still runs (runner.mlflow_process.store).
"""

import concurrent.futures.thread  # noqa: F401  (its fork hooks registered now: see below)
import ctypes
import os
import signal
import socket
import subprocess
import sys

# concurrent.futures.thread registers a pair of fork hooks: take a lock before fork, release it after in the
# parent. Registered by another thread while this one forks with a preexec_fn (the sweep imports mlflow in the
# background while it starts jobs), Python runs the release without the take and prints "release unlocked lock"
# into the job's output. Imported above, before any fork, the pair is always complete.
PR_SET_PDEATHSIG = 1
_prctl = None
if sys.platform.startswith("linux"):  # resolved here, before any fork: the child only makes one plain call
    try:
        _prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        _prctl = None


def _deaf() -> None:
    """In a helper child before exec: SIGINT and SIGTERM ignored from its first instruction on (an ignored signal
    stays ignored across exec, and Python then installs no KeyboardInterrupt handler). A terminal's Ctrl-C reaches
    the whole process group; the training process decides what happens, and its helpers end with it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _preexec(parent: int | None, deaf: bool):
    def preexec() -> None:
        if deaf:
            _deaf()
        if parent is not None and _prctl is not None:
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent:  # the parent died before the line above took effect
                os._exit(137)

    return preexec


def popen(argv, *, deaf: bool = False, **kwargs) -> subprocess.Popen:
    """subprocess.Popen whose child gets SIGKILL when this process (the forking thread) dies. `deaf`: a helper
    (the sentinel, the MLflow process) that ignores SIGINT and SIGTERM."""
    if _prctl is not None or deaf:
        kwargs["preexec_fn"] = _preexec(os.getpid() if _prctl is not None else None, deaf)
    return subprocess.Popen(argv, **kwargs)


def popen_deaf(argv, **kwargs) -> subprocess.Popen:
    """A helper that ignores SIGINT and SIGTERM but does not die with the forking thread (started from a thread
    that may end first; it ends when its stdin closes)."""
    return subprocess.Popen(argv, preexec_fn=_preexec(None, True), **kwargs)


def _stat(pid: int) -> list | None:
    """The fields of /proc/<pid>/stat after "pid (comm) ", from field 3 (state) on; None if it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rindex(b")") + 2 :].split()


def state(pid: int) -> str:
    """The process's state letter (R, S, T for stopped, Z...), or '' when it cannot be read."""
    fields = _stat(pid)
    return fields[0].decode() if fields else ""


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22), or None if it has exited.
    With the pid, it names one process: a pid reused later has another start time."""
    fields = _stat(pid)
    if fields is None:
        return None
    return None if fields[0] in (b"Z", b"X") else int(fields[19])  # a zombie has died already


def _namespace() -> str:
    """<boot id>/<pid namespace>: pids mean the same only within one boot and one pid namespace (container)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return ""


def identity(pid: int | None = None) -> dict:
    """host, pid namespace, pid and start ticks of this process (or of pid)."""
    pid = os.getpid() if pid is None else pid
    return {"host": socket.gethostname(), "ns": _namespace(), "pid": str(pid), "start": str(start_ticks(pid) or "")}


def alive(host: str, pid: str, start: str, ns: str = "") -> bool | None:
    """Whether the process recorded as (host, ns, pid, start) still runs; None when this process cannot tell
    (another host, or another container on this one)."""
    if host != socket.gethostname():
        return None
    here = _namespace()
    if ns and here and ns != here:
        if ns.split("/", 1)[0] != here.split("/", 1)[0]:
            return False  # the machine rebooted since: every process of that boot is gone
        return None  # another pid namespace (a container): its pids are not ours to look up
    try:
        ticks = start_ticks(int(pid))
    except ValueError:
        return None
    return ticks is not None and (not start or str(ticks) == start)


def started_at(pid: int | None = None) -> float | None:
    """When the process (this one by default) started, in seconds since the epoch (to ~10 ms), or None."""
    ticks = start_ticks(os.getpid() if pid is None else pid)
    try:
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    except (OSError, StopIteration):
        return None
    return None if ticks is None else boot + ticks / os.sysconf("SC_CLK_TCK")
