"""Keras Model.fit then Model.evaluate, with per-replica losses and throughput reported every N steps."""

import time

import numpy as np

from runner import tf_private
from runner.control.stopping import StopGuard
from runner.errors import ConfigError
from runner.executors import per_call, resident, xla
from runner.executors.accumulation import accumulated
from runner.executors.base import (
    RUN_RATE,
    Job,
    ProgressLines,
    Result,
    Throughput,
    accumulation_text,
    check_loss,
    concrete_per_iterator,
    epochs_text,
    last_log_point,
    log,
    logged_steps,
    progress_line,
    replica_metrics,
    training_ended,
)
from runner.executors.early_stopping import after_epoch, restore_best
from runner.executors.evaluation import evaluate_on_coordinator, make_evaluator
from runner.executors.replica_losses import ShardLosses, WorkerTable
from runner.tracking import phases


def _replica_loss_model(
    inner,
    per_example_loss,
    gather: bool,
    initial_step: int,
    replicas: int,
    shard_losses,
    strip_ids,
    accumulation_steps: int,
    stepwise=None,
    table_rows: int = 0,
    metric_count: int = 0,
    blocks=None,
):
    """Wrap the user's model so each train step also keeps every replica's own shard loss (replica_losses()).

    One worker with several replicas (shard_losses, a ShardLosses): each replica writes its shard loss on its own
    device, with no cross-device op in the step, and replica_losses() reads the copies when metrics are logged.
    Several workers: the shard losses are all-gathered in the step (the chief needs the other workers'), so each
    replica holds the same vector and distribute_reduction_method="first" hands it back whole.

    `strip_ids(batch)` makes a training batch (x, y): record ids dropped (runner.builders.data.tfrecord), or row
    indices gathered (runner.executors.resident).

    `stepwise` (tf_keras' reduce_per_replica, or None): the train function hands back every step's logs of a call
    beside the last step's (`step_logs`), so that the logged steps inside a call are reported after it.
    `table_rows` (stepwise over several replicas, no XLA): the most steps a call runs; each replica keeps its shard
    loss and its metrics' sums (a Reduce metric's total and count, read from its own copy) in its own column of a
    sync-on-read table, summed across replicas and workers once a call (`step_rows`), instead of an all-gather of the
    shard losses and a merge of every metric in every step: each step's results are the sums' (total / count), as
    the metric's own result() computes them.
    `blocks` (stepwise, XLA, in-memory data on one replica: a resident.Blocks): the iterator yields blocks of row
    batches; each call takes its steps' row batches from them and runs its steps in one XLA computation, the gather
    included, instead of one per step.
    """
    import tensorflow as tf
    import tf_keras

    local = shard_losses is not None
    metric_slots = metric_count + 1  # the loss's mean and the compiled metrics'
    Mean, Sum = tf_keras.metrics.Mean, tf_keras.metrics.Sum  # the metrics whose result is their sums'
    reductions = []  # table_rows: (name, is a sum) of each metric, when the table carries their sums (found in tracing)

    strip_ids = tf.autograph.experimental.do_not_convert(strip_ids)  # (x, y): record ids ride along only when debugging

    class ReplicaLossModel(tf_private.ResumeInsideEpoch, tf_keras.Model):  # resumes at initial_step, inside an epoch too
        def __init__(self):
            super().__init__(name="replica_loss_model")
            self.inner = inner
            self.resume_step = initial_step
            self.step_logs = None  # stepwise: the last call's logs of each step, flattened (steps x values)
            self.step_rows = None  # table_rows: the last call's shard losses (steps x replicas)

        def replica_losses(self, logs):
            """Every replica's shard loss at the last step, in replica order."""
            if local:
                return shard_losses.read()
            return [float(v) for v in np.ravel(logs["replica_losses"])]

        def logged(self, logs):
            """The step's logs as numbers: loss and metrics, the epoch's means so far."""
            return {k: float(np.mean(v)) for k, v in logs.items() if k != "replica_losses"}

        def call(self, inputs, training=None):
            return self.inner(inputs, training=training)

        def accumulate(self, x, y, sample_weight):
            """train.accumulation_steps micro-batches, one update: (the step's loss, the replica's mean loss)."""
            variables = self.trainable_variables
            scaled = isinstance(self.optimizer, tf_keras.mixed_precision.LossScaleOptimizer)

            def micro_step(part, fraction):
                x, y, *weights = part
                sample_weight = weights[0] if weights else None
                with tf.GradientTape() as tape:
                    y_pred = self(x, training=True)
                    # compute_loss: the slice's mean (its share of the loss metric, by its size); times its share
                    loss = tf.cast(self.compute_loss(x, y, y_pred, sample_weight), tf.float32) * fraction
                    target = self.optimizer.get_scaled_loss(loss) if scaled else loss
                self.compiled_metrics.update_state(y, y_pred, sample_weight)
                # the replica's shard loss: the unweighted mean over its batch (regularization losses made inside the
                # loop cannot be read after it, so not `loss` undone as below)
                mean = tf.cast(tf.reduce_mean(per_example_loss(y, y_pred)), tf.float32) * fraction
                return tape.gradient(target, variables), (loss, mean)

            part = (x, y) if sample_weight is None else (x, y, sample_weight)
            grads, (loss, mean) = accumulated(accumulation_steps, part, micro_step)
            if scaled:
                grads = self.optimizer.get_unscaled_gradients(grads)
            self.optimizer.apply_gradients(zip(grads, variables))
            return loss, mean

        def metric_sums(self):
            """table_rows: {"sums": each metric's (total, count) in this replica's own copy}, read with no collective,
            when every metric is a Reduce one (a mean or a sum, as the loss and the built-in accuracy are); else the
            metrics' results as fit's own step gives them (a merge of every metric in every step)."""
            metrics = self.metrics
            if len(metrics) > metric_slots or not all(isinstance(m, (Mean, Sum)) for m in metrics):
                reductions.clear()
                return dict(self.get_metrics_result())
            reductions[:] = [(m.name, isinstance(m, Sum)) for m in metrics]
            values = [v for m in metrics for v in (m.total, 0.0 if isinstance(m, Sum) else m.count)]
            values += [0.0] * (2 * metric_slots - len(values))
            return {"sums": tf.stack([tf.cast(v, tf.float32) for v in values])}

        def results_of(self, rows):
            """(the last step's logs, each step's logs flattened as logs_of_steps reads them) from the table's rows
            (steps x replicas x (shard loss, each metric's total and count)): every replica's sums added up."""
            sums = tf.reduce_sum(rows[:, :, 1:], axis=1)
            values = {}
            for j, (name, is_sum) in enumerate(reductions):
                total, count = sums[:, 2 * j], sums[:, 2 * j + 1]
                values[name] = total if is_sum else tf.math.divide_no_nan(total, count)
            last = {name: v[-1] for name, v in values.items()}
            return last, tf.stack([values[name] for name in sorted(values)], axis=1)  # tf.nest's order of a dict

        def shard_loss(self, loss, y, y_pred, sample_weight):
            """This replica's mean loss over its batch, from the step's loss where that can be undone."""
            if sample_weight is not None:
                return tf.reduce_mean(per_example_loss(y, y_pred))
            if replicas == 1 and not self.losses:
                return loss  # one replica, no regularization: the step's loss is its shard's (no ops added)
            # compute_loss returns (this shard's mean loss + regularization) / replicas (tf_keras scales it for
            # distribution): undo that instead of computing the loss a second time.
            return loss * replicas - (tf.add_n(self.losses) if self.losses else 0.0)

        def make_train_function(self, force=False):
            cached = self.train_function is not None and not force
            fn = super().make_train_function(force)
            # A tf.function of the iterator (not parameter_server's scheduling lambda, not run_eagerly): call it
            # through its concrete function, as the custom loop does.
            if not cached and fn is self.train_tf_function:
                if stepwise is None:
                    self.train_function = concrete_per_iterator(fn)
                else:
                    call = concrete_per_iterator(self.stepwise_train_function())
                    self.train_function = lambda iterator: self.split(call(iterator))
            return self.train_function

        def split(self, out):
            last, self.step_logs, rows = out
            self.step_rows = rows if table_rows else None
            return last

        def logs_of_steps(self, last):
            """The last call's logs of each step, {name: steps x value}, laid out as `last` (its last step's logs)."""
            rows, nest, at, out = self.step_logs.numpy(), tf.nest, 0, []
            for t in nest.flatten(last):  # tensors, or numbers where another callback had Keras copy them
                shape = tuple(np.shape(t))
                size = int(np.prod(shape))
                out.append(rows[:, at : at + size].reshape((len(rows), *shape)))
                at += size
            steps = nest.pack_sequence_as(last, out)
            if self.step_rows is not None:
                steps["replica_losses"] = self.step_rows.numpy()
            return steps

        def stepwise_train_function(self):
            """Model.fit's train function of several steps per call (tf_keras' make_train_function), which also
            hands back every step's logs: (the last step's, each step's stacked)."""
            strategy, nest, table = self.distribute_strategy, tf.nest, None
            if table_rows:
                with strategy.scope():  # not an attribute: no weight of the model's
                    table = WorkerTable(strategy, table_rows, width=1 + 2 * metric_slots)

            # Not converted by AutoGraph, as fit's own step function is not (it lives in tf_keras): converting the
            # train step doubled the first call's tracing. Keras converts each layer's call itself.
            @tf.autograph.experimental.do_not_convert
            def run_step(data, i):
                outputs = self.train_step(data)
                if table is not None:  # this replica's column of its own copy: no collective in the step
                    shard = tf.reshape(outputs.pop("replica_losses"), [1])
                    sums = outputs.pop("sums", tf.zeros([2 * metric_slots]))
                    outputs["written"] = table.write(i, tf.concat([shard, sums], 0))
                with tf.control_dependencies(nest.flatten(outputs)):  # counted only when the step ran
                    outputs.pop("written", None)
                    getattr(self, tf_private.TRAIN_COUNTER).assign_add(1)
                return outputs

            if self.jit_compile and blocks is None:
                run_step = tf.function(run_step, jit_compile=True, reduce_retracing=True)

            @tf.autograph.experimental.do_not_convert
            def step_on(data, i):
                outputs = strategy.run(run_step, args=(data, i))
                return stepwise(outputs, strategy, reduction=self.distribute_reduction_method)

            spec = []  # a step's logs: their structure and each one's shape, found while the step is traced

            @tf.autograph.experimental.do_not_convert
            def flat(logs):  # one vector a step (an array's element shape is fixed before the first step's logs exist)
                values = [tf.cast(t, tf.float32) for t in nest.flatten(logs)]
                spec[:] = [logs, [v.shape for v in values]]
                return tf.concat([tf.zeros([0]), *(tf.reshape(v, [-1]) for v in values)], 0)

            @tf.autograph.experimental.do_not_convert
            def unflat(row):  # a step's logs from its vector
                logs, shapes = spec
                parts = tf.split(row, [s.num_elements() for s in shapes]) if shapes else []
                return nest.pack_sequence_as(logs, [tf.reshape(p, s) for p, s in zip(parts, shapes)])

            most = blocks.block if blocks is not None else 0  # a block is a call's steps (the XLA call is capped to it)

            @tf.function(jit_compile=True)
            def xla_steps(rows, n):
                """A call's steps in one XLA computation: `rows` holds `most` row batches, the first n trained on (one
                shape and a bound read at run time: compiled once, whatever the call's length)."""

                def body(i, steps):
                    return i + 1, steps.write(i, flat(step_on(rows[i], i)))

                steps = tf.TensorArray(tf.float32, size=most, element_shape=[None])
                _, steps = tf.while_loop(lambda i, _: i < n, body, (0, steps), maximum_iterations=most)
                return steps.stack()

            @tf.function(reduce_retracing=True)
            def train_function(iterator):
                # fit cuts the epoch's last call to what is left of it
                n = tf.cast(getattr(self, tf_private.STEPS_PER_EXECUTION), tf.int32)
                if blocks is not None:
                    rows = tf.TensorArray(tf.int64, size=n)
                    for i in tf.range(n):
                        rows = rows.write(i, blocks.take_rows(iterator))
                    rows = rows.stack()
                    steps = xla_steps(tf.pad(rows, [[0, most - n], [0, 0]]), n)[:n]
                else:
                    steps = tf.TensorArray(tf.float32, size=n, element_shape=[None])
                    for i in tf.range(n):  # only the steps' vectors cross iterations: their logs may be empty (sums)
                        steps = steps.write(i, flat(step_on(next(iterator), i)))
                    steps = steps.stack()
                if table is None:
                    return unflat(steps[-1]), steps, tf.zeros([0])
                rows = table.read(n)  # summed over replicas and workers: one collective
                if not reductions:  # the metrics are not sums: their results came with each step
                    return unflat(steps[-1]), steps, rows[:, :, 0]
                return (*self.results_of(rows), rows[:, :, 0])

            self.train_tf_function = train_function
            return train_function

        def train_step(self, data):
            x, y, sample_weight = tf_keras.utils.unpack_x_y_sample_weight(strip_ids(data))
            if accumulation_steps > 1:
                loss, shard = self.accumulate(x, y, sample_weight)
                logs = self.metric_sums() if table_rows else dict(self.get_metrics_result())
            else:
                with tf.GradientTape() as tape:
                    y_pred = self(x, training=True)
                    loss = self.compute_loss(x, y, y_pred, sample_weight)
                self.optimizer.minimize(loss, self.trainable_variables, tape=tape)
                if table_rows:
                    self.compiled_metrics.update_state(y, y_pred, sample_weight)
                    logs = self.metric_sums()
                else:
                    logs = dict(self.compute_metrics(x, y, y_pred, sample_weight))
                shard = self.shard_loss(loss, y, y_pred, sample_weight)
            if shard.dtype != tf.float32:
                shard = tf.cast(shard, tf.float32)
            if local:
                shard_losses.write(shard)
            elif gather and replicas > 1 and not table_rows:
                # one value per replica: said statically (all_gather's length is known only at run time), as the stepwise
                # train function splits each step's flattened logs by their static shapes
                gathered = tf.distribute.get_replica_context().all_gather(tf.reshape(shard, [1]), axis=0)
                logs["replica_losses"] = tf.reshape(gathered, [replicas])
            else:  # parameter_server: one replica per step; one replica: nothing to gather; table_rows: run_step's
                logs["replica_losses"] = shard
            return logs

    return ReplicaLossModel()


