"""Multi-process clusters on 127.0.0.1: MultiWorkerMirroredStrategy and ParameterServerStrategy with both
executors, TF_CONFIG tasks started by hand, checkpoints and resume, and tasks that die mid-run."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from helpers import FAST, LiveRun, assert_refused_run_deleted, leftover_processes, load_weights, mlflow_run_by_name

pytestmark = pytest.mark.slow  # end to end: each test starts `python -m runner` clusters of real task processes

EXPERIMENT = "cluster"
MWMS = ["strategy=multi_worker_mirrored", "cluster=localhost", "cluster.workers=2", "cross_device_ops=ring"]
PS = ["strategy=parameter_server", "cluster=localhost", "cluster.workers=2", "cluster.ps=1"]


@pytest.fixture(autouse=True)
def no_process_left_behind():
    yield
    deadline = time.monotonic() + 10
    while leftover_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert leftover_processes() == [], "cluster tasks outlived their launcher"


@pytest.fixture(scope="module")
def runs(runner):
    jobs = {
        "reference-fit": ["strategy=default", "executor=fit", *FAST],
        "reference-custom_loop": ["strategy=default", "executor=custom_loop", *FAST],
        # gradient accumulation across workers (fit): 2 micro-batches per update must still give the reference's weights
        "mwms-fit": [*MWMS, "executor=fit", *FAST, "train.accumulation_steps=2"],
        # XLA across workers: each replica's forward and backward pass compiled, the update's all-reduce outside it
        "mwms-custom_loop": [*MWMS, "executor=custom_loop", *FAST, "train.jit_compile=true"],
        "ps-fit": [*PS, "executor=fit", *FAST, "cluster.evaluator=true"],
        "ps-custom_loop": [
            *PS,
            "executor=custom_loop",
            *FAST,
            "strategy.variable_partitioner.kind=fixed_shards",
            "train.accumulation_steps=4",
        ],
    }
    done = {}
    for name, args in jobs.items():  # one at a time: a cluster already uses both cores
        done[name] = runner(name, [*args, f"mlflow.experiment_name={EXPERIMENT}"])
        assert done[name].returncode == 0, f"{name} failed:\n{done[name].output[-4000:]}"
    return done


def final_loss(log_text):
    return float(re.search(r"done: \d+ steps, final loss ([0-9.]+)", log_text).group(1))


@pytest.mark.parametrize("executor", ["fit", "custom_loop"])
def test_mwms_workers_agree_and_match_a_single_process(runs, runner, executor):
    result = runs[f"mwms-{executor}"]
    logs = [(result.run_dir / f"worker-{i}" / "runner.log").read_text() for i in range(2)]
    assert final_loss(logs[0]) == final_loss(logs[1])
    chief = load_weights(result.run_dir / "worker-0" / "model.keras")
    single = load_weights(runs[f"reference-{executor}"].run_dir / "model.keras")
    for a, b in zip(chief, single):
        assert np.max(np.abs(a - b)) <= 1e-5 * np.max(np.abs(b))
    assert not (result.run_dir / "worker-1" / "model.keras").exists()  # only the chief saves
    client, run = mlflow_run_by_name(runner.uri, EXPERIMENT, f"mwms-{executor}")
    assert run.info.status == "FINISHED"
    assert run.data.tags["num_replicas_in_sync"] == "2"
    assert run.data.tags["num_workers"] == "2"
    # the chief logs the losses of every replica in the cluster, its own and worker 1's
    assert {"loss/replica_0", "loss/replica_1"} <= set(run.data.metrics)
    assert "throughput/window_examples_per_sec" in run.data.metrics
    assert len(client.get_metric_history(run.info.run_id, "loss/replica_1")) == 16  # logged once, by the chief
    # each logged step's epoch-mean loss (and fit's accuracy) is the single process's: under fit, summed from every
    # replica's metric totals and counts once a call (no merge in the step), with 2 micro-batches a step
    _, reference = mlflow_run_by_name(runner.uri, EXPERIMENT, f"reference-{executor}")
    for key in ["loss", "accuracy"] if executor == "fit" else ["loss"]:
        got, want = (
            [m.value for m in sorted(client.get_metric_history(r.info.run_id, key), key=lambda m: m.step)]
            for r in (run, reference)
        )
        assert len(got) == 16
        np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=key)
    last = result.output.strip().splitlines()[-1]  # said once, by the launcher, after the run ended
    assert f"outputs in {result.run_dir}; MLflow run {run.info.run_id} in experiment" in last, result.output[-800:]
    assert sum("; MLflow run " in line for line in result.output.splitlines()) == 1
    if executor == "custom_loop":  # train.jit_compile=true: what XLA compiles across workers
        assert "over 2 replica(s), XLA: each replica's forward and backward pass" in result.output, result.output[-3000:]
    progress = re.findall(r"^\[(worker:\d)\].* epoch \d+/\d+ step \d+/\d+", result.output, re.M)
    assert progress and set(progress) == {"worker:0"}, result.output[-3000:]  # the cluster's progress, said once


def test_xla_across_cpu_workers_under_fit_is_refused_before_training(runner):
    """fit's XLA step would hold the all-reduce, which XLA has no CPU kernels for: TensorFlow failed at the first step
    with a traceback (exit 3); the runner refuses before training, and says what works (the custom loop, above)."""
    result = runner(
        "mwms-fit-xla", [*MWMS, "executor=fit", *FAST, "train.jit_compile=true", f"mlflow.experiment_name={EXPERIMENT}"]
    )
    assert result.returncode == 2, result.output[-3000:]
    said = "train.jit_compile=true with strategy=multi_worker_mirrored over several workers and executor=fit"
    assert said in result.output and "Use executor=custom_loop" in result.output, result.output[-3000:]
    assert "Traceback" not in result.output and "epoch 1/" not in result.output
    assert_refused_run_deleted(runner.uri, EXPERIMENT, "mwms-fit-xla", result, "refused the configuration (exit code 2")


@pytest.mark.parametrize("executor", ["fit", "custom_loop"])
def test_parameter_server_trains(runs, runner, executor):
    client, run = mlflow_run_by_name(runner.uri, EXPERIMENT, f"ps-{executor}")
    assert run.info.status == "FINISHED"
    assert run.data.tags["strategy"].startswith("ParameterServerStrategy")
    assert run.data.tags["cluster.tasks"].startswith("chief:0,worker:0,worker:1,ps:0")
    losses = [m.value for m in sorted(client.get_metric_history(run.info.run_id, "loss"), key=lambda m: m.step)]
    assert losses[-1] < losses[0]
    assert run.data.metrics["eval/accuracy"] > 0.4
    # "1 replica(s)" alone read as if one worker trained (issue 50, item 13)
    assert (
        "ParameterServerStrategy with 1 replica(s) per step (its 2 worker(s) each run whole steps"
        in runs[f"ps-{executor}"].output
    )
    if executor == "fit":  # the side-car evaluator evaluated the final checkpoint like the coordinator did
        history = client.get_metric_history(run.info.run_id, "sidecar/eval_loss")
        final = max(history, key=lambda m: m.step)
        assert sorted(m.step for m in history) == [8, 16]  # every checkpoint, not only the newest at each poll
        assert final.step == 16
        assert final.value == pytest.approx(run.data.metrics["eval/loss"], rel=1e-4)
    if executor == "custom_loop":
        per_worker = [run.data.metrics.get(f"steps/worker_{i}", 0) for i in range(2)]
        assert sum(per_worker) == 16 and min(per_worker) > 0, per_worker  # both workers ran steps


def test_tf_config_tasks_started_by_hand(runner, tmp_path):
    """What Kubernetes does: one process per task, each with its TF_CONFIG; worker 0 logs the run."""
    from runner.launch.localhost import free_ports

    spec = {"worker": [f"127.0.0.1:{p}" for p in free_ports(2)]}
    procs = []
    for i in range(2):
        env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
        env.update(TF_CONFIG=json.dumps({"cluster": spec, "task": {"type": "worker", "index": i}}), RUNNER_LAUNCH_ID="by-hand")
        argv = [
            sys.executable,
            "-m",
            "runner",
            "strategy=multi_worker_mirrored",
            "cluster=tf_config",
            *FAST,
            "executor=custom_loop",
            f"mlflow.experiment_name={EXPERIMENT}-tf_config",
            "mlflow.run_name=by-hand",
            f"mlflow.tracking_uri={runner.uri}",
            f"hydra.run.dir={tmp_path}/w{i}",
            f"checkpoint.dir={tmp_path}/ckpt",
        ]
        procs.append(
            subprocess.Popen(argv, cwd=runner.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        )
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    assert final_loss(outputs[0]) == final_loss(outputs[1])
    _, run = mlflow_run_by_name(runner.uri, f"{EXPERIMENT}-tf_config", "by-hand")  # exactly one run
    assert run.info.status == "FINISHED" and run.data.tags["num_workers"] == "2"


def test_resume_continues_checkpoint_and_mlflow_run(runner):
    first = runner("resume", [*MWMS, "executor=custom_loop", *FAST, "train.epochs=1", f"mlflow.experiment_name={EXPERIMENT}"])
    assert first.returncode == 0, first.output[-3000:]
    _, run = mlflow_run_by_name(runner.uri, EXPERIMENT, "resume")
    again = runner(
        "resume",  # the same directory: a resume continues in its own
        [
            *MWMS,
            "executor=custom_loop",
            *FAST,
            "train.epochs=2",
            f"resume={first.run_dir}",
            f"mlflow.experiment_name={EXPERIMENT}",
        ],
    )
    assert again.returncode == 0, again.output[-3000:]
    assert "resumed from checkpoint at step 8" in again.output
    client, same = mlflow_run_by_name(runner.uri, EXPERIMENT, "resume")  # no second run was created
    assert same.info.run_id == run.info.run_id and same.info.status == "FINISHED"
    steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "loss/replica_0"))
    assert steps == list(range(1, 17))  # 8 steps, then 8 more continuing the step count


def _pid_of(live, task, timeout=120):
    line = live.wait_for(lambda line: f"started {task} (pid" in line, timeout)
    return int(re.search(r"pid (\d+)", line).group(1))


def _long(executor):
    return [
        f"executor={executor}",
        "data.num_examples=4096",
        "train.epochs=40",
        "train.global_batch_size=64",
        "train.log_every_n_steps=20",
        "checkpoint.every_n_steps=40",
    ]


def test_dead_mwms_worker_stops_the_job_and_the_rerun_resumes(runner):
    run_dir = runner.root / "runs" / "mwms-death"
    args = [
        *MWMS,
        *_long("custom_loop"),
        "cluster.failure_grace_sec=3",
        f"mlflow.experiment_name={EXPERIMENT}",
        "mlflow.run_name=mwms-death",
    ]
    live = LiveRun(args, runner.root, run_dir, runner.uri)
    victim = _pid_of(live, "worker:1")
    live.wait_for(lambda line: re.search(r"\[worker:0\].*epoch ([3-9]|\d\d)/40", line), 180)  # past a checkpoint
    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    code, output = live.finish(timeout=120)
    assert code == 3, output[-3000:]
    assert time.monotonic() - killed_at < 30
    assert "task worker:1" in output and "killed by SIGKILL" in output and f"resume={run_dir}" in output
    _, run = mlflow_run_by_name(runner.uri, EXPERIMENT, "mwms-death")
    assert run.info.status == "FAILED"
    assert "worker:1" in run.data.tags["error"]
    again = runner("mwms-death", [*args[:-1], "train.epochs=4", f"resume={run_dir}"])  # in its own directory
    assert again.returncode == 0, again.output[-3000:]
    assert re.search(r"resumed from checkpoint at step [1-9]\d+", again.output)


def test_parameter_server_survives_a_lost_worker_and_with_elastic_a_lost_parameter_server(runner):
    """worker:1 killed: the launcher restarts it and the coordinator reschedules its steps. Then ps:0 killed, which
    the coordinator cannot survive: with cluster.elastic the whole job restarts at its size from the last checkpoint,
    in the same MLflow run, and finishes every step."""
    run_dir = runner.root / "runs" / "ps-death"
    args = [
        *PS,
        *_long("custom_loop"),
        "train.epochs=12",
        "cluster.elastic.enabled=true",
        f"mlflow.experiment_name={EXPERIMENT}",
        "mlflow.run_name=ps-death",
    ]
    live = LiveRun(args, runner.root, run_dir, runner.uri)
    victim = _pid_of(live, "worker:1")
    server = _pid_of(live, "ps:0")
    live.wait_for(lambda line: re.search(r"\[chief:0\].*step \d+/", line), 180)
    os.kill(victim, signal.SIGKILL)
    live.wait_for(lambda line: "worker:1 stopped (killed by SIGKILL); restarting it" in line, 60)
    live.wait_for(lambda line: re.search(r"\[chief:0\].*epoch ([3-9]|1\d)/12", line), 180)  # past a checkpoint
    os.kill(server, signal.SIGKILL)
    code, output = live.finish(timeout=300)
    assert code == 0, output[-4000:]
    assert "cluster.elastic: lost ps:0: killed by SIGKILL" in output and "restarting every task (2 worker(s))" in output
    assert "encountered the following error when processing closure" not in output  # the coordinator's pages: one line
    assert re.search(r"\[chief:0\].*resumed from checkpoint at step [1-9]\d+", output), output[-3000:]
    assert re.search(r"\[chief:0\].*done: 768 steps", output), output[-3000:]
    client, run = mlflow_run_by_name(runner.uri, EXPERIMENT, "ps-death")
    assert run.info.status == "FINISHED" and run.data.metrics["cluster/restarts"] == 1
    (record,) = json.loads(open(client.download_artifacts(run.info.run_id, "elastic/resizes.json")).read())
    assert (record["from_workers"], record["to_workers"]) == (2, 2) and record["why"] == "lost ps:0: killed by SIGKILL"
    assert 0 <= record["steps_redone"] <= 40, record  # at most checkpoint.every_n_steps


def _free_port_pair():
    import socket

    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            try:
                with socket.socket() as b:
                    b.bind(("127.0.0.1", port + 1))
                    return port
            except OSError:
                continue
    raise RuntimeError("no two consecutive free ports")


def test_slurm_resolver_from_an_allocations_environment(runner, tmp_path):
    """SlurmClusterResolver on the variables srun sets for 2 tasks on one node (no Slurm needed to read them)."""
    port = _free_port_pair()
    procs = []
    for rank in range(2):
        env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
        env.update(
            SLURM_PROCID=str(rank),
            SLURM_STEP_NUM_TASKS="2",
            SLURM_STEP_NODELIST="localhost",
            SLURM_STEP_TASKS_PER_NODE="2",
            RUNNER_LAUNCH_ID="slurm-test",
        )
        argv = [
            sys.executable,
            "-m",
            "runner",
            "strategy=multi_worker_mirrored",
            "cluster=slurm",
            f"cluster.port_base={port}",
            *FAST,
            f"mlflow.experiment_name={EXPERIMENT}-slurm",
            "mlflow.run_name=slurm",
            f"mlflow.tracking_uri={runner.uri}",
            f"hydra.run.dir={tmp_path}/t{rank}",
            f"checkpoint.dir={tmp_path}/ckpt",
        ]
        procs.append(
            subprocess.Popen(argv, cwd=runner.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        )
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    assert final_loss(outputs[0]) == final_loss(outputs[1])
    _, run = mlflow_run_by_name(runner.uri, f"{EXPERIMENT}-slurm", "slurm")
    assert run.data.tags["num_workers"] == "2" and run.data.tags["num_replicas_in_sync"] == "2"


def test_a_peer_that_never_starts_stops_the_task_in_bounded_time(runner, tmp_path):
    from runner.launch.localhost import free_ports

    spec = {"worker": [f"127.0.0.1:{p}" for p in free_ports(2)]}  # worker 1 is never started
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(TF_CONFIG=json.dumps({"cluster": spec, "task": {"type": "worker", "index": 0}}), RUNNER_LAUNCH_ID="lonely")
    argv = [
        sys.executable,
        "-m",
        "runner",
        "strategy=multi_worker_mirrored",
        "cluster=tf_config",
        "cluster.start_timeout_sec=8",
        f"mlflow.experiment_name={EXPERIMENT}-lonely",
        "mlflow.run_name=lonely",
        f"mlflow.tracking_uri={runner.uri}",
        f"hydra.run.dir={tmp_path}/w0",
    ]
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=runner.root, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stdout[-2000:] + proc.stderr[-2000:]  # stopped by the watchdog
    assert time.monotonic() - started < 60
    assert "worker:0: joining the cluster did not complete within cluster.start_timeout_sec=8" in proc.stderr
    _, run = mlflow_run_by_name(runner.uri, f"{EXPERIMENT}-lonely", "lonely")
    assert run.info.status == "FAILED" and "start_timeout_sec" in run.data.tags["error"]


def test_ctrl_c_stops_a_task_blocked_in_tensorflow_within_seconds(runner, tmp_path):
    """Joining a cluster whose peer never starts, TensorFlow holds the GIL in C++: no signal handler of the process
    can run. The sentinel (runner/control/watchdog.py) acts for it: killed seconds after Ctrl-C, run KILLED, nothing left."""
    from runner.launch.localhost import free_ports

    spec = {"worker": [f"127.0.0.1:{p}" for p in free_ports(2)]}  # worker 1 is never started
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(
        TF_CONFIG=json.dumps({"cluster": spec, "task": {"type": "worker", "index": 0}}),
        RUNNER_LAUNCH_ID="blocked",
        PYTHONUNBUFFERED="1",
    )
    argv = [
        sys.executable,
        "-m",
        "runner",
        "strategy=multi_worker_mirrored",
        "cluster=tf_config",
        f"mlflow.experiment_name={EXPERIMENT}-blocked",
        "mlflow.run_name=blocked",
        f"mlflow.tracking_uri={runner.uri}",
        f"hydra.run.dir={tmp_path}/w0",
    ]
    proc = subprocess.Popen(argv, cwd=runner.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if "MultiWorkerMirrored" in line or "MLflow run" in line:
            break
    time.sleep(3)  # inside the strategy's constructor, waiting for worker 1
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    signalled = time.monotonic()
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - signalled < 20, "a second Ctrl-C must end the process within seconds"
    assert proc.returncode == -signal.SIGKILL and "Stopped: SIGINT received" in err and "Traceback" not in err, err[-2000:]
    _, run = mlflow_run_by_name(runner.uri, f"{EXPERIMENT}-blocked", "blocked")
    assert run.info.status == "KILLED"
    # and the autouse fixture checks that nothing carrying RUNNER_LAUNCH_ID (the sentinel included) is left


def test_ctrl_c_stops_every_task_and_marks_the_run_killed(runner):
    args = [*MWMS, *_long("custom_loop"), f"mlflow.experiment_name={EXPERIMENT}", "mlflow.run_name=interrupted"]
    live = LiveRun(args, runner.root, runner.root / "runs" / "interrupted", runner.uri)
    live.wait_for(lambda line: re.search(r"\[worker:0\].*epoch ([2-9]|\d\d)/40", line), 180)
    live.proc.send_signal(signal.SIGINT)
    code, output = live.finish(timeout=60)
    assert code == 130, output[-3000:]
    _, run = mlflow_run_by_name(runner.uri, EXPERIMENT, "interrupted")
    assert run.info.status == "KILLED"
    # and the autouse fixture checks that no task outlived the launcher


def test_a_stopped_worker_is_the_one_blamed(runner):
    """worker:1 frozen with SIGSTOP: worker:0 gives up waiting for it, and the error names worker:1, not worker:0."""
    args = [*MWMS, *_long("custom_loop"), f"mlflow.experiment_name={EXPERIMENT}", "mlflow.run_name=frozen"]
    live = LiveRun(args, runner.root, runner.root / "runs" / "frozen", runner.uri)
    pid = int(live.wait_for(lambda line: "started worker:1 (pid" in line, 60).split("pid ")[1].split(")")[0])
    live.wait_for(lambda line: re.search(r"\[worker:0\].*epoch ([2-9]|\d\d)/40", line), 180)  # the cluster's progress, said once
    os.kill(pid, signal.SIGSTOP)
    code, output = live.finish(timeout=180)
    assert code == 3, output[-3000:]
    assert f"task worker:1 (pid {pid}) was stopped (SIGSTOP or a debugger)" in output and "task worker:0 gave up" in output
    _, run = mlflow_run_by_name(runner.uri, EXPERIMENT, "frozen")
    assert run.info.status == "FAILED"
