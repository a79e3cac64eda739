"""train.optimizer: weight decay and the learning-rate schedule (runner.builders.optimizer).

The schedule's Python formula (the train/learning_rate metric) is checked against the rate a real tf_keras update
applies, step by step; the config keys are checked where they fail (before TensorFlow, exit 2)."""

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from runner.builders.optimizer import learning_rate
from runner.config import validate
from runner.errors import ConfigError

from helpers import composed


def optimizer_cfg(name="constant", warmup=0, decay=None, final=0.0, lr=0.1, optimizer="sgd", weight_decay=None):
    cfg = composed().train.optimizer
    cfg.name, cfg.learning_rate, cfg.weight_decay = optimizer, lr, weight_decay
    cfg.schedule.name, cfg.schedule.warmup_steps, cfg.schedule.decay_steps = name, warmup, decay
    cfg.schedule.final_fraction = final
    return cfg


def test_warmup_then_cosine_by_hand():
    cfg = optimizer_cfg("cosine", warmup=4, decay=10, final=0.1, lr=1.0)
    rates = [learning_rate(cfg, s, total_steps=100) for s in (0, 2, 4, 9, 14, 50)]
    assert rates == pytest.approx([0.0, 0.5, 1.0, 0.1 + 0.9 * 0.5, 0.1, 0.1])


def test_linear_decays_over_the_rest_of_the_run_by_default():
    cfg = optimizer_cfg("linear", warmup=0, lr=2.0)
    assert [learning_rate(cfg, s, total_steps=8) for s in (0, 4, 8, 20)] == pytest.approx([2.0, 1.0, 0.0, 0.0])


@pytest.mark.slow  # imports TensorFlow
@settings(max_examples=10, deadline=None)
@given(
    name=st.sampled_from(["constant", "cosine", "linear"]),
    warmup=st.integers(0, 5),
    decay=st.one_of(st.none(), st.integers(1, 6)),
    final=st.floats(0, 1),
    flavor=st.sampled_from(["tf_keras", "keras"]),
)
def test_the_logged_rate_is_the_rate_each_update_applies(name, warmup, decay, final, flavor):
    """Plain SGD on loss = w from w = 0: each update moves w by exactly the learning rate (w is reset before each, so
    float32 rounding of a growing w cannot hide a small rate); the k-th update used step k-1. With tf_keras' optimizer
    and with Keras 3's (a Keras 3 model's, runner.builders.keras_flavor)."""
    import importlib

    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import tensorflow as tf

    from runner.builders.optimizer import build_optimizer

    keras = importlib.import_module(flavor)
    total = 10
    cfg = optimizer_cfg(name, warmup, decay, final, lr=0.5)
    optimizer = build_optimizer(cfg, total_steps=total, keras=keras)
    w = tf.Variable(0.0) if flavor == "tf_keras" else keras.Variable(0.0)
    moves = []
    for _ in range(total + 2):
        w.assign(0.0)
        optimizer.apply_gradients([(tf.constant(1.0), w)])
        moves.append(-np.asarray(w.numpy()))
    expected = [learning_rate(cfg, k, total) for k in range(total + 2)]
    np.testing.assert_allclose(moves, expected, rtol=1e-5, atol=1e-7)


@pytest.mark.slow  # imports TensorFlow
def test_adamw_decays_weights_and_a_scheduled_fit_model_loads_again(tmp_path):
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import tf_keras

    from runner.builders.optimizer import build_optimizer

    adamw = build_optimizer(optimizer_cfg(optimizer="adamw"))
    assert type(adamw).__name__ == "AdamW" and adamw.weight_decay == pytest.approx(0.004)  # Keras' default
    sgd = build_optimizer(optimizer_cfg(optimizer="sgd", weight_decay=0.01))
    assert sgd.weight_decay == pytest.approx(0.01)
    # Model.fit compiles: model.keras then holds the optimizer and its schedule. A cosine one is tf_keras' own and
    # loads, compiled, in a process that never imported the runner; the linear one after a warm-up loads once
    # runner.builders.lr_schedule is imported. With compile=False (the MLflow model's way) both load anywhere.
    probe = (
        "import sys, tf_keras; sys.argv[2:] and __import__(sys.argv[2]); m = tf_keras.models.load_model(sys.argv[1]);"
        " print(m.optimizer.get_config()['learning_rate']['class_name'], m.count_params())"
    )
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
    for kind, imports, class_name in (("cosine", [], "CosineDecay"), ("linear", ["runner.builders.lr_schedule"], "WarmupLinear")):
        model = tf_keras.Sequential([tf_keras.Input((3,)), tf_keras.layers.Dense(1)])
        model.compile(optimizer=build_optimizer(optimizer_cfg(kind, warmup=2), total_steps=5), loss="mse")
        model.fit(np.ones((8, 3)), np.ones((8, 1)), epochs=1, verbose=0)
        path = tmp_path / f"{kind}.keras"
        model.save(path)
        argv = [sys.executable, "-c", probe, str(path), *imports]
        out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        assert class_name in out.stdout and out.stdout.split()[-1] == "4", out.stdout


