"""A config's `_target_` (model, train.loss, train.optimizer) -> the object its dotted path names, or one line on why
it does not import (Hydra's own locate logs a multi-line error first; the runner says it once, in its paragraph)."""

import importlib


def locate(path: str):
    """The object at `path` (`package.module.attribute[.attribute...]`); ImportError with one line when none."""
    parts = str(path).split(".")
    if not path or not all(parts):
        raise ImportError(f"{path!r} is not a dotted path")
    module, found = None, 0
    for n in range(len(parts), 0, -1):  # the longest importable module prefix
        name = ".".join(parts[:n])
        try:
            module, found = importlib.import_module(name), n
            break
        except ModuleNotFoundError as err:
            if err.name is None or not name.startswith(err.name):  # a module that exists and imports a missing one
                raise ImportError(f"importing {name} failed: {err}") from None
    if module is None:
        raise ImportError(f"no module named {parts[0]!r}")
    obj = module
    for attr in parts[found:]:
        if not hasattr(obj, attr):
            raise ImportError(f"{'.'.join(parts[:found])} has no attribute {attr!r}")
        obj = getattr(obj, attr)
    return obj


def reason(err: Exception) -> str:
    """An exception as one sentence fragment, without a trailing period."""
    return " ".join(str(err).split()).rstrip(".")
