"""Bad inputs beyond the matrix of tests/e2e/test_errors.py (issue 14): values out of range, malformed .npz data,
devices that do not exist, directories that cannot be written, batches that cannot fit in memory.

The contract: the run ends before its first step with ONE paragraph naming the key or file and the value, exit
1 (Hydra: type, unknown key) or 2 (ConfigError), no Python traceback, no MLflow run left RUNNING (one that was
created is FAILED with the error), and no process left behind. (a) checks the checks in-process, (b) draws bad
inputs with Hypothesis, and runs a bounded number of them through the real `python -m runner`.
"""

import json
import os
import tempfile
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from omegaconf import OmegaConf

from runner.builders.data.pipeline import build_data
from runner.config import schema
from runner.config.validate import validate
from runner.errors import ConfigError
from runner.sources import checks, in_memory

from helpers import assert_refused_run_deleted, composed, run_runner

schema.register()
OmegaConf.register_new_resolver("runner.or", lambda a, b: a or b, replace=True)
EXPERIMENT = "bad-inputs"


def assert_refused(cfg, *needles):
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    message = str(err.value)
    for needle in needles:
        assert needle in message, message
    assert "\n" not in message  # one paragraph
    return message


# --- (a) the checks themselves, in-process -------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides,needles",
    [
        (["train.optimizer.clipnorm=-1"], ["train.optimizer.clipnorm=-1.0 must be greater than 0", "or null (no clipping)"]),
        (["train.seed=-1"], ["train.seed=-1 must be between 0 and 4294967295"]),
        (["train.seed=4294967296"], ["train.seed=4294967296"]),
        (["mlflow.flush_every_sec=0"], ["mlflow.flush_every_sec=0.0 must be 1 or more", "slows training"]),
        (["data.num_examples=-5"], ["data.num_examples=-5 must be a positive integer"]),
        (["data=ones", "data.eval_examples=0"], ["data.eval_examples=0 must be a positive integer"]),
        (["data.num_classes=1"], ["data.num_classes=1 must be 2 or more"]),
        (["train.optimizer.learning_rate=nan"], ["train.optimizer.learning_rate=nan must be finite"]),
        (["train.optimizer.momentum=1.5"], ["train.optimizer.momentum=1.5"]),
        (["checkpoint.max_to_keep=0"], ["checkpoint.max_to_keep=0"]),
        (["checkpoint.every_n_steps=0"], ["checkpoint.every_n_steps=0 must be 1 or more, or null"]),
        (["data.shuffle_buffer=0"], ["data.shuffle_buffer=0", "data.shuffle=false"]),
        (["devices.gpus=[0,-1]"], ["devices.gpus=[0, -1] every element must be 0 or more"]),
        (["strategy=multi_worker_mirrored", "strategy.collective_timeout_sec=-3"], ["strategy.collective_timeout_sec=-3.0"]),
        (
            ["cross_device_ops=hierarchical_copy", "strategy=mirrored", "cross_device_ops.num_packs=-1"],
            ["cross_device_ops.num_packs=-1"],
        ),
        (["strategy=multi_worker_mirrored", "cluster=slurm", "cluster.port_base=70000"], ["cluster.port_base=70000", "TCP port"]),
        (
            ["strategy=parameter_server", "cluster=localhost", "cluster.ps=1", "strategy.variable_partitioner.num_shards=0"],
            ["strategy.variable_partitioner.num_shards=0"],
        ),
        (
            ["train.global_batch_size=1000000000", "train.steps_per_epoch=1"],
            ["train.global_batch_size=1000000000 would need about", "available"],
        ),
        (["data.num_examples=100000000000"], ["data.num_examples=100000000000 would need about", "available"]),
    ],
)
def test_values_out_of_range_are_refused_before_tensorflow(overrides, needles):
    assert_refused(composed(*overrides), *needles)


