"""The search behind `hydra/sweeper=optuna` (the shell Hydra instantiates: hydra_plugins.runner_sweeper): an Optuna
study in the sweep directory asks for trials, Hydra's configured launcher runs each as a job (runner.sweeps.sweep:
a fresh `python -m runner` process and a child MLflow run), and each job's sweep.objective (one figure, or one per
direction) is told back. The job number is the trial's number, so a continued sweep keeps its numbering.

Running the same command again with the same hydra.sweep.dir continues the study: finished trials are kept and
never run again, the trials an interrupted run left RUNNING go on first, under their own numbers and in their own job
directories (from their checkpoints, in their own MLflow runs, where they had got that far: `resume=`), and the
search goes on to n_trials in all, in the same parent MLflow run. A search space or objective that differs from the
stored study's is refused before any trial starts, naming the keys.
"""

import json
import logging
import math
import os

from omegaconf import OmegaConf

from runner.config import layout, validate
from runner.config.command_line import override
from runner.control import contract
from runner.errors import ConfigError
from runner.sweeps import failures, parallel, pruning, search_plots, search_space
from runner.sweeps.search_config import STATE_DIR, STUDY_FILE, SWEEPER_TARGET

log = logging.getLogger("runner")
SPACE_ATTR, OBJECTIVE_ATTR = "runner.search_space", "runner.objectives"
DIRECTIONS = ("minimize", "maximize")


def continues_study(config) -> bool:
    """Whether this sweep continues a study of the runner's sweeper in its directory (its parent run goes on)."""
    sweeper = config.hydra.sweeper
    return (
        sweeper.get("_target_") == SWEEPER_TARGET
        and not sweeper.get("storage")
        and os.path.exists(os.path.join(str(config.hydra.sweep.dir), STUDY_FILE))
    )


def objectives(cfg) -> list[str]:
    objective = cfg.sweep.objective
    return [str(o) for o in objective] if OmegaConf.is_list(objective) else [str(objective)]


def directions(conf: dict, names: list[str]) -> list[str]:
    given = conf.get("direction", "minimize")
    given = list(given) if OmegaConf.is_list(given) or isinstance(given, (list, tuple)) else [given] * len(names)
    wrong = [str(d) for d in given if str(d) not in DIRECTIONS]
    if wrong or len(given) != len(names):
        why = f"{wrong[0]!r} is not minimize or maximize" if wrong else f"{len(given)} direction(s) for {len(names)} objective(s)"
        raise ConfigError(
            f"hydra.sweeper.direction={list(map(str, given)) if len(given) > 1 else given[0]}: {why} (sweep.objective="
            f"{names if len(names) > 1 else names[0]}). Give one direction per objective, e.g. "
            "'sweep.objective=[eval/loss,summary/examples_per_sec]' 'hydra.sweeper.direction=[minimize,maximize]'."
        )
    return [str(d) for d in given]


def _sampler_factory(conf: dict, space: search_space.Space):
    """(the sampler Hydra made from hydra.sweeper.sampler, a partial: `_partial_: true`, its fixed arguments), checked
    before the study is opened."""
    factory = conf.get("sampler")
    if not callable(factory):
        raise ConfigError(
            f"hydra.sweeper.sampler={factory!r} names no sampler: choose one with hydra/sweeper/sampler=<name> "
            "(tpe, random, grid, cmaes, gp, nsgaii), or give its _target_ (an optuna.samplers class)."
        )
    name = getattr(getattr(factory, "func", factory), "__name__", "")
    if name == "GPSampler":
        try:
            import torch  # noqa: F401
        except ImportError:
            raise ConfigError(
                "hydra/sweeper/sampler=gp: Optuna's GPSampler needs PyTorch, which is not installed. Install it "
                "(pip install torch), or use hydra/sweeper/sampler=tpe (the default) or cmaes."
            ) from None
    return factory, ({"search_space": space.grid()} if name == "GridSampler" else {})


def _sampler(factory, fixed: dict, done: int):
    """A continued study's seed moves on by the trials done (the same seed would draw the same first trials again)."""
    seed = getattr(factory, "keywords", {}).get("seed")
    return factory(**fixed, **({"seed": seed + done} if seed is not None and done else {}))


