"""data=tfds -> tf.data pipelines that stream a prepared TensorFlow Datasets dataset from data.data_dir.

The dataset is opened with tfds.builder_from_directory (the directory runner.sources.tfds_prepared found): no dataset code
runs and nothing is downloaded. The pipeline: tfds's own reader (files shuffled with data.shuffle, no auto-cache,
images left encoded) -> [shard] -> [cache] -> shuffle -> repeat -> decode the image, (image, label) by
data.image_key / data.label_key, resize to data.image_size if set, float32 times data.scale -> batch -> prefetch.

Sharding, by input path:
- tf_data (experimental_distribute_dataset): TensorFlow's auto-shard rewrite with AutoShardPolicy.DATA (each worker
  reads the split and keeps its own share of the examples).
- from_function (distribute_datasets_from_function): tfds's ReadConfig(input_context=...) gives each input pipeline
  its own files when the split has at least one file per pipeline; otherwise the examples are sharded.
- parameter_server: the examples are sharded by the worker index (TensorFlow gives each worker the whole dataset).
Steps per epoch come from the split's size in the dataset's info (tfds counts its slices too).
"""

import logging
from dataclasses import dataclass
from typing import Any

from omegaconf import MISSING

from runner.builders.data.image_folder import scale_and_size
from runner.builders.data.pipeline import DataConfig, StreamedData, batch_fits, epoch_steps, finish
from runner.config.fields import ranged
from runner.config.registry import register

log = logging.getLogger("runner")


@dataclass(kw_only=True)
class TFDSData(StreamedData):
    # source: runner.sources.tfds_prepared.TFDSSource

    @property
    def train_items(self):
        return self.source.split_train

    @property
    def eval_items(self):
        return self.source.split_eval

    def _builder(self):
        import tensorflow_datasets as tfds

        return tfds.builder_from_directory(self.source.directory)

    def _example(self, builder):
        """features -> (x, y): the image decoded here when tfds was told to skip it (see _pipeline), then resized,
        cast to float32 and scaled."""
        import tensorflow as tf

        source, feature = self.source, builder.info.features[self.source.image_key]

        def example(features):
            x = features[source.image_key]
            if x.dtype == tf.string:  # SkipDecoding: still the encoded image
                x = feature.decode_example(x)
            x = tf.cast(x, tf.float32)
            if source.image_size is not None:
                x = tf.image.resize(x, source.image_size)
            x = tf.ensure_shape(x, source.input_shape) * source.scale
            return x, tf.cast(features[source.label_key], tf.int32)

        return example

    def pipeline(self, split, batch_size, train: bool, shard=None, context=None):
        """`context`: an InputContext for tfds to shard the files by; `shard`: (num_shards, index) to shard the
        examples; neither leaves it to tf.distribute's auto-shard rewrite (DATA). Images stay encoded (a few KB
        each) through the cache and the shuffle buffer and are decoded after them: a buffer of data.shuffle_buffer
        decoded float images could take gigabytes."""
        import tensorflow as tf
        import tensorflow_datasets as tfds

        builder = self._builder()
        encoded = isinstance(builder.info.features[self.source.image_key], tfds.features.Image)
        decoders = {self.source.image_key: tfds.decode.SkipDecoding()} if encoded else None
        read = tfds.ReadConfig(shuffle_seed=self.seed, try_autocache=False, input_context=context)
        ds = builder.as_dataset(split=split, shuffle_files=train and self.shuffle, read_config=read, decoders=decoders)
        if shard is not None:
            ds = ds.shard(*shard)
        if self.cache:
            ds = ds.cache()
        if train:
            if self.shuffle:
                ds = ds.shuffle(self.shuffle_buffer, seed=self.seed, reshuffle_each_iteration=True)
            ds = ds.repeat()
        ds = ds.map(self._example(builder), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        ds = ds.batch(batch_size, drop_remainder=train)
        return finish(ds, self.prefetch, "DATA" if shard is None and context is None else "OFF")

    def dataset_fn(self, input_context):
        """As every streamed source's, except that tfds shards by file itself when the split has a file per pipeline."""
        batch = input_context.get_per_replica_batch_size(self.global_batch_size)
        split = self.source.split_train
        files = len(self._builder().info.splits[split].file_instructions)
        if not self.parameter_server and files >= input_context.num_input_pipelines:
            return self.pipeline(split, batch, train=True, context=input_context)  # by file
        return self.pipeline(split, batch, train=True, shard=self.shard(input_context))  # by example


def build_tfds_data(cfg, source, train_cfg, *, cluster=None, parameter_server=False) -> TFDSData:
    log.info(
        "data=tfds: %s (%s), %d training examples in %r, eval on %r, input %s, %d classes",
        cfg.dataset,
        source.directory,
        source.train_records,
        source.split_train,
        source.split_eval,
        "x".join(map(str, source.input_shape)),
        source.num_classes,
    )
    steps = epoch_steps(source.train_records, train_cfg, f"data.split_train={source.split_train!r}")
    return TFDSData.of(cfg, source, train_cfg, steps_per_epoch=steps, cluster=cluster, parameter_server=parameter_server)


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


def _tfds_source(cfg):
    from runner.sources.tfds_prepared import load_source  # imports tensorflow_datasets: when training starts

    return load_source(cfg)


def _tfds_built(cfg):
    """The dataset is built in data.data_dir at the version, with the splits and features named: before TensorFlow."""
    from runner.sources.tfds_prepared import check

    _, train_examples = check(cfg.data)
    batch_fits(cfg, train_examples, f"data.split_train={cfg.data.split_train!r}")


register(
    "data",
    "tfds",
    schema=TFDSDataConfig,
    help="a TensorFlow Datasets dataset already built in data.data_dir (never downloaded), streamed and sharded per worker",
    build=_tfds_source,
    probe=_tfds_built,
    check=scale_and_size,
    pipeline=build_tfds_data,
)
