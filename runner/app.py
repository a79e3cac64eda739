"""Hydra entry point. Config-only paths (--help, --cfg, validation) never import TensorFlow."""

import glob
import importlib
import json
import logging
import math
import os
import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from runner.config import command_line, hydra_private, interpolation, layout, registry, schema
from runner.config.validate import validate
from runner.control import claims, contract
from runner.control.stopping import Stopped
from runner.errors import ConfigError, RunnerError
from runner.preflight.probes import writable_dir_problem

schema.register()
# `${runner.or:a,b}`: a unless it is null or empty (hydra.run.dir is resume=<dir> when given).
OmegaConf.register_new_resolver("runner.or", lambda first, second: first or second, replace=True)


def slurm_step_dir() -> str:
    """Inside an srun step: outputs/slurm-<job id>.<step id>, one output directory for every task of the step (each
    task reads its own clock, so clock-named directories can differ by a second between tasks). Elsewhere ''
    (a batch script's own step has no SLURM_STEP_ID)."""
    job, step = os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURM_STEP_ID")
    return f"outputs/slurm-{job}.{step}" if job and step else ""


def run_dir(resume, by_clock: str) -> str:
    """hydra.run.dir: resume=<dir> when given; under srun the step's directory; else `by_clock`
    (outputs/<date>/<time>), or <time>_2... when another run or sweep started in the same second took it. One
    resolver, not nested ones: OmegaConf resolves every argument first, and the clock's directory is created."""
    return resume or slurm_step_dir() or claims.fresh_dir(by_clock)


# Cached in the config, as Hydra's `now` is: every copy Hydra makes of it resolves to the same directory.
OmegaConf.register_new_resolver("runner.run_dir", run_dir, replace=True, use_cache=True)
OmegaConf.register_new_resolver("runner.fresh_dir", claims.fresh_dir, replace=True, use_cache=True)


hydra_private.install()  # Hydra's messages for configs it cannot compose, in one paragraph


def output_dir_problem(argv) -> str:
    """Hydra creates the run (or sweep) directory before any runner code runs, and a directory it cannot create
    ends in its traceback: check it first. Returns the error, or ''."""
    if command_line.config_only(argv):
        return ""
    sweep = command_line.multirun(argv)
    keys = ("hydra.sweep.dir=",) if sweep else ("hydra.run.dir=", "resume=")
    overrides = command_line.overrides_in(argv)
    given = [(a.split("=", 1)[0], command_line.path_of(a)) for a in overrides if a.startswith(keys)]  # quotes taken off
    given = [(key, path) for key, path in given if path != ""]  # resume= / resume=null: a new run
    default = (
        ("hydra.sweep.dir (default multirun/...)", "multirun") if sweep else ("hydra.run.dir (default outputs/...)", "outputs")
    )
    key, path = given[-1] if given else default
    if path is None:  # known once Hydra composes it (${now:...}), or no path: Hydra says what is wrong
        return ""
    if key == "resume" and not os.path.isdir(os.path.expanduser(path)):
        from runner.preflight.needs import no_resume_dir

        return no_resume_dir(path)  # here, before Hydra would make it as the run's directory
    problem = writable_dir_problem(path)  # the probe validate.py uses for output and checkpoint directories
    if problem and key == "resume":
        return (
            f"resume={path} cannot be continued: the run's directory cannot be written ({problem}), and its "
            "checkpoints, log and MLflow journal go there. Make it writable, or copy it somewhere writable and resume "
            "the copy."
        )
    if problem:
        what = "the sweep's directory" if sweep else "the run's output directory"
        fix = (
            "Free space there, or point it at another filesystem"
            if "No space left" in problem
            else ("Point it at a directory you can write, or run from one")
        )
        return f"{key}={path} cannot be used as {what} ({problem}). {fix}."
    return ""


