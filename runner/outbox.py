"""Metrics, tags and the final status that MLflow could not take before the run ended, kept on disk.

`<output_dir>/mlflow_outbox.jsonl` holds one JSON record per failed delivery. `python -m runner.deliver <dir>`
sends it once the server is back; a rerun or resume= in that directory does the same before it starts.
"""

import json
import os

FILE = "mlflow_outbox.jsonl"
BATCH = 1000  # MLflow's log_batch limit


def path_in(directory: str) -> str:
    return os.path.join(directory, FILE)


def exists(directory: str | None) -> bool:
    return bool(directory) and os.path.isfile(path_in(directory))


def save(directory: str, run_id: str, metrics: list, tags: list, status: str | None) -> str:
    os.makedirs(directory, exist_ok=True)
    record = {
        "run_id": run_id,
        "metrics": [list(m) for m in metrics],  # (key, value, timestamp, step) tuples
        "tags": [list(t) for t in tags],  # (key, value) pairs
        "status": status,
    }
    path = path_in(directory)
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return path


def deliver(client, directory: str) -> int:
    """Send every record of the outbox in `directory`, then remove it. Returns the metric values sent."""
    from mlflow.entities import Metric, RunTag

    path, sent = path_in(directory), 0
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    for record in records:
        run_id = record["run_id"]
        tags = [RunTag(k, v) for k, v in record["tags"]]
        metrics = [Metric(k, v, ts, step) for k, v, ts, step in record["metrics"]]
        for i in range(0, max(len(metrics), 1), BATCH):
            client.log_batch(run_id, metrics=metrics[i : i + BATCH], tags=tags if i == 0 else [])
        sent += len(metrics)
        if record.get("status"):
            client.set_terminated(run_id, record["status"])
    os.remove(path)
    return sent
