"""The composed config, validated, outside a Hydra app: for the commands that read an experiment's config without
running it (python -m runner.export, python -m runner.kubernetes). No TensorFlow."""

import sys

from omegaconf import DictConfig

from runner.errors import ConfigError


class CompositionError(Exception):
    """Hydra could not compose the config from the overrides (an unknown option or key, a value of the wrong type):
    its message as one paragraph. Exit 1, as for python -m runner (docs/errors.md)."""

    exit_code = 1


def composed(overrides: list[str], check: bool = True) -> DictConfig:
    """The runner's config with `overrides`, as `python -m runner` composes it, after the pure checks (ConfigError)
    unless `check` is false. Hydra's refusals raise CompositionError; an override its grammar cannot read, a
    ConfigError with the runner's own paragraph, as python -m runner says it."""
    from hydra import compose, initialize_config_module
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from runner.config import schema
    from runner.config.command_line import unreadable_override_problem
    from runner.config.hydra_private import TRAILER

    problem = unreadable_override_problem(overrides)
    if problem:
        raise ConfigError(problem)
    schema.register()
    OmegaConf.register_new_resolver("runner.or", lambda a, b: a or b, replace=True)
    try:
        with initialize_config_module(config_module="runner.conf", version_base="1.3"):
            cfg = compose(config_name="config", overrides=overrides)
    except (HydraException, OmegaConfBaseException, ValueError) as err:  # ValueError: Hydra's, for `=3`
        said = [TRAILER.sub("", str(err)).strip().removeprefix("Error: ")]
        if isinstance(err.__cause__, OmegaConfBaseException) and not said[0].endswith("Nothing ran."):
            said.append(str(err.__cause__).splitlines()[0])  # what OmegaConf refused, as python -m runner prints it
        raise CompositionError(" ".join(" ".join(said).split())) from None
    if check:
        checked(cfg)
    return cfg


def checked(cfg: DictConfig) -> DictConfig:
    """`cfg` after the pure checks (runner.config.validate.check_config)."""
    from runner.config import validate

    validate.check_config(cfg)
    return cfg


def reported(err: BaseException, overrides=()) -> int | None:
    """For a command's main: one paragraph on stderr for a config that cannot work, and its exit code (a
    CompositionError 1, a ConfigError or an interpolation that cannot be resolved 2); None for any other error."""
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(err, OmegaConfBaseException):  # an interpolation read while checking or using the config
        from runner.config.interpolation import explain

        text, code = explain(err, overrides=overrides) or str(err).splitlines()[0], 2
    elif isinstance(err, (CompositionError, ConfigError)):
        text, code = str(err), err.exit_code
    else:
        return None
    print(f"Error: {text.removeprefix('Error: ')}", file=sys.stderr)
    return code
