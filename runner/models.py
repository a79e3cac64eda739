"""Built-in model functions. Each returns an uncompiled tf_keras model.

A user's own model is any function with the same shape, named by `model._target_`; it may accept
`input_shape` and `num_outputs`, which the runner passes from the data.
"""

import difflib
import math
import os
import re
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


def image_shape(input_shape: tuple[int, ...], model: str = "cnn") -> tuple[int, int, int]:
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
        f"model={model} needs image-shaped input (H, W[, C]) or a flat square one (like 64 = 8x8); "
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


# Set by keras_app itself: the runner's data decide the input and the head, and nothing is downloaded. (The
# application is `model.application`, not `model.name`: a group's `name` is the option's own name elsewhere.)
KERAS_APP_RESERVED = ("include_top", "input_shape", "input_tensor", "classes", "classifier_activation", "pooling")
KERAS_APP_EXAMPLES = ("ResNet50", "MobileNetV2", "EfficientNetB0", "MobileNetV3Small", "DenseNet121", "VGG16")


def keras_app_problem(model_cfg: dict) -> str | None:
    """What is wrong with a model=keras_app config, without TensorFlow (runner.config.validate calls it), or None."""
    application, weights, resize_to = model_cfg.get("application"), model_cfg.get("weights"), model_cfg.get("resize_to")
    if not isinstance(application, str) or not application:
        examples = ", ".join(KERAS_APP_EXAMPLES)
        return f"model.application={application!r}: name a tf_keras.applications model function, e.g. {examples}."
    if weights is not None and (not isinstance(weights, str) or weights.lower() == "imagenet"):
        return (
            f"model.weights={weights!r} is not allowed: the runner downloads nothing while it runs, so model=keras_app "
            "starts from random weights (model.weights=null, the default). To start from pretrained weights, download "
            "the backbone's weights without its top (e.g. resnet50_weights_tf_dim_ordering_tf_kernels_notop.h5) "
            "beforehand and give its local path: model.weights=/path/to/file.h5."
        )
    if resize_to is not None and (
        not isinstance(resize_to, (list, tuple))
        or len(resize_to) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in resize_to)
    ):
        return f"model.resize_to={resize_to!r} must be [height, width] in pixels (positive integers), or null."
    if "name" in model_cfg:  # Hydra's hint for model.name=X is +model.name=X, which would only rename the default
        return f"model.name={model_cfg['name']!r}: the application is model.application (model.application=ResNet50)."
    reserved = sorted(set(model_cfg) & set(KERAS_APP_RESERVED))
    if reserved:
        return (
            f"model.{reserved[0]} is set by model=keras_app itself (input shape and head come from the data; the head "
            f"outputs float32 logits after average pooling); remove {', '.join('model.' + k for k in reserved)}."
        )
    return None


def keras_app(input_shape, num_outputs: int, application: str = "MobileNetV2", weights=None, resize_to=None, **kwargs):
    """A tf_keras.applications model by name (`tf_keras.applications.<application>`) as the backbone, without its top and
    with average pooling, then a float32 Dense head that outputs logits. The input is reshaped to an image
    (image_shape) and, with `resize_to: [h, w]`, resized; `weights` is None or a local file of the backbone's
    weights. Other keyword arguments go to the application function (MobileNetV2's `alpha`, ...)."""
    keras = _keras()
    problem = keras_app_problem({"application": application, "weights": weights, "resize_to": resize_to, **kwargs})
    if problem:
        raise ValueError(problem)
    app = getattr(keras.applications, application, None)
    if not (callable(app) and application[:1].isupper() and not isinstance(app, type)):
        valid = [n for n in dir(keras.applications) if n[:1].isupper() and callable(getattr(keras.applications, n))]
        close = difflib.get_close_matches(application, valid, n=3)
        raise ValueError(
            f"model.application={application!r} is not a model function of tf_keras.applications"
            + (f" (did you mean {' or '.join(close)}?)" if close else "")
            + f"; valid names include {', '.join(KERAS_APP_EXAMPLES)} ({len(valid)} in all: dir(tf_keras.applications))."
        )
    weights = os.path.expanduser(weights) if weights is not None else None
    image = image_shape(input_shape, model="keras_app")
    size = tuple(resize_to) if resize_to is not None else image[:2]
    inputs = keras.layers.Input(shape=tuple(input_shape))
    x = keras.layers.Reshape(image)(inputs) if tuple(input_shape) != image else inputs
    if resize_to is not None:
        x = keras.layers.Resizing(*size)(x)
    try:  # the weights are loaded below: a file that does not fit is not a config the application refused
        backbone = app(include_top=False, weights=None, input_shape=size + image[2:], pooling="avg", **kwargs)
    except (TypeError, ValueError) as err:
        least = re.search(r"at least (\d+)x(\d+)", str(err))
        if least:
            h, w = max(int(least[1]), size[0]), max(int(least[2]), size[1])
            raise ValueError(
                f"model.application={application} needs images of at least {least[1]}x{least[2]}; it would get "
                f"{size[0]}x{size[1]}"
                f"{' (model.resize_to)' if resize_to is not None else ', the size of the data'}. Set "
                f"model.resize_to=[{h}, {w}]: a Resizing layer then scales the images up first."
            ) from None
        raise ValueError(f"model=keras_app: tf_keras.applications.{application}(...) refused the model config: {err}") from None
    if weights is not None:
        _load_backbone_weights(backbone, weights, application, size + image[2:], kwargs)
    logits = keras.layers.Dense(num_outputs, dtype="float32", name="logits")(backbone(x))
    return keras.Model(inputs, logits, name=f"keras_app_{application}")


def _load_backbone_weights(backbone, weights: str, application: str, shape: tuple, kwargs: dict) -> None:
    """Load `weights` into the backbone as tf_keras.applications does (Model.load_weights), naming the file and what it
    must hold when it does not fit: another application, other arguments (alpha...), another number of channels."""
    try:
        backbone.load_weights(weights)
    except Exception as err:  # OSError (HDF5 cannot read it), ValueError (another architecture or shape), ...
        arguments = "".join(f", {k}={v!r}" for k, v in sorted(kwargs.items()))
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(
            f"model.weights={weights} cannot be loaded into tf_keras.applications.{application}(include_top=False"
            f"{arguments}) for {'x'.join(map(str, shape))} input: {reason[:400]} ({type(err).__name__}). Nothing was "
            f"trained. The file must hold the weights of this same application without its top, saved for "
            f"{shape[-1]}-channel input with the same arguments (ImageNet's *_notop.h5 are for 3-channel input); "
            "use those, or model.weights=null to start from random weights."
        ) from None
