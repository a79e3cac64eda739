"""Multirun sweeps: one MLflow parent run per sweep, one child run per job, each job in a fresh process.

Hydra's basic launcher runs every job in one process (and joblib reuses its workers), but TensorFlow's
logical devices can be set only once per process; so each job's task function here starts
`python -m runner <job overrides>` as a child process and waits for it. The child logs its own MLflow run,
nested under the sweep's parent run. A failed job is recorded and the sweep goes on; at the end the
report is written and the sweep exits non-zero if any job failed.
"""

import contextlib
import json
import logging
import math
import os
import re
import signal
import sys
import threading
import time
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from runner.config import layout
from runner.config.command_line import override as as_override
from runner.config.redact import error_line, redact, redact_uri
from runner.control import claims, contract, priority
from runner.errors import ConfigError
from runner.sweeps import failures, parallel, slurm
from runner.sweeps.run_names import job_run_name, swept_keys
from runner.sweeps.search import continues_study, objectives
from runner.sweeps.search_config import STATE_DIR, SWEEPER_TARGET  # STATE_DIR: in the sweep directory, how each job ended
from runner.sweeps.server import MlflowServer
from runner.sweeps.spares import Spares

log = logging.getLogger("runner")
# Hydra's launchers announce every job with its overrides as given: a second line per job, passwords unmasked.
HYDRA_LAUNCHER_LOGS = (
    "hydra._internal.core_plugins.basic_launcher",
    "hydra_plugins.hydra_joblib_launcher._core",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher",
)

PARENT_FILE = "parent-run.json"  # in STATE_DIR: the parent run's id once it exists (contract.announce_parent_run)
BASIC_LAUNCHER = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"
# The next job's process, started ahead (runner.sweeps.spares): under the basic launcher only, which runs the jobs one
# after another in this process (SweepCallback sets it; Hydra calls run_sweep_job with nothing but the job's config).
_spares: Spares | None = None
_server: MlflowServer | None = None
_live: set = set()  # the jobs' processes while they run (sweep.parallel: a stop is passed on to each)


class _NoPerJobLine(logging.Filter):
    """Drops a launcher's `\t#<n> : <overrides>` line, and its `Launching 1 jobs locally` said again for every
    trial of a sampling sweeper; keeps the rest (how many jobs, how they are launched), once."""

    def __init__(self):
        super().__init__()
        self.said = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if re.match(r"\s*#\d+ : ", message) or message in self.said:
            return False
        self.said.add(message)
        return True


def _state(sweep_dir: str, name: str) -> str:
    os.makedirs(os.path.join(sweep_dir, STATE_DIR), exist_ok=True)
    return os.path.join(sweep_dir, STATE_DIR, name)


def parent_run_id() -> str | None:
    """The sweep's MLflow parent run id, once a job (or this process) has created it; None before."""
    path = os.environ.get(contract.PARENT_RUN_FILE)
    return contract.parent_run(path) if path else None


