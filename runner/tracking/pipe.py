"""The training process's end of runner.mlflow_process.process: a client with MLflow's call names, over a pipe.

`Pipe.spawn(uri)` starts the process at once, so that it imports mlflow and opens the store while this
process does other work (imports TensorFlow). Each call waits for its answer; a call that fails there raises
PipeError (or ConfigError, for what the user has to fix), as MlflowClient's calls raise on a server that is down.
"""

import itertools
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future

from runner.control import contract, procs
from runner.errors import ConfigError

log = logging.getLogger("runner")
CLOSE_WAIT_SEC = 5.0  # after the run has ended, only a call stuck on an unreachable server can still be running


class PipeError(Exception):
    """MLflow did not take a call (a server that is down, or the MLflow process is gone)."""


class Pipe:
    RESTARTS = 3  # a killed MLflow process is started again, this many times in a run

    def __init__(self, uri: str, niceness: int = 0):
        self.uri, self.niceness = uri, niceness
        self._ids, self._waiting, self._lock = itertools.count(1), {}, threading.Lock()
        self.restarts = 0
        self._closing = False
        self.waited_for = False  # training_ended()
        self._start()

    @classmethod
    def spawn(cls, uri: str, niceness: int = 0) -> "Pipe":
        """Start the MLflow process now, so that it imports mlflow while this process goes on; `niceness`: how far
        below normal priority it runs from its start (a sweep's spare: nothing ahead of the job that trains)."""
        return cls(uri, niceness)

    def _start(self) -> None:
        server = os.environ.get(contract.MLFLOW_SERVER)  # a sweep's: an MLflow process forked with mlflow imported
        self.proc = _Forked.connect(server, self.uri, self.niceness) if server else None
        if self.proc is None:
            env = dict(os.environ, MLFLOW_TRACKING_URI=self.uri)  # not in argv, where credentials would show in `ps`
            argv = [sys.executable, "-m", "runner.mlflow_process", str(os.getpid()), str(self.niceness)]
            options = dict(env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
            # It dies with the thread that starts it (procs.popen): only the main thread lives as long as the run. A
            # restart from the sender thread is a plain child, which ends when its stdin closes with this process.
            main = threading.current_thread() is threading.main_thread()
            self.proc = procs.popen(argv, deaf=True, **options) if main else procs.popen_deaf(argv, **options)
        self._gone: str | None = None
        self._reader = threading.Thread(target=self._read, args=(self.proc,), name="mlflow-pipe", daemon=True)
        self._reader.start()

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            try:
                message = json.loads(line)
            except json.JSONDecodeError:  # not ours (a library printing to stdout): pass it on
                sys.stdout.write(line)
                continue
            if "log" in message:
                log.log(*message["log"])
                continue
            with self._lock:
                waiter = self._waiting.pop(message.get("id"), None)
            if waiter is None:
                continue
            if "error" in message:
                waiter.set_exception((ConfigError if message.get("config") else PipeError)(message["error"]))
            else:
                waiter.set_result(message.get("ok"))
        gone = f"the MLflow process (pid {proc.pid}) ended"
        with self._lock:
            if proc is self.proc:
                self._gone = gone
            waiting, self._waiting = self._waiting, {}
        for waiter in waiting.values():
            waiter.set_exception(PipeError(gone))

    def _restart_if_gone(self) -> None:
        """(Under the lock.) A killed MLflow process (the OOM killer, a stray `pkill`) is started again: calls carry
        the run id, so the new one takes over where the old one stopped. Calls in flight then failed and are retried
        by RunLog."""
        if self._gone is None or self._closing or self.restarts >= self.RESTARTS:
            return
        self.restarts += 1
        old = self.proc.pid
        self._start()
        log.warning("the MLflow process (pid %d) ended; started another (pid %d, restart %d/%d)", old, self.proc.pid,
                    self.restarts, self.RESTARTS)  # fmt: skip

    def training_ended(self) -> None:
        """From now on every call is one the command waits for: the MLflow process answers it at normal priority, not
        in its pool below training's (runner.mlflow_process.process)."""
        self.waited_for = True

    def call(self, op: str, timeout: float | None = None, **args):
        """Send one call and wait for its answer (at most `timeout` seconds: then TimeoutError, the call goes on)."""
        return self.submit(op, **args).result(timeout)

    def submit(self, op: str, **args) -> Future:
        """Send one call; its answer (or PipeError / ConfigError) comes in the Future."""
        waiter: Future = Future()
        with self._lock:
            self._restart_if_gone()
            if self._gone:
                raise PipeError(self._gone)
            number = next(self._ids)
            self._waiting[number] = waiter
            try:
                request = {"id": number, "op": op, "args": args, **({"now": True} if self.waited_for else {})}
                self.proc.stdin.write(json.dumps(request) + "\n")
                self.proc.stdin.flush()
            except (OSError, ValueError) as err:  # its stdin is closed: it is gone
                self._waiting.pop(number, None)
                raise PipeError(f"the MLflow process (pid {self.proc.pid}) is gone ({err})") from None
        return waiter

    # MlflowClient's names, with plain lists for entities: [key, value, timestamp, step], [key, value].
    def log_batch(self, run_id: str, metrics=(), tags=(), params=()) -> None:
        self.call(
            "log_batch",
            run_id=run_id,
            metrics=[list(m) for m in metrics],
            tags=[list(t) for t in tags],
            params=[list(p) for p in params],
        )

    def set_terminated(self, run_id: str, status: str) -> None:
        self.call("set_terminated", run_id=run_id, status=status)

    def delete_run(self, run_id: str) -> bool:
        return self.call("delete_run", run_id=run_id)

    def log_artifact(self, run_id: str, path: str, artifact_path: str | None = None) -> None:
        self.call("log_artifact", run_id=run_id, path=os.path.abspath(path), artifact_path=artifact_path)

    def log_text(self, run_id: str, text: str, name: str) -> None:
        self.call("log_text", run_id=run_id, text=text, name=name)

    def start(self, **args) -> dict:
        return self.call("start", **args)

    # The runner's own ops (runner.mlflow_process.ops): datasets, the MLflow model, system metrics.
    def log_inputs(self, run_id: str, datasets: list) -> None:
        self.call("log_inputs", run_id=run_id, datasets=datasets)

    def log_model(self, run_id: str, keras_path: str, **args) -> dict:
        return self.call("log_model", run_id=run_id, keras_path=os.path.abspath(keras_path), **args)

    def stop_system_metrics(self, run_id: str) -> Future:
        """Stop the run's system-metrics monitor (its last point is logged): the answer comes in the Future, so the
        run's own last values can be delivered meanwhile."""
        return self.submit("stop_system_metrics", run_id=run_id)

    def close(self) -> None:
        """End the MLflow process: it finishes the calls it has, then exits (killed if one is stuck)."""
        self._closing = True
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=CLOSE_WAIT_SEC)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=1)


