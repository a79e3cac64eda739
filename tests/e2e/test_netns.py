"""Multi-host on one machine: every task in a Linux network namespace of its own (tests/netns_cluster.py), with an address
from 198.18.0.0/15 and a TF_CONFIG naming those addresses, as Kubernetes pods run `cluster=tf_config`. Training
across them matches a single process; network faults made on the tasks' links (down, rate-limited) end or slow the
job as docs/reliability.md says. Skipped with the reason where namespaces cannot be made (not root)."""

import os
import re
import sys
import time

import numpy as np
import pytest

from helpers import ELASTIC, ROOT, check_elastic_run, load_weights, mlflow_run_by_name, processes_with
from netns_cluster import NetnsCluster, NetnsUnavailable, Tasks

pytestmark = pytest.mark.slow

EXPERIMENT = "netns"
MARK = "netns-test"
TINY = [
    "data.num_examples=512",
    "data.eval_examples=128",
    "train.epochs=1",
    "train.steps_per_epoch=8",
    "train.global_batch_size=64",
    "train.log_every_n_steps=1",
]
# Long enough to cut a link mid-training: 64 steps an epoch, a checkpoint every 32.
LONG = [
    "data.num_examples=4096",
    "data.eval_examples=128",
    "train.epochs=40",
    "train.global_batch_size=64",
    "train.log_every_n_steps=16",
    "checkpoint.every_n_steps=32",
]
MWMS = ["strategy=multi_worker_mirrored", "cross_device_ops=ring"]
PS = ["strategy=parameter_server", "cluster.exit_with_chief=true"]


@pytest.fixture(scope="module")
def netns():
    """Four namespaces on one bridge, removed at the end (also when a test fails or the run is interrupted)."""
    cluster = NetnsCluster(4)
    try:
        cluster.start()
    except NetnsUnavailable as why:
        pytest.skip(f"no network namespaces here: {why}")
    try:
        yield cluster
    finally:
        cluster.stop()
        assert cluster.leftovers() == [], f"namespaces or links left behind: {cluster.leftovers()}"


def leftover_processes():
    """This file's runner processes still alive (their environment carries RUNNER_LAUNCH_ID=netns-test; other
    tests' processes, which may run meanwhile, carry other values)."""
    return processes_with(f"RUNNER_LAUNCH_ID={MARK}")


@pytest.fixture(autouse=True)
def nothing_left(netns):
    yield
    deadline = time.monotonic() + 10
    while leftover_processes() and time.monotonic() < deadline:
        time.sleep(0.3)
    left = leftover_processes() + [p for i in range(netns.n) for p in netns.pids(i)]
    for i in range(netns.n):
        netns.link_up(i)
        netns.unlimit(i)
    assert left == [], f"processes left behind: {left}"


_ports = iter(range(2300, 2400))


def start(netns, store, name, jobs, args, resume=False, port=None) -> Tasks:
    """`python -m runner <args> cluster=tf_config` for every task of `jobs`, each in its own namespace; with
    `resume`, each task continues its own output directory of an earlier start under the same name."""
    root, uri = store
    run_root = root / "netns" / name
    run_root.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT), RUNNER_LAUNCH_ID=MARK)

    def argv(job, i):
        return [
            sys.executable,
            "-m",
            "runner",
            "cluster=tf_config",
            *args,
            f"mlflow.experiment_name={EXPERIMENT}",
            f"mlflow.run_name={name}",
            f"mlflow.tracking_uri={uri}",
            f"hydra.run.dir={run_root}/{job}-{i}",
            f"checkpoint.dir={run_root}/checkpoints",
            *([f"resume={run_root}/{job}-{i}"] if resume else []),
        ]

    return Tasks(netns, jobs, argv, run_root, env, port=port or next(_ports))


