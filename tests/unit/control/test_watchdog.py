"""runner/control/watchdog.py: the sentinel that stops a training process TensorFlow holds in C++.

Its state machine (Sentinel: command / signalled / timeout / due) in process; its main loop as the real small
process it is, watching a real sleeping process, fed JSON lines on stdin and signal numbers on a pipe as CPython's
wakeup fd writes them; the MLflow marks into a real SQLite store."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from runner.control import watchdog
from runner.control.watchdog import Sentinel

SIGINT, SIGTERM = int(signal.SIGINT), int(signal.SIGTERM)


@pytest.fixture
def short_grace(monkeypatch):
    monkeypatch.setattr(watchdog, "GRACE_SEC", 0.05)
    return 0.05


# --- the state machine ------------------------------------------------------------------------------------------
def test_a_fresh_sentinel_waits_for_nothing():
    s = Sentinel(1234)
    assert s.timeout() is None and s.due() is None


def test_one_signal_outside_a_deadline_is_left_to_python():
    """Python's own handler acts on a first Ctrl-C at the next step boundary: the sentinel does nothing."""
    s = Sentinel(1234)
    s.signalled([SIGINT])
    assert s.act_at is None and s.timeout() is None and s.due() is None


def test_a_second_signal_arms_the_grace_period():
    s = Sentinel(1234)
    s.signalled([SIGINT])
    s.signalled([SIGTERM])
    assert 0 < s.timeout() <= watchdog.GRACE_SEC
    assert s.due() is None  # not before the grace period ends


def test_two_signals_in_one_read_arm_it_too():
    s = Sentinel(1234)
    s.signalled([SIGINT, SIGINT])
    assert s.act_at is not None


def test_signals_other_than_ctrl_c_and_sigterm_are_ignored():
    s = Sentinel(1234)
    s.signalled([int(signal.SIGUSR1), int(signal.SIGCHLD), int(signal.SIGWINCH)])
    s.signalled([int(signal.SIGUSR1)])
    assert s.signals == [] and s.act_at is None


def test_while_a_deadline_is_armed_the_first_signal_arms_the_grace_period():
    """Joining a cluster, TensorFlow holds the GIL: the first Ctrl-C already cannot reach Python."""
    s = Sentinel(1234)
    s.command(["deadline", 60, "peers never joined"])
    assert 59 < s.timeout() <= 60
    s.signalled([SIGTERM])
    assert 0 < s.timeout() <= watchdog.GRACE_SEC  # the sooner of the two


def test_clear_after_one_signal_gives_the_signal_back_to_python():
    s = Sentinel(1234)
    s.command(["deadline", 60, "peers never joined"])
    s.signalled([SIGINT])
    s.command(["clear"])  # the blocking call returned
    assert s.deadline is None and s.act_at is None and s.timeout() is None and s.due() is None


def test_clear_after_two_signals_keeps_the_grace_period():
    s = Sentinel(1234)
    s.command(["deadline", 60, "peers never joined"])
    s.signalled([SIGINT, SIGINT])
    s.command(["clear"])
    assert s.deadline is None and s.act_at is not None


def test_due_after_the_grace_period_kills_and_marks_the_run_killed(short_grace):
    s = Sentinel(1234)
    s.command(["run", "abc123", "owner", "/runs/2026-11-30/10-00-00"])
    s.signalled([SIGINT, SIGTERM])
    time.sleep(short_grace * 2)
    message, status = s.due()
    assert status == "KILLED"
    assert message.startswith("Stopped: SIGTERM received")  # the last signal is named
    assert "within 0.05s" in message and "exit 137" in message
    assert message.endswith("Continue with resume=/runs/2026-11-30/10-00-00.")


def test_without_an_output_directory_the_message_names_no_resume(short_grace):
    for run in (None, ["abc123", "attached"], ["abc123", "attached", ""]):
        s = Sentinel(1234)
        if run:
            s.command(["run", *run])
        s.signalled([SIGINT, SIGINT])
        time.sleep(short_grace * 2)
        message, status = s.due()
        assert status == "KILLED" and "resume=" not in message


def test_a_deadline_that_passes_fails_the_run_with_its_message():
    s = Sentinel(1234)
    s.command(["deadline", 0.05, "worker:1 never joined the cluster within 0.05 s"])
    assert s.due() is None
    time.sleep(0.1)
    assert s.timeout() == 0.0
    assert s.due() == ("Error: worker:1 never joined the cluster within 0.05 s", "FAILED")


def test_a_new_deadline_replaces_the_old_one():
    s = Sentinel(1234)
    s.command(["deadline", 0.01, "first"])
    s.command(["deadline", 60, "second"])
    time.sleep(0.05)
    assert s.due() is None and s.message == "second"


