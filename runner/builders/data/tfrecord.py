"""data=tfrecord -> tf.data pipelines that stream TFRecord files, sharded per worker as data.shard_policy says.

The pipeline: file names -> interleave(TFRecordDataset) over data.num_parallel_reads files at once (deterministic
order) -> shuffle -> repeat -> batch -> tf.io.parse_example on the whole batch -> prefetch. Nothing is read before
the first step and no more than a few batches are held at once (data.cache=true would keep them all).

Sharding, by input path:
- tf_data (experimental_distribute_dataset): TensorFlow's auto-shard rewrite, with data.shard_policy as the
  dataset's AutoShardPolicy (file: FILE, data: DATA, off: OFF). auto is FILE when every worker gets a file and
  DATA otherwise, decided here from the file count (not by TensorFlow's AUTO) so that the log can say which.
- from_function (distribute_datasets_from_function) and parameter_server: no rewrite runs there, so the
  dataset_fn shards itself with the same policy: the file names (file) or the records (data) by input pipeline,
  or under parameter_server by the worker index (experimental_get_current_worker_index: TensorFlow gives each
  parameter-server worker the whole dataset otherwise).

data.record_ids_dir (debug, off by default): the records' `id` feature rides along with each batch as
(worker, id) pairs, and the training step writes them (strip_ids) to <record_ids_dir>/<task>.txt: which records
each replica of each worker consumed ("ids <replica> [<worker> <id> <worker> <id> ...]" per step). Off, the
batch is (x, y) and strip_ids is nothing at trace time.
"""

import logging
import math
import os
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from omegaconf import MISSING

from runner.builders.data.pipeline import DataConfig, StreamedData, epoch_steps, finish, streams_only
from runner.config.fields import choice, ranged
from runner.config.registry import register
from runner.errors import ConfigError
from runner.sources.tfrecord import ID_FEATURE, remote

POLICIES = {"file": "FILE", "data": "DATA", "off": "OFF"}
log = logging.getLogger("runner")


