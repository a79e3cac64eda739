"""Data sources as NumPy arrays: the guide's ones, seeded synthetic data, scikit-learn's digits, a user's .npz.

No TensorFlow here; runner/builders/data.py turns these arrays into (distributed) tf.data pipelines.
"""

import os
from dataclasses import dataclass
from typing import Optional

import numpy as np

from runner.errors import ConfigError


@dataclass
class ArrayData:
    x_train: np.ndarray
    y_train: np.ndarray
    x_eval: np.ndarray
    y_eval: np.ndarray
    task: str  # classification | regression
    num_classes: Optional[int] = None

    @property
    def input_shape(self):
        return tuple(self.x_train.shape[1:])

    @property
    def num_outputs(self) -> int:
        if self.task == "classification":
            return int(self.num_classes)
        return 1 if self.y_train.ndim == 1 else int(self.y_train.shape[1])


def _split(x, y, fraction, seed):
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
    return ArrayData(*_split(x, y, cfg.eval_fraction, cfg.seed), task="classification", num_classes=10)


def npz(cfg) -> ArrayData:
    path = os.path.expanduser(str(cfg.path))
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except Exception as err:  # corrupt, not an npz, pickled objects...
        raise ConfigError(f"data.path={cfg.path!r} could not be read as a .npz file: {err}") from None
    missing = [k for k in (cfg.x_train, cfg.y_train) if k not in arrays]
    if missing:
        raise ConfigError(
            f"data.path={cfg.path!r} has no array named {', '.join(missing)}; it holds: {', '.join(sorted(arrays)) or 'nothing'}. "
            "Set data.x_train / data.y_train to the names in the file."
        )
    x, y = arrays[cfg.x_train].astype(np.float32), arrays[cfg.y_train]
    if cfg.x_eval in arrays and cfg.y_eval in arrays:
        splits = (x, y, arrays[cfg.x_eval].astype(np.float32), arrays[cfg.y_eval])
    else:
        splits = _split(x, y, cfg.eval_fraction, cfg.seed)
    if cfg.task == "classification":
        y_all = np.concatenate([splits[1].ravel(), splits[3].ravel()])
        if not np.issubdtype(y_all.dtype, np.integer):
            raise ConfigError(f"data.task=classification needs integer labels in {cfg.y_train!r}; got {y_all.dtype}. Use data.task=regression.")
        splits = (splits[0], splits[1].astype(np.int32), splits[2], splits[3].astype(np.int32))
        return ArrayData(*splits, task="classification", num_classes=int(y_all.max()) + 1)
    return ArrayData(splits[0], splits[1].astype(np.float32), splits[2], splits[3].astype(np.float32), task="regression")


SOURCES = {"ones": ones, "synthetic": synthetic, "digits": digits, "npz": npz}


def load(cfg) -> ArrayData:
    data = SOURCES[cfg.name](cfg)
    if len(data.x_train) == 0:
        raise ConfigError(f"data={cfg.name} has no training examples.")
    return data
