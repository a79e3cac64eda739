"""`hydra/sweeper=optuna`: the runner's own Hydra sweeper on the current Optuna (runner.sweeps.search), with the
config that Hydra's Optuna sweeper users know (`hydra.sweeper.params` with choice / interval / range /
tag(log, ...), `n_trials`, `n_jobs`, `direction`, `hydra/sweeper/sampler=<name>` with its `seed`). No Optuna here:
config-only commands load this module.

The study lives in `<hydra.sweep.dir>/optuna.db` (SQLite) unless `storage` names another: running the same command
again with the same `hydra.sweep.dir` continues it to `n_trials` in all, and Optuna's own tools read it
(`optuna-dashboard sqlite:///<dir>/optuna.db`).
"""

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore

SWEEPER_TARGET = "hydra_plugins.runner_sweeper.RunnerOptunaSweeper"
STUDY_FILE = "optuna.db"
STATE_DIR = ".runner"  # the sweep's state directory (runner.sweeps.sweep): how each job ended


@dataclass
class SamplerConf:
    _target_: str = "optuna.samplers.TPESampler"
    _partial_: bool = True  # made by the search: GridSampler needs the search space, known only then
    seed: int | None = None


# name -> Optuna's sampler class: `hydra/sweeper/sampler=<name>` (grid's search space is filled in from the params)
SAMPLERS = {
    "tpe": "optuna.samplers.TPESampler",  # the default; several objectives too
    "random": "optuna.samplers.RandomSampler",
    "grid": "optuna.samplers.GridSampler",  # every combination of choice(...) and range(...) values, once
    "cmaes": "optuna.samplers.CmaEsSampler",  # intervals only (numbers): CMA-ES
    "gp": "optuna.samplers.GPSampler",  # Gaussian process (needs PyTorch: pip install torch)
    "nsgaii": "optuna.samplers.NSGAIISampler",  # several objectives (a Pareto front): NSGA-II
}


@dataclass
class OptunaSweeperConf:
    _target_: str = SWEEPER_TARGET
    defaults: list[Any] = field(default_factory=lambda: ["_self_", {"sampler": "tpe"}])  # the chosen sampler over self
    sampler: Any = None
    # minimize or maximize; a list, one per objective, when sweep.objective is a list
    direction: Any = "minimize"
    study_name: str = "sweep"
    storage: str | None = None  # an Optuna storage URL; None: sqlite:///<hydra.sweep.dir>/optuna.db
    n_trials: int = 20  # trials in all, counting those of an earlier run of the same sweep
    n_jobs: int = 1  # trials asked of Optuna at a time (a launcher such as joblib runs them side by side)
    params: dict[str, Any] | None = None  # key: a sweep of Hydra's override grammar, or a fixed value


def register(cs: ConfigStore) -> None:
    cs.store(group="hydra/sweeper", name="optuna", node=OptunaSweeperConf, provider="runner")
    for name, target in SAMPLERS.items():
        cs.store(group="hydra/sweeper/sampler", name=name, node=SamplerConf(_target_=target), provider="runner")
