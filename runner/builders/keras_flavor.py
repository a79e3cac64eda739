"""Which Keras a model is written in, and where the runner trains a Keras 3 one.

tf_keras (Keras 2, what `tf.keras` means in the runner's process: TF_USE_LEGACY_KERAS=1) trains every strategy x
executor. A `model._target_` may also return a Keras 3 model (`import keras`, TensorFlow 2.21's default): the runner
then builds its loss and optimizer with Keras 3 and trains it with the custom loop, or with Keras 3's own fit around
the custom loop's step (runner.executors.keras3_fit); tests/e2e/test_keras3.py proves the weights equal the default
strategy's. The other combinations are refused here, before the first step, with the reason, the Keras issue and the
way out (README, "Keras 3 models"): only here is the model known to be Keras 3 (config validation imports no user
module). Both Keras live in one process; the runner's own metrics are tf_keras's (they only see tensors).
"""

from runner.errors import ConfigError

WAY_OUT = "build the same model with `import tf_keras as keras` (the same layers and API), which trains everywhere"


def is_keras3(obj) -> bool:
    """A Keras 3 object, told by its classes' module (without importing keras: tf_keras's own live in tf_keras.*)."""
    return any(c.__module__ == "keras" or c.__module__.startswith("keras.") for c in type(obj).__mro__)


def keras_of(model):
    """The Keras module `model` is written in: keras (Keras 3) or tf_keras."""
    if is_keras3(model):
        import keras

        return keras
    import tf_keras

    return tf_keras


TRAINED = (
    "executor=custom_loop under the default, one_device, mirrored, central_storage and multi_worker_mirrored strategies, "
    "and executor=fit (Keras 3's own) under the default, one_device, mirrored and central_storage ones"
)
FIT_ISSUE = "keras-team/keras#20585"  # Keras 3's fit under MultiWorkerMirroredStrategy: PerReplica ... unsupported type


def _is_multi_worker(strategy) -> bool:
    import tensorflow as tf

    kinds = (tf.distribute.MultiWorkerMirroredStrategy, tf.distribute.experimental.MultiWorkerMirroredStrategy)
    return isinstance(strategy, kinds)


def _fit_refusal(strategy) -> tuple[str, str, str] | None:
    """Where the runner's Keras 3 fit does not train (the other strategies: _refusal's)."""
    if _is_multi_worker(strategy):
        return (
            "executor=fit under strategy=multi_worker_mirrored",
            f"Keras 3's fit fails there at its first step ({FIT_ISSUE}: 'PerReplica ... unsupported type' with its own "
            "train_step; with the runner's, its mean of the step's logs across workers fails on the scalar loss), and "
            "the runner's Keras 3 fit reads each replica's loss on one worker only",
            "Use executor=custom_loop (the same strategy)",
        )
    return None


def _refusal(strategy, executor: str, mixed_precision: bool, clipnorm) -> tuple[str, str, str] | None:
    """(the combination, why the runner does not train a Keras 3 model there, what to use instead), or None."""
    import tensorflow as tf

    if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
        return (
            "strategy=parameter_server",
            "Keras 3 has no ParameterServerStrategy support",
            "Use strategy=multi_worker_mirrored",
        )
    if isinstance(strategy, tf.distribute.TPUStrategy):
        return (
            "strategy=tpu",
            "no test of the runner has trained a Keras 3 model on a TPU (there is none here), so it does not claim that "
            "one trains correctly",
            "Use strategy=mirrored or one_device",
        )
    if executor == "fit":
        refused = _fit_refusal(strategy)
        if refused:
            return refused
    if clipnorm is not None and strategy.num_replicas_in_sync > 1:
        clipping = clipnorm if isinstance(clipnorm, str) else f"train.optimizer.clipnorm={clipnorm}"
        return (
            f"{clipping} over {strategy.num_replicas_in_sync} replicas",
            "Keras 3's optimizer clips each replica's part of the gradient before it sums them, so the update is "
            "not the one-device run's (tf_keras sums, then clips)",
            "Set train.optimizer.clipnorm=null, train on one replica",
        )
    if mixed_precision:
        return (
            "train.mixed_precision=true",
            "the runner scales the loss with tf_keras' LossScaleOptimizer, and Keras 3's has another API (scale_loss, "
            "no get_scaled_loss)",
            "Set train.mixed_precision=false",
        )
    return None


def check_keras3(model, target: str, strategy, executor: str, mixed_precision: bool, clipnorm=None) -> None:
    """Refuse (ConfigError, one paragraph) a Keras 3 model where the runner does not train one; nothing for tf_keras.
    `clipnorm`: train.optimizer.clipnorm, or a text naming the clipping a user's optimizer does (optimizer_clipping)."""
    if not is_keras3(model):
        return
    refusal = _refusal(strategy, executor, mixed_precision, clipnorm)
    if refusal:
        combination, why, instead = refusal
        raise ConfigError(
            f"model._target_={target!r} returned a Keras 3 model ({type(model).__module__}.{type(model).__name__}: "
            f"`import keras`), which the runner does not train with {combination}: {why}. It trains Keras 3 models with "
            f"{TRAINED}, in float32 (with train.optimizer.clipnorm on one replica only). {instead}, or {WAY_OUT}; "
            "nothing was trained."
        )


def optimizer_clipping(optimizer, target: str | None) -> str | None:
    """The gradient clipping a user's optimizer (train.optimizer._target_) does, read from the built optimizer (its
    kwargs or its own code may set it), as text for check_keras3; None when it clips nothing."""
    if not target:
        return None
    found = [f"{k}={getattr(optimizer, k)}" for k in ("clipnorm", "global_clipnorm", "clipvalue") if getattr(optimizer, k, None)]
    return f"train.optimizer._target_={target} with {', '.join(found)}" if found else None
