"""A user's own model function, as a user would write it outside the runner's package."""

import tf_keras


def tiny(input_shape, num_outputs, width=8):
    inputs = tf_keras.Input(shape=input_shape)
    hidden = tf_keras.layers.Dense(width, activation="tanh", name="user_hidden")(inputs)
    return tf_keras.Model(inputs, tf_keras.layers.Dense(num_outputs)(hidden))