def start_pods(netns, store, name, workers, ps, args) -> Tasks:
    """The pods of the manifests `python -m runner.kubernetes <args>` prints (an Indexed Job, or a JobSet under
    parameter_server), one namespace each: the command and environment of its container, what Kubernetes adds to a
    pod (JOB_COMPLETION_INDEX; JobSet's annotations in the variables the manifest declares), and the DNS names of
    the headless Service in every namespace's /etc/hosts. No TF_CONFIG: each pod derives its own."""
    import subprocess

    import yaml

    root, uri = store
    port = next(_ports)
    generate = [sys.executable, "-m", "runner.kubernetes", *args, "cluster.image=runner:test", f"cluster.job_name={name}"]
    generate += [f"cluster.workers={workers}", f"cluster.ps={ps}", f"cluster.port={port}", f"cluster.mount_path={root / 'netns'}"]
    generate += [f"mlflow.tracking_uri={uri}", "cluster.volume=runs"]  # the namespaces share this filesystem
    generate += [f"mlflow.experiment_name={EXPERIMENT}", f"mlflow.run_name={name}"]
    made = subprocess.run(generate, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert made.returncode == 0, made.stderr[-3000:]
    documents = [d for d in yaml.safe_load_all(made.stdout) if d]
    workload = documents[-1]
    if workload["kind"] == "Job":
        pod = workload["spec"]["template"]["spec"]
        service = pod["subdomain"]
        jobs = {"worker": workers}
    else:
        pod = workload["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        service = name
        jobs = {"chief": 1, "worker": workers, "ps": ps}
    (container,) = pod["containers"]
    declared = {e["name"]: e.get("value") for e in container["env"]}
    annotations = {"JOBSET_NAME": name, "JOB_INDEX": "0"}
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "TF_CONFIG")}
    env.update(PYTHONPATH=str(ROOT), RUNNER_LAUNCH_ID=MARK)

    def pods(job, i):
        given = {k: v for k, v in declared.items() if v is not None}
        if workload["kind"] == "JobSet":
            given |= {**{k: annotations[k] for k in ("JOBSET_NAME", "JOB_INDEX")}, "REPLICATED_JOB_NAME": job}
            return f"{name}-{job}-0-{i}.{service}", {**given, "JOB_COMPLETION_INDEX": str(i)}
        return f"{name}-{i}.{service}", {**given, "JOB_COMPLETION_INDEX": str(i)}

    run_root = root / "netns" / name
    run_root.mkdir(parents=True, exist_ok=True)
    return Tasks(netns, jobs, lambda job, i: [sys.executable, "-m", "runner", *container["args"]], run_root, env, port, pods)


def final_loss(text):
    return float(re.search(r"done: \d+ steps, final loss ([0-9.]+)", text).group(1))


def outputs(tasks):
    return "\n".join(f"--- {n}\n{tasks.output(n)[-2500:]}" for n in tasks.names)


@pytest.mark.parametrize("executor", ["fit", "custom_loop"])
def test_mwms_across_namespaces_matches_one_process(netns, store, runner, executor):
    """Two workers on 198.18.0.1 and .2: both finish with the same loss, and the chief's weights are those of one
    process training on the same global batch."""
    args = [*MWMS, *TINY, f"executor={executor}"]
    name = f"mwms-{executor.replace('_', '-')}"
    # fit: TF_CONFIG given, as a TFJob operator gives it; custom_loop: the Indexed Job of `python -m runner.kubernetes`
    tasks = start(netns, store, name, {"worker": 2}, args) if executor == "fit" else start_pods(netns, store, name, 2, 0, args)
    reference = runner(f"netns-reference-{executor}", ["strategy=default", *TINY, f"executor={executor}"])
    assert reference.returncode == 0, reference.output[-3000:]
    codes = tasks.finish(timeout=180)
    assert codes == {"worker:0": 0, "worker:1": 0}, outputs(tasks)
    assert ("198.18.0.1:" if executor == "fit" else f"{name}-0.{name}:") in tasks.spec["worker"][0]
    assert final_loss(tasks.output("worker:0")) == final_loss(tasks.output("worker:1"))
    chief = load_weights(tasks.root / "worker-0" / "model.keras")
    single = load_weights(reference.run_dir / "model.keras")
    for a, b in zip(chief, single):
        assert np.max(np.abs(a - b)) <= 1e-5 * np.max(np.abs(b))
    _, run = mlflow_run_by_name(store[1], EXPERIMENT, name)
    assert run.info.status == "FINISHED"
    assert run.data.tags["num_workers"] == "2" and run.data.tags["num_replicas_in_sync"] == "2"
    assert run.data.tags["cluster.name"] == ("tf_config" if executor == "fit" else "kubernetes")
    assert {"loss/replica_0", "loss/replica_1"} <= set(run.data.metrics)


def test_parameter_server_across_namespaces_ends_by_itself(netns, store, runner):
    """chief, worker and ps in three namespaces, as the pods of the JobSet `python -m runner.kubernetes` prints: the
    chief trains; with cluster.exit_with_chief=true (the JobSet's command sets it) the ps and the worker exit 0 once
    the chief has ended, so every process ends by itself. Same final loss as cluster=localhost."""
    args = ["strategy=parameter_server", *TINY, "executor=custom_loop"]  # the JobSet sets exit_with_chief
    tasks = start_pods(netns, store, "ps", 1, 1, args)
    codes = tasks.finish(timeout=180)
    assert codes == {"chief:0": 0, "worker:0": 0, "ps:0": 0}, outputs(tasks)
    for server in ("worker:0", "ps:0"):
        assert "has ended; stopping this server" in tasks.output(server)
    _, run = mlflow_run_by_name(store[1], EXPERIMENT, "ps")
    assert run.info.status == "FINISHED" and run.data.tags["strategy"].startswith("ParameterServerStrategy")
    local = runner(
        "netns-ps-localhost",
        ["strategy=parameter_server", "cluster=localhost", "cluster.workers=1", "cluster.ps=1", *TINY, "executor=custom_loop"],
    )
    assert local.returncode == 0, local.output[-3000:]
    # one worker runs the steps one after another: asynchronous training is deterministic then
    assert final_loss(tasks.output("chief:0")) == final_loss(local.output)


