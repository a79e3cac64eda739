"""Built-in model functions. Each returns an uncompiled tf_keras model.

A user's own model is any function with the same shape, named by `model._target_`; it may accept
`input_shape` and `num_outputs`, which the runner passes from the data.
"""

import math
from collections.abc import Sequence


def _keras():
    import tf_keras

    return tf_keras


def linear(input_shape: tuple[int, ...], num_outputs: int):
    """The guide's model: Sequential([Dense(1, input_shape=(1,))])."""
    keras = _keras()
    return keras.Sequential([keras.layers.Dense(num_outputs, input_shape=tuple(input_shape), dtype="float32")])


def mlp(input_shape: tuple[int, ...], num_outputs: int, hidden_units: Sequence[int] = (64, 64), activation="relu"):
    keras = _keras()
    layers = [keras.layers.Input(shape=tuple(input_shape))]
    if len(input_shape) > 1:  # a Flatten on flat input is a wasted op in every step
        layers.append(keras.layers.Flatten())
    layers += [keras.layers.Dense(units, activation=activation) for units in hidden_units]
    layers.append(keras.layers.Dense(num_outputs, dtype="float32"))  # float32 logits under mixed precision
    return keras.Sequential(layers)


def image_shape(input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    """(H, W, C) for a conv net: 3-D shapes as they are, 2-D gets a channel, flat squares are folded."""
    shape = tuple(input_shape)
    if len(shape) == 3:
        return shape
    if len(shape) == 2:
        return shape + (1,)
    side = math.isqrt(shape[0]) if len(shape) == 1 else 0
    if len(shape) == 1 and side * side == shape[0]:
        return (side, side, 1)
    raise ValueError(
        f"model=cnn needs image-shaped input (H, W[, C]) or a flat square one (like 64 = 8x8); "
        f"the data gives shape {shape}. Use model=mlp for this data."
    )


def cnn(input_shape, num_outputs: int, filters: Sequence[int] = (16, 32), kernel_size: int = 3, dense_units: int = 64):
    keras = _keras()
    layers = [keras.layers.Input(shape=tuple(input_shape)), keras.layers.Reshape(image_shape(input_shape))]
    for f in filters:
        layers.append(keras.layers.Conv2D(f, kernel_size, padding="same", activation="relu"))
        layers.append(keras.layers.MaxPooling2D(pool_size=2, padding="same"))
    layers += [
        keras.layers.Flatten(),
        keras.layers.Dense(dense_units, activation="relu"),
        keras.layers.Dense(num_outputs, dtype="float32"),
    ]
    return keras.Sequential(layers)
