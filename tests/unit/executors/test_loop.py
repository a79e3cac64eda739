"""The one outer training loop (runner/executors/loop.py), in process, with a fake inner loop: no TensorFlow.

It checks what the loop owns for every custom-loop executor: call sizes, when the inner loop is synced, the
logging cadence, checkpoints, the loss check, resuming inside an epoch and stopping on a signal.
"""

import math
import signal
from types import SimpleNamespace

import pytest

from runner.control import stopping
from runner.errors import TrainingError
from runner.executors import loop
from runner.executors.base import Job
from runner.executors.profiling import Profile


class Reporter:
    def __init__(self):
        self.logged = []

    def log_metrics(self, values, step):
        self.logged.append((step, dict(values)))

    def deliver_soon(self):
        self.logged.append(("delivered", {}))


class Checkpoints:
    directory, last_step = "/nowhere", None

    def __init__(self, start=0):
        self.start, self.saved = start, []

    def restore(self):
        return self.start

    def save(self, step):
        self.saved.append(step)
        self.last_step = step

    def save_best(self, step):
        self.best = step

    def restore_best(self):
        self.restored = self.best
        return self.best


def make_job(
    epochs=2, spe=10, every=4, checkpoints=None, checkpoint_every=None, schedule=None, watch=None, restore_best=False, **recovery
):
    job = SimpleNamespace(
        data=SimpleNamespace(steps_per_epoch=spe, global_batch_size=8),
        train=SimpleNamespace(
            epochs=epochs,
            log_every_n_steps=every,
            optimizer=SimpleNamespace(learning_rate=0.1),
            recovery=SimpleNamespace(**{"max_recoveries": 0, "loss_upper_bound": None, **recovery}),
        ),
        reporter=Reporter(),
        checkpoints=checkpoints,
        checkpoint_every=checkpoint_every,
        parameter_server=True,
        multi_worker=False,
        cluster=None,
        strategy=None,  # StopGuard: no TF handler
        profile=Profile(None, None),  # train.profile_steps unset: no trace
        schedule=schedule,
        watch=watch,
        restore_best=restore_best,
    )
    job.learning_rate = lambda step: Job.learning_rate(job, step)
    job.restore = lambda: checkpoints.restore() if checkpoints else 0
    return job


class FakeTrainer(loop.Trainer):
    """Each step's loss is its global step number; records every call and sync."""

    description = "training with a fake loop"
    progress = "quiet"

    def __init__(self, steps_per_call, sync_every_call=True, losses=None):
        self.steps_per_call, self.sync_every_call = steps_per_call, sync_every_call
        self.losses = losses or {}
        self.step, self.calls, self.syncs, self.pending, self.reported = 0, [], [], [], []

    def train(self, num_steps):
        first = self.step + 1
        self.step += num_steps
        self.calls.append(num_steps)
        self.pending.append((num_steps, self.losses.get(self.step, (first + self.step) / 2)))

    def sync(self):
        self.syncs.append(self.step)
        done, self.pending = self.pending, []
        return done

    def report(self, loss, upto=None):
        self.reported.append(upto)
        return {"extra": 1.0}, ""

    def evaluate(self):
        return {"eval/loss": 0.5}


@pytest.fixture(autouse=True)
def clean_signals():
    handlers = {s: signal.getsignal(s) for s in stopping.EXIT_CODES}
    yield
    stopping._received.clear()
    for s, h in handlers.items():
        signal.signal(s, h)


def test_calls_are_cut_at_epoch_ends_logged_on_cadence_and_synced_after_each_call():
    job = make_job()
    trainer = FakeTrainer(steps_per_call=3)
    result = loop.run(job, trainer)
    assert trainer.calls == [3, 3, 3, 1] * 2 and trainer.syncs == [3, 6, 9, 10, 13, 16, 19, 20]
    delivered = job.reporter.logged.index(("delivered", {}))  # once, after the last step's values, before evaluation's
    assert job.reporter.logged.count(("delivered", {})) == 1
    assert job.reporter.logged[delivered - 1][0] == 20 and "loss" in job.reporter.logged[delivered - 1][1]
    assert "time/train_sec" in job.reporter.logged[delivered + 1][1]
    job.reporter.logged.remove(("delivered", {}))
    steps = [step for step, values in job.reporter.logged if "loss" in values]
    assert steps == [6, 10, 16, 20]  # every 4 steps or more, and each epoch's end
    step, values = job.reporter.logged[2]
    assert values["loss"] == pytest.approx(sum(range(11, 17)) / 6) and values["extra"] == 1.0  # the epoch's mean so far
    assert "throughput/window_examples_per_sec" in values
    assert (result.steps, result.final_loss, result.eval) == (20, pytest.approx(15.5), {"eval/loss": 0.5})
    assert job.reporter.logged[-1][0] == 20 and "time/train_sec" in job.reporter.logged[-1][1]