def test_every_numeric_schema_field_declares_a_range():
    import dataclasses
    import typing

    missing = []
    for kind in {k for options in schema.GROUP_SCHEMAS.values() for k in options.values()} | {
        schema.DevicesConfig,
        schema.TrainConfig,
        schema.OptimizerConfig,
        schema.MlflowConfig,
        schema.CheckpointConfig,
        schema.VariablePartitionerConfig,
    }:
        hints = typing.get_type_hints(kind)
        for f in dataclasses.fields(kind):
            if any(
                t in (int, float)
                for t in (
                    hints[f.name],
                    *typing.get_args(hints[f.name]),
                    *[a for t in typing.get_args(hints[f.name]) for a in typing.get_args(t)],
                )
            ):
                if "range" not in f.metadata:
                    missing.append(f"{kind.__name__}.{f.name}")
    assert not missing, missing


def test_directories_that_cannot_be_written_are_refused(tmp_path):
    regular = tmp_path / "a-file"
    regular.write_text("x")
    assert_refused(composed(f"checkpoint.dir={regular}/ckpt"), "checkpoint.dir", f"{regular}/ckpt", "is a file, not a directory")
    assert_refused(composed("checkpoint.dir=/proc/no-such-place/ckpt"), "checkpoint.dir", "/proc/no-such-place/ckpt")
    fresh = tmp_path / "new" / "deeper"
    validate(composed(f"checkpoint.dir={fresh}"))  # a directory that can be made is fine
    assert not (tmp_path / "new").exists()  # and the probe leaves nothing behind
    if os.geteuid() != 0:  # root writes into read-only directories
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o555)
        try:
            assert_refused(composed(f"checkpoint.dir={locked}"), "checkpoint.dir", str(locked))
        finally:
            locked.chmod(0o755)


def _arrays(x_train, y_train, x_eval=None, y_eval=None, task="classification", num_classes=None):
    x_eval = x_train if x_eval is None else x_eval
    y_eval = y_train if y_eval is None else y_eval
    return in_memory.ArrayData(x_train, y_train, x_eval, y_eval, task=task, num_classes=num_classes)


X = np.zeros((8, 3), np.float32)
Y = np.arange(8) % 2


@pytest.mark.parametrize(
    "data,needles",
    [
        (_arrays(X, Y[:5]), ["'x_train' has 8 examples but 'y_train' has 5"]),
        (_arrays(X, np.arange(9) % 2), ["'y_train' is longer"]),
        (
            _arrays(np.where(np.eye(8, 3) > 0, np.nan, 0).astype(np.float32), Y),
            ["'x_train' holds", "non-finite", "nan at index [0, 0]"],
        ),
        (_arrays(X, Y, x_eval=np.zeros((8, 4), np.float32)), ["'x_train' has (3,) per example, 'x_eval' has (4,)"]),
        (_arrays(X.astype("U3"), Y), ["'x_train' holds <U3 values (text)"]),
        (_arrays(X[:0], Y[:0]), ["'x_train' is empty"]),
        (_arrays(X[:, 0], Y), ["'x_train' has shape (8,)", "reshape"]),
        (_arrays(X, Y - 1), ["holds the label -1"]),
        (_arrays(X, Y + 3, num_classes=2), ["holds the label 4, but there are 2 classes"]),
        (_arrays(X, Y * 10**9), ["holds the label 1000000000", "outputs"]),
        (_arrays(X, Y.astype(np.float32)), ["integer class labels", "float32"]),
        (_arrays(X, np.eye(8, 2, dtype=np.int64)), ["One-hot", "shape (8, 2)"]),
        (_arrays(X, np.zeros(8, np.int64), num_classes=1), ["at least two classes"]),
        (_arrays(X, np.full((8, 1), np.inf, np.float32), task="regression"), ["'y_train' holds 8 non-finite"]),
    ],
)
def test_data_checks_name_the_array_and_value(data, needles):
    with pytest.raises(ConfigError) as err:
        checks.check_data(data, "data.path='d.npz'")
    for needle in ["data.path='d.npz'", *needles]:
        assert needle in str(err.value), str(err.value)


def _held_out_rows(n=64, fraction=0.2, seed=0):
    """The rows of an n-row file that data=npz holds out for eval (data.eval_fraction, data.seed)."""
    return np.random.default_rng(seed).permutation(n)[: max(1, round(n * fraction))]


def _labels_bad_only_where_held_out(bad):
    y = np.arange(64) % 2
    y[_held_out_rows()] = bad
    return y


