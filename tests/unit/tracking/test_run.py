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


def _all_runs(uri):
    """Every run, deleted ones too (search_runs shows only active runs by default)."""
    from mlflow import MlflowClient
    from mlflow.entities import ViewType

    client = MlflowClient(uri)
    return client.search_runs([e.experiment_id for e in client.search_experiments()], run_view_type=ViewType.ALL)


@pytest.fixture
def untrained(monkeypatch):
    """This process has run no training step (phases keeps its marks for the whole process)."""
    from runner.tracking import phases

    monkeypatch.setattr(phases, "_marks", [])
    return phases


def _refused_inside(cfg, err):
    from runner.tracking import run

    with pytest.raises(type(err)) as raised:
        with run.mlflow_run(cfg, ["train.epochs=1"], {}) as runlog:
            raise err
    return runlog, raised.value


def test_a_new_run_refused_before_its_first_step_is_deleted_with_its_run_id_file(sqlite_uri, tmp_path, untrained):
    from mlflow import MlflowClient

    from runner.errors import ConfigError
    from runner.tracking import run

    cfg = _cfg(sqlite_uri, tmp_path)
    runlog, err = _refused_inside(cfg, ConfigError("model._target_='x.y' cannot be imported"))
    assert not _runs(sqlite_uri)  # search_runs' default view: active runs only
    (gone,) = _all_runs(sqlite_uri)
    assert gone.info.run_id == runlog.run_id and gone.info.lifecycle_stage == "deleted"
    assert gone.info.status == "FAILED"  # restored, it is not a run that looks RUNNING
    assert gone.data.tags["error"] == "ConfigError: model._target_='x.y' cannot be imported"
    assert "error.txt" not in [a.path for a in MlflowClient(sqlite_uri).list_artifacts(gone.info.run_id)]
    assert not (tmp_path / "run" / "mlflow_run_id").exists()  # the directory holds no run now
    assert err.run_deleted == gone.info.run_id
    assert run.deleted_line(err) == (
        f" The MLflow run {gone.info.run_id} was deleted (nothing was trained); "
        f"`mlflow runs restore --run-id {gone.info.run_id}` brings it back."
    )


def test_a_refusal_after_the_first_step_or_another_error_leaves_the_run_failed(sqlite_uri, tmp_path, untrained):
    from mlflow import MlflowClient

    from runner.errors import ConfigError, DataError

    _, err = _refused_inside(_cfg(sqlite_uri, tmp_path / "a"), DataError("record 0 of data/x.tfrecord is damaged"))
    untrained.mark(untrained.FIRST_STEP)
    _, late = _refused_inside(_cfg(sqlite_uri, tmp_path / "b"), ConfigError("train.early_stopping.monitor=eval/x"))
    runs = _runs(sqlite_uri)
    assert [r.info.status for r in runs] == ["FAILED", "FAILED"] and len(_all_runs(sqlite_uri)) == 2
    for r in runs:
        assert "error.txt" in [a.path for a in MlflowClient(sqlite_uri).list_artifacts(r.info.run_id)]
    assert not hasattr(err, "run_deleted") and not hasattr(late, "run_deleted")
    assert (tmp_path / "a" / "run" / "mlflow_run_id").exists() and (tmp_path / "b" / "run" / "mlflow_run_id").exists()


def test_a_continued_run_refused_before_its_first_step_is_never_deleted(sqlite_uri, tmp_path, untrained):
    from runner.errors import ConfigError
    from runner.tracking import run

    cfg = _cfg(sqlite_uri, tmp_path)
    with run.mlflow_run(cfg, ["train.epochs=1"], {}) as first:
        first.log_metrics({"loss": 0.5}, 1)
    OmegaConf.update(cfg, "train.epochs", 2)  # resumed to train longer, then refused (another model, say)
    _, err = _refused_inside(cfg, ConfigError("the checkpoints in ... are intact, but a model of another shape wrote them"))
    (only,) = _runs(sqlite_uri)
    assert only.info.run_id == first.run_id and only.info.status == "FINISHED" and only.info.lifecycle_stage == "active"
    assert "resume_refused" in only.data.tags and not hasattr(err, "run_deleted")
    assert only.data.tags["runner.train.epochs"] == "1"  # what it trained: a resume with train.epochs=2 is not refused
    assert (tmp_path / "run" / "mlflow_run_id").read_text() == first.run_id


def test_a_run_created_ahead_and_refused_before_training_took_it_is_deleted(sqlite_uri, tmp_path, untrained):
    from runner.errors import ConfigError
    from runner.tracking import run

    run.prestart(_cfg(sqlite_uri, tmp_path), ["train.epochs=1"], {})
    err = ConfigError("devices.gpus=2: this machine has none")
    run.end_prestarted(err)
    assert not _runs(sqlite_uri)
    (gone,) = _all_runs(sqlite_uri)
    assert gone.info.lifecycle_stage == "deleted" and gone.info.status == "FAILED"
    assert err.run_deleted == gone.info.run_id and not run._early and not run._prestarted


@pytest.mark.parametrize(
    ("held", "says"),
    [
        (bytes(range(128, 168)), "holds no MLflow run id (40 bytes, starting b'\\x80"),
        (b"deadbeefdeadbeefdeadbeefdeadbeef\n", "names MLflow run deadbeefdeadbeefdeadbeefdeadbeef, which the store at"),
    ],
    ids=["garbage", "unknown-run"],
)
def test_a_damaged_run_id_file_is_named_and_nothing_is_created(sqlite_uri, tmp_path, held, says):
    from runner.errors import ConfigError
    from runner.tracking import run

    cfg = _cfg(sqlite_uri, tmp_path)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "mlflow_run_id").write_bytes(held)
    with pytest.raises(ConfigError) as refused:
        with run.mlflow_run(cfg, ["resume=x"], {}):
            pass
    assert says in str(refused.value) and f"{tmp_path / 'run' / 'mlflow_run_id'}" in str(refused.value)
    assert "move the file away" in str(refused.value) or "move that file away" in str(refused.value)
    assert (tmp_path / "run" / "mlflow_run_id").read_bytes() == held and _runs(sqlite_uri) == []


def test_the_steps_a_killed_attempt_delivered_after_its_last_journal_write_are_not_logged_again(monkeypatch):
    """A chief killed by its launcher (a peer lost under Ray) may have delivered steps 20 and 24 after its journal's
    last write (16): the next attempt skips up to the store's last loss step, whatever the journal or the launcher say."""
    from runner.control import contract
    from runner.tracking.run import _logged_through

    monkeypatch.setenv(contract.LOGGED_THROUGH, "12")
    assert _logged_through(16, attached=True, earlier={"loss": [24, 1.3]}) == 24
    assert _logged_through(16, attached=True, earlier={"loss": None}) == 16
    assert _logged_through(None, attached=True) == 12 and _logged_through(None, attached=False) is None
