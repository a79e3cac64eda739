"""Faults survived or resumed with nothing lost (docs/reliability.md): a loss that becomes NaN/inf, SIGTERM as a
preemption notice and Ctrl-C, a real MLflow server that goes away mid-run, an 8-job parallel sweep into one
server, and secrets kept out of logs, params and tags."""

import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from helpers import LiveRun, leftover_processes, live_group_members, mlflow_run_by_name, run_runner

pytestmark = pytest.mark.slow  # end to end: signals, kills and resumes real `python -m runner` runs

EXPERIMENT = "reliability"
EXECUTORS = ["fit", "custom_loop"]
# Dense(1) on ones with learning rate 2: the loss grows ~9x per step and overflows to inf near step 23.
DIVERGING = ["model=linear", "data=ones", "train.optimizer.learning_rate=2", "train.epochs=60", "checkpoint.every_n_steps=4"]
# Long enough to be interrupted: ~64 steps per epoch, a few thousand steps per second.
LONG = ["strategy=mirrored", "devices.logical_cpus=2", "train.epochs=400", "train.log_every_n_steps=32"]


def history(uri, run_id, key):
    from mlflow import MlflowClient

    return sorted(MlflowClient(uri).get_metric_history(run_id, key), key=lambda m: m.step)


def checkpoint_steps(directory):
    return sorted(int(m.group(1)) for f in os.listdir(directory) if (m := re.match(r"ckpt-(\d+)\.index$", f)))


def test_a_diverging_loss_stops_the_run_and_keeps_the_last_good_checkpoint(runner):
    results = runner.many({f"nan-{e}": [*DIVERGING, f"executor={e}", f"mlflow.experiment_name={EXPERIMENT}"] for e in EXECUTORS})
    for executor in EXECUTORS:
        name = f"nan-{executor}"
        result = results[name]
        assert result.returncode == 4, result.output[-3000:]
        found = re.search(
            r"the training loss became (inf|nan) by step (\d+); training stopped\. The last good checkpoint "
            r"\(step (\d+)\) is kept in (\S+)\. Lower train\.optimizer\.learning_rate \(now 2\)",
            result.stderr,
        )
        assert found, result.stderr[-2000:]
        bad_step, good_step = int(found.group(2)), int(found.group(3))
        assert 0 < good_step < bad_step
        assert checkpoint_steps(result.run_dir / "checkpoints")[-1] == good_step
        assert "Traceback" not in result.output
        _, run = mlflow_run_by_name(runner.uri, EXPERIMENT, name)
        assert run.info.status == "FAILED" and "loss became" in run.data.tags["error"]
        assert run.info.lifecycle_stage == "active"  # it trained: a failure during training is kept, not deleted
        # The kept checkpoint holds finite weights, model and optimizer alike; no later (bad) one was written.
        assert checkpoint_finite(result.run_dir / "checkpoints" / f"ckpt-{good_step}")


def checkpoint_finite(prefix) -> bool:
    import numpy as np
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(prefix))
    values = [reader.get_tensor(k) for k in reader.get_variable_to_shape_map() if "model" in k or "optimizer" in k]
    return len(values) > 2 and all(np.all(np.isfinite(v)) for v in values if np.issubdtype(np.asarray(v).dtype, np.floating))


