"""runner/control/procs.py: children that die with their parent (PR_SET_PDEATHSIG), process state and identity, and
whether a recorded owner process still runs. With real tiny processes (`python -c`), no TensorFlow."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner.control import procs

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


def _gone(pid: int, timeout: float = 10.0) -> bool:
    """Whether `pid` stops running (exited, or a zombie nobody reaped yet) within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if procs.start_ticks(pid) is None:
            return True
        time.sleep(0.05)
    return False


def _kill_if_still(pid: int, ticks) -> None:
    """SIGKILL `pid` only while it is still the process started at `ticks` (a pid is reused once it is reaped)."""
    if ticks is not None and procs.start_ticks(pid) == ticks:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# A fork during which another thread imports concurrent.futures.thread, made certain: the first fork hook to run
# has a thread import it and waits for it (the sweep imports mlflow, which imports it, in a thread while it starts
# jobs).
_IMPORT_DURING_FORK = """
import os, subprocess, threading
{start}
fired = []
def before():
    if not fired:
        fired.append(1)
        thread = threading.Thread(target=lambda: __import__("concurrent.futures.thread"))
        thread.start()
        thread.join()
os.register_at_fork(before=before)
{popen}(["true"], preexec_fn=lambda: None).wait()
"""


def test_a_thread_importing_concurrent_futures_during_a_fork_leaves_no_error_in_the_output():
    plain = _IMPORT_DURING_FORK.format(start="", popen="subprocess.Popen")
    runner = _IMPORT_DURING_FORK.format(start="from runner.control import procs", popen="procs.subprocess.Popen")
    hazard = subprocess.run([sys.executable, "-c", plain], capture_output=True, text=True, timeout=60)
    assert "release unlocked lock" in hazard.stderr  # Python 3.11 without procs: the error seen in a sweep
    fixed = subprocess.run([sys.executable, "-c", runner], capture_output=True, text=True, timeout=60)
    assert fixed.returncode == 0 and fixed.stderr == "", fixed.stderr


@pytest.fixture
def sleeper():
    """A real process that sleeps until the test ends; killed and reaped after it."""
    proc = subprocess.Popen(SLEEPER)
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def _middle(use_procs: bool) -> subprocess.Popen:
    """A process that starts a sleeping grandchild (through procs.popen or plain subprocess.Popen), prints its pid
    and sleeps."""
    start = "procs.popen" if use_procs else "subprocess.Popen"
    code = (
        "import subprocess, sys, time\n"
        "from runner.control import procs\n"
        f"child = {start}([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_started_with_popen_dies_when_its_parent_is_killed_with_sigkill():
    middle = _middle(use_procs=True)
    grandchild = int(middle.stdout.readline())
    ticks = procs.start_ticks(grandchild)
    try:
        assert ticks is not None
        middle.kill()  # SIGKILL: no Python code of the parent runs, no atexit, no cleanup
        middle.wait()
        middle.stdout.close()
        assert _gone(grandchild), f"pid {grandchild} outlived its parent"
    finally:
        middle.kill()  # a no-op once it was reaped
        middle.wait()
        _kill_if_still(grandchild, ticks)


def test_without_popen_the_same_child_outlives_its_parent():
    """The control: what procs.popen prevents does happen with subprocess.Popen."""
    middle = _middle(use_procs=False)
    grandchild = int(middle.stdout.readline())
    ticks = procs.start_ticks(grandchild)
    try:
        middle.kill()
        middle.wait()
        middle.stdout.close()
        time.sleep(0.5)
        assert procs.start_ticks(grandchild) is not None
    finally:
        middle.kill()  # a no-op once it was reaped
        middle.wait()
        _kill_if_still(grandchild, ticks)


def test_popen_passes_its_arguments_to_subprocess():
    done = procs.popen(
        [sys.executable, "-c", "import os; print(os.environ['PROCS_TEST'])"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PROCS_TEST": "seen"},
    )
    out, _ = done.communicate(timeout=60)
    assert done.returncode == 0 and out.strip() == "seen"


def test_state_of_running_sleeping_stopped_zombie_and_missing_processes(sleeper):
    assert procs.state(os.getpid()) == "R"  # this process, reading its own stat
    deadline = time.monotonic() + 10
    while procs.state(sleeper.pid) != "S" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert procs.state(sleeper.pid) == "S"
    os.kill(sleeper.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while procs.state(sleeper.pid) != "T" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert procs.state(sleeper.pid) == "T"
    os.kill(sleeper.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while procs.state(sleeper.pid) != "Z" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert procs.state(sleeper.pid) == "Z"  # dead, not reaped yet
    sleeper.wait()
    assert procs.state(sleeper.pid) == ""


def test_start_ticks_name_one_process_and_a_dead_one_has_none(sleeper):
    ticks = procs.start_ticks(sleeper.pid)
    assert isinstance(ticks, int) and ticks >= procs.start_ticks(os.getpid())  # started after this process
    assert procs.start_ticks(sleeper.pid) == ticks  # the same on every read
    sleeper.kill()
    assert _gone(sleeper.pid)  # a zombie already counts as gone
    sleeper.wait()
    assert procs.start_ticks(sleeper.pid) is None


def test_identity_of_this_process_and_of_another():
    me = procs.identity()
    assert set(me) == {"host", "ns", "pid", "start"}
    assert me["host"] == socket.gethostname() and me["pid"] == str(os.getpid())
    assert me["start"] == str(procs.start_ticks(os.getpid()))
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert me["ns"] == f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    assert procs.identity(1)["pid"] == "1"


def test_alive_tells_a_running_owner_from_a_dead_or_reused_pid(sleeper):
    me = procs.identity()
    assert procs.alive(me["host"], me["pid"], me["start"], me["ns"]) is True
    assert procs.alive(me["host"], me["pid"], "") is True  # no start time recorded: the pid alone
    assert procs.alive(me["host"], me["pid"], str(int(me["start"]) + 1), me["ns"]) is False  # the pid reused since
    them = procs.identity(sleeper.pid)
    assert procs.alive(them["host"], them["pid"], them["start"], them["ns"]) is True
    sleeper.kill()
    sleeper.wait()
    assert procs.alive(them["host"], them["pid"], them["start"], them["ns"]) is False


def test_alive_cannot_tell_for_another_host_or_container_and_knows_a_reboot_ends_everything():
    me = procs.identity()
    boot, pidns = me["ns"].split("/", 1)
    assert procs.alive(me["host"] + "-elsewhere", me["pid"], me["start"], me["ns"]) is None
    assert procs.alive(me["host"], me["pid"], me["start"], f"{boot}/pid:[1]") is None  # another pid namespace
    assert procs.alive(me["host"], me["pid"], me["start"], f"not-{boot}/{pidns}") is False  # an earlier boot
    assert procs.alive(me["host"], "not-a-pid", me["start"], me["ns"]) is None


def test_started_at_is_when_the_process_started(sleeper):
    started = procs.started_at(sleeper.pid)
    assert started is not None and abs(started - time.time()) < 30
    assert procs.started_at() <= started  # this process started before its child
    sleeper.kill()
    sleeper.wait()
    assert procs.started_at(sleeper.pid) is None
