"""The one outer training loop, for every custom-loop executor (Orbit's Controller / StandardTrainer split).

`run(job, trainer)` owns what is the same whatever runs the steps: restore, the throughput meter, epochs, how
many steps each call runs, the logging cadence, the loss check, checkpoints, stop requests (SIGINT/SIGTERM) and
the end of training (evaluation, whole-run figures, the Result). A Trainer supplies only the inner part: run (or
schedule) N steps, hand back their losses, evaluate. The in-process custom loop (custom_loop.py) and the
parameter-server coordinator (ps_loop.py) are the two Trainers; Model.fit has its own loop (fit.py).
"""

import itertools
import time

from runner.control import stopping
from runner.executors.base import (
    RUN_RATE,
    Job,
    ProgressLines,
    Result,
    Throughput,
    check_loss,
    last_log_point,
    log,
    logged_steps,
    loss_blown_up,
    progress_line,
    recover,
    training_ended,
)
from runner.executors.early_stopping import after_epoch, restore_best
from runner.tracking import phases


class Trainer:
    """The inner loop. Subclasses set the attributes and implement train, sync and evaluate."""

    description = ""  # the log line that starts training
    replicas = 1  # for examples/sec per replica
    progress = "lines"  # bar | lines | quiet (base.progress_mode)
    steps_per_call = 1  # the most steps one train() call runs
    sync_every_call = True  # wait for each call: check its loss, poll for stop requests after every call
    logs_inside = False  # sync() hands back each step's loss: the logged steps inside a call are logged after it

    def begin(self, step: int) -> None:
        """Right before the first call, inside the training time (e.g. start the input iterator at global step
        `step`, the restored checkpoint's)."""

    def train(self, num_steps: int) -> None:
        """Run, or schedule, num_steps training steps."""
        raise NotImplementedError

    def sync(self) -> list[tuple[int, float]]:
        """Wait for every call since the last sync: (steps, mean loss) for each of them (logs_inside: (1, loss) for
        each step, in order)."""
        raise NotImplementedError

    def epoch_begin(self) -> None:
        """At each epoch's start (a resumed one's too): train.metrics start afresh, as Model.fit's do."""

    def report(self, loss: float, upto: int | None = None) -> tuple[dict[str, float], str]:
        """At a logged step: metrics beside `loss` and the throughput, and text for the end of the progress line.
        `upto` (logs_inside): the logged step is the last call's `upto`-th."""
        return {}, ""

    def end(self) -> None:
        """After the last step: wait for anything still running."""

    def evaluate(self) -> dict[str, float]:
        """{'eval/...': value} on the eval split."""
        raise NotImplementedError


class Progress:
    """A Keras progress bar on a terminal (mode bar); otherwise one log line every train.log_every_n_steps
    steps (lines; paced: at most one a second), or nothing (quiet)."""

    def __init__(self, mode: str, steps_per_epoch: int, epochs: int):
        self.mode, self.spe, self.epochs, self.bar = mode, steps_per_epoch, epochs, None
        self.lines = ProgressLines(mode, epochs * steps_per_epoch)

    def epoch(self, epoch: int) -> None:
        if self.mode == "bar":
            import tf_keras

            print(f"Epoch {epoch + 1}/{self.epochs}")
            self.bar = tf_keras.utils.Progbar(self.spe, stateful_metrics=["loss"])

    def update(self, done: int, loss: float) -> None:
        if self.bar is not None:
            self.bar.update(done, values=[("loss", loss)])

    def line(self, epoch: int, done: int, loss: float, rates, suffix: str = "") -> None:
        text = lambda: progress_line(epoch + 1, self.epochs, done, self.spe, loss, rates) + suffix  # noqa: E731
        self.lines.show(epoch * self.spe + done, text)


def checkpoint_due(job: Job, step: int, epoch_end: bool, last_saved: int) -> bool:
    if not job.checkpoints:
        return False
    if job.checkpoint_every:
        return step - last_saved >= job.checkpoint_every or (epoch_end and step == job.train.epochs * job.data.steps_per_epoch)
    return epoch_end


def finish(job: Job, meter: Throughput, step: int, epoch_loss: float, train_sec: float, evaluate) -> Result:
    """Evaluate (evaluate() -> {'eval/...': value}), report the eval and whole-run figures, build the Result."""
    started = time.perf_counter()
    results = evaluate()
    phases.mark("evaluation")
    log.info("evaluation: %s (%.1fs)", ", ".join(f"{k}={v:.4f}" for k, v in results.items()), time.perf_counter() - started)
    summary = meter.summary(train_sec)
    job.reporter.log_metrics({**results, **summary}, step)
    return Result(step, epoch_loss, results, meter.overall().get(RUN_RATE), summary)


