"""In-memory training data kept as tensors, each step's batch gathered inside the training step.

The tf.data pipeline of in-memory data (runner.builders.data.pipeline) gathers each batch inside tf.data and hands
it over through an iterator, a large share of a small model's step. Here the iterator yields only the row indices
(the same index stream: the same batches in the same order, and a resume skips the same steps), and the step
gathers its rows from the arrays, which stay tensors in memory. The custom loop goes further: its iterator yields
a call's worth of row batches at once, held in a variable that the steps read in turn, so that most steps read no
iterator at all. Under train.jit_compile the custom loop compiles its whole call with XLA, which cannot read an
iterator: the call's row batches are sliced on the host and handed to it as one tensor (Calls). Used where one
process trains one replica on the tf_data input path; elsewhere the strategy distributes the dataset as before.
"""

from runner.builders.data.pipeline import Data, Input, finish


def usable(job) -> bool:
    """In memory (not streamed from files), on the tf_data input path, one process training one replica. Under
    MirroredStrategy over 2 logical CPUs the gather in each replica's step measured slower than tf.data's, which
    runs beside the replicas (docs/dev/benchmarks.md)."""
    data = job.data
    return (
        type(data) is Data  # in memory, not streamed from files
        and data.input == Input.tf_data
        and job.strategy.num_replicas_in_sync == 1
        and not job.multi_worker
        and not job.parameter_server
    )


BLOCK_BYTES = 8 << 20  # the most row indices one block holds: a call of 100,000 steps must not hold them all


def block_steps(steps_per_call: int, global_batch_size: int) -> int:
    """The steps of one block: a call's, unless their row indices (int64) would exceed BLOCK_BYTES."""
    return max(1, min(steps_per_call, BLOCK_BYTES // (8 * global_batch_size)))


class Resident:
    def __init__(self, data: Data):
        import tensorflow as tf

        self.tf, self.data = tf, data
        self.x, self.y = tf.constant(data.arrays.x_train), tf.constant(data.arrays.y_train)

    def rows(self, done_steps: int, block: int | None = None):
        """The training row batches from step `done_steps` on, each step's alone or `block` steps' at a time."""
        data = self.data
        ds = data.row_batches(len(data.arrays.x_train), data.global_batch_size, train=True).skip(done_steps)
        return finish(ds if block is None else ds.batch(block), data.prefetch, "OFF")

    def gather(self, rows):
        return self.tf.gather(self.x, rows), self.tf.gather(self.y, rows)


class Blocks(Resident):
    """The custom loop's: `iterator(done_steps)` starts the block iterator; `take(iterator)`, inside the
    tf.function instead of `next(iterator)`, returns the next step's (x, y)."""

    def __init__(self, data: Data, block: int):
        super().__init__(data)
        tf = self.tf
        self.block = block
        self.held = tf.Variable(tf.zeros([block, data.global_batch_size], tf.int64), trainable=False)
        self.at = tf.Variable(block, trainable=False)  # the next step's row batch in `held`; block: none left
        self.take = tf.autograph.experimental.do_not_convert(self._take)
        self.take_rows = tf.autograph.experimental.do_not_convert(self._take_rows)

    def iterator(self, done_steps: int):
        self.at.assign(self.block)
        return iter(self.rows(done_steps, self.block))

    def _take(self, iterator):
        return self.gather(self._take_rows(iterator))

    def _take_rows(self, iterator):
        """The next step's row batch, ungathered (fit's XLA call gathers inside the compiled part)."""
        tf = self.tf

        def refill():
            self.held.assign(next(iterator))
            return tf.constant(0)

        at = tf.cond(self.at >= self.block, refill, self.at.read_value)
        self.at.assign(at + 1)
        return self.held[at]


class Calls(Resident):
    """The custom loop's under XLA: `begin(done_steps)` starts the block iterator; `take(n)`, on the host before a
    call, returns the call's n row batches as one tensor [n, batch], read from blocks of `block` steps."""

    def __init__(self, data: Data, block: int):
        super().__init__(data)
        self.block = block
        self.held, self.at, self.blocks = None, 0, None

    def begin(self, done_steps: int) -> None:
        self.blocks = iter(self.rows(done_steps, self.block))
        self.held, self.at = None, 0

    def take(self, n: int):
        tf = self.tf
        left = 0 if self.held is None else int(self.held.shape[0]) - self.at
        if left < n:
            parts = [self.held[self.at :]] if left else []
            while left < n:
                parts.append(next(self.blocks))
                left += int(parts[-1].shape[0])
            self.held, self.at = (tf.concat(parts, 0) if len(parts) > 1 else parts[0]), 0
        rows = self.held[self.at : self.at + n]
        self.at += n
        return rows