def _changed(study, space: search_space.Space, names: list[str]) -> None:
    """ConfigError when the stored study searched another space or objective than this command's."""
    stored = study.user_attrs.get(SPACE_ATTR)
    now = {k: str(d) for k, d in space.distributions.items()} | {k: f"fixed {v}" for k, v in space.fixed.items()}
    if stored is not None and stored != now:
        keys = sorted(k for k in set(stored) | set(now) if stored.get(k) != now.get(k))
        raise ConfigError(
            f"the study in this sweep directory searched another space: {', '.join(keys)} "
            f"{'differs' if len(keys) == 1 else 'differ'} from its first run's (hydra.sweeper.params and the command "
            "line's overrides). Run the same command to continue it, or "
            "give a new hydra.sweep.dir for a new search."
        )
    if study.user_attrs.get(OBJECTIVE_ATTR, names) != names:
        raise ConfigError(
            f"the study in this sweep directory optimised sweep.objective={study.user_attrs[OBJECTIVE_ATTR]}, not "
            f"{names}: give the same objective to continue it, or a new hydra.sweep.dir."
        )
    study.set_user_attr(SPACE_ATTR, now)
    study.set_user_attr(OBJECTIVE_ATTR, names)


def _interrupted(study) -> list:
    """Trials an interrupted run of this sweep left RUNNING: each runs again under its own number, in its own job
    directory, continuing its checkpoint and MLflow run (`resume=`) where it had got that far."""
    from optuna.trial import TrialState

    return [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.RUNNING]


def _job_dir(sweep_dir: str, subdir: str, number: int) -> str:
    return os.path.join(sweep_dir, subdir.replace("${hydra.job.num}", str(number)))


def _again(trial, space: search_space.Space, sweep_dir: str, subdir: str) -> list[str]:
    overrides = space.overrides(trial.params)
    job_dir = _job_dir(sweep_dir, subdir, trial.number)
    if os.path.exists(os.path.join(job_dir, layout.RUN_ID_FILE)):  # it had started its run: continue that
        overrides.append(override("resume", job_dir))
    return overrides


def _returned(ret):
    """What the job's task function returned (runner.sweeps.sweep.run_sweep_job), None when it raised."""
    try:
        return ret.return_value
    except Exception:  # noqa: BLE001  (Hydra re-raises the job's own exception here)
        return None


def _values(sweep_dir: str, number: int, returned, count: int) -> list[float] | None:
    """A job's objective values, None when it failed or logged no value (runner.sweeps.sweep's job record)."""
    try:
        with open(os.path.join(sweep_dir, ".runner", f"job-{number}.json")) as f:
            record = json.load(f)
    except (OSError, ValueError):
        record = {}
    if record.get("returncode"):
        return None
    values = returned if isinstance(returned, (list, tuple)) else [returned]
    try:
        values = [float(v) for v in values]
    except (TypeError, ValueError):
        return None
    return values if len(values) == count and all(math.isfinite(v) for v in values) else None


def _tell(study, running: dict, watcher, sweep_dir: str, count: int, slots) -> None:
    """The trials of `running` that have ended told to the study (waiting for the first, with slots), and dropped."""
    from concurrent.futures import Future

    from optuna.trial import TrialState

    futures = {r: n for n, (_, r) in running.items() if isinstance(r, Future)}
    ended = {futures[f] for f in slots.wait_any(futures)} if futures else set(running)
    for number in sorted(ended):
        trial, returned = running.pop(number)
        pruned = watcher.done(number)
        if isinstance(returned, Future):  # a job whose work raised (its error is in the sweep's log) has no value
            returned = None if returned.exception() is not None else returned.result()
        values = _values(sweep_dir, number, returned, count)
        if pruned is not None and values is not None:  # ended cleanly at the step it was pruned
            study.tell(number, state=TrialState.PRUNED)
        elif values is None:
            study.tell(number, state=TrialState.FAIL)
        else:
            study.tell(number, values if len(values) > 1 else values[0])


def _write_results(study, sweep_dir: str, names: list[str]) -> None:
    """optimization_results.yaml, as Hydra's Optuna sweeper wrote it: the best trial, or the Pareto front."""
    from optuna.trial import TrialState

    if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        return
    if len(names) == 1:
        best = study.best_trial
        results = {"name": "optuna", "best_params": best.params, "best_value": best.value, "best_trial": best.number}
    else:
        front = [{"trial": t.number, "params": t.params, "values": t.values} for t in study.best_trials]
        results = {"name": "optuna", "objectives": names, "solutions": front}
    OmegaConf.save(OmegaConf.create(results), os.path.join(sweep_dir, "optimization_results.yaml"))


