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