@pytest.mark.parametrize(
    "y_train,needles",
    [
        (_labels_bad_only_where_held_out(-1), ["'y_train' holds the label -1"]),
        (_labels_bad_only_where_held_out(10**9), ["'y_train' holds the label 1000000000"]),
        (np.eye(64, 2, dtype=np.int64), ["in 'y_train'", "shape (64, 2)"]),  # the file's shape, not the split's
        (np.zeros(64, np.int64), ["every label in 'y_train' is 0"]),
    ],
)
def test_labels_of_a_file_without_eval_arrays_are_named_as_the_files(tmp_path, y_train, needles):
    """No x_eval/y_eval in the file: the runner holds out part of y_train, and a bad label there is y_train's."""
    path = tmp_path / "train-only.npz"
    np.savez(path, x_train=np.zeros((64, 3), np.float32), y_train=y_train)
    cfg = OmegaConf.merge(OmegaConf.structured(schema.NpzDataConfig), {"name": "npz", "path": str(path)})
    with pytest.raises(ConfigError) as err:
        in_memory.load(cfg)
    for needle in [f"data.path={str(path)!r}", *needles]:
        assert needle in str(err.value), str(err.value)
    assert "y_eval" not in str(err.value) and "x_eval" not in str(err.value)


def test_memory_estimate_refuses_only_what_clearly_does_not_fit():
    checks.check_batch_memory(256, 84, "data=synthetic", available=2**30)
    with pytest.raises(ConfigError, match=r"train.global_batch_size=10000000 would need about .* 1.0 GiB available"):
        checks.check_batch_memory(10**7, 84, "data=synthetic", available=2**30)
    assert checks.available_memory() > 0


# --- (b) properties, with Hypothesis ---------------------------------------------------------------------------
def _floats(lo=None, hi=None, **kw):
    return st.floats(min_value=lo, max_value=hi, allow_nan=False, allow_infinity=False, **kw)


# key -> values outside its declared range (NaN and inf are outside every range)
OUT_OF_RANGE = {
    "train.epochs": st.integers(-(10**6), 0),
    "train.global_batch_size": st.integers(-(10**6), 0),
    "train.steps_per_epoch": st.integers(-(10**6), 0),
    "train.steps_per_execution": st.integers(-(10**3), 0),
    "train.log_every_n_steps": st.integers(-(10**3), 0),
    "train.seed": st.one_of(st.integers(-(10**9), -1), st.integers(2**32, 2**40)),
    "train.optimizer.learning_rate": st.one_of(_floats(-1e6, 0), st.sampled_from([float("nan"), float("inf")])),
    "train.optimizer.clipnorm": _floats(-1e6, 0),
    "train.optimizer.momentum": st.one_of(_floats(1, 1e6), _floats(-1e6, 0, exclude_max=True)),
    "mlflow.flush_every_sec": st.one_of(_floats(-1e6, 0.99), st.just(float("nan"))),
    "mlflow.delivery_timeout_sec": _floats(-1e6, 0, exclude_max=True),
    "mlflow.system_metrics_every_sec": _floats(-1e6, 0.99),
    "data.num_examples": st.integers(-(10**6), 0),
    "data.eval_examples": st.integers(-(10**6), 0),
    "data.num_features": st.integers(-(10**3), 0),
    "data.noise": _floats(-1e6, 0, exclude_max=True),
    "data.seed": st.integers(-(10**9), -1),
    "checkpoint.max_to_keep": st.integers(-(10**3), 0),
    "devices.logical_cpus": st.integers(-(10**3), 0),
    "cluster.start_timeout_sec": _floats(-1e6, 0),
}
# combinations that do not work, with what the message must name
WRONG_COMBOS = [
    (["strategy=mirrored", "cross_device_ops=ring"], "cross_device_ops=ring"),
    (["strategy=one_device", "cross_device_ops=hierarchical_copy"], "cross_device_ops=hierarchical_copy"),
    (["strategy=mirrored", "cluster=localhost"], "cluster=localhost"),
    (["strategy=parameter_server", "cluster=localhost", "cluster.ps=0"], "cluster.ps"),
    (["strategy=default", "cluster=tpu"], "cluster=tpu"),  # strategy=auto would pick tpu for it
    (["train.epochs=lots"], "train.epochs"),
    (["train.optimizer.learning_rate=fast"], "train.optimizer.learning_rate"),
    (["mlflow.register_as=a/b"], "mlflow.register_as"),
    (["mlflow.register_as=m", "mlflow.log_model=false"], "mlflow.log_model=false"),
    (["mlflow.experiment_name=" + "x" * 501], "mlflow.experiment_name is 501 characters long"),
]


