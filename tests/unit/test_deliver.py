"""`python -m runner.deliver` on outboxes that are damaged, taken by two deliveries at once, or meant for a store that
lacks the run (docs/reliability.md, "Tracking faults"). In process: runner.deliver.main against real SQLite MLflow
stores, outboxes written by runner/tracking/outbox.py itself; one subprocess test starts two real deliveries together."""

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from runner import deliver
from runner.mlflow_process import delivery
from runner.tracking import outbox

KEY = "late/loss"


@pytest.fixture
def run(sqlite_uri, tmp_path):
    """(client, a RUNNING run's id, its output directory with .hydra/ as a run leaves it) in a store of this test's own;
    the run's .hydra says it was started in tmp_path (whose mlflow.db is the store)."""
    from mlflow import MlflowClient

    client = MlflowClient(sqlite_uri)
    experiment = client.create_experiment("deliver", artifact_location=str(tmp_path / "artifacts"))
    run_id = client.create_run(experiment).info.run_id
    out = tmp_path / "outputs" / "run"
    (out / ".hydra").mkdir(parents=True)
    (out / ".hydra" / "config.yaml").write_text("mlflow:\n  tracking_uri: null\n")
    (out / ".hydra" / "hydra.yaml").write_text(f"hydra:\n  runtime:\n    cwd: {tmp_path}\n")
    (out / "mlflow_run_id").write_text(run_id)
    return client, run_id, out


def values(steps, key=KEY):
    return [(key, float(step), 1_700_000_000_000 + step, step) for step in steps]


def steps_in(client, run_id, key=KEY):
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def call(capsys, *argv):
    code = deliver.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def one_paragraph(err):
    assert err.startswith("Error: ") and len(err.strip().splitlines()) == 1, err


# --- damaged outbox files ------------------------------------------------------------------------------------------
def test_an_outbox_cut_mid_line_delivers_its_whole_records_and_keeps_the_cut_one(run, capsys, sqlite_uri):
    client, run_id, out = run
    outbox.save(str(out), run_id, values(range(1, 1201)), [("phase", "train")], None)
    outbox.save(str(out), run_id, values(range(1201, 1301)), [], "FINISHED")
    path = outbox.path_in(str(out))
    data = open(path, "rb").read()
    open(path, "wb").write(data[:-40])  # the last record cut by a crash
    cut = data[:-40].split(b"\n")[1]

    code, stdout, err = call(capsys, out, "--tracking-uri", sqlite_uri)
    assert code == 2
    one_paragraph(err)
    assert "line 2" in err and "cut short" in err and outbox.DAMAGED in err
    assert "delivered 1200 metric value(s)" in stdout
    assert steps_in(client, run_id) == list(range(1, 1201))  # every whole record, once
    assert open(out / outbox.DAMAGED, "rb").read() == cut + b"\n"  # the cut record is kept as it was
    assert not (out / outbox.FILE).exists()
    assert call(capsys, out, "--tracking-uri", sqlite_uri)[0] == 0  # a rerun: nothing more to do, nothing twice


def test_a_record_cut_by_a_crash_and_the_next_one_on_its_line_is_sent(run, capsys, sqlite_uri):
    """save() died mid-write, a later save() appended after the cut record: the record after it is whole."""
    client, run_id, out = run
    outbox.save(str(out), run_id, values(range(1, 11)), [], None)
    outbox.save(str(out), run_id, values(range(11, 21)), [], None)
    first, second, _ = open(outbox.path_in(str(out)), "rb").read().split(b"\n")
    open(outbox.path_in(str(out)), "wb").write(first[:100] + second + b"\n")
    code, _, err = call(capsys, out, "--tracking-uri", sqlite_uri)
    assert code == 2 and "line 1" in err
    assert steps_in(client, run_id) == list(range(11, 21))
    assert open(out / outbox.DAMAGED, "rb").read() == first[:100] + b"\n"


