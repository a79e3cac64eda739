"""A user's own loss, outside runner/: train.loss={_target_: my_losses.smoothed_crossentropy, smoothing: 0.1}."""


def smoothed_crossentropy(y_true, y_pred, smoothing=0.0):
    """Per-example cross-entropy of integer labels against logits, with label smoothing (plain TensorFlow: it serves
    tf_keras and Keras 3 models alike)."""
    import tensorflow as tf

    logits = tf.convert_to_tensor(y_pred)
    classes = tf.shape(logits)[-1]
    labels = tf.one_hot(tf.cast(tf.reshape(y_true, [-1]), tf.int32), classes)
    labels = labels * (1.0 - smoothing) + smoothing / tf.cast(classes, logits.dtype)
    return tf.nn.softmax_cross_entropy_with_logits(labels, logits)


def batch_mean_crossentropy(y_true, y_pred):
    """A mistake the runner refuses: one number per batch instead of one loss per example."""
    import tensorflow as tf

    return tf.reduce_mean(smoothed_crossentropy(y_true, y_pred))


def raising_loss(y_true, y_pred):
    """Fails on every batch (tests/unit/builders/test_loss.py: refused by the probe before the first step)."""
    raise ValueError("labels and outputs disagree")
