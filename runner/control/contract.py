"""What a runner process tells the runner processes it starts: environment variables, and how they are started.

The launcher (cluster=localhost) and the sweep start `python -m runner` children; every process that trains
may start a sentinel (runner.control.watchdog) and an MLflow process (runner.mlflow_process.process). They pass state by
environment only, never on the command line, where `ps` shows it to everyone:

- `TF_CONFIG` (launcher -> task): its cluster and its task in it, read by TensorFlow's resolver.
- `RUNNER_MLFLOW_RUN_ID` (launcher -> task: tracking, app, evaluator): log into this run; the launcher ends it.
- `RUNNER_LAUNCH_ID` (launcher -> every task): marks the processes of one launch (tests look for leftovers).
- `RUNNER_TASK_ROLE` (launcher, read back by it): trainer, server or evaluator (runner.config.layout).
- `RUNNER_PARENT_RUN_FILE` (sweep -> job: its MLflow process): nest the job's run under the sweep's run, whose id
  this file holds once created; beside it the sweep's request for that run, so that the first job's MLflow process
  (mlflow loaded already) creates it.
- `RUNNER_SWEEP_JOB` (sweep -> job: tracking, app): the job's number; a job never starts a sweep of its own.
- `RUNNER_SWEPT_KEYS` (sweep -> its task functions): the keys that differ between jobs, as JSON;
  `RUNNER_RUN_NAME` (sweep -> job: tracking): the job's child run name, its values of those keys
  (runner.sweeps.run_names).
- `RUNNER_RETRY` (sweep -> job: tracking): this attempt of a job that ended by a fault (sweep.retries), tagged
  `sweep.retry` on its run.
- `RUNNER_PRUNE` (sweep -> job: executors): the search prunes (sweep.pruner): evaluate after each epoch and report
  to the sweep (runner.control.trial_report).
- `RUNNER_SWEEP_SIZE` (sweep -> its task functions): how many jobs the sweep has ("?" when it cannot be told).
- `RUNNER_SPARE` (sweep -> the next job's process, started ahead): import, then wait for the job's overrides and
  environment on stdin (runner.sweeps.spares).
- `RUNNER_MLFLOW_SERVER` (sweep -> job: tracking): the socket of the sweep's MLflow server, which forks each job
  an MLflow process with mlflow already imported (runner.sweeps.server).
- `RUNNER_SPARE_FILE` (sweep -> job): where the sweep names that spare, for the job to hold it still while its
  training is timed (runner.control.ahead).
- `MLFLOW_TRACKING_URI` (launcher, sweep, tracking, stopping -> children, the MLflow process, the watchdog): the
  store, which may hold credentials.
"""

import json
import os
import subprocess
import sys

from runner.control import procs

ATTACH_RUN = "RUNNER_MLFLOW_RUN_ID"
NO_RUN = "-"  # ATTACH_RUN of a launched task with mlflow.enabled=false: launched, no run to attach to
LAUNCH_ID = "RUNNER_LAUNCH_ID"
TASK_ROLE = "RUNNER_TASK_ROLE"
ELASTIC = "RUNNER_ELASTIC"  # set by the elastic launcher: a task that loses a peer is restarted, not the user's to resume
LOGGED_THROUGH = "RUNNER_LOGGED_THROUGH"  # elastic: the steps an earlier generation logged, not logged again
PARENT_RUN_FILE = "RUNNER_PARENT_RUN_FILE"
SWEEP_JOB = "RUNNER_SWEEP_JOB"
PRUNE = "RUNNER_PRUNE"
RETRY = "RUNNER_RETRY"
RUN_NAME = "RUNNER_RUN_NAME"
SWEPT_KEYS = "RUNNER_SWEPT_KEYS"
SWEEP_SIZE = "RUNNER_SWEEP_SIZE"
SPARE = "RUNNER_SPARE"
SPARE_FILE = "RUNNER_SPARE_FILE"
MLFLOW_SERVER = "RUNNER_MLFLOW_SERVER"
CPUS = "RUNNER_CPUS"  # sweep.parallel: the CPUs a job keeps to (runner.env.prepare pins them before any thread starts)
TRACKING_URI = "MLFLOW_TRACKING_URI"


def child_env(tracking_uri: str | None, **variables: str) -> dict[str, str]:
    """This process's environment for a child, plus `variables` and the store (None: MLflow is off; unbuffered, so
    lines come through as they are written)."""
    store = {} if tracking_uri is None else {TRACKING_URI: tracking_uri}
    return dict(os.environ, PYTHONUNBUFFERED="1", **store, **variables)


def runner_command(overrides: list[str]) -> list[str]:
    return [sys.executable, "-m", "runner", *overrides]


def start_child(argv: list[str], env: dict[str, str], **popen_kwargs) -> subprocess.Popen:
    """A child (a runner_command) that dies with this process's thread (procs.popen), output piped as text lines."""
    return procs.popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen_kwargs)


def request_parent_run(path: str, experiment_name: str, run_name: str, tags: dict, keep: bool = False) -> None:
    """What the sweep's parent run is to be, for the process that creates it first (store.sweep_parent), recorded as
    this process's; an earlier sweep's run id in `path` (this directory, no live sweep owning it) is dropped, unless
    `keep`: a continued search goes on in the same parent run."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.exists(path) and not keep:
        os.remove(path)
    request = {"experiment_name": experiment_name, "run_name": run_name, "tags": tags, "owner": procs.identity()}
    _write_whole(parent_request(path), request)


def parent_request(path: str) -> str:
    return path + ".request"


def announce_parent_run(path: str, run_id: str) -> None:
    """The sweep's parent run exists: its id, for the jobs after the one that created it. Written whole, once."""
    _write_whole(path, {"run_id": run_id})


def parent_run(path: str) -> str | None:
    """The sweep's parent run id, once one process has created it (None: not yet)."""
    try:
        with open(path) as f:
            return json.load(f)["run_id"]
    except (OSError, ValueError, KeyError):
        return None


def _write_whole(path: str, value: dict) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(value, f)
    os.replace(path + ".tmp", path)
