"""data -> the source's arrays. Each source registers its schema, capabilities and loader here (runner/config/registry.py);
its YAML is conf/data/<name>.yaml. runner/builders/data/pipeline.py turns the arrays into tf.data pipelines, whatever the source.
"""

import os
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from omegaconf import MISSING

from runner.config.fields import UINT32_MAX, choice, ranged
from runner.config.registry import describe, register
from runner.errors import ConfigError

describe("data", "train and eval splits (data.input=tf_data, numpy or from_function picks the input path)")


class Input(StrEnum):  # data.input: the guide's input paths (runner/builders/data/pipeline.py)
    tf_data = "tf_data"
    numpy = "numpy"
    from_function = "from_function"


class Task(StrEnum):
    classification = "classification"  # integer labels, argmax over num_classes
    regression = "regression"  # real-valued targets


@dataclass
class DataConfig:
    name: str = MISSING
    input: str = choice(Input, "tf_data")
    shuffle: bool = True
    shuffle_buffer: int = ranged(10_000, ge=1, why="set data.shuffle=false not to shuffle")
    cache: bool = False
    prefetch: bool = True


@dataclass
class OnesDataConfig(DataConfig):
    num_examples: int = ranged(100, ge=1)
    eval_examples: int = ranged(100, ge=1)


@dataclass
class SyntheticDataConfig(DataConfig):
    task: str = choice(Task, "classification")
    num_examples: int = ranged(4096, ge=1)
    eval_examples: int = ranged(1024, ge=1)
    num_features: int = ranged(20, ge=1)
    num_classes: int = ranged(4, ge=2, why="classification needs two classes or more")
    noise: float = ranged(0.1, ge=0)
    seed: int = ranged(0, ge=0, le=UINT32_MAX)


@dataclass
class DigitsDataConfig(DataConfig):
    eval_fraction: float = ranged(0.2, gt=0, lt=1)
    seed: int = ranged(0, ge=0, le=UINT32_MAX)


@dataclass
class NpzDataConfig(DataConfig):
    path: str = MISSING
    task: str = choice(Task, "classification")
    x_train: str = "x_train"
    y_train: str = "y_train"
    x_eval: str = "x_eval"  # when absent from the file, eval_fraction of the training arrays is held out
    y_eval: str = "y_eval"
    eval_fraction: float = ranged(0.2, gt=0, lt=1)
    seed: int = ranged(0, ge=0, le=UINT32_MAX)


class SpecTask(StrEnum):  # data=tfrecord's data.task: what the spec file says unless set
    auto = "auto"
    classification = "classification"
    regression = "regression"


class ShardPolicy(StrEnum):  # data.shard_policy -> tf.data.experimental.AutoShardPolicy (runner/builders/data/tfrecord.py)
    auto = "auto"  # by file when every worker gets a file, else by record
    file = "file"  # each worker reads its own files
    data = "data"  # every worker reads every file and keeps its own records
    off = "off"  # every worker reads everything


@dataclass
class TFRecordDataConfig(DataConfig):
    # A glob pattern or a list of patterns/files: local paths, or anything tf.io.gfile reads (gs://...).
    train_files: Any = MISSING
    eval_files: Any = None  # None: evaluate on the training files
    # {name: {dtype: float32|int64, shape: [...]}}; null: the spec file runner.export writes beside the files
    # (tfrecord.json). Untyped for Hydra, which cannot add keys to a typed dict from the command line: checked in
    # runner/sources/tfrecord.py instead.
    features: Any = None
    label: str | None = None  # the feature that is the label; null: the spec file's
    task: str = choice(SpecTask, "auto")  # auto: the spec file's, else classification
    num_classes: int | None = ranged(None, ge=2, null="the spec file's")
    shard_policy: str = choice(ShardPolicy, "auto")
    num_parallel_reads: int = ranged(4, ge=1)  # files read at once (interleave)
    record_ids_dir: str | None = None  # debug: log the `id` of every record each replica trains on, one file per task
    verify: bool = False  # read every record of every file before training: checksums, spec, labels


