"""The baseline: tf.distribute training written by hand, the way the guide teaches, with no runner code.

Same model (MLP 20-64-64-4), data (seeded Gaussian features, 4 classes), global batch, strategy and steps
as the runner's benchmark rows. With --npz and --model mobilenetv2 (the compute-bound rows of
`python -m benchmarks.wall --compute-bound`): the images of that file and tf_keras.applications.MobileNetV2 with
random weights, no top, average pooling and a Dense head of logits, as the runner's model=keras_app builds it.
Prints one JSON line: {"examples_per_sec": ..., "train_sec": ...}, where train_sec is the wall time of training,
tracing included, as the runner measures it: the custom loop from making its iterator to the last step's loss;
Model.fit from the call to its on_train_end. (After on_train_end, fit drops its input iterator, and tf.data's
autotuning holds that teardown for ~1 s in about one run in three: timing it would measure that lottery, not
training.)
"""

import argparse
import json
import os
import time

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


def setup_devices(logical_cpus: int):
    """Split the CPU into logical devices (once per process, before TensorFlow initialises them)."""
    import tensorflow as tf

    if logical_cpus > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * logical_cpus)


def make_strategy(name: str, logical_cpus: int):
    """The guide's strategy objects over the logical CPUs: default, mirrored or central_storage."""
    import tensorflow as tf

    cpus = [f"/device:CPU:{i}" for i in range(logical_cpus)]
    if name == "mirrored":
        return tf.distribute.MirroredStrategy(cpus)
    if name == "central_storage":
        return tf.distribute.experimental.CentralStorageStrategy(compute_devices=cpus, parameter_device="/cpu:0")
    return tf.distribute.get_strategy()


def train(
    strategy_name="default",
    executor="fit",
    logical_cpus=1,
    global_batch=256,
    steps=1000,
    steps_per_call=1,
    examples=4096,
    save=None,
    model_name="mlp",
    npz=None,
) -> dict:
    """One training run written the way the guide teaches; {"examples_per_sec": ..., "train_sec": ...}."""
    import numpy as np
    import tensorflow as tf

    strategy = make_strategy(strategy_name, logical_cpus)
    import tf_keras as keras

    if npz:
        with np.load(npz) as f:
            x, y = f["x_train"], f["y_train"]
        examples = len(x)
    else:
        rng = np.random.default_rng(0)
        x = rng.standard_normal((examples, 20)).astype(np.float32)
        y = np.argmax(x @ rng.standard_normal((20, 4)), axis=1).astype(np.int32)
    classes = int(y.max()) + 1
    gbs = global_batch
    dataset = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .shuffle(examples, seed=0)
        .repeat()
        .batch(gbs, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )
    keras.utils.set_random_seed(0)
    with strategy.scope():
        if model_name == "mobilenetv2":
            backbone = keras.applications.MobileNetV2(input_shape=x.shape[1:], include_top=False, weights=None, pooling="avg")
            model = keras.Sequential([keras.layers.Input(shape=x.shape[1:]), backbone, keras.layers.Dense(classes)])
        else:
            model = keras.Sequential(
                [
                    keras.layers.Input(shape=(20,)),
                    keras.layers.Dense(64, activation="relu"),
                    keras.layers.Dense(64, activation="relu"),
                    keras.layers.Dense(classes),
                ]
            )
        optimizer = keras.optimizers.SGD(learning_rate=0.05)
    if executor == "fit":
        with strategy.scope():
            # accuracy too: the runner tracks it for classification, so both sides do the same work
            model.compile(
                optimizer=optimizer,
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"],
                steps_per_execution=steps_per_call,
            )
        ended = []
        # on_train_end only: no batch-level hook, so Keras runs none of its per-batch callback machinery
        timer = keras.callbacks.LambdaCallback(on_train_end=lambda logs: ended.append(time.perf_counter()))
        started = time.perf_counter()
        model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[timer])
        train_sec = ended[0] - started
    else:
        with strategy.scope():
            loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=keras.losses.Reduction.NONE)

        def train_step(inputs):
            features, labels = inputs
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(loss_object(labels, model(features, training=True)), global_batch_size=gbs)
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            return loss

        @tf.function
        def train_steps(iterator, n):
            total = tf.constant(0.0)
            for _ in tf.range(n):
                total += strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(train_step, args=(next(iterator),)), axis=None)
            return total / tf.cast(n, tf.float32)

        started = time.perf_counter()
        iterator = iter(strategy.experimental_distribute_dataset(dataset))
        done = 0
        while done < steps:
            n = min(steps_per_call, steps - done)
            float(train_steps(iterator, tf.constant(n)))
            done += n
        train_sec = time.perf_counter() - started
    if save:  # as the guide's scripts end: the trained model on disk
        model.save(os.path.join(save, "model.keras"))
    return {"examples_per_sec": steps * gbs / train_sec, "train_sec": train_sec}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--strategy", default="default", choices=["default", "mirrored", "central_storage"])
    p.add_argument("--executor", default="fit", choices=["fit", "custom_loop"])
    p.add_argument("--logical-cpus", type=int, default=1)
    p.add_argument("--global-batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--steps-per-call", type=int, default=1)
    p.add_argument("--examples", type=int, default=4096)
    p.add_argument("--save", default=None, help="a directory: save model.keras there at the end")
    p.add_argument("--model", default="mlp", choices=["mlp", "mobilenetv2"])
    p.add_argument("--npz", default=None, help="train on x_train, y_train of this file instead of Gaussian features")
    args = p.parse_args()
    setup_devices(args.logical_cpus)
    print(
        json.dumps(
            train(
                args.strategy,
                args.executor,
                args.logical_cpus,
                args.global_batch,
                args.steps,
                args.steps_per_call,
                args.examples,
                args.save,
                args.model,
                args.npz,
            )
        )
    )


if __name__ == "__main__":
    main()
