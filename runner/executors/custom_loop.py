"""The guide's custom training loop in this process: GradientTape, strategy.run, compute_average_loss,
strategy.reduce.

This module supplies only the inner loop (InProcessTrainer): train.steps_per_loop steps run inside one
tf.function call (a tf.range loop over the distributed iterator), which cuts host overhead the way Orbit's
loop_fns do. Epochs, logging, checkpoints and stop requests are runner.executors.loop's; under
parameter_server the coordinator's inner loop is runner.executors.ps_loop.
"""

from runner.builders.metrics import build_own, per_replica, reset, results
from runner.control import teardown
from runner.executors import loop, per_call, resident, xla
from runner.executors.base import Job, Result, accumulation_text, concrete_per_iterator, epochs_text, replica_metrics
from runner.executors.evaluation import make_evaluator
from runner.executors.replica_losses import WorkerTable
from runner.executors.replica_step import make_replica_step


def step_losses(job: Job):
    """(losses, scale, with_shard): losses(step output) -> (the step's loss, each replica's shard loss), the
    cheapest way for the layout; shard * scale is the shard's mean loss; with_shard: the replicas return their
    shard's mean loss too (make_replica_step).

    - One replica, no regularization: the loss is the shard's loss.
    - One worker: every replica's share of the loss, stacked on the host where strategy.reduce would add them
      up. Their sum is the step's loss and, with even shards and no regularization, each times the replicas is
      its shard's mean loss: no op on the replicas beyond the guide's step (a sync-on-read write or a gather in
      each replica's step measurably slowed it). Otherwise each replica also returns its shard's mean loss,
      stacked the same way.
    - Several workers: each replica returns its shard's mean loss too, and the steps' values cross workers once a
      call (losses is None: worker_table_loop), not in every step.

    Chosen here, outside the tf.function, and not converted by AutoGraph (plain TensorFlow ops, no tensor-
    dependent Python): converting these branches inside the loop made tracing measurably slower.
    """
    import tensorflow as tf

    strategy = job.strategy
    replicas, local = strategy.num_replicas_in_sync, strategy.experimental_local_results
    total_of = lambda loss: strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None)  # noqa: E731
    if replicas == 1 and not job.model.losses:

        def losses(loss):
            loss = total_of(loss)
            return loss, tf.reshape(loss, [1])

        scale, with_shard = 1.0, False
    elif not job.multi_worker and not job.model.losses and job.data.global_batch_size % replicas == 0:

        def losses(share):
            parts = tf.stack(local(share))
            return tf.reduce_sum(parts), parts

        scale, with_shard = float(replicas), False
    elif job.multi_worker:
        return None, 1.0, True
    else:

        def losses(out):
            return tf.reduce_sum(tf.stack(local(out[0]))), tf.concat(local(out[1]), axis=0)

        scale, with_shard = 1.0, True
    return tf.autograph.experimental.do_not_convert(losses), scale, with_shard


def worker_table_loop(job: Job, replica_step, take, most_steps: int):
    """The training loop of several workers: (each step's loss, its shard losses, steps x replicas), as the one
    worker's loop returns them, with one collective a call instead of a reduce and a gather in every step (a step's
    collectives cost more than the model's math on a small model). Each replica writes its step's (share of the loss,
    shard loss) into its own column of a sync-on-read table (its local copy: no collective); reading the table after
    the call sums the copies across workers, which holds every replica's column (replica_losses.WorkerTable)."""
    import tensorflow as tf

    strategy = job.strategy
    with strategy.scope():
        table = WorkerTable(strategy, most_steps, width=2)

    @tf.autograph.experimental.do_not_convert
    def record(inputs, i):
        share, shard = replica_step(inputs)
        table.write(i, tf.stack([tf.cast(share, tf.float32), tf.reshape(tf.cast(shard, tf.float32), [])]))

    @tf.function
    def train_loop(iterator, num_steps):
        for i in tf.range(num_steps):
            strategy.run(record, args=(take(iterator), i))
        rows = table.read(num_steps)
        return tf.reduce_sum(rows[:, :, 0], axis=1), rows[:, :, 1]

    return train_loop


class ShardWindow:
    """Each replica's shard losses of the steps since the last logged step, on the host: their mean is logged as
    loss/replica_<i>. A call hands back every step's; a logged step inside it takes those up to it."""

    def __init__(self):
        self.rows, self.at = None, 0  # the last call's steps x replicas, and how many of them are taken
        self.sum, self.count = 0.0, 0

    def call(self, rows) -> None:
        if self.rows is not None:
            self._add(self.rows[self.at :])
        self.rows, self.at = rows, 0

    def _add(self, rows) -> None:
        if len(rows):
            self.sum, self.count = self.sum + rows.sum(axis=0), self.count + len(rows)

    def take(self, upto: int):
        """The mean over the window that ends after the call's first `upto` steps."""
        self._add(self.rows[self.at : upto])
        self.at = upto
        mean = self.sum / max(1, self.count)
        self.sum, self.count = 0.0, 0
        return mean


