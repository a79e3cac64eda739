"""The guide's custom training loop: GradientTape, strategy.run, compute_average_loss, strategy.reduce.

train.steps_per_loop steps run inside one tf.function call (a tf.range loop over the distributed iterator),
which cuts host overhead the way Orbit's loop_fns do. Under parameter_server the same step function is
scheduled on the workers through a ClusterCoordinator (runner/executors/ps_loop.py).
"""

import sys
import time

from runner import phases, teardown
from runner.executors.base import Job, Result, Throughput, check_loss, concrete_per_iterator, log, progress_line, replica_metrics
from runner.stopping import StopGuard


def shard_accumulator(job: Job):
    """(add, scale, with_shard): add(step output, total, shards) -> (total, shards) sums the step's loss and each
    replica's shard loss, the cheapest way for the layout; shards * scale is their sum of shard mean losses;
    with_shard: the replicas return their shard's mean loss too (make_replica_step).

    - One replica, no regularization: the loss is the shard's loss.
    - One worker: every replica's share of the loss, stacked on the host where strategy.reduce would add them
      up. Their sum is the step's loss and, with even shards and no regularization, each times the replicas is
      its shard's mean loss: no op on the replicas beyond the guide's step. (A sync-on-read write in each
      replica's step cost 1-4% of a 1.5 ms central_storage step in benchmarks/paired.py; a gather ~8%.)
      Otherwise each replica also returns its shard's mean loss, stacked the same way.
    - Several workers: gathered across workers in every step (the chief needs the other workers' losses).

    Chosen here, outside the tf.function, and not converted by AutoGraph (plain TensorFlow ops, no tensor-
    dependent Python): converting these branches inside the loop cost ~50 ms of tracing per run.
    """
    import tensorflow as tf

    strategy = job.strategy
    replicas, local = strategy.num_replicas_in_sync, strategy.experimental_local_results
    total_of = lambda loss: strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None)  # noqa: E731
    if replicas == 1 and not job.model.losses:
        def add(loss, total, shards):
            loss = total_of(loss)
            return total + loss, shards + loss
        scale, with_shard = 1.0, False
    elif not job.multi_worker and not job.model.losses and job.data.global_batch_size % replicas == 0:
        def add(share, total, shards):
            parts = tf.stack(local(share))
            return total + tf.reduce_sum(parts), shards + parts
        scale, with_shard = float(replicas), False
    elif job.multi_worker:
        def add(out, total, shards):
            return total + total_of(out[0]), shards + strategy.gather(out[1], axis=0)
        scale, with_shard = 1.0, True
    else:
        def add(out, total, shards):
            return total + tf.reduce_sum(tf.stack(local(out[0]))), shards + tf.concat(local(out[1]), axis=0)
        scale, with_shard = 1.0, True
    return tf.autograph.experimental.do_not_convert(add), scale, with_shard


def make_replica_step(job: Job, per_example_loss, with_shard: bool = True):
    """One replica's training step; returns its share of the global loss, and (with_shard) its shard's mean loss."""
    import tensorflow as tf

    import tf_keras

    model, optimizer, gbs = job.model, job.optimizer, job.data.global_batch_size
    scaled = isinstance(optimizer, tf_keras.mixed_precision.LossScaleOptimizer)

    # The layout and precision choices live in these helpers, which AutoGraph leaves alone (plain TensorFlow,
    # no tensor-dependent Python): converting their branches inside the step cost ~30 ms of tracing per run.
    # The step itself stays converted, so a user's model with tensor-dependent Python still gets AutoGraph.
    @tf.autograph.experimental.do_not_convert
    def step_loss(losses):
        """(loss, what to differentiate)."""
        # Gradients are summed across replicas: divide by the global batch, not the replica's.
        loss = tf.nn.compute_average_loss(losses, global_batch_size=gbs)
        if model.losses:
            loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
        # mixed precision: scale the loss up (on the tape) so float16 gradients do not underflow
        return loss, optimizer.get_scaled_loss(loss) if scaled else loss

    @tf.autograph.experimental.do_not_convert
    def apply(tape, target, loss, losses):
        grads = tape.gradient(target, model.trainable_variables)
        if scaled:
            grads = optimizer.get_unscaled_gradients(grads)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return (loss, tf.reshape(tf.reduce_mean(losses), [1])) if with_shard else loss

    def replica_step(inputs):
        x, y = inputs[0], inputs[1]
        with tf.GradientTape() as tape:
            losses = per_example_loss(y, model(x, training=True))
            loss, target = step_loss(losses)
        return apply(tape, target, loss, losses)

    return replica_step


def make_evaluator(job: Job, per_example_loss):
    """(update(batch) to run per replica, results() -> {'eval/loss': ..., 'eval/accuracy': ...})."""
    import tf_keras

    from runner.builders.model import build_metrics

    with job.strategy.scope():
        mean_loss = tf_keras.metrics.Mean(name="loss")
        metrics = build_metrics(job.loss)

    def update(inputs):
        x, y = inputs[0], inputs[1]
        logits = job.model(x, training=False)
        mean_loss.update_state(per_example_loss(y, logits))
        for metric in metrics:
            metric.update_state(y, logits)

    def results():
        return {f"eval/{m.name}": float(m.result()) for m in [mean_loss, *metrics]}

    return update, results


