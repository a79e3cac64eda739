"""The one module that talks to MLflow: run lifecycle, batched metrics, params, tags, artifacts, FAILED status.

Everything else reports through `RunLog.log_metrics(values, step)` and never imports mlflow.
"""

import contextlib
import glob
import logging
import os
import time
import traceback
from typing import Dict, Iterator, Optional

from omegaconf import DictConfig, OmegaConf

from runner.errors import ConfigError

DEFAULT_URI = "sqlite:///mlflow.db"  # MLflow 3.17's own default: embedded, no server
MAX_PARAM_LENGTH = 6000
METRICS_PER_BATCH = 1000  # MLflow's log_batch limit
FLUSH_EVERY_SEC = 30.0

log = logging.getLogger("runner")


def resolve_tracking_uri(configured: Optional[str]) -> str:
    """mlflow.tracking_uri, else $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the working directory."""
    uri = configured or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    legacy = glob.glob(os.path.join("mlruns", "[0-9]*", "meta.yaml"))
    if legacy and not os.path.exists("mlflow.db"):
        raise ConfigError(
            f"./mlruns in {os.getcwd()} holds runs in MLflow's old file store, which MLflow 3.17 no longer opens by "
            "default. Migrate them once with `mlflow migrate-filestore --source . --target sqlite:///mlflow.db` "
            "(the runner then uses mlflow.db), or keep the file store with "
            "MLFLOW_TRACKING_URI=file:./mlruns MLFLOW_ALLOW_FILE_STORE=true."
        )
    return DEFAULT_URI


def flatten(node, prefix: str = "") -> Dict[str, str]:
    """{'train.optimizer.name': 'sgd', ...} for MLflow params."""
    out: Dict[str, str] = {}
    if isinstance(node, dict):
        for key, value in node.items():
            out.update(flatten(value, f"{prefix}{key}."))
    else:
        out[prefix[:-1]] = str(node)[:MAX_PARAM_LENGTH]
    return out


