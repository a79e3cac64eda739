"""data=tfds before TensorFlow: find the prepared dataset in data.data_dir and check the config against the JSON
files TensorFlow Datasets writes beside it (dataset_info.json: versions, splits, supervised_keys; features.json:
feature names). Nothing is ever downloaded: a dataset that is not built is a ConfigError that names the directory
and the `tfds build` command that makes it. Every problem is found by the pre-flight probe, before TensorFlow starts.

Layout read (tfds's own): <data_dir>/<name>[/<config>]/<version>/dataset_info.json. `load_source` (after TensorFlow
is imported) opens that directory with tfds.builder_from_directory and reads shapes, classes and split sizes from
the dataset's info: no pass over the data.
"""

import json
import os
import re
from dataclasses import dataclass

from runner.errors import ConfigError
from runner.sources.image_folder import parse_scale
from runner.sources.tfds_splits import SPLIT, eval_split, examples, split_size

VERSION = re.compile(r"^\d+\.\d+\.\d+$")
INFO = "dataset_info.json"


def data_dir(cfg) -> str:
    """data.data_dir, else tfds's own default: $TFDS_DATA_DIR, else ~/tensorflow_datasets."""
    chosen = cfg.data_dir or os.environ.get("TFDS_DATA_DIR") or "~/tensorflow_datasets"
    return os.path.abspath(os.path.expanduser(chosen))


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def _built(directory: str) -> list[str]:
    """The versions prepared in a dataset's directory, oldest first (tfds's incomplete.* folders are not)."""
    if not os.path.isdir(directory):
        return []
    found = [v for v in os.listdir(directory) if VERSION.match(v) and os.path.isfile(os.path.join(directory, v, INFO))]
    return sorted(found, key=_version_key)


def build(name: str, root: str, version=None) -> str:
    """The command that prepares the dataset in `root` (run where the network is)."""
    return f"tfds build {name}{':' + str(version) if version else ''} --data_dir {root}"  # name: dataset[/config]


def find(cfg) -> str:
    """The directory of the prepared dataset data.dataset names (at data.version, or its newest)."""
    root = data_dir(cfg)
    name = str(cfg.dataset)
    where = f"data.data_dir={root}" if cfg.data_dir else f"data.data_dir (null: $TFDS_DATA_DIR or ~/tensorflow_datasets), {root},"
    if ":" in name:
        base, version = name.split(":", 1)
        raise ConfigError(f"data.dataset={name!r}: give the version on its own: data.dataset={base} data.version={version}.")
    if not os.path.isdir(root):
        raise ConfigError(
            f"{where} does not exist. Datasets are never downloaded at run time: build {name!r} there once with "
            f"`{build(name, root)}` (on a machine with network access), or point data.data_dir at the directory that holds it."
        )
    directory = os.path.join(root, name)
    versions = _built(directory)
    if not versions:
        inside = sorted(os.listdir(directory)) if os.path.isdir(directory) else []
        configs = [c for c in inside if _built(os.path.join(directory, c))]
        if configs:
            raise ConfigError(
                f"data.dataset={name!r} is built in {root} once per config: choose one, e.g. "
                f"data.dataset={name}/{configs[0]} (configs built: {', '.join(configs)})."
            )
        present = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)) and d not in ("downloads",))
        listing = f" It holds: {', '.join(present)}." if present else " It holds no dataset."
        raise ConfigError(
            f"data.dataset={name!r} is not built in {where} (no {directory}/<version>/{INFO}).{listing} Datasets are "
            f"never downloaded at run time: build it once with `{build(name, root)}`, or point data.data_dir at the "
            "directory that holds it."
        )
    version = cfg.version if cfg.version is not None else versions[-1]
    if str(version) not in versions:
        raise ConfigError(
            f"data.version={version!r}: {name!r} is built in {root} at version(s) {', '.join(versions)} only. Use one "
            f"of them (or null: the newest), or build it with `{build(name, root, version)}`."
        )
    return os.path.join(directory, str(version))


def _read_json(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path} cannot be read as JSON ({err}); rebuild the dataset with `tfds build`.") from None


def supervised_keys(info: dict) -> tuple[str, str] | None:
    """(input, label) from dataset_info.json's supervisedKeys, in either of the forms tfds has written."""
    keys = info.get("supervisedKeys") or {}
    items = keys.get("tuple", {}).get("items", [])
    if len(items) == 2 and all("featureKey" in i for i in items):
        return items[0]["featureKey"], items[1]["featureKey"]
    if "input" in keys and "output" in keys:
        return keys["input"], keys["output"]
    return None


def check(cfg) -> tuple[str, int]:
    """Everything checkable before TensorFlow: the dataset, version, splits and feature keys. Returns its directory
    and the examples data.split_train selects."""
    directory = find(cfg)
    info = _read_json(os.path.join(directory, "dataset_info.json"))
    sizes = {s["name"]: examples(s) for s in info.get("splits", [])}
    train_examples = split_size("data.split_train", cfg.split_train, sizes)
    split_size("data.split_eval", eval_split(cfg, list(sizes)), sizes)
    _files_present(directory, info, [cfg.split_train, eval_split(cfg, list(sizes))])
    features_file = os.path.join(directory, "features.json")
    if not os.path.isfile(features_file):
        return directory, train_examples  # older datasets: the feature keys are checked when tfds opens it
    features = _read_json(features_file).get("featuresDict", {}).get("features", {})
    keys = supervised_keys(info)
    chosen = []
    for key, value, i in (("data.image_key", cfg.image_key, 0), ("data.label_key", cfg.label_key, 1)):
        if value is None and keys is None:
            raise ConfigError(
                f"{key} is null and {cfg.dataset!r} declares no supervised_keys to take it from; name its input and "
                f"label features: data.image_key=... data.label_key=... (its features: {', '.join(features)})."
            )
        chosen.append(value if value is not None else keys[i])
        if features and chosen[-1] not in features:
            raise ConfigError(f"{key}={chosen[-1]!r} is not a feature of {cfg.dataset!r}; its features: {', '.join(features)}.")
    _check_features(cfg, features, *chosen)
    return directory, train_examples