def test_an_experiment_name_longer_than_mlflow_takes_is_named():
    assert_refused(composed("mlflow.experiment_name=" + "e" * 501), "mlflow.experiment_name is 501 characters", "at most 500")
    validate_only = composed("mlflow.experiment_name=" + "e" * 500)
    from runner.config.validate import check_config

    check_config(validate_only)


def _override(key, value):
    return f"{key}={value!r}" if isinstance(value, float) else f"{key}={value}"


bad_override = st.one_of(
    st.sampled_from(sorted(OUT_OF_RANGE)).flatmap(lambda k: OUT_OF_RANGE[k].map(lambda v: ([_override(k, v)], k))),
    st.sampled_from(WRONG_COMBOS),
)


@pytest.fixture(scope="module")
def base_cfg():
    return composed()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(sorted(OUT_OF_RANGE)), data=st.data())
def test_every_out_of_range_value_is_refused_naming_its_key(base_cfg, key, data):
    value = data.draw(OUT_OF_RANGE[key])
    cfg = base_cfg.copy()
    OmegaConf.update(cfg, key, value, force_add=False)
    message = assert_refused(cfg, key)
    assert repr(value) in message or str(value) in message, message


# --- TF_CONFIG: the pre-flight probe, in-process (runner/preflight/needs.py) ---------------------------------------------
@pytest.fixture(scope="module")
def tf_config_cfg():
    return composed("cluster=tf_config", "strategy=multi_worker_mirrored")


def _probe_tf_config(cfg, spec):
    from runner.preflight.needs import tf_config_well_formed

    with mock.patch.dict(os.environ, {"TF_CONFIG": spec if isinstance(spec, str) else json.dumps(spec)}):
        tf_config_well_formed(cfg)


def _worker(index, **cluster):
    return {"cluster": cluster, "task": {"type": "worker", "index": index}}