class RunLog:
    """One MLflow run: buffered metrics, sent with log_batch so logging costs training almost nothing."""

    def __init__(self, client, run_id: str, owner: bool = True):
        self._client = client
        self.run_id = run_id
        self.owner = owner  # False when attached to the launcher's run: the launcher ends it
        self._buffer = []
        self._last_flush = time.monotonic()

    def log_metrics(self, values: Dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._buffer.extend(Metric(k, float(v), now, int(step)) for k, v in values.items())
        if time.monotonic() - self._last_flush > FLUSH_EVERY_SEC:
            self.flush()

    def flush(self) -> None:
        """Write the buffered metrics, in log_batch calls of up to 1000 values.

        Writing costs ~60 us per value in the SQLite store (more over HTTP) and competes with training for
        the CPU, so it happens at most every FLUSH_EVERY_SEC during training and once at the end.
        """
        while self._buffer:
            chunk, self._buffer = self._buffer[:METRICS_PER_BATCH], self._buffer[METRICS_PER_BATCH:]
            self._client.log_batch(self.run_id, metrics=chunk)
        self._last_flush = time.monotonic()

    def set_tags(self, tags: Dict[str, object]) -> None:
        from mlflow.entities import RunTag

        self._client.log_batch(self.run_id, tags=[RunTag(k, str(v)[:5000]) for k, v in tags.items()])

    def log_params(self, params: Dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self._client.log_batch(self.run_id, params=items[i : i + 100])

    def log_artifact(self, path: str, artifact_path: Optional[str] = None) -> None:
        self._client.log_artifact(self.run_id, path, artifact_path)

    def log_text(self, text: str, name: str) -> None:
        self._client.log_text(self.run_id, text, name)

    def abort(self, message: str) -> None:
        """Record the error and end the run FAILED now: for a process about to exit without unwinding."""
        self.set_tags({"error": message})
        self.flush()
        if self.owner:
            self._client.set_terminated(self.run_id, "FAILED")


RUN_ID_FILE = "mlflow_run_id"  # beside the checkpoint: a rerun in the same directory continues this run
ATTACH_ENV = "RUNNER_MLFLOW_RUN_ID"  # set by the localhost launcher: tasks log into its run
PARENT_ENV = "RUNNER_PARENT_RUN_ID"  # set for the jobs of a sweep (runner/sweep.py): nest under it
JOB_ENV = "RUNNER_SWEEP_JOB"


class NullRun:
    """What a non-chief task reports to: nothing, so each metric is logged once per cluster."""

    run_id = None

    def log_metrics(self, values, step):
        pass

    def flush(self):
        pass

    def set_tags(self, tags):
        pass

    def log_artifact(self, path, artifact_path=None):
        pass

    def abort(self, message):
        pass


def _open_client(cfg):
    uri = resolve_tracking_uri(cfg.mlflow.tracking_uri)
    import mlflow
    from mlflow import MlflowClient

    for name in ("mlflow", "alembic"):  # after the import: mlflow sets its own level when imported
        logging.getLogger(name).setLevel(logging.WARNING)
    mlflow.set_tracking_uri(uri)
    return uri, MlflowClient(uri)


def _saved_run_id(output_dir: Optional[str]) -> Optional[str]:
    path = os.path.join(output_dir or "", RUN_ID_FILE)
    return open(path).read().strip() if output_dir and os.path.isfile(path) else None


@contextlib.contextmanager
def mlflow_run(cfg: DictConfig, overrides=()) -> Iterator[RunLog]:
    """The MLflow run of this experiment, ended FINISHED, FAILED or KILLED.

    A new run gets the composed config as params and artifacts. A run id saved in the output directory
    (a rerun or resume=<dir>) continues that run. Under the localhost launcher, tasks attach to the
    launcher's run (RUNNER_MLFLOW_RUN_ID) and leave ending it to the launcher.
    """
    uri, client = _open_client(cfg)
    attached = os.environ.get(ATTACH_ENV)
    resumed = None if attached else _saved_run_id(cfg.output_dir)
    if attached or resumed:
        run = client.get_run(attached or resumed)
        if resumed:
            client.update_run(resumed, status="RUNNING")
            client.set_tag(resumed, "resumed_with", " ".join(overrides))
        runlog = RunLog(client, run.info.run_id, owner=not attached)
        log.info("MLflow run %s (%s) %s", run.info.run_name, run.info.run_id, "continued" if resumed else "attached")
    else:
        import mlflow

        tags = {"overrides": " ".join(overrides), "executor": cfg.executor.name, "strategy.name": cfg.strategy.name,
                "cluster.name": cfg.cluster.name}
        parent, run_name = os.environ.get(PARENT_ENV), cfg.mlflow.run_name
        if parent:  # a job of a sweep: nested under the sweep's run (named run_name), in its experiment
            experiment_id = client.get_run(parent).info.experiment_id
            tags.update({"mlflow.parentRunId": parent, "sweep.job_num": os.environ.get(JOB_ENV, "")})
            run_name = f"{run_name}-{os.environ.get(JOB_ENV, '')}" if run_name else None
        else:
            experiment_id = mlflow.set_experiment(cfg.mlflow.experiment_name).experiment_id
        run = client.create_run(experiment_id, run_name=run_name, tags=tags)
        runlog = RunLog(client, run.info.run_id)
        log.info("MLflow run %s (%s) in experiment %r at %s", run.info.run_name, run.info.run_id, cfg.mlflow.experiment_name, uri)
        container = OmegaConf.to_container(cfg, resolve=True)
        runlog.log_params(flatten(container))
        runlog.log_text(OmegaConf.to_yaml(container), "config.yaml")
        runlog.log_text("\n".join(overrides) + "\n", "overrides.txt")
        if cfg.output_dir:
            os.makedirs(cfg.output_dir, exist_ok=True)
            with open(os.path.join(cfg.output_dir, RUN_ID_FILE), "w") as f:
                f.write(run.info.run_id)
    runlog.tracking_uri = uri
    status = "FAILED"
    try:
        yield runlog
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    except BaseException as err:
        runlog.set_tags({"error": f"{type(err).__name__}: {err}"})
        runlog.log_text("".join(traceback.format_exception(err)), "error.txt")
        raise
    finally:
        try:
            runlog.flush()
        finally:
            if not attached:
                client.set_terminated(runlog.run_id, status)
