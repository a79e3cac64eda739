"""The one owner of a run directory's layout and of what each task of a cluster does. No TensorFlow, no I/O beyond
looking at a directory: the launcher (which never imports TensorFlow), the tasks, validation and the evaluator ask here
instead of each spelling the rule again.

    <output_dir>/
      .hydra/               Hydra's composed config and overrides
      runner.log            the run's log (hydra.job.name)
      checkpoints/          unless checkpoint.dir says otherwise
      model.keras           the saved model (save_model=true)
      mlflow_run_id         the MLflow run a resume= continues
      summary.json          the run's final figures (a sweep reads its objective there)
      mlflow_journal.jsonl  every metric value, about once a second (runner.tracking.journal)
      mlflow_outbox.jsonl   what MLflow could not take before the run ended (runner.tracking.outbox)
      <job>-<index>/        each task's own run directory under cluster=localhost
"""

import json
import os

HYDRA_DIR = ".hydra"
CHECKPOINTS = "checkpoints"
MODEL_FILE = "model.keras"
RUN_ID_FILE = "mlflow_run_id"
SUMMARY_FILE = "summary.json"
JOURNAL_FILE = "mlflow_journal.jsonl"
OUTBOX_FILE = "mlflow_outbox.jsonl"

TRAINER, SERVER, EVALUATOR = "trainer", "server", "evaluator"


def checkpoint_dir(cfg, output_dir=None) -> str:
    """`checkpoint.dir`, else `<output_dir>/checkpoints` (output_dir: the config's own unless given)."""
    if cfg.checkpoint.dir:
        return str(cfg.checkpoint.dir)
    return os.path.join(str(output_dir if output_dir is not None else cfg.output_dir), CHECKPOINTS)


def model_path(output_dir) -> str:
    return os.path.join(str(output_dir), MODEL_FILE)


def summary_path(output_dir) -> str:
    """The run's final figures as JSON (final loss, eval/*, throughput): what a sweep's job returns to its sweeper."""
    return os.path.join(output_dir, SUMMARY_FILE)


def task_dir(output_dir, job: str, index: int) -> str:
    """A task's own run directory (its runner.log, its .hydra/) under cluster=localhost."""
    return os.path.join(str(output_dir), f"{job}-{index}")


def is_run_dir(path: str, checkpoints: str) -> bool:
    """Whether `path` is an output directory the runner wrote: .hydra/ plus an MLflow run id or checkpoints."""
    return os.path.isdir(os.path.join(path, HYDRA_DIR)) and (
        os.path.isfile(os.path.join(path, RUN_ID_FILE)) or os.path.isdir(checkpoints)
    )


def task_role(strategy_name: str, task_type) -> str:
    """What a task does: `evaluator` evaluates checkpoints; ps tasks, and workers under parameter_server, are
    `server`s (a tf.distribute.Server that only ends when stopped); everything else (chief, workers, a process
    outside any cluster: task_type None) is a `trainer`."""
    if task_type == "evaluator":
        return EVALUATOR
    if task_type == "ps" or (strategy_name == "parameter_server" and task_type == "worker"):
        return SERVER
    return TRAINER


def is_chief(task_type, task_id: int, jobs) -> bool:
    """The task that logs to MLflow and saves: the chief, or worker 0 when there is no chief (a process outside any
    cluster too). TensorFlow's `strategy.extended.should_checkpoint`, known before the strategy exists (the MLflow
    run starts while TensorFlow is imported); runner.experiment warns if the two ever disagree."""
    if task_type is None:
        return True
    if "chief" in jobs:
        return task_type == "chief"
    return task_type == "worker" and int(task_id) == 0


READS_TF_CONFIG = ("tf_config", "kubernetes")  # clusters whose tasks read TF_CONFIG (kubernetes: derived in each pod)


def tf_config_chief(strategy_name: str, tf_config: str | None) -> bool:
    """Whether the task a TF_CONFIG (JSON text) names is the trainer that checkpoints and logs: `is_chief` of a
    `trainer`. False when TF_CONFIG cannot be read (validation says why)."""
    try:
        config = json.loads(tf_config or "")
        task, jobs = config["task"], config.get("cluster", {})
        return task_role(strategy_name, task["type"]) == TRAINER and is_chief(task["type"], task["index"], jobs)
    except (ValueError, KeyError, TypeError, AttributeError):
        return False


def latest_checkpoint_step(directory: str | None) -> int | None:
    """The step of the newest complete checkpoint in `directory`, from its index file (no TensorFlow here): TensorFlow
    writes the index after the checkpoint's files, so what it names is whole."""
    if not directory:
        return None
    try:
        with open(os.path.join(directory, "checkpoint")) as f:
            latest = f.readline().split(":", 1)[1].strip().strip('"')
        return int(latest.rsplit("-", 1)[-1])
    except (OSError, IndexError, ValueError):
        return None


def checkpoint_note(directory: str | None) -> str:
    """'the latest checkpoint is step N in DIR', from the checkpoint index file (no TensorFlow here)."""
    if not directory:
        return "no checkpoint was written"
    try:
        with open(os.path.join(directory, "checkpoint")) as f:
            latest = f.readline().split(":", 1)[1].strip().strip('"')
        return f"the latest checkpoint is step {latest.rsplit('-', 1)[-1]} in {directory}"
    except (OSError, IndexError):
        return "no checkpoint was written"
