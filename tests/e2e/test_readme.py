"""README and the documentation are a contract: every command in their ```bash blocks runs here, or is listed with
the reason it cannot.

The commands are parsed from README.md and the guide pages in docs/ (helpers.DOC_PAGES), never copied: a new or
changed command is found by test_every_readme_command_has_a_test, and must match a kind below. Each command runs
as written, with only step-count and output-directory overrides added (TINY, hydra.run.dir / hydra.sweep.dir,
--out), in a scratch working directory (so README's default store, ./mlflow.db, is a fresh one there), and is checked for what
README says it does: exit code, MLflow runs and metrics, files written.
"""

import csv
import gzip
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import yaml

from helpers import (
    ELASTIC,
    ROOT,
    doc_text,
    free_port,
    live_group_members,
    processes_with,
    serve_and_predict,
    validate_manifest,
    write_bmp,
    write_image_folder,
)

README = ROOT / "README.md"
TINY = ["train.epochs=1", "train.steps_per_epoch=2"]  # README's commands, at two steps
GROUPS = {p.name for p in (ROOT / "conf").iterdir() if p.is_dir() and p.name != "hydra"}


def readme_commands():
    """Each command of the ```bash blocks of README and the guide pages (helpers.DOC_PAGES) as a token list
    (continuations joined, comments dropped), once each, in the order the pages show them (README first)."""
    commands, block, lines = [], False, doc_text().splitlines()
    pending = ""
    for line in lines:
        if line.startswith("```"):
            block = line.strip() == "```bash"
            continue
        if not block:
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        tokens = shlex.split(pending + line, comments=True)
        pending = ""
        if tokens and tokens not in commands:
            commands.append(tokens)
    return commands


def key(tokens):
    return " ".join(tokens)


# --- kinds of command: (name, does it match, reason it cannot run here or None) -------------------------------
def _runner_args(tokens):
    """The arguments after `python -m runner` (None when the command is not the runner's)."""
    for i in range(len(tokens) - 2):
        if tokens[i].endswith("python") and tokens[i + 1 : i + 3] == ["-m", "runner"]:
            return tokens[i + 3 :]
    return None


def _setup_steps(tokens):
    return [list(g) for k, g in itertools.groupby(tokens, lambda t: t == "&&") if not k]


def kind_of(tokens):
    """(kind, reason to skip or None)."""
    if "&&" in tokens:
        last = _setup_steps(tokens)[-1]
        if last[-3:-1] == ["-m", "pytest"] or last[1:3] == ["-m", "pytest"]:
            return "setup-tests", (
                "the suite's own command: .ci/run runs it on a clean clone (checked below); running it "
                "from inside the suite would recurse"
            )
        return "setup", None
    if tokens[1:3] == ["-m", "pytest"]:
        return "fast-tests", (
            "the fast tier: every test it selects is also in the suite's own command, which runs them all; "
            "running it from inside the suite would run them twice"
        )
    if tokens[0] == "kill":
        return "elastic-kill", None  # run by README's elastic command's test, while that job trains (run_elastic)
    if tokens[0] == "srun":
        return "srun", None  # on the `slurm` fixture's one-machine cluster (conftest.py), skipped where it cannot start
    if tokens[0] == "tfds":
        return "tfds-build", (
            "tfds's own command downloads MNIST, and this machine has no network; README's data=tfds command runs on "
            "a stand-in MNIST that tfds itself prepares in the scratch directory (tests/tfds_tiny.py)"
        )
    if "tensorboard" in tokens:
        return "tensorboard", None  # on the trace of README's train.profile_steps run, with the profile extra's plugin
    if tokens[:3] == ["python", "-m", "runner.dashboard"]:
        return "dashboard", None
    if tokens[:3] == ["python", "-m", "runner.deliver"]:
        return "deliver", None
    if tokens[:3] == ["python", "-m", "runner.compare"]:
        return "compare", None  # on two jobs of README's first sweep
    if tokens[:3] == ["python", "-m", "runner.export"]:
        return "export", None
    if tokens[:3] == ["python", "-m", "runner.kubernetes"]:
        return "kubernetes", None  # the manifests are written and validated against Kubernetes' schemas
    if tokens[0] == "kubectl":
        return "kubectl", (
            "no Kubernetes API server or kubelet can run on these machines; the manifests it applies are validated "
            "against Kubernetes' OpenAPI schemas and the JobSet CRD (tests/unit/test_kubernetes.py), and their pods' "
            "command runs in network namespaces with a pod's environment and host names (tests/e2e/test_netns.py)"
        )
    if tokens[:3] == ["python", "-m", "benchmarks.gpu_scaling"]:
        return "gpu-benchmark", None  # runs: on a machine without GPUs it must refuse clearly
    if tokens[:3] == ["python", "-m", "benchmarks.run"]:
        return "benchmark-run", None
    if tokens[:3] == ["python", "-m", "benchmarks.wall"]:
        return "benchmark-wall", None
    if tokens[:2] == ["python", "-m"] and tokens[2].startswith("benchmarks."):
        return "benchmark-loop", None
    if tokens[:3] == ["mlflow", "models", "serve"]:
        return "serve", None  # serves what README's mlflow.register_as command registered: run after it
    args = _runner_args(tokens)
    if args is None:
        return "unknown", None
    if "-m" in args:
        if any(a.startswith("hydra/launcher=submitit_slurm") for a in args):
            return "submitit", None  # on the tests' real one-machine Slurm cluster (the `slurm` fixture)
        return "sweep", None
    if "--help" in args:
        return "help", None
    if "--cfg" in args:
        return "cfg", None
    if "data=tfrecord" in args:
        return "tfrecord", None  # reads the files README's export command writes: run after it
    if "data=tfds" in args:
        return "tfds", None  # on a stand-in MNIST that tfds prepares (no network), copied to data.data_dir in scratch
    if "data=image_folder" in args:
        return "image-folder", None  # on PNGs of two classes written to data.train_dir in scratch (tests/helpers.py)
    if "strategy=tpu" in args:
        return "tpu", None  # runs: without a TPU README promises an error within seconds
    if "cluster=ray" in args:
        return "ray", None  # starts its own local Ray head, as README says: run on its own (tests/e2e/test_ray.py for the rest)
    if "cluster.elastic.enabled=true" in args:
        return "elastic", None  # a 3-worker job that README's pkill command makes lose worker:1 (run_elastic)
    if "cluster=localhost" in args:
        return ("resume" if any(a.startswith("resume=") for a in args) else "cluster"), None
    if tokens[0].startswith("PYTHONPATH="):
        return "user-config", None
    return "train", None


COMMANDS = readme_commands()


def test_every_readme_command_has_a_test():
    assert len(COMMANDS) >= 25, "README's commands were not found: has its ```bash layout changed?"
    unknown = [key(c) for c in COMMANDS if kind_of(c)[0] == "unknown"]
    assert not unknown, f"README commands with no test in tests/e2e/test_readme.py: {unknown}"


def test_ci_runs_the_readme_setup():
    """The two set-up commands README starts with are what .ci/run does on a clean clone."""
    ci = (ROOT / ".ci" / "run").read_text()
    setups = [c for c in COMMANDS if kind_of(c)[0] in ("setup", "setup-tests")]
    assert len(setups) == 2
    assert "python3.11 -m venv .venv" in ci and '.venv/bin/pip install -q -e ".[test]"' in ci
    tests = _setup_steps(setups[1])
    assert " ".join(tests[-1]) in ci.replace(" -q -e", " -e")  # the same pytest command


