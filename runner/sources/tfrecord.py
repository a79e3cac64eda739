"""data=tfrecord before TensorFlow: which files, which features, how many records. Every problem is a ConfigError
naming the key and the file, found by the pre-flight probe (`registry.register` in runner.builders.data.tfrecord) before
TensorFlow starts, rather than as a C++ error at the first step.

The feature spec comes from the config (data.features, data.label, data.task, data.num_classes) or, for what the
config leaves null, from the spec file `python -m runner.export` writes beside the files (tfrecord.json), which
also holds each file's record count: the steps of an epoch are known without reading the data. Without it, local
files are counted once by seeking from record header to record header (runner.sources.tfrecord_format).

Paths with a scheme (gs://, s3://, hdfs://...) are left to tf.io.gfile when the pipeline is built: they are not
probed here, their spec must be in the config, and train.steps_per_epoch must be set unless the spec file counts them.
"""

import glob
import json
import logging
import math
import os
from dataclasses import dataclass

from runner.errors import ConfigError
from runner.sources.tfrecord_format import NotTFRecord, count_records, example_features, first_record

SPEC_FILE = "tfrecord.json"  # beside the files: features, label, task, num_classes, records per file
ID_FEATURE = "id"  # int64 written by runner.export in every record: which records a worker read (data.record_ids_dir)
STORED_AS = {"float32": "float", "int64": "int64"}  # data.features.<name>.dtype -> the Example's value list

log = logging.getLogger("runner")


def remote(path: str) -> bool:
    return "://" in path


@dataclass
class TFRecordSource:
    """What the model and the pipeline need, without reading the data: files, spec, record counts."""

    train_files: list[str]
    eval_files: list[str]
    features: dict[str, tuple[str, tuple[int, ...]]]  # name -> (dtype, shape), in spec order
    label: str
    task: str
    num_classes: int | None
    train_records: int | None  # None: not known before reading (remote files without a spec file)
    streamed = True  # runner.builders.data.pipeline: build the file pipeline, not the in-memory one

    @property
    def inputs(self) -> list[str]:
        """The model's input features: every feature but the label (several are flattened and concatenated)."""
        return [name for name in self.features if name != self.label]

    @property
    def input_shape(self) -> tuple[int, ...]:
        if len(self.inputs) == 1:
            return self.features[self.inputs[0]][1] or (1,)
        return (sum(math.prod(self.features[name][1]) for name in self.inputs),)

    @property
    def num_outputs(self) -> int:
        if self.task == "classification":
            return int(self.num_classes)
        return math.prod(self.features[self.label][1])


def resolve_files(key: str, value) -> list[str]:
    """A glob pattern or a list of them (or of files) -> the files, sorted per pattern; remote ones as given."""
    if value is None:
        raise ConfigError(f"{key} is not set; give a glob pattern (data/train-*.tfrecord) or a list of TFRecord files.")
    patterns = [value] if isinstance(value, str) else [str(v) for v in value]
    if not patterns:
        raise ConfigError(f"{key}=[] names no file; give a glob pattern or a list of TFRecord files.")
    files = []
    for pattern in patterns:
        if remote(pattern):
            files.append(pattern)
            continue
        matched = [p for p in sorted(glob.glob(os.path.expanduser(pattern))) if os.path.isfile(p)]
        if not matched:
            raise ConfigError(
                f"{key}={pattern!r} matches no file (looked in {os.path.abspath(os.path.expanduser(pattern))}). "
                "Write TFRecord files with: python -m runner.export <data overrides> --out DIR --shards N."
            )
        files += matched
    return files


def read_spec_file(files: list[str]) -> dict:
    """The spec file beside the first local file ({} when there is none)."""
    local = [f for f in files if not remote(f)]
    if not local:
        return {}
    path = os.path.join(os.path.dirname(os.path.abspath(local[0])), SPEC_FILE)
    if not os.path.isfile(path):
        return {}
    try:
        with open(path) as f:
            spec = json.load(f)
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path} (the spec file beside data.train_files) cannot be read as JSON: {err}") from None
    _check_spec_file(path, spec)
    return spec | {"_dir": os.path.dirname(path)}


