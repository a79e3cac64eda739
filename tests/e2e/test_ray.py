"""cluster=ray on a real Ray cluster: a local Ray head started once for this module (`ray_head`), that every run joins
with cluster.address. Each task of the runner's cluster is a Ray actor that runs its task process; the runner's log,
exit codes and MLflow run are cluster=localhost's. A Ray worker process killed with SIGKILL is a dead task: an MWMS job
stops (exit 3, run FAILED, the task named), a parameter-server worker is restarted. Skipped with the reason where Ray
cannot be imported."""

import os
import re
import signal
import time
import uuid

import pytest

from helpers import (
    CLUSTER_TINY,
    ELASTIC,
    LiveRun,
    check_elastic_run,
    mlflow_run_by_name,
    processes_with,
    run_runner,
    runner_imports,
)

pytestmark = pytest.mark.slow  # end to end: a Ray head, and `python -m runner` clusters of real task processes

EXPERIMENT = "ray"
TINY = CLUSTER_TINY
MWMS = ["strategy=multi_worker_mirrored", "cross_device_ops=ring"]


MARK = f"RUNNER_RAY_TEST_{uuid.uuid4().hex}"  # in this process's environment while the head runs: Ray's processes and
# the tasks' inherit it, so what this module started is told apart from other runs on a shared machine


def _marked(*also: str) -> list[int]:
    """PIDs of this session's live processes whose environment holds MARK (and every variable in `also`)."""
    return processes_with(MARK, *also)


def _until_none(find, seconds=15):
    deadline = time.monotonic() + seconds
    while find() and time.monotonic() < deadline:
        time.sleep(0.5)
    return find()


@pytest.fixture(scope="module")
def ray_head():
    """A local Ray head (GCS, raylet and its workers), shut down at the end of the module, also when a test failed;
    none of its processes may outlive it."""
    ray = pytest.importorskip("ray", reason="ray is not installed: pip install -e '.[test]' (or the 'ray' extra)")
    os.environ[MARK] = "1"
    try:
        ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False, object_store_memory=128 * 1024**2)
        yield ray, ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
        del os.environ[MARK]
        assert _until_none(_marked) == [], "processes of the Ray head outlived ray.shutdown()"


@pytest.fixture
def ray_cluster(ray_head):
    """The head's address; after the test, no task process is left and the run gave back every Ray resource it took
    (its actors and placement group are gone)."""
    ray, address = ray_head
    yield address
    assert _until_none(lambda: _marked("RUNNER_LAUNCH_ID")) == [], "task processes outlived their run"
    assert _until_none(lambda: ray.available_resources().get("CPU") != 8) is False, ray.available_resources()


def _args(address, name, *extra):
    return [
        "cluster=ray",
        f"cluster.address={address}",
        *extra,
        f"mlflow.experiment_name={EXPERIMENT}",
        f"mlflow.run_name={name}",
    ]


def _final_losses(output):
    return [float(x) for x in re.findall(r"done: \d+ steps, final loss ([0-9.]+)", output)]


def _ray_worker_pid(live, task, timeout=120):
    line = live.wait_for(lambda line: f"started {task} (Ray worker pid" in line, timeout)
    return int(re.search(r"Ray worker pid (\d+)", line).group(1))


def test_multi_worker_mirrored_on_ray(ray_cluster, store, executor="fit"):
    """Model.fit; the custom loop's MWMS job on Ray is the elastic test's below."""
    root, uri = store
    name = f"ray-mwms-{executor}"
    done = run_runner(_args(ray_cluster, name, *MWMS, *TINY, f"executor={executor}"), root, root / "runs" / name, uri)
    assert done.returncode == 0, done.output[-4000:]
    assert re.search(r"started worker:1 \(Ray worker pid \d+, task pid \d+\)", done.output)
    assert "[worker:0] " in done.stdout and "[worker:1] " in done.stdout  # one prefix per task, as cluster=localhost
    losses = _final_losses(done.stdout)
    assert len(losses) == 2 and losses[0] == losses[1], done.output[-3000:]  # both workers agree
    _, run = mlflow_run_by_name(uri, EXPERIMENT, name)  # exactly one run
    assert run.info.status == "FINISHED"
    assert run.data.tags["cluster.name"] == "ray" and run.data.tags["cluster.tasks"] == "worker:0,worker:1"
    assert run.data.tags["num_workers"] == "2" and run.data.tags["num_replicas_in_sync"] == "2"
    assert {"loss/replica_0", "loss/replica_1"} <= set(run.data.metrics)


def test_parameter_server_on_ray_restarts_a_worker_whose_ray_worker_is_killed(ray_cluster, store):
    """cluster.ps=1, 2 workers, custom loop: SIGKILL to worker:1's Ray worker process mid-run; a new actor in its bundle
    restarts the task at the same address, the coordinator runs the lost steps elsewhere, and the run FINISHES."""
    root, uri = store
    name = "ray-ps-kill"
    args = ["strategy=parameter_server", "cluster.ps=1", "executor=custom_loop", *TINY, "train.steps_per_epoch=64"]
    live = LiveRun(_args(ray_cluster, name, *args, "train.log_every_n_steps=8"), root, root / "runs" / name, uri)
    victim = _ray_worker_pid(live, "worker:1")
    live.wait_for(lambda line: re.search(r"\[chief:0\].*step \d+/", line), 120)
    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    live.wait_for(lambda line: "worker:1 stopped (its Ray worker process" in line, 30)
    print(f"killed Ray worker: the parameter-server job saw worker:1 dead {time.monotonic() - killed_at:.2f} s after the SIGKILL")
    code, output = live.finish(timeout=180)
    assert code == 0, output[-4000:]
    assert f"worker:1 stopped (its Ray worker process (pid {victim}) died" in output and "restarting it (1/3)" in output
    restarted = re.findall(r"started worker:1 \(Ray worker pid (\d+)", output)
    assert len(restarted) == 2 and int(restarted[1]) != victim, output[-3000:]  # a new actor
    _, run = mlflow_run_by_name(uri, EXPERIMENT, name)
    assert run.info.status == "FINISHED"
    assert run.data.tags["cluster.tasks"] == "chief:0,worker:0,worker:1,ps:0"
    assert run.data.tags["strategy"].startswith("ParameterServerStrategy") and "loss/replica_0" in run.data.metrics
    assert run.data.metrics["steps/worker_0"] + run.data.metrics["steps/worker_1"] == 64


