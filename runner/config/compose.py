"""The composed config, validated, outside a Hydra app: for the commands that read an experiment's config without
running it (python -m runner.export, python -m runner.kubernetes). No TensorFlow."""

from omegaconf import DictConfig


def composed(overrides: list[str], check: bool = True) -> DictConfig:
    """The runner's config with `overrides`, as `python -m runner` composes it, after the pure checks (ConfigError)
    unless `check` is false."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from runner.config import schema, validate

    schema.register()
    OmegaConf.register_new_resolver("runner.or", lambda a, b: a or b, replace=True)
    with initialize_config_module(config_module="runner.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    if check:
        validate.check_config(cfg)
    return cfg
