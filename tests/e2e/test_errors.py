"""The bad-input matrix of docs/reliability.md, one case per row: each bad input gives one readable message that
names the bad value and what would be valid, a non-zero exit, no traceback, no training, and no MLflow run
marked successful (either no run at all, or one deleted, with the error recorded: nothing was trained)."""

import json
import re
import socket
from dataclasses import dataclass, field

import numpy as np
import pytest

from helpers import ROOT, assert_refused_run_deleted, run_runner

EXPERIMENT = "errors"
MWMS_TF_CONFIG = ["strategy=multi_worker_mirrored", "cluster=tf_config"]


@dataclass
class Row:
    args: list[str]
    code: int
    needles: list[str]
    run: str | None = None  # None: no MLflow run may exist; "deleted": one was created, then deleted with the error
    env: dict[str, str] = field(default_factory=dict)


# {busy}: a port a test socket listens on; {free}: a port nothing listens on; {tmp}: this test's directory.
ROWS = {
    # Hydra composition, against the typed schemas (exit 1): no TensorFlow import
    "unknown-option": Row(
        ["strategy=mirored"], 1, ["did you mean strategy=mirrored?", "Could not find 'strategy/mirored'", "central_storage"]
    ),
    "unknown-key": Row(
        ["train.epoch=3"], 1, ["did you mean train.epochs=3?", "Key 'epoch' not in 'TrainConfig'", "full_key: train.epoch"]
    ),
    "wrong-type": Row(["train.epochs=many"], 1, ["train.epochs=many has the wrong type for train.epochs", "'many'"]),
    "unknown-strategy-argument": Row(
        ["strategy=mirrored", "strategy.device=/gpu:0"], 1, ["Key 'device' not in 'MirroredConfig'"]
    ),
    "config-file-not-yaml": Row(
        ["--config-dir", "{tmp}/conf", "model=broken"],
        1,
        ["Error: {tmp}/conf/model/broken.yaml, line 3, column 5: this config file is not valid YAML", "expected ','"],
    ),
    # runner/config/validate.py (exit 2): no TensorFlow import
    "zero-epochs": Row(["train.epochs=0"], 2, ["train.epochs=0 must be a positive integer"]),
    # runner/config/interpolation.py (exit 2): an interpolation that cannot be resolved, named before any check reads it
    "interpolation-unset-env": Row(
        ["train.epochs=${oc.env:RUNNER_TEST_UNSET}"],
        2,
        ["train.epochs=${oc.env:RUNNER_TEST_UNSET}: the interpolation reads the environment variable RUNNER_TEST_UNSET"],
    ),
    "interpolation-cycle": Row(["train.epochs=${train.epochs}"], 2, ["train.epochs=${train.epochs}: ", "interpolation cycle"]),
    "steps-per-call-word": Row(["train.steps_per_loop=many"], 2, ["train.steps_per_loop='many' must be a positive integer"]),
    "negative-steps": Row(["train.steps_per_epoch=-5"], 2, ["train.steps_per_epoch=-5 must be 1 or more, or null"]),
    "zero-batch": Row(["train.global_batch_size=0"], 2, ["train.global_batch_size=0 must be a positive integer"]),
    "negative-batch": Row(["train.global_batch_size=-8"], 2, ["train.global_batch_size=-8 must be a positive integer"]),
    "zero-learning-rate": Row(
        ["train.optimizer.learning_rate=0"], 2, ["train.optimizer.learning_rate=0.0 must be greater than 0"]
    ),
    "unknown-optimizer": Row(
        ["train.optimizer.name=lbfgs"], 2, ["train.optimizer.name='lbfgs' is not valid", "sgd, adam, adamw, rmsprop, adagrad"]
    ),
    "accumulation-not-dividing": Row(
        ["train.accumulation_steps=3"],
        2,
        ["train.accumulation_steps=3 does not divide train.global_batch_size=64", "Use a divisor of 64 (2, 4, 8"],
    ),
    "restore-best-without-keep-best": Row(
        ["checkpoint.restore_best=true"],
        2,
        ["checkpoint.restore_best=true restores the best checkpoint", "add checkpoint.keep_best=true"],
    ),
    "too-many-logical-cpus": Row(
        ["devices.logical_cpus=1000"], 2, ["devices.logical_cpus=1000 is more than this machine can use", "cluster.workers=N"]
    ),
    "ps-without-cluster": Row(
        ["strategy=parameter_server"], 2, ["strategy=parameter_server needs a cluster", "cluster=localhost"]
    ),
    "ops-not-for-strategy": Row(
        ["strategy=mirrored", "cross_device_ops=ring"],
        2,
        ["cross_device_ops=ring does not apply to strategy=mirrored", "hierarchical_copy"],
    ),
    "tpu-strategy-without-tpu-cluster": Row(["strategy=tpu"], 2, ["strategy=tpu needs cluster=tpu", "strategy=mirrored"]),
    "missing-data-file": Row(
        ["data=npz", "data.path=missing.npz"], 2, ["data.path='missing.npz': no such file", "x_train and y_train"]
    ),
    "eval-fraction-out-of-range": Row(
        ["data=npz", "data.path={tmp}/good.npz", "data.eval_fraction=1.5"], 2, ["data.eval_fraction=1.5 must be between 0 and 1"]
    ),
    "resume-missing-dir": Row(["resume=/no/such/run"], 2, ["resume='/no/such/run': no such directory", "outputs/<date>/<time>"]),
    "tf-config-unset": Row(
        MWMS_TF_CONFIG, 2, ["cluster=tf_config needs the TF_CONFIG environment variable", '"task": {"type": "worker"']
    ),
    "tf-config-not-json": Row(
        MWMS_TF_CONFIG, 2, ["TF_CONFIG is not valid JSON", "{worker: oops"], env={"TF_CONFIG": "{worker: oops"}
    ),
    "tf-config-without-task": Row(
        MWMS_TF_CONFIG,
        2,
        ["TF_CONFIG has no 'task'"],
        env={"TF_CONFIG": json.dumps({"cluster": {"worker": ["127.0.0.1:{free}"]}})},
    ),
    "tf-config-index-out-of-range": Row(
        MWMS_TF_CONFIG,
        2,
        ["TF_CONFIG task index 2 is out of range", "valid indices are 0..1"],
        env={
            "TF_CONFIG": json.dumps(
                {"cluster": {"worker": ["127.0.0.1:{free}", "127.0.0.1:{busy}"]}, "task": {"type": "worker", "index": 2}}
            )
        },
    ),
    "tf-config-unknown-task-type": Row(
        MWMS_TF_CONFIG,
        2,
        ["TF_CONFIG task type 'chef' is not a job of its cluster", "valid types: worker"],
        env={"TF_CONFIG": json.dumps({"cluster": {"worker": ["127.0.0.1:{free}"]}, "task": {"type": "chef", "index": 0}})},
    ),
    "tf-config-port-in-use": Row(
        MWMS_TF_CONFIG,
        2,
        ["port {busy} is already in use", "worker:0"],
        env={
            "TF_CONFIG": json.dumps(
                {"cluster": {"worker": ["127.0.0.1:{busy}", "127.0.0.1:{free}"]}, "task": {"type": "worker", "index": 0}}
            )
        },
    ),
    "tf-config-tasks-by-index": Row(
        MWMS_TF_CONFIG,
        2,
        ["TF_CONFIG's cluster numbers the 'worker' tasks 1", "must be 0..0"],
        env={"TF_CONFIG": json.dumps({"cluster": {"worker": {"1": "127.0.0.1:{free}"}}, "task": {"type": "worker", "index": 0}})},
    ),
    "tf-config-port-out-of-range": Row(
        MWMS_TF_CONFIG,
        2,
        ["TF_CONFIG address '127.0.0.1:99999' of worker:0 is not host:port", "1..65535"],
        env={"TF_CONFIG": json.dumps({"cluster": {"worker": ["127.0.0.1:99999"]}, "task": {"type": "worker", "index": 0}})},
    ),
    "tf-config-two-chiefs": Row(
        MWMS_TF_CONFIG,
        2,
        ["TF_CONFIG's cluster has 2 chief tasks", "at most one"],
        env={
            "TF_CONFIG": json.dumps(
                {
                    "cluster": {"chief": ["127.0.0.1:{free}", "127.0.0.1:{busy}"], "worker": ["127.0.0.1:{busy}"]},
                    "task": {"type": "worker", "index": 0},
                }
            )
        },
    ),
    "tracking-server-unreachable": Row(
        [],
        2,
        ["MLFLOW_TRACKING_URI=http://127.0.0.1:{free} is unreachable", "Connection refused", "mlflow.enabled=false"],
        env={"MLFLOW_TRACKING_URI": "http://127.0.0.1:{free}"},
    ),
    # found once TensorFlow is up (exit 2): before any step; where the run had started it is deleted
    "tpu-unreachable": Row(
        ["strategy=tpu", "cluster=tpu"], 2, ["cluster=tpu could not reach a TPU at cluster.tpu='local'", "strategy=mirrored"]
    ),
    "tpu-unknown-address": Row(
        ["strategy=tpu", "cluster=tpu", "cluster.tpu=grpc://127.0.0.1:{free}", "cluster.connect_timeout_sec=3"],
        2,
        ["could not reach a TPU at cluster.tpu='grpc://127.0.0.1:{free}'", "cluster.connect_timeout_sec=3"],
    ),
    "nccl-without-gpu": Row(
        ["strategy=mirrored", "cross_device_ops=nccl"],
        2,
        ["cross_device_ops=nccl needs NVIDIA GPUs", "hierarchical_copy or reduction_to_one_device"],
        run="deleted",
    ),
    "nccl-collectives-without-gpu": Row(
        ["strategy=multi_worker_mirrored", "cross_device_ops=nccl"],
        2,
        ["needs NVIDIA GPUs", "Use cross_device_ops=ring or auto"],
        run="deleted",
    ),
    "batch-below-replicas": Row(
        ["strategy=mirrored", "devices.logical_cpus=4", "train.global_batch_size=3"],
        2,
        ["train.global_batch_size=3 is smaller than the 4 replicas"],
        run="deleted",
    ),
    "corrupt-data-file": Row(["data=npz", "data.path={tmp}/corrupt.npz"], 2, ["could not be read as a .npz file"], run="deleted"),
    "data-file-wrong-arrays": Row(
        ["data=npz", "data.path={tmp}/good.npz", "data.x_train=features"],
        2,
        ["has no array named features", "x_train, y_train"],
        run="deleted",
    ),
    "model-target-missing": Row(
        ["model._target_=no_such_module.build"],
        2,
        ["model._target_='no_such_module.build' cannot be imported", "runner.models.mlp"],
        run="deleted",
    ),
    "model-target-wrong-arguments": Row(
        ["model._target_=numpy.zeros"], 2, ["model._target_='numpy.zeros' could not be called with"], run="deleted"
    ),
    "model-target-not-keras": Row(
        ["model._target_=builtins.dict"], 2, ["model._target_='builtins.dict' returned dict, not a tf_keras model"], run="deleted"
    ),
    # at the first call, where XLA compiles the step: TensorFlow's traceback (exit 1) before
    "xla-unsupported-op": Row(
        ["model._target_=my_models.numpy_inside", "train.jit_compile=true"],
        2,
        ["train.jit_compile=true: XLA cannot compile the training step", "the op PyFuncStateless", "Nothing was trained"],
        run="deleted",
        env={"PYTHONPATH": str(ROOT / "tests" / "user_project")},
    ),
}
# Rows of docs/reliability.md that other tests cover, and where.
# Rows that end before TensorFlow (sub-second): in the fast tier, each a test of its own, and not in the matrix above.
BEFORE_TF = ["config-file-not-yaml", "tf-config-tasks-by-index", "tf-config-port-out-of-range", "tf-config-two-chiefs"]
ELSEWHERE = {
    "old-file-store": "tests/e2e/test_errors.py::test_old_file_store_gets_a_migration_hint",
    "uneven-batch": "tests/e2e/test_inputs.py::test_guide_example_runs_uneven_batches_on_four_replicas",
    "keras-app-imagenet": "tests/unit/test_models.py::test_refusal_comes_from_the_cli_without_importing_tensorflow",
    "keras-app-weights-missing": "tests/unit/test_models.py::test_weights_path_that_does_not_exist_is_refused_by_preflight",
    "keras-app-unknown-application": "tests/unit/test_models.py::test_bad_keras_app_models_are_refused_when_built",
    "keras-app-input-too-small": "tests/unit/test_models.py::test_bad_keras_app_models_are_refused_when_built",
    "model-target-keras3": "tests/unit/builders/test_model.py::test_a_keras3_model_is_refused_where_it_is_not_trained",
    "early-stopping-monitor-not-evaluated": (
        "tests/unit/executors/test_early_stopping.py::test_a_monitor_the_loss_cannot_give_is_refused_before_the_first_step"
    ),
    "model-keras3-clipnorm": "tests/e2e/test_keras3.py::test_keras3_refusals_end_the_command_with_exit_2_before_training",
    "model-keras3-parameter-server": "tests/e2e/test_keras3.py::test_keras3_under_parameter_server_is_refused_before_training",
    "loss-target-missing": "tests/unit/builders/test_loss.py::test_a_loss_that_cannot_be_built_is_one_paragraph_naming_the_key",
    "loss-target-per-batch": (
        "tests/unit/builders/test_loss.py::test_a_loss_of_one_number_per_batch_is_refused_when_the_step_is_traced"
    ),
    "optimizer-target-wrong-keras": "tests/unit/builders/test_loss.py::test_an_optimizer_that_cannot_train_the_model_is_refused",
    "optimizer-kwargs-shape": "tests/unit/builders/test_loss.py::test_the_shape_of_own_objects_is_checked_before_tensorflow",
    "metric-target-wrong": (
        "tests/unit/builders/test_metrics.py::test_a_metric_that_cannot_be_made_is_one_paragraph_naming_the_entry"
    ),
    "metric-cannot-be-logged": (
        "tests/unit/builders/test_metrics.py::test_the_probe_before_the_first_step_refuses_what_cannot_be_logged"
    ),
    "schedule-target-wrong": (
        "tests/unit/builders/test_optimizer.py::test_a_schedule_that_cannot_be_used_is_one_paragraph_naming_the_key"
    ),
    "schedule-target-shape": (
        "tests/unit/builders/test_optimizer.py::test_the_shape_of_ones_own_schedule_is_checked_before_tensorflow"
    ),
    "elastic-settings": "tests/unit/launch/test_elastic.py::test_settings_it_cannot_keep_are_refused_before_tensorflow",
    "elastic-slurm-launcher": "tests/unit/launch/test_slurm_steps.py::test_a_launcher_that_cannot_start_steps_is_refused",
    "metric-without-target": "tests/unit/builders/test_metrics.py::test_the_shape_of_train_metrics_is_checked_before_tensorflow",
}
# Cases that import TensorFlow (seconds each) run two at a time; the rest are sub-second.
SLOW = {k for k, r in ROWS.items() if r.run or k.startswith("tpu-")}


