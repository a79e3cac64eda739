"""Which of the model node's keys a built-in `model=` option brought, when `model._target_` names another function.

`python -m runner model._target_=my_model.make_model` keeps Hydra's default `model=mlp`, so the node still holds
mlp.yaml's hidden_units and activation: keys the user never gave. The model builder leaves them out where the user's
function does not take them (runner.builders.model_args). No TensorFlow, no Hydra needed (a task's own composition
has no HydraConfig: then nothing is inherited and every key counts as the user's).
"""

from importlib import resources

from omegaconf import DictConfig, OmegaConf


def chosen_option(group: str) -> str | None:
    """The group's option Hydra composed (model=mlp -> 'mlp'), or None outside a Hydra run."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return HydraConfig.get().runtime.choices.get(group) if HydraConfig.initialized() else None
    except Exception:  # noqa: BLE001  (no Hydra here: a test, a task's own composition)
        return None


def builtin_option(group: str, option: str | None) -> dict | None:
    """The runner's own conf/<group>/<option>.yaml as a dict, or None when the option is not one of the runner's."""
    if not option:
        return None
    path = resources.files("runner.conf").joinpath(group, f"{option}.yaml")
    if not path.is_file():
        return None
    return OmegaConf.to_container(OmegaConf.create(path.read_text()), resolve=False)


def inherited_model_keys(model: DictConfig, option: str | None = None) -> dict:
    """The keys of `model` that the built-in option brought unchanged, when its `_target_` is not that option's."""
    builtin = builtin_option("model", option if option is not None else chosen_option("model"))
    if not builtin or builtin.get("_target_") == model.get("_target_"):
        return {}
    given = OmegaConf.to_container(model, resolve=True)
    return {k: v for k, v in builtin.items() if k != "_target_" and k in given and given[k] == v}
