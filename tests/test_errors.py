"""Every config mistake gives one readable message and a non-zero exit, before any training; runs that had
started are marked FAILED in MLflow with the error recorded."""

import re

import numpy as np
import pytest

from conftest import mlflow_run_by_name

EXPERIMENT = "errors"


def assert_clean_failure(result, code, *needles):
    assert result.returncode == code, result.output[-3000:]
    for needle in needles:
        assert needle in result.stderr, f"{needle!r} not in:\n{result.stderr[-3000:]}"
    assert "Traceback" not in result.output
    assert "Epoch 1/" not in result.output and "step 1/" not in result.output  # no training started


# Caught while Hydra composes or by validation: no TensorFlow import, no MLflow run.
@pytest.mark.parametrize("args,code,needles", [
    (["strategy=mirored"], 1, ["Could not find 'strategy/mirored'", "mirrored", "central_storage"]),
    (["train.epochs=many"], 1, ["full_key: train.epochs", "'many'"]),
    (["train.epoch=3"], 1, ["Key 'epoch' not in 'TrainConfig'", "full_key: train.epoch"]),
    (["strategy=mirrored", "strategy.device=/gpu:0"], 1, ["Key 'device' not in 'MirroredConfig'"]),
    (["strategy=parameter_server"], 2, ["strategy=parameter_server needs a cluster", "cluster=local"]),
    (["strategy=mirrored", "cross_device_ops=ring"], 2, ["cross_device_ops=ring does not apply to strategy=mirrored"]),
    (["data=npz", "data.path=missing.npz"], 2, ["data.path='missing.npz': no such file"]),
    (["train.global_batch_size=0"], 2, ["train.global_batch_size=0 must be a positive integer"]),
    (["strategy=tpu"], 2, ["strategy=tpu needs cluster=tpu"]),
])
def test_config_mistakes_fail_before_tensorflow(runner, args, code, needles):
    name = "config-" + re.sub(r"[^A-Za-z0-9]+", "_", "-".join(args))
    result = runner(name, [*args, f"mlflow.experiment_name={EXPERIMENT}"])
    assert_clean_failure(result, code, *needles)
    assert "MLflow run" not in result.output  # nothing started, so nothing to mark


def test_tpu_without_a_tpu_fails_fast(runner):
    """The TPU is probed while the cluster is resolved, before any run starts."""
    result = runner("tpu-probe", ["strategy=tpu", "cluster=tpu", f"mlflow.experiment_name={EXPERIMENT}"])
    assert_clean_failure(result, 2, "cluster=tpu could not reach a TPU at cluster.tpu='local'", "strategy=mirrored")


def _npz(tmp_path):
    good = tmp_path / "good.npz"
    rng = np.random.default_rng(0)
    np.savez(good, x_train=rng.standard_normal((64, 3)).astype("float32"), y_train=rng.integers(0, 2, 64))
    corrupt = tmp_path / "corrupt.npz"
    corrupt.write_bytes(b"this is not a zip file")
    return good, corrupt


def test_hardware_and_data_mistakes_fail_fast_and_mark_the_run_failed(runner, tmp_path):
    good, corrupt = _npz(tmp_path)
    cases = {
        "nccl-mirrored": (["strategy=mirrored", "cross_device_ops=nccl"],
                          ["cross_device_ops=nccl needs NVIDIA GPUs", "hierarchical_copy or reduction_to_one_device"]),
        "nccl-mwms": (["strategy=multi_worker_mirrored", "cross_device_ops=nccl"], ["Use cross_device_ops=ring or auto"]),
        "batch-below-replicas": (["strategy=mirrored", "devices.logical_cpus=4", "train.global_batch_size=3"],
                                 ["train.global_batch_size=3 is smaller than the 4 replicas"]),
        "corrupt-npz": (["data=npz", f"data.path={corrupt}"], ["could not be read as a .npz file"]),
        "npz-wrong-keys": (["data=npz", f"data.path={good}", "data.x_train=features"],
                           ["has no array named features", "x_train, y_train"]),
        "bad-model-target": (["model._target_=numpy.zeros"], ["model._target_='numpy.zeros'"]),
    }
    results = runner.many({name: [*args, f"mlflow.experiment_name={EXPERIMENT}"] for name, (args, _) in cases.items()})
    for name, (_, needles) in cases.items():
        assert_clean_failure(results[name], 2, *needles)
        _, run = mlflow_run_by_name(runner.uri, EXPERIMENT, name)
        assert run.info.status == "FAILED", name
        assert needles[0] in run.data.tags["error"]


def test_old_file_store_gets_a_migration_hint(tmp_path):
    from conftest import run_runner

    (tmp_path / "mlruns" / "0").mkdir(parents=True)
    (tmp_path / "mlruns" / "0" / "meta.yaml").write_text("name: Default\n")
    result = run_runner([], cwd=tmp_path, run_dir=tmp_path / "out")
    assert result.returncode == 2, result.output[-2000:]
    assert "mlflow migrate-filestore --source . --target sqlite:///mlflow.db" in result.stderr
    assert "MLFLOW_ALLOW_FILE_STORE=true" in result.stderr
    assert not (tmp_path / "mlflow.db").exists()