# --- running them ----------------------------------------------------------------------------------------------
def _env():
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "TF_CONFIG")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _python(tokens):
    """The command's argv with this interpreter for `python` / `.venv/bin/python`."""
    out = []
    for t in tokens:
        out.append(sys.executable if t in ("python", ".venv/bin/python") else t)
    return out


class Scratch:
    """A working directory with a fresh (initialised) ./mlflow.db, where README's commands run."""

    def __init__(self, root: Path):
        from mlflow import MlflowClient

        self.root = root
        self.uri = f"sqlite:///{root}/mlflow.db"
        MlflowClient(self.uri).search_experiments()
        self.client = MlflowClient(self.uri)
        self.counter = itertools.count()

    def dir(self, label):
        return self.root / "out" / f"{next(self.counter):02d}-{re.sub(r'[^a-z0-9]+', '-', label.lower())[:40]}"

    def run(self, argv, timeout=600, cwd=None, env_extra=None):
        env = _env()
        env.update(env_extra or {})
        started = time.monotonic()
        proc = subprocess.run(argv, cwd=cwd or self.root, env=env, capture_output=True, text=True, timeout=timeout)
        proc.seconds = time.monotonic() - started
        return proc


def _ok(proc):
    # a sweep's failed job said why far above the tails: its error and warning lines come first
    said = "\n".join(line for line in (proc.stdout + proc.stderr).splitlines() if re.search(r"Error|ERROR|WARNING", line))
    assert proc.returncode == 0, f"exit {proc.returncode}\n{said[-4000:]}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


def _run_of(scratch, run_dir):
    run_id = (Path(run_dir) / "mlflow_run_id").read_text().strip()
    return scratch.client.get_run(run_id)


def _overrides(args):
    return [a for a in args if "=" in a and not a.startswith(("-", "hydra"))]


def _override_value(override):
    """An override's value as Hydra parses it (a list of nodes: `[{_target_:x,k:2}]`), as MLflow's param shows it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return OverridesParser.create().parse_override(override).value()
    except Exception:  # noqa: BLE001  (not Hydra's grammar: compared as written)
        return override.split("=", 1)[1]


def check_training(scratch, args, result):
    """What README says a run does: exit 0, Hydra's output directory, one FINISHED MLflow run with the config as
    params, the documented metrics and artifacts; N replicas of logical CPUs for mirrored / central_storage."""
    proc, run_dir = result
    _ok(proc)
    for name in (".hydra/config.yaml", "runner.log", "model.keras"):
        assert (run_dir / name).exists(), f"{name} missing in {run_dir}"
    run = _run_of(scratch, run_dir)
    assert run.info.status == "FINISHED"
    params, metrics = run.data.params, run.data.metrics
    for override in _overrides(args):
        k, v = override.split("=", 1)
        if k in GROUPS:
            if k != "experiment" and f"{k}.name" in params:
                assert params[f"{k}.name"] == v, (k, params[f"{k}.name"], v)
        elif k in params and k not in {t.split("=", 1)[0] for t in TINY}:  # TINY's keys: the test's, not README's
            assert params[k] in (v, str(yaml.safe_load(v)), str(_override_value(override))), (k, params[k], v)
    for metric in ("loss", "throughput/window_examples_per_sec", "time/train_sec", "eval/loss", "loss/replica_0"):
        assert metric in metrics, f"{metric} not logged; have {sorted(metrics)}"
    data = params["data.name"]
    if data != "function":  # every built-in source is an MLflow dataset of the run, train and eval
        assert {i.dataset.name for i in run.inputs.dataset_inputs} == {f"{data}-train", f"{data}-eval"}, run.inputs
    replicas = int(run.data.tags["num_replicas_in_sync"])
    if not {"strategy", "experiment"} & {o.split("=", 1)[0] for o in _overrides(args)}:  # strategy=auto chose, and says so
        assert run.data.tags["strategy.auto"].startswith(params["strategy.name"] + ": "), run.data.tags
    if params["strategy.name"] in ("mirrored", "central_storage"):
        assert replicas == int(params["devices.logical_cpus"])
    assert f"loss/replica_{replicas - 1}" in metrics and f"loss/replica_{replicas}" not in metrics
    if any(a.startswith("train.optimizer.schedule.") for a in args):  # a scheduled rate is logged at each log point
        assert "train/learning_rate" in metrics, sorted(metrics)
    if "checkpoint.keep_best=true" in args:  # evaluated after its epoch, the best kept and named
        assert {"best/eval/loss", "best/step"} <= set(metrics) and list((run_dir / "checkpoints" / "best").glob("*.index"))
    for k in [a.split("=", 1)[1] for a in args if a.startswith("train.accumulation_steps=")]:  # said where it trains
        assert f", {k} micro-batches per update" in (run_dir / "runner.log").read_text()
    artifacts = {a.path for a in scratch.client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "overrides.txt", "model"} <= artifacts, artifacts
    if any(a.startswith("train.profile_steps=") for a in args):  # within TINY's two steps: a trace, logged
        assert "profile" in artifacts and list(run_dir.glob("profile/plugins/profile/*/*.xplane.pb")), artifacts


def run_training(scratch, tokens):
    args = _runner_args(tokens)
    run_dir = scratch.dir(key(args) or "default")
    proc = scratch.run([*_python(tokens), *TINY, f"hydra.run.dir={run_dir}"])
    return proc, run_dir


def run_user_config(scratch, tokens):
    """README's own-code commands as printed from the clone's root (PYTHONPATH=tests/user_project, a searchpath
    there): run in a scratch directory that holds tests/user_project as the clone does; README's YAML block is that
    folder's file."""
    text = doc_text()
    block = re.search(r"```yaml\n# (tests/user_project/\S+)\n(.*?)```", text, re.S)
    assert block, "README's tests/user_project/ YAML example not found"
    shown = [line for line in block.group(2).splitlines() if not line.startswith("#")]
    assert shown == [line for line in (ROOT / block.group(1)).read_text().splitlines() if not line.startswith("#")]
    project = scratch.root / "user-project"
    (project / "tests").mkdir(parents=True, exist_ok=True)
    if not (project / "tests" / "user_project").exists():
        (project / "tests" / "user_project").symlink_to(ROOT / "tests" / "user_project")
    env = dict(t.split("=", 1) for t in tokens if re.match(r"^[A-Z_]+=", t))
    argv = [t for t in tokens if not re.match(r"^[A-Z_]+=", t)]
    run_dir = scratch.dir(key(_runner_args(argv)))
    proc = scratch.run(
        [*_python(argv), *TINY, f"hydra.run.dir={run_dir}", f"mlflow.tracking_uri={scratch.uri}"], cwd=project, env_extra=env
    )
    return proc, run_dir


def run_cluster(scratch, tokens):
    """The run as it ended, read at once: README's resume command continues the same run (and marks it RUNNING
    again) as soon as this one is done, possibly before check_cluster reads it."""
    args = _runner_args(tokens)
    run_dir = scratch.dir(key(args))
    proc = scratch.run([*_python(tokens), *TINY, f"hydra.run.dir={run_dir}"], timeout=300)
    ended = _run_of(scratch, run_dir) if (Path(run_dir) / "mlflow_run_id").exists() else None
    return proc, run_dir, ended


