"""`python -m runner.dashboard` on a store that is not an MLflow SQLite store, given each way the dashboard takes one
(--tracking-uri, MLFLOW_TRACKING_URI, ./mlflow.db), and quiet about `mlflow server`'s security-middleware notice
without hiding its other output (docs/reliability.md). In process: runner.dashboard.main refuses before it starts a
server; one slow test starts the real server."""

import io
import os
import socket
import sqlite3
import time

import pytest

from runner import dashboard


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write(kind, path, template):
    if kind == "text":
        path.write_text("experiment,loss\nrun-1,0.5\n")
    elif kind == "random bytes":
        path.write_bytes(os.urandom(8192))
    elif kind == "directory":
        path.mkdir()
    elif kind == "another program's SQLite":
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE users (id INTEGER)")
    elif kind == "an MLflow store cut in half":
        data = template.read_bytes()
        path.write_bytes(data[: len(data) // 2])


KINDS = ["text", "random bytes", "directory", "another program's SQLite", "an MLflow store cut in half"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("given", ["--tracking-uri", "MLFLOW_TRACKING_URI", "./mlflow.db"])
def test_a_file_that_is_not_a_store_is_refused_before_the_server_starts(
    kind, given, tmp_path, monkeypatch, capsys, migrated_store
):
    store = tmp_path / "mlflow.db"
    write(kind, store, migrated_store)
    before = sorted(os.listdir(tmp_path)), (store.read_bytes() if store.is_file() else None)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    argv = ["--port", str(free_port()), "--start-timeout", "20"]
    if given == "--tracking-uri":
        argv += ["--tracking-uri", f"sqlite:///{store}"]
    elif given == "MLFLOW_TRACKING_URI":
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")
    started = time.monotonic()
    code = dashboard.main(argv)
    out, err = capsys.readouterr()
    assert code == 2, out + err
    assert time.monotonic() - started < 5  # no server started, no MLflow retries
    assert "Starting the MLflow UI" not in out and "Traceback" not in out + err
    assert err.startswith("Error: ") and len(err.strip().splitlines()) == 1, err
    assert str(store) in err and ("MLFLOW_TRACKING_URI" if given == "MLFLOW_TRACKING_URI" else "--tracking-uri") in err
    assert (sorted(os.listdir(tmp_path)), store.read_bytes() if store.is_file() else None) == before  # untouched


def test_a_store_under_a_missing_directory_is_refused(tmp_path, capsys):
    code = dashboard.main(["--tracking-uri", f"sqlite:///{tmp_path}/no/such/mlflow.db", "--port", str(free_port())])
    assert code == 2 and "its directory" in capsys.readouterr().err and not (tmp_path / "no").exists()


@pytest.mark.parametrize("state", ["missing", "empty", "an MLflow store"])
def test_a_fresh_or_real_store_is_served(state, tmp_path, migrated_store):
    store = tmp_path / "mlflow.db"
    if state == "empty":
        store.write_bytes(b"")
    elif state == "an MLflow store":
        store.write_bytes(migrated_store.read_bytes())
    assert dashboard.store_problem(f"sqlite:///{store}", "--tracking-uri") is None


def test_only_the_security_middleware_notice_is_left_out_of_the_servers_output():
    server = (
        b"[MLflow] Security middleware enabled with default settings (localhost-only). To allow connections from "
        b"other hosts, use --host 0.0.0.0 and configure --allowed-hosts and --cors-allowed-origins.\n"
        b"[MLflow] WARNING: Security middleware is DISABLED. Your MLflow server is vulnerable to various attacks.\n"
        b"Traceback (most recent call last):\n"
        b"sqlalchemy.exc.OperationalError: (sqlite3.OperationalError) database is locked\n"
        b"a last line without its newline"
    )
    sink = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    dashboard.forward(io.BytesIO(server), sink)
    sink.flush()
    shown = sink.buffer.getvalue()
    assert b"enabled with default settings" not in shown
    assert shown == server.split(b"\n", 1)[1]  # everything else, as it came
