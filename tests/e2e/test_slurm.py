"""cluster=slurm on a real Slurm cluster (the `slurm` fixture: munged, slurmctld and slurmd on this machine): the runner's
tasks are started by `srun`, and SlurmClusterResolver reads what Slurm really sets. Each job ends with one FINISHED
MLflow run. Skipped with the reason where the cluster cannot start (tests/slurm_cluster.py)."""

import os
import re
import subprocess
import sys
import time

import pytest

from helpers import CLUSTER_TINY, ELASTIC, ROOT, check_elastic_run, doc_text, mlflow_run_by_name
from slurm_cluster import free_port_run

pytestmark = pytest.mark.slow

EXPERIMENT = "slurm"
TINY = CLUSTER_TINY


def srun_runner(slurm, store, ntasks, name, args, timeout=240):
    """`srun -n <ntasks> python -m runner ... cluster=slurm`; (exit code, output, seconds)."""
    root, uri = store
    env = {k: v for k, v in slurm.env.items() if k != "MLFLOW_TRACKING_URI"}
    # srun hands its environment to the tasks: the same Python finds this checkout's code.
    env.update(PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    argv = [
        "srun",
        f"--ntasks={ntasks}",
        "--kill-on-bad-exit=1",
        f"--job-name={name}",
        f"--chdir={root}",
        sys.executable,
        "-m",
        "runner",
        "cluster=slurm",
        f"cluster.port_base={free_port_run(ntasks)}",
        *TINY,
        *args,
        f"mlflow.experiment_name={EXPERIMENT}",
        f"mlflow.run_name={name}",
        f"mlflow.tracking_uri={uri}",
        f"hydra.run.dir={root}/runs/slurm-{name}",  # the session store is shared: test_cluster has its own mwms-fit
    ]
    started = time.monotonic()
    try:
        proc = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        out = (err.stdout or b"").decode(errors="replace") + (err.stderr or b"").decode(errors="replace")
        raise AssertionError(f"srun did not return within {timeout} s; jobs: {slurm.jobs()}\n{out[-4000:]}") from None
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - started


def final_losses(output):
    return [float(x) for x in re.findall(r"done: \d+ steps, final loss ([0-9.]+)", output)]


def test_multi_worker_mirrored_under_srun(slurm, store, executor="fit"):
    """Model.fit. SlurmClusterResolver reads the same Slurm variables under either executor; the custom loop's
    MultiWorkerMirrored training under Slurm is the elastic test's below (in job steps, as cluster=tf_config tasks)."""
    name = f"mwms-{executor}"
    code, output, _ = srun_runner(
        slurm, store, 2, name, ["strategy=multi_worker_mirrored", "cross_device_ops=ring", f"executor={executor}"]
    )
    assert code == 0, output[-4000:]
    assert "worker:0:" in output and "worker:1:" in output  # both Slurm tasks took their place in the cluster
    assert "device:GPU" not in output  # a CPU node: replicas on the CPU, not on a GPU the resolver made up
    losses = final_losses(output)
    assert len(losses) == 2 and losses[0] == losses[1], output[-3000:]  # both workers agree
    _, run = mlflow_run_by_name(store[1], EXPERIMENT, name)
    assert run.info.status == "FINISHED"
    assert run.data.tags["cluster.name"] == "slurm"
    assert run.data.tags["num_workers"] == "2" and run.data.tags["num_replicas_in_sync"] == "2"
    assert {"loss/replica_0", "loss/replica_1"} <= set(run.data.metrics)
    _wait_for(lambda: not slurm.jobs(), 30, "the job leaving the queue")  # COMPLETING for a moment after srun returns


def test_parameter_server_under_srun_ends_when_the_chief_is_done(slurm, store):
    """srun -n 3 with cluster.ps=1: task 0 is the ps, task 1 the chief, task 2 a worker (README). The ps and the
    worker serve forever unless told: they watch the chief and exit 0 once it has ended, so srun returns."""
    name = "ps"
    code, output, seconds = srun_runner(slurm, store, 3, name, ["strategy=parameter_server", "cluster.ps=1"])
    assert code == 0, output[-4000:]
    assert "ps:0 serving at" in output and "worker:0 serving at" in output
    assert output.count("has ended; stopping this server") == 2, output[-3000:]
    _, run = mlflow_run_by_name(store[1], EXPERIMENT, name)
    assert run.info.status == "FINISHED"
    assert run.data.tags["cluster.name"] == "slurm" and run.data.tags["num_workers"] == "1"
    assert "chief:0: ParameterServerStrategy with " in output  # the guide's name, not the class (V2)
    assert "loss/replica_0" in run.data.metrics
    _wait_for(lambda: not slurm.jobs(), 30, "the job leaving the queue")


def _readme_sbatch_script(elastic=False):
    """README's sbatch script (a ```sh block starting #!/bin/bash, #SBATCH): the elastic one, or the other one."""
    scripts = re.findall(r"```sh\n(#!/bin/bash\n#SBATCH.*?)```", doc_text(), re.S)
    found = [s for s in scripts if ("cluster.elastic.enabled=true" in s) == elastic]
    assert len(found) == 1, f"README's {'elastic ' if elastic else ''}sbatch script not found (or found twice)"
    return found[0]


def _sbatch_env(slurm):
    """The environment a batch script here is submitted with: this checkout's code, and this Python as `python`."""
    env = {k: v for k, v in slurm.env.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
        PATH=os.pathsep.join([os.path.dirname(sys.executable), env["PATH"]]),  # the script's `python` is this one
    )
    return env


def _wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"{what} did not happen within {timeout} s")