def run(job: Job, trainer: Trainer) -> Result:
    """Train job.train.epochs epochs from the latest checkpoint's step, then evaluate.

    A call's steps are synced (waited for, their losses read) after every call when the trainer says so, and
    otherwise only when metrics are logged, a checkpoint is due or a stop was requested: variables and losses
    are final at a sync, so the loss check, checkpoints and stop requests happen there.
    """
    data = job.data
    spe, epochs, every = data.steps_per_epoch, job.train.epochs, job.train.log_every_n_steps
    meter = Throughput(data.global_batch_size, trainer.replicas)
    progress = Progress(trainer.progress, spe, epochs)
    step = last_saved = job.restore()
    log.info(trainer.description)
    meter.start()
    started = time.perf_counter()
    trainer.begin(step)
    epoch_loss = float("nan")
    stopped_early, recovered = False, 0

    def log_step(epoch: int, done: int, loss: float, upto: int | None, rates: dict, logged: bool) -> None:
        """Report a logged step. `rates`: the throughput of the window that ended with the call; logged to MLflow
        (`logged`) with the call's last logged step only, shown on each of its progress lines."""
        extra, suffix = trainer.report(loss, upto)
        at = epoch * spe + done
        job.reporter.log_metrics({"loss": loss, **extra, **(rates if logged else {}), **job.learning_rate(at)}, at)
        progress.line(epoch, done, loss, rates, suffix)

    with stopping.StopGuard(job) as guard:
        epoch = step // spe
        while epoch < epochs and not stopped_early:
            done = step - epoch * spe
            loss_sum, counted, logged_at = 0.0, 0, last_log_point(done, every)
            progress.epoch(epoch)
            trainer.epoch_begin()
            meter.resume()
            back = None  # the step of the checkpoint a blown-up loss went back to (train.recovery)
            while done < spe:
                n = min(trainer.steps_per_call, spe - done)
                job.profile.before(step + 1, n)
                trainer.train(n)
                done, step = done + n, step + n
                job.profile.after(step)
                due_log = done - logged_at >= every or done == spe
                due_ckpt = checkpoint_due(job, step, done == spe, last_saved)
                if not (trainer.sync_every_call or due_log or due_ckpt or stopping.requested()):
                    continue
                synced = trainer.sync()
                before, counted_before = loss_sum, counted
                for k, loss in synced:
                    loss_sum, counted = loss_sum + loss * k, counted + k
                epoch_loss = loss_sum / counted
                worst = max((loss for _, loss in synced), key=lambda v: (v != v, v))  # NaN first: the one to catch
                blown_at, inside = step, None
                if trainer.logs_inside:  # each step's loss: the logged steps before a blow-up are logged, it is named
                    start = done - n
                    inside = list(itertools.accumulate((loss for _, loss in synced), initial=before))
                    bad = next((i for i, (_, loss) in enumerate(synced) if loss_blown_up(job, loss)), None)
                    if bad is not None:
                        blown_at = step - n + bad + 1
                        for at in logged_steps(start, start + bad, logged_at, every, spe):
                            log_step(epoch, at, inside[at - start] / (counted_before + at - start), at - start, {}, False)
                            logged_at = at
                if due_ckpt and job.train.recovery.max_recoveries and not job.checkpoints.weights_finite():
                    worst = float("nan")  # a finite loss whose update made the weights NaN: not a checkpoint to keep
                back = recover(job, worst, blown_at, recovered)
                if back is not None:
                    break
                check_loss(job, epoch_loss, step)
                meter.tick(step)
                progress.update(done, epoch_loss)
                if inside is not None:  # every logged step of the call, each with the epoch's mean loss up to it
                    points = logged_steps(start, done, logged_at, every, spe)
                    rates = meter.window() if points else {}
                    for at in points:
                        loss = inside[at - start] / (counted_before + at - start)
                        log_step(epoch, at, loss, at - start, rates, logged=at == points[-1])
                        logged_at = at
                elif due_log:
                    logged_at = done
                    log_step(epoch, done, epoch_loss, None, meter.window(), logged=True)
                if done == spe:
                    meter.pause()  # the checkpoint and the next epoch's start are not a step's time
                if due_ckpt:
                    job.checkpoints.save(step)
                    last_saved = step
                if done == spe and after_epoch(job, step, trainer.evaluate):
                    stopped_early = True
                    if job.checkpoints and last_saved != step:  # a resume then starts where it stopped
                        job.checkpoints.save(step)
                        last_saved = step
                    break
                guard.check(step)
            if back is not None:  # on from the checkpoint's step, inside its epoch
                step = last_saved = back
                recovered += 1
                epoch = step // spe
                continue
            epoch += 1
    progress.lines.end()  # the last line, when training stopped before its last step
    trainer.end()
    train_sec = time.perf_counter() - started
    training_ended(job)
    restore_best(job, job.restore_best)
    return finish(job, meter, step, epoch_loss, train_sec, trainer.evaluate)
