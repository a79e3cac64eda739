"""model=keras_app (tf_keras.applications by name) and a user's tf_keras.Model subclass named by `_target_`.

The config's refusals are checked without TensorFlow; the models are built in process from the composed config with
the runner's own builder and trained two steps (no subprocess: none is needed to build a model). The multi-replica
run of a BatchNorm model through `python -m runner` is README's keras_app example (tests/e2e/test_readme.py).
"""

import os

import numpy as np
import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from runner.config import schema
from runner.config.validate import check_config
from runner.errors import ConfigError
from runner.preflight import needs

from helpers import ROOT, composed, runner_imports

schema.register()
OmegaConf.register_new_resolver("runner.or", lambda a, b: a or b, replace=True)
USER = ROOT / "tests" / "user_project"
DIGITS = ["model=keras_app", "data=digits", "model.resize_to=[32,32]"]


# --- refused before TensorFlow ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides,needles",
    [
        (["model.weights=imagenet"], ["model.weights='imagenet' is not allowed", "downloads nothing", "local path"]),
        (["model.weights=IMAGENET"], ["model.weights='IMAGENET' is not allowed"]),
        (["model.resize_to=[32]"], ["model.resize_to=[32] must be [height, width]"]),
        (["model.resize_to=32"], ["model.resize_to=32 must be [height, width]"]),
        (["model.resize_to=[0,32]"], ["model.resize_to=[0, 32] must be"]),
        (["model.application=null"], ["model.application=None", "MobileNetV2"]),
        (["+model.include_top=true"], ["model.include_top is set by model=keras_app itself"]),
        (["+model.classifier_activation=softmax"], ["model.classifier_activation is set by model=keras_app"]),
        (["+model.name=ResNet50"], ["the application is model.application"]),
    ],
)
def test_bad_keras_app_config_is_refused_before_tensorflow(overrides, needles):
    with pytest.raises(ConfigError) as err:
        check_config(composed("model=keras_app", *overrides))
    for needle in needles:
        assert needle in str(err.value)


def test_weights_path_that_does_not_exist_is_refused_by_preflight(tmp_path):
    missing = tmp_path / "no_such_notop.h5"
    cfg = composed("model=keras_app", f"model.weights={missing}")
    check_config(cfg)  # a path is a valid value: whether it is there is the probe's question
    with pytest.raises(ConfigError, match="model.weights=.*no_such_notop.h5 is not a file here"):
        needs.model_weights_exist(cfg)
    missing.write_bytes(b"")
    needs.model_weights_exist(composed("model=keras_app", f"model.weights={missing}"))


def test_refusal_comes_from_the_cli_without_importing_tensorflow(tmp_path):
    proc, loaded = runner_imports(["model=keras_app", "model.weights=imagenet", f"hydra.run.dir={tmp_path}"], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "model.weights='imagenet' is not allowed" in proc.stderr
    assert loaded == []
    assert "MLflow run" not in proc.stdout + proc.stderr and not (tmp_path / "mlflow.db").exists()  # no run started


def test_keras_app_composes_and_help_lists_it():
    model = composed("model=keras_app").model
    assert model._target_ == "runner.models.keras_app" and model.application == "MobileNetV2" and model.weights is None
    from runner.config import helptext

    assert "model: cnn, keras_app, linear, mlp" in helptext.render()


# --- built and trained in process ------------------------------------------------------------------------------------
def _build(*overrides, input_shape=(64,), num_outputs=10):
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    from runner.builders.model import build_model

    return build_model(composed(*overrides).model, input_shape, num_outputs)


def _two_steps(model, input_shape=(64,), classes=10, optimizer=None):
    """Two training steps through Model.fit with the runner's loss and optimizer; the losses."""
    import tf_keras

    from runner.builders.loss import build_loss
    from runner.builders.optimizer import build_optimizer

    optimizer = optimizer or build_optimizer(composed().train.optimizer)
    # eager: the steps' maths without tracing each family's training graph (tens of seconds on 2 cores; the traced
    # path is README's keras_app run through the runner)
    model.compile(optimizer=optimizer, loss=build_loss("sparse_categorical_crossentropy"), run_eagerly=True)
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 16, (8, *input_shape)).astype("float32")
    y = rng.integers(0, classes, 8)
    tf_keras.utils.set_random_seed(0)
    return model.fit(x, y, batch_size=4, epochs=1, steps_per_epoch=2, verbose=0).history["loss"]


