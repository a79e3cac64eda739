"""What every executor takes and returns, and the throughput meter they share."""

from __future__ import annotations

import logging
import math
import os
import sys
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import runner
from runner import tf_private
from runner.control import ahead, contract, pace, teardown
from runner.errors import TrainingError
from runner.executors.profiling import Profile
from runner.tracking import phases

if TYPE_CHECKING:  # the types Job holds: TensorFlow's, imported only for the annotations
    import keras
    import tensorflow as tf
    import tf_keras
    from omegaconf import DictConfig

    from runner.builders.cluster import Cluster
    from runner.builders.data.pipeline import Data
    from runner.control.trial_report import TrialReport
    from runner.executors.checkpoints import Checkpoints
    from runner.executors.early_stopping import Watch

log = logging.getLogger("runner")


class Reporter(Protocol):
    def log_metrics(self, values: dict[str, float], step: int) -> None: ...

    def deliver_soon(self) -> None: ...


@dataclass
class Job:
    strategy: tf.distribute.Strategy
    model: tf_keras.Model | keras.Model  # built inside strategy.scope(); Keras 3: runner.builders.keras_flavor
    optimizer: tf_keras.optimizers.Optimizer | keras.optimizers.Optimizer  # the model's Keras', inside strategy.scope()
    loss: str | dict  # mse | binary_crossentropy | sparse_categorical_crossentropy, or a user's {_target_: ...}
    data: Data
    train: DictConfig  # the train config node
    executor: DictConfig  # the executor config node
    reporter: Reporter
    cluster: Cluster | None = None
    checkpoints: Checkpoints | None = None  # None when checkpointing is off
    checkpoint_every: int | None = None  # steps; None: each epoch end
    profile: Profile = field(default_factory=lambda: Profile(None, None))  # train.profile_steps' trace (none: off)
    schedule: Callable[[int], float] | None = None  # global step -> learning rate, when one is scheduled
    watch: Watch | None = None  # evaluations after each epoch: early stopping, the best checkpoint (None: neither)
    restore_best: bool = False  # checkpoint.restore_best: end with the best checkpoint's weights
    trial: TrialReport | None = None  # a trial of a pruning search: its evaluations go to the sweep (None: not one)

    @property
    def metrics(self) -> list[dict]:
        """train.metrics: the user's metric nodes (runner.builders.metrics), as plain dicts."""
        from runner.builders.metrics import specs_of

        return specs_of(self.train.get("metrics"))

    def learning_rate(self, step: int) -> dict[str, float]:
        """train/learning_rate at a logged step: the rate its last update used (nothing without a schedule)."""
        return {} if self.schedule is None else {"train/learning_rate": self.schedule(max(0, step - 1))}

    @property
    def keras(self):
        """The model's Keras module (tf_keras or keras), whose losses go with it."""
        from runner.builders.keras_flavor import keras_of

        return keras_of(self.model)

    @property
    def replicas(self) -> int:
        return self.strategy.num_replicas_in_sync

    @property
    def multi_worker(self) -> bool:
        return self.cluster is not None and self.cluster.num_workers > 1

    @property
    def progress(self) -> str:
        """How this task shows progress (progress_mode): the task that logs the run shows it for the cluster, the
        other workers of a cluster keep quiet (the same steps, once per worker, told nothing new)."""
        reports = self.cluster is None or not self.multi_worker or self.cluster.is_chief
        return progress_mode(self.executor.verbose) if reports else "quiet"

    @property
    def parameter_server(self) -> bool:
        import tensorflow as tf

        return isinstance(self.strategy, tf.distribute.experimental.ParameterServerStrategy)

    def restore(self) -> int:
        """Global step to start from: the latest checkpoint's, or 0."""
        step = self.checkpoints.restore() if self.checkpoints else 0
        if step:
            log.info("resumed from checkpoint at step %d in %s", step, self.checkpoints.directory)
        return step


@dataclass
class Result:
    steps: int
    final_loss: float
    eval: dict[str, float] = field(default_factory=dict)
    examples_per_sec: float | None = None
    summary: dict[str, float] = field(default_factory=dict)