def check_cluster(scratch, args, result):
    proc, run_dir, run = result
    _ok(proc)
    assert run.info.status == "FINISHED"
    tasks = run.data.tags["cluster.tasks"].split(",")
    opts = dict(a.split("=", 1) for a in _overrides(args))
    workers, ps = int(opts.get("cluster.workers", 2)), int(opts.get("cluster.ps", 0))
    assert sum(t.startswith("worker:") for t in tasks) == workers and sum(t.startswith("ps:") for t in tasks) == ps
    metrics = run.data.metrics
    assert "loss" in metrics and "loss/replica_0" in metrics, sorted(metrics)
    if opts["strategy"] == "multi_worker_mirrored":  # every replica of the cluster, logged by worker 0
        assert {f"loss/replica_{i}" for i in range(workers)} <= set(metrics)
        assert any(f"[worker:{i}]" in proc.stdout for i in range(workers))
    if opts["strategy"] == "parameter_server" and opts.get("executor") == "custom_loop":
        assert {f"steps/worker_{i}" for i in range(workers)} <= set(metrics), sorted(metrics)
    if opts.get("cluster.evaluator") == "true":
        assert any(m.startswith("sidecar/eval_") for m in metrics), sorted(metrics)
    for i in range(workers):
        assert (run_dir / f"worker-{i}" / "runner.log").exists()


def run_elastic(scratch, tokens):
    """README's elastic command, and while it trains (past its first checkpoint) README's kill command, with the pid
    the job's "started worker:1 (pid PID)" line gives; then one uninterrupted process of the same training, whose
    weights the job must reach."""
    args = _runner_args(tokens)
    run_dir = scratch.dir(key(args))
    log_path = scratch.root / f"{run_dir.name}.out"
    with open(log_path, "w") as out:
        job = subprocess.Popen(
            [*_python(tokens), *ELASTIC, "cluster.elastic.rejoin_after_sec=0", f"hydra.run.dir={run_dir}"],
            cwd=scratch.root,
            env=_env(),
            stdout=out,
            stderr=out,
        )
        deadline = time.monotonic() + 300
        while not re.search(r"\[worker:0\].* epoch 2/12 step (8|12)/16", log_path.read_text()):
            assert job.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.5)
        kill = TOKENS[next(k for k, (kind, _) in KINDS.items() if kind == "elastic-kill")]
        pid = re.search(r"started worker:1 \(pid (\d+)\)", log_path.read_text()).group(1)
        killed = subprocess.run([t.replace("PID", pid) for t in kill], capture_output=True, text=True, timeout=30)
        job.wait(timeout=300)
    proc = subprocess.CompletedProcess(job.args, job.returncode, log_path.read_text(), "")
    same = [a for a in args if a.startswith(("executor=", "model", "data", "train."))]  # README's training, not its cluster
    reference = scratch.run(
        [sys.executable, "-m", "runner", "strategy=default", *same, *ELASTIC, f"hydra.run.dir={run_dir}-reference"]
    )
    return proc, run_dir, killed, reference


def check_elastic(scratch, args, result):
    import tf_keras

    proc, run_dir, killed, reference = result
    _ok(proc)
    _ok(reference)
    assert killed.returncode == 0, killed  # worker:1's process, by the pid the job gave
    assert "cluster.elastic: lost worker:1: killed by SIGKILL" in proc.stdout, proc.stdout[-3000:]
    assert "training again on 3 worker(s)" in proc.stdout, proc.stdout[-3000:]  # and grew back
    run = _run_of(scratch, run_dir)
    assert run.info.status == "FINISHED"
    sizes = scratch.client.get_metric_history(run.info.run_id, "cluster/world_size")
    assert [m.value for m in sorted(sizes, key=lambda m: m.timestamp)] == [3, 2, 3]
    assert not {"error", "stopped_by"} & set(run.data.tags)  # the generations stopped for a resize do not mark the run
    steps = [m.step for m in scratch.client.get_metric_history(run.info.run_id, "loss")]
    assert sorted(steps) == sorted(set(steps)), steps  # the steps a smaller job redid are not logged twice
    single = tf_keras.models.load_model(Path(f"{run_dir}-reference") / "model.keras", compile=False).get_weights()
    got = tf_keras.models.load_model(run_dir / "worker-0" / "model.keras", compile=False).get_weights()
    for a, b in zip(got, single, strict=True):  # the global batches were the same at every size
        assert np.max(np.abs(a - b)) <= 1e-5 * np.max(np.abs(b)), np.max(np.abs(a - b))


def check_elastic_kill(scratch, args, result):
    proc, run_dir, killed, _ = result
    assert killed.returncode == 0 and "lost worker:1: killed by SIGKILL" in proc.stdout, proc.stdout[-3000:]


def run_resume(scratch, tokens, results):
    """resume=<the dir of README's cluster run of the same strategy>, for one more epoch: the same MLflow run
    goes on from the checkpoint's step."""
    args = _runner_args(tokens)
    strategy = next(a for a in args if a.startswith("strategy="))
    earlier = next(k for k, (kind, _) in KINDS.items() if kind == "cluster" and strategy in k.split())
    _, run_dir, before = results(earlier)
    argv = [re.sub(r"^resume=.*", f"resume={run_dir}", t) for t in _python(tokens)]
    proc = scratch.run([*argv, "train.epochs=2", "train.steps_per_epoch=2"], timeout=300)
    return proc, run_dir, before


def check_resume(scratch, args, result):
    proc, run_dir, before = result
    _ok(proc)
    run = _run_of(scratch, run_dir)
    assert run.info.run_id == before.info.run_id, "resume= must continue the same MLflow run"
    assert run.info.status == "FINISHED"
    steps = [m.step for m in scratch.client.get_metric_history(run.info.run_id, "loss")]
    assert max(steps) == 4 and len(steps) == len(set(steps)), f"steps logged: {steps}"


def run_sweep(scratch, tokens):
    """The sweep into a scratch directory; one that names its hydra.sweep.dir (a search README says goes on when run
    again) runs twice, the second run as `proc.again`."""
    sweep_dir = scratch.dir("sweep-" + key(_runner_args(tokens)))
    given = [t for t in tokens if t.startswith("hydra.sweep.dir=")]
    argv = [*_python([t for t in tokens if t not in given]), *TINY, f"hydra.sweep.dir={sweep_dir}"]
    proc = scratch.run(argv, timeout=900)
    if given:
        proc.again = scratch.run(argv, timeout=300)
    return proc, sweep_dir


def _presets(args):
    return [
        yaml.safe_load((ROOT / "conf" / "experiment" / f"{a.split('=', 1)[1]}.yaml").read_text())
        for a in args
        if a.startswith("experiment=")
    ]


def expected_jobs(args):
    """A sampling sweeper's n_trials (the command's, else its preset's), else the size of the grid."""
    trials = [int(a.split("=", 1)[1]) for a in args if a.startswith("hydra.sweeper.n_trials=")]
    trials += [p["hydra"]["sweeper"]["n_trials"] for p in _presets(args) if "n_trials" in p["hydra"]["sweeper"]]
    if trials:
        return trials[0]
    lists = [a.split("=", 1)[1].split(",") for a in args if "=" in a and not a.startswith("hydra")]
    for preset in _presets(args):
        lists += [str(v).split(",") for v in preset["hydra"]["sweeper"]["params"].values()]
    return len(list(itertools.product(*lists)))