@pytest.mark.slow  # imports TensorFlow in process
@pytest.mark.parametrize(
    "name,extra",
    [("MobileNetV2", ["+model.alpha=0.35"]), ("ResNet50", []), ("EfficientNetB0", [])],
)
def test_each_family_builds_from_digits_shape_and_trains(name, extra):
    """8x8x1 digits (64 flat features) resized to 32x32, one channel, random weights: logits in float32."""
    import tf_keras

    model = _build(*DIGITS, f"model.application={name}", *extra)
    assert model.output_shape == (None, 10) and model.output.dtype == "float32"
    head = model.get_layer("logits")
    assert head.activation is tf_keras.activations.linear  # logits: the runner's losses are from_logits=True
    backbone = model.layers[-2]
    assert backbone.input_shape == (None, 32, 32, 1)
    assert any(isinstance(layer, tf_keras.layers.BatchNormalization) for layer in backbone.layers)
    if extra:
        assert backbone.name.startswith("mobilenetv2_0.35")  # alpha reached the application function
    losses = _two_steps(model)
    assert np.all(np.isfinite(losses)), losses


@pytest.mark.slow
def test_mixed_precision_keeps_float32_logits():
    import tf_keras

    tf_keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = _build(*DIGITS, "+model.alpha=0.35")
        assert model.layers[-2].compute_dtype == "float16"
        assert model.output.dtype == "float32"
    finally:
        tf_keras.mixed_precision.set_global_policy("float32")


@pytest.mark.slow
def test_weights_from_a_local_file_are_loaded(tmp_path):
    first = _build(*DIGITS, "+model.alpha=0.35")
    path = tmp_path / "mobilenetv2_notop.h5"
    first.layers[-2].save_weights(path)
    second = _build(*DIGITS, "+model.alpha=0.35", f"model.weights={path}")
    for a, b in zip(first.layers[-2].get_weights(), second.layers[-2].get_weights()):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ConfigError, match="for 3-channel input"):  # one channel's weights into an RGB model
        _build("model=keras_app", "+model.alpha=0.35", f"model.weights={path}", input_shape=(32, 32, 3))


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides,needles",
    [
        (["model=keras_app", "data=digits"], ["needs images of at least 32x32", "8x8", "model.resize_to=[32, 32]"]),
        ([*DIGITS, "model.application=InceptionV3"], ["at least 75x75", "model.resize_to=[75, 75]"]),
        ([*DIGITS, "model.application=MobileNetV9"], ["'MobileNetV9' is not a model function", "did you mean", "ResNet50"]),
        ([*DIGITS, "model.application=preprocess_input"], ["not a model function"]),
        ([*DIGITS, "+model.bogus=1"], ["tf_keras.applications.MobileNetV2(...) refused", "bogus"]),
    ],
)
def test_bad_keras_app_models_are_refused_when_built(overrides, needles):
    with pytest.raises(ConfigError) as err:
        _build(*overrides)
    for needle in needles:
        assert needle in str(err.value)


@pytest.mark.slow
def test_user_model_subclass_by_target_is_built_before_its_first_step(monkeypatch):
    """A tf_keras.Model subclass named by `_target_` (a class, not a function) has no variables until called: the
    runner builds it for the data's shape, so the optimizer and checkpoints see its variables before the first step
    (without that, both executors failed: 'The optimizer cannot recognize variable ...')."""
    monkeypatch.syspath_prepend(str(USER))
    with initialize_config_module(config_module="runner.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=["model=subclassed", f"hydra.searchpath=[file://{USER / 'conf'}]"])
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    from runner.builders.model import build_model
    from runner.builders.optimizer import build_optimizer

    model = build_model(cfg.model, (20,), 3)
    assert type(model).__name__ == "TinyNet" and model.built
    assert [v.shape.as_list() for v in model.trainable_variables] == [[20, 12], [12], [12, 3], [3]]  # width: 12
    optimizer = build_optimizer(cfg.train.optimizer)
    optimizer.build(model.trainable_variables)  # as runner/experiment.py does, inside the strategy's scope
    losses = _two_steps(model, input_shape=(20,), classes=3, optimizer=optimizer)
    assert np.all(np.isfinite(losses))
