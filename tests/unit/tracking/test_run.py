"""runner/tracking/run.py: a one-process run is created in the MLflow process while TensorFlow imports (`prestart`), and
one that training never reaches is ended, not left RUNNING (`end_prestarted`). A real MLflow process on a real store."""

import pytest
from omegaconf import OmegaConf

from helpers import composed

pytestmark = pytest.mark.slow  # each test starts the MLflow process, which imports mlflow (seconds)


def _cfg(sqlite_uri, tmp_path):
    cfg = composed("train.epochs=1", "mlflow.system_metrics=false")
    OmegaConf.update(cfg, "mlflow.tracking_uri", sqlite_uri)
    OmegaConf.update(cfg, "output_dir", str(tmp_path / "run"))
    return cfg


def _runs(uri):
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    return client.search_runs([e.experiment_id for e in client.search_experiments()])


@pytest.mark.parametrize(
    ("err", "status", "tag"),
    [
        (RuntimeError("TensorFlow could not be imported"), "FAILED", ("error", "RuntimeError: TensorFlow could not be imported")),
        (KeyboardInterrupt(), "KILLED", ("stopped_by", "SIGINT")),
    ],
    ids=["error", "ctrl-c"],
)
def test_a_run_created_ahead_that_training_never_reaches_is_ended(sqlite_uri, tmp_path, err, status, tag):
    from runner.tracking import run

    run.prestart(_cfg(sqlite_uri, tmp_path), ["train.epochs=1"], {"strategy.auto": "default: test"})
    run.end_prestarted(err)
    (only,) = _runs(sqlite_uri)
    assert only.info.status == status
    assert only.data.tags[tag[0]] == tag[1] and only.data.tags["strategy.auto"] == "default: test"
    assert not run._early and not run._prestarted  # the MLflow process is let go


def test_mlflow_run_takes_the_run_created_ahead(sqlite_uri, tmp_path):
    from runner.tracking import run

    cfg = _cfg(sqlite_uri, tmp_path)
    run.prestart(cfg, ["train.epochs=1"], {})
    with run.mlflow_run(cfg, ["train.epochs=1"], {}) as runlog:
        runlog.log_metrics({"loss": 0.5}, 1)
    (only,) = _runs(sqlite_uri)  # one run: the one created ahead, not a second
    assert only.info.run_id == runlog.run_id and only.info.status == "FINISHED"
    assert only.data.params["train.epochs"] == "1" and only.data.metrics["loss"] == 0.5
    assert (tmp_path / "run" / "mlflow_run_id").read_text() == only.info.run_id