def test_an_outbox_of_random_bytes_sends_nothing_and_keeps_its_bytes(run, capsys, sqlite_uri):
    client, run_id, out = run
    junk = os.urandom(4096).replace(b"\n", b"\x00") + b"\n" + os.urandom(512).replace(b"\n", b"\x00")
    (out / outbox.FILE).write_bytes(junk)
    code, _, err = call(capsys, out, "--tracking-uri", sqlite_uri)
    assert code == 2
    one_paragraph(err)
    assert "holds no outbox record" in err and str(out / outbox.DAMAGED) in err
    assert (out / outbox.DAMAGED).read_bytes() == junk + b"\n"
    assert client.get_run(run_id).data.metrics == {} and client.get_run(run_id).info.status == "RUNNING"


@pytest.mark.parametrize(
    "line,why",
    [
        (b'{"run_id": "r", "metrics": [["loss", "high", 1, 1]], "tags": [], "status": null}', "metrics are not"),
        (b'{"run_id": "r", "metrics": [], "tags": [], "status": "DONE"}', "status 'DONE'"),
        (b'["loss", 1.0, 1, 1]', "no run_id"),
        (b"not json at all}", "not JSON"),
    ],
)
def test_lines_that_are_not_outbox_records_are_named(line, why):
    records, damaged = outbox.parse(line + b"\n")
    assert records == [] and damaged[0][0] == 1 and why in damaged[0][2]


def test_an_empty_outbox_is_removed_with_nothing_to_deliver(run, capsys, sqlite_uri):
    _, _, out = run
    (out / outbox.FILE).write_bytes(b"")
    code, stdout, _ = call(capsys, out, "--tracking-uri", sqlite_uri)
    assert code == 0 and "was empty" in stdout and not (out / outbox.FILE).exists()


def test_an_outbox_that_is_a_directory_is_named_and_left_alone(run, capsys, sqlite_uri):
    _, _, out = run
    (out / outbox.FILE).mkdir()
    (out / outbox.FILE / "keep.jsonl").write_text("{}\n")
    code, stdout, err = call(capsys, out, "--tracking-uri", sqlite_uri)
    assert code == 2 and "Nothing to deliver" not in stdout
    one_paragraph(err)
    assert f"{out / outbox.FILE} is a directory" in err
    assert (out / outbox.FILE / "keep.jsonl").read_text() == "{}\n"


# --- two deliveries at once ----------------------------------------------------------------------------------------
class SlowClient:
    """A real MlflowClient whose log_batch takes its time, counting the values it is given."""

    def __init__(self, client):
        self.client, self.sent, self.lock = client, [], threading.Lock()

    def log_batch(self, run_id, metrics=(), tags=()):
        time.sleep(0.2)  # both deliveries are under way before either finishes
        with self.lock:
            self.sent += [(m.key, m.step) for m in metrics]
        self.client.log_batch(run_id, metrics=metrics, tags=tags)

    def __getattr__(self, name):
        return getattr(self.client, name)


def test_two_deliveries_at_once_send_each_value_once(run):
    client, run_id, out = run
    outbox.save(str(out), run_id, values(range(1, 2501)), [], "FINISHED")
    slow, results, errors = SlowClient(client), [], []

    def one():
        try:
            results.append(delivery.send_outbox(slow, str(out)))
        except Exception as err:  # noqa: BLE001 - the test reports it
            errors.append(err)

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert sorted(slow.sent) == [(KEY, step) for step in range(1, 2501)]  # each value sent once, by one of them
    assert sorted(r.found for r in results) == [False, True]
    assert client.get_run(run_id).info.status == "FINISHED" and not (out / outbox.FILE).exists()


def test_a_save_during_a_delivery_is_not_lost(run):
    """A run appending to the outbox while a delivery sends it: its record lands in the outbox that is left."""
    client, run_id, out = run
    outbox.save(str(out), run_id, values(range(1, 3)), [], None)
    slow = SlowClient(client)
    sender = threading.Thread(target=delivery.send_outbox, args=(slow, str(out)))
    sender.start()
    time.sleep(0.05)
    outbox.save(str(out), run_id, values(range(3, 5)), [], None)  # waits for the delivery, then appends
    sender.join(30)
    delivery.deliver_outbox(client, str(out))
    assert steps_in(client, run_id) == [1, 2, 3, 4]


