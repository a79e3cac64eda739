"""Multirun sweeps: Ctrl-C, a failing job, experiment presets, Slurm ports. A sweep's parent and child runs, its
report and the dashboard in headless Chromium are checked on README's own sweeps (tests/e2e/test_readme.py)."""

import csv
import os
import re
import signal
import subprocess
import sys
import time

import pytest

EXPERIMENT = "sweeps"


def sweep(runner, name, args, timeout=600, while_running=None):
    """Run a sweep into sweeps/<name>; `while_running(argv, env)` is called once the sweep holds its directory."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    sweep_dir = runner.root / "sweeps" / name
    argv = [
        sys.executable,
        "-m",
        "runner",
        "-m",
        *args,
        f"hydra.sweep.dir={sweep_dir}",
        f"mlflow.tracking_uri={runner.uri}",
        f"mlflow.experiment_name={EXPERIMENT}",
        f"mlflow.run_name={name}",
    ]
    if while_running is None:
        proc = subprocess.run(argv, cwd=runner.root, env=env, capture_output=True, text=True, timeout=timeout)
        return proc, sweep_dir
    from runner.control import claims

    live = subprocess.Popen(argv, cwd=runner.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not claims.holder(str(sweep_dir)) and live.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    while_running(argv, env)
    out, err = live.communicate(timeout=timeout)
    return subprocess.CompletedProcess(argv, live.returncode, out, err), sweep_dir


def family(runner, name):
    from mlflow import MlflowClient

    client = MlflowClient(runner.uri)
    exp = client.get_experiment_by_name(EXPERIMENT)
    (parent,) = client.search_runs([exp.experiment_id], filter_string=f"attributes.run_name = '{name}'")
    children = client.search_runs([exp.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    return client, parent, sorted(children, key=lambda r: int(r.data.tags["sweep.job_num"]))


@pytest.mark.slow  # end to end: runs a sweep and stops it
@pytest.mark.parametrize("parallel", [1, 2])
def test_ctrl_c_stops_a_sweep_its_job_checkpoints_and_both_runs_are_killed(runner, parallel):
    """Ctrl-C at a terminal (SIGINT to the sweep's process group) while job #0 trains (and #1 beside it, with
    sweep.parallel=2): each running job gets it once, checkpoints and ends its run KILLED; the sweep's run is KILLED
    too; exit 130, no traceback, no job after them."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    sweep_dir = runner.root / "sweeps" / f"stopped-{parallel}"
    argv = [sys.executable, "-m", "runner", "-m", "data=ones", "train.epochs=300", "train.steps_per_epoch=50", "train.seed=1,2"]
    argv += [f"hydra.sweep.dir={sweep_dir}", f"mlflow.tracking_uri={runner.uri}", f"mlflow.experiment_name={EXPERIMENT}"]
    live = subprocess.Popen(
        [*argv, f"mlflow.run_name=stopped-{parallel}", f"sweep.parallel={parallel}"],
        cwd=runner.root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    seen, training = [], set()
    for line in live.stdout:
        seen.append(line)
        reached = re.search(r"epoch (\d+)/300", line)
        if reached and int(reached.group(1)) >= 3:  # lines are paced: any at or past epoch 3
            training.add(line[:4])
            if len(training) == parallel:
                break
    os.killpg(live.pid, signal.SIGINT)
    rest, _ = live.communicate(timeout=120)
    output = "".join(seen) + rest
    assert live.returncode == 130 and "Traceback" not in output, output[-3000:]
    jobs = [f"#{n}" for n in range(parallel)]
    for job in jobs:
        stopped = rf"\[{job}\] Stopped: training stopped by SIGINT at step \d+: checkpoint written"
        assert re.search(stopped, output), output[-3000:]
        assert any((sweep_dir / job[1:] / "checkpoints").glob("ckpt-*.index"))
    during = "job #0" if parallel == 1 else "jobs #0, #1"
    assert f"Stopped: the sweep was stopped by SIGINT during {during}: a job that was training checkpointed" in output
    assert parallel == 2 or "job #1" not in output
    _, parent, children = family(runner, f"stopped-{parallel}")
    assert parent.info.status == "KILLED" and [c.info.status for c in children] == ["KILLED"] * parallel


@pytest.mark.slow  # end to end: runs sweeps of `python -m runner` jobs
def test_failed_jobs_are_recorded_and_the_sweep_goes_on(runner):
    second = {}

    def same_dir_again(argv, env):  # a second sweep into the directory this one holds: refused before any job
        second["proc"] = subprocess.run(argv, cwd=runner.root, env=env, capture_output=True, text=True, timeout=120)

    proc, sweep_dir = sweep(
        runner,
        "failing",
        ["strategy=mirrored,parameter_server", "cross_device_ops=auto,nccl", "data.num_examples=256", "train.epochs=1"],
        while_running=same_dir_again,
    )
    refused = second["proc"]
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
    assert re.search(rf"hydra\.sweep\.dir={re.escape(str(sweep_dir))} is in use: process \d+ on this host", refused.stderr)
    assert "job #" not in refused.stdout  # it started no job
    assert proc.returncode == 1
    assert "3 of the sweep's jobs failed: #1" in proc.stderr and "#2" in proc.stderr and "#3" in proc.stderr
    # Every failure is a refusal (exit 2), before any step: no child run is left for them, and the report lists them.
    assert "REFUSED in" in proc.stderr
    client, parent, children = family(runner, "failing")
    assert parent.info.status == "FAILED" and parent.data.tags["sweep.failed_jobs"] == "3"
    assert [c.info.status for c in children] == ["FINISHED"]
    from mlflow.entities import ViewType

    (deleted,) = client.search_runs(  # #1 was refused inside its run (after TensorFlow's import): deleted
        [parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'", ViewType.DELETED_ONLY
    )
    assert deleted.data.tags["sweep.job_num"] == "1" and "cross_device_ops=nccl needs NVIDIA GPUs" in deleted.data.tags["error"]
    assert f"The MLflow run {deleted.info.run_id} was deleted (nothing was trained)" in proc.stdout  # [#1]'s line
    with open(sweep_dir / "report.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["status"] for r in rows] == ["FINISHED", "REFUSED", "REFUSED", "REFUSED"]
    assert [r["cross_device_ops"] for r in rows] == ["auto", "nccl", "auto", "nccl"]  # a refused job's overrides too


def test_experiment_presets_compose():
    from hydra import compose, initialize_config_module

    from runner import app  # noqa: F401  (registers schemas and resolvers)

    with initialize_config_module(config_module="runner.conf", version_base="1.3"):
        guide = compose(config_name="config", overrides=["experiment=guide_fit"])
        loop = compose(config_name="config", overrides=["experiment=guide_custom_loop"])
        sweep_cfg = compose(config_name="config", overrides=["experiment=strategy_sweep"], return_hydra_config=True)
    assert guide.model._target_ == "runner.models.linear" and guide.data.name == "ones"
    assert guide.train.global_batch_size == 10 and guide.train.loss == "mse" and guide.strategy.name == "mirrored"
    assert loop.executor.name == "custom_loop" and loop.train.loss == "binary_crossentropy"
    assert sweep_cfg.hydra.sweeper.params.strategy.split(",") == [
        "default",
        "one_device",
        "mirrored",
        "central_storage",
        "multi_worker_mirrored",
    ]


def test_each_job_of_a_slurm_sweep_gets_its_own_ports(monkeypatch):
    """The jobs of a submitit sweep run at once and may share a node: job n starts SLURM_NTASKS ports after job
    n-1; a base that would run past 65535 is refused with the key to change."""
    from runner.errors import ConfigError
    from runner.sweeps.slurm import port_base

    monkeypatch.setenv("SLURM_NTASKS", "3")
    assert [port_base(8888, n) for n in range(3)] == [8888, 8891, 8894]
    assert port_base(65533, 0) == 65533  # its three ports end at 65535 exactly
    with pytest.raises(ConfigError, match=r"cluster.port_base=65530: job #2 .* past 65535"):
        port_base(65530, 2)


@pytest.mark.slow  # end to end: a sweep whose first job is refused
def test_on_failure_stop_starts_no_job_after_the_first_failure(runner):
    """sweep.on_failure=stop: job #0 is refused (train.epochs=0, before TensorFlow), job #1 is not started, and the
    report says so; the sweep exits 1 naming only the failed job."""
    proc, sweep_dir = sweep(runner, "stop-at-first", ["train.epochs=0,1", "train.steps_per_epoch=2", "sweep.on_failure=stop"])
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "1 of the sweep's jobs failed: #0" in proc.stderr
    assert "job #1 not started: job #0 failed and sweep.on_failure=stop" in proc.stdout + proc.stderr
    assert "[#1]" not in proc.stdout  # no process was started for it
    with open(sweep_dir / "report.csv") as f:
        assert [row["status"] for row in csv.DictReader(f)] == ["REFUSED", "SKIPPED"]


@pytest.mark.slow  # end to end: a sweep whose job is killed once
def test_a_job_ended_by_a_fault_is_retried_from_its_checkpoint(runner):
    """sweep.retries=1: the job's training process is killed with SIGKILL (as the kernel's OOM killer or a lost node
    would end it); it runs again from its checkpoint in its own MLflow run, tagged sweep.retry=1, every step once."""
    import json

    def kill_the_job(argv, env):
        lock = sweep_dir / "0" / ".runner.lock"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not list((sweep_dir / "0" / "checkpoints").glob("ckpt-*.index")):
            time.sleep(0.05)
        pid = int(lock.read_text().split()[0]) if lock.read_text()[:1].isdigit() else json.loads(lock.read_text())["pid"]
        os.kill(pid, signal.SIGKILL)

    sweep_dir = runner.root / "sweeps" / "retried"
    args = ["train.seed=3", "sweep.retries=1", "executor=custom_loop", "train.epochs=1", "train.steps_per_epoch=1500"]
    args += ["checkpoint.every_n_steps=100", "train.log_every_n_steps=50"]
    proc, _ = sweep(runner, "retried", args, while_running=kill_the_job)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, said[-3000:]
    assert "job #0 ended by a fault (exit code -9): attempt 1 of sweep.retries=1, from its checkpoint" in said
    assert "resumed from checkpoint at step" in said
    client, parent, (child,) = family(runner, "retried")
    assert child.info.status == "FINISHED" and child.data.tags["sweep.retry"] == "1"
    steps = [m.step for m in client.get_metric_history(child.info.run_id, "loss")]
    assert sorted(steps) == list(range(50, 1501, 50)), steps  # every logged step once
