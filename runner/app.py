"""Hydra entry point. Config-only paths (--help, --cfg, validation) never import TensorFlow."""

import sys

import hydra
from omegaconf import DictConfig

from runner import schema
from runner.errors import ConfigError
from runner.validate import validate

schema.register()


def run(cfg: DictConfig) -> dict:
    """Validate, then train. Returns the run summary (MLflow run id, final metrics)."""
    validate(cfg)
    from runner.experiment import run_experiment  # imports TensorFlow

    return run_experiment(cfg)


@hydra.main(version_base="1.3", config_path="pkg://runner.conf", config_name="config")
def main(cfg: DictConfig) -> None:
    try:
        run(cfg)
    except ConfigError as err:
        # A config mistake: one readable message on stderr, no stack trace.
        print(f"Error: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
