"""Data sources as NumPy arrays: the guide's ones, seeded synthetic data, scikit-learn's digits, a user's .npz.

No TensorFlow here; runner.builders.data.pipeline turns these arrays into (distributed) tf.data pipelines.
"""

import os
from dataclasses import dataclass

import numpy as np

from runner.config import registry
from runner.errors import ConfigError
from runner.sources import checks


@dataclass
class ArrayData:
    x_train: np.ndarray
    y_train: np.ndarray
    x_eval: np.ndarray
    y_eval: np.ndarray
    task: str  # classification | regression
    num_classes: int | None = None
    held_out: bool = False  # the eval rows were held out of the training arrays: errors about them name those

    @property
    def input_shape(self):
        return tuple(self.x_train.shape[1:])

    @property
    def num_outputs(self) -> int:
        if self.task == "classification":
            return int(self.num_classes)
        return 1 if self.y_train.ndim == 1 else int(self.y_train.shape[1])


def split(x, y, fraction, seed):
    order = np.random.default_rng(seed).permutation(len(x))
    n_eval = max(1, int(round(len(x) * fraction)))
    ev, tr = order[:n_eval], order[n_eval:]
    return x[tr], y[tr], x[ev], y[ev]


def ones(cfg) -> ArrayData:
    def arrays(n):
        return np.ones((n, 1), np.float32), np.ones((n, 1), np.float32)

    return ArrayData(*arrays(cfg.num_examples), *arrays(cfg.eval_examples), task="regression")


def synthetic(cfg) -> ArrayData:
    rng = np.random.default_rng(cfg.seed)
    n, f = cfg.num_examples + cfg.eval_examples, cfg.num_features
    x = rng.standard_normal((n, f)).astype(np.float32)
    if cfg.task == "classification":
        w = rng.standard_normal((f, cfg.num_classes)).astype(np.float32)
        y = np.argmax(x @ w + cfg.noise * rng.standard_normal((n, cfg.num_classes)), axis=1).astype(np.int32)
        num_classes = cfg.num_classes
    else:
        w = rng.standard_normal((f, 1)).astype(np.float32) / np.sqrt(f)
        y = (x @ w + cfg.noise * rng.standard_normal((n, 1))).astype(np.float32)
        num_classes = None
    k = cfg.num_examples
    return ArrayData(x[:k], y[:k], x[k:], y[k:], task=cfg.task, num_classes=num_classes)


def digits(cfg) -> ArrayData:
    from sklearn.datasets import load_digits  # ships with scikit-learn: no download

    bunch = load_digits()
    x = (bunch.data / 16.0).astype(np.float32)
    y = bunch.target.astype(np.int32)
    return ArrayData(*split(x, y, cfg.eval_fraction, cfg.seed), task="classification", num_classes=10)


def _read_npz(cfg) -> dict:
    """The arrays the config names, each read on its own so that an error names the array."""
    where = f"data.path={cfg.path!r}"
    path = os.path.expanduser(str(cfg.path))
    try:
        f = np.load(path, allow_pickle=False)
    except Exception as err:  # corrupt, not an npz...
        raise ConfigError(f"{where} could not be read as a .npz file: {err}") from None
    if not isinstance(f, np.lib.npyio.NpzFile):  # a plain .npy: one array, no names
        raise ConfigError(
            f"{where} is a single .npy array, not a .npz archive of named arrays; save it with "
            "np.savez(path, x_train=..., y_train=...)."
        )
    with f:
        missing = [k for k in (cfg.x_train, cfg.y_train) if k not in f.files]
        if missing:
            raise ConfigError(
                f"{where} has no array named {', '.join(missing)}; it holds: {', '.join(sorted(f.files)) or 'nothing'}. "
                "Set data.x_train / data.y_train to the names in the file."
            )
        present = [k for k in (cfg.x_eval, cfg.y_eval) if k in f.files]
        if len(present) == 1:
            absent = cfg.y_eval if present[0] == cfg.x_eval else cfg.x_eval
            raise ConfigError(
                f"{where} has the eval array {present[0]!r} but not {absent!r}; give both (or neither: then "
                f"data.eval_fraction={cfg.eval_fraction} of the training arrays is held out)."
            )
        arrays = {}
        for name in (cfg.x_train, cfg.y_train, *present):
            try:
                arrays[name] = f[name]
            except Exception as err:  # pickled objects (allow_pickle=False), a truncated member...
                raise ConfigError(
                    f"{where}: array {name!r} could not be read ({err}). Save plain numeric arrays "
                    "(no Python objects) with np.savez."
                ) from None
    return arrays


def npz(cfg) -> ArrayData:
    where = f"data.path={cfg.path!r}"
    arrays = _read_npz(cfg)
    x, y = arrays[cfg.x_train], arrays[cfg.y_train]
    # Before any cast or split: the raw arrays, so that errors name the file's own arrays and values.
    checks.check_array(x, cfg.x_train, where, features=True)
    checks.check_array(y, cfg.y_train, where, features=False)
    checks.check_pair(x, y, cfg.x_train, cfg.y_train, where)
    if cfg.x_eval in arrays:
        x_eval, y_eval = arrays[cfg.x_eval], arrays[cfg.y_eval]
        checks.check_array(x_eval, cfg.x_eval, where, features=True)
        checks.check_array(y_eval, cfg.y_eval, where, features=False)
        checks.check_pair(x_eval, y_eval, cfg.x_eval, cfg.y_eval, where)
        splits = (x, y, x_eval, y_eval)
    else:
        if len(x) < 2:
            raise ConfigError(
                f"{where}: {cfg.x_train!r} has {len(x)} example; holding out data.eval_fraction of it "
                f"needs 2 or more (or give {cfg.x_eval!r} and {cfg.y_eval!r})."
            )
        splits = split(x, y, cfg.eval_fraction, cfg.seed)
    held_out = cfg.x_eval not in arrays
    x_train, x_eval = splits[0].astype(np.float32), splits[2].astype(np.float32)
    if cfg.task == "classification":
        # The file's own label arrays, before the split: a bad label held out for eval is still one of y_train's.
        checks.check_label_array(y, cfg.y_train, where)
        if not held_out:
            checks.check_label_array(splits[3], cfg.y_eval, where)
        y_all = np.concatenate([splits[1].ravel(), splits[3].ravel()])
        return ArrayData(
            x_train,
            splits[1].astype(np.int32),
            x_eval,
            splits[3].astype(np.int32),
            task="classification",
            num_classes=int(y_all.max()) + 1,
            held_out=held_out,
        )
    y_train, y_eval = splits[1].astype(np.float32), splits[3].astype(np.float32)
    return ArrayData(x_train, y_train, x_eval, y_eval, task="regression", held_out=held_out)


def describe(cfg) -> str:
    """How errors name a source: the file for npz, else data=<name>."""
    return f"data.path={cfg.path!r}" if cfg.name == "npz" else f"data={cfg.name}"


def load(cfg) -> ArrayData:
    """Load the source, then check it: lengths, shapes, dtypes, finite values, labels (runner.sources.checks)."""
    data = registry.get("data", cfg.name).build(cfg)  # each source's loader, registered in runner.builders.data
    if getattr(data, "streamed", False):
        return data  # data=tfrecord: files, checked record by record in runner.sources.tfrecord, never loaded here
    names = {k: cfg[k] for k in ("x_train", "y_train", "x_eval", "y_eval")} if cfg.name == "npz" else None
    if names and data.held_out:
        names.update(x_eval=names["x_train"], y_eval=names["y_train"])
    checks.check_data(data, describe(cfg), names)
    return data
