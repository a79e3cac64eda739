"""The one module that talks to MLflow: run lifecycle, batched metrics, params, tags, artifacts, FAILED status.

Everything else reports through `RunLog.log_metrics(values, step)` and never imports mlflow.
"""

import contextlib
import glob
import logging
import os
import threading
import time
import traceback
from typing import Dict, Iterator, Optional

from omegaconf import DictConfig, OmegaConf

from runner import journal, outbox
from runner.errors import ConfigError
from runner.redact import is_secret_name, redact, redact_mapping, redact_uri

DEFAULT_URI = "sqlite:///mlflow.db"  # MLflow 3.17's own default: embedded, no server
MAX_PARAM_LENGTH = 6000
METRICS_PER_BATCH = 1000  # MLflow's log_batch limit
FLUSH_EVERY_SEC = 30.0
JOURNAL_EVERY_SEC = 1.0  # what a kill -9 can lose at most

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
    """One MLflow run. Metrics and tags are queued and sent by a background thread with log_batch, so neither
    logging nor an unreachable server ever stalls training: undelivered values stay queued and are retried.
    close() delivers the rest (waiting up to mlflow.delivery_timeout_sec for a server that is down) and, if
    the server never comes back, saves them to an outbox file that `python -m runner.deliver` sends later."""

    def __init__(self, client, run_id: str, uri: str, owner: bool = True, flush_every: float = FLUSH_EVERY_SEC,
                 delivery_timeout: float = 120.0, outbox_dir: Optional[str] = None, logged_through: Optional[int] = None):
        self._client, self.run_id, self.tracking_uri = client, run_id, uri
        self.owner = owner  # False when attached to the launcher's run: the launcher ends it
        self.flush_every, self.delivery_timeout, self.outbox_dir = flush_every, delivery_timeout, outbox_dir
        self._metrics, self._tags = [], []
        # Steps an earlier, killed attempt already logged (its journal was delivered): not logged twice.
        self.logged_through = logged_through
        self._fresh = []  # values logged since the last journal write
        self._journal = journal.Journal(outbox_dir, logged_through) if outbox_dir else None
        self._journaled = self._delivered = 0  # values written to the journal / taken by the store, in order
        self._lock, self._sending = threading.Lock(), threading.Lock()
        # Journal writes have their own lock: a checkpoint's sync_journal must not wait behind a delivery that a
        # slow or unreachable server holds up (MLflow's HTTP retries take minutes).
        self._journaling = threading.Lock()
        self._wake, self._stop = threading.Event(), threading.Event()
        self._last_flush = time.monotonic()
        self._outage = None  # why the last delivery failed, while it keeps failing
        self._thread = threading.Thread(target=self._send_loop, name="mlflow-sender", daemon=True)
        self._thread.start()

    def log_metrics(self, values: Dict[str, float], step: int) -> None:
        # Plain (key, value, timestamp, step) tuples: the sender thread makes MLflow's Metric objects, off the
        # training thread (making them here cost ~9 us per logged step, 2% of a 0.5 ms step at log_every_n_steps=1).
        now = int(time.time() * 1000)
        step = int(step)
        if self.logged_through is not None and step <= self.logged_through:
            return
        rows = [(k, float(v), now, step) for k, v in values.items()]
        with self._lock:
            self._metrics.extend(rows)
            self._fresh.extend(rows)

    def set_tags(self, tags: Dict[str, object]) -> None:
        from mlflow.entities import RunTag

        with self._lock:
            self._tags.extend(RunTag(k, str(v)[:5000]) for k, v in redact_mapping({k: str(v) for k, v in tags.items()}).items())
        self._wake.set()

    def flush(self) -> bool:
        """Send what is queued now; False if the server could not take it (it stays queued)."""
        return self._deliver()

    def _send_loop(self) -> None:
        """Journal what was logged every JOURNAL_EVERY_SEC; deliver it every mlflow.flush_every_sec (or when woken)."""
        while not self._stop.is_set():
            woken = self._wake.wait(min(JOURNAL_EVERY_SEC, self.flush_every))
            self._wake.clear()
            if self._stop.is_set():
                break
            if woken or time.monotonic() - self._last_flush >= self.flush_every:
                self._deliver()
            else:
                self._write_journal()

    def sync_journal(self) -> None:
        """Journal everything logged so far, now (before a checkpoint is written)."""
        self._write_journal()

    def _write_journal(self) -> None:
        """Append the values logged since the last call to the journal."""
        with self._journaling:
            with self._lock:
                rows, self._fresh = self._fresh, []
            if self._journal is not None and rows:
                try:
                    self._journal.append(rows)
                except OSError as err:  # a full disk must not stop training: the values are still queued for MLflow
                    log.warning("could not write the metrics journal %s (%s); metrics still go to MLflow", self._journal.path, err)
                    self._journal = None
            self._journaled += len(rows)

    def _deliver(self) -> bool:
        """Send queued tags and metrics in log_batch calls of up to 1000 values, oldest first.

        Writing costs ~60 us per value in the SQLite store (more over HTTP) and competes with training for
        the CPU, so the sender wakes at most every mlflow.flush_every_sec during training.
        """
        from mlflow.entities import Metric

        with self._sending:
            self._last_flush = time.monotonic()
            self._write_journal()  # what is delivered is journaled first, so the journal's count lines up
            while True:
                with self._lock:
                    room = min(METRICS_PER_BATCH - min(len(self._tags), 100), self._journaled - self._delivered)
                    tags, metrics = self._tags[:100], self._metrics[:room]
                if not tags and not metrics:
                    break
                try:
                    self._client.log_batch(self.run_id, metrics=[Metric(*m) for m in metrics], tags=tags)
                except Exception as err:  # connection refused, timeouts, 5xx after MLflow's own retries
                    self._note_outage(err)
                    return False
                with self._lock:
                    del self._tags[:len(tags)], self._metrics[:len(metrics)]
                self._delivered += len(metrics)
                with self._journaling:
                    if self._journal is not None and metrics:
                        try:
                            self._journal.delivered(self._delivered)
                        except OSError:
                            self._journal = None
                if self._outage is not None:
                    log.warning("MLflow at %s is reachable again; delivering the metrics kept meanwhile", redact_uri(self.tracking_uri))
                    self._outage = None
            return True

    def _note_outage(self, err: Exception) -> None:
        why = redact(str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__)[:300]
        if self._outage is None:
            log.warning("MLflow at %s cannot take metrics now (%s); training goes on, %d value(s) kept here and "
                        "retried every %gs", redact_uri(self.tracking_uri), why, self.pending, self.flush_every)
        self._outage = why

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._metrics) + len(self._tags)

    def close(self, status: Optional[str]) -> None:
        """Deliver everything, then end the run with `status` (None: leave it to its owner)."""
        self._stop.set()
        self._wake.set()
        self._thread.join()
        deadline = time.monotonic() + self.delivery_timeout
        try:
            while not self._deliver_all(status):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                if self._outage:
                    log.warning("waiting up to %.0fs more for MLflow at %s to take %d value(s) (mlflow.delivery_timeout_sec)",
                                left, redact_uri(self.tracking_uri), self.pending)
                time.sleep(min(5.0, left))
            else:
                if self._journal is not None:  # everything is in the store: the journal has done its job
                    self._journal.close(remove=True)
                return
        except KeyboardInterrupt:
            pass  # a second Ctrl-C: stop waiting, keep what is left in the outbox
        path = outbox.save(self.outbox_dir or os.getcwd(), self.run_id, self._metrics, self._tags,
                           status if self.owner else None)
        log.error("MLflow at %s did not come back: %d value(s) of run %s are saved in %s. Send them with "
                  "`python -m runner.deliver %s` once it is up (a rerun with resume= does it too).",
                  redact_uri(self.tracking_uri), self.pending, self.run_id, path, os.path.dirname(path))

    def _deliver_all(self, status: Optional[str]) -> bool:
        if not self._deliver():
            return False
        if status and self.owner:
            try:
                self._client.set_terminated(self.run_id, status)
            except Exception as err:
                self._note_outage(err)
                return False
        return True

    def log_params(self, params: Dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in redact_mapping(params).items()]
        for i in range(0, len(items), 100):
            self._client.log_batch(self.run_id, params=items[i : i + 100])

    def log_artifact(self, path: str, artifact_path: Optional[str] = None) -> None:
        try:
            self._client.log_artifact(self.run_id, path, artifact_path)
        except Exception as err:  # the file stays on disk; say where
            log.warning("could not upload %s to MLflow (%s); it stays at %s", os.path.basename(path), redact(str(err))[:200], path)

    def log_text(self, text: str, name: str) -> None:
        self._client.log_text(self.run_id, redact(text), name)


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

    def sync_journal(self):
        pass

    def set_tags(self, tags):
        pass

    def log_artifact(self, path, artifact_path=None):
        pass

    def close(self, status):
        pass