def test_readme_sbatch_script_scancel_then_resume(slurm, store):
    """README's job.sbatch on 2 tasks; `scancel` mid-training: both workers checkpoint at one step and the run ends
    KILLED; README's resume line continues the same run from that step to FINISHED. (The one node takes both tasks:
    `--nodes=1 --ntasks-per-node=2` on sbatch's command line override the script's #SBATCH lines.)"""
    root, uri = store
    script = root / "job.sbatch"
    script.write_text(_readme_sbatch_script())
    env = _sbatch_env(slurm)
    args = [
        "executor=custom_loop",
        "train.log_every_n_steps=32",
        f"mlflow.experiment_name={EXPERIMENT}",
        "mlflow.run_name=sbatch",
        f"mlflow.tracking_uri={uri}",
    ]

    def sbatch(*extra):
        argv = ["sbatch", "--parsable", "--nodes=1", "--ntasks-per-node=2", f"--chdir={root}", str(script), *args]
        argv += [f"cluster.port_base={free_port_run(2)}", *extra]
        proc = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip().split(";")[0]

    timings = {}
    started = time.monotonic()
    job = sbatch("train.epochs=400", "executor.verbose=2")  # every progress line: epoch 3's is waited for
    log = root / f"slurm-{job}.out"
    output = lambda: log.read_text(errors="replace") if log.exists() else ""  # noqa: E731
    _wait_for(lambda: re.search(r"epoch 3/400", output()), 180, f"epoch 3 in {log}: {output()[-3000:]}")
    timings["to epoch 3"] = time.monotonic() - started
    started = time.monotonic()
    subprocess.run(["scancel", job], env=env, check=True, timeout=30)
    _wait_for(lambda: not slurm.jobs(), 90, f"job {job} ending after scancel; {slurm.jobs()}")
    timings["scancel to job end"] = time.monotonic() - started
    assert slurm.job_state(job)[0] == "CANCELLED"
    text = output()
    saves = re.findall(r"stopped by SIGTERM at step (\d+): checkpoint written at step (\d+)", text)
    assert len(saves) == 2 and len({s for pair in saves for s in pair}) == 1, text[-4000:]
    step = int(saves[0][0])
    _, run = mlflow_run_by_name(uri, EXPERIMENT, "sbatch")
    assert run.info.status == "KILLED", text[-3000:]
    run_dir = root / "outputs" / f"slurm-{job}.0"  # under srun: one directory per job step, not per clock
    assert (run_dir / "mlflow_run_id").read_text().strip() == run.info.run_id

    epochs = step // 64 + 1
    started = time.monotonic()
    resumed = sbatch(f"train.epochs={epochs}", f"resume=outputs/slurm-{job}.0")
    _wait_for(lambda: not slurm.jobs(), 180, f"resumed job {resumed} ending; {slurm.jobs()}")
    timings["resumed job"] = time.monotonic() - started
    text = (root / f"slurm-{resumed}.out").read_text(errors="replace")
    assert slurm.job_state(resumed) == ("COMPLETED", "0:0"), text[-4000:]
    assert f"resumed from checkpoint at step {step} " in text, text[-3000:]
    _, again = mlflow_run_by_name(uri, EXPERIMENT, "sbatch")
    assert again.info.run_id == run.info.run_id and again.info.status == "FINISHED"
    print(f"stopped at step {step}, resumed to step {epochs * 64}; seconds: {timings}")


