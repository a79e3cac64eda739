"""train.metrics by `_target_` (runner.builders.metrics): each form a user can write gives the value Keras' own metric or
a NumPy computation gives; what cannot be measured is refused in one paragraph naming the entry, before the first step
(before TensorFlow where the config alone shows it). End to end: tests/e2e/test_training.py (a tf_keras metric in
every strategy x executor, per split and per replica) and tests/e2e/test_keras3.py (a user's function, multi-worker
too)."""

import os
import sys

import numpy as np
import pytest
from omegaconf import OmegaConf

from runner.config import validate
from runner.errors import ConfigError

from helpers import composed, doc_section

USER = os.path.join(os.path.dirname(__file__), "..", "..", "user_project")
TRUE_CLASS = {"_target_": "my_metrics.true_class_probability"}
TOP2 = {"_target_": "tf_keras.metrics.SparseTopKCategoricalAccuracy", "k": 2, "name": "top2"}


@pytest.fixture(scope="module")
def tf():
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    sys.path.insert(0, USER)
    import tensorflow

    yield tensorflow
    sys.path.remove(USER)


LOGITS = np.array([[2.0, 0.0, -1.0], [0.0, 1.0, 3.0], [1.0, 1.0, 0.0], [0.5, -0.5, 2.5]], np.float32)
LABELS = np.array([0, 1, 1, 2])


def _softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_each_form_measures_what_numpy_does(tf):
    from runner.builders.metrics import build_own, is_per_example

    def ranks(logits, labels):  # where the true class ranks, 0 = first
        return (logits > logits[np.arange(len(labels)), labels][:, None]).sum(axis=1)

    true_class, top2, by_function, scaled = build_own(
        [
            TRUE_CLASS,
            TOP2,
            {"_target_": "my_metrics.true_class_probability", "name": "p", "temperature": 2.0},
            {**TRUE_CLASS, "temperature": 2.0},
        ]
    )
    for metric in (true_class, top2, by_function, scaled):
        metric.update_state(LABELS, LOGITS)
    expected = _softmax(LOGITS)[np.arange(4), LABELS]
    assert float(true_class.result()) == pytest.approx(expected.mean(), rel=1e-6)
    assert float(top2.result()) == pytest.approx(np.mean(ranks(LOGITS, LABELS) < 2))
    halved = _softmax(LOGITS / 2)[np.arange(4), LABELS].mean()
    assert float(by_function.result()) == pytest.approx(halved, rel=1e-6) == float(scaled.result())
    assert [m.name for m in (true_class, top2, by_function, scaled)] == [
        "true_class_probability",
        "top2",
        "p",
        "true_class_probability",
    ]
    assert is_per_example(true_class) and is_per_example(top2)


def test_a_factory_returning_a_metric_or_a_function(tf, tmp_path, monkeypatch):
    (tmp_path / "my_factories.py").write_text(
        "import tf_keras\n"
        "def auc(curve):\n    return tf_keras.metrics.AUC(curve=curve, from_logits=True, name='auc_' + curve.lower())\n"
        "def error_of(scale):\n    def abs_error(y_true, y_pred):\n        return scale * abs(y_true - y_pred)[:, 0]\n"
        "    return abs_error\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from runner.builders.metrics import build_own

    auc, error = build_own([{"_target_": "my_factories.auc", "curve": "PR"}, {"_target_": "my_factories.error_of", "scale": 2.0}])
    assert auc.name == "auc_pr"
    error.update_state(np.array([[1.0], [0.0]], np.float32), np.array([[0.5], [0.5]], np.float32))
    assert error.name == "abs_error" and float(error.result()) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "spec, said",
    [
        (
            {"_target_": "my_metricz.auc"},
            "train.metrics[0]._target_='my_metricz.auc' cannot be imported (no module named 'my_metricz')",
        ),
        ({"_target_": "tf_keras.metrics.AUC", "curv": "PR"}, "does not accept the arguments ['curv']"),
        ({**TRUE_CLASS, "tau": 2.0}, "does not accept the arguments ['tau']"),
        ({"_target_": "keras.metrics.AUC"}, "a Keras 3 metric: the runner's metrics are tf_keras'"),
        ({"_target_": "tf_keras.losses.Huber"}, "gave Huber, not a metric"),
        ({"_target_": "math.pi"}, "is a float, not a class or a function"),
    ],
)
def test_a_metric_that_cannot_be_made_is_one_paragraph_naming_the_entry(tf, spec, said):
    from runner.builders.metrics import build_own

    with pytest.raises(ConfigError) as err:
        build_own([TOP2, spec])
    assert said.replace("[0]", "[1]") in str(err.value) and "train.metrics[1]" in str(err.value)
    assert "\n" not in str(err.value) and "Traceback" not in str(err.value)


def _probe(specs, monitor=None, loss="sparse_categorical_crossentropy", mode="auto"):
    import tf_keras

    from runner.builders.metrics import check_metrics
    from runner.sources.in_memory import ArrayData

    model = tf_keras.Sequential([tf_keras.Input((3,)), tf_keras.layers.Dense(3)])
    x, y = np.zeros((4, 3), np.float32), np.array([0, 1, 1, 2])
    check_metrics(specs, loss, model, ArrayData(x, y, x, y, task="classification", num_classes=3), monitor, mode=mode)