@pytest.mark.parametrize(
    "key, value, said",
    [
        ("train.optimizer.schedule.name", "cosin", "train.optimizer.schedule.name"),
        ("train.optimizer.schedule.final_fraction", 1.5, "train.optimizer.schedule.final_fraction"),
        ("train.optimizer.schedule.warmup_steps", -1, "train.optimizer.schedule.warmup_steps"),
        ("train.optimizer.weight_decay", -0.1, "train.optimizer.weight_decay"),
        ("train.optimizer.name", "adam_w", "adamw"),
    ],
)
def test_bad_settings_are_refused_before_tensorflow(key, value, said):
    cfg = composed()
    OmegaConf.update(cfg, key, value, merge=False)
    with pytest.raises(ConfigError) as err:
        validate.check_config(cfg)
    assert said in str(err.value)


def own_schedule_cfg(target, kwargs, optimizer_target=None):
    cfg = optimizer_cfg(lr=0.5)
    cfg.schedule._target_, cfg.schedule.kwargs = target, kwargs
    if optimizer_target:
        cfg._target_ = optimizer_target
    return cfg


@pytest.mark.parametrize("flavor", ["tf_keras", "keras"])
def test_ones_own_schedule_is_what_each_update_applies_and_what_is_logged(flavor):
    """train.optimizer.schedule._target_ (a Keras LearningRateSchedule class, with its kwargs): SGD on loss = w moves w
    by the rate of ExponentialDecay's formula, the k-th update at step k-1, and the logged rate (scheduled) is the same;
    train.optimizer.learning_rate (0.5 here) does not apply."""
    import importlib

    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import tensorflow as tf

    from runner.builders.optimizer import build_optimizer, scheduled

    keras = importlib.import_module(flavor)
    kwargs = {"initial_learning_rate": 0.2, "decay_steps": 3, "decay_rate": 0.5}
    for cfg in (
        own_schedule_cfg(f"{flavor}.optimizers.schedules.ExponentialDecay", kwargs),
        own_schedule_cfg(f"{flavor}.optimizers.schedules.ExponentialDecay", kwargs, f"{flavor}.optimizers.SGD"),
    ):
        optimizer = build_optimizer(cfg, total_steps=10, keras=keras)
        w = tf.Variable(0.0) if flavor == "tf_keras" else keras.Variable(0.0)
        moves = []
        for _ in range(6):
            w.assign(0.0)
            optimizer.apply_gradients([(tf.constant(1.0), w)])
            moves.append(-float(np.asarray(w.numpy())))
        expected = [0.2 * 0.5 ** (k / 3) for k in range(6)]
        np.testing.assert_allclose(moves, expected, rtol=1e-5)
        logged = scheduled(cfg, 10, keras)
        np.testing.assert_allclose([logged(step - 1) for step in range(1, 7)], expected, rtol=1e-6)


@pytest.mark.parametrize(
    "target, kwargs, flavor, said",
    [
        ("tf_keras.optimizers.schedules.ExponentialDecayy", {}, "tf_keras", "cannot be imported"),
        (
            "tf_keras.optimizers.schedules.ExponentialDecay",
            {"initial_rate": 0.1},
            "tf_keras",
            "does not accept the arguments ['initial_rate']",
        ),
        (
            "keras.optimizers.schedules.CosineDecay",
            {"initial_learning_rate": 0.1, "decay_steps": 5},
            "tf_keras",
            "a schedule of keras, not a tf_keras LearningRateSchedule",
        ),
        ("tf_keras.optimizers.SGD", {}, "tf_keras", "not a tf_keras LearningRateSchedule"),
        (
            "tf_keras.optimizers.schedules.PiecewiseConstantDecay",
            {"boundaries": [2], "values": [-0.1, 0.1]},
            "tf_keras",
            "gives a learning rate of -0.1",
        ),
    ],
)
def test_a_schedule_that_cannot_be_used_is_one_paragraph_naming_the_key(target, kwargs, flavor, said):
    import importlib

    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    from runner.builders.optimizer import build_optimizer

    cfg = own_schedule_cfg(target, kwargs)
    with pytest.raises(ConfigError) as err:
        build_optimizer(cfg, keras=importlib.import_module(flavor))
    assert said in str(err.value) and "train.optimizer.schedule._target_=" in str(err.value)


@pytest.mark.parametrize(
    "overrides, said",
    [
        (["train.optimizer.schedule.kwargs={decay_steps:3}"], "train.optimizer.schedule._target_ is not set"),
        (["train.optimizer.schedule._target_=x.Y", "train.optimizer.schedule.kwargs=[1]"], "is not a mapping"),
        (
            ["train.optimizer.schedule._target_=x.Y", "train.optimizer.schedule.warmup_steps=5"],
            "schedule.warmup_steps=5 is a key of the built-in",
        ),
        (
            ["train.optimizer.schedule._target_=x.Y", "train.optimizer.schedule.name=cosine"],
            "leave train.optimizer.schedule.name out",
        ),
    ],
)
def test_the_shape_of_ones_own_schedule_is_checked_before_tensorflow(overrides, said):
    with pytest.raises(ConfigError) as err:
        validate.check_config(composed(*overrides))
    assert said in str(err.value)


def test_a_schedule_of_python_math_on_its_step_is_refused_before_the_step_traces_it(tmp_path, monkeypatch):
    (tmp_path / "my_schedules.py").write_text(
        "import math, tf_keras\n"
        "class Mathy(tf_keras.optimizers.schedules.LearningRateSchedule):\n"
        "    def __call__(self, step):\n        return 0.1 * math.exp(-float(step) / 100)\n"
        "    def get_config(self):\n        return {}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    from runner.builders.optimizer import build_optimizer

    with pytest.raises(ConfigError, match="works on a plain step but fails inside the traced training step"):
        build_optimizer(own_schedule_cfg("my_schedules.Mathy", {}))
