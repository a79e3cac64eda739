"""`python -m runner.dashboard`: the MLflow UI for the runner's store, on 127.0.0.1.

Starts `mlflow server` with one worker and no job execution (up several times faster, in a fraction of the
memory: docs/dev/benchmarks.md) in its own process group, waits until its /health answers, then prints the address of the
model-training view (MLflow 3 opens experiments in a GenAI view). Quiet by default: no line per HTTP request,
no deprecation warnings from the server's libraries, and not `mlflow server`'s start-up notice about its security
middleware (the defaults, localhost only); every other line the server writes comes through (--verbose shows all).

A local SQLite store is checked before the server starts: a directory, a file that is not an SQLite database, or an
SQLite database of another program is refused (exit 2, nothing written to it) instead of MLflow's traceback or its
minutes of retries. A file that does not exist yet, or an empty one, becomes a fresh store, as with the runner.
"""

import argparse
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request

from runner.preflight import sqlite_store

VIEW = "#/experiments?workflowType=machine_learning"
QUIET_UVICORN = "--no-access-log --log-level warning"  # uvicorn's own flags, passed through `mlflow server`


def server_command(uri: str, host: str, port: int, verbose: bool = False):
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        uri,
        "--registry-store-uri",
        uri,
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    return cmd if verbose else cmd + ["--uvicorn-opts", QUIET_UVICORN]


def server_env(verbose: bool = False) -> dict:
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    if not verbose:
        # Starlette's deprecation warning is a UserWarning subclass: only a plain "ignore" silences it.
        env.update(PYTHONWARNINGS="ignore", MLFLOW_LOGGING_LEVEL="WARNING")
    return env


# `mlflow server` prints this with click.echo (not through logging: MLFLOW_LOGGING_LEVEL does not reach it) whenever
# --allowed-hosts and --cors-allowed-origins are left at their defaults; the dashboard always leaves them so.
# "Security middleware is DISABLED" (a warning) starts otherwise and still comes through.
QUIET_LINES = (b"[MLflow] Security middleware enabled with default settings",)


def forward(source, sink, drop=QUIET_LINES) -> None:
    """Copy the server's output `source` (bytes) to `sink` (a text stream) line by line as it comes, except lines
    starting with `drop`."""
    raw = getattr(sink, "buffer", None)
    for line in iter(source.readline, b""):
        if line.lstrip().startswith(drop):
            continue
        if raw is not None:
            sink.flush()
            raw.write(line)
            raw.flush()
        else:
            sink.write(line.decode("utf-8", "replace"))
            sink.flush()
    source.close()


def store_problem(uri: str, source: str, key: str = "--tracking-uri"):
    """Why the SQLite store `uri` (given by `source`) cannot be shown, from the file alone, or None; `key` is what to
    change. Nothing is written."""
    path = sqlite_store.sqlite_path(uri)
    if path is None:
        return None
    instead = (
        f"Point {key} at the mlflow.db that python -m runner wrote (sqlite:///<dir>/mlflow.db; by default in the "
        "directory it was started from)"
    )
    if os.path.isdir(path):
        inside = os.path.join(path, "mlflow.db")
        hint = f": --tracking-uri sqlite:///{inside}" if os.path.isfile(inside) else ""
        return f"the MLflow store {path} ({source}) is a directory, not an SQLite file. {instead}{hint}."
    if not os.path.exists(path):
        directory = os.path.dirname(path)
        if not os.path.isdir(directory):
            return f"the MLflow store {path} ({source}) cannot be created: its directory {directory} does not exist. {instead}."
        return None  # a fresh store, as `python -m runner` would make
    if not os.path.isfile(path):
        return f"the MLflow store {path} ({source}) is not a regular file. {instead}."
    try:
        with open(path, "rb") as f:
            head = f.read(100)
    except OSError as err:
        return f"the MLflow store {path} ({source}) cannot be read ({err.strerror or err}). {instead}, or make it readable."
    if not head:
        return None  # empty: MLflow makes a fresh store in it
    if not head.startswith(b"SQLite format 3\x00"):
        return (
            f"the MLflow store {path} ({source}) is not an SQLite database (it starts with {head[:16]!r}), so it is not "
            f"an MLflow store; it was not changed. {instead}."
        )
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.Error as err:
        return (
            f"the MLflow store {path} ({source}) cannot be read as an SQLite database ({err}); it was not changed. "
            f"Move it away (mv {path} {path}.broken) and the next run creates a fresh store, or "
            f"{instead[0].lower()}{instead[1:]}."
        )
    if tables and not sqlite_store.MLFLOW_TABLES & tables:
        listed = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
        return (
            f"the MLflow store {path} ({source}) is an SQLite database of another program (its tables: {listed}), not "
            f"an MLflow store; MLflow would add its own tables to it, so it was not opened. {instead}."
        )
    return None


