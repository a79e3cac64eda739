"""Issue 19's MLflow pieces one by one, in process (no TensorFlow): the register_as check, dataset digests, the
model logging's failures and what they do to a run, system metrics without psutil."""

import logging
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from runner.config import schema
from runner.config.validate import check_config
from runner.errors import ConfigError, RunnerError

import helpers

schema.register()


def composed(*overrides):
    return helpers.composed("hydra.run.dir=/tmp/x", *overrides)


@pytest.mark.parametrize("name", ["", " ", "a/b", "team:model", "has space", "-dash-first", "x" * 201])
def test_register_as_refuses_names_the_registry_cannot_carry(name):
    with pytest.raises(ConfigError, match=r"mlflow.register_as=.* is not a usable model name"):
        check_config(composed(f"mlflow.register_as='{name}'"))


def test_register_as_takes_a_plain_name_and_needs_a_model_to_register():
    check_config(composed("mlflow.register_as=mnist-mlp_v2.1"))
    with pytest.raises(ConfigError, match="mlflow.log_model=false"):
        check_config(composed("mlflow.register_as=m", "mlflow.log_model=false"))
    with pytest.raises(ConfigError, match="save_model=false"):
        check_config(composed("mlflow.register_as=m", "save_model=false"))


# --- datasets ---------------------------------------------------------------------------------------------------
def _synthetic(seed):
    from runner.sources import in_memory

    cfg = composed(f"data.seed={seed}").data
    return cfg, in_memory.load(cfg)


def test_array_digests_follow_the_data_not_the_run():
    from runner.sources.description import describe

    one, again, two = describe(*_synthetic(1)), describe(*_synthetic(1)), describe(*_synthetic(2))
    assert [d["context"] for d in one] == ["train", "eval"]
    assert [d["digest"] for d in one] == [d["digest"] for d in again]
    assert one[0]["digest"] != two[0]["digest"] and one[1]["digest"] != two[1]["digest"]
    assert one[0]["profile"]["num_rows"] == 4096 and one[0]["features"] == {"dtype": "float32", "shape": [20]}


def test_file_digests_come_from_names_sizes_and_mtimes_without_reading(tmp_path):
    """A FIFO stands in for a TFRecord file: reading it would block, so the digest proves no file was opened."""
    from runner.sources.description import describe
    from runner.sources.tfrecord import TFRecordSource

    fifo, shard = tmp_path / "train-0.tfrecord", tmp_path / "eval-0.tfrecord"
    os.mkfifo(fifo)
    shard.write_bytes(b"x" * 100)
    features = {"x": ("float32", (4,)), "y": ("int64", ())}
    source = TFRecordSource([str(fifo)], [str(shard)], features, "y", "classification", 3, 10)
    cfg = SimpleNamespace(name="tfrecord", train_files=str(tmp_path / "train-*.tfrecord"), eval_files=str(shard))
    first = describe(cfg, source)
    assert first[0]["profile"] == {"files": 1, "bytes": 0, "num_rows": 10} and first[1]["profile"]["bytes"] == 100
    assert first[0]["features"] == {"dtype": "float32", "shape": [4]} and first[0]["targets"]["dtype"] == "int32"
    os.utime(shard, ns=(1, 1))
    assert describe(cfg, source)[1]["digest"] != first[1]["digest"]  # a file rewritten: another digest
    assert describe(cfg, source)[0]["digest"] == first[0]["digest"]


def test_an_image_folder_is_described_by_its_listing_and_an_image_rewritten_changes_it(tmp_path, sqlite_uri):
    from mlflow import MlflowClient

    from runner.mlflow_process.ops import dataset_inputs
    from runner.sources.description import describe
    from runner.sources.image_folder import load_source

    folder = helpers.write_image_folder(tmp_path / "images", per_class=5)
    cfg = composed("data=image_folder", f"data.train_dir={folder}", "data.image_size=[8,8]", "data.color_mode=rgb").data
    first = describe(cfg, load_source(cfg))
    assert [d["profile"]["num_rows"] for d in first] == [8, 2] and first[0]["profile"]["classes"] == ["circle", "square"]
    assert first[0]["features"] == {"dtype": "float32", "shape": [8, 8, 3]} and first[0]["source"]["uri"] == str(folder)
    image = next((folder / "square").iterdir())
    os.utime(image, ns=(1, 1))
    again = describe(cfg, load_source(cfg))
    assert {d["context"] for d in again if d["digest"] != first[["train", "eval"].index(d["context"])]["digest"]}
    client = MlflowClient(sqlite_uri)
    run_id = client.create_run("0").info.run_id
    client.log_inputs(run_id, datasets=dataset_inputs(again))
    assert {i.dataset.name for i in client.get_run(run_id).inputs.dataset_inputs} == {"image_folder-train", "image_folder-eval"}


def test_dataset_entities_are_what_mlflow_logs(sqlite_uri):
    from mlflow import MlflowClient

    from runner.mlflow_process.ops import dataset_inputs
    from runner.sources.description import describe

    client = MlflowClient(sqlite_uri)
    run_id = client.create_run("0").info.run_id
    client.log_inputs(run_id, datasets=dataset_inputs(describe(*_synthetic(3))))
    inputs = client.get_run(run_id).inputs.dataset_inputs
    assert sorted(i.tags[0].value for i in inputs) == ["eval", "train"]
    assert {i.dataset.name for i in inputs} == {"synthetic-train", "synthetic-eval"}