def concrete_per_iterator(fn):
    """Call the tf.function `fn(iterator, *tensors)` through the graph traced for that iterator, with flat inputs.

    Same graph, same results. What it skips is the Python that every call of a tf.function, or of its concrete
    function, spends matching the arguments to the signature and flattening the iterator into its resource
    handles: a large share of a short step, more so for a distributed iterator (docs/dev/benchmarks.md). The
    iterator's handles are the same for its whole life, so they are flattened once (tf_private.flat_caller).
    The iterator is kept until the process ends (runner.control.teardown: destroying it can block for seconds).
    """
    bound = {}

    def bind(iterator, args):
        bound.clear()
        try:
            ref = weakref.ref(iterator, lambda _: bound.clear())
        except TypeError:  # not weak-referenceable: keep tf.function's own dispatch
            return None
        teardown.keep(iterator)
        concrete = fn.get_concrete_function(iterator, *args)
        caller = tf_private.flat_caller(concrete, iterator, args) or concrete
        bound.update(ref=ref, caller=caller)
        return caller

    def call(iterator, *args):
        ref = bound.get("ref")
        caller = bound["caller"] if ref is not None and ref() is iterator else bind(iterator, args)
        return fn(iterator, *args) if caller is None else caller(iterator, *args)

    return call


def replica_metrics(values: Sequence[float]) -> dict[str, float]:
    return {f"loss/replica_{i}": float(v) for i, v in enumerate(values)}


WINDOW_RATE = "throughput/window_examples_per_sec"  # over the steps since the last logged step: a chart
RUN_RATE = "summary/examples_per_sec"  # over the whole run after its first call: the figure runs are compared by


class Throughput:
    """Examples/sec after warm-up: the first tick (tracing, first batch) is timed apart as time/first_step_sec.
    The names say which span a figure covers (a window, or the whole run), so two figures never share a name."""

    def __init__(self, global_batch_size: int, replicas: int):
        self.gbs, self.replicas = global_batch_size, replicas
        self.first_step_sec: float | None = None
        self._start = self._warm_time = self._window_time = None
        self._warm_step = self._window_step = 0
        self._last_time, self._last_step = None, 0
        self._paused_at = None

    def pause(self) -> None:
        """At an epoch's end: what happens until resume() (checkpoints, a new input iterator) is not a step's time."""
        self._paused_at = time.perf_counter()

    def resume(self) -> None:
        """At the next epoch's start: the window's rates leave the pause out (else every epoch's first window dips
        and the throughput chart is saw-toothed); the whole-run figures keep it, as wall time of training."""
        if self._paused_at is not None and self._window_time is not None:
            self._window_time += time.perf_counter() - self._paused_at
        self._paused_at = None

    def start(self) -> None:
        self._start = time.perf_counter()

    def tick(self, step: int) -> None:
        now = time.perf_counter()
        if self.first_step_sec is None:
            self.first_step_sec = now - self._start
            phases.mark(phases.FIRST_STEP)  # tracing included
            ahead.hold()  # a sweep's next job, started ahead: still while the steps are timed
            self.to_first_step_sec = now - runner.STARTED
            self._warm_time = self._window_time = now
            self._warm_step = self._window_step = step
        self._last_time, self._last_step = now, step

    def _rates(self, prefix: str, since_time, since_step) -> dict[str, float]:
        steps = self._last_step - since_step
        if self._last_time is None or steps <= 0:
            return {}
        seconds = self._last_time - since_time
        eps = steps * self.gbs / seconds
        return {
            f"{prefix}examples_per_sec": eps,
            f"{prefix}examples_per_sec_per_replica": eps / self.replicas,
            f"{prefix}step_time_ms": 1000.0 * seconds / steps,
        }

    def window(self) -> dict[str, float]:
        """throughput/window_* since the last window, then start a new one."""
        rates = self._rates("throughput/window_", self._window_time, self._window_step)
        if rates:
            self._window_time, self._window_step = self._last_time, self._last_step
        return rates

    def overall(self) -> dict[str, float]:
        """summary/* from the end of the first call to the last tick."""
        return self._rates("summary/", self._warm_time, self._warm_step)

    def summary(self, train_sec: float | None = None) -> dict[str, float]:
        """Whole-run figures for comparing runs: summary/examples_per_sec ..., time/first_step_sec, and
        time/train_sec, the wall time of training: from the training call to the end of its last epoch (first step,
        tracing and checkpoints included; the input pipeline's teardown after that is not)."""
        out = self.overall()
        if train_sec is not None:
            out["time/train_sec"] = train_sec
        if self.first_step_sec is not None:
            out["time/first_step_sec"] = self.first_step_sec
            out["time/to_first_step_sec"] = self.to_first_step_sec  # from process start: imports, set-up, tracing
        return out


def training_ended(job: Job) -> None:
    """Either executor, after its last step: the phase's mark; a held spare goes on; what was logged during training
    is delivered now, beside the evaluation and the save."""
    phases.mark("train")
    ahead.release()
    job.reporter.deliver_soon()


