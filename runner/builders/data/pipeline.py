"""data -> tf.data pipelines of global batches, split across replicas as the guide describes: the schema every data
option extends (`DataConfig`), the in-memory sources' pipelines (`Data`), the shape every streamed source shares
(`StreamedData`), and `build_data`, which checks the batch and hands a streamed source to its own pipeline.

`data.input` picks the guide's input path:
- tf_data: a Dataset of global batches; Model.fit splits it, the custom loop uses experimental_distribute_dataset.
- numpy: the arrays themselves go to Model.fit; the custom loop wraps them in a Dataset first.
- from_function: a dataset_fn(input_context) of per-replica batches, sharded per input pipeline
  (DatasetCreator for fit, distribute_datasets_from_function for the custom loop).
"""

import logging
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from omegaconf import MISSING

from runner.config import registry
from runner.config.fields import choice, ranged
from runner.config.registry import describe
from runner.errors import ConfigError

if TYPE_CHECKING:
    from runner.sources.in_memory import ArrayData  # NumPy: imported when loading, not by config-only commands

log = logging.getLogger("runner")
describe("data", "train and eval splits (data.input=tf_data, numpy or from_function picks the input path)")


class Input(StrEnum):  # data.input: the guide's input paths (runner.builders.data.pipeline)
    tf_data = "tf_data"
    numpy = "numpy"
    from_function = "from_function"


class Task(StrEnum):
    classification = "classification"  # integer labels, argmax over num_classes
    regression = "regression"  # real-valued targets


@dataclass
class DataConfig:
    name: str = MISSING
    # tf_data: a tf.data pipeline, distributed by the strategy; numpy: NumPy arrays to fit (the custom loop: a dataset of them);
    # from_function: the strategy's distribute_datasets_from_function, one pipeline per input context
    input: str = choice(Input, "tf_data")
    # shuffle the training examples each epoch (seeded by train.seed)
    shuffle: bool = True
    # examples in tf.data's shuffle buffer (at most the number of examples; files are shuffled whole too)
    shuffle_buffer: int = ranged(10_000, ge=1, why="set data.shuffle=false not to shuffle")
    # keep the decoded training examples in memory after the first epoch (tf.data cache)
    cache: bool = False
    # prepare the next batches while a step runs (tf.data prefetch, AUTOTUNE)
    prefetch: bool = True