def _progress_bar():
    """Keras' progress bar without the step's `replica_losses` (an internal value: the per-replica losses are
    logged to MLflow as loss/replica_<i>); passed to fit, it replaces the bar Keras would add."""
    import tf_keras

    class ProgressBar(tf_keras.callbacks.ProgbarLogger):
        def on_train_batch_end(self, batch, logs=None):
            super().on_train_batch_end(batch, _shown(logs))

        def on_epoch_end(self, epoch, logs=None):
            super().on_epoch_end(epoch, _shown(logs))

    return ProgressBar(count_mode="steps")


def _shown(logs):
    return {k: v for k, v in (logs or {}).items() if k != "replica_losses"}


def _callbacks(
    job: Job,
    meter: Throughput,
    initial_step: int,
    guard: StopGuard,
    mode: str,
    evaluate,
    own=(),
    keras=None,
    per_execution=1,
    stepwise=False,
):
    """`own`: train.metrics' objects, whose per-replica copies are read at each report (one worker only). `keras`:
    the model's Keras (keras_of), whose Callback they subclass; tf_keras when not given. `stepwise`: the model
    hands back every step's logs of a call (model.step_logs), and the logged steps inside it are reported after it."""
    import tf_keras

    from runner.builders.metrics import per_replica

    keras = keras or tf_keras
    spe, every = job.data.steps_per_epoch, job.train.log_every_n_steps
    epochs = job.train.epochs
    progress = ProgressLines(mode, epochs * spe)
    # Keras 3 resumed inside an epoch: its fit counts that epoch's batches from 0 (_fit_calls), tf_keras' from the step
    skipped = initial_step % spe if keras is not tf_keras else 0

    def step_of(epoch: int, batch: int) -> int:
        return epoch * spe + batch + 1 + (skipped if epoch == initial_step // spe else 0)

    class EpochReport(keras.callbacks.Callback):
        """Checkpoints, and metrics once per epoch (all that parameter_server allows: no batch-level hooks)."""

        lines = progress  # the progress lines, for run_fit to end after its last fit call

        def __init__(self):
            super().__init__()
            # Tensor logs, read only when reported; parameter_server: remote values, let Keras fetch them.
            tf_private.take_tf_logs(self, not job.parameter_server)
            self.epoch, self.ended, self.last_step, self.loss = 0, None, None, None
            self.logged_at = initial_step - initial_step % spe + last_log_point(initial_step % spe, every)

        def on_train_begin(self, logs=None):
            meter.start()

        def on_train_end(self, logs=None):
            # Training ends here. Model.fit then drops its input iterator, and tf.data's autotuning can hold that
            # teardown for a long while, at random: not training time, so time/train_sec stops here.
            self.ended = time.perf_counter()

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch
            meter.resume()

        def report(self, step, logs, rates=None, logged=True):
            """`rates`: the throughput of the window that ended with the call (measured now when not given);
            logged to MLflow with the call's last logged step only (`logged`), shown on each progress line."""
            self.logged_at = step
            values = self.model.logged(logs)
            check_loss(job, values.get("loss", 0.0), step)
            values.update(replica_metrics(self.model.replica_losses(logs)))
            if own and not job.multi_worker and not job.parameter_server:
                values.update(per_replica(job.strategy, own))
            rates = meter.window() if rates is None else rates
            if logged:
                values.update(rates)
            values.update(job.learning_rate(step))
            job.reporter.log_metrics(values, step)
            done, epoch, loss = step - self.epoch * spe, self.epoch + 1, values.get("loss", float("nan"))
            progress.show(step, lambda: progress_line(epoch, epochs, done, spe, loss, rates))

        def on_epoch_end(self, epoch, logs=None):
            step = (epoch + 1) * spe
            if job.parameter_server:
                meter.tick(step)
                self.report(step, logs)
                meter.pause()
            else:
                meter.pause()  # the checkpoint and the next epoch's input iterator are not a step's time
            self.loss = self.model.logged(logs)["loss"]  # the epoch's mean loss
            if not job.parameter_server:  # (report checked it)
                check_loss(job, self.loss, step)
            if job.checkpoints:
                job.checkpoints.save(step)
            self.last_step = step
            if after_epoch(job, step, evaluate):
                self.model.stop_training = True
            if job.parameter_server:  # no batch-level hooks there: a signal is acted on at the epoch's end
                guard.check(step)

    class BatchReport(EpochReport):
        """Metrics every train.log_every_n_steps steps."""

        def on_train_batch_end(self, batch, logs=None):
            step = step_of(self.epoch, batch)
            meter.tick(step)
            if stepwise:
                self.report_steps(step, logs)
            elif step - self.logged_at >= every or step % spe == 0:
                self.report(step, logs)
            guard.check(step)

        def report_steps(self, step, logs):
            """Each logged step of the call that ended at `step` (`logs`: its last step's), from its own logs."""
            n = int(self.model.step_logs.shape[0])
            start, base = step - n, step - 1 - (step - 1) % spe  # the call's and the epoch's first step - 1
            points = [base + p for p in logged_steps(start - base, step - base, self.logged_at - base, every, spe)]
            if not points:  # no logged step in this call: its logs are not read
                return
            steps, rates = self.model.logs_of_steps(logs), meter.window()
            for p in points:
                self.report(p, {k: v[p - start - 1] for k, v in steps.items()}, rates, logged=p == points[-1])

    class ProfileEpochs(keras.callbacks.Callback):
        """train.profile_steps, at the epochs that hold them (parameter_server: no batch-level hooks)."""

        def on_epoch_begin(self, epoch, logs=None):
            job.profile.before(epoch * spe + 1, spe)

        def on_epoch_end(self, epoch, logs=None):
            job.profile.after((epoch + 1) * spe)

    class ProfileSteps(ProfileEpochs):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_epoch_end(self, epoch, logs=None):
            pass

        def on_train_batch_begin(self, batch, logs=None):
            job.profile.before(step_of(self.epoch, batch), per_execution)

        def on_train_batch_end(self, batch, logs=None):
            job.profile.after(step_of(self.epoch, batch))

    report = EpochReport() if job.parameter_server else BatchReport()
    # Keras 3's own bar shows its logs as they are (no replica_losses there): it adds it itself
    callbacks = [report, _progress_bar()] if mode == "bar" and keras is tf_keras else [report]
    if job.profile.wanted:
        callbacks.append(ProfileEpochs() if job.parameter_server else ProfileSteps())
    return callbacks


def _whole_call_xla(job: Job, stepwise: bool) -> bool:
    """train.jit_compile over a whole call: each step's logs come back with the call, in-memory data, one replica."""
    return bool(stepwise and job.train.jit_compile and resident.usable(job))


def _tf_keras_fit(job: Job, initial_step: int, per_execution: int, stepwise: bool):
    """(model, inputs(done steps) -> fit's x, y and kwargs, evaluate, train.metrics' objects) for a tf_keras model."""
    import tf_keras

    from runner.builders.loss import build_loss
    from runner.builders.metrics import build_metrics, build_own

    tf_private.ResumeInsideEpoch.check()
    gather = not job.parameter_server
    table_rows = per_execution if stepwise and job.replicas > 1 and not job.train.jit_compile else 0
    one_worker = gather and job.replicas > 1 and not job.multi_worker
    shard_losses = ShardLosses(job.strategy) if one_worker and not table_rows else None
    held, blocks = (resident.Resident(job.data) if resident.usable(job) else None), None
    if _whole_call_xla(job, stepwise):  # one XLA computation a call (_replica_loss_model)
        held = blocks = resident.Blocks(job.data, resident.block_steps(per_execution, job.data.global_batch_size))
    with job.strategy.scope():
        own = build_own(job.metrics)  # train.metrics: logged per split, and per replica (per-example ones)
        metrics = [*build_metrics(job.loss), *own]
        model = _replica_loss_model(
            job.model,
            build_loss(job.loss, tf_keras.losses.Reduction.NONE),
            gather,
            initial_step,
            job.replicas,
            shard_losses,
            job.data.strip_ids if held is None else held.gather,
            job.train.accumulation_steps,
            tf_private.reduce_per_replica() if stepwise else None,
            table_rows,
            len(metrics),
            blocks,
        )
        model.compile(
            optimizer=job.optimizer,
            loss=build_loss(job.loss),
            metrics=metrics,
            steps_per_execution=per_execution,
            jit_compile=bool(job.train.jit_compile),
        )
    model.distribute_reduction_method = "first"
    data = job.data
    # a resumed run's input starts at its step (not under parameter_server: workers take batches in no fixed order)
    if blocks is not None:
        fit_input = blocks.rows(initial_step, blocks.block)
    elif held is not None:
        fit_input = held.rows(initial_step)
    else:
        fit_input = data.fit_input(dataset_creator=job.parameter_server, done_steps=0 if job.parameter_server else initial_step)
    arrays_in = data.input == "numpy" and not job.parameter_server
    kwargs = {"batch_size": data.global_batch_size} if arrays_in else {}
    x, y = fit_input if arrays_in else (fit_input, None)
    # one fit call (ResumeInsideEpoch starts it at the step)
    inputs = lambda done_steps: (x, y, {"shuffle": data.shuffle, **kwargs})  # noqa: E731
    coordinator = []  # parameter_server: one evaluator (its metric variables) for every evaluation

    def evaluate() -> dict[str, float]:
        if job.parameter_server:
            if not coordinator:
                coordinator.append(make_evaluator(job, build_loss(job.loss, tf_keras.losses.Reduction.NONE)))
            return evaluate_on_coordinator(job, coordinator[0])
        eval_input = (data.arrays.x_eval, data.arrays.y_eval) if arrays_in else (data.eval_dataset(), None)
        with tf_private.one_step_per_call(model):
            results = model.evaluate(*eval_input, return_dict=True, verbose=0, **kwargs)
        return {f"eval/{k}": float(v) for k, v in results.items()}

    return model, inputs, evaluate, own


def _keras3_fit(job: Job, initial_step: int, per_execution: int, stepwise: bool):
    """The same for a Keras 3 model (runner.executors.keras3_fit): its input is the custom loop's distributed
    dataset, from the resumed step on, whatever data.input is (Keras 3 has no DatasetCreator; its own batching of
    arrays would shuffle them otherwise than the other executors)."""
    from runner.builders.loss import PER_EXAMPLE, build_loss
    from runner.builders.metrics import build_own
    from runner.executors.keras3_fit import keras3_evaluator, keras3_model

    shard_losses = ShardLosses(job.strategy)
    with job.strategy.scope():
        per_example_loss = build_loss(job.loss, PER_EXAMPLE, job.keras)
        own = build_own(job.metrics)
        model = keras3_model(job, per_example_loss, shard_losses, own)
        jit = {} if job.train.jit_compile is None else {"jit_compile": job.train.jit_compile}  # None: Keras 3's auto
        model.compile(optimizer=job.optimizer, steps_per_execution=per_execution, **jit)
    # shuffle=False: the runner's dataset is shuffled already (Keras 3 warns otherwise)
    inputs = lambda done_steps: (job.data.distributed_train(job.strategy, done_steps), None, {"shuffle": False})  # noqa: E731
    return model, inputs, keras3_evaluator(job, per_example_loss), own


def stepwise_logs(job: Job) -> bool:
    """Whether a tf_keras fit hands back every step's logs, so that auto steps per call need not end at logged steps:
    not under parameter_server (a closure per step), nor where what is logged is read at the end of a call only
    (train.metrics' per-replica copies; each replica's shard loss on its own device under XLA, or in the one variable
    CentralStorageStrategy makes of a per-replica one), nor with the user's own callbacks (they keep seeing a batch
    end at every logged step), nor without tf_keras' reduce_per_replica."""
    import tensorflow as tf

    if job.parameter_server or job.metrics:
        return False
    if job.replicas > 1 and not job.multi_worker:
        if job.train.jit_compile or isinstance(job.strategy, tf.distribute.experimental.CentralStorageStrategy):
            return False
    return not job.executor.get("callbacks") and tf_private.reduce_per_replica() is not None


def _fit_calls(initial_step: int, spe: int, epochs: int, inside_epoch: bool) -> list[tuple[int, int, int, int]]:
    """(initial_epoch, epochs, steps_per_epoch, done steps) of each Model.fit call. One, unless a resumed run starts
    inside an epoch and fit cannot (`inside_epoch` False: Keras 3 has no hook for it): then that epoch's remaining
    steps first, as an epoch of their own, then the following epochs."""
    first, done = divmod(initial_step, spe)
    if inside_epoch or not done:
        return [(first, epochs, spe, initial_step)]
    rest = [(first + 1, epochs, spe, (first + 1) * spe)] if first + 1 < epochs else []
    return [(first, first + 1, spe - done, initial_step), *rest]


def _xla_collectives_exist(job: Job) -> None:
    """Across workers, fit's XLA step holds MultiWorkerMirroredStrategy's all-reduce, which XLA implements for GPUs
    only: on CPUs TensorFlow refuses at the first step, after the build. Refused here instead (the custom loop keeps
    the all-reduce outside XLA, runner.executors.replica_step)."""
    import tensorflow as tf

    if job.train.jit_compile and job.multi_worker and isinstance(job.strategy, tf.distribute.MultiWorkerMirroredStrategy):
        if not tf.config.list_logical_devices("GPU"):
            raise ConfigError(
                "train.jit_compile=true with strategy=multi_worker_mirrored over several workers and executor=fit "
                "puts the all-reduce inside XLA, which has no collectives for CPUs, and TensorFlow sees no GPU here. "
                "Use executor=custom_loop (it compiles each replica's forward and backward pass and all-reduces "
                "outside XLA), or leave train.jit_compile unset."
            )


def run_fit(job: Job) -> Result:
    _xla_collectives_exist(job)
    initial_step = job.restore()
    keras = job.keras
    tf_keras_model = keras.__name__ == "tf_keras"
    stepwise = tf_keras_model and stepwise_logs(job)
    # Keras 3's fit runs whole calls only (runner.executors.per_call)
    per_execution = per_call.of(job, job.train.steps_per_execution, whole=not tf_keras_model, logs_inside=stepwise)
    build = _tf_keras_fit if tf_keras_model else _keras3_fit
    model, inputs, evaluate, own = build(job, initial_step, per_execution, stepwise)
    mode = job.progress
    meter = Throughput(job.data.global_batch_size, job.replicas)
    data = job.data
    # under parameter_server a step is one worker's batch (num_replicas_in_sync is 1): say how many workers share them
    spread = f"{job.cluster.num_workers} worker(s)" if job.parameter_server and job.cluster else f"{job.replicas} replica(s)"
    log.info(
        "training with Model.fit%s: %s x %d steps (%s), global batch %d over %s%s",
        "" if tf_keras_model else " (Keras 3)",
        epochs_text(job.train.epochs),
        data.steps_per_epoch,
        per_call.text(job.train.steps_per_execution, per_execution),
        data.global_batch_size,
        spread,
        accumulation_text(job.train) + xla.text(job, _whole_call_xla(job, stepwise), custom_loop=False),
    )

    from runner.executors.user_callbacks import build_callbacks

    callbacks_own = build_callbacks(job.executor.get("callbacks"), keras)  # checked before the first step
    started = time.perf_counter()
    with StopGuard(job) as guard:
        ours = _callbacks(job, meter, initial_step, guard, mode, evaluate, own, keras, per_execution, stepwise)
        callbacks = [*ours, *callbacks_own]
        calls = _fit_calls(initial_step, data.steps_per_epoch, job.train.epochs, inside_epoch=tf_keras_model)
        for initial_epoch, epochs, per_epoch, done in calls:
            x, y, kwargs = inputs(done)
            model.fit(
                x,
                y,
                epochs=epochs,
                initial_epoch=initial_epoch,
                steps_per_epoch=per_epoch,
                verbose=1 if mode == "bar" else 0,
                callbacks=callbacks,
                **kwargs,
            )
            if model.stop_training:  # early stopping
                break
        callbacks[0].lines.end()
    train_sec = (callbacks[0].ended or time.perf_counter()) - started
    training_ended(job)
    steps = callbacks[0].last_step or job.train.epochs * data.steps_per_epoch  # fewer when stopped early
    restore_best(job, job.restore_best)
    eval_metrics = evaluate()
    phases.mark("evaluation")
    summary = meter.summary(train_sec)
    job.reporter.log_metrics({**eval_metrics, **summary}, steps)
    loss = callbacks[0].loss  # the last epoch's mean loss; None when resumed after the last epoch
    loss = float("nan") if loss is None else loss
    return Result(steps, loss, eval_metrics, meter.overall().get(RUN_RATE), summary)
