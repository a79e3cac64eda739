"""runner/mlflow_process/store.py: the MLflow store opened safely (fresh, damaged, unknown), the owner tags each run records, and
runs left RUNNING by processes that are gone. Real SQLite stores, real processes (a sleeping `python -c`) as
owners, alive or killed."""

import os
import subprocess
import sys
import threading

import pytest

from runner.control import procs
from runner.errors import ConfigError
from runner.mlflow_process import store
from runner.preflight import sqlite_store

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


# --- opening the store ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "uri,path",
    [
        ("sqlite:////data/mlflow.db", "/data/mlflow.db"),
        ("sqlite:////data/mlflow.db?timeout=30", "/data/mlflow.db"),
        ("sqlite:///mlflow.db", os.path.abspath("mlflow.db")),
        ("sqlite:///:memory:", None),
        ("sqlite:///", None),
        ("http://127.0.0.1:5000", None),
        ("postgresql://u:p@db/mlflow", None),
    ],
)
def test_sqlite_path(uri, path):
    assert sqlite_store.sqlite_path(uri) == path


def test_a_fresh_store_is_created_under_a_lock_and_ready(tmp_path):
    path = tmp_path / "mlflow.db"
    client = store.open_client(f"sqlite:///{path}")
    assert path.read_bytes()[:16] == b"SQLite format 3\x00"
    assert (tmp_path / "mlflow.db.lock").exists()
    assert [e.name for e in client.search_experiments()] == ["Default"]


def test_a_fresh_store_is_created_without_mlflows_migration_lines(tmp_path, capfd, caplog):
    store.open_client(f"sqlite:///{tmp_path / 'mlflow.db'}").search_experiments()
    said = capfd.readouterr().err + caplog.text
    assert "database tables" not in said and "alembic" not in said, said


def test_an_existing_store_opens_and_keeps_its_runs(sqlite_uri, tmp_path):
    from mlflow import MlflowClient

    experiment = MlflowClient(sqlite_uri).create_experiment("kept", artifact_location=str(tmp_path / "a"))
    client = store.open_client(sqlite_uri)
    assert client.get_experiment(experiment).name == "kept"


def test_a_directory_is_not_a_store(tmp_path):
    with pytest.raises(ConfigError, match=f"the MLflow store {tmp_path} is a directory, not an SQLite file"):
        store.open_client(f"sqlite:///{tmp_path}")


def test_a_store_in_a_directory_that_does_not_exist_is_refused_without_making_it(tmp_path):
    missing = tmp_path / "no" / "such"
    with pytest.raises(ConfigError, match=f"its directory {missing} does not exist"):
        store.open_client(f"sqlite:///{missing}/mlflow.db")
    assert not (tmp_path / "no").exists()


def test_a_file_that_is_not_sqlite_is_refused_and_left_as_it_was(tmp_path):
    path = tmp_path / "mlflow.db"
    path.write_text("my notes, not a database\n")
    with pytest.raises(ConfigError) as err:
        store.open_client(f"sqlite:///{path}")
    message = str(err.value)
    assert f"the MLflow store {path} cannot be used: it is not an SQLite database" in message
    assert f"mv {path} {path}.broken" in message and "mlflow.enabled=false" in message
    assert path.read_text() == "my notes, not a database\n"


def test_a_damaged_sqlite_file_is_refused_with_the_reason(tmp_path):
    path = tmp_path / "mlflow.db"
    path.write_bytes(b"SQLite format 3\x00" + b"\xff" * 4080)  # the header, then garbage
    with pytest.raises(ConfigError) as err:
        store.open_client(f"sqlite:///{path}")
    message = str(err.value)
    assert message.startswith(f"the MLflow store {path} cannot be used: ") and "Nothing was trained" in message
    assert "\n" not in message


@pytest.fixture
def read_only_dir(tmp_path):
    """A directory nothing can be written in: a read-only mount as root (root writes through mode bits), else one
    whose write bits are cleared."""
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() == 0:
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "tmpfs", str(ro)], capture_output=True).returncode:
            pytest.skip("root here cannot mount a read-only tmpfs")
        yield ro
        subprocess.run(["umount", str(ro)], check=True)
    else:
        ro.chmod(0o555)
        yield ro
        ro.chmod(0o755)


