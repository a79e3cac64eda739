"""An SQLite MLflow store checked from the file system alone, before MLflow or TensorFlow starts: where its file
is, whether it is an SQLite database, MLflow's or another program's, and whether this user can write it. No mlflow
here: `runner.mlflow_process.store` opens the store once these checks pass.
"""

import contextlib
import os
import tempfile

from runner.errors import ConfigError


def sqlite_path(uri: str) -> str | None:
    """The database file of a sqlite:/// URI (None for other URIs and for in-memory SQLite)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///") :].split("?", 1)[0]
    return os.path.abspath(path) if path and path != ":memory:" else None


def damaged(path: str, why: str) -> ConfigError:
    return ConfigError(
        f"the MLflow store {path} cannot be used: {why}. Nothing was trained. Move it away (mv {path} {path}.broken) "
        "and the next run creates a fresh store there, or point mlflow.tracking_uri / MLFLOW_TRACKING_URI at another "
        "store (or set mlflow.enabled=false)."
    )


MLFLOW_TABLES = {"experiments", "runs", "alembic_version"}  # any of them: a store MLflow made (or half made)


def other_programs_tables(path: str) -> str:
    """The first tables of an SQLite file that holds tables but none of MLflow's ('' for an MLflow store, an empty
    database, or one that cannot be read: those are told apart where the store is opened). Read only."""
    import sqlite3

    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.Error:
        return ""
    if not tables or MLFLOW_TABLES & tables:
        return ""
    return ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")


def check_sqlite(path: str, key: str = "mlflow.tracking_uri / MLFLOW_TRACKING_URI") -> None:
    """A ConfigError when the SQLite store at `path` cannot work, found from the file system alone (no MLflow, no
    TensorFlow: preflight asks before either starts). A store MLflow cannot write would otherwise be refused only
    after its engine has retried with doubling waits (0.1 s to 51 s): 105-113 s."""
    if os.path.isdir(path):
        raise ConfigError(
            f"the MLflow store {path} is a directory, not an SQLite file. Point {key} at a file (sqlite:///<dir>/mlflow.db)."
        )
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        raise ConfigError(
            f"the MLflow store {path} cannot be created: its directory {directory} does not "
            f"exist. Create it, or point {key} at another file."
        )
    if os.path.isfile(path) and os.path.getsize(path) > 0:
        with open(path, "rb") as f:
            if f.read(16) != b"SQLite format 3\x00":
                raise damaged(path, "it is not an SQLite database")
        tables = other_programs_tables(path)
        if tables:
            raise ConfigError(
                f"the MLflow store {path} is an SQLite database of another program (its tables: {tables}), not an "
                f"MLflow store; MLflow would add its own tables to it, so it was not opened and nothing was trained. "
                f"Point {key} at an MLflow store (sqlite:///<dir>/mlflow.db), or at a new file."
            )
    try:  # SQLite writes its journal beside the file, so the directory must take files even when the store exists
        tempfile.NamedTemporaryFile(dir=directory, prefix=".write-probe-").close()
        problem = None
    except OSError as err:
        problem = f"its directory {directory} cannot be written ({err.strerror or err})"
    if problem is None and os.path.isfile(path):
        try:
            open(path, "r+b").close()  # opened for writing, nothing written
        except OSError as err:
            problem = f"the file cannot be written ({err.strerror or err})"
    if problem:
        raise ConfigError(
            f"the MLflow store {path} cannot be used: {problem}. Nothing was trained. Point {key} at a store in a "
            "directory this user can write (sqlite:///<dir>/mlflow.db), or set mlflow.enabled=false to train without "
            "tracking."
        )
