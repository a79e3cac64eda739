"""Delivery to MLflow of what the training process kept on disk: the outbox (values MLflow could not take before the
run ended) and the journal (every value, in case the training process was killed). Runs in the MLflow process and in
`python -m runner.deliver`; the files' formats and their writers are runner.tracking's `outbox` and `journal`.
"""

import dataclasses
import logging
import os

from runner.tracking import journal, outbox

BATCH = 1000  # MLflow's log_batch limit

log = logging.getLogger("runner")


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


def send_outbox(client, directory: str) -> Delivery:
    """Deliver the outbox in `directory` under its lock: every whole record of a run the store has; damaged lines go
    to outbox.DAMAGED beside it; what could not be sent stays in the outbox, which is removed once empty."""
    path = outbox.path_in(directory)
    result = Delivery(path)
    with outbox.locked(path, "rb") as f:
        if f is None:
            result.found = False
            return result
        records, result.damaged = outbox.parse(f.read())
        result.whole = len(records)
        if result.damaged:
            result.damaged_path = os.path.join(directory, outbox.DAMAGED)
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
        outbox.rewrite(path, kept)
    return result


def deliver_outbox(client, directory: str) -> int:
    """Send every record of the outbox in `directory`, then remove it. Returns the metric values sent. Damaged lines
    and runs the store lacks are warnings (see `send_outbox`); an error that stopped the delivery is raised."""
    result = send_outbox(client, directory)
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


def deliver_journal(client, run_id: str, directory: str) -> tuple[int, int | None]:
    """Send what a journal left behind holds beyond its last delivery, then remove it (a journal with damaged lines
    besides a last one cut by the kill is kept as mlflow_journal.jsonl.damaged instead). Returns (values sent, the
    largest step it held)."""
    from mlflow.entities import Metric

    rows, last_step = journal.read(directory)
    for i in range(0, len(rows), BATCH):
        client.log_batch(run_id, metrics=[Metric(k, v, ts, step) for k, v, ts, step in rows[i : i + BATCH]])
    if os.path.isfile(journal.path_in(directory)):
        if journal.scan(directory)[3]:
            os.replace(journal.path_in(directory), os.path.join(directory, journal.DAMAGED))
        else:
            os.remove(journal.path_in(directory))
    return len(rows), last_step
