"""Custom loop under ParameterServerStrategy: the coordinator schedules steps on the workers.

Each scheduled call runs train.steps_per_loop steps on one worker's own dataset (create_per_worker_dataset)
and returns the mean loss and the worker's index, so the coordinator can count the steps each worker ran.
The coordinator retries a step whose worker died; a worker that comes back rejoins.
"""

import collections
import time

from runner import stopping
from runner import phases
from runner.executors.base import Job, Result, Throughput, check_loss, log, progress_line, replica_metrics
from runner.executors.custom_loop import checkpoint_due, finish, make_evaluator, make_replica_step


def run_ps_loop(job: Job) -> Result:
    import tensorflow as tf
    import tf_keras

    from runner.builders.model import build_loss

    strategy, data = job.strategy, job.data
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        per_example_loss = build_loss(job.loss, tf_keras.losses.Reduction.NONE)
    replica_step = make_replica_step(job, per_example_loss)
    eval_update, eval_results = make_evaluator(job, per_example_loss)

    @tf.function
    def per_worker_dataset_fn():
        return strategy.distribute_datasets_from_function(data.dataset_fn)

    iterator = iter(coordinator.create_per_worker_dataset(per_worker_dataset_fn))

    @tf.function
    def worker_loop(iterator, num_steps):
        total = tf.constant(0.0)
        for _ in tf.range(num_steps):
            loss, _ = strategy.run(replica_step, args=(next(iterator),))
            total += strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None)
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        return total / tf.cast(num_steps, tf.float32), worker

    spe, epochs, every = data.steps_per_epoch, job.train.epochs, job.train.log_every_n_steps
    per_call = job.train.steps_per_loop
    meter = Throughput(data.global_batch_size, 1)
    step = last_saved = job.restore()
    per_worker = collections.Counter()
    log.info("training with a custom loop under parameter_server: %d epochs x %d steps (%d per scheduled call), "
             "batch %d per step, %d worker(s)", epochs, spe, per_call, data.global_batch_size, job.cluster.num_workers)
    meter.start()
    started = time.perf_counter()
    epoch_loss = float("nan")
    with stopping.StopGuard(job) as guard:  # no TF preemption handler under PS: it saves at the next join
        for epoch in range(step // spe, epochs):
            done = step - epoch * spe
            pending, loss_sum, counted, logged_at = [], 0.0, 0, done
            while done < spe:
                n = min(per_call, spe - done)
                pending.append((n, coordinator.schedule(worker_loop, args=(iterator, tf.constant(n)))))
                done, step = done + n, step + n
                due_log = done - logged_at >= every or done == spe
                due_ckpt = checkpoint_due(job, step, done == spe, last_saved)
                stop = stopping.requested()
                if due_log or due_ckpt or stop:
                    coordinator.join()  # every scheduled step has run: variables and losses are final
                    for k, remote in pending:
                        loss, worker = remote.fetch()
                        loss_sum, counted = loss_sum + float(loss) * k, counted + k
                        per_worker[int(worker)] += k
                    pending = []
                    epoch_loss = loss_sum / counted
                    check_loss(job, epoch_loss, step)
                    meter.tick(step)
                if due_log:
                    logged_at = done
                    rates = meter.window()
                    steps_by_worker = {f"steps/worker_{w}": c for w, c in sorted(per_worker.items())}
                    job.reporter.log_metrics({"loss": epoch_loss, **replica_metrics([epoch_loss]), **rates, **steps_by_worker}, step)
                    log.info(progress_line(epoch + 1, epochs, done, spe, epoch_loss, rates) +
                             " | steps per worker " + ", ".join(f"{w}:{c}" for w, c in sorted(per_worker.items())))
                if due_ckpt:
                    job.checkpoints.save(step)
                    last_saved = step
                if stop:
                    guard.check(step)
    coordinator.join()
    train_sec = time.perf_counter() - started
    phases.mark("train")

    def evaluate():  # on the coordinator, with the variables from the ps tasks
        for batch in data.eval_dataset():
            eval_update(batch)
        return eval_results()

    return finish(job, meter, step, epoch_loss, train_sec, evaluate)
