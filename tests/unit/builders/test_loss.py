"""train.loss and train.optimizer by `_target_` (runner.builders.loss, runner.builders.optimizer): each form a user
can write gives the per-example losses Keras' own function gives, in both Keras; what cannot train is refused in one
paragraph naming the key (before TensorFlow where the config alone shows it). End to end: tests/e2e/test_keras3.py
(every strategy, the user's loss and optimizer) and README's own-loss command (tf_keras, Model.fit)."""

import os
import sys

import numpy as np
import pytest
from omegaconf import OmegaConf

from runner.config import validate
from runner.errors import ConfigError

from helpers import composed, doc_section

USER = os.path.join(os.path.dirname(__file__), "..", "..", "user_project")


@pytest.fixture(scope="module")
def tf():
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    sys.path.insert(0, USER)
    import tensorflow

    yield tensorflow
    sys.path.remove(USER)


def _flavours():
    import keras
    import tf_keras

    return {"tf_keras": tf_keras, "keras": keras}


HUBER = [
    {"_target_": "tf_keras.losses.Huber", "delta": 0.5},  # a Loss class, with its arguments
    {"_target_": "keras.losses.Huber", "delta": 0.5},  # Keras 3's, for a tf_keras model too
    {"_target_": "tf_keras.losses.huber", "delta": 0.5},  # a per-example function
    {"_target_": "keras.losses.huber", "_partial_": True, "delta": 0.5},  # Hydra's _partial_ is not needed, nor harmful
]


@pytest.mark.parametrize("spec", HUBER, ids=lambda s: s["_target_"])
@pytest.mark.parametrize("flavour", ["tf_keras", "keras"])
def test_each_form_gives_keras_own_per_example_losses(tf, spec, flavour):
    import tf_keras

    from runner.builders.loss import PER_EXAMPLE, build_loss

    y, p = tf.constant([[0.0], [1.0], [2.0]]), tf.constant([[0.5], [3.0], [2.1]])
    expected = tf_keras.losses.huber(y, p, delta=0.5).numpy()
    got = build_loss(spec, PER_EXAMPLE, _flavours()[flavour])(y, p).numpy()
    assert got.shape == (3,) and np.allclose(got, expected)
    assert float(build_loss(spec, None, _flavours()[flavour])(y, p)) == pytest.approx(expected.mean())  # fit's compile


def test_a_users_function_with_its_arguments(tf):
    from runner.builders.loss import PER_EXAMPLE, build_loss

    y, logits = tf.constant([0, 2]), tf.constant([[2.0, 0.0, -1.0], [0.0, 1.0, 3.0]])
    plain = build_loss({"_target_": "my_losses.smoothed_crossentropy"}, PER_EXAMPLE)(y, logits).numpy()
    builtin = build_loss("sparse_categorical_crossentropy", PER_EXAMPLE)(y, logits).numpy()
    assert np.allclose(plain, builtin, atol=1e-6)
    smoothed = build_loss({"_target_": "my_losses.smoothed_crossentropy", "smoothing": 0.3}, PER_EXAMPLE)(y, logits)
    assert not np.allclose(smoothed.numpy(), builtin)


def test_a_loss_of_one_number_per_batch_is_refused_when_the_step_is_traced(tf):
    from runner.builders.loss import PER_EXAMPLE, build_loss

    loss = build_loss({"_target_": "my_losses.batch_mean_crossentropy"}, PER_EXAMPLE)
    step = tf.function(lambda y, p: loss(y, p))
    with pytest.raises(ConfigError, match=r"train.loss._target_='my_losses.batch_mean_crossentropy' gave one number"):
        step(tf.constant([0, 1]), tf.constant([[1.0, 0.0], [0.0, 1.0]]))


def test_the_probe_before_the_first_step_refuses_it_in_plain_python(tf):
    import tf_keras

    from runner.builders.loss import check_user_loss
    from runner.sources.in_memory import ArrayData

    model = tf_keras.Sequential([tf_keras.Input((3,)), tf_keras.layers.Dense(2)])
    x, y = np.zeros((4, 3), np.float32), np.array([0, 1, 1, 0])
    data = ArrayData(x, y, x, y, task="classification", num_classes=2)
    check_user_loss({"_target_": "my_losses.smoothed_crossentropy"}, model, data, tf_keras)  # per example: fine
    with pytest.raises(ConfigError, match="gave one number per batch"):
        check_user_loss({"_target_": "my_losses.batch_mean_crossentropy"}, model, data, tf_keras)
    with pytest.raises(ConfigError) as err:  # raises on the data's own first examples: named, nothing trained
        check_user_loss({"_target_": "my_losses.raising_loss"}, model, data, tf_keras)
    assert str(err.value).startswith("train.loss._target_='my_losses.raising_loss' failed on the model's output")
    assert "ValueError: labels and outputs disagree" in str(err.value)


