"""A sweep's MLflow parent run, created by whichever process needs it first from the request the sweep wrote
(runner.control.contract, runner.mlflow_process.store.sweep_parent): once, under a lock, recorded as the sweep
process's (end to end: every sweep test, tests/e2e/test_sweep.py)."""

import os
import threading

from runner.control import contract, procs


def test_a_request_drops_an_earlier_sweeps_id_and_the_id_is_read_whole(tmp_path):
    path = str(tmp_path / ".runner" / "parent-run.json")
    contract.request_parent_run(path, "exp", "sweep-a", {"sweep.jobs": "4"})
    assert contract.parent_run(path) is None  # requested, not created
    contract.announce_parent_run(path, "abc123")
    assert contract.parent_run(path) == "abc123" and not os.path.exists(path + ".tmp")
    contract.request_parent_run(path, "exp", "sweep-b", {})  # the next sweep in this directory
    assert contract.parent_run(path) is None


def test_jobs_started_together_create_one_parent_run_owned_by_the_sweep(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    from runner.mlflow_process import store

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    path = str(tmp_path / ".runner" / "parent-run.json")
    contract.request_parent_run(path, "sweeps", "sweep-x", {"sweep.jobs": "3"})
    client = store.open_client(uri)
    ids = []
    threads = [threading.Thread(target=lambda: ids.append(store.sweep_parent(client, uri, path))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(ids)) == 1 and contract.parent_run(path) == ids[0]
    run = MlflowClient(uri).get_run(ids[0])
    assert run.info.run_name == "sweep-x" and run.data.tags["sweep.jobs"] == "3" and run.info.status == "RUNNING"
    assert run.data.tags[store.OWNER_TAGS["pid"]] == procs.identity()["pid"]
    runs = MlflowClient(uri).search_runs([run.info.experiment_id])
    assert len(runs) == 1


def test_the_sweep_reads_its_parent_from_the_file_once_created(tmp_path, monkeypatch):
    from runner.sweeps import sweep

    path = str(tmp_path / "p.json")
    monkeypatch.setenv(contract.PARENT_RUN_FILE, path)
    assert sweep.parent_run_id() is None  # not created yet
    contract.announce_parent_run(path, "r1")
    assert sweep.parent_run_id() == "r1"
    monkeypatch.delenv(contract.PARENT_RUN_FILE)  # not a sweep's process
    assert sweep.parent_run_id() is None