@pytest.fixture(scope="module")
def ports():
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    yield {"busy": str(busy.getsockname()[1]), "free": str(free)}
    busy.close()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad-data")
    rng = np.random.default_rng(0)
    np.savez(root / "good.npz", x_train=rng.standard_normal((64, 3)).astype("float32"), y_train=rng.integers(0, 2, 64))
    (root / "corrupt.npz").write_bytes(b"this is not a zip file")
    (root / "conf" / "model").mkdir(parents=True)
    (root / "conf" / "model" / "broken.yaml").write_text("_target_: runner.models.mlp\nhidden_units: [8, 4\nname: mine\n")
    return root


def fill(text: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        text = text.replace("{" + key + "}", value)
    return text


def assert_clean_failure(result, code, *needles):
    assert result.returncode == code, result.output[-3000:]
    for needle in needles:
        assert needle in result.stderr, f"{needle!r} not in:\n{result.stderr[-3000:]}"
    assert "Traceback" not in result.output
    assert "Epoch 1/" not in result.output and "step 1/" not in result.output  # no training started


def _run_rows(runner, names, values):
    jobs = {name: [fill(a, values) for a in ROWS[name].args] + [f"mlflow.experiment_name={EXPERIMENT}"] for name in names}
    envs = {name: {k: fill(v, values) for k, v in ROWS[name].env.items()} for name in names}
    results = {}
    for name in names:
        if name in SLOW:
            continue
        if "MLFLOW_TRACKING_URI" in envs[name]:  # the store under test comes from the environment
            results[name] = run_runner(jobs[name], cwd=runner.root, run_dir=runner.root / "runs" / name, env_extra=envs[name])
        else:
            results[name] = runner(name, jobs[name], env_extra=envs[name])
    slow = [n for n in names if n in SLOW and not envs[n]]  # two at a time; those with an environment of their own alone
    results.update(runner.many({n: jobs[n] for n in slow}))
    results.update({n: runner(n, jobs[n], env_extra=envs[n]) for n in names if n in SLOW and envs[n]})
    return results


@pytest.mark.slow  # end to end: runs the matrix through `python -m runner`
def test_every_bad_input_gets_a_clear_error(runner, ports, data_dir):
    """Every row but the BEFORE_TF ones, which the fast tier runs (each as a test of its own, below)."""
    values = {**ports, "tmp": str(data_dir)}
    rows = {name: row for name, row in ROWS.items() if name not in BEFORE_TF}
    results = _run_rows(runner, list(rows), values)
    failures = []
    for name, row in rows.items():
        result = results[name]
        try:
            assert_clean_failure(result, row.code, *[fill(n, values) for n in row.needles])
            if row.run is None:
                assert "MLflow run" not in result.output, "a run was started"
            else:
                assert_refused_run_deleted(runner.uri, EXPERIMENT, name, result, fill(row.needles[0], values))
        except AssertionError as err:
            failures.append(f"--- {name}: {err}")
    # resume= of a directory whose run was deleted: its run id went with the run, so there is nothing to continue
    refused_dir = results["model-target-missing"].run_dir
    again = run_runner([f"resume={refused_dir}"], cwd=runner.root, run_dir=refused_dir, tracking_uri=runner.uri)
    assert_clean_failure(again, 2, f"resume='{refused_dir}' is not an output directory", "there is nothing to continue")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("name", BEFORE_TF)
def test_bad_config_files_and_tf_configs_fail_before_tensorflow(name, ports, data_dir, tmp_path):
    values, row = {**ports, "tmp": str(data_dir)}, ROWS[name]
    env = {k: fill(v, values) for k, v in row.env.items()}
    result = run_runner([fill(a, values) for a in row.args], cwd=tmp_path, run_dir=tmp_path / "run", env_extra=env)
    assert_clean_failure(result, row.code, *[fill(n, values) for n in row.needles])
    assert len([p for p in result.stderr.split("\n\n") if p.strip()]) == 1 and "HYDRA_FULL_ERROR" not in result.stderr
    assert row.run is None and "MLflow run" not in result.output, "a run was started"  # as the matrix checks its rows


def test_the_matrix_in_the_docs_is_the_matrix_tested():
    text = (ROOT / "docs" / "reliability.md").read_text()
    section = text.split("## Bad input", 1)[1].split("\n## ", 1)[0]
    documented = re.findall(r"^\| `([a-z0-9-]+)` \|", section, flags=re.M)
    assert len(documented) >= 20
    assert sorted(documented) == sorted([*ROWS, *ELSEWHERE])


@pytest.mark.slow  # end to end: runs `python -m runner`
def test_old_file_store_gets_a_migration_hint(tmp_path):
    (tmp_path / "mlruns" / "0").mkdir(parents=True)
    (tmp_path / "mlruns" / "0" / "meta.yaml").write_text("name: Default\n")
    result = run_runner([], cwd=tmp_path, run_dir=tmp_path / "out")
    assert result.returncode == 2, result.output[-2000:]
    assert "mlflow migrate-filestore --source . --target sqlite:///mlflow.db" in result.stderr
    assert "MLFLOW_ALLOW_FILE_STORE=true" in result.stderr
    assert not (tmp_path / "mlflow.db").exists()