def test_a_killed_ray_worker_stops_a_multi_worker_mirrored_job(ray_cluster, store):
    """SIGKILL to worker:1's Ray worker process mid-training: its task dies with it, the job stops within seconds with
    exit 3 and an error naming worker:1, and the run is FAILED."""
    root, uri = store
    name = "ray-mwms-kill"
    args = [*MWMS, "executor=custom_loop", "data.num_examples=4096", "train.epochs=40", "train.global_batch_size=64"]
    live = LiveRun(_args(ray_cluster, name, *args, "cluster.failure_grace_sec=3"), root, root / "runs" / name, uri)
    victim = _ray_worker_pid(live, "worker:1")
    live.wait_for(lambda line: re.search(r"\[worker:0\].*epoch 1/40 step", line), 120)  # training
    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    code, output = live.finish(timeout=60)
    seconds = time.monotonic() - killed_at
    print(f"killed Ray worker: the job ended {seconds:.1f} s after the SIGKILL")
    assert code == 3, output[-3000:]
    assert seconds < 20, output[-3000:]
    assert "task worker:1 (pid" in output and f"its Ray worker process (pid {victim}) died" in output
    assert "rerun with resume=" in output
    _, run = mlflow_run_by_name(uri, EXPERIMENT, name)
    assert run.info.status == "FAILED" and "worker:1" in run.data.tags["error"]


def test_an_elastic_job_trains_through_a_killed_actor_to_the_weights_of_one_process(ray_cluster, store, elastic_reference):
    """cluster.elastic on Ray, the custom loop, in-memory data: 3 workers; worker:1's Ray worker process is killed after the first
    checkpoint. The job goes on with 2 new actors (a placement group of 2) from that checkpoint, grows back to 3 at
    the next one, and ends with the weights of one uninterrupted process, every Ray resource given back (ray_cluster).
    tests/e2e/test_tfrecord.py has the same job on localhost on TFRecord files, README's elastic command Model.fit's."""
    root, uri = store
    name = "ray-elastic"
    args = [*MWMS, "cluster.workers=3", "cluster.elastic.enabled=true", "cluster.elastic.rejoin_after_sec=0", *ELASTIC]
    live = LiveRun(_args(ray_cluster, name, *args, "executor=custom_loop"), root, root / "runs" / name, uri)
    victim = _ray_worker_pid(live, "worker:1")
    live.wait_for(lambda line: re.search(r"\[worker:0\].* epoch 2/12 step (8|12)/16", line), 240)  # past step 16's
    os.kill(victim, signal.SIGKILL)
    code, output = live.finish(timeout=300)
    assert code == 0, output[-4000:]
    assert f"cluster.elastic: lost worker:1: its Ray worker process (pid {victim}) died" in output, output[-4000:]
    assert "going on with 2 worker(s)" in output and "training again on 3 worker(s)" in output
    assert len(re.findall(r"started worker:0 \(Ray worker pid \d+, task pid \d+\)", output)) == 3  # 3 generations
    losses = _final_losses(output)
    assert len(losses) == 3 and len(set(losses)) == 1, output[-3000:]  # the last generation's workers agree
    job_model = root / "runs" / name / "worker-0" / "model.keras"
    run, lost, back = check_elastic_run(uri, EXPERIMENT, name, job_model, elastic_reference("custom_loop"))
    assert run.data.tags["cluster.name"] == "ray" and {"loss/replica_0", "loss/replica_2"} <= set(run.data.metrics)
    assert 0 <= lost["steps_redone"] <= 16  # the steps since the checkpoint, as far as the launcher saw them
    print(f"Ray, custom loop: shrink {lost['resize_sec']:.1f}s, grow {back['resize_sec']:.1f}s, redone {lost['steps_redone']}")


@pytest.mark.parametrize("flag", ["--help", "--cfg"])
def test_config_only_paths_import_neither_tensorflow_nor_ray(flag):
    done, loaded = runner_imports([flag, *(["job"] if flag == "--cfg" else []), "cluster=ray"], modules=("tensorflow", "ray"))
    assert loaded == [], done.stdout[-2000:] + done.stderr[-2000:]
    assert "ray" in done.stdout  # --help lists cluster=ray; --cfg job shows it composed


def test_an_address_where_nothing_answers_is_refused_at_once(store, tmp_path):
    """ray.init() waits minutes on an address with no Ray head behind it: the runner probes it first (exit 2)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    started = time.monotonic()
    done = run_runner([*MWMS, "cluster=ray", f"cluster.address=127.0.0.1:{port}"], store[0], tmp_path / "run", store[1])
    assert done.returncode == 2 and time.monotonic() - started < 30, done.output[-2000:]
    assert f"cluster.address=127.0.0.1:{port}: nothing answers there" in done.stderr and "Traceback" not in done.stderr
