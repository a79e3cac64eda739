"""The arguments a `model._target_` is called with: the keys the user gave, plus what the data determines under the
names Keras users write (`input_shape`, `num_outputs`, `num_classes`, `num_features`), each only where the function
or class takes it. Keys a built-in `model=` option brought along (model=mlp's hidden_units and activation, when
`model._target_` names another function on the command line) are left out where the target does not take them:
they were never the user's. No TensorFlow here.
"""

import inspect
from dataclasses import dataclass, field

from runner.errors import ConfigError


@dataclass
class Arguments:
    kwargs: dict
    left_out: list[str] = field(default_factory=list)  # the built-in option's keys the target does not take


def data_values(input_shape, num_outputs: int, task: str) -> dict:
    """What the data determines, by every name a model function may give it."""
    values = {"input_shape": tuple(input_shape), "num_outputs": int(num_outputs)}
    if task == "classification":
        values["num_classes"] = int(num_outputs)
    if len(values["input_shape"]) == 1:
        values["num_features"] = values["input_shape"][0]
    return values


def _is_keras_model_class(fn) -> bool:
    """A Model subclass: its **kwargs go to Keras' Model.__init__, which takes none of the runner's names."""
    return inspect.isclass(fn) and any(c.__name__ == "Model" and "keras" in c.__module__ for c in fn.__mro__)


def parameters(fn) -> tuple[dict, bool]:
    """(named parameters, whether it takes **kwargs); a callable with no signature to read takes anything."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin or C function
        return {}, True
    named = {n: p for n, p in params.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    return named, any(p.kind is p.VAR_KEYWORD for p in params.values()) and not _is_keras_model_class(fn)


def arguments(fn, target: str, given: dict, data: dict, inherited: dict) -> Arguments:
    """The keyword arguments for `fn`; ConfigError naming the user's own keys that it does not take.

    `given`: the model node without `_target_`; `inherited`: those of its keys a built-in option brought."""
    named, takes_any = parameters(fn)
    kwargs, left_out = {}, []
    for key, value in given.items():
        if key in inherited and key not in named:
            left_out.append(key)
        else:
            kwargs[key] = value
    unknown = [k for k in kwargs if k not in named and not takes_any]
    if unknown:
        takes = ", ".join(named) or "no keyword arguments"
        raise ConfigError(
            f"model._target_={target!r} does not take {', '.join(f'model.{k}' for k in unknown)} (it takes: {takes}; "
            f"the runner fills {', '.join(k for k in data if k in named) or 'none of them'} from the data). Remove "
            f"{'it' if len(unknown) == 1 else 'them'} ({' '.join(repr('~model.' + k) for k in unknown)} on the command line, "
            "or out of your YAML), or rename it to one of its parameters."
        )
    for key, value in data.items():
        if key in named or (takes_any and key in ("input_shape", "num_outputs")):  # **kwargs: the two it always got
            kwargs.setdefault(key, value)
    return Arguments(kwargs, left_out)


def called_wrong(target: str, err: Exception, args: Arguments, data: dict) -> ConfigError:
    """A TypeError from calling the target (a required parameter nobody fills, a key it rejects itself) as one
    paragraph naming what it was given."""
    from runner.builders.targets import reason

    filled = [k for k in args.kwargs if k in data]
    own = [k for k in args.kwargs if k not in data]
    parts = [f"model.{k}" for k in own] + [f"{k} (from the data)" for k in filled]
    return ConfigError(
        f"model._target_={target!r} could not be called with {', '.join(parts) or 'no arguments'}: {reason(err)}. "
        f"The runner fills {', '.join(data)} from the data where the function (or the Model subclass' __init__) "
        "names them; give any other parameter as model.<name>=<value> (or +model.<name>=... for a key the config lacks)."
    )