def _open_client(cfg):
    uri = resolve_tracking_uri(cfg.mlflow.tracking_uri)
    import mlflow

    from runner.store import open_client  # a fresh SQLite store created once under a lock; bad stores: ConfigError

    for name in ("mlflow", "alembic"):  # after the import: mlflow sets its own level when imported
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("urllib3").setLevel(logging.ERROR)  # one line per retry while a server is down; we say it once
    mlflow.set_tracking_uri(uri)
    return uri, open_client(uri)


def _saved_run_id(output_dir: Optional[str]) -> Optional[str]:
    path = os.path.join(output_dir or "", RUN_ID_FILE)
    return open(path).read().strip() if output_dir and os.path.isfile(path) else None


ENV_PREFIXES = ("TF_", "SLURM_", "CUDA_", "NCCL_", "MLFLOW_", "OMP_", "KMP_")  # what shapes a run, as env.* tags


def env_tags() -> Dict[str, str]:
    """The environment that shapes a run, minus anything that looks like a secret (MLFLOW_TRACKING_TOKEN...)."""
    return {f"env.{k}": v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES) and not is_secret_name(k)}


@contextlib.contextmanager
def mlflow_run(cfg: DictConfig, overrides=()) -> Iterator[RunLog]:
    """The MLflow run of this experiment, ended FINISHED, FAILED or KILLED (Ctrl-C, SIGTERM).

    A new run gets the composed config as params and artifacts. A run id saved in the output directory
    (a rerun or resume=<dir>) continues that run, after delivering what an earlier attempt left in its
    outbox. Under the localhost launcher, tasks attach to the launcher's run (RUNNER_MLFLOW_RUN_ID) and
    leave ending it to the launcher. Secrets never reach params, tags or logs (runner/redact.py).
    """
    from runner.stopping import Stopped

    uri, client = _open_client(cfg)
    try:
        runlog = _start(cfg, overrides, uri, client)
    except Exception as err:  # MlflowException, connection errors: nothing has been trained yet
        if isinstance(err, ConfigError):
            raise
        raise ConfigError(f"MLflow at {redact_uri(uri)} could not start the run ({redact(str(err)).strip()[:400]}); nothing was "
                          "trained. Check mlflow.tracking_uri / MLFLOW_TRACKING_URI, or set mlflow.enabled=false.") from None
    status = "FAILED"
    try:
        yield runlog
        status = "FINISHED"
    except (KeyboardInterrupt, Stopped) as err:
        status = "KILLED"
        runlog.set_tags({"stopped_by": getattr(err, "signal_name", "SIGINT")})
        raise
    except BaseException as err:
        runlog.set_tags({"error": f"{type(err).__name__}: {err}"})
        try:
            runlog.log_text("".join(traceback.format_exception(err)), "error.txt")
        except Exception:  # the server may be what failed; the error tag is queued either way
            pass
        raise
    finally:
        runlog.close(status)


