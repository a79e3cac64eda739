"""The executors' shared pieces, checked in process against plain tf.function behaviour."""

import gc
import os
import weakref

import pytest

os.environ["TF_USE_LEGACY_KERAS"] = "1"
pytestmark = pytest.mark.slow  # imports TensorFlow in process (seconds)


def test_concrete_per_iterator_gives_tf_function_results_follows_new_iterators_and_keeps_them_to_the_end():
    import tensorflow as tf

    from runner.executors.base import concrete_per_iterator

    @tf.function
    def take(iterator, n):
        total = tf.constant(0, tf.int64)
        for _ in tf.range(n):
            total += tf.cast(next(iterator), tf.int64)
        return total

    call = concrete_per_iterator(take)
    first = iter(tf.data.Dataset.range(100))
    assert [int(call(first, tf.constant(k))) for k in (1, 2, 3)] == [0, 1 + 2, 3 + 4 + 5]
    assert take.experimental_get_tracing_count() == 1  # one trace, then the concrete function only

    # A new iterator, here of another element type, is bound afresh instead of fed to the old graph.
    second = iter(tf.data.Dataset.range(10, 20).map(lambda v: tf.cast(v * 2, tf.int32)))
    assert int(call(second, tf.constant(2))) == 20 + 22
    assert take.experimental_get_tracing_count() == 2
    assert int(call(first, tf.constant(1))) == 6  # the first iterator carries on where it stopped

    # Bound iterators are kept until the process ends (runner/control/teardown.py): releasing one can block the caller for
    # seconds on tf.data's autotuning thread, so it must not happen between the last step and the model's save.
    from runner.control import teardown

    gone = weakref.ref(first)
    del first
    gc.collect()
    assert gone() is not None and any(kept is gone() for kept in teardown._kept)