# --- main(): the real process -----------------------------------------------------------------------------------
class Watched:
    """A sleeping process and a sentinel process watching it, with a short grace period."""

    def __init__(self, grace=0.2):
        self.victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        self.read_fd, self.write_fd = os.pipe()
        code = f"import sys; from runner.control import watchdog; watchdog.GRACE_SEC = {grace}; watchdog.main(sys.argv[1:])"
        self.sentinel = subprocess.Popen(
            [sys.executable, "-c", code, str(self.victim.pid), str(self.read_fd)],
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            pass_fds=(self.read_fd,),
        )
        os.close(self.read_fd)

    def send(self, *words):
        self.sentinel.stdin.write(json.dumps(list(words)) + "\n")
        self.sentinel.stdin.flush()

    def signal(self, *numbers):
        os.write(self.write_fd, bytes(numbers))

    def finish(self, timeout=30):
        """(sentinel's exit code, its stderr, the victim's exit code or None if it still runs)."""
        try:
            self.sentinel.stdin.close()
        except BrokenPipeError:
            pass
        err = self.sentinel.stderr.read()
        self.sentinel.stderr.close()
        code = self.sentinel.wait(timeout=timeout)
        victim = self.victim.poll()
        self.cleanup()
        return code, err, victim

    def cleanup(self):
        """Whatever still runs is killed (a test that failed half-way leaves nothing behind)."""
        for proc in (self.sentinel, self.victim):
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for stream in (self.sentinel.stdin, self.sentinel.stderr):
            try:
                stream.close()
            except BrokenPipeError:
                pass
        if self.write_fd is not None:
            os.close(self.write_fd)
            self.write_fd = None

    def victim_exit(self, timeout=30):
        return self.victim.wait(timeout=timeout)


@pytest.fixture
def watched():
    """watched(grace=...) -> a Watched pair of processes, cleaned up after the test whatever happened."""
    made = []

    def make(**kw):
        made.append(Watched(**kw))
        return made[-1]

    yield make
    for w in made:
        w.cleanup()


def test_the_sentinel_kills_a_process_whose_deadline_passes(watched):
    w = watched()
    w.send("deadline", 0.3, "worker:1 never joined the cluster")
    assert w.victim_exit() == -signal.SIGKILL
    code, err, _ = w.finish()
    assert code == 0 and err.strip() == "Error: worker:1 never joined the cluster"


def test_the_sentinel_kills_a_process_that_does_not_act_on_two_signals(watched):
    w = watched(grace=0.2)
    w.send("run", "abc123", "attached", "/runs/x")
    started = time.monotonic()
    w.signal(SIGINT, SIGINT)
    assert w.victim_exit() == -signal.SIGKILL
    assert time.monotonic() - started >= 0.2
    code, err, _ = w.finish()
    assert err.startswith("Stopped: SIGINT received") and "resume=/runs/x" in err


def test_commands_split_across_writes_and_several_in_one_write_are_read(watched):
    w = watched()
    line = json.dumps(["deadline", 60, "far away"]) + "\n" + json.dumps(["clear"]) + "\n"
    w.sentinel.stdin.write(line[:7])
    w.sentinel.stdin.flush()
    time.sleep(0.1)
    w.sentinel.stdin.write(line[7:])
    w.sentinel.stdin.flush()
    w.signal(SIGTERM)  # after clear: one signal is Python's to act on
    time.sleep(0.5)
    code, err, victim = w.finish()
    assert (code, err, victim) == (0, "", None)


def test_the_sentinel_ends_quietly_when_its_parent_closes_stdin_and_leaves_the_process_alone(watched):
    w = watched()
    w.send("deadline", 60, "far away")
    w.signal(SIGINT)  # armed, but the grace period is far from over
    code, err, victim = w.finish()
    assert (code, err, victim) == (0, "", None)


# --- marking the MLflow run -------------------------------------------------------------------------------------
@pytest.fixture
def store(sqlite_uri, tmp_path, monkeypatch):
    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", sqlite_uri)
    monkeypatch.setattr(watchdog, "_client", None)  # opened once per process: this test's store
    client = MlflowClient(sqlite_uri)
    experiment = client.create_experiment("watchdog", artifact_location=str(tmp_path / "artifacts"))
    return client, experiment


def test_an_owner_run_is_ended_with_the_status_and_the_message(store):
    client, experiment = store
    run = client.create_run(experiment).info.run_id
    watchdog.mark([run, "owner", "/runs/x"], "KILLED", "Stopped: SIGINT received ...")
    got = client.get_run(run)
    assert got.info.status == "KILLED" and got.data.tags["stopped_by"] == "Stopped: SIGINT received ..."
    failed = client.create_run(experiment).info.run_id
    watchdog.mark([failed, "owner", ""], "FAILED", "Error: peers never joined")
    got = client.get_run(failed)
    assert got.info.status == "FAILED" and got.data.tags["error"] == "Error: peers never joined"


def test_an_attached_task_only_tags_the_run_its_launcher_owns(store):
    client, experiment = store
    run = client.create_run(experiment).info.run_id
    watchdog.mark([run, "attached", ""], "FAILED", "Error: peers never joined")
    got = client.get_run(run)
    assert got.info.status == "RUNNING" and got.data.tags["error"] == "Error: peers never joined"


def test_without_a_run_or_a_store_nothing_is_marked(store, monkeypatch, capsys):
    client, experiment = store
    run = client.create_run(experiment).info.run_id
    watchdog.mark(None, "KILLED", "Stopped")
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    watchdog.mark([run, "owner", ""], "KILLED", "Stopped")
    assert client.get_run(run).info.status == "RUNNING"
    assert capsys.readouterr().err == ""


def test_a_run_the_store_does_not_have_is_reported_not_raised(store, capsys):
    watchdog.mark(["0" * 32, "owner", ""], "KILLED", "Stopped")
    assert "could not mark the MLflow run" in capsys.readouterr().err