class StepLosses(FakeTrainer):
    """An inner loop that hands back each step's loss (the custom loop's): a call need not end at a logged step."""

    logs_inside = True

    def train(self, num_steps):
        first = self.step + 1
        super().train(num_steps)
        self.pending[-1:] = [(1, self.losses.get(s, float(s))) for s in range(first, self.step + 1)]


def test_each_logged_step_inside_a_call_is_logged_after_it_with_the_epochs_mean_loss_up_to_it():
    job = make_job(epochs=2, spe=10, every=4)
    trainer = StepLosses(steps_per_call=9)
    loop.run(job, trainer)
    assert trainer.calls == [9, 1] * 2
    logged = [(step, values) for step, values in job.reporter.logged if step != "delivered" and "loss" in values]
    assert [step for step, _ in logged] == [4, 8, 10, 14, 18, 20]  # on the cadence, not at the calls' ends
    means = [sum(range(1, 5)) / 4, sum(range(1, 9)) / 8, sum(range(1, 11)) / 10, sum(range(11, 15)) / 4]
    assert [v["loss"] for _, v in logged[:4]] == pytest.approx(means)
    assert trainer.reported == [4, 8, 1, 4, 8, 1]  # each logged step's place in its call
    # the throughput window ends with a call: logged with its last logged step (the first call is warm-up)
    assert ["throughput/window_examples_per_sec" in v for _, v in logged] == [False, False, True, False, True, True]


def test_a_blow_up_inside_a_call_is_named_at_its_step_after_the_logged_steps_before_it():
    job = make_job(epochs=1, spe=20, every=4, checkpoints=Restorable())
    with pytest.raises(TrainingError, match="became nan by step 14"):
        loop.run(job, StepLosses(steps_per_call=10, losses={14: math.nan}))
    assert [step for step, values in job.reporter.logged if "loss" in values] == [4, 8, 12]  # not 16 nor 20


def test_early_stopping_ends_training_at_the_epoch_it_decides_and_restores_the_best():
    from runner.executors.early_stopping import Watch

    class Evaluations(FakeTrainer):
        figures = iter([0.9, 0.5, 0.7, 0.6, 0.1, 0.0])  # best after epoch 2, then 2 epochs without improving

        def evaluate(self):
            return {"eval/loss": next(self.figures)}

    checkpoints = Checkpoints()
    watch = Watch(monitor="eval/loss", patience=2, keep_best=True)
    job = make_job(epochs=6, checkpoints=checkpoints, watch=watch, restore_best=True)
    trainer = Evaluations(steps_per_call=10)
    result = loop.run(job, trainer)
    assert trainer.calls == [10] * 4 and result.steps == 40  # stopped after epoch 4 of 6
    assert checkpoints.saved == [10, 20, 30, 40] and checkpoints.best == 20 and checkpoints.restored == 20
    evaluated = [(step, v["eval/loss"]) for step, v in job.reporter.logged if "eval/loss" in v]
    assert evaluated == [(10, 0.9), (20, 0.5), (30, 0.7), (40, 0.6), (40, 0.1)]  # each epoch, then the final one
    assert [v.get("best/step") for step, v in job.reporter.logged if "eval/loss" in v][:4] == [10.0, 20.0, 20.0, 20.0]


class Restorable(Checkpoints):
    def __init__(self, nan_weights_at_check=None):
        super().__init__()
        self.checks, self.nan_at = 0, nan_weights_at_check

    def restore(self):
        return self.last_step or 0

    def weights_finite(self):  # checked before a save, with recovery on
        self.checks += 1
        return self.checks != self.nan_at


def test_a_blown_up_loss_goes_back_to_the_last_checkpoint_and_trains_on():
    checkpoints = Restorable()
    job = make_job(epochs=3, checkpoints=checkpoints, max_recoveries=2, loss_upper_bound=100.0)
    # the fake's own step count goes on after a recovery: its calls end at 5, 10, ..., 25 (NaN), 30 (1e6), 35, ...
    trainer = FakeTrainer(steps_per_call=5, losses={25: math.nan, 30: 1e6})
    result = loop.run(job, trainer)
    recoveries = [(step, v["train/recoveries"]) for step, v in job.reporter.logged if "train/recoveries" in v]
    assert recoveries == [(25, 1.0), (25, 2.0)]  # twice from step 20: a NaN, then a loss above the bound
    assert checkpoints.saved == [10, 20, 30] and result.steps == 30 and trainer.calls == [5] * 8
    assert all(math.isfinite(v["loss"]) for _, v in job.reporter.logged if "loss" in v)  # no blown-up point logged