@pytest.mark.parametrize(
    "spec,needles",
    [
        (_worker(0, worker={"1": "127.0.0.1:2222"}), ["numbers the 'worker' tasks 1", "must be 0..0"]),
        (_worker(2, worker={"0": "127.0.0.1:2222", "1": "127.0.0.1:2223"}), ["task index 2 is out of range", "0..1"]),
        (_worker(0, worker={"a": "127.0.0.1:2222"}), ["lists the 'worker' tasks as", "a map from task index"]),
        (_worker(0, worker="127.0.0.1:2222"), ["lists the 'worker' tasks as \"127.0.0.1:2222\"", "a list"]),
        (_worker(0, worker=["127.0.0.1:99999"]), ["'127.0.0.1:99999' of worker:0 is not host:port", "1..65535"]),
        (_worker(0, worker=["127.0.0.1:2222", "127.0.0.1:70000"]), ["'127.0.0.1:70000' of worker:1"]),
        (_worker(0, worker=["127.0.0.1"]), ["'127.0.0.1' of worker:0 is not host:port"]),
        (_worker(0, worker=[":2222"]), ["':2222' of worker:0 is not host:port"]),
        (_worker(0, worker=[2222]), ["address 2222 of worker:0 is not host:port"]),
        (_worker(0, worker=["127.0.0.1:²"]), ["is not host:port"]),  # "²".isdigit(), but int("²") fails
        (_worker(0, worker=["127.0.0.1:0", "127.0.0.1:2223"]), ["port 0 lets the system pick", "fixed free port"]),
        (_worker(0, worker=[]), ["lists no 'worker' tasks"]),
        (_worker(0, chief=["h1:2222", "h2:2222"], worker=["h3:2222"]), ["has 2 chief tasks (h1:2222, h2:2222)", "at most one"]),
        (_worker(0, worker=["h1:2222"], evaluator=["h2:2222", "h3:2222"]), ["has 2 evaluator tasks"]),
        (_worker(0, worker=["h1:2222"], trainer=["h2:2222"]), ["has a job 'trainer'", "chief, worker, ps, evaluator"]),
        (_worker("0", worker=["h1:2222"]), ["task index '0' is not an integer"]),
        (_worker(True, worker=["h1:2222"]), ["task index True is not an integer"]),
        (_worker(-1, worker=["h1:2222"]), ["task index -1 is out of range", "0..0"]),
        (_worker(0.0, worker=["h1:2222"]), ["task index 0.0 is not an integer"]),
        ({"cluster": {"worker": ["h1:2222"]}, "task": {"type": ["worker"], "index": 0}}, ["task type ['worker'] is not a job"]),
        ({"cluster": {}, "task": {"type": "worker", "index": 0}}, ["TF_CONFIG has no 'cluster'"]),
    ],
)
def test_malformed_tf_configs_are_refused_naming_the_task_or_address(tf_config_cfg, spec, needles):
    with pytest.raises(ConfigError) as err:
        _probe_tf_config(tf_config_cfg, spec)
    message = str(err.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message


def test_tasks_listed_by_index_pass_like_a_list(tf_config_cfg):
    """TensorFlow takes {"0": address, ...} as well as a list (JSON keys are text)."""
    _probe_tf_config(tf_config_cfg, _worker(1, worker={"1": "10.0.0.2:2222", "0": "10.0.0.1:2222"}))
    _probe_tf_config(tf_config_cfg, _worker(0, chief=["10.0.0.1:2222"], worker=["10.0.0.2:2222"], ps={"0": "10.0.0.3:2222"}))
    _probe_tf_config(tf_config_cfg, _worker(0, worker=["127.0.0.1:0"]))  # one task alone: nobody needs its port


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 70000) | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
_ports = st.integers(-1, 70000).map(str) | st.sampled_from(["", "x", "²", "22a", "0"])
_addresses = st.builds("{}:{}".format, st.sampled_from(["127.0.0.1", "localhost", "10.0.0.1", "", "h"]), _ports) | _json
_job_tasks = (
    st.lists(_addresses, max_size=3)
    | st.dictionaries(st.sampled_from(["0", "1", "2", "x", "-1", "²", "01"]), _addresses, max_size=3)
    | _json
)
_jobs = st.sampled_from(["worker", "chief", "ps", "evaluator", "chef"])
_tf_configs = (
    st.fixed_dictionaries(
        {
            "cluster": st.dictionaries(_jobs, _job_tasks, max_size=3) | _json,
            "task": st.fixed_dictionaries({"type": _jobs | _json, "index": st.integers(-2, 4) | _json}) | _json,
        }
    )
    | _json
)


def by_index_of(tasks):
    return dict(enumerate(tasks)) if isinstance(tasks, list) else {int(i): a for i, a in tasks.items()}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=_tf_configs)
def test_any_tf_config_is_refused_in_one_paragraph_or_is_what_tensorflow_takes(tf_config_cfg, spec):
    try:
        _probe_tf_config(tf_config_cfg, json.dumps(spec))
    except ConfigError as err:
        assert "\n" not in str(err) and str(err).startswith("TF_CONFIG"), str(err)
        return
    # Let through: what TensorFlow's ClusterSpec and validate_cluster_spec need, and this task's address.
    cluster, task = spec["cluster"], spec["task"]
    assert cluster and set(cluster) <= {"chief", "worker", "ps", "evaluator"}
    for tasks in cluster.values():
        by_index = by_index_of(tasks)
        assert by_index and sorted(by_index) == list(range(len(by_index)))  # ClusterSpec int()s a map's keys
        addresses = by_index.values()
        for address in addresses:
            host, _, port = address.rpartition(":")
            assert host and port.isascii() and port.isdigit() and int(port) <= 65535
    assert all(len(by_index_of(cluster.get(job, []))) <= 1 for job in ("chief", "evaluator"))
    assert type(task["index"]) is int
    assert task["type"] == "evaluator" or 0 <= task["index"] < len(by_index_of(cluster[task["type"]]))