class Progress:
    """A Keras progress bar on a terminal (executor.verbose=1, or auto on a TTY); otherwise one log line
    every train.log_every_n_steps steps."""

    def __init__(self, job: Job, steps_per_epoch: int, epochs: int):
        verbose = job.executor.verbose
        self.bar_mode = (sys.stdout.isatty() if verbose == "auto" else int(verbose) == 1)
        self.quiet = str(verbose) == "0"
        self.spe, self.epochs, self.bar = steps_per_epoch, epochs, None

    def epoch(self, epoch: int) -> None:
        if self.bar_mode:
            import tf_keras

            print(f"Epoch {epoch + 1}/{self.epochs}")
            self.bar = tf_keras.utils.Progbar(self.spe, stateful_metrics=["loss"])

    def update(self, done: int, loss: float) -> None:
        if self.bar is not None:
            self.bar.update(done, values=[("loss", loss)])

    def line(self, epoch: int, done: int, loss: float, rates) -> None:
        if not self.bar_mode and not self.quiet:
            log.info(progress_line(epoch + 1, self.epochs, done, self.spe, loss, rates))


def finish(job: Job, meter: Throughput, step: int, epoch_loss: float, train_sec: float, evaluate) -> Result:
    """Evaluate (evaluate() -> {'eval/...': value}), report the eval and whole-run figures, build the Result."""
    started = time.perf_counter()
    results = evaluate()
    phases.mark("evaluation")
    log.info("evaluation: %s (%.1fs)", ", ".join(f"{k}={v:.4f}" for k, v in results.items()), time.perf_counter() - started)
    summary = meter.summary(train_sec)
    job.reporter.log_metrics({**results, **summary}, step)
    return Result(step, epoch_loss, results, meter.overall().get("throughput/examples_per_sec"), summary)


def checkpoint_due(job: Job, step: int, epoch_end: bool, last_saved: int) -> bool:
    if not job.checkpoints:
        return False
    if job.checkpoint_every:
        return step - last_saved >= job.checkpoint_every or (epoch_end and step == job.train.epochs * job.data.steps_per_epoch)
    return epoch_end


def run_custom_loop(job: Job) -> Result:
    if job.parameter_server:
        from runner.executors.ps_loop import run_ps_loop

        return run_ps_loop(job)
    import tensorflow as tf
    import tf_keras

    from runner.builders.model import build_loss

    strategy, data = job.strategy, job.data
    with strategy.scope():
        per_example_loss = build_loss(job.loss, tf_keras.losses.Reduction.NONE)
    replicas = strategy.num_replicas_in_sync
    add, scale, with_shard = shard_accumulator(job)
    replica_step = make_replica_step(job, per_example_loss, with_shard=with_shard)
    eval_update, eval_results = make_evaluator(job, per_example_loss)

    @tf.function
    def train_loop(iterator, num_steps):
        """(mean loss, mean shard loss per replica) over num_steps steps."""
        total, shards = tf.constant(0.0), tf.zeros([replicas])
        for _ in tf.range(num_steps):
            total, shards = add(strategy.run(replica_step, args=(next(iterator),)), total, shards)
        count = tf.cast(num_steps, tf.float32)
        return total / count, shards * scale / count

    run_loop = concrete_per_iterator(train_loop)

    @tf.function
    def eval_step(inputs):
        strategy.run(eval_update, args=(inputs,))

    spe, epochs, every = data.steps_per_epoch, job.train.epochs, job.train.log_every_n_steps
    per_call = job.train.steps_per_loop
    meter = Throughput(data.global_batch_size, job.replicas)
    progress = Progress(job, spe, epochs)
    step = last_saved = job.restore()
    log.info("training with a custom loop: %d epochs x %d steps (%d per tf.function call), global batch %d over %d replica(s)",
             epochs, spe, per_call, data.global_batch_size, job.replicas)
    meter.start()
    started = time.perf_counter()
    iterator = iter(data.distributed_train(strategy))
    steps = {}  # tf.constant per loop length, made once
    epoch_loss = float("nan")
    with StopGuard(job) as guard:
        for epoch in range(step // spe, epochs):
            done = step - epoch * spe
            loss_sum, counted, logged_at = 0.0, 0, done
            progress.epoch(epoch)
            while done < spe:
                n = min(per_call, spe - done, max(1, job.checkpoint_every or spe))
                log_now = done + n - logged_at >= every or done + n == spe
                if n not in steps:
                    steps[n] = tf.constant(n)
                loss, shards = run_loop(iterator, steps[n])  # tensor arguments only: the cheapest call
                done, step, counted = done + n, step + n, counted + n
                loss = float(loss)
                check_loss(job, loss, step)
                loss_sum += loss * n
                meter.tick(step)
                epoch_loss = loss_sum / counted
                progress.update(done, epoch_loss)
                if log_now:
                    logged_at = done
                    rates = meter.window()
                    job.reporter.log_metrics({"loss": epoch_loss, **replica_metrics(shards.numpy()), **rates}, step)
                    progress.line(epoch, done, epoch_loss, rates)
                if checkpoint_due(job, step, done == spe, last_saved):
                    job.checkpoints.save(step)
                    last_saved = step
                guard.check(step)
    train_sec = time.perf_counter() - started
    phases.mark("train")

    def evaluate():
        for batch in teardown.keep(iter(data.distributed_eval(strategy))):
            eval_step(batch)
        return eval_results()

    return finish(job, meter, step, epoch_loss, train_sec, evaluate)