def test_a_store_that_cannot_be_written_is_refused_at_once_naming_it(read_only_dir, sqlite_uri):
    """Before: refused after MLflow's engine retries, 105-113 s, with the advice to move a file that is not there."""
    import time

    from hydra import compose, initialize_config_module

    from runner.config import schema
    from runner.preflight.needs import tracking_server_reachable

    schema.register()
    path = read_only_dir / "mlflow.db"
    begun = time.monotonic()
    with pytest.raises(ConfigError) as err:
        store.open_client(f"sqlite:///{path}")
    assert time.monotonic() - begun < 2
    message = str(err.value)
    assert message.startswith(f"the MLflow store {path} cannot be used: its directory {read_only_dir} cannot be written (")
    assert "sqlite:///<dir>/mlflow.db" in message and "mlflow.enabled=false" in message and ".broken" not in message
    with initialize_config_module(config_module="runner.conf", version_base="1.3"):  # before TensorFlow, in preflight
        cfg = compose(config_name="config", overrides=[f"mlflow.tracking_uri=sqlite:///{path}"])
    with pytest.raises(ConfigError, match=f"^the MLflow store {path} cannot be used: .* Point mlflow.tracking_uri at"):
        tracking_server_reachable(cfg)
    if os.geteuid() != 0:  # a store that exists but whose file is read-only
        existing = sqlite_store.sqlite_path(sqlite_uri)
        os.chmod(existing, 0o444)
        try:
            with pytest.raises(ConfigError, match="the file cannot be written"):
                store.open_client(sqlite_uri)
        finally:
            os.chmod(existing, 0o644)


def test_an_unknown_scheme_is_refused_with_the_password_masked():
    with pytest.raises(ConfigError) as err:
        store.open_client("mlfow+typo://alice:hunter2@host/db")
    message = str(err.value)
    assert "'mlfow+typo://alice:***@host/db' has a scheme MLflow does not know" in message
    assert "hunter2" not in message and "sqlite:///<path>" in message


def test_a_server_uri_gives_a_client_without_contacting_it():
    client = store.open_client("http://127.0.0.1:9")  # nothing listens on the discard port: not asked yet
    assert client.tracking_uri == "http://127.0.0.1:9"


# --- owners -----------------------------------------------------------------------------------------------------
@pytest.fixture
def mlflow(sqlite_uri, tmp_path):
    """(client, experiment id) in a fresh store of this test's own."""
    from mlflow import MlflowClient

    client = MlflowClient(sqlite_uri)
    return client, client.create_experiment("owners", artifact_location=str(tmp_path / "artifacts"))


@pytest.fixture
def live_process():
    """The identity of a real process that runs until the test ends."""
    proc = subprocess.Popen(SLEEPER)
    yield procs.identity(proc.pid)
    proc.kill()
    proc.wait()


@pytest.fixture
def dead_process():
    """The identity a real process had while it ran; it has exited since (and its pid was reaped)."""
    proc = subprocess.Popen(SLEEPER)
    identity = procs.identity(proc.pid)
    proc.kill()
    proc.wait()
    return identity


def owned_run(client, experiment, owner, status="RUNNING", name=None, **tags):
    tags.update({tag: owner[key] for key, tag in store.OWNER_TAGS.items()} if owner else {})
    run = client.create_run(experiment, run_name=name, tags=tags)
    if status != "RUNNING":
        client.set_terminated(run.info.run_id, status)
    return client.get_run(run.info.run_id)


def test_started_records_this_process_as_the_owner(mlflow):
    client, experiment = mlflow
    run = client.create_run(experiment)
    store.started(client, run, epochs=5)
    _housekeeping_done()
    tags = client.get_run(run.info.run_id).data.tags
    me = procs.identity()
    assert {key: tags[tag] for key, tag in store.OWNER_TAGS.items()} == me
    assert tags[store.EPOCHS_TAG] == "5"


def test_started_can_record_another_process_as_the_owner(mlflow, live_process):
    client, experiment = mlflow
    run = client.create_run(experiment)
    store.started(client, run, owner=int(live_process["pid"]))
    _housekeeping_done()
    tags = client.get_run(run.info.run_id).data.tags
    assert tags[store.OWNER_TAGS["pid"]] == live_process["pid"]
    assert tags[store.OWNER_TAGS["start"]] == live_process["start"]
    assert store.EPOCHS_TAG not in tags


