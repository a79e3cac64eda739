"""benchmarks/scale.py writes its GBs of records with a protobuf encoder of its own (tf.train.Example through
Python would take hours): its records must be what data=tfrecord's own reader sees as Examples. The runs it times
are README's data=tfrecord runs at scale; its figures are in docs/dev/benchmarks.md."""

import numpy as np

from benchmarks.scale import example
from runner.sources.tfrecord_format import example_features


def test_the_benchmarks_records_are_tf_train_examples():
    x = np.arange(1024, dtype="float32")
    data = example(x, 9, 300)  # 300: a varint of two bytes
    assert example_features(data) == {"x": ("float", 1024), "y": ("int64", 1), "id": ("int64", 1)}
    assert x.astype("<f4").tobytes() in data  # the values themselves, packed little-endian