def test_a_link_down_stops_mwms_with_exit_3_and_resume_continues(netns, store):
    """worker:1's link goes down mid-training: both workers stop within TensorFlow's heartbeat timeout (10 s) plus
    the time to end, exit 3, each naming the task it lost, no traceback; the run is FAILED; nothing is left running.
    With the link back, resume=<each task's output directory> continues from the last checkpoint to FINISHED, in the
    same MLflow run."""
    name = "link-down"
    args = [*MWMS, *LONG, "executor=custom_loop"]
    tasks = start(netns, store, name, {"worker": 2}, args)
    tasks.wait_for("worker:0", r"epoch ([3-9]|\d\d)/40", 120)  # past a checkpoint (every 32 steps); lines are paced
    netns.link_down(tasks.ns_of["worker:1"])
    down_at = time.monotonic()
    codes = tasks.finish(timeout=90)
    stopped_after = time.monotonic() - down_at
    assert codes == {"worker:0": 3, "worker:1": 3}, outputs(tasks)
    first, second = tasks.output("worker:0"), tasks.output("worker:1")
    assert "Error: task worker:0 lost contact with worker:1 (198.18.0.2:" in first, first[-3000:]
    assert "Error: task worker:1 lost contact with worker:0 (198.18.0.1:" in second, second[-3000:]
    assert "Traceback" not in first + second
    assert stopped_after < 10 + 15, f"stopped {stopped_after:.1f} s after the link went down"
    _, run = mlflow_run_by_name(store[1], EXPERIMENT, name)
    assert run.info.status == "FAILED" and "lost contact with worker:1" in run.data.tags["error"]
    checkpoint = int(re.search(r"the latest checkpoint is step (\d+)", first).group(1))
    reached = max((int(e) - 1) * 64 + int(s) for e, s in re.findall(r"epoch (\d+)/40 step (\d+)/64", first))
    # (no process is left: the autouse fixture checks the namespaces and the marker)

    netns.link_up(tasks.ns_of["worker:1"])
    epochs = checkpoint // 64 + 1
    resumed = start(netns, store, name, {"worker": 2}, [*args, f"train.epochs={epochs}"], resume=True)
    codes = resumed.finish(timeout=120)
    assert codes == {"worker:0": 0, "worker:1": 0}, outputs(resumed)
    assert f"resumed from checkpoint at step {checkpoint} " in resumed.output("worker:0")
    _, again = mlflow_run_by_name(store[1], EXPERIMENT, name)
    assert again.info.run_id == run.info.run_id and again.info.status == "FINISHED"
    print(
        f"link down -> both tasks exited 3 after {stopped_after:.1f} s; last step logged {reached}, checkpoint "
        f"{checkpoint}: {reached - checkpoint} logged steps redone on resume"
    )


def test_a_slow_link_still_trains(netns, store):
    """worker:1's link rate-limited both ways with tbf (netem, the usual tool, is not in this kernel): the job
    trains to the same loss on both workers, only slower; the cost is measured in benchmarks/netns_scale.py."""
    netns.rate_limit(1, "2mbit")
    tasks = start(netns, store, "slow-link", {"worker": 2}, [*MWMS, *TINY, "executor=custom_loop"])
    codes = tasks.finish(timeout=180)
    assert codes == {"worker:0": 0, "worker:1": 0}, outputs(tasks)
    assert final_loss(tasks.output("worker:0")) == final_loss(tasks.output("worker:1"))
    client, run = mlflow_run_by_name(store[1], EXPERIMENT, "slow-link")
    assert run.info.status == "FINISHED"
    print(f"tbf 2mbit on worker:1: {run.data.metrics['summary/examples_per_sec']:,.0f} examples/s")