class _Forked:
    """An MLflow process forked for this process by a sweep's server (runner.sweeps.server), over a Unix
    socket: what `Pipe` uses of a Popen (stdin, stdout, pid, poll, wait, kill)."""

    HELLO_WAIT_SEC = 60.0  # the server imports mlflow before it forks the first child

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.stdin = _HalfClosing(sock)
        self._lines = sock.makefile("r", encoding="utf-8")
        self._pid: int | None = None
        self._known = threading.Event()

    @classmethod
    def connect(cls, path: str, uri: str, niceness: int) -> "_Forked | None":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            sock.sendall((json.dumps({"owner": os.getpid(), "niceness": niceness, "uri": uri}) + "\n").encode())
        except OSError:  # the server is gone (the sweep ended, or it was killed): spawn one as usual
            sock.close()
            return None
        return cls(sock)

    @property
    def stdout(self):
        """The MLflow process's lines, after the first, which names it; they end when it does (a process killed with
        a call unread resets the connection: the same end as a pipe's)."""
        try:
            for line in self._lines:
                if self._pid is None:
                    try:
                        self._pid = int(json.loads(line)["pid"])
                    except (ValueError, KeyError, TypeError):
                        self._pid = 0
                    self._known.set()
                    continue
                yield line
        except OSError:
            pass
        finally:
            self._known.set()

    @property
    def pid(self) -> int:
        self._known.wait(self.HELLO_WAIT_SEC)
        return self._pid or 0

    def poll(self) -> int | None:
        return None if self.pid and procs.start_ticks(self.pid) is not None and procs.state(self.pid) != "Z" else 0

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("mlflow process", timeout)
            time.sleep(0.01)
        return 0

    def kill(self) -> None:
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except OSError:
                pass


class _HalfClosing:
    """The socket's sending side as a text stream; close() shuts it down, which the MLflow process reads as the end
    of its stdin, while its answers still come back."""

    def __init__(self, sock: socket.socket):
        self.sock, self._out = sock, sock.makefile("w", encoding="utf-8")

    def write(self, text: str) -> int:
        return self._out.write(text)

    def flush(self) -> None:
        self._out.flush()

    def close(self) -> None:
        try:
            self._out.close()
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
