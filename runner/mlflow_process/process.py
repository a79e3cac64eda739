"""The process that owns MLflow for one training process: `python -m runner.mlflow_process PARENT_PID [NICENESS]`.

Importing mlflow and opening its store takes seconds of Python work (SQLAlchemy's models, alembic's schema
check). Here it runs on another core while the training process imports TensorFlow, and metric delivery later
runs beside training instead of taking turns with it for the GIL. The training process never imports mlflow:
it talks to this one over a pipe (runner.tracking.pipe).

Protocol, one JSON object per line. In: {"id": n, "op": name, "args": {...}}, ops are the methods of `Calls`.
Out: {"id": n, "ok": result} or {"id": n, "error": message, "config": true when it is the user's to fix};
and {"log": [level, message]} for the training process's log. Calls run in a small thread pool, so a delivery
stuck on a server that is down does not hold up an artifact upload. The store is $MLFLOW_TRACKING_URI.

It ignores SIGINT and SIGTERM (a terminal's Ctrl-C reaches the whole process group; the training process ends
the run KILLED through it), ends when its stdin closes, and dies with its parent (runner.control.procs).
"""

import json
import logging
import os
import signal
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

from omegaconf import OmegaConf

from runner.config import layout
from runner.config.redact import redact, redact_mapping, redact_uri
from runner.control import priority
from runner.errors import ConfigError
from runner.mlflow_process import delivery, sqlite_metrics
from runner.tracking import outbox

log = logging.getLogger("runner")
# What the training process sends while it trains, answered below training's priority (its work waits, training's
# steps do not); every other call, and these once training has ended ("now"), is one the command waits for (the run's
# start, the model logged at its end), answered by threads never lowered: at a low niceness on a busy machine those
# took minutes.
BACKGROUND_OPS = frozenset({"log_batch", "log_inputs", "start_system_metrics"})