def _interrupt(runner, name, args, signum):
    """Start a long run, signal it once it has logged a few hundred steps; returns (exit code, output, last step seen).
    SIGINT goes to the whole process group, as a terminal's Ctrl-C does (the sentinel and the MLflow process get it
    too); SIGTERM to the runner's process alone, as a scheduler's notice does."""
    live = LiveRun(
        [*args, f"mlflow.experiment_name={EXPERIMENT}", f"mlflow.run_name={name}"],
        runner.root,
        runner.root / "runs" / name,
        runner.uri,
    )
    line = live.wait_for(
        lambda line: re.search(r"epoch ([4-9]|\d\d+)/400 step \d+/64", line) or re.search(r"^Epoch ([4-9]|\d\d+)/400", line), 120
    )
    epoch = int(re.search(r"[Ee]poch (\d+)/400", line).group(1))
    # the step of the line that was seen (not the largest step number of any epoch's lines so far)
    seen = re.search(r"step (\d+)/64", line)
    live.ctrl_c() if signum == signal.SIGINT else live.proc.send_signal(signum)
    code, output = live.finish(timeout=90)
    return code, output, (epoch - 1) * 64 + (int(seen.group(1)) if seen else 0)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_sigterm_checkpoints_at_once_and_the_rerun_resumes_there(runner, executor):
    name = f"preempted-{executor}"
    code, output, before = _interrupt(runner, name, [*LONG, f"executor={executor}"], signal.SIGTERM)
    assert code == 143, output[-3000:]
    stop = re.search(r"Stopped: training stopped by SIGTERM at step (\d+): checkpoint written at step (\d+) in (\S+)\.", output)
    assert stop, output[-3000:]
    step = int(stop.group(1))
    assert int(stop.group(2)) == step >= before  # written where training stopped: no step is lost
    after_notice = output[output.index("SIGTERM received: stopping at the next step boundary") :]
    assert len(re.findall(r"epoch \d+/400 step \d+/64", after_notice[: after_notice.index("Stopped:")])) <= 1, output[-3000:]
    run_dir = runner.root / "runs" / name
    assert checkpoint_steps(run_dir / "checkpoints")[-1] == step
    assert f"resume={run_dir}" in output
    _, run = mlflow_run_by_name(runner.uri, EXPERIMENT, name)
    assert run.info.status == "KILLED" and run.data.tags["stopped_by"] == "SIGTERM"
    # The rerun starts at that very step (inside an epoch, for fit too) and finishes the same MLflow run.
    epochs = step // 64 + 1
    result = run_runner(
        [*LONG, f"executor={executor}", f"train.epochs={epochs}", f"resume={run_dir}"],
        cwd=runner.root,
        run_dir=run_dir,
        tracking_uri=runner.uri,
    )
    assert result.returncode == 0, result.output[-3000:]
    assert f"resumed from checkpoint at step {step} " in result.output
    assert f"done: {epochs * 64} steps" in result.output
    _, run = mlflow_run_by_name(runner.uri, EXPERIMENT, name)
    assert run.info.status == "FINISHED"
    where = f"outputs in {run_dir}; MLflow run {run.info.run_id} in experiment '{EXPERIMENT}' (id {run.info.experiment_id})"
    assert where in result.output.splitlines()[-1], result.output[-500:]  # the last line: where to find it all
    steps = [m.step for m in history(runner.uri, run.info.run_id, "loss/replica_0")]
    assert steps == sorted(set(steps)) and steps[-1] == epochs * 64  # one history, no step twice
    assert [s for s in steps if s > step][0] - step <= 32  # logging picked up right after the checkpoint
    assert all(s % 32 == 0 for s in steps), (step, [s for s in steps if s > step - 64])  # on the grid, no seam
    # The rerun read the batches an uninterrupted run reads after that step (the input skips the checkpoint's steps,
    # inside an epoch too): it ends with the weights of a run that was never stopped.
    reference = runner(f"{name}-reference", [*LONG, f"executor={executor}", f"train.epochs={epochs}"])
    assert reference.returncode == 0, reference.output[-3000:]
    import tf_keras

    load = lambda d: tf_keras.models.load_model(d / "model.keras", compile=False).get_weights()  # noqa: E731
    for a, b in zip(load(run_dir), load(reference.run_dir)):
        assert np.max(np.abs(a - b)) <= 1e-5 * np.max(np.abs(b)), (step, np.max(np.abs(a - b)))