def _files_present(directory: str, info: dict, splits: list[str]) -> None:
    """Each split read has all its files (tfds names them <dataset>-<split>.<format>-<i>-of-<n>): a copy cut short
    would otherwise fail at the first step that reaches a missing file."""
    shards = {s["name"]: len(s.get("shardLengths", [])) for s in info.get("splits", [])}
    names = {SPLIT.match(piece.strip()).group(1) for split in splits for piece in str(split).split("+")}
    for name in sorted(names):
        prefix = f"{info.get('name')}-{name}."
        found = sum(1 for f in os.listdir(directory) if f.startswith(prefix))
        if found < shards.get(name, 0):
            raise ConfigError(
                f"{directory} holds {found} of the {shards[name]} files of the split {name!r} (named {prefix}*); the "
                "dataset was copied or built only in part. Copy it again, or rebuild it with `tfds build`."
            )


def _check_features(cfg, features: dict, image_key: str, label_key: str) -> None:
    """As features.json describes them: the label is a ClassLabel, and images of varying size get data.image_size."""
    label = features.get(label_key, {})
    if label and "classLabel" not in label:
        kind = label.get("pythonClassName", "feature").rsplit(".", 1)[-1]
        raise ConfigError(
            f"data.label_key={label_key!r} is a {kind}, not a ClassLabel: data=tfds trains classifiers on a ClassLabel "
            "feature (its number of classes sizes the model). Name a ClassLabel feature with data.label_key."
        )
    image = features.get(image_key, {})
    spec = next((v for v in image.values() if isinstance(v, dict) and "shape" in v), None)
    if image and (spec is None or spec.get("dtype") in ("string", "bool")):
        kind = image.get("pythonClassName", "feature").rsplit(".", 1)[-1]
        raise ConfigError(
            f"data.image_key={image_key!r} is a {kind} of {spec.get('dtype') if spec else 'no fixed'} values, not an image "
            "or a numeric tensor; name the input feature with data.image_key."
        )
    dims = [int(d) for d in spec["shape"].get("dimensions", [])] if spec else []
    if cfg.image_size is None and any(d < 0 for d in dims):
        shape = "x".join("?" if d < 0 else str(d) for d in dims)
        raise ConfigError(
            f"{cfg.dataset!r}'s {image_key!r} has images of varying size ({shape}): set data.image_size=[height,width] "
            "to resize every image to one size."
        )


@dataclass
class TFDSSource:
    """What the model and the pipeline need, read from the dataset's info (no pass over the data)."""

    directory: str
    split_train: str
    split_eval: str
    image_key: str
    label_key: str
    input_shape: tuple[int, ...]
    num_classes: int
    train_records: int
    image_size: tuple[int, int] | None  # resize to it; None: the feature's own (fixed) shape
    scale: float
    task = "classification"
    streamed = True

    @property
    def num_outputs(self) -> int:
        return self.num_classes


def load_source(cfg) -> TFDSSource:
    """The data node -> TFDSSource. Imports tensorflow_datasets (and so TensorFlow): called when training starts."""
    import tensorflow_datasets as tfds

    directory, _ = check(cfg)
    info = tfds.builder_from_directory(directory).info
    keys = info.supervised_keys or (None, None)
    image_key, label_key = cfg.image_key or keys[0], cfg.label_key or keys[1]
    label = info.features[label_key]
    if not isinstance(label, tfds.features.ClassLabel):
        raise ConfigError(
            f"data.label_key={label_key!r} is a {type(label).__name__}, not a ClassLabel: data=tfds trains classifiers "
            "on a ClassLabel feature (its number of classes comes from the dataset)."
        )
    image = info.features[image_key]
    shape = tuple(image.shape)
    size = tuple(int(d) for d in cfg.image_size) if cfg.image_size is not None else None
    if size is None and (len(shape) < 2 or any(d is None for d in shape)):
        raise ConfigError(
            f"{cfg.dataset!r}'s {image_key!r} has shape {shape} (varying sizes): set data.image_size=[height,width] "
            "to resize every image to one size."
        )
    if size is not None:
        if len(shape) != 3 or shape[-1] is None:
            raise ConfigError(f"data.image_size resizes images (height, width, channels); {image_key!r} has shape {shape}.")
        shape = (*size, shape[-1])
    scale = parse_scale("data.scale", cfg.scale)
    if scale is None:
        scale = 1 / 255 if image.dtype == "uint8" else 1.0
    split_eval = eval_split(cfg, list(info.splits))
    return TFDSSource(
        directory,
        cfg.split_train,
        split_eval,
        image_key,
        label_key,
        shape,
        int(label.num_classes),
        int(info.splits[cfg.split_train].num_examples),  # tfds's own count (the probe's agrees, tests/test_data_more.py)
        size,
        scale,
    )
