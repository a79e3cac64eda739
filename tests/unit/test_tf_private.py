"""The private TensorFlow / tf_keras names in runner/tf_private.py still exist and still do what the
runner relies on. In process, one small graph or model each: when a TensorFlow release moves one, this fails
loudly here, instead of the runner going quietly slower (or resuming fit at an epoch's start)."""

import os

import pytest

os.environ["TF_USE_LEGACY_KERAS"] = "1"
pytestmark = pytest.mark.slow  # imports TensorFlow in process (seconds)


def test_call_flat_fast_path_exists_and_gives_the_public_calls_results():
    import tensorflow as tf

    from runner import tf_private

    @tf.function
    def take(iterator, n):
        total = tf.constant(0, tf.int64)
        for _ in tf.range(n):
            total += next(iterator)
        return total

    iterator, n = iter(tf.data.Dataset.range(100)), tf.constant(3)
    concrete = take.get_concrete_function(iterator, n)
    assert callable(getattr(concrete, tf_private.CALL_FLAT, None)), f"ConcreteFunction.{tf_private.CALL_FLAT} is gone"
    caller = tf_private.flat_caller(concrete, iterator, (n,))
    assert caller is not None, "the flat inputs are no longer the iterator's handles followed by the tensors"
    assert int(caller(iterator, n)) == 0 + 1 + 2 and int(concrete(iterator, n)) == 3 + 4 + 5
    assert int(caller(iterator, tf.constant(2))) == 6 + 7
    assert not tf_private._warned


def test_a_callback_can_still_take_the_steps_tensor_logs():
    import tensorflow as tf
    import tf_keras

    from runner import tf_private

    seen = []

    class Recorder(tf_keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(logs["loss"])

    for takes in (True, False):
        callbacks = tf_keras.callbacks.CallbackList([tf_private.take_tf_logs(Recorder(), takes)], add_progbar=False)
        callbacks.on_train_batch_end(0, {"loss": tf.constant(1.5)})
    assert tf.is_tensor(seen[0]), f"Keras copied the logs to the host despite {tf_private.TF_LOGS}"
    assert not tf.is_tensor(seen[1]) and float(seen[1]) == 1.5


def test_model_fit_still_asks_the_resume_hook_where_to_start():
    import numpy as np
    import tf_keras

    from runner import tf_private

    assert hasattr(tf_keras.Model, tf_private.RESUME_HOOK), f"tf_keras.Model.{tf_private.RESUME_HOOK} is gone"

    class Resumed(tf_private.ResumeInsideEpoch, tf_keras.Sequential):
        pass

    model = Resumed([tf_keras.layers.Dense(1)])
    model.resume_step = 7  # epoch 1 (of 5 steps each), its third step
    model.compile(optimizer="sgd", loss="mse")
    batches = []
    recorder = tf_keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: batches.append(batch),
        on_epoch_begin=lambda epoch, logs: batches.append(f"epoch {epoch}"),
    )
    x = np.ones((10, 2), np.float32)
    model.fit(x, x[:, :1], batch_size=2, epochs=2, steps_per_epoch=5, verbose=0, callbacks=[recorder])
    assert batches == ["epoch 1", 2, 3, 4]


def test_the_preemption_handler_still_says_which_platform_it_found(tmp_path):
    import tensorflow as tf

    from runner import tf_private

    checkpoint = tf.train.Checkpoint(step=tf.Variable(0))
    manager = tf.train.CheckpointManager(checkpoint, str(tmp_path), max_to_keep=1)
    handler = tf.distribute.experimental.PreemptionCheckpointHandler(
        None, manager, termination_config=tf.distribute.experimental.TerminationConfig(termination_watcher_fn=lambda: False)
    )
    assert hasattr(handler, tf_private.PLATFORM), f"PreemptionCheckpointHandler.{tf_private.PLATFORM} is gone"
    assert tf_private.preemption_handler_acts(handler)  # not a GCE VM: TensorFlow's handler acts on its notices


def test_keras3_fit_still_has_the_symbolic_build_the_keras3_fit_skips():
    """runner.executors.keras3_fit's model overrides it: gone, fit would read a batch from another iterator first."""
    import keras

    from runner import tf_private

    assert callable(getattr(keras.Model, tf_private.SYMBOLIC_BUILD, None)), f"keras.Model.{tf_private.SYMBOLIC_BUILD} is gone"
    tf_private.NoSymbolicBuild.check()
    assert f"keras.Model.{tf_private.SYMBOLIC_BUILD}" not in tf_private._warned


def test_evaluate_still_runs_a_stream_of_unknown_size_at_one_step_per_call():
    import numpy as np
    import tensorflow as tf
    import tf_keras

    from runner import tf_private

    model = tf_keras.Sequential([tf_keras.layers.Input((3,)), tf_keras.layers.Dense(2)])
    model.compile(loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True), steps_per_execution=4)
    x, y = np.ones((10, 3), np.float32), np.zeros(10, np.int32)
    stream = tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda *_: True).batch(4)  # size unknown to Keras
    assert stream.cardinality() == tf.data.UNKNOWN_CARDINALITY
    with pytest.raises(ValueError, match="steps_per_execution"):
        model.evaluate(stream, verbose=0)
    with tf_private.one_step_per_call(model):
        model.evaluate(stream, verbose=0)
    assert int(getattr(model, tf_private.STEPS_PER_EXECUTION).numpy()) == 4 and not tf_private._warned


def test_fit_still_counts_its_steps_and_reduces_replica_outputs_as_the_runners_train_function_does():
    """runner.executors.fit's train function of its own (every step's logs handed back) reduces each step's replica
    outputs with tf_keras' reduce_per_replica and counts the step in the model's train counter, as fit's own does."""
    import numpy as np
    import tensorflow as tf
    import tf_keras

    from runner import tf_private

    reduce = tf_private.reduce_per_replica()
    assert callable(reduce), f"tf_keras {tf_private.REDUCE} is gone"
    strategy = tf.distribute.get_strategy()
    assert float(reduce(tf.constant(2.5), strategy, reduction="first")) == 2.5
    model = tf_keras.Sequential([tf_keras.layers.Input((3,)), tf_keras.layers.Dense(2)])
    model.compile(loss="mse", steps_per_execution=2)
    model.fit(np.ones((4, 3), np.float32), np.zeros((4, 2), np.float32), batch_size=2, verbose=0)
    assert int(getattr(model, tf_private.TRAIN_COUNTER).numpy()) == 2, f"tf_keras Model.{tf_private.TRAIN_COUNTER} moved"
    assert not tf_private._warned
