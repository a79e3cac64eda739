"""train.accumulation_steps (runner.executors.accumulation): k micro-batches give the update of the whole batch.

In this process, on the default strategy: one update of the custom loop's replica step and one of Model.fit's train
step, with k = 1 and k > 1, from the same weights, on batches that k does not divide (and smaller than k), with a
weight regularizer and an activity regularizer (a loss made inside the micro-batch loop). The multi-replica and
multi-worker runs are end to end (tests/e2e/test_training.py, tests/e2e/test_cluster.py)."""

import os
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from runner.config import validate
from runner.errors import ConfigError

from helpers import composed


def _model(tf_keras, seed):
    tf_keras.utils.set_random_seed(seed)
    inputs = tf_keras.Input((5,))
    hidden = tf_keras.layers.Dense(
        7,
        activation="tanh",
        kernel_regularizer=tf_keras.regularizers.L2(0.01),
        activity_regularizer=tf_keras.regularizers.L1(0.001),
    )(inputs)
    return tf_keras.Model(inputs, tf_keras.layers.Dense(1)(hidden))


def _branching(tf_keras, seed):
    """A subclassed model with tensor-dependent Python in call(): AutoGraph must convert it inside the slice loop."""
    import tensorflow as tf

    tf_keras.utils.set_random_seed(seed)

    class Branching(tf_keras.Model):
        def __init__(self):
            super().__init__()
            self.a, self.b = tf_keras.layers.Dense(1), tf_keras.layers.Dense(1)

        def call(self, x):
            if tf.reduce_max(tf.abs(x)) > 1e6:  # never on this data, so the micro-batches take the whole batch's branch
                return self.a(x)
            return self.b(x)

    model = Branching()
    for layer in (model.a, model.b):  # both branches' variables, before any step (the optimizer's list)
        layer(tf.ones((1, 5)))
    model(tf.ones((1, 5)))  # built eagerly: Keras' build() traces call() without AutoGraph
    return model


def _half_precision(tf_keras, seed):
    """float16 outputs and loss scaling (train.mixed_precision with a model of the user's that leaves them so)."""
    tf_keras.utils.set_random_seed(seed)
    inputs = tf_keras.Input((5,))
    return tf_keras.Model(inputs, tf_keras.layers.Dense(1, dtype="mixed_float16")(inputs))


def _after_one_update(executor, k, x, y, seed, make=_model, scaled=False):
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import tensorflow as tf
    import tf_keras

    from runner.executors.fit import _replica_loss_model
    from runner.executors.replica_step import make_replica_step

    model = make(tf_keras, seed)
    optimizer = tf_keras.optimizers.SGD(0.1, momentum=0.5)
    if scaled:
        optimizer = tf_keras.mixed_precision.LossScaleOptimizer(optimizer)
    train = OmegaConf.create({"accumulation_steps": k})
    mse = tf_keras.losses.MeanSquaredError(reduction=tf_keras.losses.Reduction.NONE)
    if executor == "custom_loop":
        data = SimpleNamespace(global_batch_size=len(x), strip_ids=lambda batch: batch)
        job = SimpleNamespace(model=model, optimizer=optimizer, data=data, train=train)
        step = tf.function(make_replica_step(job, lambda t, p: mse(t, p), with_shard=True))
        loss, shard = step((tf.constant(x), tf.constant(y)))
    else:
        wrapped = _replica_loss_model(model, mse, True, 0, 1, None, lambda batch: batch, k)
        wrapped.compile(optimizer=optimizer, loss="mse")
        history = wrapped.fit(x, y, batch_size=len(x), epochs=1, verbose=0)
        loss, shard = history.history["loss"][-1], None
    return [w.numpy() for w in model.weights], float(loss), shard


