"""model -> an uncompiled Keras model from `model._target_` (tf_keras, or Keras 3: runner.builders.keras_flavor); its
loss and metrics: runner.builders.loss, its optimizer: runner.builders.optimizer.

Call these inside strategy.scope(): variables created there are distributed by the strategy.
"""

import logging
import math

from omegaconf import OmegaConf

from runner.builders.keras_flavor import is_keras3
from runner.builders.model_args import arguments, called_wrong, data_values
from runner.builders.targets import callable_at
from runner.errors import ConfigError, RunnerError

log = logging.getLogger("runner")


def _leaf_layers(layer):
    inner = getattr(layer, "layers", None)
    if isinstance(inner, (list, tuple)) and inner and layer is not inner[0]:
        for sub in inner:
            yield from _leaf_layers(sub)
    else:
        yield layer


VIEWS = ("Reshape", "Flatten")  # outputs that share their input's memory
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "uint8": 1, "int8": 1, "bool": 1}


def activation_bytes(model) -> tuple[int, int]:
    """(bytes of every layer's output for one example, layers counted): what a training step keeps for the backward
    pass, at least (gradients and temporaries come on top). Layers without a known output shape (a subclassed model's)
    count nothing."""
    total = counted = 0
    for layer in _leaf_layers(model):
        if type(layer).__name__ in VIEWS:
            continue
        try:
            shapes = layer.output_shape  # tf_keras
        except AttributeError:  # Keras 3: the symbolic output's shape
            try:
                output = layer.output
                shapes = [tuple(t.shape) for t in output] if isinstance(output, (list, tuple)) else tuple(output.shape)
            except Exception:  # never called symbolically
                continue
        except Exception:  # never called symbolically
            continue
        shapes = shapes if isinstance(shapes, list) else [shapes]
        size = DTYPE_BYTES.get(str(getattr(layer, "compute_dtype", None) or "float32"), 4)
        for shape in shapes:
            dims = tuple(shape)[1:] if isinstance(shape, tuple) else ()
            if dims and all(isinstance(d, int) for d in dims):
                total += size * math.prod(dims)
                counted += 1
    return total, counted


