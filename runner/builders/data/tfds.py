"""data=tfds -> tf.data pipelines that stream a prepared TensorFlow Datasets dataset from data.data_dir.

The dataset is opened with tfds.builder_from_directory (the directory runner/sources/tfds_prepared.py found): no dataset code
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

from runner.builders.data.pipeline import Data, epoch_steps, finish, worker_shard

log = logging.getLogger("runner")


@dataclass
class TFDSData(Data):
    source: Any  # runner.sources.tfds_prepared.TFDSSource
    workers: int
    parameter_server: bool

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

    def _pipeline(self, split, batch_size, train: bool, shard=None, context=None):
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

    def train_dataset(self):
        return self._pipeline(self.source.split_train, self.global_batch_size, train=True)

    def eval_dataset(self):
        return self._pipeline(self.source.split_eval, self.global_batch_size, train=False)

    def dataset_fn(self, input_context):

        batch = input_context.get_per_replica_batch_size(self.global_batch_size)
        split = self.source.split_train
        if self.parameter_server:
            return self._pipeline(split, batch, train=True, shard=worker_shard(self.workers))
        if len(self._builder().info.splits[split].file_instructions) >= input_context.num_input_pipelines:
            return self._pipeline(split, batch, train=True, context=input_context)  # by file
        shard = (input_context.num_input_pipelines, input_context.input_pipeline_id)
        return self._pipeline(split, batch, train=True, shard=shard)  # by example


def build_tfds_data(cfg, source, train_cfg, num_replicas: int, cluster=None, parameter_server=False):
    workers = cluster.num_workers if cluster is not None else 1
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
    return TFDSData(
        arrays=None,
        input=cfg.input,
        global_batch_size=train_cfg.global_batch_size,
        steps_per_epoch=epoch_steps(source.train_records, train_cfg, f"data.split_train={source.split_train!r}"),
        shuffle=cfg.shuffle,
        shuffle_buffer=cfg.shuffle_buffer,
        cache=cfg.cache,
        prefetch=cfg.prefetch,
        seed=train_cfg.seed,
        source=source,
        workers=workers,
        parameter_server=parameter_server,
    )