class Calls:
    """What the training process asks of MLflow. Values arrive as plain lists: MLflow's entities are made here."""

    def __init__(self, client, uri: str, owner_pid: int):
        self.client, self.uri, self.owner_pid = client, uri, owner_pid
        self._monitors: dict = {}  # run id -> its system-metrics monitor (runner.mlflow_process.ops)
        self._sqlite = sqlite_metrics.SqliteMetrics.for_uri(uri)  # None: MLflow's log_batch takes every value

    def log_batch(self, run_id: str, metrics=(), tags=(), params=()) -> None:
        from mlflow.entities import Metric, Param, RunTag

        if metrics and not params and self._sqlite is not None:  # what training logs, 10x cheaper
            self._sqlite.log(self.client, run_id, metrics, tags)
            return
        self.client.log_batch(
            run_id, metrics=[Metric(*m) for m in metrics], tags=[RunTag(*t) for t in tags], params=[Param(*p) for p in params]
        )

    def set_terminated(self, run_id: str, status: str) -> None:
        self.client.set_terminated(run_id, status)

    def delete_run(self, run_id: str) -> bool:
        """A run refused before its first step: ended FAILED (so that restoring it does not bring back a run that looks
        RUNNING), then deleted, MLflow's way: hidden from the UI's and search_runs' default view, restorable until
        `mlflow gc`. Returns False when the store ended it but would not delete it (it stays FAILED)."""
        self.client.set_terminated(run_id, "FAILED")
        try:
            self.client.delete_run(run_id)
        except Exception as err:  # a server that refuses deletes (permissions): not an outage to wait out
            log.warning("MLflow run %s was refused before training but could not be deleted (%s)", run_id, redact(str(err))[:300])
            return False
        return True

    def log_artifact(self, run_id: str, path: str, artifact_path: str | None = None) -> None:
        if os.path.isdir(path):  # a directory's files (train.profile_steps' trace)
            self.client.log_artifacts(run_id, path, artifact_path)
        else:
            self.client.log_artifact(run_id, path, artifact_path)

    def log_text(self, run_id: str, text: str, name: str) -> None:
        self.client.log_text(run_id, redact(text), name)

    def log_inputs(self, run_id: str, datasets: list) -> None:
        """The run's datasets (runner.sources.description's dicts) as MLflow Dataset entities, one per context."""
        from runner.mlflow_process.ops import dataset_inputs

        self.client.log_inputs(run_id, datasets=dataset_inputs(datasets))

    def log_model(self, run_id: str, keras_path: str, inputs: dict, outputs: dict, example: list, register_as=None) -> dict:
        """The saved .keras model as an MLflow pyfunc model (runner.mlflow_process.model), registered when asked."""
        from runner.mlflow_process.ops import log_keras_model

        return log_keras_model(self.uri, run_id, keras_path, inputs, outputs, example, register_as)

    def start_system_metrics(self, run_id: str, every_sec: float, resumed: bool = False) -> None:
        """MLflow's SystemMetricsMonitor on `run_id`, started in a thread: the caller does not wait for it."""
        from runner.mlflow_process.ops import SystemMetrics

        if run_id not in self._monitors:
            self._monitors[run_id] = SystemMetrics(self.uri, run_id, every_sec, resumed)

    def stop_system_metrics(self, run_id: str) -> int:
        """Stop the monitor, logging what it sampled since its last point; returns the points it logged."""
        monitor = self._monitors.pop(run_id, None)
        return monitor.stop() if monitor is not None else 0

    def start(
        self,
        cfg: dict,
        overrides: list,
        attached: str | None,
        resumed: str | None,
        parent_file: str | None,
        job: str | None,
        tags: dict,
        system_metrics_every_sec: float | None = None,
        run_name: str | None = None,
    ) -> dict:
        """Continue, attach to, or create the run; a new one gets the config as params and artifacts. The run's owner
        (not an attached task) samples system metrics every `system_metrics_every_sec` (None: not). A sweep's job
        nests under the parent run `parent_file` holds, creating it when no job has yet (store.sweep_parent)."""
        try:
            parent = None
            if parent_file and not (attached or resumed):
                from runner.mlflow_process import store

                parent = store.sweep_parent(self.client, self.uri, parent_file)
            started = self._start(OmegaConf.create(cfg), overrides, attached, resumed, parent, job, tags, run_name)
            if system_metrics_every_sec and not attached:
                self.start_system_metrics(started["run_id"], system_metrics_every_sec, bool(resumed))
            launcher = cfg["cluster"]["name"] in ("localhost", "ray") and not attached  # its chief task logs the model
            if cfg.get("save_model") and cfg["mlflow"].get("log_model") and not launcher:
                from runner.mlflow_process.ops import warm_up

                threading.Thread(target=priority.in_background(warm_up), name="mlflow-warm-up", daemon=True).start()
            return started
        except ConfigError:
            raise
        except Exception as err:  # MlflowException, connection errors: nothing has been trained yet
            raise ConfigError(
                f"MLflow at {redact_uri(self.uri)} could not start the run ({redact(str(err)).strip()[:400]}); nothing was "
                "trained. Check mlflow.tracking_uri / MLFLOW_TRACKING_URI, or set mlflow.enabled=false."
            ) from None

    def _saved_run(self, attached, resumed, cfg):
        """The run to attach to or continue; a resumed run the store does not hold is named as such."""
        from mlflow.exceptions import MlflowException

        try:
            return self.client.get_run(attached or resumed)
        except MlflowException as err:
            if attached or err.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            raise ConfigError(
                f"{os.path.join(str(cfg['output_dir']), layout.RUN_ID_FILE)} names MLflow run {resumed}, which the store "
                f"at {redact_uri(self.uri)} does not hold. Give the store the run was logged to (mlflow.tracking_uri or "
                "MLFLOW_TRACKING_URI, as the first run had it), or move that file away to continue the checkpoints in "
                "a new MLflow run."
            ) from None

    def _start(self, cfg, overrides, attached, resumed, parent, job, tags, job_name=None) -> dict:
        import mlflow

        from runner.mlflow_process import store
        from runner.tracking.run import flatten

        client, logged_through, previous, put_back = self.client, None, None, {}
        if attached or resumed:
            if resumed and outbox.exists(cfg.output_dir):
                delivery.deliver_outbox(client, cfg.output_dir)
            run = self._saved_run(attached, resumed, cfg)
            if resumed:
                store.take_over(client, run, cfg.train.epochs, cfg.output_dir, self.owner_pid, explicit=bool(cfg.get("resume")))
                before = client.get_run(resumed)
                previous = before.info.status  # what a refusal before any step gives back, with the epochs it trained
                trained = before.data.tags.get(store.EPOCHS_TAG) or before.data.params.get("train.epochs")
                put_back = {store.EPOCHS_TAG: trained} if trained else {}
                client.update_run(resumed, status="RUNNING")
                client.set_tag(resumed, "resumed_with", redact(" ".join(overrides)))
                if "sweep.retry" in tags:  # a sweep's job run again after a fault (sweep.retries)
                    client.set_tag(resumed, "sweep.retry", tags["sweep.retry"])
            # An earlier attempt killed without a word left its journal: send what the store never got, and do not
            # log again the steps it holds (training restarts at the checkpoint, before them).
            sent, logged_through = (
                delivery.deliver_journal(client, run.info.run_id, cfg.output_dir) if cfg.output_dir else (0, None)
            )
            if sent or logged_through is not None:
                log.info(
                    "delivered %d metric value(s) from the journal of the attempt that was killed (steps up to %s logged)",
                    sent,
                    logged_through,
                )
            log.info("MLflow run %s (%s) %s", run.info.run_name, run.info.run_id, "continued" if resumed else "attached")
        else:
            run_name = cfg.mlflow.run_name
            if parent:  # a job of a sweep: nested under the sweep's run (named run_name), in its experiment
                experiment_id = client.get_run(parent).info.experiment_id
                tags = {**tags, "mlflow.parentRunId": parent, "sweep.job_num": job or ""}
                # named by its swept values (runner.sweeps.run_names), after the sweep's name when it has one
                numbered = f"{run_name}-{job or ''}" if run_name else None
                run_name = " ".join(filter(None, [numbered, job_name])) or None
            else:
                mlflow.set_tracking_uri(self.uri)
                experiment_id = mlflow.set_experiment(cfg.mlflow.experiment_name).experiment_id
            run = client.create_run(experiment_id, run_name=redact(run_name) if run_name else None, tags=redact_mapping(tags))
            link = (
                f" (view: {redact_uri(self.uri).rstrip('/')}/#/experiments/{experiment_id}/runs/{run.info.run_id})"
                if self.uri.startswith("http")
                else ""
            )
            log.info(
                "MLflow run %s (%s) in experiment %r at %s%s",
                run.info.run_name,
                run.info.run_id,
                cfg.mlflow.experiment_name,
                redact_uri(self.uri),
                link,
            )
            container = OmegaConf.to_container(cfg, resolve=True)
            params = [[k, v] for k, v in redact_mapping(flatten(container)).items()]
            for i in range(0, len(params), 100):
                self.log_batch(run.info.run_id, params=params[i : i + 100])
            self.log_text(run.info.run_id, OmegaConf.to_yaml(container), "config.yaml")
            self.log_text(run.info.run_id, "\n".join(overrides) + "\n", "overrides.txt")
        if not attached:  # the training process ends the run: record it as the owner; fail runs whose owner died
            store.started(client, run, cfg.train.epochs, self.owner_pid)
        earlier = store.earlier_figures(client, run.info.run_id) if attached or resumed else None
        return {
            "earlier": earlier,  # for an attempt with nothing left to train (runner.executors.base.nothing_left)
            "run_id": run.info.run_id,
            "logged_through": logged_through,
            "experiment_id": run.info.experiment_id,
            "previous_status": previous if resumed else None,
            "put_back": put_back,  # the tags this attempt changes (store.started), as they were: for a refusal
        }