def nothing_left(result: Result, run, global_batch_size: int, replicas: int) -> Result:
    """An attempt that resumed at the run's last step (the one before was killed after its last checkpoint) trained
    nothing: the run still ends with its figures, the last training loss and the throughput that earlier attempts
    logged (`run.earlier`, from MLflow), and its evaluation and summary logged at that step."""
    earlier = getattr(run, "earlier", None) or {}
    summary = dict(earlier.get("summary") or {}) or windows_summary(earlier.get("windows") or [], global_batch_size, replicas)
    loss = earlier.get("loss")
    final = float(loss[1]) if loss and loss[0] == result.steps else result.final_loss
    log.info(
        "nothing left to train: the checkpoint is at the last step (%d); %s",
        result.steps,
        "the final loss and throughput are those the earlier attempt logged"
        if not math.isnan(final)
        else "the earlier attempt's final loss is not known here (no MLflow run holds it)",
    )
    run.log_end({**result.eval, **summary}, result.steps)
    rate = summary.get("summary/examples_per_sec")
    return Result(result.steps, final, result.eval, rate, summary)


def earlier_rate(result: Result, run, global_batch_size: int, replicas: int) -> Result:
    """An attempt that resumed within one call of the run's end timed no step after its first call (warm-up,
    tracing): the run's summary/ throughput is then the one its earlier attempts' windows give (`run.earlier`), logged
    at its last step, as for an attempt with nothing left to train. Unchanged when none was logged."""
    earlier = getattr(run, "earlier", None) or {}
    summary = windows_summary(earlier.get("windows") or [], global_batch_size, replicas)
    if not summary:
        return result
    log.info("this attempt timed only its first call: the run's throughput is the one its earlier attempts logged")
    run.log_end(summary, result.steps)
    rate = summary["summary/examples_per_sec"]
    return Result(result.steps, result.final_loss, result.eval, rate, {**result.summary, **summary})


def windows_summary(windows: Sequence, global_batch_size: int, replicas: int) -> dict[str, float]:
    """summary/ figures from the throughput windows a run logged, [step, examples/s] each: the examples over the
    time they took (each window's steps at its own rate), as Throughput.summary gives them from its clock."""
    points = sorted((int(s), float(r)) for s, r in windows if r and r > 0)
    if not points:
        return {}
    steps = [b[0] - a[0] for a, b in zip(points, points[1:])]
    steps = [steps[0] if steps else 1, *steps]  # the first window's start is not logged: as long as the next
    seconds = sum(n * global_batch_size / rate for n, (_, rate) in zip(steps, points))
    eps = sum(steps) * global_batch_size / seconds
    return {
        "summary/examples_per_sec": eps,
        "summary/examples_per_sec_per_replica": eps / replicas,
        "summary/step_time_ms": 1000.0 * global_batch_size / eps,
    }


def done_line(result: Result, summary: dict[str, float]) -> str:
    """The last line of a run, also read by benchmarks/run.py."""
    parts = [f"done: {result.steps} steps, final loss {result.final_loss:.4f}"]
    parts += [f"{k}={v:.4f}" for k, v in result.eval.items()]
    if "time/train_sec" in summary:
        rate = summary.get("summary/examples_per_sec")
        after = f" ({rate:,.0f} examples/s after the first call)" if rate else ""
        parts.append(f"training {summary['time/train_sec']:.3f}s{after}")
    if "time/to_first_step_sec" in summary:
        parts.append(f"first step after {summary['time/to_first_step_sec']:.2f}s")
    return ", ".join(parts)


def progress_mode(verbose) -> str:
    """executor.verbose as bar (Keras' progress bar: a terminal, or 1), lines (one log line every
    train.log_every_n_steps steps: 2, or a task under a launcher, which reads its steps from them and paces what it
    shows), paced (those lines at most one a second, runner.control.pace: no terminal) or quiet (0). A task under a
    launcher prints every line whatever executor.verbose says: they are the launcher's record of its steps (an
    elastic resize counts the steps redone from them), and the launcher shows them as executor.verbose says."""
    if os.environ.get(contract.TASK_ROLE):
        return "lines"
    if str(verbose) == "auto":
        return "bar" if sys.stdout.isatty() else "paced"
    return {"0": "quiet", "1": "bar", "2": "lines"}[str(verbose)]