def _housekeeping_done():
    """started() looks for stale runs in a background thread: wait for it."""
    for thread in threading.enumerate():
        if thread.name == "mlflow-stale-runs":
            thread.join(timeout=60)


def test_owner_dead_and_live_owner(mlflow, live_process, dead_process):
    client, experiment = mlflow
    alive = owned_run(client, experiment, live_process)
    dead = owned_run(client, experiment, dead_process)
    mine = owned_run(client, experiment, procs.identity())
    nobody = owned_run(client, experiment, None)
    elsewhere = owned_run(client, experiment, {**live_process, "host": "another-host"})
    assert [store.owner_dead(r) for r in (alive, dead, mine, nobody, elsewhere)] == [False, True, False, False, False]
    assert store.live_owner(alive) == live_process["pid"]
    assert store.live_owner(dead) is None and store.live_owner(nobody) is None and store.live_owner(elsewhere) is None
    assert store.live_owner(mine) is None  # this process is not another owner
    assert store.live_owner(mine, me=int(live_process["pid"])) == str(os.getpid())  # seen from another process


def test_fail_dead_runs_marks_only_running_runs_of_dead_owners_on_this_host(mlflow, live_process, dead_process):
    client, experiment = mlflow
    stale = owned_run(client, experiment, dead_process, name="stale")
    kept = owned_run(client, experiment, dead_process, name="kept")
    untouched = [
        owned_run(client, experiment, live_process, name="alive"),
        owned_run(client, experiment, procs.identity(), name="mine"),
        owned_run(client, experiment, None, name="no-owner"),
        owned_run(client, experiment, {**dead_process, "host": "another-host"}, name="elsewhere"),
        owned_run(client, experiment, dead_process, status="FINISHED", name="finished"),
        kept,
    ]
    failed = store.fail_dead_runs(client, experiment, who="the test", keep=kept.info.run_id)
    assert failed == [stale.info.run_id]
    got = client.get_run(stale.info.run_id)
    assert got.info.status == "FAILED"
    assert got.data.tags["error"] == "process died without ending the run (found by the test)"
    for run in untouched:
        after = client.get_run(run.info.run_id)
        assert after.info.status == run.info.status and "error" not in after.data.tags, run.info.run_name
    assert store.fail_dead_runs(client, experiment, who="again") == [kept.info.run_id]


def test_a_run_that_ended_after_the_search_is_not_marked_failed(mlflow, dead_process, monkeypatch):
    """The search is a snapshot: a run seen RUNNING whose owner then ended it FINISHED and exited (two tiny runs side
    by side, CI under load) kept FINISHED. Before, the snapshot's RUNNING was trusted and the run marked FAILED."""
    client, experiment = mlflow
    run = owned_run(client, experiment, dead_process, name="ended-meanwhile")
    snapshot = client.search_runs([experiment])  # RUNNING here
    client.set_terminated(run.info.run_id, "FINISHED")  # then its owner ended it, and exited
    monkeypatch.setattr(client, "search_runs", lambda *a, **k: snapshot)
    assert store.fail_dead_runs(client, experiment, who="the test") == []
    assert client.get_run(run.info.run_id).info.status == "FINISHED"


def test_fail_dead_runs_never_stops_a_run_when_the_store_cannot_answer(mlflow):
    client, _ = mlflow
    assert store.fail_dead_runs(client, "no-such-experiment-id", who="the test") == []


def test_a_starting_run_fails_the_runs_dead_processes_left_running(mlflow, dead_process):
    client, experiment = mlflow
    stale = owned_run(client, experiment, dead_process)
    run = client.create_run(experiment, run_name="new")
    store.started(client, run)
    _housekeeping_done()
    got = client.get_run(stale.info.run_id)
    assert got.info.status == "FAILED" and f"run new ({run.info.run_id}), pid {os.getpid()}" in got.data.tags["error"]
    assert client.get_run(run.info.run_id).info.status == "RUNNING"


