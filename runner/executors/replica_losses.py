"""Per-replica values without a collective in every step. ShardLosses: loss/replica_<i> for Model.fit on one worker
with several replicas where a call ends at each logged step, each replica keeping its last shard loss on its own
device. WorkerTable: each step's values of every replica, summed across replicas and workers once a call (the custom
loop over several workers; fit over several replicas, with its metrics' sums).

The step writes one scalar per replica, locally, with no cross-device op; the host reads the copies only when
metrics are logged. (An all-gather in every step made MirroredStrategy's step much slower: docs/dev/benchmarks.md. The
custom loop needs none of this: it stacks the replicas' shares of the loss on the host instead.)
"""


class ShardLosses:
    """Make it outside strategy.scope(); write(value) in replica context, read() on the host."""

    def __init__(self, strategy):
        import tensorflow as tf

        if tf.distribute.has_strategy():
            raise RuntimeError("ShardLosses must be made outside strategy.scope()")
        self.strategy = strategy
        with strategy.scope():
            synced = tf.Variable(
                0.0,
                trainable=False,
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.MEAN,
                name="shard_loss",
            )
        if len(strategy.experimental_local_results(synced)) == strategy.num_replicas_in_sync:
            # Mirrored, multi-worker mirrored and TPU strategies: one copy per replica, written locally.
            self.synced, self.copies = synced, None
        else:
            # CentralStorageStrategy makes an ON_READ variable one variable on the parameter device: each write
            # would average all replicas (a merge in every step) and keep only that mean. One plain variable per
            # compute device instead (made outside the scope, so the strategy does not take it over).
            self.synced = None
            self.copies = []
            for i, device in enumerate(strategy.extended.worker_devices):
                with tf.device(device):
                    self.copies.append(tf.Variable(0.0, trainable=False, name=f"shard_loss_{i}"))

    def write(self, value) -> None:
        """In replica context: this replica's shard loss (a float32 scalar)."""
        if self.synced is not None:
            self.synced.assign(value)
            return
        import tensorflow as tf

        # a constant in each replica's trace (mirrored_run traces the step once per device)
        replica = tf.get_static_value(tf.distribute.get_replica_context().replica_id_in_sync_group)
        self.copies[int(replica)].assign(value)

    def read(self) -> list[float]:
        """Every replica's last written shard loss, in replica order."""
        held = self.copies if self.synced is None else self.strategy.experimental_local_results(self.synced)
        return [float(v.numpy()) for v in held]


class WorkerTable:
    """Each step's values of every replica, crossing replicas and workers once a call instead of in every step.
    Each replica writes its row into its own column of a sync-on-read table (its local copy: no collective); reading
    it after the call sums the copies, which then holds every replica's column. Not under CentralStorageStrategy (one
    variable for all replicas there). Made in strategy.scope(); write(i, values) in replica context, read(n) in the
    call's cross-replica part."""

    def __init__(self, strategy, steps: int, width: int = 1):
        import tensorflow as tf

        self.tf = tf
        shape = [steps, strategy.num_replicas_in_sync] + ([width] if width > 1 else [])
        self.table = tf.Variable(
            tf.zeros(shape),
            trainable=False,
            synchronization=tf.VariableSynchronization.ON_READ,
            aggregation=tf.VariableAggregation.SUM,
        )

    def write(self, i, values):
        """Step i's values of this replica (a scalar, or `width` of them), into this replica's own copy: the write."""
        tf, table = self.tf, self.table
        at = [[i, tf.distribute.get_replica_context().replica_id_in_sync_group]]
        return table.assign(tf.tensor_scatter_nd_update(table.read_value(), at, [tf.cast(values, tf.float32)]))

    def read(self, n):
        """The first n steps' rows, every replica's (steps x replicas [x width]): one collective."""
        return self.table.read_value()[:n]