def check_search(sweep_dir, parent, children):
    """An Optuna search: each trial's objective is its own run's final eval/loss (from the job's process), the
    report ranks them best first, and the parent run and the best child are tagged."""
    losses = {c.info.run_id: c.data.metrics["eval/loss"] for c in children}
    best = min(losses, key=losses.get)
    assert parent.data.tags["sweep.best_run_id"] == best and parent.data.tags["sweep.objective"] == "eval/loss"
    assert float(parent.data.tags["sweep.best_value"]) == losses[best]
    assert [c.data.tags.get("sweep.best") for c in children if c.info.run_id == best] == ["true"]
    with open(sweep_dir / "report.csv") as f:
        ranked = [float(row["eval_loss"]) for row in csv.DictReader(f)]
    assert ranked == sorted(losses.values())
    optuna = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert optuna["best_value"] == pytest.approx(losses[best], rel=1e-6)  # what the job returned to Optuna
    importances = json.loads((sweep_dir / "importances.json").read_text())["importances"]  # fANOVA, per searched key
    assert set(importances) <= set(optuna["best_params"]) and abs(sum(importances.values()) - 1) < 1e-6
    assert (sweep_dir / "optuna_history.png").exists() and (sweep_dir / "optuna_parallel_coordinate.png").exists()


def check_sweep(scratch, args, result):
    proc, sweep_dir = result
    _ok(proc)
    parents = scratch.client.search_runs(
        [e.experiment_id for e in scratch.client.search_experiments()],
        filter_string=f"tags.`sweep.dir` = '{os.path.abspath(sweep_dir)}'",
    )
    assert len(parents) == 1, f"one parent run per sweep, found {len(parents)}"  # no job became a sweep of its own
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    children = scratch.client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
    )
    assert len(children) == expected_jobs(args) == int(parent.data.tags["sweep.jobs"])
    assert all(c.info.status == "FINISHED" for c in children)
    search = "sweep.best_run_id" in parent.data.tags
    for name in ("report.csv", "report.md", "throughput.png", "loss_curves.png"):
        assert (sweep_dir / name).exists(), f"{name} missing in {sweep_dir}"
    if any(a.startswith("sweep.parallel=") for a in args):  # side by side, each on CPUs of its own, devices per job
        records = [json.loads(p.read_text()) for p in sorted((sweep_dir / ".runner").glob("job-*.json"))]
        assert records[1]["started"] < records[0]["ended"] and records[0]["started"] < records[1]["ended"], records
        assert records[0]["cpus"] != records[1]["cpus"], records
        assert "2 side by side" in proc.stdout + proc.stderr
        by_job = sorted(children, key=lambda c: int(c.data.tags["sweep.job_num"]))
        assert [c.data.tags["num_replicas_in_sync"] for c in by_job] == ["1", "2"]  # one_device, mirrored over 2
    speeds = {c.data.tags["sweep.job_num"]: c.data.metrics["summary/examples_per_sec"] for c in children}
    if len(speeds) > 1:  # the parent names its fastest job (a strategy sweep's answer)
        assert parent.data.tags["sweep.fastest_job"] == max(speeds, key=speeds.get)
    if search:
        check_search(sweep_dir, parent, children)
    elif any(c.data.tags.get("num_replicas_in_sync") == "1" for c in children):  # a baseline to scale against
        assert (sweep_dir / "scaling_efficiency.png").exists(), "scaling_efficiency.png missing"
    if getattr(proc, "again", None) is not None:  # the same search again: it goes on (nothing left: no new trial)
        _ok(proc.again)
        again = proc.again.stdout + proc.again.stderr
        assert "continuing the study" in again and "[#" not in again, again[-2000:]  # no job ran again
    assert not (scratch.root / "multirun").exists(), "a job started a sweep of its own"
    said = proc.stdout
    if any(a.startswith("hydra/launcher=submitit") for a in args):  # the jobs' own lines are in submitit's logs
        said = "".join(p.read_text() for p in sorted(sweep_dir.glob(".submitit/*/*_0_log.out")))
        assert not any("job #" in p.read_text() for p in sweep_dir.glob(".submitit/*/*_1_log.out"))  # task 0 speaks
    assert f"job #{len(children) - 1} ({len(children)} of {len(children)})" in said


def run_cfg(scratch, tokens):
    return scratch.run(_python(tokens), timeout=60)


def check_cfg(scratch, args, proc):
    _ok(proc)
    composed = yaml.safe_load(proc.stdout)
    for override in _overrides(args):
        k, v = override.split("=", 1)
        assert composed[k]["name"] == v if k in GROUPS else True
    assert proc.seconds < 10  # no TensorFlow import (its import alone is ~4 s)


def check_help(scratch, args, proc):
    _ok(proc)
    for group in GROUPS - {"schema"}:
        assert group in proc.stdout, f"--help does not mention the {group} group"