def probe_address(host: str, port: int) -> str:
    """Where to ask for /health: this machine when the server listens on every interface."""
    if host in ("", "0.0.0.0", "::", "localhost"):
        host = "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def port_problem(host: str, port: int):
    """Why the server could not bind host:port (checked first: its own error comes only after its start-up)."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: TIME_WAIT is no conflict
            sock.bind((host, port))
    except OSError as err:
        return err.strerror or str(err)
    return None


def wait_until_up(proc: subprocess.Popen, base: str, timeout: float) -> str:
    """'up' once GET /health answers 200, 'exited' if the server process ended first, else 'timeout'."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            return "exited"
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as response:
                if response.status == 200:
                    return "up"
        except OSError:
            pass
        if time.monotonic() > deadline:
            return "timeout"
        time.sleep(0.2)


def stop_group(proc: subprocess.Popen, grace: float = 15.0) -> None:
    """SIGTERM the server's whole process group (mlflow's CLI and its uvicorn), SIGKILL what outlives `grace`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader, so that only live members keep the group alive
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
    proc.wait()


class _Stop(Exception):
    def __init__(self, signum: int):
        self.exit_code = 128 + signum


def main(argv=None) -> int:
    from runner.config.redact import redact_uri
    from runner.tracking.run import resolve_tracking_uri

    parser = argparse.ArgumentParser(prog="python -m runner.dashboard", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tracking-uri", default=None, help="store to show (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument(
        "--start-timeout",
        type=float,
        default=120.0,
        metavar="SEC",
        help="give up if the server does not answer within SEC seconds (default 120)",
    )
    parser.add_argument(
        "--verbose", action="store_true", help="show the server's own output: a line per HTTP request, start-up logs, warnings"
    )
    args = parser.parse_args(argv)
    from runner.errors import ConfigError

    try:
        uri = args.tracking_uri or resolve_tracking_uri(None)
    except ConfigError as err:  # ./mlruns of an older MLflow: the migration command
        print(f"Error: {err}", file=sys.stderr)
        return err.exit_code
    if uri.startswith("http"):
        print(f"{redact_uri(uri)} is already an MLflow server: open {redact_uri(uri)}/{VIEW}")
        return 0
    if args.tracking_uri:
        source, key = "--tracking-uri", "--tracking-uri"
    elif os.environ.get("MLFLOW_TRACKING_URI"):
        source, key = "MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_URI (or --tracking-uri)"
    else:
        source, key = f"the default, sqlite:///mlflow.db in {os.getcwd()}", "--tracking-uri"
    problem = store_problem(uri, source, key)
    if problem:
        print(f"Error: {problem}", file=sys.stderr)
        return 2

    problem = port_problem(args.host, args.port)
    if problem:
        print(
            f"Error: cannot serve on {args.host}:{args.port} ({problem}). Pass another --port, e.g. --port {args.port + 1}.",
            file=sys.stderr,
        )
        return 2

    def stop(signum, _frame):
        raise _Stop(signum)

    address, proc, relay = f"http://{args.host}:{args.port}", None, None
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        # Ctrl-C and `kill` both stop the server: it runs in its own session, so the terminal's Ctrl-C reaches only
        # this process, which then stops the server's whole process group (in `finally`).
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        print(f"Starting the MLflow UI for {redact_uri(uri)} ...", flush=True)  # the address only once it answers
        proc = subprocess.Popen(
            server_command(uri, args.host, args.port, args.verbose),
            env=server_env(args.verbose),
            start_new_session=True,
            stderr=None if args.verbose else subprocess.PIPE,
        )
        if proc.stderr is not None:
            relay = threading.Thread(target=forward, args=(proc.stderr, sys.stderr), name="mlflow-server-output", daemon=True)
            relay.start()
        state = wait_until_up(proc, probe_address(args.host, args.port), args.start_timeout)
        if state == "exited":
            if relay is not None:
                relay.join(5)  # its last lines first: the message says they are above
            print(
                f"Error: the MLflow server exited (code {proc.returncode}) before it answered on {address}; its output is above.",
                file=sys.stderr,
            )
            return proc.returncode or 1
        if state == "timeout":
            print(
                f"Error: the MLflow server did not answer on {address} within {args.start_timeout:g} s; stopped it. "
                "Retry with --start-timeout 300, or --verbose to see its output.",
                file=sys.stderr,
            )
            return 1
        print(f"MLflow UI: {address}/{VIEW} (Ctrl-C stops it)", flush=True)
        proc.wait()
        if relay is not None:
            relay.join(5)
        print(f"Error: the MLflow server exited (code {proc.returncode}).", file=sys.stderr)
        return proc.returncode or 1
    except _Stop as stopped:
        return stopped.exit_code
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if proc is not None:
            stop_group(proc)
        signal.signal(signal.SIGINT, handlers[0])
        signal.signal(signal.SIGTERM, handlers[1])


if __name__ == "__main__":
    sys.exit(main())
