"""What a runner process tells the runner processes it starts: environment variables, and how they are started.

The launcher (cluster=localhost) and the sweep start `python -m runner` children; every process that trains
may start a sentinel (runner/watchdog.py) and an MLflow process (runner/mlflow_process.py). They pass state by
environment only, never on the command line, where `ps` shows it to everyone:

| variable               | set by                  | read by                           | meaning                                   |
|------------------------|-------------------------|-----------------------------------|-------------------------------------------|
| `TF_CONFIG`            | launcher                | the task (TensorFlow's resolver)  | its cluster and its task in it            |
| `RUNNER_MLFLOW_RUN_ID` | launcher                | the task (tracking, app, evaluator) | log into this run; the launcher ends it |
| `RUNNER_LAUNCH_ID`     | launcher                | tests (processes left behind)     | marks every process of one launch         |
| `RUNNER_TASK_ROLE`     | launcher                | launcher (which tasks only serve) | trainer, server or evaluator (layout.py)  |
| `RUNNER_PARENT_RUN_ID` | sweep                   | the job (tracking)                | nest the job's run under the sweep's run  |
| `RUNNER_SWEEP_JOB`     | sweep                   | the job (tracking, app)           | the job's number; a job never sweeps      |
| `MLFLOW_TRACKING_URI`  | launcher, sweep, tracking | children, watchdog, MLflow process | the store (it may hold credentials)    |
"""

import os
import subprocess
import sys
from typing import Dict, List

from runner import procs

ATTACH_RUN = "RUNNER_MLFLOW_RUN_ID"
LAUNCH_ID = "RUNNER_LAUNCH_ID"
TASK_ROLE = "RUNNER_TASK_ROLE"
PARENT_RUN = "RUNNER_PARENT_RUN_ID"
SWEEP_JOB = "RUNNER_SWEEP_JOB"
TRACKING_URI = "MLFLOW_TRACKING_URI"


def child_env(tracking_uri: str, **variables: str) -> Dict[str, str]:
    """This process's environment for a child, plus `variables` and the store (unbuffered, so lines come through
    as they are written)."""
    return dict(os.environ, PYTHONUNBUFFERED="1", **{TRACKING_URI: tracking_uri}, **variables)


def runner_command(overrides: List[str]) -> List[str]:
    return [sys.executable, "-m", "runner", *overrides]


def start_child(argv: List[str], env: Dict[str, str], **popen_kwargs) -> subprocess.Popen:
    """A child (a runner_command) that dies with this process's thread (procs.popen), output piped as text lines."""
    return procs.popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen_kwargs)