def check_tpu(scratch, args, proc):
    """README: without a TPU the runner stops in seconds, with an error saying what to use instead."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    error = proc.stderr[proc.stderr.index("Error:") :]
    assert "cluster.tpu" in error and "strategy=mirrored" in error
    assert proc.seconds < 60


def run_tpu(scratch, tokens):
    proc = scratch.run([*_python(tokens), f"hydra.run.dir={scratch.dir('tpu')}"], timeout=120)
    return proc


def run_dashboard(scratch, tokens):
    """Start it on a free port (README's --port), read the address it prints, load the page, stop it with Ctrl-C."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [*_python(tokens), "--port", str(port)],
        cwd=scratch.root,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        line, deadline = "", time.monotonic() + 90
        while "http://" not in line and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
        url = re.search(r"http://\S+", line).group(0) if "http://" in line else None
        page = None
        if url:
            for _ in range(60):
                try:
                    with urllib.request.urlopen(url, timeout=5) as r:
                        page = r.status
                        break
                except OSError:
                    time.sleep(0.5)
        return url, page, str(scratch.root / "mlflow.db")
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError("the dashboard did not stop on Ctrl-C") from None


def check_dashboard(scratch, args, result):
    url, page, _ = result
    assert url and "workflowType=machine_learning" in url, url
    assert page == 200


def run_deliver(scratch, tokens, results):
    """README's deliver command on the output directory of README's first run (nothing left to deliver)."""
    default = next(k for k, (kind, _) in KINDS.items() if kind == "train")
    _, run_dir = results(default)
    argv = [*_python(tokens[:3]), str(run_dir), *tokens[4:]]
    return scratch.run(argv, timeout=120)


def check_deliver(scratch, args, proc):
    _ok(proc)


def run_compare(scratch, tokens, results):
    """README's compare command on jobs 0 and 1 of README's first sweep (one_device with fit, then custom_loop)."""
    _, sweep_dir = results(GRID)
    return scratch.run([*_python(tokens[:3]), str(sweep_dir / "0"), str(sweep_dir / "1")], timeout=120)


def check_compare(scratch, args, proc):
    _ok(proc)
    lines = proc.stdout.splitlines()
    differ = lines[: next(i for i, line in enumerate(lines) if line.startswith("("))]
    assert any(line.split()[0] == "executor.name" for line in differ[1:]), proc.stdout  # what differs, and only that
    assert not any(line.split()[0] == "strategy.name" for line in differ[1:]), proc.stdout
    assert any(line.startswith("eval/loss ") for line in lines), proc.stdout


def run_export(scratch, tokens):
    return scratch.run(_python(tokens), timeout=300)


def check_export(scratch, args, proc):
    _ok(proc)
    out = Path(scratch.root) / args[args.index("--out") + 1]
    assert (out / "tfrecord.json").exists() and len(list(out.glob("train-*.tfrecord"))) == int(args[args.index("--shards") + 1])


def check_kubernetes(scratch, args, proc):
    """The manifests README's command wrote: valid for Kubernetes (and JobSet), with the command's overrides in the
    pods' command."""
    import yaml

    _ok(proc)
    documents = [d for d in yaml.safe_load_all((Path(scratch.root) / args[args.index("--out") + 1]).read_text()) if d]
    for document in documents:
        validate_manifest(document)
    assert all(o in json.dumps(documents) for o in args[3:] if "=" in o and not o.startswith("cluster.")), args


def run_tfrecord(scratch, tokens, results):
    """A data=tfrecord command, on the files README's export command wrote in the same working directory."""
    exported = next(k for k, (kind, _) in KINDS.items() if kind == "export")
    _ok(results(exported))
    return (run_cluster if "cluster=localhost" in tokens else run_training)(scratch, tokens)


def check_tfrecord(scratch, args, result):
    (check_cluster if "cluster=localhost" in args else check_training)(scratch, args, result)


def _data_value(tokens, key):
    return next(t.split("=", 1)[1] for t in tokens if t.startswith(f"{key}="))


def run_tfds(scratch, tokens):
    """A data=tfds command, with the session's stand-in MNIST (built by tfds, tests/tfds_tiny.py) in its data_dir."""
    shutil.copytree(scratch.tfds_dir, scratch.root / _data_value(tokens, "data.data_dir"))
    return run_training(scratch, tokens)


def run_image_folder(scratch, tokens):
    """A data=image_folder command, on 2 classes of small PNGs written to its data.train_dir, and one BMP (which
    tf.io.decode_image alone refuses to decode as grayscale)."""
    folder = write_image_folder(scratch.root / _data_value(tokens, "data.train_dir"), per_class=12)
    write_bmp(folder / "square" / "extra.bmp", [[30] * 12 + [230] * 12] * 8)
    return run_training(scratch, tokens)


def run_benchmark(scratch, tokens):
    out = scratch.dir("bench") / "benchmarks.md"
    out.parent.mkdir(parents=True)
    if tokens[2] == "benchmarks.run":
        extra = ["--quick", f"--out={out}", f"--tracking-uri={scratch.uri}"]
    elif tokens[2] == "benchmarks.wall":
        extra = ["--quick"]
    elif tokens[2] == "benchmarks.limit":
        extra = ["--quick", "--models=host"]  # three processes: the runner's two executors and the tight loop
    else:
        extra = ["--rounds=1", "--calls=2"]
    proc = scratch.run([*_python(tokens), *extra], cwd=ROOT, timeout=900)
    return proc, out


# README's in-process benchmarks (benchmark-loop): the ways each times a step, in the order it prints them
IN_PROCESS_WAYS = {
    "benchmarks.paired": ["guide", "stacked", "written"],
    "benchmarks.call_overhead": ["tf.function", "concrete function", "runner (concrete_per_iterator)"],
}


def check_benchmark(scratch, args, result):
    proc, out = result
    _ok(proc)
    if "benchmarks.run" in args:
        text = out.read_text()
        sections = ["Runner vs hand-written"]
        if "--sections" not in args:  # the whole run: every section, and its figures in MLflow
            sections += [
                "MLflow logging on vs off",
                "Steps per tf.function call",
                "Input pipeline",
                "`python -m runner --cfg job`",
                "Machine:",
            ]
            runs = scratch.client.search_runs([scratch.client.get_experiment_by_name("benchmarks").experiment_id])
            assert any(
                r.data.metrics.get("ratio/default/fit", 0) > 0 and r.data.metrics.get("wall/cfg_job_sec", 0) > 0 for r in runs
            )
        for section in sections:
            assert section in text, f"{section!r} missing from {out}"
        if "--strategies" in args:
            chosen = args[args.index("--strategies") + 1]
            assert f"| {chosen}" in text or chosen in text
    else:
        assert sum(line.startswith("| ") for line in proc.stdout.splitlines()) >= 3, proc.stdout[-2000:]
        if "benchmarks.wall" in args:  # the sweep row (--quick: a 1-job sweep against its job typed alone)
            assert "speed, sweep / one by one" in proc.stdout, proc.stdout[-2000:]
            assert re.search(r"^\| 1 \| [0-9.]+ \|", proc.stdout, re.M), proc.stdout[-2000:]
        module = args[args.index("-m") + 1]
        if module in IN_PROCESS_WAYS:  # one row per way of timing, in order; the first is the reference
            rows = [line.strip("| ").split(" | ") for line in proc.stdout.splitlines() if line.startswith("| ")][1:]
            assert [row[0] for row in rows] == IN_PROCESS_WAYS[module], proc.stdout[-2000:]
            assert float(rows[0][2]) == 1.0  # the reference against itself


def check_gpu_benchmark(scratch, args, proc):
    """On a machine without GPUs it refuses, saying what to run instead."""
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "needs NVIDIA GPUs" in proc.stderr and "benchmarks.run" in proc.stderr


def run_serve(scratch, tokens, results):
    """README's serve command (on a free port) after README's register command: one request, then the server's
    process group stopped."""
    register = next(k for k, (kind, _) in KINDS.items() if kind == "train" and "mlflow.register_as=" in k)
    _, run_dir = results(register)
    params = _run_of(scratch, run_dir).data.params
    argv = [sys.executable, "-m", "mlflow", *tokens[1:]]
    argv[argv.index("-p") + 1] = str(free_port())
    env = {**_env(), "MLFLOW_TRACKING_URI": scratch.uri}
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])  # uvicorn, as in an activated venv
    rows = [[0.5] * int(params["data.num_features"])] * 2
    log_dir = scratch.dir("serve")
    log_dir.mkdir(parents=True)
    answer, left = serve_and_predict(argv, scratch.root, env, rows, log_dir / "serve.log")
    return answer, left, int(params["data.num_classes"])


def check_serve(scratch, args, result):
    answer, left, classes = result
    assert len(answer["predictions"]) == 2 and len(answer["predictions"][0]) == classes, answer
    assert not left, f"mlflow models serve left processes behind: {left}"


def _profiled_run(scratch, request):
    """README's train.profile_steps run: the suite's own (from `results`) when its test is selected too, else that
    command alone, here (`-k tensorboard` then runs one training run, not all of README's commands)."""
    profiled = next(k for k, (kind, _) in KINDS.items() if kind == "train" and "train.profile_steps=" in k)
    selected = {getattr(item, "callspec", None) and item.callspec.params.get("command") for item in request.session.items}
    if profiled in selected:
        _, result = request.getfixturevalue("results")
        return result(profiled)
    return run_training(scratch, TOKENS[profiled])


def _get_json(url):
    """GET url as JSON; the profile plugin gzips its answers whatever the request accepts."""
    with urllib.request.urlopen(url, timeout=30) as r:
        body = r.read()
        return json.loads(gzip.decompress(body) if r.headers.get("Content-Encoding") == "gzip" else body)