def check_activation_memory(model, cfg, global_batch_size, accumulation_steps: int = 1):
    """Refuse, before the first step, a model whose layers' outputs for this host's share of a batch (of one of its
    micro-batches with gradient accumulation) clearly do not fit in memory (TensorFlow's refusal comes only inside the
    first step, as a ResourceExhaustedError traceback). CPU replicas only: a GPU's memory is its own."""
    import tensorflow as tf

    from runner.sources import checks

    strategy = tf.distribute.get_strategy()
    if global_batch_size is None or isinstance(
        strategy, (tf.distribute.experimental.ParameterServerStrategy, tf.distribute.TPUStrategy)
    ):
        return
    try:
        devices = list(strategy.extended.worker_devices)
    except (RuntimeError, AttributeError, NotImplementedError):  # the default strategy: TensorFlow's placement
        devices = ["/gpu:0" if tf.config.list_logical_devices("GPU") else "/cpu:0"]
    if any("GPU" in d.upper() for d in devices):
        return
    per_example, layers = activation_bytes(model)
    available = checks.available_memory()
    replicas = strategy.num_replicas_in_sync
    share = math.ceil(global_batch_size * len(devices) / max(1, replicas))  # this process's share of the batch
    here = math.ceil(share / accumulation_steps)  # alive at once: one micro-batch's
    need = here * per_example
    if available is None or not per_example or need <= available:
        return
    target = cfg.get("_target_")
    resize_to = cfg.get("resize_to") if target == "runner.models.keras_app" else None
    what = f"model=keras_app (tf_keras.applications.{cfg.get('application')})" if resize_to is not None else f"model {target}"
    if resize_to is not None:
        side = max(1, math.isqrt(int(available // here // max(1, per_example // (resize_to[0] * resize_to[1])))))
        instead = (
            f"Use a smaller model.resize_to (the layers' outputs alone fill the memory at about [{side}, {side}] with this "
            "batch; training needs more)"
        )
    else:
        instead = "Use a smaller model"
    fits = available // per_example * replicas // len(devices)
    instead += f", or a train.global_batch_size well below {fits}" if fits > 1 else ""
    more = [k for k in range(accumulation_steps + 1, global_batch_size + 1) if global_batch_size % k == 0]
    more = [k for k in more if math.ceil(share / k) * per_example * 2 <= available][:1]  # room for the gradients too
    instead += f", or train.accumulation_steps={more[0]} (the same global batch in micro-batches)" if more else ""
    micro = f" (one of train.accumulation_steps={accumulation_steps} micro-batches)" if accumulation_steps > 1 else ""
    raise ConfigError(
        f"{what}{f' with model.resize_to={list(resize_to)}' if resize_to is not None else ''} would need at least "
        f"{checks.gib(need)} of memory for one training step: the outputs of its {layers} layers take "
        f"{checks.gib(per_example)} per example, x {here} example(s) of train.global_batch_size={global_batch_size}{micro} in "
        f"this process, before any gradient; this machine has {checks.gib(available)} available, and TensorFlow would "
        f"stop at the first step with ResourceExhaustedError. Nothing was trained. {instead}."
    )


def _keras3_model(obj) -> bool:
    import keras

    return isinstance(obj, keras.Model)


def _build(model, input_shape) -> None:
    """Keras 3's build() of a subclassed model marks it built without building its layers: call it on one example of
    zeros instead, which makes every variable. tf_keras' build() traces call() and makes them."""
    if is_keras3(model):
        import numpy as np

        model(np.zeros((1, *input_shape), np.float32), training=False)
    else:
        model.build((None, *input_shape))


def build_model(cfg, input_shape, num_outputs, global_batch_size=None, accumulation_steps: int = 1, *, task=None, inherited=None):
    """The model `cfg` names, built for the data; refused (ConfigError) when it cannot be, or when one step of
    `global_batch_size` clearly does not fit in memory (not checked without it: a model built for evaluation).
    `task`: the data's (classification fills num_classes too); `inherited`: the keys a built-in model= option brought
    along (runner.config.model_defaults), left out where the target does not take them."""
    import tf_keras

    target = cfg.get("_target_")
    if not target:
        raise ConfigError("model needs a `_target_`: the dotted path of a function that returns an uncompiled Keras model.")
    fn = callable_at(
        "model", target, "Use runner.models.linear, runner.models.mlp, runner.models.cnn or your own module.function."
    )
    given = {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if not k.startswith("_")}
    data = data_values(input_shape, num_outputs, task)
    args = arguments(fn, target, given, data, inherited or {})
    if args.left_out:
        log.info(
            "model._target_=%s: left out %s, which the model= option's YAML brought and it does not take",
            target,
            ", ".join(f"model.{k}" for k in args.left_out),
        )
    try:
        model = fn(**args.kwargs)
    except TypeError as err:
        raise called_wrong(target, err, args, data) from None
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if not isinstance(model, tf_keras.Model) and not (is_keras3(model) and _keras3_model(model)):
        raise ConfigError(
            f"model._target_={target!r} returned {type(model).__name__}, not a tf_keras model (nor a Keras 3 one). "
            "Return tf_keras.Model (Keras 2; the runner sets TF_USE_LEGACY_KERAS=1, so tf.keras is tf_keras too), or "
            'keras.Model (Keras 3: docs/models.md, "Keras 3 models", says where it trains).'
        )
    if not model.built:  # a subclassed model makes its variables at its first call: make them now, in this scope,
        try:  # so that the optimizer and the checkpoints see them before the first step (not inside it)
            _build(model, input_shape)
        except RunnerError:  # a stop (Ctrl-C, SIGTERM) or a refusal inside it: not the user's error
            raise
        except Exception as err:
            raise ConfigError(
                f"model._target_={target!r} built no variables, and building it for the data's input shape "
                f"{tuple(input_shape)} failed: {err}. Give the model an Input, or a build() that takes (None, *input_shape)."
            ) from None
    check_activation_memory(model, cfg, global_batch_size, accumulation_steps)
    return model
