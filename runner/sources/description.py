"""What MLflow's dataset view needs to know about a run's data, made in the training process without MLflow.

`describe(cfg, data)` returns one small dict per context (train, eval): name, source, digest, schema, profile.
runner.mlflow_process.process turns each into an `mlflow.entities.Dataset` and logs it as the run's input, so the Dataset
column and the dataset filters of the dashboard work. The digest changes when the data change:
- arrays (ones, synthetic, digits, npz, any source that yields runner.sources.in_memory's ArrayData): a hash of the arrays'
  bytes, dtypes and shapes (arrays over HASH_BYTES are hashed on evenly spaced rows, plus their shapes);
- files (data=tfrecord): a hash of each file's name, size and modification time, and of the feature spec. No file
  is read;
- images (data=image_folder): a hash of the listing, each file's path and class (and size and modification time);
- a prepared tfds dataset (data=tfds): its directory's files, as for data=tfrecord, and the split.
"""

import hashlib
import os

import numpy as np

HASH_BYTES = 16 << 20  # per array: hash at most this much of it (a whole row every `stride` rows)
DIGEST_CHARS = 16


def _array_hash(h, a: np.ndarray) -> None:
    h.update(f"{a.dtype.str}{a.shape}".encode())
    stride = max(1, -(-a.nbytes // HASH_BYTES)) if a.ndim else 1
    h.update(np.ascontiguousarray(a[::stride] if a.ndim else a).tobytes())


def _spec(a: np.ndarray) -> dict:
    return {"dtype": a.dtype.name, "shape": list(a.shape[1:])}


def _source(cfg) -> tuple[str, dict]:
    """(MLflow source type, source) for a data node: the file for npz, else the config that made the data."""
    if cfg.name == "npz":
        return "local", {"uri": os.path.abspath(os.path.expanduser(str(cfg.path)))}
    return "code", {"tags": {f"data.{k}": str(v) for k, v in cfg.items() if not isinstance(v, dict | list)}}


def _arrays(cfg, data) -> list[dict]:
    source_type, source = _source(cfg)
    out = []
    for context, x, y in (("train", data.x_train, data.y_train), ("eval", data.x_eval, data.y_eval)):
        h = hashlib.sha256()
        _array_hash(h, x)
        _array_hash(h, y)
        out.append(
            {
                "context": context,
                "name": f"{cfg.name}-{context}",
                "digest": h.hexdigest()[:DIGEST_CHARS],
                "source_type": source_type,
                "source": source,
                "features": _spec(x),
                "targets": _spec(y),
                "profile": {"num_rows": int(len(x)), "features_shape": list(x.shape), "targets_shape": list(y.shape)},
            }
        )
    return out


def _files_digest(files: list[str], spec) -> tuple[str, int | None]:
    """(digest, total bytes or None when a file is remote) from names, sizes and mtimes; no file is opened."""
    h, total = hashlib.sha256(repr(spec).encode()), 0
    for path in files:
        if "://" in path:  # remote: its name only (stat would need TensorFlow's file systems and a round trip)
            h.update(f"{path}\0".encode())
            total = None
            continue
        st = os.stat(path)
        h.update(f"{os.path.abspath(path)}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
        if total is not None:
            total += st.st_size
    return h.hexdigest()[:DIGEST_CHARS], total


def _files(cfg, source) -> list[dict]:
    spec = source.features
    inputs = {"dtype": "float32", "shape": list(source.input_shape)}  # as runner.builders.data.tfrecord parses them
    if source.task == "classification":
        targets = {"dtype": "int32", "shape": []}
    else:
        targets = {"dtype": "float32", "shape": [int(np.prod(spec[source.label][1]))]}
    out = []
    for context, files in (("train", source.train_files), ("eval", source.eval_files)):
        digest, size = _files_digest(files, (spec, source.label))
        profile = {"files": len(files), **({"bytes": size} if size is not None else {})}
        if context == "train" and source.train_records is not None:
            profile["num_rows"] = int(source.train_records)
        pattern = cfg.train_files if context == "train" else (cfg.eval_files if cfg.eval_files is not None else cfg.train_files)
        out.append(
            {
                "context": context,
                "name": f"{cfg.name}-{context}",
                "digest": digest,
                "source_type": "local" if "://" not in str(files[0]) else str(files[0]).split("://")[0],
                "source": {"uri": str(pattern) if isinstance(pattern, str) else ",".join(map(str, pattern))},
                "features": inputs,
                "targets": targets,
                "profile": profile,
            }
        )
    return out


STAT_FILES = 100_000  # an image listing up to this long has each file's size and mtime in its digest


def _images(cfg, source) -> list[dict]:
    """data=image_folder: a digest of each split's listing (paths and classes, and each file's size and mtime
    while the listing is at most STAT_FILES long), the image shape the model gets and the class names."""
    out = []
    for context, pairs, folder in (("train", source.train, cfg.train_dir), ("eval", source.eval, cfg.eval_dir or cfg.train_dir)):
        h = hashlib.sha256(f"{source.classes}{source.input_shape}".encode())
        for path, label in pairs:
            h.update(f"{path}\0{label}\0".encode())
            if len(pairs) <= STAT_FILES:
                st = os.stat(path)
                h.update(f"{st.st_size}\0{st.st_mtime_ns}\0".encode())
        out.append(
            {
                "context": context,
                "name": f"{cfg.name}-{context}",
                "digest": h.hexdigest()[:DIGEST_CHARS],
                "source_type": "local",
                "source": {"uri": os.path.abspath(os.path.expanduser(str(folder)))},
                "features": {"dtype": "float32", "shape": list(source.input_shape)},
                "targets": {"dtype": "int32", "shape": []},
                "profile": {"num_rows": len(pairs), "classes": list(source.classes)},
            }
        )
    return out


def _tfds(cfg, source) -> list[dict]:
    """data=tfds: the prepared dataset's directory (its files' names, sizes and mtimes, as for data=tfrecord) and
    each split's name."""
    files = sorted(os.path.join(d, f) for d, _, names in os.walk(source.directory) for f in names)
    out = []
    for context, split in (("train", source.split_train), ("eval", source.split_eval)):
        digest, size = _files_digest(files, (split, source.image_key, source.label_key, source.input_shape))
        out.append(
            {
                "context": context,
                "name": f"{cfg.name}-{context}",
                "digest": digest,
                "source_type": "local",
                "source": {"uri": f"{os.path.abspath(source.directory)}?split={split}"},
                "features": {"dtype": "float32", "shape": list(source.input_shape)},
                "targets": {"dtype": "int32", "shape": []},
                "profile": {"split": split, **({"num_rows": int(source.train_records)} if context == "train" else {})},
            }
        )
    return out


def describe(cfg, data) -> list[dict]:
    """The train and eval inputs of a run, for MLflow (see the module's docstring); [] for data it cannot describe."""
    if getattr(data, "streamed", False):
        if hasattr(data, "train_files"):
            return _files(cfg, data)
        if hasattr(data, "classes") and hasattr(data, "train"):
            return _images(cfg, data)
        return _tfds(cfg, data) if hasattr(data, "split_train") else []
    if all(hasattr(data, k) for k in ("x_train", "y_train", "x_eval", "y_eval")):
        return _arrays(cfg, data)
    return []
