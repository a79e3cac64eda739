"""The physical anchor of benchmarks.limit: a model's training math with nothing around it.

    python -m benchmarks.tight_loop --hidden 64,64 --features 20 --classes 4 --batch 256 --steps 3000

The runner's own MLP (runner.models.mlp, the same layers and variables), sparse softmax cross-entropy on logits
averaged over the global batch, plain SGD written as `var.assign_sub(lr * grad)`, N steps per call of one
tf.function, on a batch already in memory: no Keras training loop, no input pipeline, no logging. Then the rungs
that add back, one at a time, what a real training loop has, so that the gap between the runner and this loop
can be read off as input, calls and the rest:

- `tight`: in-memory batch, N steps per call (plain, and with `jit_compile=True`, the faster counts);
- `dataset`: the same, but each step takes its batch from a `tf.data` iterator, as the runner's in-memory
  pipeline makes it (row indices batched, the rows gathered a batch at a time, prefetched);
- `per_step`: the same dataset, one step per call, the loss read back on the host after each call (what a loop
  that checks every step's loss does).

Under --strategy mirrored (--logical-cpus N) each rung runs through strategy.run over the replicas, with the
dataset distributed by the strategy; under --strategy multi_worker_mirrored (--workers N) the same in N processes
on 127.0.0.1 (TF_CONFIG made here, ring all-reduce, each worker reading its share of the global batch), worker 0's
figures printed. Prints one JSON line: {rung: examples/sec}, steady state (the first call,
tracing, excluded; the best of --repeats timings).
"""

import argparse
import json
import os
import subprocess
import sys
import time

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

LR = 0.05


def _rate(fn, calls: int, steps_per_call: int, batch: int, repeats: int) -> float:
    fn()  # tracing and the first batch are no step's time
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            out = fn()
        float(out)  # wait for the last call
        best = min(best, time.perf_counter() - started)
    return calls * steps_per_call * batch / best


def measure(hidden, features, classes, batch, steps, steps_per_call, strategy_name, logical_cpus, repeats, rungs):
    import numpy as np
    import tensorflow as tf

    from benchmarks.handwritten import make_strategy, setup_devices
    from runner.models import mlp

    setup_devices(logical_cpus if strategy_name == "mirrored" else 1)
    if strategy_name == "multi_worker_mirrored":  # TF_CONFIG from the parent process (main)
        ring = tf.distribute.experimental.CommunicationImplementation.RING
        options = tf.distribute.experimental.CommunicationOptions(implementation=ring)
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    else:
        strategy = make_strategy(strategy_name, logical_cpus)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((max(4096, batch), features)).astype(np.float32)
    y = rng.integers(0, classes, len(x)).astype(np.int32)
    with strategy.scope():
        model = mlp((features,), classes, hidden)
    variables = model.trainable_variables

    def replica_step(xb, yb):
        with tf.GradientTape() as tape:
            logits = model(xb, training=True)
            per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=yb, logits=logits)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=batch)
        grads = tape.gradient(loss, variables)
        if strategy.num_replicas_in_sync > 1:
            grads = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, grads)
        for v, g in zip(variables, grads):
            v.assign_sub(LR * g)
        return loss

    def step(inputs):
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica_step, args=inputs), axis=None)

    xt, yt = tf.constant(x), tf.constant(y)  # the runner's in-memory pipeline: batches of rows, gathered
    dataset = tf.data.Dataset.range(len(x)).repeat().batch(batch, drop_remainder=True)
    dataset = dataset.map(lambda rows: (tf.gather(xt, rows), tf.gather(yt, rows)))
    shard = tf.data.Options()  # each worker its share of every global batch, as the runner's in-memory data
    shard.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = dataset.with_options(shard)
    dataset = strategy.experimental_distribute_dataset(dataset.prefetch(tf.data.AUTOTUNE))
    fixed = next(iter(dataset))  # one batch, already where the replicas read it
    calls = max(1, steps // steps_per_call)
    out = {}

    def tight_fn(jit):
        @tf.function(jit_compile=jit)
        def loop(n):
            loss = tf.constant(0.0)
            for _ in tf.range(n):
                loss = step(fixed)
            return loss

        n = tf.constant(steps_per_call)
        return lambda: loop(n)

    if "tight" in rungs:
        rates = {"plain": _rate(tight_fn(False), calls, steps_per_call, batch, repeats)}
        if strategy.num_replicas_in_sync == 1:  # XLA across logical CPU devices is not supported
            try:
                rates["xla"] = _rate(tight_fn(True), calls, steps_per_call, batch, repeats)
            except Exception as e:  # noqa: BLE001  a model XLA cannot compile: the plain figure stands
                rates["xla_error"] = str(e).splitlines()[0][:200]
        out["tight"] = max(v for k, v in rates.items() if k in ("plain", "xla"))
        out["tight_plain"], out["tight_xla"] = rates["plain"], rates.get("xla")
    iterator = iter(dataset)

    @tf.function
    def from_dataset(n):
        loss = tf.constant(0.0)
        for _ in tf.range(n):
            loss = step(next(iterator))
        return loss

    if "dataset" in rungs:
        n = tf.constant(steps_per_call)
        out["dataset"] = _rate(lambda: from_dataset(n), calls, steps_per_call, batch, repeats)
    if "per_step" in rungs:
        one = tf.constant(1)
        out["per_step"] = _rate(lambda: float(from_dataset(one)), min(steps, 3000), 1, batch, repeats)
    return out


def _workers(argv: list[str], n: int) -> dict:
    """The loop in n worker processes of a MultiWorkerMirroredStrategy cluster on 127.0.0.1; worker 0's figures."""
    from runner.launch.localhost import free_ports

    spec = {"worker": [f"127.0.0.1:{p}" for p in free_ports(n)]}
    procs = []
    for i in range(n):
        env = {**os.environ, "TF_CONFIG": json.dumps({"cluster": spec, "task": {"type": "worker", "index": i}})}
        cmd = [sys.executable, "-m", "benchmarks.tight_loop", *argv, f"--task={i}"]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=1800) for p in procs]
    for p, (_, err) in zip(procs, outs):
        if p.returncode:
            raise SystemExit(f"a worker of the tight loop failed (exit {p.returncode}):\n{err[-2000:]}")
    return json.loads(outs[0][0].strip().splitlines()[-1])


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.tight_loop")
    p.add_argument("--hidden", default="64,64")
    p.add_argument("--features", type=int, default=20)
    p.add_argument("--classes", type=int, default=4)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--steps-per-call", type=int, default=100)
    p.add_argument("--strategy", default="default", choices=["default", "mirrored", "multi_worker_mirrored"])
    p.add_argument("--logical-cpus", type=int, default=1)
    p.add_argument("--workers", type=int, default=2, help="multi_worker_mirrored: processes on 127.0.0.1")
    p.add_argument("--task", type=int, help=argparse.SUPPRESS)  # a worker started by _workers
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rungs", default="tight,dataset,per_step")
    a = p.parse_args(argv)
    if a.strategy == "multi_worker_mirrored" and a.task is None:
        print(json.dumps(_workers(sys.argv[1:] if argv is None else list(argv), a.workers)))
        return
    hidden = [int(h) for h in a.hidden.split(",")]
    result = measure(
        hidden, a.features, a.classes, a.batch, a.steps, min(a.steps_per_call, a.steps), a.strategy, a.logical_cpus,
        a.repeats, a.rungs.split(","),
    )  # fmt: skip
    print(json.dumps(result))


if __name__ == "__main__":
    main()