class ColorMode(StrEnum):  # data=image_folder's data.color_mode: the channels images are decoded to
    rgb = "rgb"
    grayscale = "grayscale"
    rgba = "rgba"


@dataclass
class TFDSDataConfig(DataConfig):
    dataset: str = MISSING  # a TensorFlow Datasets name, built beforehand: mnist, or name/config
    data_dir: str | None = None  # null: $TFDS_DATA_DIR, else ~/tensorflow_datasets (tfds's own default)
    version: str | None = None  # null: the newest version built in data_dir
    split_train: str = "train"  # a split of the dataset, or tfds's slicing syntax: train[:80%]
    split_eval: str | None = None  # null: test, else validation, whichever the dataset has
    image_key: str | None = None  # the input feature; null: the dataset's supervised_keys
    label_key: str | None = None  # the label feature (a ClassLabel); null: the dataset's supervised_keys
    image_size: list[int] | None = ranged(None, ge=1, null="the dataset's own shape")  # [height, width]: resized to
    scale: Any = None  # inputs are cast to float32 and multiplied by it: a number or a fraction (1/255); null: 1/255
    # for uint8 features, else 1


@dataclass
class ImageFolderDataConfig(DataConfig):
    train_dir: str = MISSING  # one sub-folder per class, the images in it (.png .jpg .jpeg .bmp .gif)
    eval_dir: str | None = None  # the same class sub-folders; null: eval_fraction of train_dir is held out
    eval_fraction: float = ranged(0.2, gt=0, lt=1)
    seed: int = ranged(0, ge=0, le=UINT32_MAX)  # which files data.eval_fraction holds out
    image_size: list[int] | None = ranged(None, ge=1)  # [height, width], required: every image is resized to it
    color_mode: str = choice(ColorMode, "rgb")
    scale: Any = None  # pixels are cast to float32 and multiplied by it: a number or a fraction; null: 1/255
    verify_images: bool = True  # before TensorFlow starts, read each file's first bytes: is it an image?


def _loader(name: str):
    """The source's loader in runner/sources/in_memory.py (NumPy: imported when loading, not by config-only commands)."""

    def load(cfg):
        from runner.sources import in_memory

        return getattr(in_memory, name)(cfg)

    return load


def _npz_file_exists(cfg):
    path = os.path.expanduser(str(cfg.data.path))
    if not os.path.isfile(path):
        raise ConfigError(
            f"data.path={cfg.data.path!r}: no such file (looked in {os.path.abspath(path)}). "
            "Point data.path at a .npz file with arrays x_train and y_train."
        )


register(
    "data",
    "ones",
    schema=OnesDataConfig,
    help="the guide's from_tensors(([1.], [1.])), repeated",
    build=_loader("ones"),
    example_bytes=lambda cfg: 4 + 4,
    generates=1,
)
register(
    "data",
    "synthetic",
    schema=SyntheticDataConfig,
    help="seeded Gaussian features, labels from a linear map",
    build=_loader("synthetic"),
    example_bytes=lambda cfg: 4 * cfg.num_features + 4,
    generates=3,
)  # drawn in float64, then cast: `generates` is the peak memory per example while made
register(
    "data",
    "digits",
    schema=DigitsDataConfig,
    help="scikit-learn's 8x8 digits",
    build=_loader("digits"),
    example_bytes=lambda cfg: 4 * 64 + 4,
)
register("data", "npz", schema=NpzDataConfig, help="your own .npz file", build=_loader("npz"), probe=_npz_file_exists)


def _tfrecord_source(cfg):
    from runner.sources.tfrecord import load_source

    return load_source(cfg)


def _tfrecord_files_readable(cfg):
    """Files match, are TFRecord, and hold the spec's features: checked before TensorFlow starts."""
    from runner.sources.tfrecord import load_source

    load_source(cfg.data, count=False)