@pytest.mark.parametrize(
    "specs, monitor, said",
    [
        ([{"_target_": "my_metrics.batch_true_class_probability"}], None, "gave one number per batch, not one per example"),
        (
            [{"_target_": "tf_keras.metrics.SparseCategoricalAccuracy", "name": "accuracy"}],
            None,
            "which the built-in metric of this run already is",
        ),
        ([TOP2, {**TRUE_CLASS, "name": "top2"}], None, "train.metrics[1] is named 'top2', which train.metrics[0]"),
        ([{**TOP2, "name": "top/2"}], None, "a metric's name is one word"),
        ([{"_target_": "tf_keras.metrics.AUC", "from_logits": True}], None, "failed on the model's output for two examples"),
        ([TOP2], "eval/auc", "train.early_stopping.monitor=eval/auc is not among this run's evaluation metrics"),
        ([TOP2], "eval/top2", "train.early_stopping.mode=auto cannot tell whether it improves upwards"),
        ([{"_target_": "my_metrics.numpy_true_class_probability"}], None, "fails inside the traced training step"),
        ([{**TOP2, "name": "replica_losses"}], None, "which Model.fit's own per-replica losses key"),
        ([{**TOP2, "name": ".."}], None, "a metric's name is one word"),
    ],
)
def test_the_probe_before_the_first_step_refuses_what_cannot_be_logged(tf, specs, monitor, said):
    with pytest.raises(ConfigError) as err:
        _probe(specs, monitor)
    assert said in str(err.value) and "{{function_node" not in str(err.value)


def test_the_probe_passes_what_can_be_logged(tf):
    _probe([TRUE_CLASS, TOP2], "eval/top2", mode="max")
    _probe(
        [{**TOP2, "name": "accuracy"}], "eval/accuracy", loss={"_target_": "my_losses.smoothed_crossentropy"}
    )  # no built-in accuracy then


@pytest.mark.parametrize(
    "overrides, said",
    [
        (["train.metrics=[auc]"], "train.metrics[0]='auc' has no `_target_`"),
        (["train.metrics=[{from_logits:true}]"], "has no `_target_`"),
        (["train.metrics=mae"], "train.metrics='mae' is not a list"),
        (["train.metrics={_target_:tf_keras.metrics.AUC}"], "is not a list: give your metrics in brackets, even one"),
        (
            ["train.early_stopping.patience=2", "train.early_stopping.monitor=eval/top2"],
            "or eval/<name> of one of your own train.metrics",
        ),
    ],
)
def test_the_shape_of_train_metrics_is_checked_before_tensorflow(overrides, said):
    with pytest.raises(ConfigError) as err:
        validate.check_config(composed(*overrides))
    assert said in str(err.value)


def test_a_monitor_of_ones_own_metric_composes_and_validates_from_the_command_line():
    cfg = composed(
        "train.metrics=[{_target_:tf_keras.metrics.SparseTopKCategoricalAccuracy,k:2,name:top2},{_target_:my_metrics.true_class_probability}]",
        "train.early_stopping.patience=2",
        "train.early_stopping.monitor=eval/top2",
    )
    validate.check_config(cfg)
    assert OmegaConf.to_container(cfg.train.metrics)[0] == TOP2


def test_readmes_yaml_composes_and_validates():
    import re

    section = doc_section("Your own loss, metrics and optimizer")
    block = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    cfg = OmegaConf.merge(composed(), OmegaConf.create(block))
    validate.check_config(cfg)
    assert [m["_target_"] for m in cfg.train.metrics] == [TRUE_CLASS["_target_"], TOP2["_target_"]]


def test_metrics_with_accumulation_under_central_storage_are_refused(tf):
    """Over two replicas (two compute devices of one CPU: a real CentralStorageStrategy), a metric updated inside a
    loop in replica context is a merge_call TensorFlow refuses when the step is traced, so the runner refuses the
    combination before the first step; over one replica, and under other strategies, it is left alone."""
    from runner.builders.metrics import _check_strategy, build_own

    strategy = tf.distribute.experimental.CentralStorageStrategy(compute_devices=["/cpu:0", "/cpu:0"])
    with strategy.scope():
        metric = build_own([TOP2])[0]

    @tf.function
    def step():
        def replica():
            def body(i):
                metric.update_state(tf.constant(LABELS[:2]), tf.constant(LOGITS[:2]))
                return i + 1

            tf.while_loop(lambda i: i < 2, body, [tf.constant(0)])

        strategy.run(replica)

    with pytest.raises(RuntimeError, match="merge_call"):
        step()
    with pytest.raises(ConfigError, match="train.accumulation_steps=2 under CentralStorageStrategy over 2 replicas"):
        _check_strategy(strategy, 2)
    _check_strategy(strategy, 1)
    _check_strategy(tf.distribute.experimental.CentralStorageStrategy(), 2)  # one replica: no merge
    _check_strategy(tf.distribute.get_strategy(), 4)


def test_a_factory_of_a_function_takes_the_name_given_beside_it(tf, tmp_path, monkeypatch):
    factory = "import tf_keras\ndef top(k):\n    return tf_keras.metrics.SparseTopKCategoricalAccuracy(k=k)\n"
    (tmp_path / "my_tops.py").write_text(factory)
    monkeypatch.syspath_prepend(str(tmp_path))
    from runner.builders.metrics import build_own

    (sharp,) = build_own([{"_target_": "my_metrics.sharpened", "temperature": 0.5, "name": "sharp"}])
    sharp.update_state(LABELS, LOGITS)
    assert sharp.name == "sharp"
    assert float(sharp.result()) == pytest.approx(_softmax(LOGITS / 0.5)[np.arange(4), LABELS].mean(), rel=1e-6)
    with pytest.raises(ConfigError, match="does not take name='x' and gave SparseTopKCategoricalAccuracy"):
        build_own([{"_target_": "my_tops.top", "k": 2, "name": "x"}])
