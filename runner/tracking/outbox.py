"""Metrics, tags and the final status that MLflow could not take before the run ended, kept on disk.

`<output_dir>/mlflow_outbox.jsonl` holds one JSON record per failed delivery (written here, in the training
process; sent by `runner.mlflow_process.delivery`, where mlflow is imported). `python -m runner.deliver <dir>`
sends it once the server is back; a rerun or resume= in that directory does the same before it starts.

Every writer and every delivery holds `flock` on the outbox file itself, so two deliveries started together send each
record once (the second finds the file gone), and a run saving into the outbox never appends to a file that a delivery
has just removed. A line that is not a whole record (cut short by a crash, not text, not an outbox record) is not
guessed at: it is moved, byte for byte, to `mlflow_outbox.jsonl.damaged` beside it, and the whole records are sent.
Records of a run that the store does not have (deleted, or another store) stay in the outbox.
"""

import contextlib
import fcntl
import json
import logging
import os
import tempfile

from runner.config import layout

FILE = layout.OUTBOX_FILE
DAMAGED = FILE + ".damaged"
STATUSES = ("RUNNING", "SCHEDULED", "FINISHED", "FAILED", "KILLED")
_START = b'{"run_id"'  # how every record save() writes begins

log = logging.getLogger("runner")


def path_in(directory: str) -> str:
    return os.path.join(directory, FILE)


def exists(directory: str | None) -> bool:
    return bool(directory) and os.path.isfile(path_in(directory))


@contextlib.contextmanager
def locked(path: str, mode: str):
    """The file at `path` opened with `mode` and held under flock: the file that is at `path` once the lock is held
    (a delivery may have removed or replaced the one opened first). None when there is none (mode "rb")."""
    while True:
        try:
            f = open(path, mode)
        except FileNotFoundError:
            yield None
            return
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            same = os.path.samestat(os.fstat(f.fileno()), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            break
        f.close()
    try:
        yield f
    finally:
        f.close()


def save(directory: str, run_id: str, metrics: list, tags: list, status: str | None) -> str:
    os.makedirs(directory, exist_ok=True)
    record = {
        "run_id": run_id,
        "metrics": [list(m) for m in metrics],  # (key, value, timestamp, step) tuples
        "tags": [list(t) for t in tags],  # (key, value) pairs
        "status": status,
    }
    path = path_in(directory)
    with locked(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return path


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def record_problem(record) -> str | None:
    """Why a decoded line is not an outbox record as save() writes it, or None."""
    if not isinstance(record, dict) or not isinstance(record.get("run_id"), str) or not record["run_id"]:
        return "it has no run_id"
    metrics, tags, status = record.get("metrics", []), record.get("tags", []), record.get("status")
    if not isinstance(metrics, list) or not all(
        isinstance(m, list) and len(m) == 4 and isinstance(m[0], str) and _number(m[1]) and _number(m[2]) and _number(m[3])
        for m in metrics
    ):
        return "its metrics are not [key, value, timestamp, step] lists"
    if not isinstance(tags, list) or not all(isinstance(t, list) and len(t) == 2 and isinstance(t[0], str) for t in tags):
        return "its tags are not [key, value] pairs"
    if status is not None and status not in STATUSES:
        return f"its status {status!r} is not one of {', '.join(STATUSES)}"
    return None


def _line_problem(line: bytes) -> tuple[object, str | None]:
    """(the record, None) for a whole record, else (None, why not)."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as err:
        return None, f"it is not text (byte 0x{line[err.start]:02x} at column {err.start + 1})"
    try:
        record = json.loads(text)
    except json.JSONDecodeError as err:
        if not text.rstrip().endswith("}"):
            return None, "it is cut short (a record ends with '}')"
        return None, f"it is not JSON ({err.msg} at column {err.colno})"
    return record, record_problem(record)


def parse(data: bytes) -> tuple[list[dict], list[tuple[int, bytes, str]]]:
    """(the whole records, the damaged lines as (line number, bytes, why)) of an outbox's bytes. A line on which a
    record cut short by a crash runs into the next one's start gives that next record too."""
    records, damaged = [], []
    for number, line in enumerate(data.split(b"\n"), start=1):
        if not line.strip():
            continue
        record, why = _line_problem(line)
        if why is None:
            records.append(record)
            continue
        at = line.find(_START, 1)
        while at > 0:  # the next record, written after the cut one
            following, problem = _line_problem(line[at:])
            if problem is None:
                records.append(following)
                line = line[:at]
                why = _line_problem(line)[1] or "it is cut short"
                break
            at = line.find(_START, at + 1)
        damaged.append((number, line, why))
    return records, damaged


def rewrite(path: str, records: list[dict]) -> None:
    """Replace the outbox by `records` (atomically: a crash leaves the old or the new file), or remove it."""
    if not records:
        os.remove(path)
        return
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".mlflow_outbox.")
    with os.fdopen(fd, "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
