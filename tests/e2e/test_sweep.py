"""Multirun sweeps: MLflow parent and child runs, a failing job, the report (README's joblib sweep: tests/e2e/test_readme.py),
experiment presets, and the dashboard checked in headless Chromium."""

import csv
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from helpers import FAST

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


@pytest.fixture(scope="module")
def grid(runner):
    proc, sweep_dir = sweep(
        runner, "grid", ["strategy=one_device,mirrored", "executor=fit,custom_loop", "devices.logical_cpus=2", *FAST]
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, sweep_dir


@pytest.mark.slow  # end to end: runs sweeps of `python -m runner` jobs
def test_sweep_nests_one_child_run_per_job(grid, runner):
    proc, _ = grid
    client, parent, children = family(runner, "grid")
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["sweep.jobs"] == "4" and parent.data.tags["sweep.failed_jobs"] == "0"
    assert [c.data.tags["sweep.job_num"] for c in children] == ["0", "1", "2", "3"]
    assert all(c.info.status == "FINISHED" for c in children)
    assert [(c.data.params["strategy.name"], c.data.params["executor.name"]) for c in children] == [
        ("one_device", "fit"),
        ("one_device", "custom_loop"),
        ("mirrored", "fit"),
        ("mirrored", "custom_loop"),
    ]
    assert "strategy=mirrored" in children[2].data.tags["overrides"]
    for n in range(4):
        assert f"job #{n} ({n + 1} of 4)" in proc.stdout  # which job of how many is running


@pytest.mark.slow  # end to end: runs sweeps of `python -m runner` jobs
def test_report_numbers_equal_the_child_runs(grid, runner):
    _, sweep_dir = grid
    client, parent, children = family(runner, "grid")
    with open(sweep_dir / "report.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4
    for row, child in zip(rows, children):
        m = child.data.metrics
        assert row["run"] == child.info.run_name and row["status"] == "FINISHED"
        assert float(row["examples_per_sec"]) == m["summary/examples_per_sec"]
        assert float(row["examples_per_sec_per_replica"]) == m["summary/examples_per_sec_per_replica"]
        assert float(row["final_loss"]) == m["loss"]
        assert float(row["eval_loss"]) == m["eval/loss"] and float(row["eval_accuracy"]) == m["eval/accuracy"]
        assert row["replicas"] == child.data.tags["num_replicas_in_sync"]
    assert "| mirrored | custom_loop | 2 |" in (sweep_dir / "report.md").read_text()
    for plot in ["throughput.png", "loss_curves.png", "scaling_efficiency.png"]:
        assert (sweep_dir / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    logged = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {"report/report.csv", "report/report.md", "report/loss_curves.png"} <= logged


@pytest.mark.slow  # end to end: runs a sweep and stops it
def test_ctrl_c_stops_a_sweep_its_job_checkpoints_and_both_runs_are_killed(runner):
    """Ctrl-C at a terminal (SIGINT to the sweep's process group) while job #0 trains: the job gets it once,
    checkpoints and ends its run KILLED; the sweep's run is KILLED too; exit 130, no traceback, no job after it."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    sweep_dir = runner.root / "sweeps" / "stopped"
    argv = [sys.executable, "-m", "runner", "-m", "data=ones", "train.epochs=300", "train.steps_per_epoch=50", "train.seed=1,2"]
    argv += [f"hydra.sweep.dir={sweep_dir}", f"mlflow.tracking_uri={runner.uri}", f"mlflow.experiment_name={EXPERIMENT}"]
    live = subprocess.Popen(
        [*argv, "mlflow.run_name=stopped"],
        cwd=runner.root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    seen = []
    for line in live.stdout:
        seen.append(line)
        if "epoch 3/300" in line:
            break
    os.killpg(live.pid, signal.SIGINT)
    rest, _ = live.communicate(timeout=120)
    output = "".join(seen) + rest
    assert live.returncode == 130 and "Traceback" not in output, output[-3000:]
    assert re.search(r"\[#0\] Stopped: training stopped by SIGINT at step \d+: checkpoint written", output), output[-3000:]
    assert "Stopped: the sweep was stopped by SIGINT during job #0" in output and "job #1" not in output
    _, parent, children = family(runner, "stopped")
    assert parent.info.status == "KILLED" and [c.info.status for c in children] == ["KILLED"]
    assert any((sweep_dir / "0" / "checkpoints").glob("ckpt-*.index"))


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
    _, parent, children = family(runner, "failing")
    assert parent.info.status == "FAILED" and parent.data.tags["sweep.failed_jobs"] == "3"
    assert [c.info.status for c in children] == ["FINISHED", "FAILED", "FAILED", "FAILED"]
    assert "cross_device_ops=nccl needs NVIDIA GPUs" in children[1].data.tags["error"]  # failed inside its run
    assert "needs a cluster of worker and ps tasks" in children[2].data.tags["error"]  # failed before one existed
    assert children[2].data.params["strategy.name"] == "parameter_server"
    with open(sweep_dir / "report.csv") as f:
        assert [r["status"] for r in csv.DictReader(f)] == ["FINISHED", "FAILED", "FAILED", "FAILED"]


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


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


@pytest.mark.slow  # end to end: runs sweeps of `python -m runner` jobs
def test_dashboard_shows_the_sweep_in_chromium(grid, runner):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        pytest.skip("no Chromium on this machine (.ci/run installs Debian's chromium; apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    client, parent, children = family(runner, "grid")
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "runner.dashboard", "--tracking-uri", runner.uri, "--port", str(port)],
        cwd=runner.root,
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
            parent_link = page.get_by_role("link", name="grid", exact=True)
            parent_link.wait_for(timeout=60_000)
            parent_link.locator("xpath=ancestor::*[@role='gridcell'][1]").locator("button").first.click()
            for child in children:
                page.get_by_role("link", name=child.info.run_name, exact=True).wait_for(timeout=60_000)
            # The Dataset column: each job's training data, logged as a run input (name and digest).
            page.get_by_text("synthetic-train (").first.wait_for(timeout=60_000)
            page.screenshot(path=str(runner.root / "dashboard-runs.png"))
            page.goto(f"{base}/#/experiments/{exp_id}/runs/{children[0].info.run_id}")
            page.get_by_text("throughput/examples_per_sec", exact=True).first.wait_for(timeout=60_000)
            # MLflow's system-metrics charts for the run, sampled in its MLflow process.
            page.goto(f"{base}/#/experiments/{exp_id}/runs/{children[0].info.run_id}/system-metrics")
            page.get_by_text("cpu_utilization_percentage", exact=True).first.wait_for(timeout=60_000)
            page.screenshot(path=str(runner.root / "dashboard-system-metrics.png"))
            browser.close()
        for shot in ("dashboard-runs.png", "dashboard-system-metrics.png"):
            assert (runner.root / shot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", shot
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    with pytest.raises(OSError):  # stopping the dashboard stopped its MLflow server too
        urllib.request.urlopen(f"{base}/health", timeout=2)


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
