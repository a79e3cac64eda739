"""A sweep job's child run is named by what differs between the jobs: its values of the swept keys
(`strategy=mirrored executor=fit`, `learning_rate=0.0303 global_batch_size=128`), never a random name. The sweep
finds the swept keys once (`swept_keys`: the command line's sweeps and hydra.sweeper.params', by Hydra's own parser)
and each job names its run from its own overrides (`job_run_name`). No mlflow, no Optuna here.
"""

import re

MAX_LENGTH = 200  # MLflow takes 250 characters in a run name
NUMBER = re.compile(r"^-?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?$")


def swept_keys(task_overrides, params) -> list[str]:
    """The keys whose value differs between jobs: the sweep overrides of the command line and of the sweeper's
    params, in the order given."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    texts = [*(f"{k}={v}" for k, v in (params or {}).items()), *task_overrides]
    keys = []
    for override in OverridesParser.create().parse_overrides(texts):
        key = override.get_key_element().lstrip("+~")
        if override.is_sweep_override() and key not in keys:
            keys.append(key)
    return keys


def _value(text: str) -> str:
    """A float's value to 4 significant digits (a sampled learning rate has 17); any other value as given."""
    if NUMBER.match(text) and any(c in text for c in ".eE"):
        return f"{float(text):.4g}"
    return text


def job_run_name(overrides, keys: list[str]) -> str | None:
    """`key=value ...` for the swept keys among a job's overrides (keys shortened to their last part where that is
    unambiguous); None when none of them is there."""
    given = {}
    for override in overrides:
        key, sep, value = override.lstrip("+~").partition("=")
        if sep and key in keys:
            given[key] = value
    if not given:
        return None
    last = [k.rsplit(".", 1)[-1] for k in given]
    names = [short if last.count(short) == 1 else key for key, short in zip(given, last)]
    return " ".join(f"{name}={_value(value)}" for name, value in zip(names, given.values()))[:MAX_LENGTH]
