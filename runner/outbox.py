"""Metrics, tags and the final status that MLflow could not take before the run ended, kept on disk.

`<output_dir>/mlflow_outbox.jsonl` holds one JSON record per failed delivery. `python -m runner.deliver <dir>`
sends it once the server is back; a rerun or resume= in that directory does the same before it starts.

Every writer and every delivery holds `flock` on the outbox file itself, so two deliveries started together send each
record once (the second finds the file gone), and a run saving into the outbox never appends to a file that a delivery
has just removed. A line that is not a whole record (cut short by a crash, not text, not an outbox record) is not
guessed at: it is moved, byte for byte, to `mlflow_outbox.jsonl.damaged` beside it, and the whole records are sent.
Records of a run that the store does not have (deleted, or another store) stay in the outbox.
"""

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import tempfile

FILE = "mlflow_outbox.jsonl"
DAMAGED = FILE + ".damaged"
BATCH = 1000  # MLflow's log_batch limit
STATUSES = ("RUNNING", "SCHEDULED", "FINISHED", "FAILED", "KILLED")
_START = b'{"run_id"'  # how every record save() writes begins

log = logging.getLogger("runner")


def path_in(directory: str) -> str:
    return os.path.join(directory, FILE)


def exists(directory: str | None) -> bool:
    return bool(directory) and os.path.isfile(path_in(directory))


@contextlib.contextmanager
def _locked(path: str, mode: str):
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
    with _locked(path, "a") as f:
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


@dataclasses.dataclass
class Delivery:
    """What one delivery did: values and records sent, the damaged lines set aside (and where), the runs the store
    lacks (run id -> why) whose records stay in the outbox, and the error that stopped it part way (None)."""

    path: str
    whole: int = 0  # whole records in the file
    sent: int = 0
    records: int = 0
    damaged: list = dataclasses.field(default_factory=list)
    damaged_path: str | None = None
    missing: dict = dataclasses.field(default_factory=dict)
    kept_values: int = 0
    error: Exception | None = None
    found: bool = True  # False: no outbox (another delivery took it first)

    @property
    def complete(self) -> bool:
        return not (self.damaged or self.missing or self.error)


def run_problem(client, run_id: str) -> str | None:
    """Why `client`'s store cannot take values for `run_id` (not there, or deleted), or None."""
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(run_id)
    except MlflowException as err:
        if getattr(err, "error_code", "") == "RESOURCE_DOES_NOT_EXIST" or "not found" in str(err):
            return "missing"
        raise
    if run.info.lifecycle_stage == "deleted":
        return "deleted"
    return None


def _send(client, record: dict) -> tuple[int, dict | None, Exception | None]:
    """(values sent, what is left of the record when sending stopped part way, the error)."""
    from mlflow.entities import Metric, RunTag

    run_id = record["run_id"]
    tags = [RunTag(k, str(v)) for k, v in record.get("tags", [])]
    metrics = [Metric(k, float(v), int(ts), int(step)) for k, v, ts, step in record.get("metrics", [])]
    i = 0
    try:
        for i in range(0, max(len(metrics), 1), BATCH):
            client.log_batch(run_id, metrics=metrics[i : i + BATCH], tags=tags if i == 0 else [])
        if record.get("status"):
            client.set_terminated(run_id, record["status"])
    except Exception as err:  # the server went away, or refused: keep what it did not take
        left = {**record, "metrics": record.get("metrics", [])[i:], "tags": record.get("tags", []) if i == 0 else []}
        return min(i, len(metrics)), left, err
    return len(metrics), None, None


def _rewrite(path: str, records: list[dict]) -> None:
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


def send(client, directory: str) -> Delivery:
    """Deliver the outbox in `directory` under its lock: every whole record of a run the store has; damaged lines go
    to DAMAGED beside it; what could not be sent stays in the outbox, which is removed once empty."""
    path = path_in(directory)
    result = Delivery(path)
    with _locked(path, "rb") as f:
        if f is None:
            result.found = False
            return result
        records, result.damaged = parse(f.read())
        result.whole = len(records)
        if result.damaged:
            result.damaged_path = os.path.join(directory, DAMAGED)
            with open(result.damaged_path, "ab") as out:  # before the outbox changes: nothing is lost on a crash
                out.write(b"".join(line + b"\n" for _, line, _ in result.damaged))
                out.flush()
                os.fsync(out.fileno())
        kept = []
        for record in records:
            run_id = record["run_id"]
            if result.error is None and run_id not in result.missing:
                try:
                    problem = run_problem(client, run_id)
                except Exception as err:
                    problem, result.error = None, err
                if problem:
                    result.missing[run_id] = problem
            if result.error is not None or run_id in result.missing:
                kept.append(record)
                continue
            sent, left, result.error = _send(client, record)
            result.sent += sent
            result.records += left is None
            if left is not None:
                kept.append(left)
        result.kept_values = sum(len(r.get("metrics", [])) for r in kept)
        _rewrite(path, kept)
    return result


def deliver(client, directory: str) -> int:
    """Send every record of the outbox in `directory`, then remove it. Returns the metric values sent. Damaged lines
    and runs the store lacks are warnings (see `send`); an error that stopped the delivery is raised."""
    result = send(client, directory)
    if result.damaged:
        log.warning(
            "%d line(s) of %s are not whole outbox records (line %d: %s); they are kept in %s and were not sent",
            len(result.damaged),
            result.path,
            result.damaged[0][0],
            result.damaged[0][2],
            result.damaged_path,
        )
    for run_id, why in result.missing.items():
        log.warning(
            "the outbox %s holds values of run %s, which the store has not (%s); they stay in the outbox",
            result.path,
            run_id,
            why,
        )
    if result.error is not None:
        raise result.error
    return result.sent
