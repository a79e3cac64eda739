"""executor -> the function that trains and evaluates a Job (`runner.executors`: `run_fit`, `run_custom_loop`,
`run_ps_loop`). Each option registers its schema and capabilities here, once; its YAML is conf/executor/<name>.yaml.
A new executor is a module in runner.executors with a `run_<name>(job) -> Result`, an option here and a YAML."""

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from omegaconf import MISSING

from runner.config.fields import choice
from runner.config.registry import describe, get, option

describe("executor", "the training loop")


class Verbose(StrEnum):
    auto = "auto"  # a progress bar on a terminal, otherwise log lines at most one a second
    quiet = "0"
    bar = "1"
    lines = "2"


@dataclass
class ExecutorConfig:
    name: str = MISSING
    # progress: auto (a bar on a terminal, else log lines at most one a second), 0 nothing, 1 Keras' bar, 2 a line every
    # train.log_every_n_steps steps
    verbose: str = choice(Verbose, "auto")


@dataclass
class FitConfig(ExecutorConfig):
    # your own tf_keras callbacks, each `{_target_: module.Class, <its arguments>}`, after the runner's own
    callbacks: list[Any] = field(default_factory=list)


@option("executor", "fit", schema=FitConfig, help="Model.fit + evaluate")
def _fit(cfg):
    from runner.executors.fit import run_fit

    return run_fit


@option(
    "executor", "custom_loop", schema=ExecutorConfig, help="GradientTape + strategy.run + compute_average_loss + strategy.reduce"
)
def _custom_loop(cfg):
    return _custom_loop_run


def _custom_loop_run(job):
    if job.parameter_server:  # the coordinator's loop schedules the steps on the workers
        from runner.executors.ps_loop import run_ps_loop

        return run_ps_loop(job)
    from runner.executors.custom_loop import run_custom_loop

    return run_custom_loop(job)


def build_executor(cfg):
    """The function that runs `executor=<name>` on a Job; an unknown name is a ConfigError listing the valid ones."""
    return get("executor", cfg.name).build(cfg)
