"""runner/tracking/journal.py on a journal damaged past a line cut by a kill (bytes that are not text, rows of the wrong
types): a resume reads what is whole instead of stopping on a traceback, and keeps the damaged file. In process,
against a real SQLite MLflow store."""

import os

import pytest

from runner.mlflow_process import delivery
from runner.tracking import journal


@pytest.fixture
def mlflow(sqlite_uri, tmp_path):
    from mlflow import MlflowClient

    client = MlflowClient(sqlite_uri)
    experiment = client.create_experiment("journal", artifact_location=str(tmp_path / "artifacts"))
    return client, client.create_run(experiment).info.run_id


def rows(steps):
    return [("loss", float(step), 1_700_000_000_000 + step, step) for step in steps]


def test_random_bytes_and_wrong_rows_are_skipped_and_the_journal_is_kept(mlflow, tmp_path):
    client, run_id = mlflow
    j = journal.Journal(str(tmp_path))
    j.append(rows([1, 2]))
    j.close(remove=False)
    with open(journal.path_in(str(tmp_path)), "ab") as f:
        f.write(os.urandom(256).replace(b"\n", b"\x00") + b"\n")  # not text
        f.write(b'["loss", "x", 1, "three"]\n{"delivered": "many"}\n')  # JSON, but not a row nor a mark
    with open(journal.path_in(str(tmp_path)), "a") as f:
        f.write('["loss", 3.0, 1700000000003, 3]\n')
    assert journal.read(str(tmp_path)) == (rows([1, 2, 3]), 3)
    assert delivery.deliver_journal(client, run_id, str(tmp_path)) == (3, 3)
    assert sorted(m.step for m in client.get_metric_history(run_id, "loss")) == [1, 2, 3]
    assert not (tmp_path / journal.FILE).exists() and (tmp_path / journal.DAMAGED).exists()  # kept to look at


def test_a_journal_of_random_bytes_reads_as_empty(tmp_path):
    (tmp_path / journal.FILE).write_bytes(os.urandom(2048))
    assert journal.read(str(tmp_path)) == ([], None)