def test_weights_made_nan_by_a_finite_loss_are_caught_before_the_checkpoint_and_recovered():
    checkpoints = Restorable(nan_weights_at_check=2)  # the update of step 20 (loss finite) made the weights NaN
    job = make_job(epochs=3, checkpoints=checkpoints, max_recoveries=1)
    result = loop.run(job, FakeTrainer(steps_per_call=10))
    assert checkpoints.saved == [10, 20, 30] and result.steps == 30  # 20 saved only after it was trained again
    assert [step for step, v in job.reporter.logged if "train/recoveries" in v] == [20]


@pytest.mark.parametrize(
    "recovery, losses, said",
    [
        ({"max_recoveries": 1}, {15: math.nan, 20: math.nan}, "became nan by step 15 after 1 recovery(ies) from a checkpoint"),
        ({"loss_upper_bound": 10.0}, {15: 11.0}, "rose to 11, above train.recovery.loss_upper_bound=10, by step 15"),
        ({"max_recoveries": 3}, {5: math.nan}, "became nan by step 5; training stopped. No checkpoint had been written yet"),
    ],
)
def test_past_its_recoveries_or_without_a_checkpoint_the_run_stops_naming_them(recovery, losses, said):
    job = make_job(epochs=3, checkpoints=Restorable(), **recovery)
    with pytest.raises(TrainingError) as err:
        loop.run(job, FakeTrainer(steps_per_call=5, losses=losses))
    assert said in str(err.value)


def test_a_scheduled_rate_is_logged_beside_the_loss_as_the_rate_of_the_steps_last_update():
    job = make_job(schedule=lambda step: 0.01 * step)
    loop.run(job, FakeTrainer(steps_per_call=3))
    logged = [(step, values["train/learning_rate"]) for step, values in job.reporter.logged if "loss" in values]
    assert logged == [(6, pytest.approx(0.05)), (10, pytest.approx(0.09)), (16, pytest.approx(0.15)), (20, pytest.approx(0.19))]
    assert "train/learning_rate" not in make_job().learning_rate(6)  # no schedule: no metric


def test_an_asynchronous_inner_loop_is_synced_only_to_log_or_checkpoint():
    checkpoints = Checkpoints()
    job = make_job(epochs=1, spe=12, every=6, checkpoints=checkpoints, checkpoint_every=4)
    trainer = FakeTrainer(steps_per_call=2, sync_every_call=False)
    loop.run(job, trainer)
    assert trainer.calls == [2] * 6
    assert trainer.syncs == [4, 6, 8, 12] and checkpoints.saved == [4, 8, 12]
    assert [step for step, values in job.reporter.logged if "loss" in values] == [6, 12]


def test_a_non_finite_loss_stops_training_naming_the_step_and_the_last_checkpoint():
    checkpoints = Checkpoints()
    job = make_job(checkpoints=checkpoints, checkpoint_every=5)
    with pytest.raises(TrainingError, match=r"the training loss became nan by step 9; .* last good checkpoint \(step 6\)"):
        loop.run(job, FakeTrainer(steps_per_call=3, losses={9: math.nan}))
    assert checkpoints.saved == [6]


def test_a_resumed_run_starts_inside_its_epoch():
    job = make_job(checkpoints=Checkpoints(start=13))
    trainer = FakeTrainer(steps_per_call=4)
    trainer.step = 13
    result = loop.run(job, trainer)
    assert trainer.calls == [4, 3] and result.steps == 20
    assert job.checkpoints.saved == [20]  # no checkpoint.every_n_steps: each epoch's end


def test_a_run_resumed_off_the_logging_grid_logs_on_it():
    job = make_job(checkpoints=Checkpoints(start=11))  # stopped 1 step into epoch 2 (logged at 4, 8, 10 before)
    trainer = FakeTrainer(steps_per_call=1)
    trainer.step = 11
    loop.run(job, trainer)
    assert [step for step, values in job.reporter.logged if "loss" in values] == [14, 18, 20]  # not 15, 19


def test_a_stop_request_saves_at_the_next_sync_and_stops():
    checkpoints = Checkpoints()
    job = make_job(checkpoints=checkpoints)

    class Signalled(FakeTrainer):
        def train(self, num_steps):
            super().train(num_steps)
            if self.step == 4:
                stopping._received.append(signal.SIGTERM)

    trainer = Signalled(steps_per_call=2, sync_every_call=False)
    with pytest.raises(stopping.Stopped, match="at step 4: checkpoint written at step 4"):
        loop.run(job, trainer)
    assert trainer.syncs == [4] and checkpoints.saved == [4]