def _ensure_parent(uri: str) -> str | None:
    """The parent run, created here when no job has yet (a job that failed before its run, a sweep of no job)."""
    from runner.mlflow_process import store

    path = os.environ.get(contract.PARENT_RUN_FILE)
    if not path:
        return None
    try:
        return store.sweep_parent(store.open_client(uri), uri, path)
    except ConfigError as err:  # the store: no job can log into it either, so the sweep ends here
        print(f"Error: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
    except Exception as err:  # a server that is down, a store that refuses the run: the same for every job
        reason = error_line(err)
        print(
            f"Error: the sweep's MLflow parent run could not be created at {redact_uri(uri)} ({reason}), so no job can "
            "log into it and the sweep stops here. Start the server or point MLFLOW_TRACKING_URI / mlflow.tracking_uri "
            "at one that is up, or unset both to log to the local sqlite:///mlflow.db.",
            file=sys.stderr,
        )
        sys.exit(2)


def _warm_mlflow() -> None:
    """mlflow's and matplotlib's imports for the report written in this process (no MLflow server), at the lowest
    priority while the jobs run (Linux: a thread's own niceness); the store is opened later, not here: its lock would
    keep a job's MLflow process waiting on this thread."""
    priority.lower_this_thread(priority.LOWEST)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: F401
        import mlflow  # noqa: F401
        import mlflow.store.tracking.sqlalchemy_store  # noqa: F401
    except Exception as err:  # imported again where needed, which then says what is wrong
        log.debug("mlflow's import in the background failed: %s", err)


def count_jobs(hydra_cfg) -> int | None:
    """How many jobs the sweep will launch: a sampling sweeper's n_trials, else the size of the grid of the sweep
    overrides and sweeper params (Hydra's public override parser); None when that cannot be told (a glob)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if hydra_cfg.sweeper.get("n_trials") is not None:
        return int(hydra_cfg.sweeper.n_trials)
    params = [f"{k}={v}" for k, v in (hydra_cfg.sweeper.get("params") or {}).items()]
    total = 1
    for override in OverridesParser.create().parse_overrides(params + list(hydra_cfg.overrides.task)):
        if override.is_sweep_override():
            try:
                total *= len(list(override.sweep_string_iterator()))
            except Exception:  # a glob over a config group, or a sweep type only its sweeper can expand
                return None
    return total


def run_sweep_job(cfg: DictConfig) -> float:
    """The task function of one sweep job: run it in a fresh process, record how it ended. Returns the job's final
    value of sweep.objective, which a sampling sweeper (Optuna) optimises. A failed job, or one without that
    figure, returns the worst value (inf when minimising): Optuna raises on a trial without a value once every
    trial has failed, before the sweep's report is written, while the worst value lets the search go on."""
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    num = hc.job.num
    # mlflow.tracking_uri travels in the environment (env below): on a command line `ps` shows its password
    overrides = [o for o in hc.overrides.task if not o.lstrip("+~").startswith("mlflow.tracking_uri=")]
    label = f"#{num}"  # Hydra's job number, as in the sweep's subdirectories
    # Under Hydra's submitit launcher every Slurm task of a job runs this function: task 0 speaks for the job.
    secondary = cfg.cluster.name == "slurm" and os.environ.get("SLURM_PROCID", "0") != "0"
    problem = None
    if cfg.cluster.name == "slurm":
        try:
            overrides = [*overrides, f"cluster.port_base={slurm.port_base(cfg.cluster.port_base, num)}"]
        except ConfigError as err:  # this job cannot start: it fails as a job with a bad config does
            problem = f"Error: {err}\n"
    # the store through the environment, not the command line, where credentials would show in `ps`
    name = job_run_name(overrides, json.loads(os.environ.get(contract.SWEPT_KEYS) or "[]")) or f"job-{num}"
    env = contract.child_env(cfg_uri(cfg), **{contract.SWEEP_JOB: str(num), contract.RUN_NAME: name})  # + PARENT_RUN_FILE
    job = dict(cfg=cfg, hc=hc, overrides=overrides, env=env, label=label, secondary=secondary, problem=problem)
    slots = parallel.current()
    if slots is None or secondary:
        return _job(**job, share={})
    return slots.submit(lambda share: _job(**job, share=share), label)  # sweep.parallel: its value, a Future


def _job(cfg, hc, overrides, env, label, secondary, problem, share):
    """The job's process (again, for sweep.retries), its record in the sweep's state directory, its objective value.
    The process dies with this thread's, even on SIGKILL: the launcher's main thread (the basic launcher's, or a joblib
    worker process's), or a slot's thread of its own (sweep.parallel), which waits for it."""
    job_dir, sweep_dir, num = hc.runtime.output_dir, hc.sweep.dir, hc.job.num
    total = os.environ.get(contract.SWEEP_SIZE) or "?"  # set by SweepCallback (or the search) in the sweep's process
    slots = parallel.current()
    env, started = {**env, **share}, time.time()
    if not secondary:
        on = f" on CPU {share[contract.CPUS]}" if contract.CPUS in share else ""
        log.info("job #%d (%d of %s)%s: %s", num, num + 1, total, on, redact(" ".join(hc.overrides.task)) or "(defaults)")
    first = failures.stopped_by(_state(sweep_dir, ""))
    if problem:
        sys.stdout.write(f"[{label}] {problem}")
        code, tail = 2, [problem]
    elif first is not None and not secondary:  # sweep.on_failure=stop, and a job before this one failed
        log.warning("job %s not started: job #%d failed and sweep.on_failure=stop", label, first)
        code, tail = None, [f"not started: job #{first} failed and sweep.on_failure=stop\n"]
    else:
        try:
            # Its own process group (not under Slurm, which signals every process of a step itself): a Ctrl-C reaches
            # this process only, which passes exactly one signal on, so the job checkpoints once instead of
            # taking a terminal's signal and a forwarded one as a second Ctrl-C.
            own_group = cfg.cluster.name != "slurm"
            # hydra.mode=RUN: a job is never a sweep itself, even when a preset it names sets hydra.mode=MULTIRUN
            # (without it, `-m experiment=strategy_sweep` starts itself again in every job, without end).
            argv = [*overrides, as_override("hydra.run.dir", job_dir), "hydra.mode=RUN"]
            more = not total.isdigit() or num + 1 < int(total)
            code, tail = _run_child(argv, env, label, own_group, spare_after=more)
            for attempt in range(1, cfg.sweep.retries + 1):
                if not failures.is_fault(code) or (slots is not None and slots.stopping):
                    break
                resumable = os.path.exists(os.path.join(job_dir, layout.RUN_ID_FILE))
                log.warning("job %s ended by a fault (exit code %d): attempt %d of sweep.retries=%d, %s", label, code,
                            attempt, cfg.sweep.retries, "from its checkpoint" if resumable else "from the start")  # fmt: skip
                again = [*argv, as_override("resume", job_dir)] if resumable else argv
                code, tail = _run_child(again, {**env, contract.RETRY: str(attempt)}, label, own_group)
        except SweepStopped as stop:
            _stopped(stop.signum, [label])
    if secondary:
        return math.nan  # Hydra's submitit launcher returns task 0's value
    if slots is not None and slots.stopping:  # stopped with the sweep (Ctrl-C, SIGTERM): the sweep says so
        return None
    status = {"num": num, "overrides": overrides, "returncode": code, "dir": job_dir, "started": started}
    status |= {"ended": time.time(), **({"cpus": share[contract.CPUS]} if contract.CPUS in share else {})}
    if code is None:
        status["skipped"] = True
    elif code and cfg.sweep.on_failure == "stop":
        failures.stop_after(_state(sweep_dir, ""), num)
    if code:
        status["error"] = "".join(tail)  # a job that left no run (refused: its run deleted) is reported from this
        goes_on = "the sweep goes on" if cfg.sweep.on_failure != "stop" else "no further job starts (sweep.on_failure=stop)"
        log.error("job %s failed (exit code %d); %s", label, code, goes_on)
    names = objectives(cfg)
    values = [None if code or code is None else _objective(name, job_dir, label) for name in names]
    status["objective"] = values[0] if len(names) == 1 else values
    with open(_state(sweep_dir, f"job-{num}.json"), "w") as f:
        json.dump(status, f)
    given = hc.sweeper.get("direction")
    ways = list(given) if OmegaConf.is_list(given) else [given] * len(names)
    worst = [-math.inf if way == "maximize" else math.inf for way in ways]
    values = [w if v is None else v for v, w in zip(values, worst)]
    return values[0] if len(names) == 1 else values


class SweepStopped(KeyboardInterrupt):
    """Ctrl-C or SIGTERM to the sweep's process (not an Exception: Hydra's launchers catch those)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _on_stop_signal(signum, frame):
    raise SweepStopped(signum)


def _run_child(
    overrides: list[str], env: dict, label: str, own_group: bool = False, spare_after: bool = False
) -> tuple[int, list[str]]:
    """`python -m runner <overrides>`, its lines passed on with the job's label; (exit code, its last 30 lines). On
    Ctrl-C or SIGTERM the job gets the signal (once, in its own group), checkpoints and ends its run KILLED while its
    lines still come through; a further signal is passed on too (stop at once); then SweepStopped. With spares (the
    basic launcher), the job is the spare started ahead when there is one, and at the job's first line (its imports
    are done by then) `spare_after` starts the next one."""
    proc = _spares.take(overrides, env) if _spares is not None and own_group else None
    if proc is None:
        proc = contract.start_child(contract.runner_command(overrides), env, process_group=0 if own_group else None)
    _live.add(proc)
    ahead = _spares is not None
    tail: list[str] = []

    def show(line):
        nonlocal tail, ahead
        if ahead:  # one thing of the lowest priority at a time, beside the job: it never waits for them
            ahead = False
            if spare_after:
                _spares.start(env)
        sys.stdout.write(f"[{label}] {line}")
        sys.stdout.flush()
        tail = (tail + [line])[-30:]

    try:
        for line in proc.stdout:
            show(line)
        code = proc.wait()
        _live.discard(proc)
        if _spares is not None:
            _spares.resume()  # held by the job, which ended (failed, killed) before it let the spare go on
        return code, tail
    except (KeyboardInterrupt, SweepStopped) as err:
        signum = getattr(err, "signum", signal.SIGINT)
        if _spares is not None:  # no job comes after this one
            _spares.drop()
        forward = lambda sig, frame: own_group and proc.poll() is None and proc.send_signal(sig)  # noqa: E731
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, forward)
        forward(signum, None)
        for line in proc.stdout:
            show(line)
        proc.wait()
        raise SweepStopped(signum) from None


def kill_parent_run(signum: int) -> None:
    """The sweep's MLflow parent run (this process's, when it opened one) KILLED by `signum`. A further Ctrl-C or
    SIGTERM meanwhile (a second press, `timeout` passing its own on) waits for it: the run is being ended already,
    and an exception in the middle left it RUNNING behind a traceback."""
    parent_id, uri = parent_run_id(), os.environ.get(contract.TRACKING_URI)
    if not parent_id or not uri:
        return
    with _signals_held():
        try:
            from mlflow import MlflowClient

            client = MlflowClient(uri)
            end_stranded_jobs(client, parent_id, signum)
            client.set_tag(parent_id, "stopped_by", signal.Signals(signum).name)
            client.set_terminated(parent_id, "KILLED")
        except Exception as err:  # the message is what matters; the next run marks a stale one FAILED
            log.warning("could not mark the sweep's MLflow run KILLED: %s", err)


def _hold_signals() -> dict:
    """SIGINT and SIGTERM ignored from now (in the main thread, where handlers live); the handlers they had."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}