def _whole(n) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 0


def _check_spec_file(path: str, spec) -> None:
    """The spec file's shape (a hand-written one may differ from what runner.export writes): named, not a TypeError."""
    what = f"{path} (the spec file beside data.train_files)"
    if not isinstance(spec, dict):
        raise ConfigError(f"{what} holds a JSON {type(spec).__name__}, not an object of features, label and records.")
    records = spec.get("records") or {}  # null: none, as absent
    if not isinstance(records, dict):
        raise ConfigError(f'{what}: "records" must map each file name to [records, bytes]; it is {records!r}.')
    for name, entry in records.items():
        if not (isinstance(entry, list) and len(entry) == 2 and all(_whole(n) for n in entry)):
            raise ConfigError(
                f'{what}: "records" holds {name!r}: {entry!r}; each file name maps to [records, bytes], two whole '
                'numbers (python -m runner.export writes them). Fix the entry, or remove "records" and the files are '
                "counted instead."
            )


def _features(raw) -> dict[str, tuple[str, tuple[int, ...]]]:
    """data.features (or the spec file's) as {name: (dtype, shape)}; a malformed entry is named."""
    if not hasattr(raw, "items"):
        raise ConfigError(f"data.features must map feature names to {{dtype, shape}}; got {raw!r}.")
    out = {}
    for name, entry in raw.items():
        try:
            dtype, shape = str(entry["dtype"]), tuple(int(d) for d in entry.get("shape", []))
        except (TypeError, KeyError, ValueError, AttributeError):
            raise ConfigError(
                f"data.features.{name}={entry!r} must be {{dtype: float32|int64, shape: [d1, ...]}} (shape [] for a scalar)."
            ) from None
        if dtype not in STORED_AS:
            raise ConfigError(f"data.features.{name}.dtype={dtype!r} is not supported; use one of: {', '.join(STORED_AS)}.")
        if any(d < 1 for d in shape):
            raise ConfigError(f"data.features.{name}.shape={list(shape)}: every dimension must be 1 or more.")
        out[str(name)] = (dtype, shape)
    return out


def _spec(cfg, spec_file: dict) -> tuple[dict, str, str, int | None]:
    features = cfg.features or spec_file.get("features")
    if not features:
        raise ConfigError(
            "data.features is not set and no spec file (tfrecord.json, written by python -m runner.export) is beside "
            "data.train_files: give each feature's dtype and shape, e.g. data.features='{x: {dtype: float32, shape: [20]}, "
            "y: {dtype: int64, shape: []}}' data.label=y."
        )
    features = _features(features)
    label = cfg.label or spec_file.get("label")
    task = cfg.task if cfg.task != "auto" else spec_file.get("task", "classification")
    num_classes = cfg.num_classes if cfg.num_classes is not None else spec_file.get("num_classes")
    if label not in features:
        raise ConfigError(f"data.label={label!r} is not one of data.features ({', '.join(features)}); name the label feature.")
    if len(features) < 2:
        raise ConfigError(f"data.features has only the label {label!r}; the model needs at least one input feature.")
    if task == "classification":
        dtype, shape = features[label]
        if dtype != "int64" or math.prod(shape) != 1:
            raise ConfigError(
                f"data.task=classification needs one int64 class index per record in data.features.{label} "
                f"(dtype int64, shape []); it is {dtype} {list(shape)}. Use data.task=regression for real-valued targets."
            )
        if num_classes is None:
            raise ConfigError("data.num_classes is not set (and no spec file says it): classification needs it, 2 or more.")
    return features, label, task, num_classes