def run_tensorboard(scratch, tokens, profiled):
    """README's tensorboard command, its --logdir the profile directory of README's profiled run, on a free port of
    127.0.0.1: wait until it answers, ask it what the Profile tab shows (the plugin's own routes: runs, run_tools,
    hosts, data), then Ctrl-C its process group. A variable only its processes carry finds any that outlive it."""
    proc, run_dir = profiled
    _ok(proc)
    logdir = run_dir / "profile"
    sessions = sorted(p.name for p in logdir.glob("plugins/profile/*") if p.is_dir())
    argv = [str(Path(sys.executable).parent / "tensorboard"), *tokens[1:]]  # the venv's, as an activated venv finds it
    argv[argv.index("--logdir") + 1] = str(logdir)
    port = free_port()
    argv += ["--host", "127.0.0.1", "--port", str(port)]
    mark = f"RUNNER_README_TENSORBOARD_{os.getpid()}"
    log_path = scratch.dir("tensorboard").with_suffix(".log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    found = {"sessions": sessions, "argv": argv}
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            argv,
            cwd=scratch.root,
            env={**_env(), mark: "1"},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # Ctrl-C as a terminal delivers it: a suite started in the background (`cmd &` without job control)
            # ignores SIGINT, every child inherits that, and TensorBoard then never hears the test's Ctrl-C
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120  # it imports TensorFlow first: seconds, more on a busy machine
        while "plugins" not in found:
            assert server.poll() is None, f"tensorboard exited {server.returncode}:\n{log_path.read_text()[-3000:]}"
            try:
                found["plugins"] = _get_json(f"{base}/data/plugins_listing")
            except OSError:
                assert time.monotonic() < deadline, f"tensorboard did not answer in 120 s:\n{log_path.read_text()[-3000:]}"
                time.sleep(0.5)
        if found["plugins"].get("profile", {}).get("enabled"):
            plugin = f"{base}/data/plugin/profile"
            found["runs"] = _get_json(f"{plugin}/runs")
            for run in found["runs"]:
                tools = _get_json(f"{plugin}/run_tools?run={run}")
                trace = next((t for t in tools if t.startswith("trace_viewer")), None)
                hosts = [h["hostname"] for h in _get_json(f"{plugin}/hosts?run={run}&tag={trace}")] if trace else []
                events = _get_json(f"{plugin}/data?run={run}&tag={trace}&host={hosts[0]}")["traceEvents"] if hosts else []
                found.setdefault("tools", {})[run] = tools
                found.setdefault("events", {})[run] = events
    finally:
        os.killpg(server.pid, signal.SIGINT)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            found["stuck"] = _threads(live_group_members(server.pid))  # what each thread waits in, for the message
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
            found["ctrl_c"] = False
        deadline = time.monotonic() + 15
        while (live_group_members(server.pid) or _processes_with(mark)) and time.monotonic() < deadline:
            time.sleep(0.2)
        found["left"] = sorted(set(live_group_members(server.pid)) | set(_processes_with(mark)))
    found["log"] = log_path.read_text()[-3000:]
    return found


def check_tensorboard(scratch, args, found):
    """TensorBoard's Profile tab is there, active, and shows the profiled run's trace: its one profiler session as
    the plugin's run, a trace viewer for it with the steps' events; Ctrl-C stops the server and its data server."""
    assert len(found["sessions"]) == 1, found["sessions"]
    profile = found["plugins"].get("profile")
    assert profile, f'no profile plugin in TensorBoard (pip install -e ".[profile]"): {sorted(found["plugins"])}'
    assert profile["enabled"], f"the profile plugin found no trace in {found['argv']}:\n{found['log']}"
    assert found["runs"] == found["sessions"], (found["runs"], found["sessions"])
    (run,) = found["runs"]
    assert any(t.startswith("trace_viewer") for t in found["tools"][run]), found["tools"][run]
    spans = [e for e in found["events"][run] if e.get("ph") == "X"]  # complete events: the ops the traced steps ran
    assert spans, found["events"][run][:20]
    assert found.get("ctrl_c", True), f"tensorboard did not stop on Ctrl-C: {found.get('stuck')}\n{found['log']}"
    assert not found["left"], f"tensorboard's processes outlived it: {found['left']}"


def run_setup(scratch, tokens, results):
    """README's set-up command ends with the default experiment (`.venv/bin/python -m runner`), the same run as README's
    own `python -m runner`: it runs once for both. (The venv its first steps make is .ci/run's, checked above.)"""
    last = _setup_steps(tokens)[-1]
    same = [k for k, (kind, _) in KINDS.items() if kind == "train" and _runner_args(TOKENS[k]) == _runner_args(last)]
    return results(same[0]) if same else run_training(scratch, last)


RUNNERS = {
    "train": run_training,
    "user-config": run_user_config,
    "cluster": run_cluster,
    "sweep": run_sweep,
    "cfg": run_cfg,
    "help": run_cfg,
    "tpu": run_tpu,
    "dashboard": run_dashboard,
    "benchmark-run": run_benchmark,
    "benchmark-loop": run_benchmark,
    "benchmark-wall": run_benchmark,
    "gpu-benchmark": lambda s, t: s.run(_python(t), cwd=ROOT, timeout=120),
    "export": run_export,
    "kubernetes": run_export,
    "tfds": run_tfds,
    "image-folder": run_image_folder,
    "elastic": run_elastic,
}


def run_srun(scratch, tokens, slurm):
    """README's srun command on the one-machine Slurm cluster of the `slurm` fixture. Two changes, both said here:
    its one node takes the two tasks (`--nodes=2 --ntasks-per-node=1` -> `--nodes=1 --ntasks-per-node=2`), and
    `cluster.port_base` is a free port (README's default, 8888, may be taken on a shared machine)."""
    from slurm_cluster import free_port_run

    argv = _python(tokens)
    argv = [{"--nodes=2": "--nodes=1", "--ntasks-per-node=1": "--ntasks-per-node=2"}.get(t, t) for t in argv]
    run_dir = scratch.dir("srun")
    env = {k: v for k, v in slurm.env.items() if k not in ("MLFLOW_TRACKING_URI", "TF_CONFIG")}
    env.update(PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    extra = [*TINY, f"cluster.port_base={free_port_run(2)}", f"hydra.run.dir={run_dir}"]
    started = time.monotonic()
    proc = subprocess.run([*argv, *extra], cwd=scratch.root, env=env, capture_output=True, text=True, timeout=300)
    proc.seconds = time.monotonic() - started
    return proc, run_dir


def run_submitit(scratch, tokens, slurm):
    """README's submitit sweep on the one-machine Slurm cluster: its one node takes each job's two tasks
    (`nodes=2 tasks_per_node=1` -> `nodes=1 tasks_per_node=2`); ports from a free run, four: the two jobs run at once
    as a Slurm array, each on its own two ports (runner/sweeps/sweep.py)."""
    from slurm_cluster import free_port_run

    swap = {
        "hydra.launcher.nodes=2": "hydra.launcher.nodes=1",
        "hydra.launcher.tasks_per_node=1": "hydra.launcher.tasks_per_node=2",
    }
    argv = [swap.get(t, t) for t in _python(tokens)]
    sweep_dir = scratch.dir("submitit")
    env = {k: v for k, v in slurm.env.items() if k not in ("MLFLOW_TRACKING_URI", "TF_CONFIG")}
    env.update(
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
        MLFLOW_TRACKING_URI=scratch.uri,  # the jobs run in Slurm's environment, which is this one
    )
    extra = [*TINY, f"cluster.port_base={free_port_run(4)}", f"hydra.sweep.dir={sweep_dir}"]
    proc = subprocess.run([*argv, *extra], cwd=scratch.root, env=env, capture_output=True, text=True, timeout=600)
    return proc, sweep_dir


def check_submitit(scratch, args, result):
    """A sweep like any other (one parent run, a FINISHED child run per job, the report), each job a
    MultiWorkerMirroredStrategy of the two Slurm tasks submitit started; submitit's sacct noise said once."""
    proc, sweep_dir = result
    check_sweep(scratch, args, result)
    client = scratch.client
    (parent,) = client.search_runs(
        [e.experiment_id for e in client.search_experiments()], filter_string=f"tags.`sweep.dir` = '{sweep_dir}'"
    )
    children = client.search_runs([parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert {c.data.tags["cluster.name"] for c in children} == {"slurm"}
    assert {c.data.tags["num_replicas_in_sync"] for c in children} == {"2"}
    assert sorted(c.data.tags["executor"] for c in children) == ["custom_loop", "fit"]
    assert "Bypassing sacct error" not in proc.stdout + proc.stderr


def check_srun(scratch, args, result):
    """Both Slurm tasks joined one MultiWorkerMirroredStrategy: one FINISHED run with 2 replicas' losses."""
    proc, run_dir = result
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    run = _run_of(scratch, run_dir)
    assert run.info.status == "FINISHED" and run.data.tags["cluster.name"] == "slurm"
    assert run.data.tags["num_workers"] == "2" and run.data.tags["num_replicas_in_sync"] == "2"
    assert {"loss/replica_0", "loss/replica_1"} <= set(run.data.metrics)


def run_ray(scratch, tokens):
    """README's cluster=ray command as written (no cluster.address: the runner starts a local Ray head and must shut it
    down). A variable only this run's processes carry finds any of them (Ray's included) that outlive it."""
    args = _runner_args(tokens)
    run_dir = scratch.dir(key(args))
    mark = f"RUNNER_README_RAY_{os.getpid()}"
    proc = scratch.run([*_python(tokens), *TINY, f"hydra.run.dir={run_dir}"], timeout=300, env_extra={mark: "1"})
    deadline = time.monotonic() + 15
    while _processes_with(mark) and time.monotonic() < deadline:
        time.sleep(0.5)
    proc.left = _processes_with(mark)
    return proc, run_dir


def _threads(pids) -> dict:
    """pid -> [(thread name, the kernel function it waits in)]: where a process that does not exit is."""

    def read(path):
        try:
            with open(path) as f:
                return f.read().strip()
        except OSError:
            return "?"

    stacks = {}
    for pid in pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:  # gone meanwhile
            continue
        stacks[pid] = [(read(f"/proc/{pid}/task/{t}/comm"), read(f"/proc/{pid}/task/{t}/wchan")) for t in tasks]
    return stacks


def _processes_with(variable):
    return processes_with(variable)


def check_ray(scratch, args, result):
    """One FINISHED run whose two Ray-actor tasks trained every replica; the local Ray head is gone with the run."""
    proc, run_dir = result
    _ok(proc)
    assert not proc.left, f"processes of the run (the Ray head's, or tasks) outlived it: {proc.left}"
    run = _run_of(scratch, run_dir)
    assert run.info.status == "FINISHED" and run.data.tags["cluster.name"] == "ray"
    assert run.data.tags["cluster.tasks"] == "worker:0,worker:1" and run.data.tags["num_replicas_in_sync"] == "2"
    assert {"loss/replica_0", "loss/replica_1"} <= set(run.data.metrics)
    assert "[worker:0] " in proc.stdout and "[worker:1] " in proc.stdout and "a local head started for this run" in proc.stdout
    for i in range(2):
        assert (run_dir / f"worker-{i}" / "runner.log").exists()


DEPENDENT = {
    "elastic-kill": lambda scratch, tokens, results: results(next(k for k, (kind, _) in KINDS.items() if kind == "elastic")),
    "resume": run_resume,
    "deliver": run_deliver,
    "compare": run_compare,
    "tfrecord": run_tfrecord,
    "serve": run_serve,
    "setup": run_setup,
}
CHECKS = {
    "setup": lambda s, a, r: check_training(s, _runner_args(_setup_steps(a)[-1]), r),
    "train": check_training,
    "user-config": check_training,
    "cluster": check_cluster,
    "resume": check_resume,
    "sweep": check_sweep,
    "cfg": check_cfg,
    "help": check_help,
    "tpu": check_tpu,
    "dashboard": check_dashboard,
    "deliver": check_deliver,
    "compare": check_compare,
    "benchmark-run": check_benchmark,
    "benchmark-loop": check_benchmark,
    "benchmark-wall": check_benchmark,
    "gpu-benchmark": check_gpu_benchmark,
    "export": check_export,
    "kubernetes": check_kubernetes,
    "tfrecord": check_tfrecord,
    "tfds": check_training,
    "image-folder": check_training,
    "serve": check_serve,
    "srun": check_srun,
    "submitit": check_submitit,
    "ray": check_ray,
    "tensorboard": check_tensorboard,
    "elastic": check_elastic,
    "elastic-kill": check_elastic_kill,
}
KINDS = {key(c): kind_of(c) for c in COMMANDS}
TOKENS = {key(c): c for c in COMMANDS}


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return Scratch(tmp_path_factory.mktemp("readme"))


@pytest.fixture(scope="module")
def results(scratch, tfds_dir):
    """Every runnable README command, two at a time (2 cores); dependent ones after what they depend on."""
    scratch.tfds_dir = tfds_dir  # conftest.py: a stand-in MNIST prepared by tfds, for README's data=tfds command
    pool = ThreadPoolExecutor(max_workers=2)
    futures = {}
    for k, (kind, reason) in KINDS.items():
        if reason is None and kind in RUNNERS:
            futures[k] = pool.submit(RUNNERS[kind], scratch, TOKENS[k])

    def result(k):
        return futures[k].result()

    for k, (kind, reason) in KINDS.items():
        if reason is None and kind in DEPENDENT:
            futures[k] = pool.submit(DEPENDENT[kind], scratch, TOKENS[k], result)
    yield scratch, result
    pool.shutdown(wait=True)


@pytest.mark.slow  # end to end: runs README's commands (training runs, sweeps, benchmarks)
@pytest.mark.parametrize(
    "command", list(KINDS), ids=[kind + ": " + re.sub(r"\s+", " ", k)[:80] for k, (kind, _) in KINDS.items()]
)  # the kind first: conftest.py's xdist_scope keeps the srun / submitit / ray ones with their daemon's file
def test_readme_command(command, request):
    kind, reason = KINDS[command]
    if reason:
        pytest.skip(f"{command}: {reason}")
    if kind == "srun":  # its own cluster, started here: where it cannot start only this command is skipped
        scratch, slurm = request.getfixturevalue("scratch"), request.getfixturevalue("slurm")
        CHECKS[kind](scratch, _runner_args(TOKENS[command]), run_srun(scratch, TOKENS[command], slurm))
        return
    if kind == "submitit":
        scratch, slurm = request.getfixturevalue("scratch"), request.getfixturevalue("slurm")
        CHECKS[kind](scratch, _runner_args(TOKENS[command]), run_submitit(scratch, TOKENS[command], slurm))
        return
    if kind == "ray":  # on its own: `-k ray` runs just this command
        scratch = request.getfixturevalue("scratch")
        CHECKS[kind](scratch, _runner_args(TOKENS[command]), run_ray(scratch, TOKENS[command]))
        return
    if kind == "tensorboard":  # on README's profiled run; `-k tensorboard` runs just that run and this command
        scratch = request.getfixturevalue("scratch")
        CHECKS[kind](scratch, TOKENS[command], run_tensorboard(scratch, TOKENS[command], _profiled_run(scratch, request)))
        return
    scratch, result = request.getfixturevalue("results")
    tokens = TOKENS[command]
    args = (
        tokens
        if kind in ("setup", "dashboard", "deliver", "export", "kubernetes") or kind.startswith(("benchmark", "gpu"))
        else _runner_args(tokens)
    )
    CHECKS[kind](scratch, args, result(command))


# --- README's first sweep, read closer: its runs, its report, and the dashboard showing it ---------------------
GRID = next(k for k, (kind, _) in KINDS.items() if kind == "sweep")  # strategy=one_device,mirrored,central_storage x 2


def _grid(request):
    """(sweep output, sweep directory, client, parent run, child runs in job order) of README's first sweep."""
    scratch, result = request.getfixturevalue("results")
    proc, sweep_dir = result(GRID)
    _ok(proc)
    client = scratch.client
    experiments = [e.experiment_id for e in client.search_experiments()]
    (parent,) = client.search_runs(experiments, filter_string=f"tags.`sweep.dir` = '{os.path.abspath(sweep_dir)}'")
    children = client.search_runs([parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    return proc, sweep_dir, client, parent, sorted(children, key=lambda r: int(r.data.tags["sweep.job_num"]))


GRID_JOBS = [(s, e) for s in ("one_device", "mirrored", "central_storage") for e in ("fit", "custom_loop")]


@pytest.mark.slow  # end to end: README's sweep
def test_the_sweep_nests_one_child_run_per_job_in_grid_order(request):
    proc, _, _, parent, children = _grid(request)
    assert parent.data.tags["sweep.jobs"] == "6" and parent.data.tags["sweep.failed_jobs"] == "0"
    assert [c.data.tags["sweep.job_num"] for c in children] == [str(n) for n in range(6)]
    assert [(c.data.params["strategy.name"], c.data.params["executor.name"]) for c in children] == GRID_JOBS
    assert "strategy=mirrored" in children[2].data.tags["overrides"]
    for n in range(6):
        assert f"job #{n} ({n + 1} of 6)" in proc.stdout  # which job of how many is running


@pytest.mark.slow  # end to end: README's sweep
def test_the_sweep_report_holds_the_child_runs_numbers(request):
    _, sweep_dir, client, parent, children = _grid(request)
    with open(sweep_dir / "report.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 6
    for row, child in zip(rows, children):
        m = child.data.metrics
        assert row["run"] == child.info.run_name and row["status"] == "FINISHED"
        assert float(row["examples_per_sec"]) == m["summary/examples_per_sec"]
        assert float(row["examples_per_sec_per_replica"]) == m["summary/examples_per_sec_per_replica"]
        assert float(row["final_loss"]) == m["loss"]
        assert float(row["eval_loss"]) == m["eval/loss"] and float(row["eval_accuracy"]) == m["eval/accuracy"]
        assert row["replicas"] == child.data.tags["num_replicas_in_sync"]
    assert "| mirrored | custom_loop | 4 |" in (sweep_dir / "report.md").read_text()
    for plot in ["throughput.png", "loss_curves.png", "scaling_efficiency.png"]:
        assert (sweep_dir / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    logged = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {"report/report.csv", "report/report.md", "report/loss_curves.png"} <= logged


def listening_addresses(port):
    """The local addresses of sockets listening on `port`, from /proc/net/tcp and tcp6."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, hex_port = local.rsplit(":", 1)
                if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                    found.add(".".join(str(int(address[i : i + 2], 16)) for i in (6, 4, 2, 0)) if len(address) == 8 else address)
    return found


@pytest.mark.slow  # end to end: README's sweep in the dashboard, in headless Chromium
def test_the_dashboard_shows_the_sweep_in_chromium(request, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        pytest.skip("no Chromium on this machine (.ci/run installs Debian's chromium; apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    _, _, _, parent, children = _grid(request)
    scratch, result = request.getfixturevalue("results")
    elastic = _run_of(scratch, result(next(k for k, (kind, _) in KINDS.items() if kind == "elastic"))[1])
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "runner.dashboard", "--tracking-uri", scratch.uri, "--port", str(port)],
        cwd=scratch.root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if urllib.request.urlopen(f"{base}/health", timeout=2).status == 200:
                    break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise AssertionError("dashboard did not start") from None
                time.sleep(0.5)
        assert listening_addresses(port) == {"127.0.0.1"}  # this machine only, by default
        exp_id = parent.info.experiment_id
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=chromium,
                args=[
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--no-first-run",
                    "--disable-sync",
                ],
            )
            page = browser.new_page()
            page.goto(f"{base}/#/experiments/{exp_id}?workflowType=machine_learning")
            # The experiment page lists the sweep's parent run; expanding it shows every job's run.
            parent_link = page.get_by_role("link", name=parent.info.run_name, exact=True)
            parent_link.wait_for(timeout=60_000)
            parent_link.locator("xpath=ancestor::*[@role='gridcell'][1]").locator("button").first.click()
            for child in children:
                page.get_by_role("link", name=child.info.run_name, exact=True).wait_for(timeout=60_000)
            # The Dataset column: each job's training data, logged as a run input (name and digest).
            page.get_by_text("synthetic-train (").first.wait_for(timeout=60_000)
            page.screenshot(path=str(tmp_path / "dashboard-runs.png"))
            page.goto(f"{base}/#/experiments/{exp_id}/runs/{children[0].info.run_id}")
            page.get_by_text("throughput/window_examples_per_sec", exact=True).first.wait_for(timeout=60_000)
            # MLflow's system-metrics charts for the run, sampled in its MLflow process.
            page.goto(f"{base}/#/experiments/{exp_id}/runs/{children[0].info.run_id}/system-metrics")
            page.get_by_text("cpu_utilization_percentage", exact=True).first.wait_for(timeout=60_000)
            page.screenshot(path=str(tmp_path / "dashboard-system-metrics.png"))
            # README's elastic job: its world size over the steps, charted with the loss in the run's Model metrics
            # (a section per prefix, cluster's first). MLflow draws only the charts in view, so the per-replica loss,
            # sections further down, is found through the page's own chart search.
            page.goto(f"{base}/#/experiments/{elastic.info.experiment_id}/runs/{elastic.info.run_id}/model-metrics")
            for chart in ("world_size", "restarts"):
                page.get_by_text(chart, exact=True).first.wait_for(timeout=60_000)
            page.get_by_text(f"{elastic.info.run_name} (cluster/world_size)", exact=True).first.wait_for(timeout=60_000)
            page.screenshot(path=str(tmp_path / "dashboard-elastic.png"))
            page.get_by_placeholder("Search metric charts").fill("loss/replica_0")
            page.get_by_text(f"{elastic.info.run_name} (loss/replica_0)", exact=True).first.wait_for(timeout=60_000)
            browser.close()
        for shot in ("dashboard-runs.png", "dashboard-system-metrics.png", "dashboard-elastic.png"):
            assert (tmp_path / shot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", shot
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    with pytest.raises(OSError):  # stopping the dashboard stopped its MLflow server too
        urllib.request.urlopen(f"{base}/health", timeout=2)