@contextlib.contextmanager
def _signals_held():
    before = _hold_signals()
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def end_stranded_jobs(client, parent_id: str, signum: int) -> list[str]:
    """The sweep's child runs still RUNNING once every job's process has ended, KILLED by `signum`: each job ends its
    own run, but one whose signal landed as its run was being created, before it could, left it RUNNING with no owner.
    Their ids."""
    experiment = client.get_run(parent_id).info.experiment_id
    left = client.search_runs(
        [experiment], filter_string=f"tags.mlflow.parentRunId = '{parent_id}' and attributes.status = 'RUNNING'"
    )
    for run in left:
        client.set_tag(run.info.run_id, "stopped_by", signal.Signals(signum).name)
        client.set_terminated(run.info.run_id, "KILLED")
        log.info("job run %s was left RUNNING by its stopped job: ended KILLED", run.info.run_id)
    return [run.info.run_id for run in left]


def _stop_jobs(signum: int) -> None:
    """A stop for the sweep passed on to each running job's process (each in its own group: the terminal's Ctrl-C
    reached none of them)."""
    for proc in list(_live):
        if proc.poll() is None:
            proc.send_signal(signum)


def _stopped(signum: int, labels: list[str]):
    """The sweep stopped during the jobs `labels`: its parent run KILLED, one paragraph, exit 130 / 143. A further
    signal waits for the end (the jobs have ended: nothing is left to stop)."""
    name = signal.Signals(signum).name
    _hold_signals()  # until the process exits
    kill_parent_run(signum)
    one = len(labels) == 1
    during = f"job {labels[0]}" if one else f"jobs {', '.join(labels)}"
    print(  # what each job did is in its own lines above (it may have been starting, or already done)
        f"Stopped: the sweep was stopped by {name} during {during}: a job that was training checkpointed and ended "
        f"its MLflow run KILLED (continue it with the resume= it printed); the sweep's MLflow run is KILLED and the "
        f"jobs after {'it' if one else 'them'} did not run.",
        file=sys.stderr,
    )
    sys.exit(128 + signum)


