"""The sweep's MLflow server: one process imports mlflow (and matplotlib, for the report) once, and forks each job
an MLflow process ready to serve, and the report's process at the end. `python -m runner.sweeps.server FD`, FD a
listening Unix socket the sweep bound; `MlflowServer` is the sweep's side.

Every training process has an MLflow process of its own (runner.mlflow_process.process), which imports mlflow and
SQLAlchemy's store first: seconds of CPU per job, which a sweep of short jobs paid again and again on the cores its
jobs train on, and once more for the report. A job's `Pipe` connects to the socket (RUNNER_MLFLOW_SERVER, in a
directory only this user can enter: the store's credentials are in the environment) and says who it is,
{"owner": pid, "niceness": n, "uri": store}; the server forks, and the child says {"pid": its pid} and serves that
connection as a spawned MLflow process serves its pipe, ending when the job closes it or dies. The sweep asks for
its report the same way, {"report": write_report's arguments, "result": path}: the child writes it, its lines
come back on the connection, and the failed jobs (or the error that stopped it) go to `result` as JSON. The
server opens no store itself: each child opens its own, after the fork.

It ignores SIGINT and SIGTERM like an MLflow process, ends when its stdin closes (the sweep ended) and dies with
the sweep (runner.control.procs); its children go on serving the jobs that connected.
"""

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

from runner.control import procs


class MlflowServer:
    """The sweep's side of its MLflow server (`main`, a process of its own): each job's MLflow process, and the
    report's, is forked from it with mlflow already imported, instead of importing it again; its socket is in a
    directory of this user's only."""

    def __init__(self, env: dict):
        self.dir = tempfile.mkdtemp(prefix="runner-mlflow-")
        self.path = os.path.join(self.dir, "mlflow.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.path)  # here: a job that connects before the server has started waits in the backlog
        listener.listen(16)
        argv = [sys.executable, "-m", "runner.sweeps.server", str(listener.fileno())]
        try:
            self.proc = procs.popen(argv, deaf=True, env=env, stdin=subprocess.PIPE, pass_fds=(listener.fileno(),))
        finally:
            listener.close()

    def stop(self) -> None:
        """No job connects any more (those that did keep their MLflow processes until they end)."""
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def report(self, report: dict, result: str) -> list[str] | None:
        """The report (write_report's arguments), written by a process forked from the server, its lines passed on;
        the failed jobs, or None when the server is gone or could not write it (then the sweep writes it itself)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.path)
            sock.sendall((json.dumps({"report": report, "result": result}) + "\n").encode())
            sock.shutdown(socket.SHUT_WR)
            for line in sock.makefile("r", encoding="utf-8"):
                sys.stdout.write(line)
            with open(result) as f:
                return json.load(f)["failed"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        finally:
            sock.close()


def _hello(conn: socket.socket) -> dict | None:
    line = b""
    while not line.endswith(b"\n"):  # a byte at a time: what follows the hello is the MLflow process's to read
        byte = conn.recv(1)
        if not byte:
            return None
        line += byte
    return json.loads(line)


def _report(request: dict) -> None:
    from runner.sweeps.report import write_report

    try:
        outcome = {"failed": write_report(**request["report"])}
    except Exception as err:  # written again by the sweep's process, which then says what is wrong
        outcome = {"error": f"{type(err).__name__}: {err}"}
    with open(request["result"], "w") as f:
        json.dump(outcome, f)


def _serve_connection(conn: socket.socket) -> None:
    """In the forked child: the connection becomes stdin and stdout, and the MLflow process (or the report) runs
    on it."""
    hello = _hello(conn)
    if hello is None:
        return
    os.dup2(conn.fileno(), 0)
    os.dup2(conn.fileno(), 1)
    conn.close()
    sys.stdin = open(0, encoding="utf-8", closefd=False)
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
    if "report" in hello:
        _report(hello)
        sys.stdout.flush()
        return
    sys.stdout.write(json.dumps({"pid": os.getpid()}) + "\n")
    sys.stdout.flush()
    if hello.get("uri"):
        os.environ["MLFLOW_TRACKING_URI"] = hello["uri"]
    from runner.mlflow_process.process import main as serve

    serve([str(int(hello.get("owner", 0))), str(int(hello.get("niceness", 0)))])  # ends with os._exit


def main(argv) -> None:
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the children are reaped by the kernel as they end
    listener = socket.socket(fileno=int(argv[0]))  # bound and listening: a job that connects now waits in the backlog
    try:  # one thread only, before any fork: a child must not inherit an import lock some thread holds
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: F401
        import mlflow  # noqa: F401
        import mlflow.store.tracking.sqlalchemy_store  # noqa: F401

        from runner.mlflow_process import process  # noqa: F401
        from runner.sweeps import report  # noqa: F401
    except Exception:  # noqa: S110  (each child imports again, and answers with what is wrong)
        pass
    while True:
        readable, _, _ = select.select([listener, sys.stdin], [], [])
        if sys.stdin in readable and not os.read(sys.stdin.fileno(), 1):
            break  # the sweep ended
        if listener in readable:
            conn, _ = listener.accept()
            if os.fork() == 0:
                listener.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                try:
                    _serve_connection(conn)
                finally:
                    os._exit(0)
            conn.close()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