@pytest.mark.slow  # imports TensorFlow
@settings(max_examples=6, deadline=None)
@given(
    executor=st.sampled_from(["custom_loop", "fit"]),
    n=st.integers(1, 11),
    k=st.integers(2, 5),
    seed=st.integers(0, 100),
)
@example(executor="fit", n=2, k=5, seed=1)  # fewer examples than micro-batches: 2 slices of 1, none empty
@example(executor="custom_loop", n=10, k=4, seed=2)  # slices of 3, 3, 3, 1
def test_k_micro_batches_make_the_update_of_the_whole_batch(executor, n, k, seed):
    rng = np.random.default_rng(seed)
    x, y = rng.normal(size=(n, 5)).astype("float32"), rng.normal(size=(n, 1)).astype("float32")
    whole, whole_loss, whole_shard = _after_one_update(executor, 1, x, y, seed)
    parts, parts_loss, parts_shard = _after_one_update(executor, k, x, y, seed)
    for a, b in zip(parts, whole):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    assert parts_loss == pytest.approx(whole_loss, rel=1e-5)
    if whole_shard is not None:
        np.testing.assert_allclose(parts_shard, whole_shard, rtol=1e-5)


@pytest.mark.parametrize("k, batch", [(3, 64), (5, 12), (65, 64)])
def test_a_k_that_does_not_divide_the_global_batch_is_refused_naming_both(k, batch):
    cfg = composed(f"train.accumulation_steps={k}", f"train.global_batch_size={batch}")
    with pytest.raises(ConfigError) as err:
        validate.check_config(cfg)
    said = str(err.value)
    assert f"train.accumulation_steps={k}" in said and f"train.global_batch_size={batch}" in said and "\n" not in said


def test_a_k_that_divides_it_passes_and_zero_is_out_of_range():
    validate.check_config(composed("train.accumulation_steps=4", "train.global_batch_size=64"))
    with pytest.raises(ConfigError, match="train.accumulation_steps"):
        validate.check_config(composed("train.accumulation_steps=0"))


@pytest.mark.slow  # imports TensorFlow
@pytest.mark.parametrize("executor", ["custom_loop", "fit"])
@pytest.mark.parametrize(
    "make, scaled, rtol", [(_branching, False, 1e-5), (_half_precision, True, 2e-3)], ids=["autograph", "float16"]
)
def test_a_model_with_tensor_dependent_python_or_float16_outputs_accumulates_too(executor, make, scaled, rtol):
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(8, 5)).astype("float32"), rng.normal(size=(8, 1)).astype("float32")
    whole, _, _ = _after_one_update(executor, 1, x, y, 3, make, scaled)
    parts, _, _ = _after_one_update(executor, 2, x, y, 3, make, scaled)
    for a, b in zip(parts, whole):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=1e-4 if scaled else 1e-7)


@pytest.mark.slow  # imports TensorFlow
def test_batch_normalization_with_accumulation_is_a_warning(caplog):
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import tf_keras

    from runner.executors.accumulation import warn_batch_norm

    inputs = tf_keras.Input((5,))
    model = tf_keras.Model(inputs, tf_keras.layers.BatchNormalization(name="bn")(tf_keras.layers.Dense(3)(inputs)))
    warn_batch_norm(model, 1)
    assert not caplog.records
    warn_batch_norm(model, 2)
    assert "train.accumulation_steps=2 with 1 BatchNormalization layer(s) (bn)" in caplog.text

    import keras

    for k in (tf_keras, keras):  # a residual block's kind: the normalization inside a custom layer

        class Block(k.layers.Layer):
            def __init__(self, k=k):
                super().__init__()
                self.dense, self.norm = k.layers.Dense(5), k.layers.BatchNormalization(name="inner_bn")

            def call(self, x):
                return x + self.norm(self.dense(x))

        inputs = k.Input((5,))
        caplog.clear()
        warn_batch_norm(k.Model(inputs, k.layers.Dense(2)(Block()(inputs))), 2)
        assert "1 BatchNormalization layer(s) (inner_bn)" in caplog.text, k.__name__