def test_a_parameter_server_worker_cut_off_finishes(netns, store):
    """worker:1's link down for 6 s mid-training, then back: worker:1 keeps serving (a chief it cannot reach is not a
    chief that ended), the coordinator's step in flight on it waits for the link (or fails with UnavailableError
    and is rescheduled) while worker:0 goes on, and worker:1 takes steps again once its link is back. Every
    scheduled step runs once; every process ends by itself; the run is FINISHED."""
    args = [*PS, *LONG, "train.epochs=4", "executor=custom_loop"]
    tasks = start(netns, store, "ps-cut", {"chief": 1, "worker": 2, "ps": 1}, args)
    tasks.wait_for("chief:0", r"epoch 2/4", 120)
    netns.link_down(tasks.ns_of["worker:1"])
    cut_at = time.monotonic()
    before = int(re.findall(r"steps per worker 0:\d+, 1:(\d+)", tasks.output("chief:0"))[-1])
    time.sleep(6)
    netns.link_up(tasks.ns_of["worker:1"])
    codes = tasks.finish(timeout=180)
    assert codes == {"chief:0": 0, "worker:0": 0, "worker:1": 0, "ps:0": 0}, outputs(tasks)
    assert "does not answer (a network fault?); still serving" in tasks.output("worker:1")
    _, run = mlflow_run_by_name(store[1], EXPERIMENT, "ps-cut")
    assert run.info.status == "FINISHED"
    per_worker = [int(run.data.metrics.get(f"steps/worker_{i}", 0)) for i in range(2)]
    assert sum(per_worker) == 4 * 64, per_worker
    assert per_worker[1] > before + 8, (before, per_worker)  # worker:1 trained again after its link came back
    took = time.monotonic() - cut_at
    print(f"ps worker cut off 6 s: steps per worker {per_worker} (worker:1 had {before} at the cut); {took:.0f} s cut to end")


def test_an_elastic_job_trains_through_a_link_down_and_up_to_the_weights_of_one_process(netns, store, elastic_reference):
    """cluster=kubernetes cluster.elastic.enabled=true in three namespaces, as the three pods of the Indexed Job
    `python -m runner.kubernetes` prints (each derives its TF_CONFIG; names from /etc/hosts): each runner is an
    agent that starts its pod's trainer, worker:0's leads. worker:2's link goes down after the first checkpoint: the
    leader hears nothing from its agent for cluster.agent_timeout_sec, stops the other trainers and goes on with 2
    from that checkpoint; worker:2's agent, out of touch, stops its own trainer and calls back. The link comes up
    again as the smaller job starts: worker:2's agent is back in touch, and the job grows to 3 at the smaller job's
    first checkpoint, at a step the trainers agree on. Every agent exits 0, and the weights
    are those of one uninterrupted process (1e-5), as under localhost, Slurm and Ray (helpers.check_elastic_run)."""
    name = "netns-elastic"
    args = [*MWMS, "cluster.elastic.enabled=true", "cluster.elastic.rejoin_after_sec=0", *ELASTIC, "executor=custom_loop"]
    tasks = start_pods(netns, store, name, 3, 0, args)
    tasks.wait_for("worker:0", r"\[worker:0\].* epoch 2/12 step (8|12)/16", 240)  # past step 16's checkpoint
    down = tasks.ns_of["worker:2"]
    netns.link_down(down)
    down_at = time.monotonic()
    tasks.wait_for("worker:0", r"cluster.elastic: lost worker:2", 60)
    netns.link_up(down)  # back in touch while the smaller job starts: it grows back at its first checkpoint
    tasks.wait_for("worker:0", r"training again on 2 worker\(s\)", 60)
    shrunk_after = time.monotonic() - down_at
    codes = tasks.finish(timeout=300)
    assert codes == {"worker:0": 0, "worker:1": 0, "worker:2": 0}, outputs(tasks)
    leader, cut = tasks.output("worker:0"), tasks.output("worker:2")
    lost = r"cluster.elastic: lost worker:2: its pod \(netns-elastic-2\.netns-elastic\) is out of touch: no word for"
    assert re.search(lost, leader), leader[-4000:]
    assert "going on with 2 worker(s)" in leader and "training again on 3 worker(s)" in leader, leader[-4000:]
    assert "lost worker:0 at netns-elastic-0.netns-elastic:" in cut and cut.count("in touch with worker:0") == 2, cut[-3000:]
    assert "Traceback" not in leader + cut
    model = tasks.root / "worker-0" / "worker-0" / "model.keras"
    run, lost, back = check_elastic_run(store[1], EXPERIMENT, name, model, elastic_reference("custom_loop"))
    assert run.data.tags["cluster.name"] == "kubernetes" and {"loss/replica_0", "loss/replica_2"} <= set(run.data.metrics)
    assert 0 <= lost["steps_redone"] <= 16
    print(
        f"link down: training again on 2 workers {shrunk_after:.1f}s later (resize {lost['resize_sec']:.1f}s after "
        f"the loss was seen); link up: grown back in {back['resize_sec']:.1f}s; {lost['steps_redone']} steps redone"
    )