# --- resume= taking a run over ----------------------------------------------------------------------------------
def test_a_finished_run_continues_only_with_more_epochs(mlflow):
    client, experiment = mlflow
    run = owned_run(client, experiment, procs.identity(), status="FINISHED")
    client.log_param(run.info.run_id, "train.epochs", "2")
    run = client.get_run(run.info.run_id)
    with pytest.raises(ConfigError, match=r"is FINISHED: it trained all its train.epochs=2, so there is nothing to continue"):
        store.take_over(client, run, epochs=2, output_dir="/runs/a")
    store.take_over(client, run, epochs=3, output_dir="/runs/a")
    client.set_tag(run.info.run_id, store.EPOCHS_TAG, "4")  # resumed before, to 4 epochs
    with pytest.raises(ConfigError, match="train.epochs=4"):
        store.take_over(client, client.get_run(run.info.run_id), epochs=3, output_dir="/runs/a")
    assert client.get_run(run.info.run_id).info.status == "FINISHED"
    # started with 200 epochs, stopped, resumed to 40 and FINISHED there: 41 continues (the first run's 200 did not)
    other = owned_run(client, experiment, procs.identity(), status="FINISHED")
    client.log_param(other.info.run_id, "train.epochs", "200")
    client.set_tag(other.info.run_id, store.EPOCHS_TAG, "40")
    store.take_over(client, client.get_run(other.info.run_id), epochs=41, output_dir="/runs/b")


def test_a_run_directory_reused_without_resume_is_named_as_such(mlflow):
    """A fixed hydra.run.dir run again (a restarted pod, or a user) continues the run it holds: the refusal names
    hydra.run.dir, not a resume= the user never typed, and says how to start a new run."""
    client, experiment = mlflow
    run = owned_run(client, experiment, procs.identity(), status="FINISHED")
    client.log_param(run.info.run_id, "train.epochs", "2")
    with pytest.raises(ConfigError) as err:
        store.take_over(client, client.get_run(run.info.run_id), epochs=2, output_dir="/runs/a", explicit=False)
    assert str(err.value).startswith("hydra.run.dir=/runs/a holds an earlier run, which is continued:")
    assert "resume=" not in str(err.value) and "pass another hydra.run.dir" in str(err.value)


def test_a_deleted_run_is_not_continued_until_it_is_restored(mlflow):
    client, experiment = mlflow
    run = owned_run(client, experiment, None, status="KILLED")
    client.delete_run(run.info.run_id)
    with pytest.raises(ConfigError, match=rf"is deleted, .* \(`mlflow runs restore --run-id {run.info.run_id}`\)"):
        store.take_over(client, client.get_run(run.info.run_id), epochs=2, output_dir="/runs/a")
    client.restore_run(run.info.run_id)
    store.take_over(client, client.get_run(run.info.run_id), epochs=2, output_dir="/runs/a")


def test_a_finished_run_without_a_recorded_epoch_count_is_not_continued(mlflow):
    client, experiment = mlflow
    run = owned_run(client, experiment, None, status="FINISHED")
    with pytest.raises(ConfigError, match=r"train.epochs=\?"):
        store.take_over(client, run, epochs=100, output_dir="/runs/a")


def test_a_run_whose_process_still_runs_is_not_taken_over(mlflow, live_process):
    client, experiment = mlflow
    run = owned_run(client, experiment, live_process)
    with pytest.raises(ConfigError, match=f"still RUNNING in process {live_process['pid']} on this host. Stop that process"):
        store.take_over(client, run, epochs=2, output_dir="/runs/a")
    assert client.get_run(run.info.run_id).info.status == "RUNNING"


def test_a_run_whose_process_died_is_marked_failed_then_continued(mlflow, dead_process):
    client, experiment = mlflow
    run = owned_run(client, experiment, dead_process)
    store.take_over(client, run, epochs=2, output_dir="/runs/a")
    got = client.get_run(run.info.run_id)
    assert got.info.status == "FAILED"
    assert got.data.tags["error"] == "process died without ending the run (found by resume=/runs/a)"


def test_a_run_this_process_owns_is_continued_as_it_is(mlflow, live_process):
    client, experiment = mlflow
    run = owned_run(client, experiment, live_process)
    store.take_over(client, run, epochs=2, output_dir="/runs/a", me=int(live_process["pid"]))
    assert client.get_run(run.info.run_id).info.status == "RUNNING"


def test_another_programs_sqlite_database_is_refused_and_left_as_it_was(tmp_path):
    import sqlite3

    path = tmp_path / "app.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE users (id INTEGER, name TEXT)")
    before = path.read_bytes()
    with pytest.raises(ConfigError) as err:
        store.open_client(f"sqlite:///{path}")
    assert "another program (its tables: users)" in str(err.value) and "nothing was trained" in str(err.value)
    assert path.read_bytes() == before  # MLflow added its 65 tables to such a file
