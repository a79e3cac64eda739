"""The MLflow run's lifecycle: started, continued or attached to; ended FINISHED, FAILED or KILLED, or deleted when
it was refused before its first step (`refused`).

MLflow itself runs in a process of its own (`runner.mlflow_process`), started by `prestart` before TensorFlow is
imported; this process reaches it through `pipe.Pipe` and reports through `RunLog.log_metrics(values, step)`. mlflow
is imported only on the MLflow side and by the tools that read runs back (sweeps, deliver, dashboard, the sentinel).
"""

import contextlib
import glob
import logging
import os
import re
import traceback
from collections.abc import Iterator
from concurrent.futures import Future

from omegaconf import DictConfig, OmegaConf

from runner.config import layout
from runner.config.redact import is_secret_name, redact, redact_mapping, redact_uri
from runner.control import contract
from runner.errors import ConfigError
from runner.tracking import phases
from runner.tracking.pipe import Pipe, PipeError
from runner.tracking.runlog import DELETED, NullRun, RunLog

DEFAULT_URI = "sqlite:///mlflow.db"  # MLflow 3.17's own default: embedded, no server
MAX_PARAM_LENGTH = 6000

log = logging.getLogger("runner")


def resolve_tracking_uri(configured: str | None) -> str:
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


def flatten(node, prefix: str = "") -> dict[str, str]:
    """{'train.optimizer.name': 'sgd', ...} for MLflow params."""
    out: dict[str, str] = {}
    if isinstance(node, dict):
        for key, value in node.items():
            out.update(flatten(value, f"{prefix}{key}."))
    else:
        out[prefix[:-1]] = str(node)[:MAX_PARAM_LENGTH]
    return out


__all__ = [
    "NullRun",
    "RunLog",
    "mlflow_run",
    "prestart",
    "end_prestarted",
    "refused",
    "deleted_line",
    "resolve_tracking_uri",
    "flatten",
    "env_tags",
]

_prestarted: dict[str, Pipe] = {}  # tracking URI -> the MLflow process started ahead of the run
_early: dict[str, tuple[dict, Future]] = {}  # tracking URI -> a new run's start call, sent ahead: (its args, answer)
EARLY_END_WAIT_SEC = 30.0  # for an early run's start to answer, so that it can be ended (it was sent seconds ago)