def with_resumed_overrides(argv: list[str]) -> list[str]:
    """`resume=<dir>` continues that run as it was configured: its first command's overrides (Hydra's
    <dir>/.hydra/overrides.yaml) come back, placed before resume=, and any override given now for the same key
    replaces its old value (resume=<dir> train.epochs=200 trains longer). Without them a run started with
    train.epochs=100 would be continued with the defaults. Hydra writes the merged list back, so it holds for the
    next resume too. A saved value whose secret was masked (`redact_hydra_files`) must be given again: ConfigError."""
    if command_line.multirun(argv):
        return argv
    overrides = command_line.overrides_in(argv)
    at = max((i for i, a in enumerate(argv) if a.startswith("resume=") and a in overrides), default=None)
    directory = command_line.path_of(argv[at]) if at is not None else None  # resume='/srv/a b': as Hydra reads it
    if not directory:
        return argv
    from hydra.core.override_parser.overrides_parser import OverridesParser

    path = os.path.join(directory, layout.HYDRA_DIR, "overrides.yaml")
    if not os.path.isfile(path):
        return argv  # not a run directory (or not one of the runner's): resume= is checked and refused later
    parser = OverridesParser.create()
    try:
        given = {o.key_or_group for o in parser.parse_overrides(overrides)}
    except Exception:
        return argv  # Hydra says what is wrong with the command line itself
    try:
        loaded = OmegaConf.to_container(OmegaConf.load(path))
        if not isinstance(loaded, list) or not all(isinstance(o, str) for o in loaded):
            raise ValueError("it is not a list of key=value overrides")
        parsed = parser.parse_overrides(loaded)
    except Exception as err:  # empty (a full disk), edited by hand, cut short: resuming with the defaults would be wrong
        raise ConfigError(
            f"resume={directory}: {path} cannot be read as the first run's overrides ({str(err).splitlines()[0][:200]}), "
            "and resuming without them would train with the defaults. Write them back into it, one `- key=value` per "
            "line as Hydra wrote them (the run's MLflow tag `overrides` holds them), or give them all again with "
            "resume= after putting `[]` in the file."
        ) from None
    keep = [
        (text, o.key_or_group)
        for text, o in zip(loaded, parsed)
        if o.key_or_group not in given and o.key_or_group != "resume" and not o.key_or_group.startswith("hydra.")
    ]
    _keep_record(directory)
    from runner.config.redact import MASK

    masked = [key for text, key in keep if MASK in text]
    if "mlflow.tracking_uri" in masked and os.environ.get(contract.TRACKING_URI):
        masked.remove("mlflow.tracking_uri")
        keep = [(text, key) for text, key in keep if key != "mlflow.tracking_uri"]  # the environment's store
    if masked:
        raise ConfigError(
            f"{argv[at]}: the first run gave {', '.join(masked)} with a password or token, which its run directory "
            f"keeps masked ({MASK}). Give {'them' if len(masked) > 1 else 'it'} again with resume= ("
            + " ".join(f"{key}=..." for key in masked)
            + ("), or set MLFLOW_TRACKING_URI." if "mlflow.tracking_uri" in masked else ").")
        )
    return [*argv[:at], *(text for text, _ in keep), *argv[at:]]


_RECORD: dict[str, str] = {}  # this process's resume=<dir>: its .hydra/*.yaml as they were before Hydra rewrote them


def _keep_record(directory: str) -> None:
    """Hydra rewrites <dir>/.hydra/ with this command's overrides before any check runs. A resume that is refused
    (exit 2: another model, a finished run) must leave the run's record as it was, or the next resume=<dir> alone
    would bring the refused values back: keep it, to put back on a refusal (`restore_record`)."""
    for path in glob.glob(os.path.join(directory, layout.HYDRA_DIR, "*.yaml")):
        try:
            with open(path) as f:
                _RECORD[path] = f.read()
        except OSError:
            continue


def restore_record() -> None:
    for path, text in _RECORD.items():
        try:
            with open(path, "w") as f:
                f.write(text)
        except OSError:
            continue


def redact_hydra_files(*directories) -> None:
    """Hydra writes the command line's overrides into .hydra/ (config.yaml, hydra.yaml, overrides.yaml) and a sweep's
    multirun.yaml before any runner code runs; a password in an override (mlflow.tracking_uri=https://u:pw@host)
    would stay there in clear text. Rewrite them masked, as logs, params and tags are (runner.config.redact)."""
    from runner.config.redact import redact

    for directory in directories:
        for path in [
            *glob.glob(os.path.join(str(directory), layout.HYDRA_DIR, "*.yaml")),
            os.path.join(str(directory), "multirun.yaml"),
        ]:
            try:
                with open(path) as f:
                    text = f.read()
                masked = redact(text)
                if masked != text:
                    with open(path, "w") as f:
                        f.write(masked)
            except OSError:
                continue


