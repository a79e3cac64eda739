"""data=image_folder -> tf.data pipelines that stream image files from the listing runner.sources.image_folder made.

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
from enum import StrEnum
from typing import Any

from omegaconf import MISSING

from runner.builders.data.pipeline import DataConfig, StreamedData, batch_fits, epoch_steps, finish, streams_only
from runner.config.fields import UINT32_MAX, choice, ranged
from runner.config.registry import register
from runner.errors import ConfigError

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


@dataclass(kw_only=True)
class ImageFolderData(StreamedData):
    # source: runner.sources.image_folder.ImageFolderSource

    @property
    def train_items(self):
        return self.source.train

    @property
    def eval_items(self):
        return self.source.eval

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

    def pipeline(self, pairs, batch_size, train: bool, shard=None):
        """(path, class index) pairs, sharded before anything is read when `shard` is given; else tf.distribute's
        auto-shard rewrite (DATA)."""
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


def build_image_folder_data(cfg, source, train_cfg, *, cluster=None, parameter_server=False) -> ImageFolderData:
    log.info(
        "data=image_folder: %d training and %d eval images of %d classes (%s), resized to %dx%d",
        len(source.train),
        len(source.eval),
        len(source.classes),
        ", ".join(source.classes[:10]) + (", ..." if len(source.classes) > 10 else ""),
        *source.image_size,
    )
    steps = epoch_steps(len(source.train), train_cfg, f"data.train_dir={cfg.train_dir!r}")
    return ImageFolderData.of(cfg, source, train_cfg, steps_per_epoch=steps, cluster=cluster, parameter_server=parameter_server)


class ColorMode(StrEnum):  # data=image_folder's data.color_mode: the channels images are decoded to
    rgb = "rgb"
    grayscale = "grayscale"
    rgba = "rgba"


@dataclass
class ImageFolderDataConfig(DataConfig):
    train_dir: str = MISSING  # one sub-folder per class, the images in it (.png .jpg .jpeg .bmp .gif)
    eval_dir: str | None = None  # the same class sub-folders; null: eval_fraction of train_dir is held out
    # without eval_dir: the share of each class's files held out for evaluation
    eval_fraction: float = ranged(0.2, gt=0, lt=1)
    seed: int = ranged(0, ge=0, le=UINT32_MAX)  # which files data.eval_fraction holds out
    image_size: list[int] | None = ranged(None, ge=1)  # [height, width], required: every image is resized to it
    # the channels images are decoded to: rgb 3, grayscale 1, rgba 4
    color_mode: str = choice(ColorMode, "rgb")
    scale: Any = None  # pixels are cast to float32 and multiplied by it: a number or a fraction; null: 1/255
    verify_images: bool = True  # before TensorFlow starts, read each file's first bytes: is it an image?


def scale_and_size(cfg):
    """Pure: data.scale is a number or a fraction, data.image_size is [height, width] (required by image_folder)."""
    from runner.sources.image_folder import parse_scale

    streams_only(cfg)
    parse_scale("data.scale", cfg.data.scale)
    size = cfg.data.image_size
    if (size is None and cfg.data.name == "image_folder") or (size is not None and len(size) != 2):
        given = " is not set" if size is None else f"={list(size)} is not [height, width]"
        raise ConfigError(
            f"data.image_size{given}: data={cfg.data.name} resizes every image to it; give it, e.g. data.image_size=[64,64]."
        )


def _image_folder_source(cfg):
    from runner.sources.image_folder import load_source

    return load_source(cfg, verify=False)  # the probe read every image's signature moments ago


def _image_folder_listed(cfg):
    """The folders exist, hold two classes or more, and their files are images: before TensorFlow."""
    from runner.sources.image_folder import load_source

    batch_fits(cfg, len(load_source(cfg.data).train), f"data.train_dir={cfg.data.train_dir!r}")


register(
    "data",
    "image_folder",
    schema=ImageFolderDataConfig,
    help="a directory of class sub-folders of images, decoded as streamed and sharded per worker",
    build=_image_folder_source,
    probe=_image_folder_listed,
    check=scale_and_size,
    pipeline=build_image_folder_data,
)
