"""What a runner process tells the runner processes it starts: environment variables, and how they are started.

The launcher (cluster=localhost) and the sweep start `python -m runner` children; every process that trains
may start a sentinel (runner.control.watchdog) and an MLflow process (runner.mlflow_process.process). They pass state by
environment only, never on the command line, where `ps` shows it to everyone:

- `TF_CONFIG` (launcher -> task): its cluster and its task in it, read by TensorFlow's resolver.
- `RUNNER_MLFLOW_RUN_ID` (launcher -> task: tracking, app, evaluator): log into this run; the launcher ends it.
- `RUNNER_LAUNCH_ID` (launcher -> every task): marks the processes of one launch (tests look for leftovers).
- `RUNNER_TASK_ROLE` (launcher, read back by it): trainer, server or evaluator (runner.config.layout).
- `RUNNER_PARENT_RUN_ID` (sweep -> job: tracking): nest the job's run under the sweep's run.
- `RUNNER_SWEEP_JOB` (sweep -> job: tracking, app): the job's number; a job never starts a sweep of its own.
- `RUNNER_SWEEP_SIZE` (sweep -> its task functions): how many jobs the sweep has ("?" when it cannot be told).
- `MLFLOW_TRACKING_URI` (launcher, sweep, tracking, stopping -> children, the MLflow process, the watchdog): the
  store, which may hold credentials.
"""

import os
import subprocess
import sys

from runner.control import procs

ATTACH_RUN = "RUNNER_MLFLOW_RUN_ID"
LAUNCH_ID = "RUNNER_LAUNCH_ID"
TASK_ROLE = "RUNNER_TASK_ROLE"
PARENT_RUN = "RUNNER_PARENT_RUN_ID"
SWEEP_JOB = "RUNNER_SWEEP_JOB"
SWEEP_SIZE = "RUNNER_SWEEP_SIZE"
TRACKING_URI = "MLFLOW_TRACKING_URI"


def child_env(tracking_uri: str, **variables: str) -> dict[str, str]:
    """This process's environment for a child, plus `variables` and the store (unbuffered, so lines come through
    as they are written)."""
    return dict(os.environ, PYTHONUNBUFFERED="1", **{TRACKING_URI: tracking_uri}, **variables)


def runner_command(overrides: list[str]) -> list[str]:
    return [sys.executable, "-m", "runner", *overrides]


def start_child(argv: list[str], env: dict[str, str], **popen_kwargs) -> subprocess.Popen:
    """A child (a runner_command) that dies with this process's thread (procs.popen), output piped as text lines."""
    return procs.popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen_kwargs)