def _tfrecord_pipeline(cfg, source, train_cfg, num_replicas, cluster, parameter_server):
    from runner.builders.data.tfrecord import build_tfrecord_data  # TensorFlow's pipeline: imported when training

    return build_tfrecord_data(cfg, source, train_cfg, num_replicas, cluster, parameter_server)


def _streams(cfg):
    """Streamed sources (their own pipeline=) cannot give Model.fit arrays."""
    if cfg.data.input == Input.numpy:
        raise ConfigError(
            f"data.input=numpy needs the data in memory, and data={cfg.data.name} streams it from files; "
            "use data.input=tf_data or data.input=from_function."
        )


register(
    "data",
    "tfrecord",
    schema=TFRecordDataConfig,
    help="TFRecord files of tf.train.Example, streamed and sharded per worker (python -m runner.export writes them)",
    build=_tfrecord_source,
    probe=_tfrecord_files_readable,
    check=_streams,
    pipeline=_tfrecord_pipeline,
)


def _scale_and_size(cfg):
    """Pure: data.scale is a number or a fraction, data.image_size is [height, width] (required by image_folder)."""
    from runner.sources.image_folder import parse_scale

    _streams(cfg)
    parse_scale("data.scale", cfg.data.scale)
    size = cfg.data.image_size
    if (size is None and cfg.data.name == "image_folder") or (size is not None and len(size) != 2):
        given = " is not set" if size is None else f"={list(size)} is not [height, width]"
        raise ConfigError(
            f"data.image_size{given}: data={cfg.data.name} resizes every image to it; give it, e.g. data.image_size=[64,64]."
        )


def _tfds_source(cfg):
    from runner.sources.tfds_prepared import load_source  # imports tensorflow_datasets: when training starts

    return load_source(cfg)


def _batch_fits(cfg, records: int, what: str):
    """An epoch needs one full global batch (the steps are records // batch) unless train.steps_per_epoch is set."""
    from runner.builders.data.pipeline import epoch_steps  # no TensorFlow at its top

    epoch_steps(records, cfg.train, what)


def _tfds_built(cfg):
    """The dataset is built in data.data_dir at the version, with the splits and features named: before TensorFlow."""
    from runner.sources.tfds_prepared import check

    _, train_examples = check(cfg.data)
    _batch_fits(cfg, train_examples, f"data.split_train={cfg.data.split_train!r}")


def _tfds_pipeline(cfg, source, train_cfg, num_replicas, cluster, parameter_server):
    from runner.builders.data.tfds import build_tfds_data

    return build_tfds_data(cfg, source, train_cfg, num_replicas, cluster, parameter_server)


register(
    "data",
    "tfds",
    schema=TFDSDataConfig,
    help="a TensorFlow Datasets dataset already built in data.data_dir (never downloaded), streamed and sharded per worker",
    build=_tfds_source,
    probe=_tfds_built,
    check=_scale_and_size,
    pipeline=_tfds_pipeline,
)


def _image_folder_source(cfg):
    from runner.sources.image_folder import load_source

    return load_source(cfg, verify=False)  # the probe read every image's signature moments ago


def _image_folder_listed(cfg):
    """The folders exist, hold two classes or more, and their files are images: before TensorFlow."""
    from runner.sources.image_folder import load_source

    _batch_fits(cfg, len(load_source(cfg.data).train), f"data.train_dir={cfg.data.train_dir!r}")


def _image_folder_pipeline(cfg, source, train_cfg, num_replicas, cluster, parameter_server):
    from runner.builders.data.image_folder import build_image_folder_data

    return build_image_folder_data(cfg, source, train_cfg, num_replicas, cluster, parameter_server)


register(
    "data",
    "image_folder",
    schema=ImageFolderDataConfig,
    help="a directory of class sub-folders of images, decoded as streamed and sharded per worker",
    build=_image_folder_source,
    probe=_image_folder_listed,
    check=_scale_and_size,
    pipeline=_image_folder_pipeline,
)
