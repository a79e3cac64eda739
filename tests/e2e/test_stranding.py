"""Nothing stranded (docs/reliability.md, "Stranding"): kill -9 of a launcher takes its tasks with it and its run is
marked FAILED by the next run; runs started together on a fresh store all succeed; a damaged store, a resume= of a
directory the runner did not write, a truncated checkpoint and a FINISHED run are clear errors or safe fallbacks."""

import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from helpers import LiveRun, mlflow_run_by_name, processes_with, run_runner

pytestmark = pytest.mark.slow  # end to end: kills real `python -m runner` launchers and their tasks

TINY = [
    "data.num_examples=256",
    "data.eval_examples=64",
    "train.global_batch_size=32",
    "train.epochs=1",
    "train.steps_per_epoch=4",
    "save_model=false",
]
EXPERIMENT = "stranding"


def _carrying(marker: bytes):
    """PIDs of this session's live processes whose environment holds exactly this NAME=value."""
    return processes_with(marker.decode())


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A fresh store (not created beforehand: the runner must create it itself)."""
    root = tmp_path_factory.mktemp("stranding")
    return root, f"sqlite:///{root}/mlflow.db"


@pytest.fixture(scope="module")
def killed_launcher(store):
    """A cluster=localhost launcher killed with SIGKILL once a worker trains; (run dir, seconds to no leftovers)."""
    root, uri = store
    run_dir = root / "killed"
    live = LiveRun(
        [
            "strategy=multi_worker_mirrored",
            "cluster=localhost",
            "cluster.workers=2",
            "executor=custom_loop",
            "train.epochs=50",
            *TINY[:3],
            "train.log_every_n_steps=1",
            f"mlflow.experiment_name={EXPERIMENT}",
            "mlflow.run_name=killed",
        ],
        root,
        run_dir,
        uri,
    )
    pid = int(live.wait_for(lambda line: "started worker:0 (pid" in line, 60).split("(pid ")[1].split(")")[0])
    with open(f"/proc/{pid}/environ", "rb") as f:
        marker = next(e for e in f.read().split(b"\0") if e.startswith(b"RUNNER_LAUNCH_ID="))
    live.wait_for(lambda line: re.search(r"\[worker:\d\].*epoch \d+/50", line), 150)
    assert len(_carrying(marker)) >= 2
    live.proc.kill()
    live.proc.wait()
    killed = time.monotonic()
    while _carrying(marker) and time.monotonic() - killed < 5:
        time.sleep(0.1)
    left = _carrying(marker)
    for p in left:  # never leave them training, whatever the assertion says
        os.kill(p, signal.SIGKILL)
    return run_dir, left, time.monotonic() - killed


def test_kill_9_of_the_launcher_takes_every_task_with_it(killed_launcher):
    _, left, seconds = killed_launcher
    assert left == [], f"{len(left)} task(s) outlived their SIGKILLed launcher"
    assert seconds < 5


@pytest.fixture(scope="module")
def checkpointed(store, killed_launcher):
    """The next run in the same store (after the killed launcher): a custom loop with checkpoints at steps 2 and 4."""
    root, uri = store
    result = run_runner(
        [
            *TINY,
            "executor=custom_loop",
            "checkpoint.every_n_steps=2",
            f"mlflow.experiment_name={EXPERIMENT}",
            "mlflow.run_name=checkpointed",
        ],
        cwd=root,
        run_dir=root / "checkpointed",
        tracking_uri=uri,
    )
    assert result.returncode == 0, result.output[-3000:]
    return result


def test_the_next_run_marks_the_killed_launchers_run_failed(store, checkpointed):
    _, uri = store
    _, run = mlflow_run_by_name(uri, EXPERIMENT, "killed")
    assert run.info.status == "FAILED"
    assert run.data.tags["error"].startswith("process died without ending the run (found by run ")
    _, mine = mlflow_run_by_name(uri, EXPERIMENT, "checkpointed")
    assert mine.info.status == "FINISHED" and mine.info.run_id in run.data.tags["error"]


def test_a_truncated_checkpoint_falls_back_to_the_previous_one_and_a_finished_run_is_not_resumed(store, checkpointed):
    root, uri = store
    ckpts = checkpointed.run_dir / "checkpoints"
    data = next(ckpts.glob("ckpt-4.data-*"))
    with open(data, "r+b") as f:
        f.truncate(data.stat().st_size // 2)
    again = run_runner(
        [*TINY, "executor=custom_loop", "checkpoint.every_n_steps=2", "train.epochs=2", f"resume={checkpointed.run_dir}"],
        cwd=root,
        run_dir=checkpointed.run_dir,  # a resume continues in its own directory
        tracking_uri=uri,
    )
    assert again.returncode == 0, again.output[-3000:]
    assert "could not be read: ckpt-4" in again.output and "resuming from the previous good one, ckpt-2" in again.output
    assert "resumed from checkpoint at step 2 " in again.output
    assert "Traceback" not in again.output
    client, run = mlflow_run_by_name(uri, EXPERIMENT, "checkpointed")  # the same run, continued
    assert run.info.status == "FINISHED"
    assert max(m.step for m in client.get_metric_history(run.info.run_id, "loss")) == 8
    # FINISHED with all its train.epochs=2: nothing left to continue
    done = run_runner(
        [*TINY, "executor=custom_loop", "train.epochs=2", f"resume={checkpointed.run_dir}"],
        cwd=root,
        run_dir=checkpointed.run_dir,
        tracking_uri=uri,
    )
    assert done.returncode == 2, done.output[-3000:]
    assert "is FINISHED" in done.stderr and run.info.run_id in done.stderr and "Traceback" not in done.output


def test_four_runs_started_together_on_a_fresh_store_all_succeed(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"

    def one(i):
        return run_runner(
            [*TINY, f"train.seed={i}", f"mlflow.experiment_name={EXPERIMENT}", f"mlflow.run_name=together-{i}"],
            cwd=tmp_path,
            run_dir=tmp_path / f"run-{i}",
            tracking_uri=uri,
        )

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(one, range(4)))
    for r in results:
        assert r.returncode == 0, r.output[-3000:]
    from mlflow import MlflowClient

    client = MlflowClient(uri)  # the store works after
    runs = client.search_runs([client.get_experiment_by_name(EXPERIMENT).experiment_id])
    assert sorted(r.info.run_name for r in runs) == [f"together-{i}" for i in range(4)]
    assert {r.info.status for r in runs} == {"FINISHED"}


def test_a_store_that_is_not_a_database_is_a_clear_error(tmp_path):
    db = tmp_path / "mlflow.db"
    db.write_text("these are my notes, not a database\n")
    result = run_runner([*TINY, "strategy=default"], cwd=tmp_path, run_dir=tmp_path / "run", tracking_uri=f"sqlite:///{db}")
    assert result.returncode == 2, result.output[-3000:]
    assert str(db) in result.stderr and "not an SQLite database" in result.stderr and "mv " in result.stderr
    assert "Traceback" not in result.output
    assert db.read_text() == "these are my notes, not a database\n"


def test_an_unknown_tracking_uri_scheme_is_a_clear_error(tmp_path):
    result = run_runner([*TINY], cwd=tmp_path, run_dir=tmp_path / "run", tracking_uri="foo://x")
    assert result.returncode == 2, result.output[-3000:]
    assert "foo://x" in result.stderr and "sqlite:///" in result.stderr and "Traceback" not in result.output


def test_resume_of_a_directory_the_runner_did_not_write_changes_nothing_there(tmp_path):
    mine = tmp_path / "my-project"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine\n")
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "runner", f"resume={mine}", f"mlflow.tracking_uri=sqlite:///{tmp_path}/m.db"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "is not an output directory of the runner" in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]  # Hydra's .hydra/ and runner.log removed again
    assert time.monotonic() - started < 15  # before TensorFlow
