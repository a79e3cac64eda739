"""In-memory data gathered in the step (runner.executors.resident) gives the batches of the tf.data pipeline that
gathers them (runner.builders.data.pipeline), in the same order, from any resumed step: the row indices it reads,
one step's at a time or a block of steps held in a variable, gathered, against train_dataset().skip(done)."""

import os

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


def _data(rows: int, batch: int, shuffle: bool, buffer: int, cache: bool):
    from runner.builders.data.pipeline import Data
    from runner.sources.in_memory import ArrayData

    x = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
    y = np.arange(rows, dtype=np.int32) % 5
    arrays = ArrayData(x, y, x[:4], y[:4], "classification", 5)
    return Data(arrays, "tf_data", batch, max(1, rows // batch), shuffle, buffer, cache, True, seed=7)


@settings(max_examples=5, deadline=None)
@given(
    rows=st.integers(3, 40),
    batch=st.integers(1, 9),
    shuffle=st.booleans(),
    buffer=st.integers(1, 50),
    cache=st.booleans(),
    done=st.integers(0, 30),
    block=st.integers(1, 7),
)
def test_the_steps_gather_the_pipelines_batches(rows, batch, shuffle, buffer, cache, done, block):
    import tensorflow as tf

    from runner.executors.resident import Blocks

    data = _data(rows, max(1, min(batch, rows)), shuffle, buffer, cache)
    steps = 2 * block + 3  # past a block's end, a refill and part of the next block
    expected = [(x.numpy(), y.numpy()) for x, y in data.train_dataset().skip(done).take(steps)]

    blocks = Blocks(data, block)
    iterator = blocks.iterator(done)
    take = tf.function(lambda: blocks.take(iterator))
    held = [tuple(t.numpy() for t in take()) for _ in range(steps)]
    one_by_one = [tuple(t.numpy() for t in blocks.gather(rows)) for rows in blocks.rows(done).take(steps)]

    for got in (held, one_by_one):
        assert len(got) == len(expected)
        for (x, y), (ex, ey) in zip(got, expected):
            np.testing.assert_array_equal(x, ex)
            np.testing.assert_array_equal(y, ey)


def test_a_block_is_a_calls_steps_unless_their_indices_outgrow_the_cap():
    """train.steps_per_loop=100000 at batch 1024 held 800 MB of row indices (3 GB at its peak, tf.data's copies)."""
    from runner.executors.resident import BLOCK_BYTES, block_steps

    assert block_steps(10, 256) == 10 and block_steps(1, 1 << 30) == 1
    assert block_steps(100_000, 1024) * 1024 * 8 <= BLOCK_BYTES < (block_steps(100_000, 1024) + 1) * 1024 * 8


@settings(max_examples=5, deadline=None)
@given(
    rows=st.integers(3, 40),
    batch=st.integers(1, 9),
    done=st.integers(0, 30),
    block=st.integers(1, 7),
    calls=st.lists(st.integers(1, 9), min_size=1, max_size=6),
)
def test_xlas_calls_take_the_pipelines_row_batches_whatever_their_length(rows, batch, done, block, calls):
    """train.jit_compile's whole call (resident.Calls): calls shorter and longer than a block, and spanning blocks,
    hand over the same row batches as the pipeline, in order."""
    from runner.executors.resident import Calls

    data = _data(rows, max(1, min(batch, rows)), True, 10, False)
    calls_of = Calls(data, block)
    calls_of.begin(done)
    got = np.concatenate([calls_of.take(n).numpy() for n in calls])
    expected = np.stack([r.numpy() for r in calls_of.rows(done).take(sum(calls))])
    np.testing.assert_array_equal(got, expected)
