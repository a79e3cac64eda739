"""A user's own data, outside runner/: one function that returns NumPy arrays, and the guide's dataset_fn."""

import numpy as np


def pairs(n: int = 320, features: int = 6, seed: int = 0):
    """256 training and 64 eval examples of a two-class problem, as NumPy arrays."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)).astype("float32")
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype("int64")
    return {"x_train": x[:256], "y_train": y[:256], "x_eval": x[256:], "y_eval": y[256:]}


def pairs_dataset(input_context, split="train", batch_size=32, n: int = 320, features: int = 6, seed: int = 0):
    """The same examples as `pairs`, as the guide's dataset_fn: this input pipeline's shard, per-replica batches."""
    import tensorflow as tf

    arrays = pairs(n, features, seed)
    x, y = (arrays["x_train"], arrays["y_train"]) if split == "train" else (arrays["x_eval"], arrays["y_eval"])
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return ds.batch(batch_size, drop_remainder=split == "train")