def test_ctrl_c_checkpoints_marks_the_run_killed_and_resume_alone_restores_the_overrides(runner):
    code, output, before = _interrupt(runner, "ctrl-c", [*LONG, "executor=custom_loop"], signal.SIGINT)
    assert code == 130, output[-3000:]
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output[-3000:]  # none of its helpers either
    step = int(re.search(r"stopped by SIGINT at step (\d+): checkpoint written at step \1", output).group(1))
    assert step >= before
    run_dir = runner.root / "runs" / "ctrl-c"
    assert checkpoint_steps(run_dir / "checkpoints")[-1] == step
    assert f"Continue with: python -m runner resume={run_dir}" in output
    _, run = mlflow_run_by_name(runner.uri, EXPERIMENT, "ctrl-c")
    assert run.info.status == "KILLED"
    # A resume refused before any step (a model of another shape) leaves the run as it was: KILLED, its saved
    # overrides (the next resume= alone brings them back) and its checkpoints untouched.
    record = (run_dir / ".hydra" / "overrides.yaml").read_text()
    refused = run_runner([f"resume={run_dir}", "model.hidden_units=[16]"], runner.root, run_dir, tracking_uri=runner.uri)
    assert refused.returncode == 2 and "are intact, but a model of another shape wrote them" in refused.stderr, refused.output[
        -3000:
    ]
    assert (run_dir / ".hydra" / "overrides.yaml").read_text() == record
    _, run = mlflow_run_by_name(runner.uri, EXPERIMENT, "ctrl-c")
    assert run.info.status == "KILLED" and "another shape" in run.data.tags["resume_refused"] and "error" not in run.data.tags
    assert checkpoint_steps(run_dir / "checkpoints")[-1] == step
    # resume=<dir> alone continues the run as it was started (mirrored over 2 logical CPUs, the custom loop, its
    # logging grid), not with the defaults; an override given now (train.epochs) replaces the saved one.
    epochs = step // 64 + 1
    result = run_runner([f"resume={run_dir}", f"train.epochs={epochs}"], runner.root, run_dir, tracking_uri=runner.uri)
    assert result.returncode == 0, result.output[-3000:]
    assert f"resumed from checkpoint at step {step} " in result.output
    assert "training with a custom loop" in result.output and "over 2 replica(s)" in result.output, result.output[-3000:]
    assert f"done: {epochs * 64} steps" in result.output
    _, run = mlflow_run_by_name(runner.uri, EXPERIMENT, "ctrl-c")
    assert run.info.status == "FINISHED"
    steps = [m.step for m in history(runner.uri, run.info.run_id, "loss/replica_0")]
    assert steps[-1] == epochs * 64 and all(s % 32 == 0 for s in steps if s > step), (step, [s for s in steps if s > step - 64])


def test_a_preempted_worker_makes_the_cluster_checkpoint_together(runner):
    """SIGTERM to worker:1 only: TensorFlow's PreemptionCheckpointHandler has both workers save at the same step."""
    args = [
        "strategy=multi_worker_mirrored",
        "cluster=localhost",
        "cluster.workers=2",
        "cross_device_ops=ring",
        "executor=fit",
        "train.epochs=400",
        "train.log_every_n_steps=32",
        f"mlflow.experiment_name={EXPERIMENT}",
        "mlflow.run_name=preempted-worker",
    ]
    live = LiveRun(args, runner.root, runner.root / "runs" / "preempted-worker", runner.uri)
    pid = int(live.wait_for(lambda line: "started worker:1 (pid" in line, 60).split("pid ")[1].split(")")[0])
    live.wait_for(lambda line: re.search(r"\[worker:0\] .*[Ee]poch ([3-9]|\d\d+)/400", line), 180)  # paced: any line past
    os.kill(pid, signal.SIGTERM)
    code, output = live.finish(timeout=120)
    assert code == 143, output[-3000:]
    saved = {
        m.group(1): int(m.group(2))
        for m in re.finditer(
            r"\[(worker:\d)\] Stopped: training stopped by SIGTERM at step "
            r"\d+: checkpoint written at step (\d+)",
            output,
        )
    }
    assert set(saved) == {"worker:0", "worker:1"} and saved["worker:0"] == saved["worker:1"], output[-3000:]
    assert "SIGTERM received" not in "".join(
        line for line in output.splitlines(True) if line.startswith("[worker:0]")
    )  # it was told by its peer
    assert "task worker:1 was preempted (SIGTERM)" in output and f"the latest checkpoint is step {saved['worker:0']}" in output
    assert checkpoint_steps(runner.root / "runs" / "preempted-worker" / "checkpoints")[-1] == saved["worker:0"]
    _, run = mlflow_run_by_name(runner.uri, EXPERIMENT, "preempted-worker")
    assert run.info.status == "KILLED"
    deadline = time.monotonic() + 10
    while leftover_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert leftover_processes() == []


