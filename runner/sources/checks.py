"""Checks on the data a run will train on, and on whether it fits in memory: NumPy only, no TensorFlow.

Each check raises ConfigError (exit 2) with one paragraph naming the file or source, the array, the bad value
and what to do. runner.sources.in_memory calls them on every source right after loading; runner.config.validate calls the
memory estimate before TensorFlow is imported, for the sources whose sizes the config already says.
"""

import os

import numpy as np

from runner.errors import ConfigError

MAX_CLASSES = 1_000_000  # a label past this is an id, not a class index: the output layer would not fit
BATCH_COPIES = 4  # the batch, its prefetched successor, its per-replica split, and one spare
ACTIVATION_BYTES = 1024  # per example in a batch: activations and their gradients in a small model
DATA_COPIES = 3  # the arrays, tf.data's copy of them, and the cast or shuffle on the way


def _shape(a) -> str:
    return "(" + ", ".join(map(str, a.shape)) + ("," if a.ndim == 1 else "") + ")"


def check_array(a, name: str, where: str, *, features: bool) -> None:
    """One array: numeric, at least 1-D (2-D for features), non-empty, finite."""
    if not isinstance(a, np.ndarray):
        raise ConfigError(f"{where}: {name} is a {type(a).__name__}, not a NumPy array.")
    if a.dtype.kind not in "biuf":
        raise ConfigError(
            f"{where}: array {name!r} holds {a.dtype} values ({_kind(a.dtype)}); training needs numbers (int, uint, "
            "float or bool). Convert it with .astype('float32') (or 'int64' for class labels) before saving."
        )
    if a.ndim == 0:
        raise ConfigError(f"{where}: array {name!r} is a single value (shape ()); it needs one row per example.")
    if len(a) == 0:
        raise ConfigError(f"{where}: array {name!r} is empty (shape {_shape(a)}); it needs at least one example.")
    if features and a.ndim < 2:
        raise ConfigError(
            f"{where}: array {name!r} has shape {_shape(a)}, one number per example but no feature axis; reshape it "
            f"to ({len(a)}, 1) (x.reshape(-1, 1)) or ({len(a)}, num_features)."
        )
    if 0 in a.shape[1:]:
        raise ConfigError(f"{where}: array {name!r} has shape {_shape(a)}: its examples have no values.")
    if a.dtype.kind == "f":
        bad = ~np.isfinite(a)
        if bad.any():
            index = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ConfigError(
                f"{where}: array {name!r} holds {int(bad.sum())} non-finite value(s) (NaN or inf), the first "
                f"{a[index]} at index {list(index)}; training on them makes the loss NaN. Drop or fill those rows."
            )


def _kind(dtype) -> str:
    return {
        "U": "text",
        "S": "bytes",
        "O": "Python objects",
        "V": "records",
        "c": "complex numbers",
        "M": "dates",
        "m": "time spans",
    }.get(dtype.kind, "not numbers")


def check_pair(x, y, x_name: str, y_name: str, where: str) -> None:
    if len(x) != len(y):
        longer = y_name if len(y) > len(x) else x_name
        raise ConfigError(
            f"{where}: {x_name!r} has {len(x)} examples but {y_name!r} has {len(y)}; every example needs exactly one "
            f"label, so they must have the same length (first axis). {longer!r} is longer: check that both come from the "
            "same rows."
        )


def check_data(data, where: str, names: dict | None = None) -> None:
    """A loaded ArrayData (runner.sources.in_memory): every array, lengths, train/eval shapes, labels for the task."""
    names = {"x_train": "x_train", "y_train": "y_train", "x_eval": "x_eval", "y_eval": "y_eval", **(names or {})}
    for key in ("x_train", "y_train", "x_eval", "y_eval"):
        check_array(getattr(data, key), names[key], where, features=key.startswith("x"))
    check_pair(data.x_train, data.y_train, names["x_train"], names["y_train"], where)
    check_pair(data.x_eval, data.y_eval, names["x_eval"], names["y_eval"], where)
    if data.x_train.shape[1:] != data.x_eval.shape[1:]:
        raise ConfigError(
            f"{where}: training and eval examples differ in shape: {names['x_train']!r} has {data.x_train.shape[1:]} per "
            f"example, {names['x_eval']!r} has {data.x_eval.shape[1:]}. The model takes one input shape; give both the same "
            "features."
        )
    if data.y_train.shape[1:] != data.y_eval.shape[1:]:
        raise ConfigError(
            f"{where}: training and eval labels differ in shape: {names['y_train']!r} has {data.y_train.shape[1:]} per "
            f"example, {names['y_eval']!r} has {data.y_eval.shape[1:]}."
        )
    if data.task == "classification":
        check_labels(data, where, names)
    elif data.y_train.ndim > 2:
        raise ConfigError(
            f"{where}: data.task=regression needs targets of shape (n,) or (n, outputs); {names['y_train']!r} has shape "
            f"{_shape(data.y_train)}. Flatten each example's targets."
        )