def _run_with_artifacts_in(uri, tmp_path) -> str:
    """A run whose artifacts go under tmp_path (experiment 0's would go to ./mlruns in the working directory)."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    experiment = client.create_experiment("models", artifact_location=(tmp_path / "artifacts").as_uri())
    return client.create_run(experiment).info.run_id


# --- the model --------------------------------------------------------------------------------------------------
def test_a_model_that_cannot_be_logged_says_why(sqlite_uri, tmp_path):
    from runner.mlflow_process.ops import log_keras_model

    run_id = _run_with_artifacts_in(sqlite_uri, tmp_path)
    spec = {"dtype": "float32", "shape": [2]}
    with pytest.raises(RuntimeError, match="could not be logged as an MLflow model") as err:
        log_keras_model(sqlite_uri, run_id, str(tmp_path / "missing.keras"), spec, spec, [[0.0, 0.0]])
    assert "\n" not in str(err.value)


class _Refusing:
    def log_model(self, keras_path, **args):
        raise RuntimeError("the model could not be logged as an MLflow model (disk full)")

    def set_tags(self, tags):
        raise AssertionError("nothing to tag")


def test_a_failed_model_logging_is_a_warning_unless_registering(caplog):
    from runner.tracking.logged_model import log_mlflow_model

    data = SimpleNamespace(input_shape=(3,), num_outputs=2, x_train=np.zeros((4, 3), np.float32))
    with caplog.at_level(logging.WARNING, logger="runner"):
        log_mlflow_model(_Refusing(), "model.keras", data, None)
    assert "disk full" in caplog.text and "mlflow.log_model=false" in caplog.text
    with pytest.raises(RunnerError, match="mlflow.register_as=prod: the model could not be logged"):
        log_mlflow_model(_Refusing(), "model.keras", data, "prod")


@pytest.mark.slow  # loading the model imports TensorFlow (in a child process)
def test_a_model_that_cannot_be_loaded_back_says_why(sqlite_uri, tmp_path):
    """Logging never loads the model (that would import TensorFlow at the end of every run): a damaged .keras is
    found when the model is loaded, with a message naming the file."""
    from runner.mlflow_process.ops import log_keras_model

    broken = tmp_path / "model.keras"
    broken.write_text("not a keras archive")
    run_id = _run_with_artifacts_in(sqlite_uri, tmp_path)
    spec = {"dtype": "float32", "shape": [2]}
    logged = log_keras_model(sqlite_uri, run_id, str(broken), spec, spec, [[0.0, 0.0]])
    probe = (
        "import sys, mlflow\ntry:\n    mlflow.pyfunc.load_model(sys.argv[1])\nexcept Exception as err:\n    print('ERROR', err)\n"
    )
    env = {**os.environ, "MLFLOW_TRACKING_URI": sqlite_uri, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, "-c", probe, logged["model_uri"]], env=env, capture_output=True, text=True)
    assert "ERROR model.keras could not be loaded with tf_keras" in done.stdout, done.stdout + done.stderr[-2000:]


# --- system metrics ---------------------------------------------------------------------------------------------
def test_system_metrics_without_psutil_are_a_warning(monkeypatch, caplog):
    from runner.mlflow_process.ops import SystemMetrics

    monkeypatch.setitem(sys.modules, "psutil", None)  # `import psutil` raises ImportError
    with caplog.at_level(logging.WARNING, logger="runner"):
        monitor = SystemMetrics("sqlite:///unused.db", "run", 1.0, False)
        assert monitor.stop() == 0
    assert "system metrics are off for this run" in caplog.text and "pip install psutil" in caplog.text


def test_system_metrics_whose_last_point_cannot_be_sent_are_one_warning(monkeypatch, caplog, capsys):
    """Before: `Exception in thread system-metrics-stop:` and five chained tracebacks when the server was down at
    the end (the run still finished with every point). A send that outlasts the 5 s wait is said once too, not twice."""
    import time

    from runner.mlflow_process import ops

    def refused(after):
        def flush():
            time.sleep(after)
            raise ConnectionError("API request to http://127.0.0.1:9/api/log-batch failed\nMax retries")

        return flush

    monkeypatch.setitem(sys.modules, "psutil", None)  # no monitor of MLflow's is started: the fake below is stopped
    monkeypatch.setattr(ops, "STOP_WAIT_SEC", 0.2)
    for after, line in [
        (
            0,
            "system metrics: the last point was not logged (API request to http://127.0.0.1:9/api/log-batch failed)",
        ),
        (0.5, "system metrics: the last point was not logged within 0s; left behind"),  # its failure later: not said again
    ]:
        metrics = ops.SystemMetrics("sqlite:///unused.db", "run", 1.0, False)
        metrics._started.join()
        metrics.monitor = SimpleNamespace(
            finish=lambda: None,
            monitors=[SimpleNamespace(metrics={"cpu_utilization_percentage": [3.0]})],
            aggregate_metrics=lambda: {"cpu_utilization_percentage": 3.0},
            publish_metrics=lambda metrics: None,
            mlflow_logger=SimpleNamespace(flush=refused(after)),
            _logging_step=4,
        )
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="runner"):
            assert metrics.stop() == 4
            time.sleep(after + 0.2)  # the thread left behind has failed by now
        assert [r.getMessage() for r in caplog.records if r.name == "runner"] == [line]
    assert "Exception in thread" not in capsys.readouterr().err