class InProcessTrainer(loop.Trainer):
    """Runs N steps per call of one tf.function on this process's replicas, and waits for each call: its loss is
    checked, and under MultiWorkerMirroredStrategy every worker polls the preemption handler at the same steps."""

    def __init__(self, job: Job):
        import tensorflow as tf

        from runner.builders.loss import PER_EXAMPLE, build_loss

        strategy, data = job.strategy, job.data
        self.job, self.tf = job, tf
        with strategy.scope():
            per_example_loss = build_loss(job.loss, PER_EXAMPLE, job.keras)
            self.metrics = build_own(job.metrics)  # train.metrics on the training batches
        replicas = strategy.num_replicas_in_sync
        losses_of, scale, with_shard = step_losses(job)
        # train.jit_compile with in-memory data on one replica: the whole call is compiled, the row gather and the
        # loop around the steps included (each step compiled alone pays XLA's launch in every step)
        self.xla_call = bool(job.train.get("jit_compile")) and losses_of is not None and resident.usable(job)
        replica_step = make_replica_step(
            job, per_example_loss, with_shard=with_shard, metrics=self.metrics, jit=False if self.xla_call else None
        )
        eval_update, self.eval_results = make_evaluator(job, per_example_loss)
        # every step's losses come back with the call: logged steps need not end one, unless train.metrics' results are
        # logged (read at the end of a call)
        self.logs_inside = not self.metrics
        n = per_call.of(job, job.train.steps_per_loop, logs_inside=self.logs_inside)
        if self.xla_call:  # the call's row indices are handed over at once: no more than a block's
            n = resident.block_steps(n, data.global_batch_size)
        self.steps_per_call = min(n, max(1, job.checkpoint_every or data.steps_per_epoch))
        self.resident = None
        if resident.usable(job):  # in-memory data: each step gathers its own rows (runner.executors.resident)
            kind = resident.Calls if self.xla_call else resident.Blocks
            self.resident = kind(data, resident.block_steps(self.steps_per_call, data.global_batch_size))
        take = next if self.resident is None else self.resident.take

        @tf.function
        def one_worker_loop(iterator, num_steps):
            """Each of num_steps steps' loss, and its shard losses (steps x replicas)."""
            steps = tf.TensorArray(tf.float32, size=num_steps)
            shards = tf.TensorArray(tf.float32, size=num_steps, element_shape=[replicas])
            for i in tf.range(num_steps):
                loss, shard = losses_of(strategy.run(replica_step, args=(take(iterator),)))
                steps, shards = steps.write(i, loss), shards.write(i, shard)
            return steps.stack(), shards.stack() * scale

        @tf.function(jit_compile=True)
        def xla_loop(rows, num_steps):
            """one_worker_loop under XLA, on the call's row batches instead of an iterator. `rows` always holds
            steps_per_call batches, of which the first num_steps are trained on: one shape, compiled once, however
            long the call (the results past num_steps are not read)."""
            steps = tf.TensorArray(tf.float32, size=self.steps_per_call)
            shards = tf.TensorArray(tf.float32, size=self.steps_per_call, element_shape=[replicas])

            def body(i, steps, shards):
                loss, shard = losses_of(strategy.run(replica_step, args=(self.resident.gather(rows[i]),)))
                return i + 1, steps.write(i, loss), shards.write(i, shard)

            # a bound XLA reads at run time: tf.range(num_steps) made num_steps a compile-time constant, and a
            # call of another length compiled anew
            _, steps, shards = tf.while_loop(
                lambda i, *_: i < num_steps, body, (0, steps, shards), maximum_iterations=self.steps_per_call
            )
            return steps.stack(), shards.stack() * scale

        @tf.function
        def eval_step(inputs):
            strategy.run(eval_update, args=(inputs,))

        loop = one_worker_loop if losses_of else worker_table_loop(job, replica_step, take, self.steps_per_call)
        self.run_loop, self.eval_step = concrete_per_iterator(loop), eval_step
        self.xla_loop = xla_loop
        self.replicas, self.progress = job.replicas, job.progress
        self.description = (
            f"training with a custom loop: {epochs_text(job.train.epochs)} x {data.steps_per_epoch} steps "
            f"({per_call.text(job.train.steps_per_loop, n)}), global batch {data.global_batch_size} over "
            f"{job.replicas} replica(s){accumulation_text(job.train)}{xla.text(job, self.xla_call, custom_loop=True)}"
        )
        self.steps = {}  # tf.constant per call length, made once
        self.out = None
        self.window = ShardWindow()

    def begin(self, step: int) -> None:
        if self.xla_call:
            self.resident.begin(step)
        elif self.resident is not None:
            self.iterator = self.resident.iterator(step)
        else:
            self.iterator = iter(self.job.data.distributed_train(self.job.strategy, step))

    def train(self, num_steps: int) -> None:
        if num_steps not in self.steps:
            self.steps[num_steps] = self.tf.constant(num_steps)
        if self.xla_call:
            rows = self.resident.take(num_steps)
            if num_steps < self.steps_per_call:
                rows = self.tf.pad(rows, [[0, self.steps_per_call - num_steps], [0, 0]])
            self.out = num_steps, self.xla_loop(rows, self.steps[num_steps])
            return
        self.out = num_steps, self.run_loop(self.iterator, self.steps[num_steps])  # tensor arguments only: the cheapest call

    def sync(self):
        n, (losses, shards) = self.out
        self.window.call(shards.numpy()[:n])
        return [(1, loss) for loss in losses.numpy()[:n].tolist()]

    def epoch_begin(self) -> None:
        reset(self.metrics)
        self.window = ShardWindow()  # an epoch's start, or a recovery's checkpoint: no step before it counts

    def report(self, loss: float, upto: int | None = None):
        found = replica_metrics(self.window.take(self.out[0] if upto is None else upto))
        if self.metrics:  # every worker reads them at the same steps (under multi-worker, a collective each)
            found.update(results(self.metrics))
            if not self.job.multi_worker:
                found.update(per_replica(self.job.strategy, self.metrics))
        return found, ""

    def evaluate(self):
        for batch in teardown.keep(iter(self.job.data.distributed_eval(self.job.strategy))):
            self.eval_step(batch)
        return self.eval_results()


def run_custom_loop(job: Job) -> Result:
    return loop.run(job, InProcessTrainer(job))