def _start(cfg: DictConfig, overrides, uri: str, client) -> RunLog:
    """Continue, attach to, or create the run; a new one gets the config as params and artifacts."""
    from runner import store

    attached = os.environ.get(ATTACH_ENV)
    resumed = None if attached else _saved_run_id(cfg.output_dir)
    options = dict(uri=uri, owner=not attached, flush_every=cfg.mlflow.flush_every_sec,
                   delivery_timeout=cfg.mlflow.delivery_timeout_sec, outbox_dir=cfg.output_dir)
    if attached or resumed:
        if resumed and outbox.exists(cfg.output_dir):
            outbox.deliver(client, cfg.output_dir)
        run = client.get_run(attached or resumed)
        if resumed:
            store.take_over(client, run, cfg.train.epochs, cfg.output_dir)  # not FINISHED, not running elsewhere
            client.update_run(resumed, status="RUNNING")
        # An earlier attempt killed without a word left its journal: send what the store never got, and do not
        # log again the steps it holds (training restarts at the checkpoint, before them).
        sent, logged_through = journal.deliver(client, run.info.run_id, cfg.output_dir) if cfg.output_dir else (0, None)
        if sent or logged_through is not None:
            log.info("delivered %d metric value(s) from the journal of the attempt that was killed (steps up to %s logged)",
                     sent, logged_through)
        runlog = RunLog(client, run.info.run_id, logged_through=logged_through, **options)
        if resumed:
            runlog.set_tags({"resumed_with": " ".join(overrides)})
        log.info("MLflow run %s (%s) %s", run.info.run_name, run.info.run_id, "continued" if resumed else "attached")
    else:
        import mlflow

        tags = {"overrides": " ".join(overrides), "executor": cfg.executor.name, "strategy.name": cfg.strategy.name,
                "cluster.name": cfg.cluster.name, **env_tags()}
        parent, run_name = os.environ.get(PARENT_ENV), cfg.mlflow.run_name
        if parent:  # a job of a sweep: nested under the sweep's run (named run_name), in its experiment
            experiment_id = client.get_run(parent).info.experiment_id
            tags.update({"mlflow.parentRunId": parent, "sweep.job_num": os.environ.get(JOB_ENV, "")})
            run_name = f"{run_name}-{os.environ.get(JOB_ENV, '')}" if run_name else None
        else:
            experiment_id = mlflow.set_experiment(cfg.mlflow.experiment_name).experiment_id
        run = client.create_run(experiment_id, run_name=run_name, tags=redact_mapping(tags))
        runlog = RunLog(client, run.info.run_id, **options)
        link = f" (view: {redact_uri(uri).rstrip('/')}/#/experiments/{experiment_id}/runs/{run.info.run_id})" if uri.startswith("http") else ""
        log.info("MLflow run %s (%s) in experiment %r at %s%s", run.info.run_name, run.info.run_id,
                 cfg.mlflow.experiment_name, redact_uri(uri), link)
        container = OmegaConf.to_container(cfg, resolve=True)
        runlog.log_params(flatten(container))
        runlog.log_text(OmegaConf.to_yaml(container), "config.yaml")
        runlog.log_text("\n".join(overrides) + "\n", "overrides.txt")
        if cfg.output_dir:
            os.makedirs(cfg.output_dir, exist_ok=True)
            with open(os.path.join(cfg.output_dir, RUN_ID_FILE), "w") as f:
                f.write(run.info.run_id)
    if not attached:  # this process ends the run: record it as the owner; fail runs whose owner died (store.py)
        store.started(client, run, cfg.train.epochs)
    return runlog
