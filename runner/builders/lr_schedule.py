"""The one learning-rate schedule tf_keras lacks, for train.optimizer.schedule (runner.builders.optimizer): a linear
warm-up from 0, then a linear decay to final_fraction x the peak rate.

A module of its own, with tf_keras imported at its top: a model.keras saved with its optimizer (Model.fit compiles)
names this class, and tf_keras finds it once this module is imported (`import runner.builders.lr_schedule` before
`tf_keras.models.load_model`; with compile=False, as the MLflow model loads, nothing is needed). Only the optimizer's
builder imports it, so config-only paths never do.
"""

import tensorflow as tf
import tf_keras


@tf_keras.saving.register_keras_serializable(package="runner")
class WarmupLinear(tf_keras.optimizers.schedules.LearningRateSchedule):
    """The rate at the optimizer's step; runner.builders.optimizer.learning_rate computes the same in Python."""

    def __init__(self, peak: float, warmup_steps: int, decay_steps: int, final_fraction: float):
        self.peak, self.warmup_steps, self.decay_steps, self.final_fraction = peak, warmup_steps, decay_steps, final_fraction

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        warmup = float(self.warmup_steps)
        done = tf.clip_by_value((step - warmup) / float(self.decay_steps), 0.0, 1.0)
        decayed = self.peak * (self.final_fraction + (1.0 - self.final_fraction) * (1.0 - done))
        return tf.where(step < warmup, self.peak * step / warmup, decayed)

    def get_config(self):
        return {
            "peak": self.peak,
            "warmup_steps": self.warmup_steps,
            "decay_steps": self.decay_steps,
            "final_fraction": self.final_fraction,
        }


_KERAS3 = {}


def keras3_warmup_linear(peak: float, warmup_steps: int, decay_steps: int, final_fraction: float):
    """The same schedule for a Keras 3 optimizer (a keras.optimizers.schedules.LearningRateSchedule, made at the first
    call so that keras is imported only for a Keras 3 model; the custom loop saves no optimizer with the model)."""
    if not _KERAS3:
        import keras

        class Keras3WarmupLinear(keras.optimizers.schedules.LearningRateSchedule):
            __init__, __call__, get_config = WarmupLinear.__init__, WarmupLinear.__call__, WarmupLinear.get_config

        _KERAS3["class"] = Keras3WarmupLinear
    return _KERAS3["class"](peak, warmup_steps, decay_steps, final_fraction)
