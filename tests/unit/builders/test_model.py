"""model=keras_app with a model.weights file that is not weights (text, random bytes, an HDF5 file of something else,
one cut short, weights of another architecture), and a model.resize_to too large for memory (docs/reliability.md,
"Bad input beyond the matrix"). Before: TensorFlow's OSError / ResourceExhaustedError traceback, exit 1.

The file checks run before TensorFlow (in process, fast); weights of another architecture and the memory the built
model's layers need are found once it is built (in process with TensorFlow: slow); each case once through
`python -m runner` (slow)."""

import os

import h5py
import numpy as np
import pytest
from omegaconf import OmegaConf

from runner.config import schema
from runner.errors import ConfigError
from runner.preflight import needs
from runner.sources import checks

from helpers import assert_refused_run_deleted, composed

schema.register()
OmegaConf.register_new_resolver("runner.or", lambda a, b: a or b, replace=True)
EXPERIMENT = "keras-app-inputs"
DIGITS = ["model=keras_app", "data=digits", "model.resize_to=[32,32]", "+model.alpha=0.35"]


def other_architecture(path):
    """Keras HDF5 weights (as save_weights writes them) of one Dense layer, written with h5py alone."""
    with h5py.File(path, "w") as f:
        f.attrs["layer_names"] = [b"dense"]
        f.attrs["backend"] = b"tensorflow"
        f.attrs["keras_version"] = b"2.21.0"
        group = f.create_group("dense")
        group.attrs["weight_names"] = [b"dense/kernel:0", b"dense/bias:0"]
        group["dense/kernel:0"] = np.zeros((4, 3), "float32")
        group["dense/bias:0"] = np.zeros((3,), "float32")
    return path