def _objective(metric: str, job_dir: str, label: str) -> float | None:
    """The job's final value of `metric`, from the summary.json its own process wrote."""
    from runner.config.layout import summary_path

    try:
        with open(summary_path(job_dir)) as f:
            summary = json.load(f)
    except (OSError, ValueError):
        summary = {}
    value = summary.get(metric)
    if not isinstance(value, (int, float)):
        figures = ", ".join(k for k, v in summary.items() if isinstance(v, (int, float))) or "none"
        log.warning("job %s has no final %s (sweep.objective) to return; its figures: %s", label, metric, figures)
        return None
    return float(value)


def cfg_uri(cfg) -> str:
    from runner.tracking.run import resolve_tracking_uri

    uri = resolve_tracking_uri(cfg.mlflow.tracking_uri)
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):  # relative: pin it for the children
        uri = "sqlite:///" + os.path.abspath(uri[len("sqlite:///") :])
    return uri


class SweepCallback(Callback):
    """Opens the parent run before the jobs, and closes it with the report after them."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):  # a scheduler's notice stops the running job as Ctrl-C does
            signal.signal(signum, _on_stop_signal)
        hc = config.hydra
        sweep_dir = hc.sweep.dir
        if config.sweep.get("pruner") not in (None, "none") and hc.sweeper.get("_target_") != SWEEPER_TARGET:
            print(
                f"Error: sweep.pruner={config.sweep.pruner} stops trials of a search, and this sweep is a grid "
                f"({hc.sweeper.get('_target_')}): add hydra/sweeper=optuna (or experiment=tune_lr), or set "
                "sweep.pruner=null.",
                file=sys.stderr,
            )
            sys.exit(2)
        try:  # a sweep directory another live sweep owns: its jobs would continue that sweep's runs
            parallel.check(config.sweep.parallel, hc.launcher.get("_target_"), BASIC_LAUNCHER)
            slots = parallel.start(config.sweep.parallel, _stop_jobs, _stopped) if config.sweep.parallel > 1 else None
            claims.claim(sweep_dir, "hydra.sweep.dir", what="sweep")
        except ConfigError as err:
            print(f"Error: {err}", file=sys.stderr)
            sys.exit(err.exit_code)
        logging.getLogger("submitit").addFilter(slurm.SacctQuiet())
        for name in HYDRA_LAUNCHER_LOGS:  # each job is announced once, by run_sweep_job, with secrets masked
            logging.getLogger(name).addFilter(_NoPerJobLine())
        os.environ[contract.SWEPT_KEYS] = json.dumps(swept_keys(list(hc.overrides.task), hc.sweeper.get("params")))
        total = count_jobs(hc)
        label = "?" if total is None else str(total)
        os.environ[contract.SWEEP_SIZE] = label  # the jobs' task functions run here or in children started later
        uri = cfg_uri(config)
        os.environ[contract.TRACKING_URI] = uri  # the jobs get it anyway; kill_parent_run reads it here
        # The parent run is created by the first job's MLflow process, which imports mlflow anyway (here, mlflow's
        # import and the store took seconds of CPU from that job): it reads this request, and writes the run's id.
        announced = _state(sweep_dir, PARENT_FILE)
        contract.request_parent_run(
            announced,
            config.mlflow.experiment_name,
            redact(config.mlflow.run_name or f"sweep-{os.path.basename(sweep_dir)}"),  # ${oc.env:...} in it: masked
            {
                "sweep.overrides": redact(" ".join(hc.overrides.task)),
                "sweep.jobs": label,
                "sweep.dir": os.path.abspath(sweep_dir),
            },
            keep=continues_study(config),
        )
        os.environ[contract.PARENT_RUN_FILE] = announced
        side = f", {len(slots)} side by side" if slots is not None else ""
        log.info("sweep of %s jobs into %s%s", label, sweep_dir, side)
        global _spares, _server
        if hc.launcher.get("_target_") == BASIC_LAUNCHER and config.cluster.name != "slurm":
            if config.mlflow.enabled:
                _server = MlflowServer(contract.child_env(uri))
                os.environ[contract.MLFLOW_SERVER] = _server.path  # each job's MLflow process: forked, mlflow imported
        if hc.launcher.get("_target_") == BASIC_LAUNCHER and config.cluster.name != "slurm" and slots is None:
            os.environ[contract.SPARE_FILE] = _state(sweep_dir, "spare.pid")  # the jobs hold the spare from it
            _spares = Spares(os.environ[contract.SPARE_FILE])
            _spares.start(contract.child_env(uri))  # the first job's
        if _server is None:  # the report is written here: its imports while the jobs run
            threading.Thread(target=_warm_mlflow, name="sweep-mlflow-import", daemon=True).start()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from runner.sweeps.report import write_report

        sweep_dir = config.hydra.sweep.dir
        if parallel.current() is not None:  # sweep.parallel: the jobs still running
            parallel.current().wait_all()
        parent = parent_run_id() or _ensure_parent(cfg_uri(config))  # none yet: no job logged a run
        if _spares is not None:
            _spares.drop()
        try:
            if not parent:
                return
            direction = config.hydra.sweeper.get("direction")  # a sampling sweeper's (Optuna): the report ranks by it
            if OmegaConf.is_list(direction):  # several objectives: ranked by the first (the Pareto front: the study's)
                direction = str(direction[0]) if len(direction) else None
            report = dict(
                uri=cfg_uri(config),
                parent_id=parent,
                sweep_dir=sweep_dir,
                objective=objectives(config)[0] if direction else None,
                direction=direction,
            )
            failed = _server.report(report, _state(sweep_dir, "report.json")) if _server is not None else None
        finally:
            if _server is not None:
                _server.stop()
        if failed is None:
            failed = write_report(**report)
        if failed:
            print(
                f"Error: {len(failed)} of the sweep's jobs failed: {', '.join(failed)}. Their errors are above; a job "
                "that trained has its run in MLflow (FAILED, with its error), and a job refused before training left "
                f"none (REFUSED in {sweep_dir}/report.md).",
                file=sys.stderr,
            )
            sys.exit(1)
