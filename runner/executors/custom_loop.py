"""The guide's custom training loop: GradientTape, strategy.run, compute_average_loss, strategy.reduce.

train.steps_per_loop steps run inside one tf.function call (a tf.range loop over the distributed iterator),
which cuts host overhead the way Orbit's loop_fns do.
"""

import time

from runner.executors.base import Job, Result, Throughput, log, progress_line, replica_metrics


def _local_vector(strategy, per_replica):
    """This worker's per-replica scalars as one vector, in replica order."""
    import tensorflow as tf

    return tf.stack([tf.reshape(v, []) for v in strategy.experimental_local_results(per_replica)])


def run_custom_loop(job: Job) -> Result:
    import tensorflow as tf
    import tf_keras

    from runner.builders.model import build_loss, build_metrics

    strategy, model, optimizer, data = job.strategy, job.model, job.optimizer, job.data
    gbs = data.global_batch_size
    with strategy.scope():
        per_example_loss = build_loss(job.loss, tf_keras.losses.Reduction.NONE)
        eval_loss = tf_keras.metrics.Mean(name="loss")
        eval_metrics = build_metrics(job.loss)
    num_local = strategy.num_replicas_in_sync  # one worker: every replica is local

    def replica_step(inputs):
        x, y = inputs
        with tf.GradientTape() as tape:
            losses = per_example_loss(y, model(x, training=True))
            # Gradients are summed across replicas: divide by the global batch, not the replica's.
            loss = tf.nn.compute_average_loss(losses, global_batch_size=gbs)
            if model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss, tf.reduce_mean(losses)

    @tf.function
    def train_loop(iterator, num_steps):
        total, shards = tf.constant(0.0), tf.zeros([num_local])
        for _ in tf.range(num_steps):
            loss, shard = strategy.run(replica_step, args=(next(iterator),))
            total += strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None)
            shards += _local_vector(strategy, shard)
        n = tf.cast(num_steps, tf.float32)
        return total / n, shards / n

    def replica_eval(inputs):
        x, y = inputs
        logits = model(x, training=False)
        eval_loss.update_state(per_example_loss(y, logits))
        for metric in eval_metrics:
            metric.update_state(y, logits)

    @tf.function
    def eval_step(inputs):
        strategy.run(replica_eval, args=(inputs,))

    spe, epochs, every = data.steps_per_epoch, job.train.epochs, job.train.log_every_n_steps
    per_call = job.train.steps_per_loop
    meter = Throughput(gbs, job.replicas)
    iterator = iter(data.distributed_train(strategy))
    log.info("training with a custom loop: %d epochs x %d steps (%d per tf.function call), global batch %d over %d replica(s)",
             epochs, spe, per_call, gbs, job.replicas)
    meter.start()
    step, epoch_loss = 0, 0.0
    for epoch in range(epochs):
        done, loss_sum, logged_at = 0, 0.0, 0
        while done < spe:
            n = min(per_call, spe - done)
            loss, shards = train_loop(iterator, tf.constant(n))
            done, step = done + n, step + n
            loss_sum += float(loss) * n
            meter.tick(step)
            if done - logged_at >= every or done == spe:
                logged_at = done
                epoch_loss = loss_sum / done
                rates = meter.window()
                job.reporter.log_metrics({"loss": epoch_loss, **replica_metrics(shards.numpy()), **rates}, step)
                log.info(progress_line(epoch + 1, epochs, done, spe, epoch_loss, rates))
    started = time.perf_counter()
    for batch in data.distributed_eval(strategy):
        eval_step(batch)
    results = {"eval/loss": float(eval_loss.result())}
    results.update({f"eval/{m.name}": float(m.result()) for m in eval_metrics})
    log.info("evaluation: %s (%.1fs)", ", ".join(f"{k}={v:.4f}" for k, v in results.items()), time.perf_counter() - started)
    job.reporter.log_metrics({**results, **meter.summary()}, step)
    return Result(step, epoch_loss, results, meter.overall().get("throughput/examples_per_sec"))
