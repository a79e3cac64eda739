"""A user's own model function, as a user would write it outside the runner's package."""

import tf_keras


def tiny(input_shape, num_outputs, width=8):
    inputs = tf_keras.Input(shape=input_shape)
    hidden = tf_keras.layers.Dense(width, activation="tanh", name="user_hidden")(inputs)
    return tf_keras.Model(inputs, tf_keras.layers.Dense(num_outputs)(hidden))


class SignFlip(tf_keras.layers.Layer):
    """Python control flow on a tensor: runs inside tf.function only if AutoGraph converts the layer's call."""

    def call(self, x):
        import tensorflow as tf

        if tf.reduce_sum(x) < 0.0:
            return -x
        return x


def branchy(input_shape, num_outputs, width=8):
    inputs = tf_keras.Input(shape=input_shape)
    hidden = SignFlip()(tf_keras.layers.Dense(width, activation="tanh")(inputs))
    return tf_keras.Model(inputs, tf_keras.layers.Dense(num_outputs)(hidden))


class TinyNet(tf_keras.Model):
    """A subclassed model: named by `_target_` as a class; the runner passes num_outputs and YAML keys to __init__."""

    def __init__(self, num_outputs, width=8):
        super().__init__()
        self.hidden = tf_keras.layers.Dense(width, activation="tanh")
        self.logits = tf_keras.layers.Dense(num_outputs)

    def call(self, x):
        return self.logits(self.hidden(x))


def keras3_mlp(input_shape, num_outputs, hidden_units=(8,), activation="relu"):
    """model=mlp's MLP written the way TensorFlow 2.21's tutorials write it, with Keras 3 (the custom loop trains it)."""
    import keras

    hidden = [keras.layers.Dense(units, activation=activation) for units in hidden_units]
    return keras.Sequential([keras.Input(input_shape), *hidden, keras.layers.Dense(num_outputs)])


def image_classifier(input_shape, num_classes):
    """A classifier as TensorFlow 2.21's tutorials write one: Keras 3, the data's num_classes, softmax at the end."""
    import keras

    return keras.Sequential(
        [
            keras.Input(shape=input_shape),
            keras.layers.Flatten(),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(num_classes, activation="softmax"),
        ]
    )


def image_classifier_logits(input_shape, num_classes):
    """The same model returning logits (no softmax): it trains to the same weights as image_classifier."""
    import keras

    return keras.Sequential(
        [
            keras.Input(shape=input_shape),
            keras.layers.Flatten(),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(num_classes),
        ]
    )


def mnist_head(input_shape):
    """A tutorial's model copied as is: its 10 classes written into the last layer, whatever the data have."""
    import keras

    return keras.Sequential(
        [keras.Input(shape=input_shape), keras.layers.Flatten(), keras.layers.Dense(10, activation="softmax")]
    )


class HostRound(tf_keras.layers.Layer):
    """A NumPy op inside the model: it trains without XLA, and XLA has no kernel for it (train.jit_compile=true)."""

    def call(self, x):
        import numpy as np
        import tensorflow as tf

        rounded = tf.numpy_function(lambda a: np.round(a, 3), [x], tf.float32, stateful=False)
        return tf.reshape(rounded, tf.shape(x)) + 0.0 * x


def numpy_inside(input_shape, num_outputs, width=8):
    inputs = tf_keras.Input(shape=input_shape)
    hidden = HostRound()(tf_keras.layers.Dense(width, activation="tanh")(inputs))
    return tf_keras.Model(inputs, tf_keras.layers.Dense(num_outputs)(hidden))
