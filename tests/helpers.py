"""Helpers shared by the tests: run the real runner as a subprocess (one process per experiment, as TensorFlow's
logical devices require) against a throw-away MLflow store, follow a run's output live, start a real MLflow
server, and read the results back. Fixtures are in conftest.py."""

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Small and quick, but enough steps that a loss has room to fall.
FAST = [
    "data.num_examples=512",
    "data.eval_examples=128",
    "train.epochs=2",
    "train.global_batch_size=64",
    "train.log_every_n_steps=1",
    "train.optimizer.learning_rate=0.3",
]


@dataclass
class Completed:
    args: list
    returncode: int
    stdout: str
    stderr: str
    run_dir: Path

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def run_runner(args, cwd, run_dir, tracking_uri=None, env_extra=None, timeout=300) -> Completed:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(PYTHONUNBUFFERED="1", **(env_extra or {}))
    argv = [sys.executable, "-m", "runner", *args, f"hydra.run.dir={run_dir}"]
    if tracking_uri:
        argv.append(f"mlflow.tracking_uri={tracking_uri}")
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return Completed(list(args), proc.returncode, proc.stdout, proc.stderr, Path(run_dir))


def mlflow_run_by_name(uri, experiment, name):
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no MLflow experiment {experiment!r}"
    found = client.search_runs([exp.experiment_id], filter_string=f"attributes.run_name = '{name}'")
    assert len(found) == 1, f"expected one run named {name!r}, found {len(found)}"
    return client, found[0]


def leftover_processes(marker_env="RUNNER_LAUNCH_ID"):
    """PIDs of processes that still carry a launcher's marker in their environment."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker_env.encode() + b"=" in f.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


class LiveRun:
    """A runner process whose merged output is read line by line while it runs."""

    def __init__(self, args, cwd, run_dir, tracking_uri):
        import queue
        import threading

        env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
        env["PYTHONUNBUFFERED"] = "1"
        argv = [sys.executable, "-m", "runner", *args, f"hydra.run.dir={run_dir}", f"mlflow.tracking_uri={tracking_uri}"]
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines, self._queue = [], queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self._queue.put(line)
        self._queue.put(None)

    def wait_for(self, predicate, timeout):
        """The first line for which predicate(line) is true; fails after timeout seconds."""
        import queue
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            self.lines.append(line)
            if predicate(line):
                return line
        raise AssertionError("expected line never came; output:\n" + "".join(self.lines[-60:]))

    def finish(self, timeout):
        """(exit code, whole output)."""
        code = self.proc.wait(timeout=timeout)
        while True:
            line = self._queue.get(timeout=10)
            if line is None:
                break
            self.lines.append(line)
        return code, "".join(self.lines)


class MlflowServer:
    """A real `mlflow server` on 127.0.0.1 over an SQLite store, which tests stop and start again mid-run."""

    def __init__(self, root: Path):
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.root, self.proc = root, None
        self.uri = f"http://127.0.0.1:{self.port}"

    def start(self, timeout=60):
        import time
        import urllib.request

        env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mlflow",
                "server",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                "1",
                "--backend-store-uri",
                f"sqlite:///{self.root}/server.db",
                "--default-artifact-root",
                str(self.root / "artifacts"),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2):
                    return self
            except OSError:
                time.sleep(0.3)
        raise AssertionError("mlflow server did not come up")

    def stop(self):
        import signal

        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # gone at once, as a crashed server would be
            self.proc.wait()


def serve_and_predict(argv, cwd, env, inputs, log_path, timeout=150):
    """Start `mlflow models serve ...` (argv, its port from `-p`) in its own process group, wait for /ping, POST
    {"inputs": inputs} to /invocations, and stop the whole group whatever happens. Returns (answer, pids left alive)."""
    import json
    import signal
    import time
    import urllib.request

    port = argv[argv.index("-p") + 1]
    with open(log_path, "w") as log:
        server = subprocess.Popen(argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + timeout
            while True:
                assert server.poll() is None, Path(log_path).read_text()[-3000:]
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                assert time.monotonic() < deadline, f"mlflow models serve did not answer /ping in {timeout} s"
                time.sleep(0.5)
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/invocations",
                data=json.dumps({"inputs": inputs}).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=60) as r:
                answer = json.loads(r.read())
        finally:
            for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
                try:
                    os.killpg(server.pid, sig)
                except ProcessLookupError:
                    break
                stop_at = time.monotonic() + wait
                while live_group_members(server.pid) and time.monotonic() < stop_at:
                    server.poll()
                    time.sleep(0.2)
                if not live_group_members(server.pid):
                    break
    return answer, live_group_members(server.pid)


def live_group_members(pgid: int) -> list[int]:
    """Processes of a process group that are not zombies (a container's init may leave those unreaped)."""
    live = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                live.append(int(entry))
    return live


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
