"""runner.sources.checks, beyond the cases test_validate.py draws: what passes, each kind of array it refuses,
custom array names in messages, and the memory estimates. NumPy only."""

import numpy as np
import pytest

from runner.errors import ConfigError
from runner.sources import checks
from runner.sources.in_memory import ArrayData

WHERE = "data.path='d.npz'"
X = np.zeros((8, 3), np.float32)
Y = np.arange(8) % 2


def refused(call, *args, **kwargs) -> str:
    with pytest.raises(ConfigError) as err:
        call(*args, **kwargs)
    message = str(err.value)
    assert "\n" not in message  # one paragraph
    return message


@pytest.mark.parametrize(
    "data",
    [
        ArrayData(X, Y, X[:2], Y[:2], task="classification"),
        ArrayData(X, Y.reshape(-1, 1), X, Y.reshape(-1, 1), task="classification", num_classes=2),
        ArrayData(X.astype(np.int64), Y.astype(np.uint8), X, Y.astype(np.uint8), task="classification"),
        ArrayData(X.astype(bool), Y, X.astype(bool), Y, task="classification"),
        ArrayData(np.zeros((8, 4, 4, 1), np.float16), Y, np.zeros((2, 4, 4, 1), np.float16), Y[:2], task="classification"),
        ArrayData(X, np.linspace(0, 1, 8), X, np.linspace(0, 1, 8), task="regression"),
        ArrayData(X, np.ones((8, 2), np.float32), X, np.ones((8, 2), np.float32), task="regression"),
    ],
    ids=["eval-smaller", "labels-n-by-1", "int-features", "bool-features", "images", "regression", "regression-2-outputs"],
)
def test_data_training_can_use_passes(data):
    checks.check_data(data, WHERE)


@pytest.mark.parametrize(
    "array,features,needles",
    [
        ([[1.0, 2.0]], True, ["x_train is a list, not a NumPy array"]),
        (np.array([[1, "a"]], dtype=object), True, ["holds object values (Python objects)", ".astype('float32')"]),
        (np.ones((3, 2), np.complex64), True, ["complex64 values (complex numbers)"]),
        (np.array(["2026-01-01"], dtype="datetime64[D]"), False, ["(dates)"]),
        (np.array(1.0, np.float32), True, ["is a single value (shape ())"]),
        (np.zeros((0, 3), np.float32), True, ["is empty (shape (0, 3))"]),
        (np.zeros(5, np.float32), True, ["has shape (5,)", "x.reshape(-1, 1)", "(5, 1)"]),
        (np.zeros((5, 0), np.float32), True, ["has shape (5, 0): its examples have no values"]),
        (np.array([[1.0, np.inf], [np.nan, 0.0]]), True, ["holds 2 non-finite value(s)", "the first inf at index [0, 1]"]),
    ],
    ids=["list", "objects", "complex", "dates", "scalar", "empty", "no-feature-axis", "zero-width", "nan-and-inf"],
)
def test_each_kind_of_bad_array_is_named(array, features, needles):
    message = refused(checks.check_array, array, "x_train", WHERE, features=features)
    assert message.startswith(WHERE), message
    for needle in needles:
        assert needle in message, message


def test_labels_need_no_feature_axis():
    checks.check_array(Y, "y_train", WHERE, features=False)


def test_pairs_of_equal_length_pass_and_the_longer_one_is_named():
    checks.check_pair(X, Y, "x_train", "y_train", WHERE)
    message = refused(checks.check_pair, X[:3], Y, "x_eval", "y_eval", WHERE)
    assert "'x_eval' has 3 examples but 'y_eval' has 8" in message and "'y_eval' is longer" in message


def test_messages_use_the_names_the_file_gives_its_arrays():
    names = {"x_train": "features", "y_train": "labels"}
    message = refused(checks.check_data, ArrayData(X, Y[:5], X, Y, task="classification"), WHERE, names)
    assert "'features' has 8 examples but 'labels' has 5" in message


def test_eval_labels_of_another_shape_are_refused():
    data = ArrayData(X, np.ones((8, 2), np.float32), X, np.ones((8, 3), np.float32), task="regression")
    assert "training and eval labels differ in shape" in refused(checks.check_data, data, WHERE)


def test_regression_targets_of_more_than_two_axes_are_refused():
    y = np.ones((8, 2, 2), np.float32)
    message = refused(checks.check_data, ArrayData(X, y, X, y, task="regression"), WHERE)
    assert "data.task=regression needs targets of shape (n,) or (n, outputs)" in message and "(8, 2, 2)" in message


def test_an_eval_label_past_the_classes_is_named_with_its_array():
    data = ArrayData(X, Y, X, Y + 5, task="classification", num_classes=2)
    assert "'y_eval' holds the label 6, but there are 2 classes (labels 0..1)" in refused(checks.check_data, data, WHERE)


def test_available_memory_is_positive_and_at_most_the_machines():
    available = checks.available_memory()
    with open("/proc/meminfo") as f:
        total = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
    assert 0 < available <= total


@pytest.mark.parametrize(
    "available,shown", [(2**30, "1.0 GiB available"), (100 * 2**20, "100 MiB available"), (3 * 2**31, "6.0 GiB available")]
)
def test_batch_memory_refused_only_past_what_is_available_and_says_what_fits(available, shown):
    per_example = checks.BATCH_COPIES * 1000 + checks.ACTIVATION_BYTES
    fits = available // per_example
    checks.check_batch_memory(fits, 1000, "data=npz", available=available)
    message = refused(checks.check_batch_memory, fits + 1, 1000, "data=npz", available=available)
    assert f"train.global_batch_size={fits + 1} would need about" in message and shown in message, message
    assert f"Use a global batch of at most ~{fits}." in message


def test_data_memory_refused_only_past_what_is_available():
    per_example = 80 * checks.DATA_COPIES
    checks.check_data_memory("data.num_examples", 1000, 1000, 80, "data=synthetic", available=1000 * per_example)
    message = refused(
        checks.check_data_memory, "data.num_examples", 1001, 1001, 80, "data=synthetic", available=1000 * per_example
    )
    assert message.startswith("data.num_examples=1001 would need about") and "Use at most ~1000 examples in all." in message


def test_memory_checks_use_this_machines_memory_when_not_told():
    checks.check_batch_memory(64, 80, "data=synthetic")  # a default run fits anywhere
    with pytest.raises(ConfigError, match="train.global_batch_size=10000000000000"):
        checks.check_batch_memory(10**13, 80, "data=synthetic")
