"""The MLflow process (runner/mlflow_process/process.py) and its pipe (runner/tracking/pipe.py): calls reach a real store,
and a killed MLflow process is started again without losing a metric or leaving the run RUNNING."""

import os
import re
import signal
import time

import pytest

from helpers import LiveRun

pytestmark = pytest.mark.slow  # each MLflow process imports mlflow (seconds)


def _child_pids(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def _parents(pid: int) -> list[int]:
    with open(f"/proc/{pid}/stat") as f:
        return [int(f.read().rsplit(")", 1)[1].split()[1])]


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.mark.parametrize("forked", [False, True], ids=["spawned", "forked by a sweep's server"])
def test_calls_reach_the_store_and_a_killed_process_is_replaced(sqlite_uri, caplog, monkeypatch, forked):
    from mlflow import MlflowClient

    from runner.control import contract
    from runner.sweeps.server import MlflowServer
    from runner.tracking.pipe import Pipe, PipeError

    client = MlflowClient(sqlite_uri)
    run_id = client.create_run("0").info.run_id
    server = MlflowServer(dict(os.environ)) if forked else None
    if server:
        monkeypatch.setenv(contract.MLFLOW_SERVER, server.path)
    pipe = Pipe.spawn(sqlite_uri)
    try:
        now = int(time.time() * 1000)
        pipe.log_batch(run_id, metrics=[("loss", 0.5, now, 1)], tags=[("t", "v")], params=[("p", "1")])
        first = pipe.proc.pid
        os.kill(first, signal.SIGKILL)
        pipe.proc.wait()
        for _ in range(3):  # the call that meets the dead process fails; RunLog retries it, as here
            try:
                pipe.log_batch(run_id, metrics=[("loss", 0.25, now, 2)])
                break
            except PipeError:
                time.sleep(0.2)
        assert pipe.proc.pid != first and pipe.restarts == 1
        if server:  # forked again from the server, not spawned: it has no process of its own here
            assert not [p for p in _child_pids(os.getpid()) if "runner.mlflow_process" in _cmdline(p)]
            assert os.getppid() != pipe.proc.pid and server.proc.pid in _parents(pipe.proc.pid)
        pipe.set_terminated(run_id, "FINISHED")
    finally:
        pipe.close()
        if server:
            server.stop()
    run = client.get_run(run_id)
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "loss")] == [(1, 0.5), (2, 0.25)]
    assert run.data.tags["t"] == "v" and run.data.params["p"] == "1" and run.info.status == "FINISHED"
    assert "ended; started another" in caplog.text
    assert pipe.proc.poll() is not None  # closed: nothing left behind


def test_a_run_whose_mlflow_process_is_killed_still_logs_every_step_and_finishes(store, tmp_path):
    from mlflow import MlflowClient

    _, uri = store
    args = ["executor=custom_loop", "train.epochs=40", "train.log_every_n_steps=8", "mlflow.flush_every_sec=1",
            "mlflow.experiment_name=mlflow-process", "mlflow.run_name=killed-tracker"]  # fmt: skip
    live = LiveRun(args, tmp_path, tmp_path / "run", uri)
    live.wait_for(lambda line: re.search(r"epoch ([2-9]|\d\d)/40", line), 120)  # lines are paced
    trackers = [p for p in _child_pids(live.proc.pid) if "runner.mlflow_process" in _cmdline(p)]
    assert len(trackers) == 1
    os.kill(trackers[0], signal.SIGKILL)
    code, output = live.finish(timeout=300)
    assert code == 0, output[-3000:]
    assert re.search(rf"the MLflow process \(pid {trackers[0]}\) ended; started another", output)
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("mlflow-process")
    run = client.search_runs([experiment.experiment_id], filter_string="attributes.run_name = 'killed-tracker'")[0]
    assert run.info.status == "FINISHED"
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "loss")]
    assert steps == sorted(set(steps)) and steps[-1] == 40 * 64 and len(steps) == 40 * 8  # every point, once
