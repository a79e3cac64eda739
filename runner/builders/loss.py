"""train.loss -> a Keras loss (its metrics: runner.builders.metrics).

train.loss is a built-in name (the `Loss` Enum) or your own, as Hydra instantiates objects: a node with `_target_`
and keyword arguments. The target may be
- a Keras `Loss` class (either Keras), made with those arguments: `{_target_: tf_keras.losses.Huber, delta: 0.5}`;
- a per-example function `(y_true, y_pred, **arguments)`, whose arguments the node gives: `{_target_:
  mypkg.losses.focal, gamma: 2.0}`, made a `Loss` of the model's Keras;
- any other function, called with the arguments, that returns one of those two.
A user's loss is evaluated as eval/loss only: accuracy is the built-in losses' (the runner cannot tell what a user's
loss expects of the model's output).

The executors need per-example losses (the custom loop and fit's per-replica losses divide their sum by the global
batch, as the guide's `tf.nn.compute_average_loss` does), so the runner sets the loss' reduction itself, and a user's
loss that gives one number per batch instead of one per example is refused before the first step (check_user_loss),
or when the step is traced. Call build_loss inside strategy.scope().
"""

import inspect
from enum import StrEnum

from omegaconf import DictConfig, OmegaConf

from runner.builders.targets import callable_at, per_example_function, probe_examples, ran_on_probe, reason
from runner.errors import ConfigError, RunnerError


class Loss(StrEnum):
    """train.loss's built-in names (the schema's field is typed by it: runner.config.schema)."""

    auto = "auto"  # from the data's task: sparse_categorical_crossentropy or mse
    mse = "mse"
    binary_crossentropy = "binary_crossentropy"
    sparse_categorical_crossentropy = "sparse_categorical_crossentropy"


KINDS = (
    "Give a Keras Loss class (tf_keras.losses.Huber, keras.losses.Huber or your subclass), a function (y_true, y_pred, "
    "**arguments) returning one loss per example, or a function that returns either."
)
PER_EXAMPLE = "none"  # the loss reduction that gives per-example losses (the custom loop's), in both Keras
KEY = "train.loss"


def is_target(spec) -> bool:
    """A user's loss node (`{_target_: ...}`), not a built-in name."""
    return isinstance(spec, (dict, DictConfig))


class OnProbabilities(str):
    """A built-in classification loss's name, for a model whose last layer ends in softmax (or sigmoid for one
    output): it compares equal to the plain name everywhere, and build_loss gives it from_logits=False."""

    from_logits = False


CROSSENTROPIES = ("sparse_categorical_crossentropy", "binary_crossentropy")


def for_outputs(spec, kind: str):
    """The loss spec for a model's output kind (runner.builders.model_outputs: "probabilities" or "logits")."""
    if kind == "probabilities" and not is_target(spec) and spec in CROSSENTROPIES:
        return OnProbabilities(spec)
    return spec


def from_logits(spec) -> bool:
    return getattr(spec, "from_logits", True)


def loss_name(train_cfg, task: str):
    """The built-in loss name for the data's task, or the user's node as a plain dict."""
    spec = train_cfg.loss
    if is_target(spec):
        return OmegaConf.to_container(spec, resolve=True) if isinstance(spec, DictConfig) else dict(spec)
    if spec != "auto":
        return str(spec)
    return "sparse_categorical_crossentropy" if task == "classification" else "mse"


def build_loss(spec, reduction=None, keras=None):
    """A loss object of `keras` (the model's Keras, runner.builders.keras_flavor; tf_keras when not given);
    reduction PER_EXAMPLE gives per-example losses for the custom loop."""
    if keras is None:
        import tf_keras as keras

    if is_target(spec):
        return _user_loss(dict(spec), reduction, keras)
    kwargs = {} if reduction is None else {"reduction": reduction}
    if spec == "mse":
        return keras.losses.MeanSquaredError(**kwargs)
    if spec == "binary_crossentropy":
        return keras.losses.BinaryCrossentropy(from_logits=from_logits(spec), **kwargs)
    return keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits(spec), **kwargs)


def _is_loss(obj) -> bool:
    import tf_keras

    if isinstance(obj, tf_keras.losses.Loss):
        return True
    from runner.builders.keras_flavor import is_keras3

    if is_keras3(obj):
        import keras

        return isinstance(obj, keras.losses.Loss)
    return False


