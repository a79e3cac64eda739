"""runner/sweeps/spares.py, runner/spare.py and runner/control/ahead.py: the next job's process started ahead, with
real `python -m runner` spares (they import TensorFlow ahead at niceness 19, and are handed config-only jobs or
none), no mocks."""

import os
import sys
import time

from runner.control import ahead, contract, procs
from runner.sweeps.spares import Spares


def _env(tmp_path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != contract.TRACKING_URI}
    return {**env, "PYTHONUNBUFFERED": "1", contract.SWEEP_JOB: "1", **extra}


def _gone(pid: int, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if procs.start_ticks(pid) is None or procs.state(pid) == "Z":
            return True
        time.sleep(0.05)
    return False


def _stopped(pid: int, want: bool, timeout: float = 5.0) -> bool:
    """Whether `pid` is (want=True) or is not stopped within `timeout` (a signal's effect is not immediate)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (procs.state(pid) == "T") == want:
            return True
        time.sleep(0.02)
    return False


def _command_line_becomes(proc, word: str, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
                if word.encode() in f.read().split(b"\0"):
                    return True
        except OSError:
            pass
        time.sleep(0.01)
    return False


def test_a_spare_becomes_the_job_it_is_handed(tmp_path):
    spares = Spares(str(tmp_path / "spare.pid"))
    spares.start(_env(tmp_path))
    assert (tmp_path / "spare.pid").exists()  # named for the running job to hold
    job_env = _env(tmp_path, **{contract.SWEEP_JOB: "2"})  # another number: still this spare's job
    proc = spares.take(["--cfg", "job", "strategy=mirrored", "train.epochs=7"], job_env)
    assert proc is not None and not (tmp_path / "spare.pid").exists()
    # handed at once, before its imports at the lowest priority are done: it does not wait for them (on a busy machine
    # minutes) but starts afresh as the job, in the same process at normal priority (exec: its command line is the job's)
    assert _command_line_becomes(proc, "--cfg"), "the spare waited for its imports ahead"
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-2000:]
    assert "name: mirrored" in out and "epochs: 7" in out  # `python -m runner --cfg job ...`, as typed
    assert "cuda" not in out.lower()  # TensorFlow's start-up chatter during the import ahead stays hidden


def test_a_spare_for_another_environment_or_never_used_ends_and_leaves_nothing(tmp_path):
    spares = Spares(str(tmp_path / "spare.pid"))
    spares.start(_env(tmp_path))
    first = spares.proc.pid
    assert spares.take(["--cfg", "job"], _env(tmp_path, TF_ENABLE_ONEDNN_OPTS="1")) is None  # read at TF's import
    assert _gone(first)
    spares.start(_env(tmp_path))
    second = spares.proc.pid
    spares.drop()
    assert _gone(second) and spares.take(["--cfg", "job"], _env(tmp_path)) is None
    assert not (tmp_path / "spare.pid").exists()


def test_the_job_holds_the_spare_still_while_its_steps_are_timed(tmp_path, monkeypatch):
    path = str(tmp_path / "spare.pid")
    spares = Spares(path)
    spares.start(_env(tmp_path))
    pid = spares.proc.pid
    monkeypatch.setenv(contract.SPARE_FILE, path)
    try:
        ahead.hold()
        assert _stopped(pid, True)  # its MLflow process with it: one process group
        ahead.release()
        assert _stopped(pid, False) and procs.state(pid)
        ahead.hold()
        assert _stopped(pid, True)
        spares.resume()  # the sweep's side, when a job ended before it let the spare go
        assert _stopped(pid, False)
    finally:
        ahead.release()
        spares.drop()
    assert _gone(pid)


def test_a_stale_spare_file_holds_nothing(tmp_path, monkeypatch):
    path = tmp_path / "spare.pid"
    path.write_text(f"{os.getpid()} 1")  # a pid whose start time is not the one recorded: used again
    monkeypatch.setenv(contract.SPARE_FILE, str(path))
    ahead.hold()
    assert not ahead._held and procs.state(os.getpid()) != "T"
    path.write_text(f"{os.getpgrp()} {procs.start_ticks(os.getpgrp())}")  # the job's own group: never
    ahead.hold()
    assert not ahead._held


def test_a_process_that_holds_mlflow_ends_after_its_atexit_handlers_without_tearing_modules_down(tmp_path):
    import subprocess

    script = (
        "import atexit, sys, types\n"
        "from runner.control import teardown\n"
        "atexit.register(teardown.after_atexit)\n"
        "sys.modules.setdefault('mlflow', types.ModuleType('mlflow'))  # what the sweep's report imports\n"
        "atexit.register(lambda: print('handler ran', flush=True))\n"
        "class Loud:\n"
        "    def __del__(self):\n"
        "        print('torn down', flush=True)\n"
        "keep = Loud()\n"
        "teardown.exit(3)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3 and "handler ran" in done.stdout and "torn down" not in done.stdout, done
