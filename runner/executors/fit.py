"""Keras Model.fit then Model.evaluate, with per-replica losses and throughput reported every N steps."""

import sys

from runner.executors.base import Job, Result, Throughput, log, replica_metrics


def _replica_loss_model(inner, per_example_loss):
    """Wrap the user's model so each train step also returns every replica's own shard loss.

    The shard losses are all-gathered inside the step, so each replica holds the same vector and
    distribute_reduction_method="first" hands it back whole (and keeps the usual logs unsummed across workers).
    """
    import tensorflow as tf
    import tf_keras

    class ReplicaLossModel(tf_keras.Model):
        def __init__(self):
            super().__init__(name="replica_loss_model")
            self.inner = inner

        def call(self, inputs, training=None):
            return self.inner(inputs, training=training)

        def train_step(self, data):
            x, y, sample_weight = tf_keras.utils.unpack_x_y_sample_weight(data)
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(x, y, y_pred, sample_weight)
            self.optimizer.minimize(loss, self.trainable_variables, tape=tape)
            logs = dict(self.compute_metrics(x, y, y_pred, sample_weight))
            shard = tf.reshape(tf.reduce_mean(per_example_loss(y, y_pred)), [1])
            logs["replica_losses"] = tf.distribute.get_replica_context().all_gather(shard, axis=0)
            return logs

    return ReplicaLossModel()


def _callback(job: Job, meter: Throughput):
    import tf_keras

    spe, every = job.data.steps_per_epoch, job.train.log_every_n_steps

    class Report(tf_keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self._supports_tf_logs = True  # no per-step NumPy conversion unless we log
            self.epoch, self.logged_at = 0, 0

        def on_train_begin(self, logs=None):
            meter.start()

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            step = self.epoch * spe + batch + 1
            meter.tick(step)
            if step - self.logged_at >= every or batch + 1 == spe:
                self.logged_at = step
                values = {k: float(v) for k, v in logs.items() if k != "replica_losses"}
                values.update(replica_metrics(logs["replica_losses"].numpy()))
                values.update(meter.window())
                job.reporter.log_metrics(values, step)

    return Report()


def run_fit(job: Job) -> Result:
    import tf_keras

    from runner.builders.model import build_loss, build_metrics

    with job.strategy.scope():
        model = _replica_loss_model(job.model, build_loss(job.loss, tf_keras.losses.Reduction.NONE))
        model.compile(
            optimizer=job.optimizer,
            loss=build_loss(job.loss),
            metrics=build_metrics(job.loss),
            steps_per_execution=job.train.steps_per_execution,
        )
    model.distribute_reduction_method = "first"
    verbose = job.executor.verbose
    verbose = (1 if sys.stdout.isatty() else 2) if verbose == "auto" else int(verbose)
    meter = Throughput(job.data.global_batch_size, job.replicas)
    data = job.data
    fit_input = data.fit_input()
    kwargs = {"batch_size": data.global_batch_size} if data.input == "numpy" else {}
    x, y = fit_input if data.input == "numpy" else (fit_input, None)
    log.info("training with Model.fit: %d epochs x %d steps, global batch %d over %d replica(s)",
             job.train.epochs, data.steps_per_epoch, data.global_batch_size, job.replicas)
    history = model.fit(
        x, y, epochs=job.train.epochs, steps_per_epoch=data.steps_per_epoch, verbose=verbose,
        callbacks=[_callback(job, meter)], shuffle=data.shuffle, **kwargs,
    )
    steps = job.train.epochs * data.steps_per_epoch
    eval_input = (data.arrays.x_eval, data.arrays.y_eval) if data.input == "numpy" else (data.eval_dataset(), None)
    results = model.evaluate(*eval_input, return_dict=True, verbose=0, **kwargs)
    eval_metrics = {f"eval/{k}": float(v) for k, v in results.items()}
    job.reporter.log_metrics({**eval_metrics, **meter.summary()}, steps)
    return Result(steps, float(history.history["loss"][-1]), eval_metrics, meter.overall().get("throughput/examples_per_sec"))