def task_overrides() -> list[str]:
    """The command line's overrides of this run (Hydra's task overrides; none outside a Hydra app)."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def _saved_run_id(output_dir: str | None) -> str | None:
    """The MLflow run id saved beside a run's outputs, None when there is none; ConfigError naming the file when what
    it holds is no run id (damaged)."""
    path = os.path.join(output_dir or "", layout.RUN_ID_FILE)
    if not (output_dir and os.path.isfile(path)):
        return None
    with open(path, "rb") as f:
        held = f.read(200)
    text = held.decode("ascii", errors="replace").strip()
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", text):
        raise ConfigError(
            f"{path} holds no MLflow run id ({len(held)}{'+' if len(held) == 200 else ''} bytes, starting "
            f"{held[:16]!r}): the file is damaged. Write the run's id into it (MLflow's UI shows it in the run's "
            "overview), or move the file away to continue the checkpoints in a new MLflow run."
        )
    return text


ENV_PREFIXES = ("TF_", "SLURM_", "CUDA_", "NCCL_", "MLFLOW_", "OMP_", "KMP_")  # what shapes a run, as env.* tags


def env_tags() -> dict[str, str]:
    """The environment that shapes a run, minus anything that looks like a secret (MLFLOW_TRACKING_TOKEN...)."""
    return {f"env.{k}": v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES) and not is_secret_name(k)}


def _logs_here(cfg: DictConfig) -> bool:
    """Whether this process will own or attach to the run, as far as the config and TF_CONFIG tell without
    TensorFlow: the chief, or worker 0 when there is no chief (runner.builders.cluster's rule)."""
    if not cfg.mlflow.enabled:
        return False
    if cfg.cluster.name in ("local", "tpu"):
        return True
    if cfg.cluster.name not in layout.READS_TF_CONFIG:
        return False  # decided once the cluster is built; the MLflow process starts then
    return layout.tf_config_chief(cfg.strategy.name, os.environ.get("TF_CONFIG"))


def prestart(cfg: DictConfig, overrides=None, tags: dict | None = None) -> None:
    """Start the MLflow process now, so that it gets ready while this process imports TensorFlow. Given the run's
    overrides, a new run of a one-process job is also created now, there, instead of after TensorFlow's import
    (`mlflow_run` takes it; `end_prestarted` ends it if training never gets that far)."""
    if not _logs_here(cfg):
        return
    try:
        uri = resolve_tracking_uri(cfg.mlflow.tracking_uri)
    except ConfigError:
        return  # raised again where the run starts
    if uri not in _prestarted:
        _prestarted[uri] = Pipe.spawn(uri)
    new_run = not os.environ.get(contract.ATTACH_RUN) and _saved_run_id(cfg.output_dir) is None
    if overrides is not None and cfg.cluster.name == "local" and new_run and uri not in _early:
        args = _start_args(cfg, overrides, tags or {})
        try:
            _early[uri] = (args, _prestarted[uri].submit("start", **args))
        except PipeError:
            pass  # started (and its error said) where the run starts


def spawn_ahead(uri: str, niceness: int) -> None:
    """Start the MLflow process for `uri` before this process knows its run (a sweep's spare), for `prestart` to take."""
    if uri not in _prestarted:
        _prestarted[uri] = Pipe.spawn(uri, niceness)


def where_line(run, cfg) -> str:
    """The run's last line: where its outputs are and how to find its MLflow run (`mlflow runs list
    --experiment-id` needs the id), and the command that shows it."""
    parts = [f"outputs in {cfg.output_dir}"] if cfg.output_dir else []
    if getattr(run, "run_id", None):
        uri = redact_uri(run.tracking_uri)
        parts.append(f"MLflow run {run.run_id} in experiment {cfg.mlflow.experiment_name!r} (id {run.experiment_id}) at {uri}")
        tracking = "" if uri == DEFAULT_URI else f" --tracking-uri '{uri}'"
        parts.append(f"compare runs with: python -m runner.dashboard{tracking}")
    return "; ".join(parts)


def refused(err: BaseException, created: bool) -> bool:
    """Whether a run that ends with `err` is deleted rather than left FAILED: a refusal (a ConfigError, exit 2: the
    user's model, data or a _target_ cannot train; data.verify's DataRefused, exit 5) raised before this process's
    first training step, in a run this process created. Such a run trained nothing, and kept FAILED it would only
    crowd the user's results. A continued or attached run holds training (or is another process's to end), and the
    other errors (a lost peer, data that broke while read, a loss that blew up, a crash) are failures of a run meant
    to train, whose messages point at resume=<dir>: those stay FAILED, with their error."""
    return bool(getattr(err, "trained_nothing", False) and created and not phases.trained())


def said_after_training(text: str, checkpoint_dir: str | None) -> str:
    """An error's paragraph as true as when it was raised: a check that says "Nothing was trained" also runs after
    training (the eval split, a model saved at the end); once a step has run, the paragraph says what was kept."""
    if not phases.trained() or not re.search(r"nothing was trained", text, re.I):
        return text
    note = layout.checkpoint_note(checkpoint_dir)
    kept = f"Training had run: {note}" + ("" if note.startswith("no checkpoint") else "; resume= continues once this is fixed")
    return re.sub(r"nothing was trained([.;])", lambda m: kept + m.group(1), text, flags=re.I)


def deleted_line(err: BaseException) -> str:
    """What the error's paragraph adds when its run was deleted (`refused`), else ''."""
    run_id = getattr(err, "run_deleted", None)
    if not run_id:
        return ""
    return f" The MLflow run {run_id} was deleted (nothing was trained); `mlflow runs restore --run-id {run_id}` brings it back."


def discard_prestarted() -> None:
    """This process turned out not to log (a server or evaluator task): let its MLflow process go."""
    end_prestarted(None)


def end_prestarted(err: BaseException | None) -> None:
    """Before `mlflow_run` took them: end each run created ahead, FAILED (KILLED for Ctrl-C or SIGTERM) naming `err`,
    or deleted when `err` is a refusal (`refused`), so that none is left RUNNING; then let the MLflow processes go."""
    while _early:
        uri, (_, answer) = _early.popitem()
        _end_early(_prestarted[uri], answer, err)
    while _prestarted:
        _prestarted.popitem()[1].close()


def _end_early(pipe: Pipe, answer: Future, err: BaseException | None) -> None:
    from runner.control.stopping import Stopped

    try:
        run_id = answer.result(EARLY_END_WAIT_SEC)["run_id"]
        killed = isinstance(err, (KeyboardInterrupt, Stopped))
        tags = [["stopped_by", getattr(err, "signal_name", "SIGINT")]] if killed else []
        if err is not None and not killed:
            tags.append(["error", f"{type(err).__name__}: {err}"[:5000]])
        if tags:
            pipe.log_batch(run_id, tags=tags)
        if err is not None and refused(err, created=True):  # created ahead by this process, for this command
            if pipe.delete_run(run_id):
                err.run_deleted = run_id
            return
        pipe.set_terminated(run_id, "KILLED" if killed else "FAILED")
    except Exception:  # never created (MLflow unreachable, the process gone): nothing to end
        pass


@contextlib.contextmanager
def mlflow_run(cfg: DictConfig, overrides=(), tags: dict | None = None, trains: bool = True) -> Iterator[RunLog]:
    """The MLflow run of this experiment, ended FINISHED, FAILED or KILLED (Ctrl-C, SIGTERM), or deleted when this
    process created it and it was refused before its first step (`refused`: the error's paragraph says so).

    A new run gets the composed config as params and artifacts. A run id saved in the output directory
    (a rerun or resume=<dir>) continues that run, after delivering what an earlier attempt left in its
    outbox. Under the localhost launcher, tasks attach to the launcher's run (`contract.ATTACH_RUN`) and leave
    ending it to the launcher. `tags` go on a new run beside the runner's own. Secrets never reach params, tags or
    logs (`redact`). `trains`: False for a task that logs beside the trainers (the side-car evaluator): it redoes no
    step, so the steps the trainers logged are not skipped in what it logs.
    """
    from runner.control.stopping import Stopped

    uri = resolve_tracking_uri(cfg.mlflow.tracking_uri)
    pipe = _prestarted.pop(uri, None) or Pipe.spawn(uri)
    early = _early.pop(uri, None)
    discard_prestarted()  # the MLflow processes of other stores
    try:
        runlog = _start(cfg, overrides, uri, pipe, tags or {}, early, trains)
    except BaseException:
        pipe.close()
        raise
    monitored = cfg.mlflow.system_metrics and runlog.owner  # attached tasks: the launcher's run is monitored by it
    elastic_task = not runlog.owner and bool(os.environ.get(contract.ELASTIC))
    status, deleting = "FAILED", None
    try:
        yield runlog
        status = "FINISHED"
    except (KeyboardInterrupt, Stopped) as err:
        status = "KILLED"
        if not elastic_task:  # the elastic launcher stops a generation to resize it: not the run's end
            runlog.set_tags({"stopped_by": getattr(err, "signal_name", "SIGINT")})
        err.run_killed = runlog.owner  # what the message may say: this process ends the run KILLED
        raise
    except BaseException as err:
        if isinstance(err, ConfigError) and runlog.previous_status and not phases.trained():
            # A continued run refused before any step (another model, a bad value): it stays as it was (FINISHED,
            # KILLED), with the refusal as a tag, not an error of the run.
            status = runlog.previous_status
            runlog.set_tags({**runlog.put_back, "resume_refused": redact(str(err))[:5000]})
            raise
        if elastic_task:  # the launcher decides whether the run failed; it keeps the error of its last generation
            runlog.set_tags({"elastic.last_task_error": f"{type(err).__name__}: {err}"})
            raise
        runlog.set_tags({"error": f"{type(err).__name__}: {err}"})  # kept on a deleted run, for whoever restores it
        if refused(err, created=runlog.owner and runlog.previous_status is None):
            status, deleting = DELETED, err  # no error.txt: the message is the whole story, and the run goes
            raise
        try:
            runlog.log_text("".join(traceback.format_exception(err)), "error.txt")
        except Exception:  # the server may be what failed; the error tag is queued either way
            pass
        raise
    finally:
        try:
            # The monitor's last point and the run's own last values are sent side by side; both are in before return.
            stopping = _submit_stop_system_metrics(pipe, runlog.run_id) if monitored else None
            if stopping is not None and status == DELETED:  # its last point before the run goes, not into a deleted run
                _wait_system_metrics(stopping)
                stopping = None
            runlog.close(status)
            if stopping is not None:
                _wait_system_metrics(stopping)
            if deleting is not None and runlog.deleted:
                _forget_run_id(cfg.output_dir, runlog.run_id)
                deleting.run_deleted = runlog.run_id
        finally:
            pipe.close()


def _forget_run_id(output_dir: str | None, run_id: str) -> None:
    """The run id saved beside a deleted run's outputs goes with it: that directory holds no run now, so the same
    hydra.run.dir again starts a new one, and resume=<dir> says there is nothing to continue."""
    try:
        if output_dir and _saved_run_id(output_dir) == run_id:
            os.remove(os.path.join(output_dir, layout.RUN_ID_FILE))
    except OSError:  # a read-only directory: the run is deleted all the same, and resume= says so (store.take_over)
        pass


def _logged_through(journaled: int | None, attached: bool, earlier: dict | None = None) -> int | None:
    """The last step already logged, so that the steps an attempt redoes after its checkpoint are not logged twice:
    the journal's; (an elastic job's next generation) what the launcher saw the generation before log; and the
    last step of the run's loss in the store, which holds what a killed attempt delivered after its journal's last
    write (runner.mlflow_process.store.earlier_figures)."""
    told = os.environ.get(contract.LOGGED_THROUGH) if attached else None
    stored = (earlier or {}).get("loss")
    candidates = (journaled, int(told) if told and told.isdigit() else None, int(stored[0]) if stored else None)
    steps = [s for s in candidates if s is not None]
    return max(steps) if steps else None


SYSTEM_METRICS_STOP_SEC = 6.0  # the MLflow process gives up on a stuck monitor after 5 s (runner.mlflow_process.ops)


def _submit_stop_system_metrics(pipe: Pipe, run_id: str):
    """Ask MLflow's system-metrics monitor to stop (its last point is logged then): the answer's Future, or None."""
    try:
        return pipe.stop_system_metrics(run_id)
    except PipeError as err:
        log.warning("system metrics: the monitor did not stop cleanly (%s)", err)
        return None


def _wait_system_metrics(stopping) -> None:
    from runner.control.stopping import Stopped

    try:
        stopping.result(SYSTEM_METRICS_STOP_SEC)
    except (PipeError, TimeoutError) as err:
        log.warning("system metrics: the monitor did not stop cleanly (%s)", err or "timed out")
    except (KeyboardInterrupt, Stopped):  # a second Ctrl-C: not waiting any longer
        log.warning("system metrics: not waiting for the monitor's last point")


def _start_args(cfg: DictConfig, overrides, extra_tags: dict) -> dict:
    """The MLflow process's `start` call for this run (runner.mlflow_process.process.Calls.start)."""
    attached = os.environ.get(contract.ATTACH_RUN)
    tags = {
        "overrides": " ".join(overrides),
        "executor": cfg.executor.name,
        "strategy.name": cfg.strategy.name,
        "cluster.name": cfg.cluster.name,
        **extra_tags,
        **env_tags(),
        **({"sweep.retry": os.environ[contract.RETRY]} if os.environ.get(contract.RETRY) else {}),
    }
    return dict(
        cfg=OmegaConf.to_container(cfg, resolve=True),
        overrides=list(overrides),
        attached=attached,
        resumed=None if attached else _saved_run_id(cfg.output_dir),
        parent_file=os.environ.get(contract.PARENT_RUN_FILE),  # a sweep's job: its parent run, created by the first job
        job=os.environ.get(contract.SWEEP_JOB),
        run_name=os.environ.get(contract.RUN_NAME),
        tags=tags,
        system_metrics_every_sec=cfg.mlflow.system_metrics_every_sec if cfg.mlflow.system_metrics else None,
    )


def _start(cfg: DictConfig, overrides, uri: str, pipe: Pipe, extra_tags: dict, early=None, trains: bool = True) -> RunLog:
    """Continue, attach to, or create the run (in the MLflow process), or take `early`, the one `prestart` created;
    a new run's id is saved beside its outputs."""
    args, answer = early if early is not None else (_start_args(cfg, overrides, extra_tags), None)
    attached, resumed = args["attached"], args["resumed"]
    try:
        if answer is not None:  # the same config, overrides and tags, sent before TensorFlow's import
            started = answer.result()
            changed = {k: v for k, v in env_tags().items() if args["tags"].get(k) != v}  # env.* set since
            if changed:
                pipe.log_batch(started["run_id"], tags=[[k, v] for k, v in redact_mapping(changed).items()])
        else:
            started = pipe.start(**args)
    except PipeError as err:
        raise ConfigError(
            f"MLflow at {redact_uri(uri)} could not start the run ({err}); nothing was trained. Check "
            "mlflow.tracking_uri / MLFLOW_TRACKING_URI, or set mlflow.enabled=false."
        ) from None
    run_id = started["run_id"]
    if not (attached or resumed) and cfg.output_dir:
        os.makedirs(cfg.output_dir, exist_ok=True)
        with open(os.path.join(cfg.output_dir, layout.RUN_ID_FILE), "w") as f:
            f.write(run_id)
    return RunLog(
        pipe,
        run_id,
        uri=uri,
        owner=not attached,
        flush_every=cfg.mlflow.flush_every_sec,
        delivery_timeout=cfg.mlflow.delivery_timeout_sec,
        outbox_dir=cfg.output_dir,
        logged_through=_logged_through(started["logged_through"], attached, started.get("earlier"))
        if trains
        else started["logged_through"],
        experiment_id=started.get("experiment_id"),
        previous_status=started.get("previous_status"),
        put_back=started.get("put_back"),
        earlier=started.get("earlier"),
    )
