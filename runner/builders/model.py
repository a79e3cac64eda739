"""model -> an uncompiled tf_keras model from `model._target_`, plus the loss, metrics and optimizer for it.

Call these inside strategy.scope(): variables created there are distributed by the strategy.
"""

import inspect
from enum import StrEnum

from hydra.utils import get_method
from omegaconf import OmegaConf

from runner.errors import ConfigError


class Loss(StrEnum):
    """train.loss (the schema's field is typed by it: runner/schema.py)."""

    auto = "auto"  # from the data's task: sparse_categorical_crossentropy or mse
    mse = "mse"
    binary_crossentropy = "binary_crossentropy"
    sparse_categorical_crossentropy = "sparse_categorical_crossentropy"


class Optimizer(StrEnum):
    """train.optimizer.name (typed by it in runner/schema.py); built by _optimizer below."""

    sgd = "sgd"
    adam = "adam"
    rmsprop = "rmsprop"
    adagrad = "adagrad"


def build_model(cfg, input_shape, num_outputs):
    import tf_keras

    target = cfg.get("_target_")
    if not target:
        raise ConfigError("model needs a `_target_`: the dotted path of a function that returns an uncompiled Keras model.")
    try:
        fn = get_method(target)
    except Exception as err:
        raise ConfigError(
            f"model._target_={target!r} cannot be imported ({err}). Use runner.models.linear, runner.models.mlp, "
            "runner.models.cnn or your own module.function."
        ) from None
    kwargs = {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if not k.startswith("_")}
    try:
        params = inspect.signature(fn).parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    except (TypeError, ValueError):  # a builtin or C function: no signature to read, so offer it everything
        params, takes_any = {}, True
    for name, value in (("input_shape", tuple(input_shape)), ("num_outputs", num_outputs)):
        if takes_any or name in params:
            kwargs.setdefault(name, value)
    try:
        model = fn(**kwargs)
    except TypeError as err:
        raise ConfigError(f"model._target_={target!r} does not accept the model config {sorted(kwargs)}: {err}") from None
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if not isinstance(model, tf_keras.Model):
        raise ConfigError(
            f"model._target_={target!r} returned {type(model).__name__}, not a tf_keras model. "
            "Return tf_keras.Model (Keras 2; the runner sets TF_USE_LEGACY_KERAS=1, so tf.keras is tf_keras too)."
        )
    if not model.built:  # a subclassed model makes its variables at its first call: make them now, in this scope,
        try:  # so that the optimizer and the checkpoints see them before the first step (not inside it)
            model.build((None, *input_shape))
        except Exception as err:
            raise ConfigError(
                f"model._target_={target!r} built no variables, and building it for the data's input shape "
                f"{tuple(input_shape)} failed: {err}. Give the model an Input, or a build() that takes (None, *input_shape)."
            ) from None
    return model


def loss_name(train_cfg, task: str) -> str:
    if train_cfg.loss != "auto":
        return train_cfg.loss
    return "sparse_categorical_crossentropy" if task == "classification" else "mse"


def build_loss(name: str, reduction=None):
    """A Keras loss object; reduction NONE gives per-example losses for the custom loop."""
    import tf_keras

    kwargs = {} if reduction is None else {"reduction": reduction}
    if name == "mse":
        return tf_keras.losses.MeanSquaredError(**kwargs)
    if name == "binary_crossentropy":
        return tf_keras.losses.BinaryCrossentropy(from_logits=True, **kwargs)
    return tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True, **kwargs)


def build_metrics(name: str):
    """Accuracy for losses that have one (the models output logits)."""
    import tf_keras

    if name == "binary_crossentropy":
        return [tf_keras.metrics.BinaryAccuracy(name="accuracy", threshold=0.0)]
    if name == "sparse_categorical_crossentropy":
        return [tf_keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
    return []


def build_optimizer(cfg, mixed_precision: bool = False):
    optimizer = _optimizer(cfg)
    if mixed_precision:  # float16 gradients underflow without loss scaling
        import tf_keras

        optimizer = tf_keras.mixed_precision.LossScaleOptimizer(optimizer)
    return optimizer


def _optimizer(cfg):
    import tf_keras

    opt = tf_keras.optimizers
    kwargs = {"learning_rate": cfg.learning_rate}
    if cfg.clipnorm is not None:
        kwargs["clipnorm"] = cfg.clipnorm
    if cfg.name == "sgd":
        return opt.SGD(momentum=cfg.momentum, **kwargs)
    if cfg.name == "rmsprop":
        return opt.RMSprop(momentum=cfg.momentum, **kwargs)
    return {"adam": opt.Adam, "adagrad": opt.Adagrad}[cfg.name](**kwargs)