@dataclass(kw_only=True)
class TFRecordData(StreamedData):
    # source: runner.sources.tfrecord.TFRecordSource
    shard_policy: str  # auto | file | data | off
    num_parallel_reads: int
    worker: int  # this task's worker index (the id log); under parameter_server the dataset_fn asks TensorFlow
    ids_file: str | None  # data.record_ids_dir/<task>.txt

    def _files(self, files: list[str]) -> list[str]:
        import tensorflow as tf

        out = []
        for f in files:
            matched = sorted(tf.io.gfile.glob(f)) if remote(f) else [f]
            if not matched:
                raise ConfigError(f"data.train_files / data.eval_files: {f!r} matches no file.")
            out += matched
        return out

    def policy(self, num_files: int, train: bool = True) -> str:
        """data.shard_policy with auto resolved: file when every worker gets a file, else data. The eval files
        fall back to data too when they are fewer than the workers (the training files are checked at build)."""
        if self.shard_policy == "auto" or (self.shard_policy == "file" and not train):
            return "file" if num_files >= self.workers else "data"
        return self.shard_policy

    def _parse(self, with_ids: bool, worker):
        import tensorflow as tf

        source = self.source
        dtypes = {"float32": tf.float32, "int64": tf.int64}
        spec = {name: tf.io.FixedLenFeature(shape, dtypes[dtype]) for name, (dtype, shape) in source.features.items()}
        if with_ids:
            spec[ID_FEATURE] = tf.io.FixedLenFeature([], tf.int64)

        def parse(serialized):
            parsed = tf.io.parse_example(serialized, spec)
            n = tf.shape(serialized)[0]
            inputs = [tf.cast(parsed[name], tf.float32) for name in source.inputs]
            if len(inputs) == 1 and source.features[source.inputs[0]][1]:
                x = inputs[0]  # one feature keeps its shape (an image stays an image)
            else:
                x = tf.concat([tf.reshape(t, [n, -1]) for t in inputs], axis=1)
            y = parsed[source.label]
            if source.task == "classification":
                y = tf.reshape(tf.cast(y, tf.int32), [n])
            else:
                y = tf.reshape(tf.cast(y, tf.float32), [n, math.prod(source.features[source.label][1])])
            if not with_ids:
                return x, y
            ids = parsed[ID_FEATURE]
            return x, y, tf.stack([tf.fill(tf.shape(ids), tf.cast(worker, tf.int64)), ids], axis=1)

        return parse

    @property
    def train_items(self):
        return self.source.train_files

    @property
    def eval_items(self):
        return self.source.eval_files

    def pipeline(self, files, batch_size, train: bool, shard=None):
        """Files, sharded (by file or record, as `policy` says) when `shard` is given; else tf.distribute's auto-shard
        rewrite is told the policy through the dataset's options."""
        import tensorflow as tf

        files = self._files(files)
        policy = self.policy(len(files), train)
        ds = tf.data.Dataset.from_tensor_slices(files)
        if shard is not None and policy == "file":
            ds = ds.shard(*shard)
        if train and self.shuffle:
            ds = ds.shuffle(len(files), seed=self.seed, reshuffle_each_iteration=True)
        ds = ds.interleave(
            tf.data.TFRecordDataset,
            cycle_length=min(self.num_parallel_reads, len(files)),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
        if shard is not None and policy == "data":
            ds = ds.shard(*shard)
        if self.cache:
            ds = ds.cache()
        with_ids = train and self.ids_file is not None
        if train:
            if self.shuffle:
                ds = ds.shuffle(self.shuffle_buffer, seed=self.seed, reshuffle_each_iteration=True)
            ds = ds.repeat().batch(batch_size, drop_remainder=True)
        else:
            ds = ds.batch(batch_size)
        worker = shard[1] if shard is not None and self.parameter_server else self.worker
        ds = ds.map(self._parse(with_ids, worker), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return finish(ds, self.prefetch, "OFF" if shard is not None else POLICIES[policy])

    def strip_ids(self, batch):
        """A training batch as (x, y). With data.record_ids_dir, first write its (worker, id) pairs, after the
        replica's id, to this task's file: the records this replica consumed in this step."""
        if self.ids_file is None:
            return batch
        import tensorflow as tf

        x, y, ids = batch
        # parameter_server has one replica per worker; asking its replica context for the id inside the custom loop's
        # tf.range loop crashed the coordinator (SIGSEGV after a few steps, TensorFlow 2.21)
        replica = 0 if self.parameter_server else tf.distribute.get_replica_context().replica_id_in_sync_group
        tf.print("ids", replica, tf.reshape(ids, [-1]), summarize=-1, output_stream=f"file://{self.ids_file}")
        return x, y


def build_tfrecord_data(cfg, source, train_cfg, *, cluster=None, parameter_server=False) -> TFRecordData:
    workers = cluster.num_workers if cluster is not None else 1
    steps = train_cfg.steps_per_epoch
    if steps is None:
        if source.train_records is None:
            raise ConfigError(
                "data.train_files are remote and no spec file counts their records: set train.steps_per_epoch "
                "(or write them with python -m runner.export, which records the counts in tfrecord.json)."
            )
        steps = epoch_steps(source.train_records, train_cfg, "data.train_files", noun="records")
    files = source.train_files
    if cfg.shard_policy == "file" and workers > 1 and not any(map(remote, files)) and len(files) < workers:
        raise ConfigError(
            f"data.shard_policy=file gives each of the {workers} workers its own files, but data.train_files matches "
            f"{len(files)}; write more shards (python -m runner.export ... --shards {workers}) or use data.shard_policy=data."
        )
    if workers > 1:
        log.info(
            "data=tfrecord: %d training file(s) sharded over %d workers by %s (data.shard_policy=%s)",
            len(files),
            workers,
            "file" if cfg.shard_policy == "auto" and len(files) >= workers else cfg.shard_policy.replace("auto", "data"),
            cfg.shard_policy,
        )
    ids_file = None
    if cfg.record_ids_dir is not None:
        os.makedirs(cfg.record_ids_dir, exist_ok=True)
        task = cluster.task.replace(":", "-") if cluster is not None else "local"
        ids_file = os.path.abspath(os.path.join(cfg.record_ids_dir, f"{task}.txt"))
    data = TFRecordData.of(
        cfg,
        source,
        train_cfg,
        steps_per_epoch=steps,
        cluster=cluster,
        parameter_server=parameter_server,
        shard_policy=cfg.shard_policy,
        num_parallel_reads=cfg.num_parallel_reads,
        worker=cluster.worker_index if cluster is not None else 0,
        ids_file=ids_file,
    )
    if cfg.verify:
        from runner.builders.data.tfrecord_verify import verify

        verify(data)
    return data


class SpecTask(StrEnum):  # data=tfrecord's data.task: what the spec file says unless set
    auto = "auto"
    classification = "classification"
    regression = "regression"


class ShardPolicy(StrEnum):  # data.shard_policy -> tf.data.experimental.AutoShardPolicy (runner.builders.data.tfrecord)
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
    # runner.sources.tfrecord instead.
    features: Any = None
    label: str | None = None  # the feature that is the label; null: the spec file's
    task: str = choice(SpecTask, "auto")  # auto: the spec file's, else classification
    # classification: the number of classes
    num_classes: int | None = ranged(None, ge=2, null="the spec file's")
    # how workers split the input (tf.data AutoShardPolicy): auto, file (each worker its own files), data (every worker reads all,
    # keeps its share), off
    shard_policy: str = choice(ShardPolicy, "auto")
    num_parallel_reads: int = ranged(4, ge=1)  # files read at once (interleave)
    record_ids_dir: str | None = None  # debug: log the `id` of every record each replica trains on, one file per task
    verify: bool = False  # read every record of every file before training: checksums, spec, labels


def _tfrecord_source(cfg):
    from runner.sources.tfrecord import load_source

    return load_source(cfg)


def _tfrecord_files_readable(cfg):
    """Files match, are TFRecord, and hold the spec's features: checked before TensorFlow starts."""
    from runner.sources.tfrecord import load_source

    load_source(cfg.data, count=False)


register(
    "data",
    "tfrecord",
    schema=TFRecordDataConfig,
    help="TFRecord files of tf.train.Example, streamed and sharded per worker (python -m runner.export writes them)",
    build=_tfrecord_source,
    probe=_tfrecord_files_readable,
    check=streams_only,
    pipeline=build_tfrecord_data,
)
