"""runner/tracking/outbox.py and runner/tracking/journal.py: what MLflow did not get, kept on disk and delivered later, round trip
into a real SQLite MLflow store (written by the real modules, read back with MlflowClient)."""

import json

import pytest

from runner.mlflow_process import delivery
from runner.tracking import journal, outbox


@pytest.fixture
def mlflow(sqlite_uri, tmp_path):
    """(client, a RUNNING run's id) in a fresh store of this test's own."""
    from mlflow import MlflowClient

    client = MlflowClient(sqlite_uri)
    experiment = client.create_experiment("delivery", artifact_location=str(tmp_path / "artifacts"))
    return client, client.create_run(experiment).info.run_id


def history(client, run_id, key):
    return sorted((m.step, m.value, m.timestamp) for m in client.get_metric_history(run_id, key))


# --- outbox -----------------------------------------------------------------------------------------------------
def test_exists_only_for_a_directory_holding_an_outbox(tmp_path):
    assert not outbox.exists(None) and not outbox.exists("") and not outbox.exists(str(tmp_path))
    outbox.save(str(tmp_path), "r", [], [], None)
    assert outbox.exists(str(tmp_path))
    assert outbox.path_in(str(tmp_path)) == str(tmp_path / "mlflow_outbox.jsonl")


def test_save_makes_the_directory_and_appends_one_record_per_call(tmp_path):
    directory = tmp_path / "not" / "yet"
    outbox.save(str(directory), "run-a", [("loss", 0.5, 1000, 1)], [("error", "x")], "FAILED")
    path = outbox.save(str(directory), "run-b", [], [], None)
    with open(path) as f:
        records = [json.loads(line) for line in f]
    assert records == [
        {"run_id": "run-a", "metrics": [["loss", 0.5, 1000, 1]], "tags": [["error", "x"]], "status": "FAILED"},
        {"run_id": "run-b", "metrics": [], "tags": [], "status": None},
    ]


def test_outbox_round_trip_delivers_metrics_tags_and_status_then_removes_the_file(mlflow, tmp_path):
    client, run_id = mlflow
    metrics = [("loss", 1.0 / step, 1_700_000_000_000 + step, step) for step in range(1, 2501)]  # more than one log_batch
    outbox.save(str(tmp_path), run_id, metrics[:1200], [("phase", "train")], None)
    outbox.save(str(tmp_path), run_id, metrics[1200:], [("stopped_by", "SIGTERM")], "KILLED")

    assert delivery.deliver_outbox(client, str(tmp_path)) == 2500
    run = client.get_run(run_id)
    assert run.info.status == "KILLED"
    assert run.data.tags["phase"] == "train" and run.data.tags["stopped_by"] == "SIGTERM"
    assert history(client, run_id, "loss") == [(step, value, ts) for _, value, ts, step in metrics]
    assert not outbox.exists(str(tmp_path))


def test_an_outbox_of_tags_and_status_only_is_delivered(mlflow, tmp_path):
    client, run_id = mlflow
    outbox.save(str(tmp_path), run_id, [], [("error", "the server went away")], "FAILED")
    assert delivery.deliver_outbox(client, str(tmp_path)) == 0
    run = client.get_run(run_id)
    assert run.info.status == "FAILED" and run.data.tags["error"] == "the server went away"


def test_records_for_several_runs_go_to_each_run(mlflow, tmp_path):
    client, first = mlflow
    second = client.create_run(client.get_run(first).info.experiment_id).info.run_id
    outbox.save(str(tmp_path), first, [("loss", 1.0, 1, 1)], [], "FINISHED")
    outbox.save(str(tmp_path), second, [("loss", 2.0, 1, 1)], [], None)
    assert delivery.deliver_outbox(client, str(tmp_path)) == 2
    assert [m.value for m in client.get_metric_history(first, "loss")] == [1.0]
    assert [m.value for m in client.get_metric_history(second, "loss")] == [2.0]
    assert client.get_run(first).info.status == "FINISHED" and client.get_run(second).info.status == "RUNNING"


# --- journal ----------------------------------------------------------------------------------------------------
def rows(steps, key="loss"):
    return [(key, float(step), 1_700_000_000_000 + step, step) for step in steps]


def test_read_without_a_journal_is_empty(tmp_path):
    assert journal.read(None) == ([], None)
    assert journal.read(str(tmp_path)) == ([], None)


