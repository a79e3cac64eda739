"""`python -m runner.mlflow_process PARENT_PID [NICENESS]`: the MLflow process of one training process
(runner.tracking.pipe starts it)."""

import sys

from runner.mlflow_process.process import main

main(sys.argv[1:])
