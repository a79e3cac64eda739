"""executor -> the function that trains and evaluates a Job. Each option registers its schema and capabilities here
(runner/registry.py); its YAML is conf/executor/<name>.yaml. The training loops themselves are runner/executors/,
whose get_executor() the builders return."""

from dataclasses import dataclass
from enum import StrEnum

from omegaconf import MISSING

from runner.fields import choice
from runner.registry import describe, get, option

describe("executor", "the training loop")


class Verbose(StrEnum):
    auto = "auto"  # a progress bar on a terminal, log lines otherwise
    quiet = "0"
    bar = "1"
    lines = "2"


@dataclass
class ExecutorConfig:
    name: str = MISSING
    verbose: str = choice(Verbose, "auto")


@option("executor", "fit", schema=ExecutorConfig, help="Model.fit + evaluate")
def _fit(cfg):
    from runner.executors import get_executor

    return get_executor("fit")


@option(
    "executor", "custom_loop", schema=ExecutorConfig, help="GradientTape + strategy.run + compute_average_loss + strategy.reduce"
)
def _custom_loop(cfg):
    from runner.executors import get_executor

    return get_executor("custom_loop")  # under parameter_server, the coordinator's loop


def build_executor(cfg):
    """The executor function for `executor=<name>`; an unknown name is a ConfigError listing the valid ones."""
    return get("executor", cfg.name).build(cfg)