def run_search(conf: dict, config, launcher, arguments: list[str]) -> None:
    import optuna
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # its lines per trial: the sweep's own log and report tell
    sweep_dir = os.path.abspath(str(config.hydra.sweep.dir))
    os.makedirs(sweep_dir, exist_ok=True)
    names = objectives(config)
    space = search_space.parse(conf.get("params"), arguments)
    validate.sweep_objective(config)
    ways = directions(conf, names)
    pruner = pruning.pruner_of(config.sweep.get("pruner"), names)
    factory, fixed = _sampler_factory(conf, space)  # every refusal before the study is opened (or made)
    storage = conf.get("storage") or f"sqlite:///{os.path.join(sweep_dir, STUDY_FILE)}"
    name = conf.get("study_name") or "sweep"
    stored = {s.study_name: s.n_trials for s in optuna.get_all_study_summaries(storage, include_best_trial=False)}
    study = optuna.create_study(
        storage=storage,
        study_name=name,
        sampler=_sampler(factory, fixed, stored.get(name, 0)),
        directions=ways,
        pruner=pruner,
        load_if_exists=True,
    )
    _changed(study, space, names)
    again = _interrupted(study)
    finished = len([t for t in study.get_trials(deepcopy=False) if t.state != TrialState.WAITING]) - len(again)
    left = int(conf.get("n_trials", 20)) - finished - len(again)
    if "search_space" in fixed:  # grid: each combination once, however many trials were asked for
        left = min(left, math.prod(len(v) for v in fixed["search_space"].values()) - finished - len(again))
    if finished or again:
        log.info("continuing the study in %s: %d trial(s) done, %d interrupted (continued first), %d more to go",
                 sweep_dir, finished, len(again), max(0, left))  # fmt: skip
    os.environ[contract.SWEEP_SIZE] = str(finished + len(again) + max(0, left))  # the jobs' "n of N"
    if pruner is not None:
        os.environ[contract.PRUNE] = "1"  # the jobs evaluate after each epoch and report here (runner.sweeps.pruning)
    subdir = str(OmegaConf.to_container(config.hydra.sweep, resolve=False)["subdir"])
    slots = parallel.current()  # sweep.parallel: one trial per free slot, told as each ends (no batch)
    width = len(slots) if slots is not None else max(1, int(conf.get("n_jobs", 1)))
    running: dict = {}  # trial number -> (trial, what its job returned: its value, or a Future of it)
    stopped = lambda: failures.stopped_by(os.path.join(sweep_dir, STATE_DIR)) is not None  # noqa: E731
    with pruning.Watcher() as watcher:
        while True:
            free = len(running) < width if slots is not None else not running
            if again and free and not stopped():  # one per launch: their numbers need not follow each other
                trials = [again.pop(0)]
                overrides = [_again(trials[0], space, sweep_dir, subdir)]
            elif left > 0 and not again and len(running) < width and not stopped():
                asked = 1 if slots is not None else min(width - len(running), left)  # a slot each, asked as each frees
                trials = [study.ask(space.distributions) for _ in range(asked)]
                overrides = [space.overrides(t.params) for t in trials]
                for trial, given in zip(trials, overrides):
                    trial.set_user_attr("overrides", given)
                left -= len(trials)
            elif running:
                _tell(study, running, watcher, sweep_dir, len(names), slots)
                continue
            else:
                break
            if pruner is not None:
                for trial in trials:
                    if hasattr(trial, "report"):  # asked here (a continued trial is a FrozenTrial: told, not pruned)
                        watcher.add(trial.number, trial, _job_dir(sweep_dir, subdir, trial.number))
            returns = launcher.launch(overrides, initial_job_idx=trials[0].number)
            running |= {trial.number: (trial, _returned(ret)) for trial, ret in zip(trials, returns)}
            if slots is None:  # the launcher's batch has ended
                _tell(study, running, watcher, sweep_dir, len(names), slots)
    _write_results(study, sweep_dir, names)
    search_plots.write(study, sweep_dir, names)
