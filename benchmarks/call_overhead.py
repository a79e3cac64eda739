"""What one call of a training loop costs on the host, by the way it is called.

    python -m benchmarks.call_overhead --strategy central_storage --logical-cpus 4

The loop is the guide's shape (`for _ in tf.range(n): strategy.run(step, args=(next(iterator),))`) with a step
that does almost nothing, so the time per call is mostly the call itself: TensorFlow's Python that matches the
arguments and flattens the distributed iterator, then the graph's dispatch. Three ways are timed in alternating
chunks in one process: the tf.function, its concrete function, and the runner's concrete_per_iterator.
"""

import argparse
import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.call_overhead")
    p.add_argument("--strategy", default="central_storage", choices=["default", "mirrored", "central_storage"])
    p.add_argument("--logical-cpus", type=int, default=4)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--calls", type=int, default=300, help="calls per chunk")
    args = p.parse_args(argv)

    import numpy as np
    import tensorflow as tf

    from benchmarks.handwritten import make_strategy, setup_devices
    from benchmarks.interleaved import print_table, time_in_chunks
    from runner.executors.base import concrete_per_iterator

    cpus = args.logical_cpus if args.strategy != "default" else 1
    setup_devices(cpus)
    strategy = make_strategy(args.strategy, cpus)
    x = np.random.default_rng(0).standard_normal((4096, 20)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(256, drop_remainder=True).prefetch(tf.data.AUTOTUNE)

    @tf.function
    def loop(iterator, n):
        total = tf.constant(0.0)
        for _ in tf.range(n):
            out = strategy.run(lambda batch: tf.reduce_sum(tf.cast(batch[1], tf.float32)), args=(next(iterator),))
            total += strategy.reduce(tf.distribute.ReduceOp.SUM, out, axis=None)
        return total

    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    one = tf.constant(1)
    concrete = loop.get_concrete_function(iterator, one)
    runner_call = concrete_per_iterator(loop)
    ways = {
        "tf.function": lambda: loop(iterator, one),
        "concrete function": lambda: concrete(iterator, one),
        "runner (concrete_per_iterator)": lambda: runner_call(iterator, one),
    }
    times = time_in_chunks(ways, args.rounds, args.calls, warmup=100)
    print(
        f"{args.strategy}, {strategy.num_replicas_in_sync} replica(s): {args.rounds} rounds of {args.calls} calls, "
        "one near-empty step each"
    )
    print_table("call", times, "tf.function", "tf.function")


if __name__ == "__main__":
    main()