def not_weights(kind, path):
    if kind == "text":
        path.write_text("these are not weights\n")
    elif kind == "random bytes":
        path.write_bytes(os.urandom(20000))
    elif kind == "HDF5 without weights":
        with h5py.File(path, "w") as f:
            f["x"] = np.arange(3)
    elif kind == "HDF5 cut short":
        data = other_architecture(path).read_bytes()
        path.write_bytes(data[: len(data) // 2])
    return path


@pytest.mark.parametrize(
    "kind,needle",
    [
        ("text", "it is not an HDF5 file (it starts with b'these are not we'"),
        ("random bytes", "it is not an HDF5 file"),
        ("HDF5 without weights", "holds no Keras weights"),
        ("HDF5 cut short", "HDF5 cannot read it"),
    ],
)
def test_a_weights_file_that_is_not_weights_is_refused_before_tensorflow(kind, needle, tmp_path):
    path = not_weights(kind, tmp_path / "backbone_notop.h5")
    cfg = composed(*DIGITS, f"model.weights={path}")
    with pytest.raises(ConfigError) as err:
        needs.model_weights_exist(cfg)
    message = str(err.value)
    assert message.startswith(f"model.weights={path} is not a weights file: ") and needle in message, message
    assert "model.weights=null" in message and "\n" not in message


def test_keras_weights_files_pass_the_file_check(tmp_path):
    """Whether they fit the application is the builder's question (below)."""
    needs.model_weights_exist(composed(*DIGITS, f"model.weights={other_architecture(tmp_path / 'w.h5')}"))


def test_resized_images_that_cannot_fit_are_refused_before_tensorflow(monkeypatch):
    monkeypatch.setattr(checks, "available_memory", lambda: 16 * 2**30)
    cfg = composed("model=keras_app", "data=digits", "model.resize_to=[20000,20000]")
    with pytest.raises(ConfigError) as err:
        needs.resized_images_fit(cfg)
    message = str(err.value)
    assert "model.resize_to=[20000, 20000] would need at least 95.4 GiB" in message, message
    assert "64 examples of train.global_batch_size" in message and "16.0 GiB available" in message
    assert "ResourceExhaustedError" in message
    needs.resized_images_fit(composed("model=keras_app", "data=digits", "model.resize_to=[224,224]"))
    # resized inside the model: with 4 micro-batches a quarter of the batch is resized at a time
    monkeypatch.setattr(checks, "available_memory", lambda: 8 * 2**30)
    big = ("model=keras_app", "data=digits", "model.resize_to=[20000,20000]", "train.global_batch_size=16")
    with pytest.raises(ConfigError, match=r"\(16 examples of train.global_batch_size x"):
        needs.resized_images_fit(composed(*big))
    with pytest.raises(ConfigError, match=r"\(4 examples of train.global_batch_size / train.accumulation_steps=4 x"):
        needs.resized_images_fit(composed(*big, "train.accumulation_steps=4", "model.resize_to=[40000,40000]"))
    needs.resized_images_fit(composed(*big, "train.accumulation_steps=4"))  # 6.0 GiB at a time


# --- built in process (TensorFlow) -------------------------------------------------------------------------------
def _build(*overrides, input_shape=(64,), num_outputs=10):
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    from runner.builders.model import build_model

    cfg = composed(*overrides)
    return build_model(cfg.model, input_shape, num_outputs, cfg.train.global_batch_size, cfg.train.accumulation_steps)


@pytest.mark.slow  # imports TensorFlow in process
def test_weights_of_another_architecture_name_the_file_and_what_it_must_hold(tmp_path):
    import tf_keras

    empty = tmp_path / "empty.h5"
    empty.write_bytes(b"")
    wide = tmp_path / "mobilenetv2_1.0_notop.h5"  # the same application, alpha=1.0, into alpha=0.35
    tf_keras.applications.MobileNetV2(include_top=False, weights=None, input_shape=(32, 32, 1), pooling="avg").save_weights(wide)
    for path, needles in (
        (wide, ["Shape mismatch"]),
        (other_architecture(tmp_path / "dense.h5"), ["Layer count mismatch", "found 1 saved layers"]),
        (empty, ["(OSError)"]),  # the file check leaves an empty file to the load
    ):
        with pytest.raises(ConfigError) as err:
            _build(*DIGITS, f"model.weights={path}")
        message = str(err.value)
        assert message.startswith(f"model.weights={path} cannot be loaded into tf_keras.applications.MobileNetV2("), message
        assert "alpha=0.35" in message and "32x32x1 input" in message and "1-channel input" in message
        assert all(n in message for n in needles), message


@pytest.mark.slow
def test_layers_that_cannot_fit_are_refused_once_built_with_the_estimate(monkeypatch):
    monkeypatch.setattr(checks, "available_memory", lambda: 64 * 2**20)
    with pytest.raises(ConfigError) as err:
        _build("model=keras_app", "data=digits", "model.resize_to=[128,128]", "+model.alpha=0.35")
    message = str(err.value)
    assert "model=keras_app (tf_keras.applications.MobileNetV2) with model.resize_to=[128, 128] would need at least" in message
    assert "per example, x 64 example(s) of train.global_batch_size=64" in message and "64 MiB available" in message
    assert "Use a smaller model.resize_to" in message, message
    assert "or train.accumulation_steps=" in message, message  # the same global batch, in micro-batches that fit
    with pytest.raises(ConfigError) as err:  # counted per micro-batch: 16 of the 64 examples at a time
        _build("model=keras_app", "data=digits", "model.resize_to=[128,128]", "+model.alpha=0.35", "train.accumulation_steps=4")
    assert "x 16 example(s) of train.global_batch_size=64 (one of train.accumulation_steps=4 micro-batches)" in str(err.value)
    _build("model=mlp")  # a small model still builds


# --- through `python -m runner` ---------------------------------------------------------------------------------
@pytest.mark.slow  # end to end: `python -m runner`, two cases through TensorFlow
def test_each_case_is_one_paragraph_through_the_cli(runner, tmp_path):
    fast = ["train.epochs=1", "train.steps_per_epoch=2", f"mlflow.experiment_name={EXPERIMENT}"]
    cases = {
        "weights-text": ([*DIGITS, f"model.weights={not_weights('text', tmp_path / 'a.h5')}"], "is not a weights file", None),
        "weights-random": ([*DIGITS, f"model.weights={not_weights('random bytes', tmp_path / 'b.h5')}"], "not an HDF5", None),
        "weights-other-architecture": (
            [*DIGITS, f"model.weights={other_architecture(tmp_path / 'c.h5')}"],
            "cannot be loaded into tf_keras.applications.MobileNetV2",
            "deleted",
        ),
        "resize-input-too-large": (
            ["model=keras_app", "data=digits", "model.resize_to=[20000,20000]", "train.global_batch_size=1024"],
            "would need at least 1,525.9 GiB",
            None,
        ),
        "resize-layers-too-large": (
            [*DIGITS[:2], "+model.alpha=0.35", "model.resize_to=[16384,16384]", "train.global_batch_size=1"],
            "would need at least",
            "deleted",
        ),
    }
    results = runner.many({name: [*args, *fast] for name, (args, _, _) in cases.items()}, timeout=240)
    for name, (_, needle, status) in cases.items():
        result = results[name]
        assert result.returncode == 2, (name, result.output[-3000:])
        assert "Traceback" not in result.output and "ResourceExhaustedError:" not in result.output, result.output[-3000:]
        assert "Epoch 1/" not in result.output and "step 1/" not in result.output
        errors = [p for p in result.stderr.split("\n\n") if p.strip()]
        assert len(errors) == 1 and errors[0].startswith("Error: ") and needle in errors[0], (name, result.stderr[-3000:])
        if status is None:
            assert "MLflow run" not in result.output, name  # refused before TensorFlow, and before any run
        else:  # refused once TensorFlow was up: the run created for it is deleted
            assert_refused_run_deleted(runner.uri, EXPERIMENT, name, result, needle)


@pytest.mark.slow  # imports TensorFlow and Keras 3 in process
def test_a_keras3_model_is_refused_where_it_is_not_trained(monkeypatch):
    """Built like a tf_keras model; refused with executor=fit under MultiWorkerMirroredStrategy and with mixed
    precision, in one paragraph that names the combination, the Keras error it avoids and the way out
    (tests/e2e/test_keras3.py: trained and refused end to end)."""
    import tensorflow as tf

    from runner.builders.keras_flavor import check_keras3

    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(__file__), "..", "..", "user_project"))
    from runner.builders.model import activation_bytes

    model = _build("model._target_=my_models.keras3_mlp")
    assert type(model).__module__.startswith("keras.") and model.built
    assert activation_bytes(model) == (4 * (64 + 64 + 10), 3)  # model=mlp's [64, 64]: the memory check reads Keras 3 too
    target, strategy = "my_models.keras3_mlp", tf.distribute.get_strategy()
    for executor in ["custom_loop", "fit"]:
        check_keras3(model, target, strategy, executor, mixed_precision=False)  # trained: no refusal
    # only its class is looked at: not constructed (that would start collective ops in this process)
    multi_worker = object.__new__(tf.distribute.MultiWorkerMirroredStrategy)
    for executor, mixed, on, says in [
        ("fit", False, multi_worker, ["with executor=fit under strategy=multi_worker_mirrored:", "keras-team/keras#20585"]),
        ("custom_loop", True, strategy, ["with train.mixed_precision=true:", "Set train.mixed_precision=false"]),
    ]:
        with pytest.raises(ConfigError) as err:
            check_keras3(model, target, on, executor, mixed_precision=mixed)
        message = str(err.value)
        assert message.startswith("model._target_='my_models.keras3_mlp' returned a Keras 3 model (keras."), message
        assert all(s in message for s in says) and "import tf_keras as keras" in message, message
        assert message.endswith("nothing was trained.") and "\n" not in message