def run(cfg: DictConfig) -> dict:
    """Validate, then train. Returns the run summary (MLflow run id, final metrics), also written to summary.json."""
    unresolved = interpolation.check(cfg)  # before any check reads a value: one paragraph, not OmegaConf's traceback
    if unresolved:
        raise ConfigError(unresolved)
    chosen = validate(cfg)  # strategy=auto's choice, carried along (None: the config names its strategy)
    claims.claim_output_dir(cfg)  # before anything reads the directory's checkpoints or MLflow run id
    if cfg.resume and not os.environ.get(contract.ATTACH_RUN):
        from hydra.core.hydra_config import HydraConfig

        given = [o for o in HydraConfig.get().overrides.task if not o.startswith("resume=")]
        logging.getLogger("runner").info("resume=%s: continuing with %s", cfg.resume, " ".join(given) or "the defaults")
    if chosen:  # logged only once the config passed every check: a refused resume= leaves runner.log empty
        logging.getLogger("runner").info(chosen.line)
    caps = registry.selected(cfg, "cluster").caps
    elastic = "elastic" in cfg.cluster and cfg.cluster.elastic.enabled
    launcher = caps.launcher or (caps.elastic_launcher if elastic else None)
    if launcher:  # starts tf_config tasks (localhost: processes here; ray: Ray actors; slurm: job steps); no TensorFlow
        return _written(cfg, importlib.import_module(launcher).launch(cfg, chosen))
    from runner.tracking.run import end_prestarted, prestart, task_overrides

    # MLflow gets ready in its own process, and creates the run there, while this one imports TensorFlow
    prestart(cfg, task_overrides(), chosen.tags if chosen else {})
    try:
        from runner.experiment import run_experiment  # imports TensorFlow

        summary = run_experiment(cfg, chosen)
    except BaseException as err:
        end_prestarted(err)  # a run created ahead that training never reached: ended, not left RUNNING
        raise
    return _written(cfg, summary)


def _written(cfg, summary: dict) -> dict:
    """summary.json in the output directory, for whoever started this run (a sweep reads its objective there)."""
    if cfg.output_dir and summary.get("steps") is not None:  # a trainer's (ps and evaluator tasks train nothing)
        with open(layout.summary_path(cfg.output_dir), "w") as f:
            figures = {k: v for k, v in summary.items() if isinstance(v, (int, float, str))}
            # NaN is not JSON (jq, browsers and strict parsers refuse the file): a figure that is not finite is null
            figures = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in figures.items()}
            json.dump(figures, f, indent=1, allow_nan=False)
    return summary


@hydra.main(version_base="1.3", config_path="pkg://runner.conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from runner.config.redact import redact, redact_logs

    redact_logs()
    hydra_cfg = HydraConfig.get()
    redact_hydra_files(hydra_cfg.runtime.output_dir, *([hydra_cfg.sweep.dir] if hydra_cfg.mode == RunMode.MULTIRUN else []))
    if hydra_cfg.mode == RunMode.MULTIRUN:
        if os.environ.get(contract.SWEEP_JOB):  # the sweep passes hydra.mode=RUN; this is the backstop against a fork bomb
            print(
                "Error: a job of a sweep was started as a sweep itself (hydra.mode=MULTIRUN); refusing to start "
                "another level of jobs. Remove hydra.mode from the job's overrides.",
                file=sys.stderr,
            )
            sys.exit(2)
        from runner.sweeps.sweep import run_sweep_job  # each job in a fresh process: devices are per process

        return run_sweep_job(cfg)  # the job's sweep.objective: what a sampling sweeper (Optuna) optimises
    try:
        run(cfg)
    except Stopped as err:
        launched = os.environ.get(contract.ATTACH_RUN)  # a task of cluster=localhost: the launcher says what to do next
        continued = cfg.output_dir and layout.is_run_dir(cfg.output_dir, layout.checkpoint_dir(cfg))  # else nothing to continue
        hint = f" Continue with: python -m runner resume={cfg.output_dir}" if continued and not launched else ""
        marked = " The MLflow run is marked KILLED." if cfg.mlflow.enabled and not launched else ""
        said = str(err).rstrip(".")  # "stopped by SIGINT" (outside the steps) ends with no period of its own
        print(redact(f"Stopped: {said}.{marked}{hint}"), file=sys.stderr)
        sys.exit(err.exit_code)
    except RunnerError as err:
        # A config mistake or a dead task: one readable message on stderr, no stack trace.
        from runner.tracking import phases
        from runner.tracking.run import deleted_line, said_after_training

        if isinstance(err, ConfigError) and not phases.trained():
            restore_record()  # a refused resume= trained nothing: its command is not the run's record

        saving = "checkpoint" in cfg and cfg.checkpoint.enabled  # `~checkpoint` removes it: a ConfigError of its own
        kept = layout.checkpoint_dir(cfg) if saving and (cfg.checkpoint.dir or cfg.output_dir) else None
        said = said_after_training(str(err), kept)
        print(redact(f"Error: {said}{deleted_line(err)}"), file=sys.stderr)
        sys.exit(err.exit_code)
    except KeyboardInterrupt as err:  # before the signal handlers were installed (or a task that only serves)
        marked = " the MLflow run is marked KILLED and" if getattr(err, "run_killed", False) else ""
        print(f"Interrupted:{marked} nothing was left running.", file=sys.stderr)
        sys.exit(130)