def test_the_journal_keeps_what_was_not_delivered_and_the_largest_step(tmp_path):
    j = journal.Journal(str(tmp_path / "run"))
    j.append(rows(range(1, 6)))
    j.delivered(3)  # the store took the first three values
    j.append(rows(range(6, 9)))
    j.append([])
    j.close(remove=False)
    pending, last_step = journal.read(str(tmp_path / "run"))
    assert pending == rows(range(4, 9))
    assert last_step == 8


def test_a_line_cut_by_a_kill_is_skipped(tmp_path):
    j = journal.Journal(str(tmp_path))
    j.append(rows([1, 2]))
    j.close(remove=False)
    with open(journal.path_in(str(tmp_path)), "a") as f:
        f.write('["loss", 3.0, 17')  # kill -9 in the middle of a write
    assert journal.read(str(tmp_path)) == (rows([1, 2]), 2)


def test_a_resumed_attempt_keeps_the_earlier_watermark_even_with_nothing_logged(tmp_path):
    journal.Journal(str(tmp_path), last_step=120).close(remove=False)
    assert journal.read(str(tmp_path)) == ([], 120)


def test_close_removes_the_journal_when_told(tmp_path):
    j = journal.Journal(str(tmp_path))
    j.append(rows([1]))
    j.close(remove=True)
    assert journal.read(str(tmp_path)) == ([], None)


def test_close_of_a_journal_whose_directory_was_deleted_under_the_run_ends_quietly(tmp_path):
    import shutil

    j = journal.Journal(str(tmp_path / "run"))
    j.append(rows([1]))
    shutil.rmtree(tmp_path / "run")  # `rm -rf` of the working directory while the run trains
    j.close(remove=True)  # was FileNotFoundError, a traceback after a run that trained to the end


def test_journal_rows_are_on_disk_before_close(tmp_path):
    """Written each second into the page cache: a process killed with -9 loses nothing it appended."""
    j = journal.Journal(str(tmp_path))
    j.append(rows([1, 2, 3]))
    try:
        assert journal.read(str(tmp_path)) == (rows([1, 2, 3]), 3)
    finally:
        j.close(remove=False)


def test_journal_round_trip_delivers_the_rest_once_and_removes_the_file(mlflow, tmp_path):
    client, run_id = mlflow
    j = journal.Journal(str(tmp_path))
    j.append(rows(range(1, 1501)) + rows(range(1, 1501), key="throughput/window_examples_per_sec"))
    j.delivered(1000)  # as if the sender had sent the first batch
    j.close(remove=False)
    sent, last_step = delivery.deliver_journal(client, run_id, str(tmp_path))
    assert (sent, last_step) == (2000, 1500)
    assert [step for step, _, _ in history(client, run_id, "loss")] == list(range(1001, 1501))
    assert [step for step, _, _ in history(client, run_id, "throughput/window_examples_per_sec")] == list(range(1, 1501))
    assert not (tmp_path / journal.FILE).exists()
    assert delivery.deliver_journal(client, run_id, str(tmp_path)) == (0, None)  # nothing twice


def test_sending_a_value_twice_keeps_one_row(mlflow, tmp_path):
    """Why the journal may resend the batch it was writing when the process died: MLflow keeps one row per
    (key, timestamp, step, value)."""
    client, run_id = mlflow
    for _ in range(2):
        j = journal.Journal(str(tmp_path))
        j.append(rows([1, 2]))
        j.close(remove=False)
        delivery.deliver_journal(client, run_id, str(tmp_path))
    assert [step for step, _, _ in history(client, run_id, "loss")] == [1, 2]


@pytest.mark.parametrize("key", ["throughput/window_examples_per_sec", "throughput/examples_per_sec"])
def test_a_continued_run_finds_the_throughput_windows_under_either_name(mlflow, key):
    """A run an earlier version started logged its windows as throughput/examples_per_sec: continued by this one
    with nothing left to train, its summary is still rebuilt from them (store.earlier_figures)."""
    from runner.mlflow_process import store

    client, run_id = mlflow
    for step, rate in ((10, 100.0), (20, 200.0)):
        client.log_metric(run_id, key, rate, step=step)
    assert store.earlier_figures(client, run_id)["windows"] == [[10, 100.0], [20, 200.0]]