@pytest.mark.slow  # two real processes (each imports MLflow)
def test_two_processes_started_together_deliver_once(run, sqlite_uri):
    client, run_id, out = run
    outbox.save(str(out), run_id, values(range(1, 3001)), [("t", "v")], "FINISHED")
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    argv = [sys.executable, "-m", "runner.deliver", str(out), "--tracking-uri", sqlite_uri]
    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    done = [(p.wait(timeout=120), *p.communicate()) for p in procs]
    assert [code for code, _, _ in done] == [0, 0], done
    assert all("Traceback" not in o + e for _, o, e in done), done
    said = sorted(o.split(" ", 1)[0] for _, o, _ in done)
    assert said == ["Nothing", "delivered"], done  # one sent it, the other found it sent
    assert steps_in(client, run_id) == list(range(1, 3001))


# --- a store without the run ---------------------------------------------------------------------------------------
def test_a_store_that_lacks_the_run_keeps_the_outbox_and_names_the_runs_own(run, capsys, tmp_path, migrated_store):
    import shutil

    client, run_id, out = run
    outbox.save(str(out), run_id, values(range(1, 11)), [], "FINISHED")
    before = (out / outbox.FILE).read_bytes()
    other = tmp_path / "other" / "mlflow.db"
    other.parent.mkdir()
    shutil.copy(migrated_store, other)
    code, _, err = call(capsys, out, "--tracking-uri", f"sqlite:///{other}")
    assert code == 2
    one_paragraph(err)
    assert f"run {run_id} is not in the store sqlite:///{other}" in err
    assert f"--tracking-uri sqlite:///{tmp_path / 'mlflow.db'}" in err  # where the run's directory says it logged
    assert (out / outbox.FILE).read_bytes() == before and steps_in(client, run_id) == []


def test_another_tracking_uri_that_does_not_exist_creates_nothing(run, capsys, tmp_path, monkeypatch):
    _, run_id, out = run
    outbox.save(str(out), run_id, values(range(1, 11)), [], None)
    missing = tmp_path / "elsewhere" / "mlflow.db"
    missing.parent.mkdir()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{missing}")
    code, _, err = call(capsys, out)
    assert code == 2
    one_paragraph(err)
    assert "(MLFLOW_TRACKING_URI) does not exist" in err and "nothing was created" in err
    assert not missing.exists() and (out / outbox.FILE).exists()


def test_a_deleted_run_keeps_the_outbox_and_says_how_to_restore_it(run, capsys, sqlite_uri):
    client, run_id, out = run
    outbox.save(str(out), run_id, values(range(1, 11)), [], "FINISHED")
    client.delete_run(run_id)
    code, _, err = call(capsys, out, "--tracking-uri", sqlite_uri)
    assert code == 2
    one_paragraph(err)
    assert f"mlflow runs restore --run-id {run_id}" in err and (out / outbox.FILE).exists()
    client.restore_run(run_id)
    assert call(capsys, out, "--tracking-uri", sqlite_uri)[0] == 0
    assert steps_in(client, run_id) == list(range(1, 11)) and client.get_run(run_id).info.status == "FINISHED"


def test_without_a_uri_the_runs_own_store_is_used_from_any_directory(run, capsys, monkeypatch, tmp_path):
    """The run used MLflow's default, sqlite:///mlflow.db where it was started; deliver from elsewhere finds it
    there (before: a fresh mlflow.db in the current directory, then a traceback)."""
    client, run_id, out = run
    outbox.save(str(out), run_id, values(range(1, 6)), [], None)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    code, stdout, _ = call(capsys, out)
    assert code == 0 and "delivered 5 metric value(s)" in stdout
    assert steps_in(client, run_id) == [1, 2, 3, 4, 5] and not (elsewhere / "mlflow.db").exists()


def test_records_of_a_missing_run_stay_while_the_others_are_sent(run, capsys, sqlite_uri):
    client, run_id, out = run
    outbox.save(str(out), "0" * 32, values(range(1, 4)), [], "FINISHED")
    outbox.save(str(out), run_id, values(range(1, 4)), [], None)
    code, _, err = call(capsys, out, "--tracking-uri", sqlite_uri)
    assert code == 2 and f"run {'0' * 32} is not in the store" in err
    assert steps_in(client, run_id) == [1, 2, 3]
    left = [json.loads(line) for line in (out / outbox.FILE).read_text().splitlines()]
    assert [r["run_id"] for r in left] == ["0" * 32] and len(left[0]["metrics"]) == 3
