"""runner/executors/checkpoints.py restoring in process: intact checkpoints of a model of another shape are named as such (kept,
never called damaged), and checkpoints that really cannot be read are (docs/reliability.md, "Stranding")."""

import os

import pytest
from omegaconf import OmegaConf

from runner.errors import ConfigError

os.environ["TF_USE_LEGACY_KERAS"] = "1"
pytestmark = pytest.mark.slow  # imports TensorFlow in process (seconds)


def _checkpoints(directory, hidden_units, model_keys="", run_dir=None):
    import tf_keras

    from runner.executors.checkpoints import Checkpoints
    from runner.models import mlp

    model = mlp((20,), 3, hidden_units)
    optimizer = tf_keras.optimizers.SGD(0.1)
    optimizer.build(model.trainable_variables)
    return Checkpoints(str(directory), True, 3, model, optimizer, model_keys=model_keys, run_dir=run_dir)


def test_checkpoints_of_a_model_of_another_shape_are_called_intact_and_kept(tmp_path):
    from runner.experiment import _model_keys

    run_dir = tmp_path / "run"
    ckpts = run_dir / "checkpoints"
    first = _checkpoints(ckpts, [64, 64])
    first.save(2)
    first.save(4)
    (run_dir / ".hydra").mkdir()
    (run_dir / ".hydra" / "overrides.yaml").write_text("- train.epochs=3\n- resume=x\n- model.hidden_units=[128,128,128]\n")
    before = {p.name: p.read_bytes() for p in ckpts.iterdir()}
    keys = _model_keys(OmegaConf.create({"model": {"_target_": "runner.models.mlp", "hidden_units": [128, 128, 128]}}))
    assert keys == "model.hidden_units=[128,128,128]"
    with pytest.raises(ConfigError) as refused:
        _checkpoints(ckpts, [128, 128, 128], keys, str(run_dir)).restore()
    message = str(refused.value)
    assert f"the checkpoints in {ckpts} are intact, but a model of another shape wrote them" in message
    assert "has shape (64,) there and (128,) in the model this run builds" in message  # TensorFlow's variable and shapes
    assert "this run's model: model.hidden_units=[128,128,128]" in message
    assert f"leave the model keys (model=, model.*) out, since resume={run_dir} alone brings back the first run's" in message
    assert "leave resume= out" in message and "damaged" not in message and "Move" not in message
    assert {p.name: p.read_bytes() for p in ckpts.iterdir()} == before  # nothing moved, nothing rewritten
    assert _checkpoints(ckpts, [64, 64]).restore() == 4  # the same model resumes from them


def test_checkpoints_that_cannot_be_read_are_called_damaged(tmp_path):
    first = _checkpoints(tmp_path, [8])
    first.save(2)
    for data in tmp_path.glob("ckpt-2.data-*"):
        with open(data, "r+b") as f:
            f.truncate(data.stat().st_size // 2)
    with pytest.raises(ConfigError, match=r"no checkpoint in .* can be read: ckpt-2 \(IndexError.*Move the damaged ckpt-\*"):
        _checkpoints(tmp_path, [8]).restore()


def test_a_checkpoint_that_restores_only_part_of_the_model_is_refused(tmp_path):
    """The same architecture in Keras 3 tracks its layers under other names: TensorFlow restores nothing into it and
    says nothing. The runner refuses, naming the variables left without a value (never their values)."""
    import keras
    import tensorflow as tf

    from runner.executors.checkpoints import Checkpoints

    first = _checkpoints(tmp_path, [8])
    first.save(2)
    model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)])
    before = [v.numpy().copy() for v in model.weights]
    optimizer = keras.optimizers.SGD(0.1)
    optimizer.build(model.trainable_variables)
    with pytest.raises(ConfigError) as refused:
        Checkpoints(str(tmp_path), True, 3, model, optimizer).restore()
    message = str(refused.value)
    assert f"the checkpoints in {tmp_path} are intact, but a model of the other Keras" in message
    assert "of this run's variables get no value from it (" in message and "so training would start from fresh" in message
    assert "dense" in message and "value=" not in message and "numpy=" not in message and "\n" not in message
    assert all((a == v.numpy()).all() for a, v in zip(before, model.weights))  # nothing half-restored went on training
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-2")  # kept
    assert _checkpoints(tmp_path, [8]).restore() == 2  # the model that wrote it resumes from it


def test_a_checkpoint_index_of_garbage_is_set_aside_and_the_files_decide(tmp_path, caplog):
    first = _checkpoints(tmp_path, [8])
    first.save(2)
    first.save(4)
    garbage = bytes(range(128, 256)) * 3  # not UTF-8: TensorFlow's reader raised UnicodeDecodeError from the manager
    (tmp_path / "checkpoint").write_bytes(garbage)
    assert _checkpoints(tmp_path, [8]).restore() == 4
    assert (tmp_path / "checkpoint.damaged").read_bytes() == garbage  # kept
    assert "ckpt-4" in (tmp_path / "checkpoint").read_text()  # a good index again
    assert "cannot be read (UnicodeDecodeError" in caplog.text