@pytest.mark.parametrize(
    "spec, said",
    [
        ({"_target_": "my_lossez.focal"}, "cannot be imported (no module named 'my_lossez')"),
        ({"_target_": "my_losses.focal"}, "my_losses has no attribute 'focal'"),
        ({"_target_": "tf_keras.losses.Huber", "deltaa": 1.0}, "does not accept the arguments ['deltaa']"),
        ({"_target_": "tf_keras.metrics.Mean"}, "gave Mean, not a loss"),
        ({"_target_": "my_losses.smoothed_crossentropy", "smoothin": 0.1}, "does not accept the arguments ['smoothin']"),
        ({"_target_": "math.pi"}, "is a float, not a class or a function"),
        ({"_target_": "tf_keras.optimizers.SGD"}, "gave SGD, not a loss"),
    ],
)
def test_a_loss_that_cannot_be_built_is_one_paragraph_naming_the_key(tf, spec, said):
    from runner.builders.loss import PER_EXAMPLE, build_loss

    with pytest.raises(ConfigError) as err:
        build_loss(spec, PER_EXAMPLE)
    assert str(err.value).startswith(f"train.loss._target_={spec['_target_']!r}") and said in str(err.value)
    assert "\n" not in str(err.value)


def _optimizer_cfg(target, **kwargs):
    cfg = composed().train.optimizer
    cfg._target_, cfg.kwargs, cfg.learning_rate, cfg.weight_decay = target, kwargs or None, 0.2, 0.01
    cfg.schedule.name, cfg.schedule.warmup_steps = "cosine", 2
    return cfg


@pytest.mark.parametrize("flavour", ["tf_keras", "keras"])
def test_a_users_optimizer_gets_the_runners_schedule_weight_decay_and_its_own_arguments(tf, flavour):
    from runner.builders.optimizer import build_optimizer, learning_rate

    keras = _flavours()[flavour]
    cfg = _optimizer_cfg(f"{flavour}.optimizers.Lion", beta_1=0.8)
    optimizer = build_optimizer(cfg, False, 10, keras)
    assert isinstance(optimizer, keras.optimizers.Lion) and optimizer.beta_1 == 0.8
    assert optimizer.weight_decay == pytest.approx(0.01)
    schedule = keras.optimizers.schedules.deserialize(optimizer.get_config()["learning_rate"])  # the runner's schedule
    assert [float(schedule(s)) for s in (1, 5)] == pytest.approx([learning_rate(cfg, s, 10) for s in (1, 5)])


@pytest.mark.parametrize(
    "target, flavour, said",
    [
        ("keras.optimizers.Lion", "tf_keras", "not a tf_keras optimizer"),
        ("tf_keras.optimizers.Lion", "keras", "not a keras optimizer"),
        ("tf_keras.optimizers.legacy.SGD", "tf_keras", "not a tf_keras optimizer"),
        ("tf_keras.optimizers.Adam", "tf_keras", "does not accept the arguments"),
        ("tf_keras.optimizers.Lionn", "tf_keras", "has no attribute 'Lionn'"),
    ],
)
def test_an_optimizer_that_cannot_train_the_model_is_refused(tf, target, flavour, said):
    from runner.builders.optimizer import build_optimizer

    with pytest.raises(ConfigError) as err:
        extra = {"betaa_1": 0.9} if target.endswith("Adam") else {}
        build_optimizer(_optimizer_cfg(target, **extra), False, 10, _flavours()[flavour])
    assert str(err.value).startswith(f"train.optimizer._target_={target!r}") and said in str(err.value)


