"""runner/sweeps/report.py: the sweep's comparison table and plots, from real child runs created with MlflowClient in a
fresh SQLite store, the way runner/sweeps/sweep.py nests them under a parent run."""

import csv
import json
import os

import pytest

from runner.sweeps import report


@pytest.fixture
def sweep(sqlite_uri, tmp_path):
    """A parent run and a function that adds child runs to it as a sweep's jobs log them."""
    from mlflow import MlflowClient

    client = MlflowClient(sqlite_uri)
    experiment = client.create_experiment("sweep", artifact_location=str(tmp_path / "artifacts"))
    parent = client.create_run(experiment, run_name="sweep-parent")
    sweep_dir = tmp_path / "multirun"
    (sweep_dir / ".runner").mkdir(parents=True)

    def job(
        num,
        strategy,
        executor,
        replicas=None,
        examples_per_sec=None,
        losses=(),
        status="FINISHED",
        returncode=None,
        overrides=None,
        eval_accuracy=None,
    ):
        tags = {"mlflow.parentRunId": parent.info.run_id, "sweep.job_num": str(num)}
        if replicas is not None:
            tags["num_replicas_in_sync"] = str(replicas)
        run = client.create_run(experiment, run_name=f"job-{num}", tags=tags)
        run_id = run.info.run_id
        client.log_param(run_id, "strategy.name", strategy)
        client.log_param(run_id, "executor.name", executor)
        for step, loss in enumerate(losses, 1):
            client.log_metric(run_id, "loss", loss, step=step)
        if examples_per_sec is not None:
            client.log_metric(run_id, "summary/examples_per_sec", examples_per_sec)
            client.log_metric(run_id, "summary/examples_per_sec_per_replica", examples_per_sec / replicas)
            client.log_metric(run_id, "eval/loss", losses[-1] * 1.1)
        if eval_accuracy is not None:
            client.log_metric(run_id, "eval/accuracy", eval_accuracy)
        client.set_terminated(run_id, status)
        if returncode is not None:  # what the sweep's job process records when it ends
            record = {
                "num": num,
                "overrides": overrides or [f"strategy={strategy}", f"executor={executor}"],
                "returncode": returncode,
                "dir": str(sweep_dir / str(num)),
            }
            (sweep_dir / ".runner" / f"job-{num}.json").write_text(json.dumps(record))
        return run_id

    return client, parent.info.run_id, sweep_dir, job


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_the_report_holds_one_row_per_job_in_job_order_and_ends_the_parent_finished(sweep, capsys):
    client, parent, sweep_dir, job = sweep
    job(1, "mirrored", "fit", replicas=2, examples_per_sec=1600.0, losses=[0.9, 0.5], returncode=0, eval_accuracy=0.75)
    job(0, "one_device", "fit", replicas=1, examples_per_sec=1000.0, losses=[1.0, 0.6, 0.4], returncode=0, eval_accuracy=0.7)
    job(2, "central_storage", "custom_loop", replicas=2, examples_per_sec=900.5, losses=[0.8, 0.7], returncode=0)

    failed = report.write_report(client.tracking_uri, parent, str(sweep_dir))

    assert failed == []
    rows = read_csv(sweep_dir / "report.csv")
    assert [r["job"] for r in rows] == ["0", "1", "2"]
    assert list(rows[0]) == report.COLUMNS
    assert rows[0] == {
        "job": "0",
        "run": "job-0",
        "status": "FINISHED",
        "strategy": "one_device",
        "executor": "fit",
        "replicas": "1",
        "examples_per_sec": "1000.0",
        "examples_per_sec_per_replica": "1000.0",
        "final_loss": "0.4",
        "eval_loss": str(0.4 * 1.1),
        "eval_accuracy": "0.7",
    }
    assert rows[2]["eval_accuracy"] == ""  # not logged: an empty cell
    md = (sweep_dir / "report.md").read_text().splitlines()
    assert md[0] == "| " + " | ".join(report.COLUMNS) + " |" and len(md) == 2 + 3
    assert md[2].startswith("| 0 | job-0 | FINISHED | one_device | fit | 1 | 1,000.0 | 1,000.0 | 0.4000 |")
    for name in ("throughput.png", "loss_curves.png", "scaling_efficiency.png"):
        assert (sweep_dir / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    run = client.get_run(parent)
    assert run.info.status == "FINISHED" and run.data.tags["sweep.failed_jobs"] == "0"
    logged = {a.path for a in client.list_artifacts(parent, "report")}
    assert logged == {
        f"report/{n}" for n in ("report.csv", "report.md", "throughput.png", "loss_curves.png", "scaling_efficiency.png")
    }
    out = capsys.readouterr().out
    assert "job  run    status" in out and f"MLflow parent run sweep-parent ({parent})" in out


def test_failed_jobs_are_named_and_fail_the_parent(sweep):
    client, parent, sweep_dir, job = sweep
    job(0, "one_device", "fit", replicas=1, examples_per_sec=1000.0, losses=[1.0], returncode=0)
    job(1, "mirrored", "fit", status="FAILED", returncode=1, overrides=["strategy=mirrored", "cross_device_ops=nccl"])
    job(2, "mirrored", "fit", replicas=2, losses=[1.0], status="KILLED")  # its process left no record: named by its run
    job(3, "tpu", "fit", returncode=2, overrides=["strategy=tpu"])  # the process failed though its run says FINISHED

    failed = report.write_report(client.tracking_uri, parent, str(sweep_dir))

    assert failed == ["#1 (strategy=mirrored cross_device_ops=nccl)", "#3 (strategy=tpu)", "#2 (job-2)"]
    assert [r["status"] for r in read_csv(sweep_dir / "report.csv")] == ["FINISHED", "FAILED", "KILLED", "FINISHED"]
    run = client.get_run(parent)
    assert run.info.status == "FAILED" and run.data.tags["sweep.failed_jobs"] == "3"
    assert not (sweep_dir / "scaling_efficiency.png").exists()  # no multi-replica job finished with a throughput


def test_a_job_that_left_no_run_is_reported_from_its_record(sweep):
    """A job refused before its first step (exit 2) had its run deleted, and one that failed before its run existed
    never had one: each still has its row, from the sweep's record of the job, and fails the sweep."""
    client, parent, sweep_dir, job = sweep
    job(0, "mirrored", "fit", replicas=2, examples_per_sec=1000.0, losses=[1.0], returncode=0)
    for num, code, overrides in ((2, 1, ["strategy=tpu", "model=typo"]), (1, 2, ["strategy=mirrored", "cross_device_ops=nccl"])):
        record = {"num": num, "overrides": overrides, "returncode": code, "dir": str(sweep_dir / str(num))}
        (sweep_dir / ".runner" / f"job-{num}.json").write_text(json.dumps(record))

    failed = report.write_report(client.tracking_uri, parent, str(sweep_dir))

    assert failed == ["#1 (strategy=mirrored cross_device_ops=nccl)", "#2 (strategy=tpu model=typo)"]
    rows = read_csv(sweep_dir / "report.csv")
    assert [(r["job"], r["run"], r["status"], r["strategy"]) for r in rows] == [
        ("0", "job-0", "FINISHED", "mirrored"),
        ("1", "", "REFUSED", "mirrored"),
        ("2", "", "FAILED", "tpu"),
    ]
    assert [r["cross_device_ops"] for r in rows] == ["", "nccl", ""]  # what the jobs' overrides searched
    assert "| 1 |  | REFUSED |" in (sweep_dir / "report.md").read_text()
    assert client.get_run(parent).data.tags["sweep.failed_jobs"] == "2"


def test_a_sweep_with_no_job_that_finished_still_reports(sweep):
    client, parent, sweep_dir, job = sweep
    job(0, "mirrored", "fit", status="FAILED", returncode=1)
    assert report.write_report(client.tracking_uri, parent, str(sweep_dir)) == ["#0 (strategy=mirrored executor=fit)"]
    assert (sweep_dir / "loss_curves.png").exists() and not (sweep_dir / "throughput.png").exists()
    assert read_csv(sweep_dir / "report.csv")[0]["replicas"] == ""


# --- the table's pieces, on rows as _row makes them --------------------------------------------------------------
def row(job, executor="fit", replicas=1, examples_per_sec=100.0, **more):
    base = {c: "" for c in report.COLUMNS}
    base.update(
        job=job,
        run=f"job-{job}",
        status="FINISHED",
        strategy="s",
        executor=executor,
        replicas=replicas,
        examples_per_sec=examples_per_sec,
        **more,
    )
    return base


def test_scaling_efficiency_is_over_the_fastest_one_replica_job_of_the_same_executor():
    rows = [
        row(0, replicas=1, examples_per_sec=1000.0),
        row(1, replicas=1, examples_per_sec=800.0),
        row(2, replicas=4, examples_per_sec=3000.0),
        row(3, executor="custom_loop", replicas=1, examples_per_sec=500.0),
        row(4, executor="custom_loop", replicas=2, examples_per_sec=900.0),
        row(5, replicas=2, examples_per_sec=""),  # failed: no throughput
        row(6, executor="other", replicas=2, examples_per_sec=900.0),  # no one-replica baseline
        row(7, replicas="", examples_per_sec=900.0),  # replicas unknown
    ]
    assert report.scaling_efficiency(rows) == {2: pytest.approx(0.75), 4: pytest.approx(0.9)}


def test_table_text_aligns_columns_and_formats_numbers():
    rows = [row(0, examples_per_sec=12345.678, final_loss=0.123456), row(10, replicas=2, examples_per_sec=99.5, final_loss="")]
    lines = report.table_text(rows).splitlines()
    shown = [c for c in report.COLUMNS if c not in ("strategy", "executor")]  # the same in both: said once, below
    assert len(lines) == 4 and lines[0].split() == shown and lines[3] == "every job: strategy=s, executor=fit"
    assert "12,345.7" in lines[1] and "0.1235" in lines[1] and "99.5000" in lines[2]
    starts = [line.index("FINISHED") for line in lines[1:3]]
    assert starts[0] == starts[1] == lines[0].index("status")


def test_markdown_has_a_header_a_rule_and_one_line_per_row():
    text = report.markdown([row(0), row(1, executor="custom_loop")])
    lines = text.splitlines()
    assert text.endswith("\n") and len(lines) == 6 and lines[5] == "every job: strategy=s, replicas=1"
    assert lines[1] == "|" + "---|" * (len(report.COLUMNS) - 2)
    assert lines[3].startswith("| 1 | job-1 | FINISHED | custom_loop | 100.0 |")


def test_a_search_shows_the_values_it_searched_and_not_what_every_trial_shares(sweep, capsys):
    client, parent, sweep_dir, job = sweep
    for num, lr, batch in ((0, "0.03028525153605885", 32), (1, "0.013913346327363716", 128)):
        run_id = job(num, "default", "fit", replicas=1, examples_per_sec=10.0, losses=[0.5 + num], returncode=0)
        overrides = f"train.optimizer.learning_rate={lr} train.global_batch_size={batch} experiment=tune_lr train.epochs=1"
        client.set_tag(run_id, "overrides", overrides)

    report.write_report(client.tracking_uri, parent, str(sweep_dir), "eval/loss", "minimize")

    out = capsys.readouterr().out.splitlines()
    table = out[out.index(next(line for line in out if line.startswith("job "))) :][:3]
    assert table[0].split()[:5] == ["job", "run", "status", "train.optimizer.learning_rate", "train.global_batch_size"]
    assert table[1].split()[3:5] == ["0.03029", "32"] and table[2].split()[3:5] == ["0.01391", "128"]
    assert "strategy" not in table[0] and "executor" not in table[0] and "train.epochs" not in table[0]
    csv_rows = read_csv(sweep_dir / "report.csv")  # every column for scripts, the searched values as given
    assert list(csv_rows[0]) == report.COLUMNS + ["train.optimizer.learning_rate", "train.global_batch_size"]
    assert csv_rows[0]["train.optimizer.learning_rate"] == "0.03028525153605885" and csv_rows[0]["strategy"] == "default"
    assert "| train.optimizer.learning_rate | train.global_batch_size |" in (sweep_dir / "report.md").read_text()


@pytest.mark.parametrize("direction,order", [("minimize", ["2", "0", "1", "3"]), ("maximize", ["1", "0", "2", "3"])])
def test_a_search_ranks_its_trials_by_the_objective_and_tags_the_best(sweep, direction, order):
    client, parent, sweep_dir, job = sweep
    ids = {
        0: job(0, "default", "fit", replicas=1, examples_per_sec=10.0, losses=[0.5], returncode=0),  # eval/loss 0.55
        1: job(1, "default", "fit", replicas=1, examples_per_sec=10.0, losses=[0.9], returncode=0),  # 0.99
        2: job(2, "default", "fit", replicas=1, examples_per_sec=10.0, losses=[0.1], returncode=0),  # 0.11
        3: job(3, "default", "fit", status="FAILED", returncode=1),  # no objective: last, whatever the direction
    }

    failed = report.write_report(client.tracking_uri, parent, str(sweep_dir), "eval/loss", direction)

    assert [r["job"] for r in read_csv(sweep_dir / "report.csv")] == order
    assert len(failed) == 1
    best = ids[int(order[0])]
    tags = client.get_run(parent).data.tags
    assert tags["sweep.best_run_id"] == best and tags["sweep.best_job"] == order[0] and tags["sweep.objective"] == "eval/loss"
    assert float(tags["sweep.best_value"]) == client.get_run(best).data.metrics["eval/loss"]
    assert [n for n, i in ids.items() if client.get_run(i).data.tags.get("sweep.best") == "true"] == [int(order[0])]


def test_the_sweeps_server_writes_the_report_it_is_asked_for_and_says_what_failed(sweep, tmp_path, capfd):
    """The report in a process forked from the sweep's MLflow server (runner.sweeps.server), mlflow imported."""
    from runner.sweeps.server import MlflowServer

    client, parent_id, sweep_dir, job = sweep
    job(0, "default", "fit", 1, 1000.0, [0.9, 0.5])
    job(1, "mirrored", "fit", 2, 1500.0, [0.9, 0.4], status="FAILED", returncode=1)
    server = MlflowServer({**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        args = dict(uri=client.tracking_uri, parent_id=parent_id, sweep_dir=str(sweep_dir), objective=None, direction=None)
        failed = server.report(args, str(tmp_path / "report.json"))
        assert failed == ["#1 (strategy=mirrored executor=fit)"]
        assert "report: " in capfd.readouterr().out  # its lines, passed on
        assert (sweep_dir / "report.csv").is_file() and client.get_run(parent_id).info.status == "FAILED"
        # a parent run that is not there: None, for the sweep to write the report itself (and say what is wrong)
        assert server.report({**args, "parent_id": "0" * 32}, str(tmp_path / "again.json")) is None
        assert "error" in json.loads((tmp_path / "again.json").read_text())
    finally:
        server.stop()
    assert server.report(args, str(tmp_path / "gone.json")) is None and not os.path.exists(server.dir)


def test_the_loss_curves_do_not_restart_at_epoch_boundaries():
    """Running means since each epoch's start, logged every 2 steps over epochs of 4: each interval's own mean."""
    from runner.sweeps.report import interval_means

    losses = [4.0, 2.0, 3.0, 1.0, 1.0, 1.0, 0.5, 0.5]  # the steps' own losses
    logged = []
    for step in (2, 4, 6, 8):
        start = (step - 1) // 4 * 4
        logged.append((step, sum(losses[start:step]) / (step - start)))
    assert interval_means(logged, 4) == [(2, 3.0), (4, 2.0), (6, 1.0), (8, 0.5)]
    assert interval_means(logged, None) == logged  # no steps_per_epoch known: as logged


def test_a_stopped_sweep_ends_the_runs_its_stopped_jobs_left_running_killed(sweep):
    """Ctrl-C landing as a job's run was being created: the job ended without ending it. Once every job's process has
    ended, the sweep ends such runs KILLED (sweep.end_stranded_jobs); runs that ended keep their status."""
    import signal

    from runner.sweeps.sweep import end_stranded_jobs

    client, parent_id, _, job = sweep
    done, killed = job(0, "default", "fit"), job(1, "default", "fit", status="KILLED")
    experiment = client.get_run(parent_id).info.experiment_id
    left = client.create_run(experiment, run_name="job-2", tags={"mlflow.parentRunId": parent_id}).info.run_id
    other = client.create_run(experiment, run_name="not-a-job").info.run_id  # another run going on in the experiment
    assert end_stranded_jobs(client, parent_id, signal.SIGINT) == [left]
    statuses = {r: client.get_run(r).info.status for r in (done, killed, left, other)}
    assert statuses == {done: "FINISHED", killed: "KILLED", left: "KILLED", other: "RUNNING"}
    assert client.get_run(left).data.tags["stopped_by"] == "SIGINT"


def test_a_second_ctrl_c_while_the_sweeps_run_is_ended_waits_for_it(sweep, sqlite_uri, tmp_path, monkeypatch):
    """Two SIGINTs (a second press, or `timeout` passing its own on): the second came while the first's handler
    ended the sweep's run, raised in the middle and left the run RUNNING behind a traceback. It waits now."""
    import os
    import signal

    from runner.control import contract
    from runner.sweeps import sweep as sweep_module

    client, parent_id, _, _ = sweep
    path = tmp_path / "parent-run.json"
    contract.announce_parent_run(str(path), parent_id)
    monkeypatch.setenv(contract.PARENT_RUN_FILE, str(path))
    monkeypatch.setenv(contract.TRACKING_URI, sqlite_uri)
    ended = sweep_module.end_stranded_jobs

    def interrupted(*args):
        os.kill(os.getpid(), signal.SIGINT)  # delivered here, in the main thread, at the next bytecode
        return ended(*args)

    monkeypatch.setattr(sweep_module, "end_stranded_jobs", interrupted)
    raising = signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C raises, as in the sweep's process
    try:
        sweep_module.kill_parent_run(signal.SIGINT)  # no KeyboardInterrupt out of it
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back after
    finally:
        signal.signal(signal.SIGINT, raising)
    assert client.get_run(parent_id).info.status == "KILLED"
