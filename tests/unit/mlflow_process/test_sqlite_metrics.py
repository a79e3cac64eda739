"""runner/mlflow_process/sqlite_metrics.py: values written without MLflow's ORM are what MLflow's own log_batch
leaves in the store, as MLflow reads them back (every point of every key, and the latest value per key), for batches
Hypothesis draws: NaN and infinities, ties in step and timestamp, values sent twice. Errors stay MLflow's own."""

import contextlib
import math
import sqlite3

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from runner.mlflow_process.sqlite_metrics import SqliteMetrics

KEYS = ["loss", "throughput/window_examples_per_sec", "loss/replica_0"]
VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.sampled_from([0.0, 1.0, float("nan"), float("inf"), -float("inf")]),
)
ROW = st.tuples(st.sampled_from(KEYS), VALUES, st.integers(0, 1), st.integers(0, 2))  # few timestamps, steps: ties
BATCHES = st.lists(st.lists(ROW, min_size=1, max_size=30), min_size=1, max_size=4)


@pytest.fixture(scope="module")
def store(migrated_store, tmp_path_factory):
    import shutil

    from mlflow import MlflowClient

    path = tmp_path_factory.mktemp("sqlite-metrics") / "mlflow.db"
    shutil.copy(migrated_store, path)
    uri = f"sqlite:///{path}"
    client = MlflowClient(uri)
    return uri, client, client.create_experiment("e", artifact_location=str(path.parent / "a")), SqliteMetrics.for_uri(uri)


def _held(client, uri, run_id):
    """What MLflow reads back (every point per key, sorted, NaN as a string; the latest value per key) and the
    latest-metrics rows themselves (which point each key's latest is: step, timestamp, value, NaN flag)."""

    def plain(v):
        return "nan" if math.isnan(v) else v

    history = {k: sorted((m.step, m.timestamp, str(plain(m.value))) for m in client.get_metric_history(run_id, k)) for k in KEYS}
    latest = {k: plain(v) for k, v in client.get_run(run_id).data.metrics.items()}
    with contextlib.closing(sqlite3.connect(uri[len("sqlite:///") :])) as db:
        rows = db.execute(
            "SELECT key, value, timestamp, step, is_nan FROM latest_metrics WHERE run_uuid = ? ORDER BY key", (run_id,)
        ).fetchall()
    return history, latest, rows


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=BATCHES)
@example(batches=[[("loss", float("nan"), 1, 2)], [("loss", 0.0, 1, 2)]])  # a tie: the first stays the latest
@example(batches=[[("loss", float("inf"), 1, 2), ("loss", -float("inf"), 1, 2), ("loss", 5.0, 1, 2)], [("loss", 5.0, 1, 2)]])
def test_the_store_holds_what_mlflows_log_batch_leaves(store, batches):
    from mlflow.entities import Metric

    uri, client, experiment, fast = store
    theirs, ours = client.create_run(experiment).info.run_id, client.create_run(experiment).info.run_id
    for batch in batches:
        client.log_batch(theirs, metrics=[Metric(*m) for m in batch])
        fast.log(client, ours, [list(m) for m in batch])
    assert _held(client, uri, ours) == _held(client, uri, theirs)


def test_a_run_with_values_continued_by_another_process(store):
    """A resumed run: a fresh writer (nothing known of the run) adds to what the store holds, as MLflow would."""
    from mlflow.entities import Metric

    uri, client, experiment, fast = store
    theirs, ours = client.create_run(experiment).info.run_id, client.create_run(experiment).info.run_id
    batches = [[("loss", 2.0, 5, 10), ("loss", 1.0, 6, 20)], [("loss", 0.5, 7, 15), ("loss", 3.0, 8, 30)]]
    client.log_batch(theirs, metrics=[Metric(*m) for m in batches[0]])
    fast.log(client, ours, [list(m) for m in batches[0]])
    client.log_batch(theirs, metrics=[Metric(*m) for m in batches[1]])
    SqliteMetrics.for_uri(uri).log(client, ours, [list(m) for m in batches[1]])
    assert _held(client, uri, ours) == _held(client, uri, theirs)


def test_a_batch_with_tags_stores_both_and_one_that_is_not_runlogs_goes_to_mlflow(store):
    from mlflow.exceptions import MlflowException

    from runner.mlflow_process.process import Calls

    uri, client, experiment, fast = store
    calls = Calls(client, uri, 1)
    run = client.create_run(experiment).info.run_id
    calls.log_batch(run, metrics=[["loss", 1.0, 1, 1], ["loss", 0.5, 2, 2]], tags=[["phase", "train"]])
    assert client.get_run(run).data.tags["phase"] == "train"
    assert [m.value for m in client.get_metric_history(run, "loss")] == [1.0, 0.5]
    with pytest.raises(MlflowException, match="metrics"):  # MLflow's own check of the value
        calls.log_batch(run, metrics=[["loss", "not a number", 3, 3]])
    assert len(client.get_metric_history(run, "loss")) == 2


def test_other_stores_are_left_to_mlflow():
    assert SqliteMetrics.for_uri("http://127.0.0.1:5000") is None
    assert SqliteMetrics.for_uri("postgresql://u:p@db/mlflow") is None
    assert SqliteMetrics.for_uri("sqlite:///:memory:") is None


def test_a_deleted_or_missing_run_gets_mlflows_own_error_and_nothing_is_stored(store):
    from mlflow.exceptions import MlflowException

    uri, client, experiment, fast = store
    run = client.create_run(experiment).info.run_id
    fast.log(client, run, [["loss", 1.0, 1, 1]])  # its keys are known now: the next batch takes the fast path
    client.delete_run(run)
    with pytest.raises(MlflowException, match="must be in the 'active' state"):
        fast.log(client, run, [["loss", 2.0, 2, 2]])
    client.restore_run(run)
    assert [m.value for m in client.get_metric_history(run, "loss")] == [1.0]
    with pytest.raises(MlflowException) as err:
        fast.log(client, "0" * 32, [["loss", 1.0, 1, 1]])
    assert err.value.error_code == "RESOURCE_DOES_NOT_EXIST"


def test_a_key_mlflow_refuses_is_refused_with_its_error(store):
    from mlflow.exceptions import MlflowException

    uri, client, experiment, fast = store
    run = client.create_run(experiment).info.run_id
    with pytest.raises(MlflowException, match="Names may only contain"):
        fast.log(client, run, [["loss", 1.0, 1, 1], ["bad\x00key", 1.0, 1, 1]])
    assert client.get_run(run).data.metrics == {}
