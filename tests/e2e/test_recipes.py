"""Training recipes through `python -m runner`: early stopping with the best checkpoint (both executors), and loss
blow-up recovery (the custom loop).

Early stopping monitors eval/accuracy with mode=min, a choice that makes the first evaluation the best one on this
data (accuracy rises from the first epoch): training must stop `patience` evaluations later, and the run must end
with the first epoch's weights, not its last ones. Recovery trains on data with one outlier whose batch's loss is far
above train.recovery.loss_upper_bound in every pass over the data: each time, the run goes back one step (a
checkpoint every step) and trains on past it."""

import numpy as np
import pytest

from helpers import mlflow_run_by_name

pytestmark = pytest.mark.slow  # end to end: two runs of `python -m runner`

EXPERIMENT = "early_stopping"
WATCHED = [
    "data.num_examples=512",
    "data.eval_examples=128",
    "train.global_batch_size=64",
    "train.epochs=6",  # 8 steps each
    "train.early_stopping.patience=2",
    "train.early_stopping.monitor=eval/accuracy",
    "train.early_stopping.mode=min",
    "checkpoint.keep_best=true",
    "checkpoint.restore_best=true",
    f"mlflow.experiment_name={EXPERIMENT}",
]
RUNS = {"fit": ["strategy=mirrored", "devices.logical_cpus=2", "executor=fit"], "custom_loop": ["executor=custom_loop"]}
BOUND = 1000.0


@pytest.fixture(scope="module")
def runs(runner, tmp_path_factory):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 20)).astype("float32")
    y = x[:, :1] * 0.5
    y[100] = 1e4  # one example: its batch's mean squared error is above 1e6
    path = tmp_path_factory.mktemp("outlier") / "outlier.npz"
    np.savez(path, x_train=x, y_train=y, x_eval=x[:64], y_eval=x[:64, :1] * 0.5)
    recovering = [
        "executor=custom_loop",
        "data=npz",
        f"data.path={path}",
        "data.task=regression",
        "train.global_batch_size=64",
        "train.epochs=3",
        "checkpoint.every_n_steps=1",
        "train.recovery.max_recoveries=10",
        f"train.recovery.loss_upper_bound={BOUND}",
        "train.log_every_n_steps=1",
        f"mlflow.experiment_name={EXPERIMENT}",
    ]
    jobs = {**{name: [*args, *WATCHED] for name, args in RUNS.items()}, "recovery": recovering}
    done = runner.many(jobs)
    for name, result in done.items():
        assert result.returncode == 0, f"{name} failed:\n{result.output[-3000:]}"
    return done


def _history(runner, name, key):
    client, run = mlflow_run_by_name(runner.uri, EXPERIMENT, name)
    return run, [(m.step, m.value) for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)]


@pytest.mark.parametrize("executor", list(RUNS))
def test_training_stops_patience_evaluations_after_the_best_and_ends_with_its_weights(runs, runner, executor):
    result = runs[executor]
    said = "early stopping at step 24: eval/accuracy has not improved by more than 0.0 for 2 evaluation(s)"
    assert said in result.output and "best eval/accuracy=" in result.output, result.output[-3000:]
    assert "restored the best checkpoint (step 8)" in result.output
    run, accuracy = _history(runner, executor, "eval/accuracy")
    assert run.info.status == "FINISHED"
    epochs, final = accuracy[:-1], accuracy[-1]
    assert [step for step, _ in epochs] == [8, 16, 24]  # one evaluation per epoch, none after the stop
    assert epochs[0][1] < epochs[1][1] < epochs[2][1]  # accuracy rose, so the first is the lowest
    assert final == (24, pytest.approx(epochs[0][1], abs=1e-6))  # the final evaluation is the best checkpoint's
    assert run.data.metrics["best/eval/accuracy"] == pytest.approx(epochs[0][1]) and run.data.metrics["best/step"] == 8
    checkpoints = result.run_dir / "checkpoints"
    assert sorted(p.name for p in (checkpoints / "best").glob("*.index")) == ["ckpt-8.index"]
    assert (checkpoints / "ckpt-24.index").exists() and not (checkpoints / "ckpt-32.index").exists()  # resume: from 24


def test_the_epoch_evaluations_of_both_executors_agree(runs, runner):
    """Model.fit's evaluate and the custom loop's evaluator give the same figures at every epoch: the custom loop's
    metrics start afresh for each evaluation (the same weights: mirrored x2 and the default strategy agree)."""
    _, fit = _history(runner, "fit", "eval/loss")
    _, loop = _history(runner, "custom_loop", "eval/loss")
    assert [s for s, _ in fit] == [s for s, _ in loop] == [8, 16, 24, 24]
    for (_, a), (_, b) in zip(fit, loop):
        assert a == pytest.approx(b, rel=1e-5)


def test_a_loss_above_its_bound_goes_back_a_step_and_the_run_trains_on_past_it(runs, runner):
    result = runs["recovery"]
    client, run = mlflow_run_by_name(runner.uri, EXPERIMENT, "recovery")
    assert run.info.status == "FINISHED"
    recoveries = client.get_metric_history(run.info.run_id, "train/recoveries")
    # one outlier per pass over the data (8 batches), 3 epochs of 8 steps: 3 or 4 passes are read
    assert 3 <= len(recoveries) <= 4 and max(m.value for m in recoveries) == len(recoveries), recoveries
    assert result.output.count("back to the checkpoint of step") == len(recoveries)
    _, losses = _history(runner, "recovery", "loss")
    assert [s for s, _ in losses] == list(range(1, 25)) and all(v < BOUND for _, v in losses)  # every step, none blown up
    assert run.data.metrics["eval/loss"] < 1.0