class _Forward(logging.Handler):
    """Log records go to the training process, which logs them as its own (its handlers, its runner.log)."""

    def __init__(self, send):
        super().__init__()
        self.send = send

    def emit(self, record):
        self.send({"log": [record.levelno, record.getMessage()]})


def _started_pool(workers: int, name: str) -> ThreadPoolExecutor:
    """A pool whose threads exist now, at this thread's priority (a pool starts its threads when work comes, from the
    thread that submits it)."""
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
    ready = threading.Barrier(workers + 1)
    for _ in range(workers):
        pool.submit(ready.wait)  # each waits for the others: no thread is idle, so each submit starts one
    ready.wait()
    return pool


def main(argv) -> None:
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    owner_pid, uri = int(argv[0]), os.environ.get("MLFLOW_TRACKING_URI", "")
    urgent = _started_pool(2, "mlflow-urgent")  # before this thread is lowered: the calls the training process waits for
    if len(argv) > 1 and int(argv[1]) and "mlflow" not in sys.modules:
        # started ahead of its job by a sweep's spare (runner.sweeps.spares), not forked from a sweep's MLflow server
        # that has mlflow imported: its import below the job that runs now (and the calls of its background pool)
        priority.lower_this_thread(int(argv[1]))
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # its bars would land in the user's terminal
    out, out_lock = sys.stdout, threading.Lock()

    def send(message: dict) -> None:
        with out_lock:
            out.write(json.dumps(message) + "\n")
            out.flush()

    log.addHandler(_Forward(send))
    log.setLevel(logging.INFO)
    log.propagate = False
    calls = opened = None
    try:
        from runner.mlflow_process.store import (
            open_client,  # a fresh SQLite store created once under a lock; bad stores: ConfigError
        )

        client = open_client(uri)
        for name in ("mlflow", "alembic"):  # after the import: mlflow sets its own level when imported
            logging.getLogger(name).setLevel(logging.WARNING)
        logging.getLogger("urllib3").setLevel(logging.ERROR)  # one line per retry while a server is down; said once
        # A store that breaks mid-run (deleted, read-only): MLflow logs each failed write with SQLAlchemy's chained
        # traceback, and its system-metrics thread each failed sample; the runner says it once (runlog, run).
        for name in ("mlflow.store.db.utils", "mlflow.system_metrics"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
        calls = Calls(client, uri, owner_pid)
    except Exception as err:  # answered to every call: the training process raises it where it starts the run
        opened = (
            err
            if isinstance(err, ConfigError)
            else ConfigError(
                f"MLflow at {redact_uri(uri)} could not be opened ({redact(str(err)).strip()[:400]}); nothing was trained. "
                "Check mlflow.tracking_uri / MLFLOW_TRACKING_URI, or set mlflow.enabled=false."
            )
        )

    def answer(request: dict) -> None:
        try:
            if opened is not None:
                raise opened
            result = getattr(calls, request["op"])(**request.get("args", {}))
            send({"id": request["id"], "ok": result})
        except Exception as err:
            why = str(err).strip() or type(err).__name__
            send(
                {
                    "id": request["id"],
                    "error": why if isinstance(err, ConfigError) else redact(why)[:2000],
                    "config": isinstance(err, ConfigError),
                }
            )

    lowered = {"initializer": priority.lower_this_thread, "initargs": (priority.BACKGROUND,)}
    with urgent, ThreadPoolExecutor(max_workers=4, thread_name_prefix="mlflow-call", **lowered) as background:
        for line in sys.stdin:
            if line.strip():
                request = json.loads(line)
                later = request.get("op") in BACKGROUND_OPS and not request.get("now")  # "now": training has ended
                (background if later else urgent).submit(answer, request)
    out.flush()
    os._exit(0)  # every call is answered; tearing down MLflow's and SQLAlchemy's modules would only cost time


if __name__ == "__main__":
    main(sys.argv[1:])
