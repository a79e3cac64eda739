"""A `model._target_`'s arguments (runner.builders.model_args, runner.config.model_defaults): the keys a built-in
model= option brought are left out where the target does not take them, the data's values are filled under every
name Keras users write, and an error names only the keys the user gave. No TensorFlow."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runner.builders.model_args import arguments, data_values
from runner.config.model_defaults import inherited_model_keys
from runner.errors import ConfigError

from helpers import composed

DATA = data_values((20,), 4, "classification")


def make_model(input_shape, num_classes=3, dropout=0.1):  # as TensorFlow's tutorials write one
    return input_shape, num_classes, dropout


def takes_anything(input_shape, **kwargs):
    return input_shape, kwargs


class Model:  # stands in for keras.Model: its __init__(**kwargs) takes none of the runner's names
    pass


Model.__module__ = "keras.src.models.model"


class MyModel(Model):
    def __init__(self, num_classes, **kwargs):
        self.num_classes = num_classes


def test_the_data_gives_every_name():
    assert data_values((8, 8, 1), 10, "classification") == {"input_shape": (8, 8, 1), "num_outputs": 10, "num_classes": 10}
    assert data_values((6,), 2, "regression") == {"input_shape": (6,), "num_outputs": 2, "num_features": 6}


def test_the_builtin_options_keys_come_along_only_for_another_target():
    cfg = composed("model._target_=my_model.make_model")  # model=mlp stays the default option
    assert inherited_model_keys(cfg.model, "mlp") == {"hidden_units": [64, 64], "activation": "relu"}
    changed = composed("model._target_=my_model.make_model", "model.hidden_units=[8]")
    assert inherited_model_keys(changed.model, "mlp") == {"activation": "relu"}  # a key the user set is the user's
    assert inherited_model_keys(composed().model, "mlp") == {}  # the option's own target: every key is its own
    assert inherited_model_keys(cfg.model, "tiny") == {}  # not one of the runner's options (a searchpath's)
    assert inherited_model_keys(cfg.model, None) == {}  # no Hydra run: nothing is assumed


def test_keys_the_target_does_not_take_are_left_out_and_the_data_fills_its_names():
    inherited = {"hidden_units": [64, 64], "activation": "relu"}
    args = arguments(make_model, "m.make_model", dict(inherited), DATA, inherited)
    assert args.kwargs == {"input_shape": (20,), "num_classes": 4}
    assert args.left_out == ["hidden_units", "activation"]


def test_a_model_subclass_gets_no_key_through_its_kwargs():
    inherited = {"hidden_units": [64, 64]}
    args = arguments(MyModel, "m.MyModel", dict(inherited), DATA, inherited)
    assert args.kwargs == {"num_classes": 4}


def test_a_function_with_kwargs_gets_the_two_names_it_always_got_and_the_users_keys():
    args = arguments(takes_anything, "m.f", {"width": 3, "activation": "relu"}, DATA, {"activation": "relu"})
    assert args.kwargs == {"width": 3, "input_shape": (20,), "num_outputs": 4}
    assert args.left_out == ["activation"]


def test_a_key_of_the_users_own_is_named_alone():
    inherited = {"activation": "relu"}
    with pytest.raises(ConfigError) as err:
        arguments(make_model, "m.make_model", {"width": 8, "activation": "relu"}, DATA, inherited)
    message = str(err.value)
    assert "does not take model.width" in message and "'~model.width'" in message
    assert "activation" not in message.split("(it takes")[0] and "input_shape" not in message.split("(it takes")[0]


@given(st.dictionaries(st.sampled_from(["hidden_units", "activation", "width", "dropout", "num_classes"]), st.integers()))
def test_what_is_passed_is_what_the_target_takes(given_keys):
    """Whatever the node holds: nothing reaches the function that it does not name, a user's key it lacks is refused,
    and the data's values never override the user's."""
    inherited = {k: v for k, v in given_keys.items() if k in ("hidden_units", "activation")}
    try:
        args = arguments(make_model, "m.make_model", given_keys, DATA, inherited)
    except ConfigError:
        assert "width" in given_keys
        return
    assert set(args.kwargs) <= {"input_shape", "num_classes", "dropout"}
    for key in ("dropout", "num_classes"):
        if key in given_keys:
            assert args.kwargs[key] == given_keys[key]
