"""Metrics survive a kill -9: the journal holds what was logged up to about a second before, and resume=
delivers it first, so the run's history ends whole, with no gap and no step twice; an attempt killed after its
last checkpoint leaves the next nothing to train, which ends the run with its figures all the same."""

import json
import math
import re
import signal
import statistics
import time

import pytest

from helpers import LiveRun, run_runner

pytestmark = pytest.mark.slow  # end to end: kills and resumes a real `python -m runner`

# A custom loop with a loss every 5 steps and MLflow's flush far away (300 s, not the default 5 s): the first kill
# lands before any delivery, so what it keeps is the journal's alone. Enough steps that the kill, a second or two
# into training, lands well before the end (a call runs 100 steps; this model trains thousands of steps a second).
STEPS = 60000
ARGS = [
    "mlflow.flush_every_sec=300",
    "executor=custom_loop",
    "train.epochs=1",
    f"train.steps_per_epoch={STEPS}",
    "train.log_every_n_steps=5",
    "data.num_examples=2048",
    "checkpoint.every_n_steps=2000",
    "mlflow.experiment_name=journal",
]


def test_kill_9_loses_at_most_the_journal_interval_and_resume_completes_the_history(runner):
    from mlflow import MlflowClient

    from runner.tracking.journal import read

    run_dir = runner.root / "runs" / "journal-kill9"
    live = LiveRun([*ARGS, "mlflow.run_name=journal-kill9"], runner.root, run_dir, runner.uri)
    step = re.compile(rf"step (\d+)/{STEPS}")
    live.wait_for(lambda line: (m := step.search(line)) and int(m.group(1)) >= 300, 180)
    before = max(int(m.group(1)) for line in live.lines if (m := step.search(line)))
    time.sleep(1.2)  # the journal is written every second: everything up to `before` must be in it
    live.proc.send_signal(signal.SIGKILL)
    live.finish(timeout=30)

    pending, logged_through = read(str(run_dir))
    assert logged_through is not None and logged_through >= before, (logged_through, before)
    assert {row[3] for row in pending if row[0] == "loss"} >= set(range(5, before + 1, 5))  # never delivered, kept

    client = MlflowClient(runner.uri)
    run_id = (run_dir / "mlflow_run_id").read_text().strip()
    # The resume trains to the end and is killed in turn after its last checkpoint, as it evaluates: the next
    # attempt has nothing left to train, and still ends the run with its figures.
    again = LiveRun([*ARGS, f"resume={run_dir}"], runner.root, run_dir, runner.uri)
    again.wait_for(lambda line: "evaluation:" in line, 240)
    again.proc.send_signal(signal.SIGKILL)
    _, said = again.finish(timeout=30)
    assert f"steps up to {logged_through} logged" in said
    last = run_runner([*ARGS, f"resume={run_dir}"], cwd=runner.root, run_dir=run_dir, tracking_uri=runner.uri)
    assert last.returncode == 0, last.output[-3000:]
    assert f"nothing left to train: the checkpoint is at the last step ({STEPS})" in last.output, last.output[-3000:]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    ended = json.loads((run_dir / "summary.json").read_text())
    for figures in (run.data.metrics, ended):
        assert {"eval/loss", "summary/examples_per_sec"} <= set(figures), sorted(figures)
    assert ended["final_loss"] == run.data.metrics["loss"] and math.isfinite(ended["final_loss"])
    windows = statistics.median(m.value for m in client.get_metric_history(run_id, "throughput/window_examples_per_sec"))
    assert 0.2 < ended["summary/examples_per_sec"] / windows < 5  # the attempts' own windows, not a figure from nowhere
    steps = [m.step for m in client.get_metric_history(run_id, "loss")]
    assert sorted(steps) == list(range(5, STEPS + 1, 5)), (
        "every logged step once: no gap, no step twice",
        sorted(set(range(5, STEPS + 1, 5)) ^ set(steps))[:20],
        last.output[-3000:],
    )
    assert not (run_dir / "mlflow_journal.jsonl").exists()  # a run that ended with everything delivered keeps none
