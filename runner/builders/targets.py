"""A config's `_target_` (model, train.loss, train.optimizer) -> the object its dotted path names, or one line on why
it does not import (Hydra's own locate logs a multi-line error first; the runner says it once, in its paragraph)."""

import importlib
import inspect


def _import(name: str, owner: str, attr: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name == name:  # this module does not exist (not: it exists and imports a missing one)
            raise ImportError(f"{owner} has no attribute {attr!r}" if owner else f"no module named {name!r}") from None
        raise ImportError(f"importing {name} failed: {err}") from None


def locate(path: str):
    """The object at `path`, found as Hydra finds it: the first part imported, then each next part an attribute, or
    a submodule where there is no such attribute. ImportError with one line when there is none."""
    parts = str(path).split(".")
    if not path or not all(parts):
        raise ImportError(f"{path!r} is not a dotted path")
    obj = _import(parts[0], "", parts[0])
    for i, attr in enumerate(parts[1:], 1):
        owner = ".".join(parts[:i])
        if hasattr(obj, attr):
            obj = getattr(obj, attr)
        elif inspect.ismodule(obj):
            obj = _import(f"{owner}.{attr}", owner, attr)
        else:
            raise ImportError(f"{owner} has no attribute {attr!r}")
    return obj


def reason(err: Exception) -> str:
    """An exception as one sentence fragment, without a trailing period."""
    return " ".join(str(err).split()).rstrip(".")


def per_example_function(fn, kwargs) -> bool:
    """A plain function that still needs (y_true, y_pred) once the node's arguments are bound (a user's loss or
    metric function, runner.builders.loss and .metrics)."""
    if inspect.isclass(fn) or not callable(fn):
        return False
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len([p for p in positional if p.name not in kwargs and p.default is p.empty]) >= 2


def probe_examples(data):
    """(x, y, real): two examples to run a user's loss or metric on before the first step: the data's first two, or
    zeros shaped like them (streamed data; real=False, so a failure may be the zeros')."""
    import numpy as np

    x, y = getattr(data, "x_train", None), getattr(data, "y_train", None)
    if x is not None and y is not None and len(x) >= 2:
        return x[:2], y[:2], True
    x = np.zeros((2, *data.input_shape), np.float32)
    y = np.zeros((2,), np.int64) if data.task == "classification" else np.zeros((2, data.num_outputs), np.float32)
    return x, y, False


def callable_at(key: str, target, hint: str):
    """The class or function `{key}._target_` names; ConfigError (one paragraph, ending with `hint`: what it may
    name) when it does not import or is neither."""
    from runner.errors import ConfigError, RunnerError

    what = f"{key}._target_={target!r}"
    try:
        fn = locate(str(target))
    except RunnerError:  # a stop (Ctrl-C, SIGTERM) or a refusal inside it: not the user's error
        raise
    except Exception as err:
        raise ConfigError(f"{what} cannot be imported ({reason(err)}). {hint}") from None
    if not callable(fn):
        raise ConfigError(f"{what} is a {type(fn).__name__}, not a class or a function. {hint}")
    return fn


def ran_on_probe(call, real: bool, refusal) -> bool:
    """A user's function run on the probe examples (`probe_examples`): True when it ran; False when it failed on
    the probe's own zeros (the step, on the real batches, says what is wrong); ConfigError(refusal(err)) when it
    failed on the data's own examples. The runner's own errors (a stop, a refusal inside it) pass through."""
    from runner.errors import ConfigError, RunnerError

    try:
        call()
    except RunnerError:
        raise
    except Exception as err:  # noqa: BLE001  (the user's function on the model's output: said in one line)
        if not real:
            return False
        raise ConfigError(refusal(err)) from None
    return True
