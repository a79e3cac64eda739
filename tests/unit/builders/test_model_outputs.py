"""A built model against the data (runner.builders.model_outputs): its Input's shape and dtype, its output width
against the classes or targets, and softmax / sigmoid last layers read as probabilities, for tf_keras and Keras 3,
Sequential, functional and subclassed models. In process: imports TensorFlow (slow)."""

import os
import re

import numpy as np
import pytest

from runner.errors import ConfigError

pytestmark = pytest.mark.slow  # imports TensorFlow and Keras 3 in process
X = np.zeros((2, 6), np.float32)


def _kerases():
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import keras
    import tf_keras

    return {"tf_keras": tf_keras, "keras3": keras}


def _sequential(k, last):
    return k.Sequential([k.Input(shape=(6,)), k.layers.Dense(5, activation="relu"), *last])


def _subclassed(k, activation, out_first=False):
    class Net(k.Model):
        def __init__(self):
            super().__init__()
            if out_first:  # model.layers lists the output layer first: the probe's rows summing to 1 tell
                self.out = k.layers.Dense(3, activation=activation)
            self.hidden = k.layers.Dense(5, activation="relu")
            if not out_first:
                self.out = k.layers.Dense(3, activation=activation)

        def call(self, x):
            return self.out(self.hidden(x))

    net = Net()
    net(X)
    return net


@pytest.mark.parametrize("flavor", ["tf_keras", "keras3"])
def test_softmax_and_sigmoid_last_layers_are_probabilities(flavor):
    from runner.builders.model_outputs import LOGITS, PROBABILITIES, check_output

    k = _kerases()[flavor]
    loss = "sparse_categorical_crossentropy"
    cases = {
        "Dense softmax": (_sequential(k, [k.layers.Dense(3, activation="softmax")]), PROBABILITIES),
        "Softmax layer": (_sequential(k, [k.layers.Dense(3), k.layers.Softmax()]), PROBABILITIES),
        "Activation layer": (_sequential(k, [k.layers.Dense(3), k.layers.Activation("softmax")]), PROBABILITIES),
        "logits": (_sequential(k, [k.layers.Dense(3)]), LOGITS),
        "subclassed softmax": (_subclassed(k, "softmax"), PROBABILITIES),
        "subclassed logits": (_subclassed(k, None), LOGITS),
        "subclassed softmax assigned first": (_subclassed(k, "softmax", out_first=True), PROBABILITIES),
        "sigmoid over 3 outputs": (_sequential(k, [k.layers.Dense(3, activation="sigmoid")]), LOGITS),
    }
    for name, (model, expected) in cases.items():
        assert check_output(model, "m.f", loss, 3, "classification", X)[0] == expected, name
    one = _sequential(k, [k.layers.Dense(1, activation="sigmoid")])
    assert check_output(one, "m.f", "binary_crossentropy", 2, "classification", X)[0] == PROBABILITIES


@pytest.mark.parametrize("flavor", ["tf_keras", "keras3"])
def test_a_model_that_does_not_fit_the_data_names_its_layer_and_the_datas_figure(flavor):
    from runner.builders.model_outputs import check_input, check_output

    k = _kerases()[flavor]
    three = _sequential(k, [k.layers.Dense(3, activation="softmax", name="head")])
    with pytest.raises(ConfigError) as err:
        check_output(three, "m.f", "sparse_categorical_crossentropy", 4, "classification", X)
    message = str(err.value)
    said = "outputs shape [3] per example from its last layer, head (Dense, activation softmax), but the data have 4 classes"
    assert said in message
    assert "\n" not in message and message.endswith("Nothing was trained.")
    with pytest.raises(ConfigError, match=r"the data have 2 target\(s\) per example: mse"):  # mse would broadcast
        check_output(three, "m.f", "mse", 2, "regression", X)
    with pytest.raises(ConfigError, match=r"outputs shape \[3\] per example"):  # subclassed: read by a call
        check_output(_subclassed(k, None), "m.f", "sparse_categorical_crossentropy", 4, "classification", X)
    with pytest.raises(
        ConfigError, match=r"takes inputs of shape \[6\] \(its Input\), and the data's examples have shape \[8, 8"
    ):
        check_input(three, "m.f", (8, 8))
    integers = k.Sequential([k.Input(shape=(6,), dtype="int32"), k.layers.Dense(3)])
    with pytest.raises(ConfigError, match="takes int inputs"):
        check_input(integers, "m.f", (6,), np.dtype("float32"))
    check_input(three, "m.f", (6,), np.dtype("float32"))
    check_output(three, "m.f", {"_target_": "my_losses.any"}, 4, "classification", X)  # a user's loss: its own reading
    inputs = k.Input(shape=(6,))
    head = k.layers.Dense(3)(inputs)
    several = {  # one loss trains one output: a dict of them, or two, fail inside the step otherwise
        "a dict of outputs (logits)": k.Model(inputs, {"logits": head}),
        "2 outputs": k.Model(inputs, [head, k.layers.Dense(1)(inputs)]),
    }
    for said, model in several.items():
        with pytest.raises(ConfigError, match=r"model._target_='m.f' returns " + re.escape(said)):
            check_output(model, "m.f", "sparse_categorical_crossentropy", 3, "classification", X)
    assert check_output(k.Model(inputs, [head]), "m.f", "sparse_categorical_crossentropy", 3, "classification", X)


@pytest.mark.parametrize("flavor", ["tf_keras", "keras3"])
def test_the_loss_takes_probabilities_as_probabilities(flavor):
    """On probabilities the loss with from_logits=False equals the logits loss on the logits they came from."""
    from runner.builders.loss import build_loss, for_outputs
    from runner.builders.metrics import build_metrics

    k = _kerases()[flavor]
    logits = np.array([[2.0, -1.0, 0.5], [0.1, 0.2, 3.0]], np.float32)
    probabilities = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    y = np.array([0, 2])
    spec = for_outputs("sparse_categorical_crossentropy", "probabilities")
    assert spec == "sparse_categorical_crossentropy" and for_outputs(spec, "logits") == spec
    on_probabilities = float(build_loss(spec, keras=k)(y, probabilities))
    on_logits = float(build_loss("sparse_categorical_crossentropy", keras=k)(y, logits))
    assert abs(on_probabilities - on_logits) < 1e-5
    (accuracy,) = build_metrics(for_outputs("binary_crossentropy", "probabilities"))
    accuracy.update_state([[1.0], [0.0]], [[0.4], [0.3]])  # probabilities: 0.4 is the negative class
    assert float(accuracy.result()) == 0.5
    (accuracy,) = build_metrics("binary_crossentropy")
    accuracy.update_state([[1.0], [0.0]], [[0.4], [0.3]])  # logits: both are positive
    assert float(accuracy.result()) == 0.5
    accuracy.update_state([[1.0], [0.0]], [[0.4], [-0.3]])
    assert float(accuracy.result()) == 0.75
