"""hydra/sweeper=optuna, the runner's own sweeper on Optuna 5 (runner.sweeps.search), end to end: a two-objective
search (NSGA-II over eval/loss and throughput), two trials side by side (sweep.parallel=2), killed with SIGKILL in
the middle of its third trial, then the same command again: the finished trials are not run again, the interrupted
ones go on from their checkpoints in their own MLflow runs (no step logged twice), under the same parent run and
numbering, and Optuna's study in the sweep directory holds every trial once. Searches it cannot run are refused
before any trial, in one paragraph."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest
import yaml

pytestmark = pytest.mark.slow  # end to end: sweeps of `python -m runner` processes

EXPERIMENT = "search"
SEARCH = [
    "experiment=tune_lr",
    "hydra/sweeper/sampler=nsgaii",
    "hydra.sweeper.n_trials=3",
    "sweep.parallel=2",
    "sweep.objective=[eval/loss,summary/examples_per_sec]",
    "hydra.sweeper.direction=[minimize,maximize]",
    "train.epochs=1",
    "train.steps_per_epoch=600",
    "train.log_every_n_steps=20",
    "executor=custom_loop",
    "checkpoint.every_n_steps=40",
    f"mlflow.experiment_name={EXPERIMENT}",
]


def _argv(runner, sweep_dir, *args):
    return [sys.executable, "-m", "runner", "-m", *args, f"hydra.sweep.dir={sweep_dir}", f"mlflow.tracking_uri={runner.uri}"]


def _env():
    return {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}


@pytest.fixture(scope="module")
def resumed(runner):
    sweep_dir = runner.root / "sweeps" / "search"
    live = subprocess.Popen(
        _argv(runner, sweep_dir, *SEARCH),
        cwd=runner.root,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    seen = []
    for line in live.stdout:  # killed once the third trial (started when one of the first two ended) has checkpointed
        seen.append(line)
        reached = re.search(r"step (\d+)/600", line)
        if line.startswith("[#2]") and reached and int(reached.group(1)) >= 100:  # lines are paced: any at or past 100
            break
    run_id = (sweep_dir / "2" / "mlflow_run_id").read_text().strip()
    finished = {n for n in (0, 1) if (sweep_dir / ".runner" / f"job-{n}.json").exists()}  # the others: interrupted
    os.killpg(live.pid, signal.SIGKILL)
    live.wait(timeout=60)
    time.sleep(1)
    again = subprocess.run(
        _argv(runner, sweep_dir, *SEARCH), cwd=runner.root, env=_env(), capture_output=True, text=True, timeout=600
    )
    return "".join(seen), again, sweep_dir, run_id, finished


def test_a_killed_search_goes_on_where_it_stopped(resumed, runner):
    import optuna
    from mlflow import MlflowClient

    before, again, sweep_dir, run_id, finished = resumed
    assert "[#0]" in before and "[#1]" in before and again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "2 side by side" in before and finished, before[-3000:]  # #2 started when one of #0, #1 had ended
    assert "continuing the study" in again.stderr + again.stdout
    assert all(f"[#{n}]" not in again.stdout for n in finished)  # a finished trial is not run again
    assert f"resume={sweep_dir / '2'}" in again.stdout
    assert "resumed from checkpoint at step" in (sweep_dir / "2" / "runner.log").read_text()
    study = optuna.load_study(study_name="sweep", storage=f"sqlite:///{sweep_dir}/optuna.db")
    assert [(t.number, t.state.name) for t in study.trials] == [(0, "COMPLETE"), (1, "COMPLETE"), (2, "COMPLETE")]
    client = MlflowClient(runner.uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 3, [(r.info.run_name, r.info.status) for r in runs]
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parents[0].info.run_id}
    assert all(r.info.status == "FINISHED" for r in runs), [(r.info.run_name, r.info.status) for r in runs]
    (interrupted,) = [r for r in children if r.data.tags["sweep.job_num"] == "2"]
    assert interrupted.info.run_id == run_id  # its own MLflow run, continued
    for child in children:  # every logged step once, in the interrupted runs and the others
        steps = [m.step for m in client.get_metric_history(child.info.run_id, "loss")]
        assert sorted(steps) == list(range(20, 601, 20)), (child.data.tags["sweep.job_num"], steps)


def test_two_objectives_give_their_pareto_front(resumed):
    _, _, sweep_dir, _, _ = resumed
    results = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert results["objectives"] == ["eval/loss", "summary/examples_per_sec"]
    assert 1 <= len(results["solutions"]) <= 2 and all(len(s["values"]) == 2 for s in results["solutions"])


@pytest.mark.parametrize(
    "args,says",
    [
        (["train.global_batch_size=choice(16,32)"], "searched another space: train.global_batch_size differs"),
        (["hydra/sweeper/sampler=grid"], "learning_rate is a continuous interval, and hydra/sweeper/sampler=grid"),
        (["hydra/sweeper/sampler=gp"], "GPSampler needs PyTorch"),
        (["sweep.objective=accuracy"], "sweep.objective='accuracy': 'accuracy' is not a figure a run reports"),
        (["sweep.parallel=999"], "sweep.parallel=999: this machine has"),
    ],
)
def test_a_search_it_cannot_run_is_refused_before_any_trial(resumed, runner, args, says):
    _, _, sweep_dir, _, _ = resumed
    target = sweep_dir if "choice" in args[0] else runner.root / "sweeps" / f"refused-{len(args[0])}"
    done = subprocess.run(
        _argv(runner, target, *SEARCH, *args), cwd=runner.root, env=_env(), capture_output=True, text=True, timeout=120
    )
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error: ")]
    assert done.returncode == 2 and len(errors) == 1 and says in errors[0], done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "[#" not in done.stdout