@pytest.mark.parametrize(
    "overrides, said",
    [
        ({"train.loss": {"delta": 0.5}}, "has no `_target_`"),
        ({"train.optimizer.kwargs": {"beta_1": 0.8}}, "train.optimizer._target_ is not set"),
        ({"train.optimizer._target_": "x.Y", "train.optimizer.kwargs": {"learning_rate": 0.1}}, "kwargs.learning_rate"),
        ({"train.optimizer._target_": "x.Y", "train.optimizer.kwargs": [1, 2]}, "is not a mapping"),
    ],
)
def test_the_shape_of_own_objects_is_checked_before_tensorflow(overrides, said):
    cfg = composed()
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value, merge=False)
    with pytest.raises(ConfigError) as err:
        validate.check_config(cfg)
    assert said in str(err.value)


def test_own_objects_compose_from_the_command_line():
    cfg = composed(
        "train.loss={_target_:my_losses.smoothed_crossentropy,smoothing:0.1}",
        "train.optimizer._target_=keras.optimizers.SGD",
        "train.optimizer.kwargs={momentum:0.5}",
    )
    validate.check_config(cfg)
    assert cfg.train.loss.smoothing == 0.1 and cfg.train.optimizer.kwargs.momentum == 0.5


def test_readmes_yaml_composes_and_validates():
    import re

    section = doc_section("Your own loss, metrics and optimizer")
    block = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    cfg = OmegaConf.merge(composed(), OmegaConf.create(block))
    validate.check_config(cfg)
    assert cfg.train.loss._target_ == "my_losses.smoothed_crossentropy" and cfg.train.optimizer.kwargs.beta_1 == 0.95
    assert cfg.train.optimizer.schedule.kwargs.decay_rate == 0.5


def test_a_loss_of_several_numbers_per_example_is_refused(tf):
    from runner.builders.loss import PER_EXAMPLE, build_loss

    loss = build_loss({"_target_": "tf_keras.losses.mean_squared_error"}, PER_EXAMPLE)  # [batch, k] -> [batch]: fine
    assert loss(tf.zeros([2, 3]), tf.ones([2, 3])).shape == (2,)
    wide = build_loss({"_target_": "tensorflow.math.squared_difference"}, PER_EXAMPLE)  # [batch, k] stays
    with pytest.raises(ConfigError, match=r"gave losses of shape \[2, 3\], not one loss per example"):
        wide(tf.zeros([2, 3]), tf.ones([2, 3]))


def test_fit_gets_keras_default_mean_whatever_reduction_the_node_gives(tf):
    from runner.builders.loss import build_loss

    y, p = tf.constant([[0.0], [1.0]]), tf.constant([[1.0], [3.0]])
    loss = build_loss({"_target_": "tf_keras.losses.MeanSquaredError", "reduction": "sum"})
    assert float(loss(y, p)) == pytest.approx(2.5)  # the mean of 1 and 4, not their sum


def test_locate_finds_a_packages_function_before_its_submodule_and_names_the_missing_module(tmp_path, monkeypatch):
    from runner.builders.targets import locate

    (tmp_path / "pk").mkdir()
    (tmp_path / "pk" / "__init__.py").write_text("from .resnet import resnet\n")
    (tmp_path / "pk" / "resnet.py").write_text("def resnet():\n    return 1\n")
    (tmp_path / "broken.py").write_text("import no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert locate("pk.resnet")() == 1  # the function, as Hydra finds it, not the module
    with pytest.raises(ImportError, match="No module named 'no_such_dependency'"):
        locate("broken.f")
    with pytest.raises(ImportError, match="pk has no attribute 'nothing'"):
        locate("pk.nothing")


def test_a_keras3_users_optimizer_that_clips_is_named_for_the_refusal(tf):
    import keras

    from runner.builders.keras_flavor import optimizer_clipping

    clipping = optimizer_clipping(keras.optimizers.SGD(global_clipnorm=1.0), "keras.optimizers.SGD")
    assert clipping == "train.optimizer._target_=keras.optimizers.SGD with global_clipnorm=1.0"
    assert optimizer_clipping(keras.optimizers.SGD(), "keras.optimizers.SGD") is None


def test_early_stopping_on_accuracy_with_a_users_loss_is_refused_before_tensorflow():
    cfg = composed("train.loss={_target_:my_losses.smoothed_crossentropy}", "train.early_stopping.patience=2")
    cfg.train.early_stopping.monitor = "eval/accuracy"
    with pytest.raises(ConfigError, match="a user's loss is evaluated as eval/loss only"):
        validate.check_config(cfg)
