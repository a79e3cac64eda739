"""Training loops compared inside one process: the guide's, and the runner's ways of keeping loss/replica_<i>.

    python -m benchmarks.paired --strategy central_storage --rounds 16

Separate processes on this VM differ by 5-8% from run to run (docs/dev/benchmarks.md), which hides a 2% cost.
Here every loop trains the same model on the same data in one process. Each is timed in chunks of calls,
alternating, with the order rotated each round, and each round's time is divided by the guide's in the same
round. Prints the median time per call and the median of those paired ratios.
"""

import argparse
import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.paired")
    p.add_argument("--strategy", default="central_storage", choices=["mirrored", "central_storage"])
    p.add_argument("--logical-cpus", type=int, default=4)
    p.add_argument("--global-batch", type=int, default=256)
    p.add_argument("--rounds", type=int, default=16)
    p.add_argument("--calls", type=int, default=200, help="calls per chunk (one step each)")
    args = p.parse_args(argv)

    import numpy as np
    import tensorflow as tf
    import tf_keras as keras

    from benchmarks.handwritten import make_strategy, setup_devices
    from benchmarks.interleaved import print_table, time_in_chunks
    from runner.executors.base import concrete_per_iterator
    from runner.executors.replica_losses import ShardLosses

    setup_devices(args.logical_cpus)
    strategy = make_strategy(args.strategy, args.logical_cpus)
    replicas, gbs = strategy.num_replicas_in_sync, args.global_batch
    shard_losses = ShardLosses(strategy)  # fit's way: each replica writes its own copy
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4096, 20)).astype(np.float32)
    y = np.argmax(x @ rng.standard_normal((20, 4)), axis=1).astype(np.int32)
    dataset = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .shuffle(4096, seed=0)
        .repeat()
        .batch(gbs, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.layers.Input(shape=(20,)),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(4),
            ]
        )
        optimizer = keras.optimizers.SGD(learning_rate=0.05)
        per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=keras.losses.Reduction.NONE)

    def step(inputs, write=False):
        features, labels = inputs
        with tf.GradientTape() as tape:
            losses = per_example(labels, model(features, training=True))
            loss = tf.nn.compute_average_loss(losses, global_batch_size=gbs)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        if write:
            shard_losses.write(tf.reduce_mean(losses))
        return loss

    @tf.function
    def guide(iterator, n):  # benchmarks/handwritten.py's loop
        total = tf.constant(0.0)
        for _ in tf.range(n):
            total += strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step, args=(next(iterator),)), axis=None)
        return total / tf.cast(n, tf.float32)

    @tf.function
    def stacked(iterator, n):  # runner/executors/custom_loop.py: the replicas' shares stacked on the host
        total, shards = tf.constant(0.0), tf.zeros([replicas])
        for _ in tf.range(n):
            parts = tf.stack(strategy.experimental_local_results(strategy.run(step, args=(next(iterator),))))
            total += tf.reduce_sum(parts)
            shards += parts
        count = tf.cast(n, tf.float32)
        return total / count, shards * float(replicas) / count

    @tf.function
    def written(iterator, n):  # runner/executors/fit.py's ShardLosses, in the guide's loop
        total = tf.constant(0.0)
        for _ in tf.range(n):
            total += strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step, args=(next(iterator), True)), axis=None)
        return total / tf.cast(n, tf.float32)

    one = tf.constant(1)
    calls = {}
    for name, fn in [("guide", guide), ("stacked", stacked), ("written", written)]:
        iterator = iter(strategy.experimental_distribute_dataset(dataset))
        # the runner's way of calling a loop, for every loop: what differs is the graph
        calls[name] = lambda c=concrete_per_iterator(fn), it=iterator: float(tf.nest.flatten(c(it, one))[0])
    times = time_in_chunks(calls, args.rounds, args.calls, warmup=50)
    print(f"{args.strategy}, {replicas} replicas, global batch {gbs}: {args.rounds} rounds of {args.calls} calls per loop")
    print_table("loop", times, "guide", "the guide's")


if __name__ == "__main__":
    main()
