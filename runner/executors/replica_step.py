"""One replica's training step of the guide's custom loop: GradientTape, compute_average_loss, apply_gradients.

Shared by the in-process custom loop (custom_loop.py) and the parameter-server coordinator (ps_loop.py), which
runs it on the workers through strategy.run. With train.accumulation_steps > 1 the gradients of the batch's
micro-batches are summed before the one update (runner.executors.accumulation).
"""

from runner.executors.accumulation import accumulated
from runner.executors.base import Job


def make_replica_step(job: Job, per_example_loss, with_shard: bool = True, metrics=(), keras3: bool = False, jit=None):
    """One replica's training step; returns its share of the global loss, and (with_shard) its shard's mean loss.
    `metrics`: train.metrics' objects (made inside the scope), updated with each (micro-)batch's labels and output.
    `jit`: compile the step with XLA (None: train.jit_compile; False where the caller compiles the whole call)."""
    import tensorflow as tf
    import tf_keras

    model, optimizer, gbs = job.model, job.optimizer, job.data.global_batch_size
    scaled = isinstance(optimizer, tf_keras.mixed_precision.LossScaleOptimizer)
    k = job.train.accumulation_steps

    # The layout and precision choices live in these helpers, which AutoGraph leaves alone (plain TensorFlow,
    # no tensor-dependent Python): converting their branches inside the step made tracing measurably slower.
    # The step itself stays converted, so a user's model with tensor-dependent Python still gets AutoGraph.
    @tf.autograph.experimental.do_not_convert
    def step_loss(losses, fraction):
        """(loss, what to differentiate) of a batch, or of a micro-batch holding `fraction` of it."""
        # Gradients are summed across replicas (and micro-batches): divide by the global batch, not the replica's.
        loss = tf.nn.compute_average_loss(losses, global_batch_size=gbs)
        if model.losses:  # once per update: each micro-batch adds its share
            regularization = tf.nn.scale_regularization_loss(tf.add_n(model.losses))
            loss += regularization * tf.cast(fraction, regularization.dtype)
        # mixed precision: scale the loss up (on the tape) so float16 gradients do not underflow
        return loss, optimizer.get_scaled_loss(loss) if scaled else loss

    def micro_step(xy, fraction):
        x, y = xy
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            losses = per_example_loss(y, y_pred)
            loss, target = step_loss(losses, fraction)
        grads = tape.gradient(target, model.trainable_variables)
        for metric in metrics:
            metric.update_state(y, y_pred)
        f32 = lambda t: tf.cast(t, tf.float32)  # noqa: E731
        return grads, (f32(loss), f32(tf.reduce_sum(losses)), f32(tf.size(losses)))

    @tf.autograph.experimental.do_not_convert
    def apply(grads, loss, losses_sum, count):
        if scaled:
            grads = optimizer.get_unscaled_gradients(grads)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return (loss, tf.reshape(losses_sum / count, [1])) if with_shard else loss

    # (x, y): a debug option may add record ids to the batch (runner.builders.data.tfrecord); plain TensorFlow, left alone
    strip_ids = tf.autograph.experimental.do_not_convert(job.data.strip_ids)

    def replica_step(inputs):
        x, y = strip_ids(inputs)[:2]
        grads, (loss, losses_sum, count) = accumulated(k, (x, y), micro_step)
        return apply(grads, loss, losses_sum, count)

    # train.jit_compile for the custom loop (Keras 3's fit compiles its own train_step); the loop around it, which
    # reads the input iterator, stays outside XLA. Across workers the update stays outside it too: there its
    # all-reduce is a merge_call, which TensorFlow refuses inside a nested tf.function.
    if not (job.train.get("jit_compile") if jit is None else jit) or keras3:
        return replica_step
    if job.multi_worker:
        micro_step = tf.function(micro_step, jit_compile=True)
        return replica_step
    return tf.function(replica_step, jit_compile=True)