def _function_loss(keras, fn, kwargs: dict):
    """A per-example function as a Loss of `keras` (tf_keras has no public LossFunctionWrapper; a subclass with
    `call` is how both Keras document a custom loss)."""

    class FunctionLoss(keras.losses.Loss):
        def call(self, y_true, y_pred):
            return fn(y_true, y_pred, **kwargs)

    return FunctionLoss(name=getattr(fn, "__name__", "loss"))


def _user_loss(spec: dict, reduction, keras):
    target = spec.get("_target_")
    kwargs = {k: v for k, v in spec.items() if not k.startswith("_")}
    what = f"{KEY}._target_={target!r}"
    fn = callable_at(KEY, target, f"{KINDS} Or a built-in: {KEY}=mse.")
    if per_example_function(fn, kwargs):
        try:
            inspect.signature(fn).bind(None, None, **kwargs)
        except TypeError as err:
            raise ConfigError(
                f"{what} does not accept the arguments {sorted(kwargs)}: {reason(err)}. Change them under {KEY} (a "
                "node given on the command line is merged into the one the config has: its other arguments stay)."
            ) from None
        obj = _function_loss(keras, fn, kwargs)
    else:
        try:
            obj = fn(**kwargs)
        except (TypeError, ValueError) as err:
            raise ConfigError(
                f"{what} does not accept the arguments {sorted(kwargs)}: {reason(err)}. Change them under {KEY}."
            ) from None
        if callable(obj) and not _is_loss(obj) and per_example_function(obj, {}):
            obj = _function_loss(keras, obj, {})
    if not _is_loss(obj):
        raise ConfigError(f"{what} gave {type(obj).__name__}, not a loss. {KINDS}")
    # the executors sum per-example losses themselves (compute_average_loss); fit's compile and the evaluator get
    # Keras' default mean, whatever reduction the node gave, so that both executors train at the same scale
    obj.reduction = reduction if reduction is not None else _default_reduction(obj)
    return _per_example_checked(obj, what) if reduction is not None else obj


def _default_reduction(loss) -> str:
    """The mean over the batch, in the loss object's own Keras (a Keras 3 loss may serve a tf_keras model)."""
    import tf_keras

    return tf_keras.losses.Reduction.AUTO if isinstance(loss, tf_keras.losses.Loss) else "sum_over_batch_size"


def check_user_loss(spec, model, data, keras) -> None:
    """A user's train.loss built, and called once on the model's output for two examples (the data's first two, or
    zeros shaped like them): one number per batch, and an error on the data's own examples, are refused here, before
    the first step, in one paragraph (inside the traced step TensorFlow would wrap them in its own trace). A failure
    on the probe's zeros, or of the model itself, is left to the step, which sees the real batches. (No gradient
    through the loss is told by the step: runner.builders.own_code. The probe runs the model for inference, where a
    model or a loss may differ from training.)"""
    from runner.builders.own_code import error_line

    loss = build_loss(spec, PER_EXAMPLE, keras)
    if not is_target(spec):
        return
    x, y, real = probe_examples(data)
    try:
        y_pred = model(x, training=False)
    except RunnerError:
        raise
    except Exception:  # noqa: BLE001  (the model's own failure: its checks and the step say it)
        return
    ran_on_probe(
        lambda: loss(y, y_pred),
        real,
        lambda err: (
            f"train.loss._target_={spec.get('_target_')!r} failed on the model's output for the data's first two "
            f"examples: {error_line(err)}. Fix the function (it gets y_true and y_pred, the model's output). Nothing "
            "was trained."
        ),
    )


def _per_example_checked(loss, what: str):
    """The loss, refusing at trace time a result with one number per batch (the step would divide it by the
    global batch again: a silently wrong scale)."""

    def checked(y_true, y_pred, sample_weight=None):
        losses = loss(y_true, y_pred, sample_weight=sample_weight)
        shape = losses.shape
        if shape.rank == 0:
            raise ConfigError(
                f"{what} gave one number per batch, not one loss per example: the runner divides the sum of "
                "per-example losses by the global batch (tf.nn.compute_average_loss), so a mean would be scaled "
                "again. Return the loss of each example (shape [batch]), and leave the reduction to the runner. "
                "Nothing was trained."
            )
        if shape.rank > 1 and shape[1:].num_elements() != 1:
            raise ConfigError(
                f"{what} gave losses of shape {shape.as_list()}, not one loss per example: the custom loop would sum "
                "the last axes and Model.fit average them, so the two executors would train at different scales. "
                "Reduce them to one number per example (shape [batch]). Nothing was trained."
            )
        return losses

    return checked
