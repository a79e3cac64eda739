"""data.verify=true for data=tfrecord: every record of every file read once before training, as training would read
it (checksums, then tf.io.parse_example against the spec, then labels within data.num_classes), so that a record
damaged in the middle of a large file is found in the first minutes, not hours into the run. The first bad record
is named by file and number (runner.sources.faults names what it can from an error met during training)."""

import logging
import os
import time

from runner.errors import DataRefused

BATCH = 1024  # records per read: big enough that TensorFlow's per-batch cost vanishes
log = logging.getLogger("runner")


def _first_bad(tf, path: str, start: int, parse) -> int:
    """The number of the first record from `start` on that cannot be read or parsed (one by one, after a batch failed)."""
    n = start
    try:
        for record in tf.data.TFRecordDataset(path).skip(start):
            parse(tf.expand_dims(record, 0))
            n += 1
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError):
        return n
    return n


def verify(data) -> None:
    """Read data.source's train and eval files through `data`'s parser; DataRefused at the first bad record."""
    import numpy as np
    import tensorflow as tf

    from runner.sources.faults import tf_says

    source = data.source
    parse = data._parse(False, 0)
    classes = source.num_classes if source.task == "classification" else None
    started, records, size, seen = time.perf_counter(), 0, 0, set()
    for key, paths in (("data.train_files", source.train_files), ("data.eval_files", source.eval_files)):
        for path in paths:
            if path in seen:
                continue
            seen.add(path)
            n = 0
            try:
                for batch in tf.data.TFRecordDataset(path).batch(BATCH):
                    _, y = parse(batch)
                    labels = y.numpy()
                    if classes is not None and labels.size and (labels.min() < 0 or labels.max() >= classes):
                        bad = int(np.flatnonzero((labels < 0) | (labels >= classes))[0])
                        raise DataRefused(
                            f"data.verify: {path} ({key}), record {n + bad}, holds the label {labels[bad]}, outside the "
                            f"{classes} classes 0..{classes - 1} (data.num_classes, or the spec file's); nothing was "
                            "trained. Fix the labels, or set data.num_classes to the number of classes the files hold."
                        )
                    n += len(labels)
            except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as err:
                raise DataRefused(
                    f"data.verify: {path} ({key}) cannot be read at record {_first_bad(tf, path, n, parse)}: "
                    f"{tf_says(str(err))} ({type(err).__name__}); nothing was trained. Replace the file with a good "
                    "copy (or write it again with python -m runner.export), or leave it out of "
                    f"{key}."
                ) from None
            records += n
            size += os.path.getsize(path) if os.path.exists(path) else 0
    sec = time.perf_counter() - started
    log.info("data.verify: %d records in %d files (%.1f MB) read and checked in %.1fs", records, len(seen), size / 1e6, sec)