def check_labels(data, where: str, names: dict) -> None:
    for key in ("y_train", "y_eval"):
        check_label_array(getattr(data, key), names[key], where, data.num_classes)
    if data.num_classes is not None and data.num_classes < 2:
        arrays = " and ".join(repr(n) for n in dict.fromkeys([names["y_train"], names["y_eval"]]))
        raise ConfigError(
            f"{where}: data.task=classification needs at least two classes, but every label in {arrays} is 0. Check "
            "the labels, or use data.task=regression."
        )


def check_label_array(y, name: str, where: str, num_classes: int | None = None) -> None:
    """One array of class labels: integers, one per example, 0..num_classes-1 (or below MAX_CLASSES)."""
    if y.dtype.kind not in "biu":
        raise ConfigError(
            f"{where}: data.task=classification needs integer class labels in {name!r}, got {y.dtype}. "
            "Use data.task=regression for real-valued targets, or convert the labels to class indices 0..K-1."
        )
    if y.ndim > 2 or (y.ndim == 2 and y.shape[1] != 1):
        raise ConfigError(
            f"{where}: data.task=classification needs one class index per example in {name!r} (shape (n,) or "
            f"(n, 1)); it has shape {_shape(y)}. One-hot labels? Save y.argmax(axis=1) instead."
        )
    low, high = int(y.min()), int(y.max())
    if low < 0:
        raise ConfigError(
            f"{where}: {name!r} holds the label {low}; class labels must be 0..num_classes-1. Map them to "
            "class indices first (np.unique(y, return_inverse=True)[1])."
        )
    if high >= MAX_CLASSES:
        raise ConfigError(
            f"{where}: {name!r} holds the label {high}: a model would need {high + 1} outputs. Class labels must be "
            "indices 0..num_classes-1; map ids to indices first (np.unique(y, return_inverse=True)[1])."
        )
    if num_classes is not None and high >= num_classes:
        raise ConfigError(
            f"{where}: {name!r} holds the label {high}, but there are {num_classes} classes (labels 0..{num_classes - 1})."
        )


# --- memory ---
def available_memory() -> int | None:
    """Bytes this process can still allocate: MemAvailable, capped by a cgroup limit; None if unknown."""
    found = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
    except OSError:
        try:
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):
            pass
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            with open(limit_file) as f:
                limit = f.read().strip()
            with open(usage_file) as f:
                usage = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 1 << 60:
            found.append(max(0, int(limit) - usage))
    return min(found) if found else None


def gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB" if n >= 2**28 else f"{n / 2**20:.0f} MiB"


def check_batch_memory(global_batch_size: int, example_bytes: int, where: str, available: int | None = None) -> None:
    """Refuse a global batch whose memory clearly does not fit (the data repeat, so a batch can exceed the data)."""
    available = available_memory() if available is None else available
    if available is None:
        return
    need = global_batch_size * (BATCH_COPIES * example_bytes + ACTIVATION_BYTES)
    if need > available:
        fits = max(1, available // (BATCH_COPIES * example_bytes + ACTIVATION_BYTES))
        raise ConfigError(
            f"train.global_batch_size={global_batch_size} would need about {gib(need)} of memory ({global_batch_size} "
            f"examples x ({BATCH_COPIES} copies x {example_bytes} bytes + ~{ACTIVATION_BYTES} bytes of activations)) with "
            f"{where}, but this machine has {gib(available)} available. Use a global batch of at most ~{fits}."
        )


def check_data_memory(
    key: str, value: int, num_examples: int, example_bytes: int, where: str, available: int | None = None
) -> None:
    """Refuse generating data that clearly does not fit in memory (`key=value` is the setting that makes it big)."""
    available = available_memory() if available is None else available
    if available is None:
        return
    need = num_examples * example_bytes * DATA_COPIES
    if need > available:
        fits = max(1, available // (example_bytes * DATA_COPIES))
        raise ConfigError(
            f"{key}={value} would need about {gib(need)} of memory for {where} ({num_examples} examples in all x "
            f"{example_bytes} bytes x {DATA_COPIES} copies), but this machine has {gib(available)} available. "
            f"Use at most ~{fits} examples in all."
        )