@pytest.mark.slow  # end to end: runs `python -m runner` for each drawn case
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=bad_override)
def test_the_cli_refuses_bad_config_in_one_paragraph(tmp_path_factory, case):
    overrides, needle = case
    root = tmp_path_factory.mktemp("cli")
    result = run_runner([*overrides, "mlflow.enabled=false"], cwd=root, run_dir=root / "run", timeout=120)
    assert result.returncode in (1, 2), result.output[-2000:]
    assert "Traceback" not in result.output
    assert needle in result.stderr, result.stderr[-2000:]
    if result.returncode == 2:
        assert len([line for line in result.stderr.splitlines() if line.startswith("Error:")]) == 1


# Malformed .npz files: arrays of any shape and dtype, lengths that disagree, NaN/inf, text, objects, complex.
DTYPES = st.sampled_from(["float32", "float64", "int8", "int64", "uint8", "bool", "<U2", "complex64", "float16"])


def _any_array():
    return DTYPES.flatmap(lambda dt: hnp.arrays(dt, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)))


npz_contents = st.fixed_dictionaries(
    {"x_train": _any_array(), "y_train": _any_array()},
    optional={"x_eval": _any_array(), "y_eval": _any_array()},
)


def _well_formed(data):
    """What training relies on, for data the checks let through."""
    assert len(data.x_train) == len(data.y_train) > 0 and len(data.x_eval) == len(data.y_eval) > 0
    assert data.x_train.shape[1:] == data.x_eval.shape[1:] and data.x_train.ndim >= 2
    assert np.isfinite(data.x_train).all() and np.isfinite(data.x_eval).all()
    if data.task == "classification":
        for y in (data.y_train, data.y_eval):
            assert y.dtype.kind in "iu" and y.min() >= 0 and y.max() < data.num_classes


@settings(max_examples=150, deadline=None)
@given(
    contents=npz_contents,
    task=st.sampled_from(["classification", "regression"]),
    object_array=st.sampled_from([None, "x_train", "y_eval"]),
    batch=st.integers(1, 40),
)
def test_malformed_npz_files_end_in_a_config_error_naming_the_file(contents, task, object_array, batch):
    if object_array:
        contents[object_array] = np.array([[1, "a"]] * 3, dtype=object)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bad.npz"
        np.savez(path, **contents)
        cfg = OmegaConf.merge(OmegaConf.structured(schema.NpzDataConfig), {"name": "npz", "path": str(path), "task": task})
        train = OmegaConf.create({"global_batch_size": batch, "steps_per_epoch": None, "seed": 0})
        try:
            data = in_memory.load(cfg)
            build_data(cfg, data, train, num_replicas=1)
        except ConfigError as err:
            message = str(err)
            assert "\n" not in message
            assert str(path) in message or "train.global_batch_size" in message, message
            return
    _well_formed(data)


# --- (b) end to end through TensorFlow: each ~6-15 s, two at a time (eval width, dtypes, labels: in-process above) ---
@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad-npz")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 3)).astype("float32")
    y = rng.integers(0, 2, 64)
    np.savez(root / "short-labels.npz", x_train=x, y_train=y[:40])
    x_nan = x.copy()
    x_nan[5, 1] = np.nan
    np.savez(root / "nan-features.npz", x_train=x_nan, y_train=y)
    np.savez(root / "eval-width.npz", x_train=x, y_train=y, x_eval=rng.standard_normal((16, 5)).astype("float32"), y_eval=y[:16])
    np.savez(root / "good.npz", x_train=x, y_train=y)
    return root


def _processes_mentioning(text):
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if text.encode() in f.read():
                        found.append(int(pid))
            except OSError:
                pass
    return found


