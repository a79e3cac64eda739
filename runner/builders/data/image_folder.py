"""data=image_folder -> tf.data pipelines that stream image files from the listing runner/sources/image_folder.py made.

The pipeline: (path, class index) pairs -> [shard] -> shuffle the names (all of them: names are small) -> repeat ->
read, decode (data.color_mode's channels), resize to data.image_size, cast to float32 and multiply by data.scale ->
batch -> prefetch. Images are decoded as they are needed: a few batches are held at once, never the folder
(data.cache=true keeps the decoded images after the first pass, then shuffles them with data.shuffle_buffer).

Sharding, by input path (as data=tfrecord's, with the pairs in place of files):
- tf_data (experimental_distribute_dataset): TensorFlow's auto-shard rewrite with AutoShardPolicy.DATA (the names
  come from memory, not from reader files: each worker runs the pipeline and keeps its own share of the elements).
- from_function (distribute_datasets_from_function) and parameter_server: the dataset_fn shards the names before
  anything is read, by input pipeline, or under parameter_server by the worker index.
"""

import logging
from dataclasses import dataclass
from typing import Any

from runner.builders.data.pipeline import Data, epoch_steps, finish, worker_shard

log = logging.getLogger("runner")


def to_channels(image, channels: int):
    """A decoded uint8 image of 1 (gray), 2 (gray + alpha), 3 (RGB) or 4 (RGBA) channels -> `channels` of them."""
    import tensorflow as tf

    have = tf.shape(image)[-1]
    gray, color = image[..., :1], image[..., : tf.minimum(have, 3)]
    rgb = tf.cond(have < 3, lambda: tf.tile(gray, [1, 1, 3]), lambda: color)
    if channels == 3:
        return rgb
    if channels == 1:
        weights = tf.constant([0.2989, 0.587, 0.114])  # tf.image.rgb_to_grayscale's
        mixed = tf.cast(tf.round(tf.reduce_sum(tf.cast(rgb, tf.float32) * weights, axis=-1, keepdims=True)), tf.uint8)
        return tf.cond(have < 3, lambda: gray, lambda: mixed)
    opaque = tf.fill(tf.shape(gray), tf.constant(255, tf.uint8))
    alpha = tf.cond(tf.equal(have % 2, 0), lambda: image[..., have - 1 :], lambda: opaque)  # 2 and 4 carry alpha last
    return tf.concat([rgb, alpha], axis=-1)


@dataclass
class ImageFolderData(Data):
    source: Any  # runner.sources.image_folder.ImageFolderSource
    workers: int  # training processes: the input is sharded over them
    parameter_server: bool

    def _load(self):
        import tensorflow as tf

        size, channels, scale = self.source.image_size, self.source.channels, self.source.scale

        def load(path, label):
            # Decoded with the file's own channels, then converted: decode_image refuses grayscale for GIF and BMP
            # and alpha for JPEG and GIF, which would fail a batch in the middle of training.
            image = tf.io.decode_image(tf.io.read_file(path), channels=0, expand_animations=False)
            image = tf.image.resize(to_channels(image, channels), size)  # bilinear, float32, as tf_keras does
            image.set_shape((*size, channels))
            return image * scale, label

        return load

    def _pipeline(self, pairs, batch_size, train: bool, shard=None):
        """`shard`: (num_shards, index) to shard here (from_function, parameter_server); None leaves it to
        tf.distribute's auto-shard rewrite (DATA)."""
        import tensorflow as tf

        paths, labels = [p for p, _ in pairs], [label for _, label in pairs]
        ds = tf.data.Dataset.from_tensor_slices((paths, tf.constant(labels, tf.int32)))
        if shard is not None:
            ds = ds.shard(*shard)
        shuffle = train and self.shuffle
        if shuffle and not self.cache:
            ds = ds.shuffle(len(paths), seed=self.seed, reshuffle_each_iteration=True)
        ds = ds.map(self._load(), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        if self.cache:
            ds = ds.cache()
            if shuffle:
                ds = ds.shuffle(min(self.shuffle_buffer, len(paths)), seed=self.seed, reshuffle_each_iteration=True)
        if train:
            ds = ds.repeat().batch(batch_size, drop_remainder=True)
        else:
            ds = ds.batch(batch_size)
        return finish(ds, self.prefetch, "OFF" if shard is not None else "DATA")

    def train_dataset(self):
        return self._pipeline(self.source.train, self.global_batch_size, train=True)

    def eval_dataset(self):
        return self._pipeline(self.source.eval, self.global_batch_size, train=False)

    def dataset_fn(self, input_context):
        batch = input_context.get_per_replica_batch_size(self.global_batch_size)
        if self.parameter_server:
            shard = worker_shard(self.workers)
        else:
            shard = (input_context.num_input_pipelines, input_context.input_pipeline_id)
        return self._pipeline(self.source.train, batch, train=True, shard=shard)


def build_image_folder_data(cfg, source, train_cfg, num_replicas: int, cluster=None, parameter_server=False):
    workers = cluster.num_workers if cluster is not None else 1
    log.info(
        "data=image_folder: %d training and %d eval images of %d classes (%s), resized to %dx%d",
        len(source.train),
        len(source.eval),
        len(source.classes),
        ", ".join(source.classes[:10]) + (", ..." if len(source.classes) > 10 else ""),
        *source.image_size,
    )
    return ImageFolderData(
        arrays=None,
        input=cfg.input,
        global_batch_size=train_cfg.global_batch_size,
        steps_per_epoch=epoch_steps(len(source.train), train_cfg, f"data.train_dir={cfg.train_dir!r}"),
        shuffle=cfg.shuffle,
        shuffle_buffer=cfg.shuffle_buffer,
        cache=cfg.cache,
        prefetch=cfg.prefetch,
        seed=train_cfg.seed,
        source=source,
        workers=workers,
        parameter_server=parameter_server,
    )
