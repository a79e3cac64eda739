"""The MLflow tracking store, opened safely: a fresh local SQLite store is created once under a file lock, a
damaged one or an unknown URI is a ConfigError, and runs left RUNNING by a process that died are marked FAILED.

- MLflow creates a fresh SQLite store by running its migrations in whichever process opens it first; several
  processes starting together on a fresh file all run them and break it (`table _alembic_tmp_metrics already
  exists`, for every later run too). `open_client` opens the store under `flock(<db>.lock)`, so one process
  migrates and the others find it ready.
- A run records its owner (host, pid, process start time) in tags. `fail_dead_runs` (called as a run starts,
  one search over its experiment) marks FAILED every RUNNING run of this host whose owner process is gone.
"""

import contextlib
import fcntl
import json
import logging
import os
import threading

from runner.config.redact import error_line, redact_uri
from runner.control import contract, priority, procs
from runner.errors import ConfigError
from runner.preflight.sqlite_store import check_sqlite, damaged, sqlite_path

log = logging.getLogger("runner")
OWNER_TAGS = {"host": "runner.owner.host", "ns": "runner.owner.ns", "pid": "runner.owner.pid", "start": "runner.owner.start"}
DIED = "process died without ending the run (found by {who})"
SCHEMES = "sqlite:///<path>, http(s)://<host>:<port>, postgresql://, mysql://, mssql://, file:<dir>, databricks"


@contextlib.contextmanager
def _locked(path: str):
    try:
        f = open(path + ".lock", "a")
    except OSError:  # a read-only directory: nothing can migrate the store there either
        yield
        return
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def open_client(uri: str):
    """An MlflowClient for `uri`, with the store created (once, under a lock) and checked."""
    path = sqlite_path(uri)
    if path is None:
        return _client(uri)
    check_sqlite(path)
    with _locked(path):
        try:
            client = _client(uri)  # MLflow creates (migrates) a fresh store here, and caches it per URI
            client.search_experiments(max_results=1)
        except ConfigError:
            raise
        except Exception as err:  # MlflowException, sqlalchemy errors, a half-migrated store
            raise damaged(path, error_line(err)) from None
    return client


def _client(uri: str):
    from mlflow import MlflowClient
    from mlflow.tracking.registry import UnsupportedModelRegistryStoreURIException

    for name in ("mlflow.store.db.utils", "alembic"):  # "Creating initial MLflow database tables...": not news
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        return MlflowClient(uri)
    except UnsupportedModelRegistryStoreURIException:
        raise ConfigError(
            f"the tracking URI {redact_uri(uri)!r} has a scheme MLflow does not know. Use one of: {SCHEMES} "
            "(mlflow.tracking_uri or MLFLOW_TRACKING_URI; unset both for ./mlflow.db)."
        ) from None


def _owner_alive(run) -> bool | None:
    """Whether the run's recorded owner process still runs (None: no owner recorded, or not one this host can see)."""
    tags = run.data.tags
    if OWNER_TAGS["pid"] not in tags:
        return None
    return procs.alive(
        tags.get(OWNER_TAGS["host"], ""),
        tags[OWNER_TAGS["pid"]],
        tags.get(OWNER_TAGS["start"], ""),
        tags.get(OWNER_TAGS["ns"], ""),
    )


def owner_dead(run) -> bool:
    """Whether the RUNNING run's recorded owner was a process of this host that is gone now."""
    return _owner_alive(run) is False


def fail_dead_runs(client, experiment_id: str, who: str, keep: str | None = None) -> list:
    """Mark FAILED each RUNNING run of the experiment whose owner process on this host is gone; their ids."""
    host = procs.identity()["host"].replace("'", "")
    try:
        running = client.search_runs(
            [experiment_id],
            max_results=1000,
            filter_string=f"attributes.status = 'RUNNING' and tags.`{OWNER_TAGS['host']}` = '{host}'",
        )
    except Exception as err:  # never let the check stop a run
        log.debug("could not look for runs left RUNNING: %s", err)
        return []
    failed = []
    for run in running:
        if run.info.run_id == keep or not owner_dead(run):
            continue
        # The search is a snapshot: a run that ended since (its owner gone after ending it) is not stale. The owner is
        # gone now, so what the store says next is final.
        try:
            if client.get_run(run.info.run_id).info.status != "RUNNING":
                continue
        except Exception as err:
            log.debug("could not read run %s again: %s", run.info.run_id, err)
            continue
        try:
            client.set_tag(run.info.run_id, "error", DIED.format(who=who))
            client.set_terminated(run.info.run_id, "FAILED")
        except Exception as err:
            log.debug("could not mark run %s FAILED: %s", run.info.run_id, err)
            continue
        log.warning(
            "MLflow run %s (%s) was left RUNNING by pid %s, which is gone: marked FAILED",
            run.info.run_name,
            run.info.run_id,
            run.data.tags[OWNER_TAGS["pid"]],
        )
        failed.append(run.info.run_id)
    return failed


def live_owner(run, me: int | None = None) -> str | None:
    """The pid of the run's recorded owner when it is a process of this host that still runs (and not `me`,
    default this process), else None."""
    pid = run.data.tags.get(OWNER_TAGS["pid"])
    return pid if pid != str(me or os.getpid()) and _owner_alive(run) else None


EPOCHS_TAG = "runner.train.epochs"  # the epochs the run was last asked to train (params cannot change on resume)


