"""data -> the source's arrays (each source registers its schema, capabilities and loader here, runner/registry.py;
its YAML is conf/data/<name>.yaml), then tf.data pipelines of global batches, split across replicas as the guide describes.

`data.input` picks the guide's input path:
- tf_data: a Dataset of global batches; Model.fit splits it, the custom loop uses experimental_distribute_dataset.
- numpy: the arrays themselves go to Model.fit; the custom loop wraps them in a Dataset first.
- from_function: a dataset_fn(input_context) of per-replica batches, sharded per input pipeline
  (DatasetCreator for fit, distribute_datasets_from_function for the custom loop).
"""

import logging
import os
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from omegaconf import MISSING

from runner.errors import ConfigError
from runner.fields import UINT32_MAX, choice, ranged
from runner.registry import describe, register

if TYPE_CHECKING:
    from runner.datasets import ArrayData  # NumPy: imported when loading, not by config-only commands

log = logging.getLogger("runner")
describe("data", "train and eval splits (data.input=tf_data, numpy or from_function picks the input path)")


class Input(str, Enum):  # data.input (the paths above)
    tf_data = "tf_data"
    numpy = "numpy"
    from_function = "from_function"


class Task(str, Enum):
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


def _loader(name: str):
    """The source's loader in runner/datasets.py (NumPy: imported when loading, not by config-only commands)."""
    def load(cfg):
        from runner import datasets

        return getattr(datasets, name)(cfg)

    return load


def _npz_file_exists(cfg):
    path = os.path.expanduser(str(cfg.data.path))
    if not os.path.isfile(path):
        raise ConfigError(
            f"data.path={cfg.data.path!r}: no such file (looked in {os.path.abspath(path)}). "
            "Point data.path at a .npz file with arrays x_train and y_train."
        )


register("data", "ones", schema=OnesDataConfig, help="the guide's from_tensors(([1.], [1.])), repeated", build=_loader("ones"),
         example_bytes=lambda cfg: 4 + 4, generates=1)
register("data", "synthetic", schema=SyntheticDataConfig, help="seeded Gaussian features, labels from a linear map",
         build=_loader("synthetic"), example_bytes=lambda cfg: 4 * cfg.num_features + 4,
         generates=3)  # drawn in float64 and cast: ~3x while made
register("data", "digits", schema=DigitsDataConfig, help="scikit-learn's 8x8 digits", build=_loader("digits"),
         example_bytes=lambda cfg: 4 * 64 + 4)
register("data", "npz", schema=NpzDataConfig, help="your own .npz file", build=_loader("npz"), probe=_npz_file_exists)


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
        import tensorflow as tf

        ds = tf.data.Dataset.from_tensor_slices((x, y))
        if self.cache:
            ds = ds.cache()
        if train:
            if self.shuffle:
                ds = ds.shuffle(min(self.shuffle_buffer, len(x)), seed=self.seed, reshuffle_each_iteration=True)
            # Repeat, and keep every step's batch full: equal shards on every replica every step.
            ds = ds.repeat().batch(batch_size, drop_remainder=True)
        else:
            ds = ds.batch(batch_size)
        if self.prefetch:
            ds = ds.prefetch(tf.data.AUTOTUNE)
        options = tf.data.Options()
        # Workers shard by element, not by file: the data are in memory.
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
        return ds.with_options(options)

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

    def fit_input(self, dataset_creator: bool = False):
        """What Model.fit takes: a Dataset, (x, y) arrays, or a DatasetCreator (always, for parameter_server)."""
        if self.input == "numpy" and not dataset_creator:
            return self.arrays.x_train, self.arrays.y_train
        if self.input == "from_function" or dataset_creator:
            import tf_keras

            return tf_keras.utils.experimental.DatasetCreator(self.dataset_fn)
        return self.train_dataset()

    def distributed_train(self, strategy):
        if self.input == "from_function":
            return strategy.distribute_datasets_from_function(self.dataset_fn)
        return strategy.experimental_distribute_dataset(self.train_dataset())

    def distributed_eval(self, strategy):
        return strategy.experimental_distribute_dataset(self.eval_dataset())


def build_data(cfg, arrays, train_cfg, num_replicas: int) -> Data:
    from runner.data_checks import check_batch_memory

    gbs = train_cfg.global_batch_size
    if gbs < num_replicas:
        raise ConfigError(
            f"train.global_batch_size={gbs} is smaller than the {num_replicas} replicas of this strategy: every replica "
            f"needs at least one example per step. Use train.global_batch_size>={num_replicas} (a multiple of {num_replicas} splits evenly)."
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
        log.info("train.global_batch_size=%d does not split evenly over %d replicas: they get %s examples per step "
                 "(the gradient is still that of the whole batch)", gbs, num_replicas, "/".join(map(str, shards)))
    n = len(arrays.x_train)
    if train_cfg.steps_per_epoch is None and n < gbs:
        raise ConfigError(
            f"train.global_batch_size={gbs} is larger than the {n} training examples of data={cfg.name}; "
            "lower the batch or set train.steps_per_epoch (the data repeat)."
        )
    # The data repeat, so with train.steps_per_epoch a batch may exceed the data: refuse one that cannot fit in memory.
    check_batch_memory(gbs, arrays.x_train[0].nbytes + arrays.y_train[0].nbytes, f"data={cfg.name}")
    return Data(
        arrays=arrays,
        input=cfg.input,
        global_batch_size=gbs,
        steps_per_epoch=train_cfg.steps_per_epoch or n // gbs,
        shuffle=cfg.shuffle,
        shuffle_buffer=cfg.shuffle_buffer,
        cache=cfg.cache,
        prefetch=cfg.prefetch,
        seed=train_cfg.seed,
    )
