"""What a built model takes and gives, read before the first step: its input against the data's, its output width
against the data's classes or targets, and whether its last layer ends in softmax (or sigmoid for one output), so
that the loss takes probabilities (`from_logits=False`) instead of logits.

Shapes are read from the model's symbolic inputs and outputs (Sequential and functional models, either Keras); a
subclassed model, which has none, is called once on two examples. Each mismatch is one paragraph naming the model's
layer and the data's figure (ConfigError, exit 2): the first step would otherwise fail inside TensorFlow, be blamed
on the data (a label outside the model's range), or, for mse, broadcast silently.
"""

import numpy as np

from runner.errors import ConfigError

PROBABILITIES, LOGITS = "probabilities", "logits"


def last_layer(model):
    """The layer that makes the output: the last of model.layers (a Sequential's, a functional model's output layer,
    a subclassed model's last attribute), descending into a nested Sequential or functional model."""
    layers = getattr(model, "layers", None)
    while layers:
        layer = layers[-1]
        inner = getattr(layer, "layers", None)
        if not inner:
            return layer
        layers = inner
    return None


def _activation_name(layer) -> str | None:
    if layer is None:
        return None
    if type(layer).__name__ in ("Softmax", "Sigmoid"):  # a Softmax layer (tf_keras and Keras 3)
        return type(layer).__name__.lower()
    activation = getattr(layer, "activation", None)
    return getattr(activation, "__name__", None) if callable(activation) else None


def output_kind(model, width: int | None) -> tuple[str, str]:
    """(PROBABILITIES or LOGITS, the layer and activation that tell it), from the last layer's activation."""
    layer = last_layer(model)
    name = _activation_name(layer)
    said = f"{getattr(layer, 'name', '?')} ({type(layer).__name__}, activation {name or 'none'})"
    if name == "softmax" or (name == "sigmoid" and width == 1):
        return PROBABILITIES, said
    return LOGITS, said


def _symbolic(model, attr: str):
    try:
        tensors = getattr(model, attr, None)
    except (AttributeError, ValueError):  # a subclassed model: no symbolic graph
        return None
    return tensors if tensors else None


def _shape(t) -> tuple:
    return tuple(None if d is None else int(d) for d in tuple(t.shape))


def _several(out) -> str | None:
    """What a model's output is when it is not one tensor (a dict, or a list of several), else None."""
    if isinstance(out, dict):
        return f"a dict of outputs ({', '.join(map(str, out))})"
    if isinstance(out, (list, tuple)) and len(out) != 1:
        return f"{len(out)} outputs"
    return None


def output_shape(model, x_probe, target: str = "?") -> tuple[tuple | None, np.ndarray | None]:
    """(the output's shape without the batch; the probe's output where the model was called for it: a subclassed
    model's). A model of several outputs, or of a dict of them, is refused: the runner trains one output with one
    loss, and the executors would fail inside the step on the structure."""
    outputs = _symbolic(model, "outputs")
    if outputs is None:  # a subclassed model: its call says (an error in it is the model's own, left to surface)
        out = model(x_probe, training=False)
    else:
        try:  # the symbolic output's structure (not its truth: a KerasTensor has none)
            out = model.output
        except (AttributeError, ValueError):
            out = outputs
    several = _several(out)
    if several:
        raise ConfigError(
            f"model._target_={target!r} returns {several}: the runner trains a model of one output tensor, with one "
            "loss. Return that tensor (keras.Model(inputs, outputs['logits']), or the one output a subclassed call "
            "returns). Nothing was trained."
        )
    if outputs is None:
        out = np.asarray(out[0] if isinstance(out, (list, tuple)) else out)
        return tuple(out.shape[1:]), out
    return _shape(outputs[0])[1:], None


def _sums_to_one(out) -> bool:
    """A subclassed model's probe output that is a distribution in every row: softmax, whichever of its attributes
    (model.layers' order) applies it last."""
    if out is None or out.ndim != 2 or out.shape[1] < 2:
        return False
    out = out.astype(np.float64)
    return bool(np.all(out >= 0) and np.allclose(out.sum(axis=1), 1.0, atol=1e-5))


def _dtype_kind(dtype) -> str:
    name = str(getattr(dtype, "name", dtype))
    return "float" if "float" in name else "int" if "int" in name else "string" if "string" in name else name


def check_input(model, target: str, input_shape, data_dtype=None) -> None:
    inputs = _symbolic(model, "inputs")
    if inputs is None or len(inputs) != 1:
        return
    expected = _shape(inputs[0])[1:]
    given = tuple(int(d) for d in input_shape)
    fits = len(expected) == len(given) and all(e is None or e == g for e, g in zip(expected, given))
    if not fits:
        raise ConfigError(
            f"model._target_={target!r} takes inputs of shape {list(expected)} (its Input), and the data's examples "
            f"have shape {list(given)}. Build the model's Input from the input_shape the runner passes (add an "
            "input_shape parameter to the function), or choose data of that shape. Nothing was trained."
        )
    if data_dtype is not None and _dtype_kind(inputs[0].dtype) != _dtype_kind(data_dtype):
        raise ConfigError(
            f"model._target_={target!r} takes {_dtype_kind(inputs[0].dtype)} inputs (its Input's dtype "
            f"{getattr(inputs[0].dtype, 'name', inputs[0].dtype)}), and the data's examples are {np.dtype(data_dtype).name}. "
            "Give the Input the data's dtype (Keras' default, float32, for numbers). Nothing was trained."
        )


def check_output(model, target: str, loss, num_outputs: int, task: str, x_probe) -> tuple[str, str]:
    """The output width against the data; returns (PROBABILITIES or LOGITS, the last layer that tells it): what the
    built-in losses should take."""
    from runner.builders.loss import is_target

    shape, probed = output_shape(model, x_probe, target)
    width = shape[-1] if shape else None
    kind, said = output_kind(model, width)
    if kind == LOGITS and _sums_to_one(probed):
        kind, said = PROBABILITIES, f"{said}, and its outputs for two examples sum to 1 in each row"
    if is_target(loss) or shape is None:
        return kind, said  # a user's loss reads the output its own way
    if loss == "sparse_categorical_crossentropy":
        needed, what = num_outputs, f"the data have {num_outputs} classes: {loss} needs one output per class"
    elif loss == "mse":
        needed, what = num_outputs, f"the data have {num_outputs} target(s) per example: mse needs one output each"
    else:
        return kind, said
    if shape != (needed,) and not (loss == "mse" and needed == 1 and shape == ()):  # one target: [batch] works too
        numbers = "num_classes (or num_outputs)" if task == "classification" else "num_outputs"
        raise ConfigError(
            f"model._target_={target!r} outputs shape {list(shape)} per example from its last layer, {said}, but {what}. "
            f"Build the last layer with the {numbers} the runner passes (add that parameter to the function), or "
            "check the data's classes or targets. Nothing was trained."
        )
    return kind, said