def take_over(client, run, epochs: int, output_dir: str, me: int | None = None, explicit: bool = True) -> None:
    """Before resume= continues `run`: refuse a run that is finished or whose process still runs; a RUNNING run
    whose process died is marked FAILED first (that attempt ended without a word). `explicit`: resume= was given;
    else the run directory already held a run (a fixed hydra.run.dir, a restarted pod, a requeued Slurm job)."""
    info, name = run.info, f"{run.info.run_name} ({run.info.run_id})"
    where = f"resume={output_dir}:" if explicit else f"hydra.run.dir={output_dir} holds an earlier run, which is continued:"
    new_run = "for a new run, leave resume= out" if explicit else "for a new run, pass another hydra.run.dir"
    if info.lifecycle_stage == "deleted":  # deleted by hand since (a refused run's id file is removed with it)
        raise ConfigError(
            f"{where} its MLflow run {name} is deleted, and training into it would hide all it logs. To continue it, "
            f"restore it first (`mlflow runs restore --run-id {info.run_id}`); {new_run}."
        )
    if info.status == "FINISHED":
        # The epochs it was last asked for (the tag: a resume may have changed them), else the first run's (params
        # cannot change on resume).
        trained = [v for v in (run.data.tags.get(EPOCHS_TAG), run.data.params.get("train.epochs")) if v and v.isdigit()]
        done = int(trained[0]) if trained else None
        if done is None or epochs <= done:
            raise ConfigError(
                f"{where} its MLflow run {name} is FINISHED: it trained all its train.epochs="
                f"{done if done is not None else '?'}, so there is nothing to continue. To train longer, pass a larger "
                f"train.epochs; {new_run}."
            )
    pid = live_owner(run, me) if info.status == "RUNNING" else None
    if pid:
        raise ConfigError(
            f"{where} its MLflow run {name} is still RUNNING in process {pid} on this host. Stop that process first "
            f"(kill {pid}: it checkpoints and ends the run KILLED), then resume; {new_run}."
        )
    if info.status == "RUNNING" and owner_dead(run):
        client.set_tag(info.run_id, "error", DIED.format(who=f"resume={output_dir}"))
        client.set_terminated(info.run_id, "FAILED")
        log.warning(
            "MLflow run %s was left RUNNING by pid %s, which is gone: marked FAILED, now continued",
            name,
            run.data.tags[OWNER_TAGS["pid"]],
        )


def started(client, run, epochs: int | None = None, owner: int | None = None, identity: dict | None = None) -> None:
    """Process `owner` (default this one; or the process recorded as `identity`, procs.identity's, taken on another
    host) owns `run` now: record it, and fail the runs of its experiment left RUNNING by dead processes."""
    from mlflow.entities import RunTag

    me = identity or procs.identity(owner)
    tags = [RunTag(tag, me[key]) for key, tag in OWNER_TAGS.items()] + ([RunTag(EPOCHS_TAG, str(epochs))] if epochs else [])
    client.log_batch(run.info.run_id, tags=tags)
    # Housekeeping off the critical path (a search over the experiment's runs): in the background.
    threading.Thread(
        target=priority.in_background(fail_dead_runs),
        name="mlflow-stale-runs",
        daemon=True,
        args=(client, run.info.experiment_id, f"run {run.info.run_name} ({run.info.run_id}), pid {me['pid']}"),
        kwargs={"keep": run.info.run_id},
    ).start()


def sweep_parent(client, uri: str, parent_file: str) -> str:
    """The id of a sweep's MLflow parent run, created by whichever process needs it first (the first job's MLflow
    process, which has mlflow loaded anyway; the sweep's own for a job that failed before its run, or for the
    report) from the request the sweep wrote (contract.request_parent_run), under a lock for parallel launchers. The
    run is recorded as the sweep process's: left RUNNING if the sweep dies, the next run marks it FAILED."""
    import mlflow

    with _locked(parent_file):
        if os.path.exists(parent_file):
            return contract.parent_run(parent_file)
        with open(contract.parent_request(parent_file)) as f:
            request = json.load(f)
        logging.getLogger("mlflow").setLevel(logging.WARNING)  # "Experiment with name ... Creating a new experiment."
        mlflow.set_tracking_uri(uri)
        experiment = mlflow.set_experiment(request["experiment_name"])
        run = client.create_run(experiment.experiment_id, run_name=request["run_name"], tags=request["tags"])
        started(client, run, identity=request["owner"])
        contract.announce_parent_run(parent_file, run.info.run_id)
    log.info("MLflow parent run %s (%s) for the sweep", run.info.run_name, run.info.run_id)
    return run.info.run_id


def earlier_figures(client, run_id: str) -> dict:
    """What earlier attempts of a continued run logged that its end reports, for an attempt that finds nothing left
    to train (killed after its last checkpoint): the last training loss, the throughput windows as [step, examples/s]
    and the summary/ figures if an attempt got that far. Read after its journal was delivered."""
    latest = client.get_run(run_id).data.metrics
    losses = sorted((m.step, m.timestamp, m.value) for m in client.get_metric_history(run_id, "loss"))
    # the window's name before it said so (a run started by an earlier version and continued by this one)
    history = client.get_metric_history(run_id, "throughput/window_examples_per_sec") or client.get_metric_history(
        run_id, "throughput/examples_per_sec"
    )
    windows = sorted((m.step, m.value) for m in history)
    return {
        "loss": [losses[-1][0], losses[-1][2]] if losses else None,
        "windows": [list(w) for w in windows],
        "summary": {k: v for k, v in latest.items() if k.startswith("summary/")},
    }