def finish(ds, prefetch: bool, auto_shard: str):
    """The end of every source's pipeline: prefetch, and tf.distribute's auto-shard rewrite as AutoShardPolicy
    `auto_shard` (DATA, FILE, or OFF where the pipeline shards itself)."""
    import tensorflow as tf

    if prefetch:
        ds = ds.prefetch(tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = getattr(tf.data.experimental.AutoShardPolicy, auto_shard)
    return ds.with_options(options)


def worker_shard(workers: int):
    """(num_shards, index) of this parameter-server worker, from inside its dataset_fn: TensorFlow gives each worker
    the whole dataset otherwise (one input pipeline each)."""
    import tensorflow as tf

    return workers, tf.cast(tf.distribute.coordinator.experimental_get_current_worker_index(), tf.int64)


@dataclass
class Data:
    arrays: "ArrayData"
    input: str
    global_batch_size: int
    steps_per_epoch: int
    shuffle: bool
    shuffle_buffer: int
    cache: bool
    prefetch: bool
    seed: int

    def _pipeline(self, x, y, batch_size, train: bool):
        """The arrays' rows, shuffled and batched as indices and gathered a whole batch at a time: the same batches as
        shuffling and batching the rows themselves (a shuffle's order depends on its seed and the element count
        only), at a fraction of the input time per step."""
        import tensorflow as tf

        ds = self.row_batches(len(x), batch_size, train)
        x, y = tf.constant(x), tf.constant(y)  # graph constants inside a dataset_fn (parameter_server's workers)
        ds = ds.map(lambda rows: (tf.gather(x, rows), tf.gather(y, rows)))
        # Workers shard by element, not by file: the data are in memory.
        return finish(ds, self.prefetch, "DATA")

    def row_batches(self, rows: int, batch_size: int, train: bool):
        """The batches of row indices of `rows` examples: shuffled (seeded) and repeated when `train`."""
        import tensorflow as tf

        ds = tf.data.Dataset.range(rows)
        if self.cache:
            ds = ds.cache()
        if train:
            if self.shuffle:
                ds = ds.shuffle(min(self.shuffle_buffer, rows), seed=self.seed, reshuffle_each_iteration=True)
            # Repeat, and keep every step's batch full: equal shards on every replica every step.
            return ds.repeat().batch(batch_size, drop_remainder=True)
        return ds.batch(batch_size)

    def train_dataset(self):
        """Global batches, repeated: for Model.fit with steps_per_epoch."""
        return self._pipeline(self.arrays.x_train, self.arrays.y_train, self.global_batch_size, train=True)

    def eval_dataset(self):
        return self._pipeline(self.arrays.x_eval, self.arrays.y_eval, self.global_batch_size, train=False)

    def dataset_fn(self, input_context):
        """Per-replica batches of this input pipeline's shard (distribute_datasets_from_function)."""
        batch = input_context.get_per_replica_batch_size(self.global_batch_size)
        n, i = input_context.num_input_pipelines, input_context.input_pipeline_id
        return self._pipeline(self.arrays.x_train[i::n], self.arrays.y_train[i::n], batch, train=True)

    def strip_ids(self, batch):
        """A training batch as (x, y), called at the top of each training step: record ids ride along only with
        data=tfrecord's data.record_ids_dir (runner.builders.data.tfrecord)."""
        return batch

    def fit_input(self, dataset_creator: bool = False, done_steps: int = 0):
        """What Model.fit takes: a Dataset, (x, y) arrays, or a DatasetCreator (always, for parameter_server).
        `done_steps`: as for distributed_train (arrays are batched and shuffled by Keras itself: not skipped)."""
        if self.input == "numpy" and not dataset_creator:
            return self.arrays.x_train, self.arrays.y_train
        if self.input == "from_function" or dataset_creator:
            import tf_keras

            return tf_keras.utils.experimental.DatasetCreator(self.skipping_dataset_fn(done_steps))
        return self.train_dataset_from(done_steps)

    def train_dataset_from(self, done_steps: int):
        """train_dataset's global batches from step `done_steps` on (the ones before are read and dropped)."""
        ds = self.train_dataset()
        return ds.skip(done_steps) if done_steps else ds

    def skipping_dataset_fn(self, done_steps: int):
        """dataset_fn from step `done_steps` on: each step takes one per-replica batch per replica of a pipeline."""
        if not done_steps:
            return self.dataset_fn

        def dataset_fn(input_context):
            per_step = input_context.num_replicas_in_sync // input_context.num_input_pipelines
            return self.dataset_fn(input_context).skip(done_steps * per_step)

        return dataset_fn

    def distributed_train(self, strategy, done_steps: int = 0):
        """The training batches for strategy.run, from step `done_steps` on: a resumed run skips the batches its
        checkpoint's steps trained on, so it reads the same global batches in the same order as an uninterrupted run
        (the shuffle is seeded; the skipped batches are still read, so a resume costs their input time)."""
        if self.input == "from_function":
            return strategy.distribute_datasets_from_function(self.skipping_dataset_fn(done_steps))
        return strategy.experimental_distribute_dataset(self.train_dataset_from(done_steps))

    def distributed_eval(self, strategy):
        return strategy.experimental_distribute_dataset(self.eval_dataset())


@dataclass(kw_only=True)
class StreamedData(Data):
    """The shape every streamed source shares (data=tfrecord, tfds, image_folder), written once: global batches
    for the tf_data path, and a dataset_fn that shards by input pipeline (under parameter_server, by worker) for
    from_function. A source says what it streams (`train_items`, `eval_items`) and how (`pipeline`)."""

    source: Any  # what runner.sources found before TensorFlow: files, records, classes
    workers: int = 1  # training processes: the input is sharded over them
    parameter_server: bool = False

    @property
    def train_items(self):
        raise NotImplementedError

    @property
    def eval_items(self):
        raise NotImplementedError

    def pipeline(self, items, batch_size: int, train: bool, shard=None):
        """A tf.data pipeline of `items` in batches of `batch_size`, repeated when `train`. `shard`: (num_shards,
        index) to shard here (from_function, parameter_server); None leaves it to tf.distribute's auto-shard."""
        raise NotImplementedError

    def train_dataset(self):
        return self.pipeline(self.train_items, self.global_batch_size, train=True)

    def eval_dataset(self):
        return self.pipeline(self.eval_items, self.global_batch_size, train=False)

    def dataset_fn(self, input_context):
        batch = input_context.get_per_replica_batch_size(self.global_batch_size)
        return self.pipeline(self.train_items, batch, train=True, shard=self.shard(input_context))

    def shard(self, input_context):
        """This input pipeline's (num_shards, index): by worker under parameter_server (TensorFlow gives each worker
        the whole dataset), else by input pipeline."""
        if self.parameter_server:
            return worker_shard(self.workers)
        return input_context.num_input_pipelines, input_context.input_pipeline_id

    @classmethod
    def of(cls, cfg, source, train_cfg, *, steps_per_epoch: int, cluster=None, parameter_server: bool = False, **own):
        """The data config's common keys filled in; `own`: the source's own fields."""
        return cls(
            **_common(cfg, None, train_cfg, steps_per_epoch),
            source=source,
            workers=cluster.num_workers if cluster is not None else 1,
            parameter_server=parameter_server,
            **own,
        )


def epoch_steps(records: int, train_cfg, what: str, noun: str = "training examples") -> int:
    """train.steps_per_epoch, else the source's training `records` // the global batch (refused when not one)."""
    gbs = train_cfg.global_batch_size
    if train_cfg.steps_per_epoch is not None:
        return train_cfg.steps_per_epoch
    if records < gbs:
        raise ConfigError(
            f"train.global_batch_size={gbs} is larger than the {records} {noun} of {what}; "
            "lower the batch or set train.steps_per_epoch (the data repeat)."
        )
    return records // gbs


def build_data(cfg, arrays, train_cfg, num_replicas: int, cluster=None, parameter_server: bool = False) -> Data:
    """`cluster` and `parameter_server` say how a streamed source (data=tfrecord) shards its files over workers."""

    gbs = train_cfg.global_batch_size
    if gbs < num_replicas:
        raise ConfigError(
            f"train.global_batch_size={gbs} is smaller than the {num_replicas} replicas of this strategy: every replica "
            f"needs at least one example per step. Use train.global_batch_size>={num_replicas} "
            f"(a multiple of {num_replicas} splits evenly)."
        )
    if cfg.input == "from_function" and gbs % num_replicas:
        raise ConfigError(
            f"data.input=from_function needs train.global_batch_size divisible by the {num_replicas} replicas; "
            f"{gbs} is not. Use {gbs - gbs % num_replicas or num_replicas} or {gbs + num_replicas - gbs % num_replicas}."
        )
    if gbs % num_replicas:
        # Allowed, as in the guide (batches of 10 over 4 replicas): tf.distribute splits each batch as evenly as it
        # can, and the loss is averaged over the global batch, so the gradient is the same as on one device.
        shards = [gbs // num_replicas + (1 if i < gbs % num_replicas else 0) for i in range(num_replicas)]
        log.info(
            "train.global_batch_size=%d does not split evenly over %d replicas: they get %s examples per step "
            "(the gradient is still that of the whole batch)",
            gbs,
            num_replicas,
            "/".join(map(str, shards)),
        )
    pipeline = registry.get("data", cfg.name).caps.pipeline
    if pipeline is not None:  # a streamed source (data=tfrecord, tfds, image_folder) builds its own pipeline
        return pipeline(cfg, arrays, train_cfg, cluster=cluster, parameter_server=parameter_server)
    return array_data(cfg, arrays, train_cfg)


def array_data(cfg, arrays, train_cfg) -> Data:
    """The in-memory pipeline of `arrays` (an ArrayData), refused when an epoch or a batch cannot be."""
    from runner.sources.checks import check_batch_memory

    gbs = train_cfg.global_batch_size
    steps = epoch_steps(len(arrays.x_train), train_cfg, f"data={cfg.name}")
    # The data repeat, so with train.steps_per_epoch a batch may exceed the data: refuse one that cannot fit in memory.
    check_batch_memory(gbs, arrays.x_train[0].nbytes + arrays.y_train[0].nbytes, f"data={cfg.name}")
    return Data(**_common(cfg, arrays, train_cfg, steps))


def _common(cfg, arrays, train_cfg, steps_per_epoch: int) -> dict:
    """The fields every Data takes from the data and train configs."""
    return dict(
        arrays=arrays,
        input=cfg.input,
        global_batch_size=train_cfg.global_batch_size,
        steps_per_epoch=steps_per_epoch,
        shuffle=cfg.shuffle,
        shuffle_buffer=cfg.shuffle_buffer,
        cache=cfg.cache,
        prefetch=cfg.prefetch,
        seed=train_cfg.seed,
    )


def streams_only(cfg):
    """Streamed sources (their own pipeline=) cannot give Model.fit arrays."""
    if cfg.data.input == Input.numpy:
        raise ConfigError(
            f"data.input=numpy needs the data in memory, and data={cfg.data.name} streams it from files; "
            "use data.input=tf_data or data.input=from_function."
        )


def batch_fits(cfg, records: int, what: str):
    """An epoch needs one full global batch (the steps are records // batch) unless train.steps_per_epoch is set."""
    epoch_steps(records, cfg.train, what)
