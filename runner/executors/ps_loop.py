"""The custom loop under ParameterServerStrategy: the coordinator's inner loop schedules steps on the workers.

Each scheduled call runs train.steps_per_loop steps on one worker's own dataset (create_per_worker_dataset)
and returns the mean loss and the worker's index, so the coordinator can count the steps each worker ran.
The coordinator retries a step whose worker died; a worker that comes back rejoins. Calls are not waited for
one by one: runner.executors.loop syncs (joins) only to log, checkpoint or stop, and there the variables are
final. TensorFlow's preemption handler does not support parameter_server: the coordinator saves at that join.
"""

import collections

from runner.builders.metrics import build_own, reset, results
from runner.executors import loop, per_call
from runner.executors.base import Job, Result, accumulation_text, epochs_text, replica_metrics
from runner.executors.evaluation import evaluate_on_coordinator, make_evaluator
from runner.executors.replica_step import make_replica_step


class CoordinatorTrainer(loop.Trainer):
    progress = "lines"  # the coordinator logs lines, with the steps each worker ran
    sync_every_call = False

    def __init__(self, job: Job):
        import tensorflow as tf
        import tf_keras

        from runner.builders.loss import build_loss

        strategy, data = job.strategy, job.data
        self.job, self.tf = job, tf
        self.coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
        with strategy.scope():
            per_example_loss = build_loss(job.loss, tf_keras.losses.Reduction.NONE)
            self.metrics = build_own(job.metrics)  # train.metrics, their variables on the ps tasks
        replica_step = make_replica_step(job, per_example_loss, metrics=self.metrics)
        self.evaluator = make_evaluator(job, per_example_loss)

        @tf.function
        def per_worker_dataset_fn():
            return strategy.distribute_datasets_from_function(data.dataset_fn)

        self.iterator = iter(self.coordinator.create_per_worker_dataset(per_worker_dataset_fn))

        @tf.function
        def worker_loop(iterator, num_steps):
            total = tf.constant(0.0)
            for _ in tf.range(num_steps):
                loss, _ = strategy.run(replica_step, args=(next(iterator),))
                total += strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None)
            worker = tf.distribute.coordinator.experimental_get_current_worker_index()
            return total / tf.cast(num_steps, tf.float32), worker

        self.worker_loop = worker_loop
        self.steps_per_call = per_call.of(job, job.train.steps_per_loop)
        self.description = (
            f"training with a custom loop under parameter_server: {epochs_text(job.train.epochs)} x "
            f"{data.steps_per_epoch} steps ({self.steps_per_call} per scheduled call), batch "
            f"{data.global_batch_size} per step, {job.cluster.num_workers} worker(s){accumulation_text(job.train)}"
        )
        self.pending, self.per_worker = [], collections.Counter()

    def train(self, num_steps: int) -> None:
        remote = self.coordinator.schedule(self.worker_loop, args=(self.iterator, self.tf.constant(num_steps)))
        self.pending.append((num_steps, remote))

    def sync(self):
        self.coordinator.join()  # every scheduled step has run: variables and losses are final
        done = []
        for k, remote in self.pending:
            loss, worker = remote.fetch()
            done.append((k, float(loss)))
            self.per_worker[int(worker)] += k
        self.pending = []
        return done

    def epoch_begin(self) -> None:
        reset(self.metrics)

    def report(self, loss: float, upto=None):
        by_worker = sorted(self.per_worker.items())
        metrics = {**replica_metrics([loss]), **{f"steps/worker_{w}": c for w, c in by_worker}, **results(self.metrics)}
        return metrics, " | steps per worker " + ", ".join(f"{w}:{c}" for w, c in by_worker)

    def end(self) -> None:
        self.coordinator.join()

    def evaluate(self):  # on the coordinator, with the variables from the ps tasks
        return evaluate_on_coordinator(self.job, self.evaluator)


def run_ps_loop(job: Job) -> Result:
    return loop.run(job, CoordinatorTrainer(job))
