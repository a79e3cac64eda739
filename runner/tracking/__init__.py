"""The training process's side of MLflow, which never imports mlflow (seconds of start-up, and a GIL to share).

The run's lifecycle (`run.mlflow_run`: started, continued or attached to, ended FINISHED, FAILED or KILLED, or
deleted when refused before its first step: `run.refused`), its
metrics queued, journaled and delivered in batches (`runlog.RunLog`) over a pipe to `runner.mlflow_process`
(`pipe`), what MLflow could not take kept on disk (`outbox`, `journal`), the model to log (`logged_model`) and where
the wall time goes (`phases`).

Imports: runner.errors, runner.config, runner.control
TensorFlow: never
mlflow: never
"""
