"""The sweep's next job, started ahead of this one (runner.sweeps.spares), held still while this job's training is
timed: its imports would otherwise take CPU from the steps whose throughput the sweep compares (measured: training
4-35% slower beside it, even at niceness 19, on 2 cores).

The sweep writes the spare's process group and start time to the file RUNNER_SPARE_FILE names (`announce`); the
job stops that group at its first step's end (`hold`, from the throughput meter) and lets it go on when training
ends (`release`). The sweep lets it go on itself when a job ends any other way (`resume`).
"""

import os
import signal

from runner.control import contract, procs

_held: list[int] = []


def announce(path: str, pid: int) -> None:
    """(The sweep.) The spare `pid`, leader of its own process group, for the running job to hold."""
    with open(path + ".tmp", "w") as f:
        f.write(f"{pid} {procs.start_ticks(pid)}")
    os.replace(path + ".tmp", path)


def withdraw(path: str) -> None:
    """(The sweep.) No spare to hold: it became the job, or it was dropped."""
    try:
        os.remove(path)
    except OSError:
        pass


def _spare() -> int | None:
    path = os.environ.get(contract.SPARE_FILE)
    try:
        with open(path or "") as f:
            pid, ticks = (int(v) for v in f.read().split())
    except (OSError, ValueError):
        return None
    if pid == os.getpgrp() or procs.start_ticks(pid) != ticks:  # this job itself, or a pid used again
        return None
    return pid


def hold() -> None:
    """Stop the spare's process group (the spare and its MLflow process), if the sweep started one."""
    pid = _spare()
    if pid is not None and not _held:
        try:
            os.killpg(pid, signal.SIGSTOP)
            _held.append(pid)
        except OSError:
            pass


def release() -> None:
    """Let the held spare go on."""
    while _held:
        resume(_held.pop())


def resume(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGCONT)
    except OSError:
        pass
