"""The composed config, validated, outside a Hydra app: for the commands that read an experiment's config without
running it (python -m runner.export, python -m runner.kubernetes). No TensorFlow."""

from omegaconf import DictConfig


class CompositionError(Exception):
    """Hydra could not compose the config from the overrides (an unknown option or key, a value of the wrong type):
    its message as one paragraph. Exit 1, as for python -m runner (docs/errors.md)."""

    exit_code = 1


def composed(overrides: list[str], check: bool = True) -> DictConfig:
    """The runner's config with `overrides`, as `python -m runner` composes it, after the pure checks (ConfigError)
    unless `check` is false. Hydra's refusals raise CompositionError."""
    from hydra import compose, initialize_config_module
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from runner.config import schema, validate
    from runner.config.hydra_private import TRAILER

    schema.register()
    OmegaConf.register_new_resolver("runner.or", lambda a, b: a or b, replace=True)
    try:
        with initialize_config_module(config_module="runner.conf", version_base="1.3"):
            cfg = compose(config_name="config", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as err:
        said = [TRAILER.sub("", str(err)).strip().removeprefix("Error: ")]
        if isinstance(err.__cause__, OmegaConfBaseException) and not said[0].endswith("Nothing ran."):
            said.append(str(err.__cause__).splitlines()[0])  # what OmegaConf refused, as python -m runner prints it
        raise CompositionError(" ".join(" ".join(said).split())) from None
    if check:
        try:
            validate.check_config(cfg)
        except OmegaConfBaseException as err:  # an interpolation that cannot be resolved: exit 2, as python -m runner
            from runner.config.interpolation import explain
            from runner.errors import ConfigError

            raise ConfigError(explain(err, overrides=overrides) or str(err).splitlines()[0]) from None
    return cfg