def check_file(key: str, path: str, features: dict, with_ids: bool) -> bool:
    """A local file: TFRecord framing, and its first record holds every spec feature with the right kind and number
    of values. Returns whether it holds a record."""
    try:
        data = first_record(path)
    except NotTFRecord as err:
        raise ConfigError(f"{key}: {path} is not a TFRecord file: {err}.") from None
    except OSError as err:
        raise ConfigError(f"{key}: {path} cannot be read: {err}.") from None
    if data is None:
        return False
    try:
        found = example_features(data)
    except ValueError as err:
        raise ConfigError(f"{key}: {path} is a TFRecord file, but its records are not tf.train.Example ({err}).") from None
    wanted = dict(features)
    if with_ids:
        wanted[ID_FEATURE] = ("int64", ())
    for name, (dtype, shape) in wanted.items():
        where = "data.record_ids_dir" if name == ID_FEATURE and name not in features else f"data.features.{name}"
        if name not in found:
            raise ConfigError(
                f"{where}: the records of {path} have no feature {name!r}; they have: {', '.join(sorted(found)) or 'none'}."
            )
        kind, count = found[name]
        if kind != STORED_AS[dtype]:
            stored = {v: k for k, v in STORED_AS.items()}.get(kind, kind)
            raise ConfigError(f"{where}.dtype={dtype} but {path} stores {name!r} as {kind} values (dtype {stored}).")
        if count != math.prod(shape):
            raise ConfigError(
                f"{where}.shape={list(shape)} means {math.prod(shape)} value(s) per record, but the first record of "
                f"{path} has {count} for {name!r}."
            )
    return True


def _records(files: list[str], spec_file: dict, key: str = "data.train_files") -> int | None:
    """Records in the files: the spec file's counts where it has them for an unchanged file, else counted (which
    walks every record's header: a file cut short is found here, before training, not hours into it)."""
    known = spec_file.get("records") or {}
    total = 0
    for path in files:
        entry = known.get(os.path.basename(path)) if os.path.dirname(os.path.abspath(path)) == spec_file.get("_dir") else None
        if remote(path):
            if entry is None:
                return None
            total += entry[0]
        elif entry is not None and entry[1] == os.path.getsize(path):
            total += entry[0]
        else:
            try:
                total += count_records(path)
            except NotTFRecord as err:
                raise ConfigError(f"{key}: {path} is not a whole TFRecord file: {err}.") from None
    return total


def load_source(cfg, count: bool = True) -> TFRecordSource:
    """The data node -> TFRecordSource, every local file checked; `count`: the training records too."""
    train = resolve_files("data.train_files", cfg.train_files)
    evals = resolve_files("data.eval_files", cfg.eval_files) if cfg.eval_files is not None else train
    spec_file = read_spec_file(train)
    features, label, task, num_classes = _spec(cfg, spec_file)
    with_ids = cfg.record_ids_dir is not None
    for key, files in (("data.train_files", train), ("data.eval_files", evals)):
        local = [f for f in files if not remote(f)]
        filled = [check_file(key, f, features, with_ids and files is train) for f in local]  # ids: training only
        if local and not any(filled) and len(local) == len(files):
            raise ConfigError(f"{key}: the {len(local)} file(s) it matches hold no records.")
        empty = [f for f, holds in zip(local, filled) if not holds]
        # said once: by the load (not the probe too), and for one key when both name the same files
        if count and empty and (key == "data.train_files" or evals is not train):
            log.warning(
                "%s: %d of %d file(s) hold no records (%s): a shard that was never written? Training goes on without them.",
                key,
                len(empty),
                len(files),
                ", ".join(os.path.basename(f) for f in empty[:3]) + (", ..." if len(empty) > 3 else ""),
            )
    records = _records(train, spec_file) if count else None
    if count and evals is not train:
        _records(evals, spec_file, "data.eval_files")  # cut short: refused now, not after training
    return TFRecordSource(train, evals, features, label, task, num_classes, records)