@pytest.mark.slow  # end to end: runs `python -m runner` through TensorFlow
def test_bad_data_and_devices_are_refused_before_the_first_step_and_their_runs_deleted(runner, bad_files):
    from mlflow import MlflowClient

    common = ["train.epochs=1", f"mlflow.experiment_name={EXPERIMENT}"]
    cases = {
        "short-labels": (
            ["data=npz", f"data.path={bad_files}/short-labels.npz"],
            ["'x_train' has 64 examples but 'y_train' has 40"],
        ),
        "nan-features": (["data=npz", f"data.path={bad_files}/nan-features.npz"], ["'x_train' holds 1 non-finite", "[5, 1]"]),
        "missing-device": (
            [
                "strategy=mirrored",
                "devices.logical_cpus=2",
                "strategy.devices=[/cpu:0,/cpu:7]",
                "data=npz",
                f"data.path={bad_files}/good.npz",
            ],
            ["strategy.devices='/cpu:7' names a device that does not exist", "/device:CPU:1"],
        ),
    }
    results = runner.many({name: [*args, *common] for name, (args, _) in cases.items()}, timeout=180)
    client = MlflowClient(runner.uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    assert not client.search_runs([experiment.experiment_id])  # none left among the results
    for name, (_, needles) in cases.items():
        result = results[name]
        assert result.returncode == 2, result.output[-3000:]
        assert "Traceback" not in result.output, result.output[-3000:]
        assert "Epoch 1/" not in result.output and "step 1/" not in result.output
        errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1, result.stderr[-3000:]
        for needle in needles:
            assert needle in errors[0], errors[0]
        assert_refused_run_deleted(runner.uri, EXPERIMENT, name, result, needles[0])
    assert not _processes_mentioning(str(bad_files))


@pytest.mark.parametrize(
    "overrides, said",
    [
        (["train.recovery.max_recoveries=2"], "which only executor=custom_loop can do"),  # the default executor is fit
        (
            ["executor=custom_loop", "train.recovery.max_recoveries=2", "checkpoint.enabled=false"],
            "checkpoint.enabled=false writes none",
        ),
        (["train.recovery.loss_upper_bound=0"], "train.recovery.loss_upper_bound=0.0 must be greater than 0"),
        (["train.recovery.max_recoveries=-1"], "train.recovery.max_recoveries=-1"),
    ],
)
def test_recovery_settings_that_cannot_work_are_refused_naming_them(overrides, said):
    from runner.config.validate import check_config

    with pytest.raises(ConfigError) as err:
        check_config(composed(*overrides))
    assert said in str(err.value) and "\n" not in str(err.value)
    check_config(composed("executor=custom_loop", "train.recovery.max_recoveries=2", "train.recovery.loss_upper_bound=50"))


def test_accumulation_with_fit_under_central_storage_is_refused_and_the_custom_loop_is_not():
    from runner.config.validate import check_config

    base = ("strategy=central_storage", "devices.logical_cpus=2", "train.accumulation_steps=2")
    with pytest.raises(ConfigError, match=r"train.accumulation_steps=2 with executor=fit is not supported under "):
        check_config(composed(*base, "executor=fit"))
    check_config(composed(*base, "executor=custom_loop"))
    check_config(composed("strategy=central_storage", "devices.logical_cpus=2", "executor=fit"))


@pytest.mark.parametrize("value", ["accuracy", "[]", "[eval/loss,examples_per_sec]"])
def test_a_sweep_objective_no_run_reports_is_refused(value):
    from runner.config import validate

    with pytest.raises(ConfigError, match=r"^sweep.objective=.* is not a figure a run reports"):
        validate.sweep_objective(composed(f"sweep.objective={value}"))
    validate.sweep_objective(composed("sweep.objective=[eval/loss,summary/examples_per_sec]"))


@pytest.mark.parametrize("name,chars", [("a[1]", "[ ]"), ("a\\b", "\\"), ("c[x\\y]", "[ \\ ]")])
def test_a_checkpoint_directory_tensorflow_would_read_as_a_pattern_is_refused(tmp_path, name, chars):
    """TensorFlow finds a checkpoint's files by a glob of its path: under `a[1]` or `a\\b` the run trained and wrote
    them, and resume= found none (found by an attack). Refused before training; `*` and `?` match themselves."""
    from runner.config.command_line import override
    from runner.preflight.needs import directories_writable

    with pytest.raises(ConfigError) as refused:
        directories_writable(composed(override("output_dir", str(tmp_path / name))))
    assert f"Choose a directory without {chars} (hydra.run.dir=<dir>)" in str(refused.value), refused.value
    directories_writable(composed(override("output_dir", str(tmp_path / name)), "checkpoint.enabled=false"))
    directories_writable(composed(override("output_dir", str(tmp_path / "a*b?"))))