def test_metrics_survive_a_tracking_server_that_goes_away_mid_run(runner, mlflow_server, tmp_path):
    """The server is killed twice while Model.fit trains and started again each time: training goes on, every
    metric point is delivered, and the run ends FINISHED with no traceback. A second run whose server stays down
    saves an outbox that `python -m runner.deliver` sends once the server is back."""
    args = [
        "executor=fit",
        "train.epochs=600",
        "train.log_every_n_steps=8",
        "mlflow.flush_every_sec=1",
        f"mlflow.experiment_name={EXPERIMENT}",
        "mlflow.run_name=server-outage",
    ]
    live = LiveRun(args, tmp_path, tmp_path / "outage", mlflow_server.uri)
    live.wait_for(lambda line: re.search(r"epoch ([2-9]|\d\d+)/600", line), 120)  # lines are paced
    for _outage in range(2):
        time.sleep(1.5)  # a flush has reached the server
        mlflow_server.stop()
        live.wait_for(lambda line: "cannot take metrics now" in line, 60)
        progress = live.wait_for(lambda line: re.search(r"epoch \d+/600", line), 60)  # training goes on meanwhile
        mlflow_server.start()
        live.wait_for(lambda line: "is reachable again" in line, 120)
    code, output = live.finish(timeout=300)
    assert code == 0, output[-3000:]
    assert progress and "Traceback" not in output and "Exception" not in output, output[-3000:]
    client, run = _server_run(mlflow_server.uri, "server-outage")
    assert run.info.status == "FINISHED"
    steps = [m.step for m in history(mlflow_server.uri, run.info.run_id, "loss")]
    expected = [e * 64 + s for e in range(600) for s in [*range(8, 64, 8), 64]]
    assert steps == expected  # every point, once

    # The server is down at the end and stays down past mlflow.delivery_timeout_sec: an outbox keeps the rest.
    args = [
        "model=linear",
        "data=ones",
        "train.epochs=30",
        "train.log_every_n_steps=1",
        "mlflow.delivery_timeout_sec=2",
        f"mlflow.experiment_name={EXPERIMENT}",
        "mlflow.run_name=server-gone",
    ]
    live = LiveRun(args, tmp_path, tmp_path / "gone", mlflow_server.uri)
    live.wait_for(lambda line: "training with" in line, 60)
    mlflow_server.stop()
    code, output = live.finish(timeout=120)
    assert code == 0, output[-3000:]
    assert "python -m runner.deliver" in output and (tmp_path / "gone" / "mlflow_outbox.jsonl").exists()
    # the system-metrics monitor's last point could not be sent either: one line, not a thread's tracebacks
    assert "Exception in thread" not in output and "Traceback" not in output
    assert len([line for line in output.splitlines() if "system metrics:" in line]) <= 1, output[-3000:]
    mlflow_server.start()
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    sent = subprocess.run(
        [sys.executable, "-m", "runner.deliver", str(tmp_path / "gone"), "--tracking-uri", mlflow_server.uri],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert sent.returncode == 0, sent.stdout + sent.stderr
    client, run = _server_run(mlflow_server.uri, "server-gone")
    assert run.info.status == "FINISHED"
    assert [m.step for m in history(mlflow_server.uri, run.info.run_id, "loss")] == list(range(1, 31))
    assert not (tmp_path / "gone" / "mlflow_outbox.jsonl").exists()


def _server_run(uri, name):
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(EXPERIMENT)
    (run,) = client.search_runs([exp.experiment_id], filter_string=f"attributes.run_name = '{name}'")
    return client, run


def test_a_parallel_sweep_loses_nothing_on_one_server(mlflow_server, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    argv = [
        sys.executable,
        "-m",
        "runner",
        "-m",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=4",
        "train.seed=range(8)",  # 4 at a time: two waves of concurrent writers
        "model=linear",
        "data=ones",
        "train.epochs=12",
        "train.log_every_n_steps=1",
        "checkpoint.enabled=false",
        "save_model=false",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        f"mlflow.tracking_uri={mlflow_server.uri}",
        f"mlflow.experiment_name={EXPERIMENT}-load",
        "mlflow.run_name=load",
    ]
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    from mlflow import MlflowClient

    client = MlflowClient(mlflow_server.uri)
    exp = client.get_experiment_by_name(f"{EXPERIMENT}-load")
    (parent,) = client.search_runs([exp.experiment_id], filter_string="attributes.run_name = 'load'")
    children = client.search_runs([exp.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert len(children) == 8
    assert sorted(int(c.data.params["train.seed"]) for c in children) == list(range(8))
    assert all(c.info.status == "FINISHED" for c in children)
    with ThreadPoolExecutor(8) as pool:
        histories = list(
            pool.map(lambda c: [m.step for m in history(mlflow_server.uri, c.info.run_id, "loss/replica_0")], children)
        )
    assert all(h == list(range(1, 13)) for h in histories), histories  # 8 x 12 points, none lost or doubled


def test_secrets_stay_out_of_logs_params_and_tags(mlflow_server, tmp_path):
    secrets = {"MLFLOW_TRACKING_PASSWORD": "pw-9f8e7d", "MY_API_TOKEN": "tok-5c4b3a", "TF_VAR_db_password": "tfv-1a2b3c"}
    uri = mlflow_server.uri.replace("http://", "http://alice:url-6d5e4f@")
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(secrets, MLFLOW_TRACKING_USERNAME="alice", PYTHONUNBUFFERED="1")
    argv = [
        sys.executable,
        "-m",
        "runner",
        "model=linear",
        "data=ones",
        "train.epochs=2",
        f"mlflow.tracking_uri={uri}",
        f"mlflow.experiment_name={EXPERIMENT}",
        "mlflow.run_name=secrets",
        f"checkpoint.dir={tmp_path}/ckpt-${{oc.env:MY_API_TOKEN}}",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    client, run = _server_run(mlflow_server.uri, "secrets")
    logged = "\n".join(
        [proc.stdout, proc.stderr, *run.data.params.values(), *run.data.tags.values(), *run.data.params, *run.data.tags]
    )
    for secret in [*secrets.values(), "url-6d5e4f"]:
        assert secret not in logged, secret
    assert "alice:***@127.0.0.1" in proc.stdout + proc.stderr  # the URI is shown, its password is not
    assert run.data.params["mlflow.tracking_uri"] == uri.replace("url-6d5e4f", "***")
    assert run.data.params["checkpoint.dir"] == f"{tmp_path}/ckpt-***"  # a config value built from a secret variable
    assert "env.TF_CPP_MIN_LOG_LEVEL" in run.data.tags  # the environment is recorded, minus the secrets
    assert not any(k.endswith(("PASSWORD", "TOKEN", "password")) for k in run.data.tags)
    # Nor on disk: Hydra's .hydra/*.yaml (written before any runner code) and the log hold the URI masked.
    on_disk = {p: p.read_text(errors="replace") for p in (tmp_path / "run").rglob("*") if p.suffix in (".yaml", ".log")}
    assert {"config.yaml", "hydra.yaml", "overrides.yaml", "runner.log"} <= {p.name for p in on_disk}
    for path, text in on_disk.items():
        assert "url-6d5e4f" not in text and not any(s in text for s in secrets.values()), path
    assert "mlflow.tracking_uri=http://alice:***@" in on_disk[tmp_path / "run" / ".hydra" / "overrides.yaml"]
    # resume= restores the first run's overrides, but not a masked password: it must be given again.
    resume = [sys.executable, "-m", "runner", f"resume={tmp_path / 'run'}", "train.epochs=3"]
    refused = subprocess.run(resume, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
    assert "gave mlflow.tracking_uri with a password or token" in refused.stderr and "mlflow.tracking_uri=..." in refused.stderr
    again = subprocess.run(
        [*resume, f"mlflow.tracking_uri={uri}"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 0 and "done: 3 steps" in again.stdout, (again.stdout + again.stderr)[-3000:]
    assert not any(s in again.stdout + again.stderr for s in [*secrets.values(), "url-6d5e4f"])  # its "resumed from" line too
    assert client.get_run(run.info.run_id).info.status == "FINISHED"


@pytest.mark.parametrize(
    "moment",
    [
        "importing",  # before Hydra: the interpreter is importing the runner
        "strategy=auto chose",  # composed, importing TensorFlow; no MLflow run yet
        "training with",  # the run exists, training starts
        "model saved to",  # training is over: saving, the MLflow model, the last delivery
    ],
)
def test_ctrl_c_at_any_moment_ends_cleanly(runner, moment):
    name = "ctrl-c-" + re.sub(r"\W+", "-", moment)
    live = LiveRun(
        ["train.epochs=1", "train.steps_per_epoch=20", f"mlflow.experiment_name={EXPERIMENT}", f"mlflow.run_name={name}"],
        runner.root,
        runner.root / "runs" / name,
        runner.uri,
    )
    if moment == "importing":
        time.sleep(0.2)
    else:
        live.wait_for(lambda line: moment in line, 120)
    live.ctrl_c()
    code, output = live.finish(timeout=60)
    assert code in (130, 0), output[-3000:]  # 0: it had finished before the signal came
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output[-3000:]
    assert re.search(r"^(Stopped|Interrupted): ", output, re.M) or code == 0, output[-3000:]
    if moment in ("training with", "model saved to"):
        _, run = mlflow_run_by_name(runner.uri, EXPERIMENT, name)
        assert run.info.status in ("KILLED", "FINISHED"), run.info.status  # never left RUNNING
    deadline = time.monotonic() + 10
    while live_group_members(live.proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert live_group_members(live.proc.pid) == [], "the run left processes behind (sentinel, MLflow process)"


@pytest.fixture
def full_disk(tmp_path):
    """A 300 KiB tmpfs: a real filesystem that fills up (mount needs root, as the network-namespace tests do)."""
    where = tmp_path / "full"
    where.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", str(where)]).returncode:
        pytest.skip("a small filesystem to fill needs root to mount a tmpfs")
    yield where
    subprocess.run(["umount", "-l", str(where)])


def test_a_disk_that_fills_up_ends_the_run_failed_with_one_paragraph(runner, full_disk):
    result = run_runner(
        ["train.epochs=2", "train.steps_per_epoch=5", "model.hidden_units=[400,400]", f"mlflow.experiment_name={EXPERIMENT}",
         "mlflow.run_name=full-disk"],
        cwd=runner.root,
        run_dir=full_disk / "run",
        tracking_uri=runner.uri,
    )  # fmt: skip
    assert result.returncode == 1, result.output[-3000:]
    assert "Traceback" not in result.output, result.output[-3000:]
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("Error: the checkpoint of step 5 could not be written to ") and "No space left" in error, error
    assert f"resume={full_disk / 'run'}" in error
    _, run = mlflow_run_by_name(runner.uri, EXPERIMENT, "full-disk")
    assert run.info.status == "FAILED" and "could not be written" in run.data.tags["error"]