def _steps(job, env):
    """{name: <job>.<step>} of the job's running steps (squeue)."""
    out = subprocess.run(
        ["squeue", "--steps", f"--jobs={job}", "--noheader", "--format=%i %j"], env=env, capture_output=True, text=True
    )
    return {name: step for step, name in (line.split() for line in out.stdout.splitlines() if len(line.split()) == 2)}


def test_readme_elastic_script_trains_through_a_cancelled_step_to_the_weights_of_one_process(slurm, store, elastic_reference):
    """README's elastic sbatch script on 3 tasks, the custom loop, in-memory data: one launcher starts each worker as a
    job step. README's `scancel --signal=KILL <job>.<step>` of worker:1's step after the first checkpoint: the launcher
    cancels the other two, starts 2 fresh steps from that checkpoint, grows back to 3 steps at the next one, and the
    job ends COMPLETED with the weights of one uninterrupted process (1e-5)."""
    root, uri = store
    name = "slurm-elastic"
    script = root / "elastic.sbatch"
    script.write_text(_readme_sbatch_script(elastic=True))
    env = _sbatch_env(slurm)
    run_dir = root / "runs" / name
    args = [
        "executor=custom_loop",
        f"cluster.port_base={free_port_run(15)}",  # 3 ports per generation, fresh at each resize
        "cluster.elastic.rejoin_after_sec=0",
        *ELASTIC,
        f"mlflow.experiment_name={EXPERIMENT}",
        f"mlflow.run_name={name}",
        f"mlflow.tracking_uri={uri}",
        f"hydra.run.dir={run_dir}",
    ]
    argv = ["sbatch", "--parsable", "--nodes=1", f"--chdir={root}", str(script), *args]
    job = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    log = root / f"slurm-{job}.out"
    output = lambda: log.read_text(errors="replace") if log.exists() else ""  # noqa: E731
    _wait_for(lambda: re.search(r"\[worker:0\].* epoch 2/12 step (8|12)/16", output()), 240, f"step 24: {output()[-3000:]}")
    steps = _steps(job, env)
    step = next((v for k, v in steps.items() if re.fullmatch(r"runner-\d+-0-worker1", k)), None)  # generation 0's
    assert step, steps
    subprocess.run(["scancel", "--signal=KILL", step], env=env, check=True, timeout=30)
    _wait_for(lambda: not slurm.jobs(), 300, f"job {job} ending; {slurm.jobs()}")
    text = output()
    assert slurm.job_state(job) == ("COMPLETED", "0:0"), text[-4000:]
    assert "cluster.elastic: lost worker:1: killed by SIGKILL (its step on" in text, text[-4000:]
    assert "going on with 2 worker(s)" in text and "training again on 3 worker(s)" in text, text[-4000:]
    assert "job steps on" in text and len(re.findall(r"started worker:0 \(pid \d+\)", text)) == 3  # 3 generations
    model = run_dir / "worker-0" / "model.keras"
    run, lost, back = check_elastic_run(uri, EXPERIMENT, name, model, elastic_reference("custom_loop"))
    assert run.data.tags["cluster.name"] == "slurm" and {"loss/replica_0", "loss/replica_2"} <= set(run.data.metrics)
    assert 0 <= lost["steps_redone"] <= 16  # the steps since the checkpoint, as far as the launcher saw them
    print(f"Slurm, custom loop: shrink {lost['resize_sec']:.1f}s, grow {back['resize_sec']:.1f}s, redone {lost['steps_redone']}")