class ProgressLines:
    """The progress lines of lines or paced mode (progress_mode): paced, the line of a step not shown is kept, and
    end() shows it when training stopped before its last step (early stopping), so the last line is always there."""

    def __init__(self, mode: str, last_step: int):
        self.mode, self.last_step = mode, last_step
        self.pace = pace.Pace() if mode == "paced" else None
        self.held: str | None = None

    def show(self, step: int, text) -> None:
        """`text()`, the line of `step`, logged now or held."""
        if self.mode == "lines" or (self.pace is not None and self.pace.due(last=step >= self.last_step)):
            log.info(text())
            self.held = None
        elif self.pace is not None:
            self.held = text

    def end(self) -> None:
        if self.held is not None:
            log.info(self.held())
            self.held = None


def epochs_text(n: int) -> str:
    return f"{n} epoch" if n == 1 else f"{n} epochs"


def accumulation_text(train) -> str:
    """What the training log line says of train.accumulation_steps (nothing without accumulation)."""
    k = train.accumulation_steps
    return f", {k} micro-batches per update" if k > 1 else ""


def last_log_point(done: int, every: int) -> int:
    """Where the logging of an epoch resumed after `done` steps stands: the grid line at or before it (metrics go
    every train.log_every_n_steps steps from the epoch's start). A run stopped at step 513 then logs at 544, 576 as
    an uninterrupted one does, not at 545, 577: charts have no seam and steps compare across runs."""
    return done - done % every


def logged_steps(start: int, done: int, logged_at: int, every: int, spe: int) -> list[int]:
    """The steps of an epoch in (start, done] to log: every `every` steps after `logged_at`, and the epoch's last."""
    points = list(range(logged_at + every, done + 1, every))
    if done == spe and (not points or points[-1] != spe):
        points.append(spe)
    return [p for p in points if p > start]


def progress_line(epoch: int, epochs: int, step: int, steps: int, loss: float, rates: dict[str, float]) -> str:
    eps = rates.get(WINDOW_RATE)
    speed = f" {eps:,.0f} examples/s" if eps else ""
    return f"epoch {epoch}/{epochs} step {step}/{steps} loss {loss:.4f}{speed}"


def loss_blown_up(job: Job, loss: float) -> bool:
    """NaN, inf, or above train.recovery.loss_upper_bound."""
    bound = job.train.recovery.loss_upper_bound
    return not math.isfinite(loss) or (bound is not None and loss > bound)


def check_loss(job: Job, loss: float, step: int, recovered: int = 0) -> None:
    """Stop with a clear error when the loss is NaN, infinite or above its bound; the last good checkpoint stays as it
    is. `recovered`: how many times the custom loop went back to a checkpoint before (train.recovery)."""
    if not loss_blown_up(job, loss):
        return
    last = job.checkpoints.last_step if job.checkpoints else None
    kept = (
        f"The last good checkpoint (step {last}) is kept in {job.checkpoints.directory}. "
        if last is not None
        else "No checkpoint had been written yet. "
    )
    bound = job.train.recovery.loss_upper_bound
    what = (
        f"became {loss}" if not math.isfinite(loss) else f"rose to {loss:.6g}, above train.recovery.loss_upper_bound={bound:g},"
    )
    most = job.train.recovery.max_recoveries
    tried = f" after {recovered} recovery(ies) from a checkpoint (train.recovery.max_recoveries={most})" if recovered else ""
    opt = job.train.optimizer
    own = getattr(getattr(opt, "schedule", None), "_target_", None)
    rate = f"train.optimizer.learning_rate (now {opt.learning_rate:g})"
    if own:
        rate = f"the rates of train.optimizer.schedule._target_={own}"
    raise TrainingError(
        f"the training loss {what} by step {step}{tried}; training stopped. {kept}Lower {rate}, or check the data for "
        "NaN/inf values."
    )


def recover(job: Job, loss: float, step: int, recovered: int) -> int | None:
    """train.recovery: the step of the last good checkpoint, restored, when the loss blew up and a recovery is left;
    None when it did not blow up. Raises check_loss's error when none is left."""
    if not loss_blown_up(job, loss):
        return None
    checkpoints = job.checkpoints
    if recovered >= job.train.recovery.max_recoveries or not checkpoints or checkpoints.last_step is None:
        check_loss(job, loss, step, recovered)
    back = checkpoints.restore()
    log.warning(
        "the training loss was %s at step %d: back to the checkpoint of step %d and on (recovery %d of %d, "
        "train.recovery.max_recoveries)",
        f"{loss:.6g}",
        step,
        back,
        recovered + 1,
        job.train.recovery.max_recoveries,
    )
    job.reporter.log_metrics({"train/recoveries": float(recovered + 1)}, step)
    return back
