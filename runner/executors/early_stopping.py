"""Early stopping and the best checkpoint: an evaluation after each epoch, watched.

With train.early_stopping.patience or checkpoint.keep_best set, both executors evaluate on the eval split at the
end of every epoch (`after_epoch`) and log the eval/* metrics at that step. A `Watch` decides: whether the monitored
metric improved (by more than min_delta; NaN never does), then the best checkpoint is kept in <checkpoints>/best,
and whether `patience` evaluations in a row did not, then training stops there. Its state (best value and step,
evaluations since) is kept beside the checkpoints in best.json, so a resumed run goes on counting. Under
MultiWorkerMirroredStrategy every worker evaluates the same replicated model and so takes the same decision.
Plain Python and NumPy-free: the decision is tested without TensorFlow.
"""

import json
import logging
import math
import os

from runner.builders.metrics import MAXIMISED
from runner.config.schema import Mode
from runner.errors import ConfigError

log = logging.getLogger("runner")
STATE_FILE = "best.json"  # in the checkpoint directory


def direction(monitor: str, mode: str) -> str:
    if mode != Mode.auto:
        return str(mode)
    return "max" if monitor.endswith(MAXIMISED) else "min"


class Watch:
    """The monitored metric over the evaluations: the best value and its step, and how many evaluations since.

    It keeps every evaluation (one per epoch) by step: a step evaluated again, after a recovery or a resume went back
    before it, replaces the earlier evaluation instead of counting twice."""

    def __init__(
        self,
        *,
        monitor: str,
        mode: str = "auto",
        patience: int | None = None,
        min_delta: float = 0.0,
        keep_best: bool = False,
        state_dir: str | None = None,
        writes: bool = True,
    ):
        self.monitor, self.direction = monitor, direction(monitor, mode)
        self.patience, self.min_delta, self.keep_best = patience, min_delta, keep_best
        self.path = os.path.join(state_dir, STATE_FILE) if state_dir else None
        self.writes = writes
        self.evaluations: list[tuple[int, float]] = []
        self.best: float | None = None
        self.best_step: int | None = None
        self.since = 0  # evaluations without improvement
        if self.path and os.path.exists(self.path):
            self._load()

    def _load(self) -> None:
        try:
            with open(self.path) as f:
                state = json.load(f)
            if state.get("monitor") == self.monitor:  # another metric watched now: start afresh
                self.evaluations = [(int(step), float(value)) for step, value in state["evaluations"]]
                self._replay()
        except (OSError, ValueError, KeyError, TypeError) as err:
            log.warning("%s could not be read (%s): early stopping counts from this run's first evaluation", self.path, err)

    def save(self) -> None:
        """best.json, after the best checkpoint it names is written (the chief's; the other workers keep none)."""
        if not (self.path and self.writes):
            return
        state = {"monitor": self.monitor, "evaluations": self.evaluations, "best": self.best, "best_step": self.best_step}
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(self.path + ".tmp", "w") as f:
            json.dump(state, f)
        os.replace(self.path + ".tmp", self.path)  # whole or the previous one

    def _beats(self, value: float, best: float | None) -> bool:
        if not math.isfinite(value):
            return False
        if best is None:
            return True
        return value < best - self.min_delta if self.direction == "min" else value > best + self.min_delta

    def _replay(self) -> None:
        self.best, self.best_step, self.since = None, None, 0
        for step, value in self.evaluations:
            if self._beats(value, self.best):
                self.best, self.best_step, self.since = value, step, 0
            else:
                self.since += 1

    def update(self, results: dict[str, float], step: int) -> tuple[bool, bool]:
        """(this evaluation is the best so far, training should stop now)."""
        if self.monitor not in results:
            raise ConfigError(
                f"train.early_stopping.monitor={self.monitor} is not among this run's evaluation metrics "
                f"({', '.join(sorted(results))}); use one of them (eval/accuracy needs a classification loss)."
            )
        self.evaluations = [(s, v) for s, v in self.evaluations if s < step] + [(step, float(results[self.monitor]))]
        self._replay()
        return self.best_step == step, self.patience is not None and self.since >= self.patience

    def metrics(self) -> dict[str, float]:
        """best/<monitor> and best/step, once there is a best."""
        if self.best is None:
            return {}
        return {f"best/{self.monitor}": self.best, "best/step": float(self.best_step)}


def _named(loss) -> str:
    return f"your own ({loss.get('_target_')})" if isinstance(loss, dict) else str(loss)


def watch_for(train_cfg, checkpoint_cfg, checkpoint_dir: str | None, writes: bool, loss: str | None = None) -> Watch | None:
    """The run's Watch, or None when nothing is watched (no patience, no best checkpoint). `loss` (the run's loss
    name): a monitor its evaluation will not have is refused here, before the first step, not after an epoch."""
    es = train_cfg.early_stopping
    keep_best = bool(checkpoint_cfg.keep_best)
    if es.patience is None and not keep_best:
        return None
    if loss is not None:
        from runner.builders.metrics import builtin_names

        have = ["eval/loss", *(f"eval/{name}" for name in builtin_names(loss))]
        if es.monitor not in have and not train_cfg.get("metrics"):  # your own metrics: checked when they are made
            uses = "train.early_stopping.patience" if es.patience is not None else "checkpoint.keep_best"
            raise ConfigError(
                f"train.early_stopping.monitor={es.monitor} (watched for {uses}) is not among this run's evaluation "
                f"metrics ({', '.join(have)}): its loss is {_named(loss)}, which has no accuracy. Set "
                "train.early_stopping.monitor=eval/loss; nothing was trained."
            )
    return Watch(
        monitor=es.monitor,
        mode=es.mode,
        patience=es.patience,
        min_delta=es.min_delta,
        keep_best=keep_best,
        state_dir=checkpoint_dir,
        writes=writes,
    )


def after_epoch(job, step: int, evaluate) -> bool:
    """Evaluate at the end of an epoch when the run is watched, or is a trial of a pruning search; True: stop
    training here."""
    watch, trial = job.watch, getattr(job, "trial", None)
    if watch is None and trial is None:
        return False
    results = evaluate()
    if watch is None:  # a trial only: its evaluation logged, then the sweep's verdict
        job.reporter.log_metrics(results, step)
        log.info("evaluation at step %d: %s", step, ", ".join(f"{k}={v:.4f}" for k, v in results.items()))
        return _pruned(job, step, results)
    better, stop = watch.update(results, step)
    if better and watch.keep_best and job.checkpoints:
        job.checkpoints.save_best(step)
    watch.save()
    job.reporter.log_metrics({**results, **watch.metrics()}, step)
    said = ", ".join(f"{k}={v:.4f}" for k, v in results.items())
    best = f"best {watch.monitor}={watch.best:.4f} at step {watch.best_step}" if watch.best is not None else "no best yet"
    log.info("evaluation at step %d: %s (%s)", step, said, "a new best" if better else best)
    if stop:
        log.info(
            "early stopping at step %d: %s has not improved by more than %s for %d evaluation(s); %s",
            step,
            watch.monitor,
            watch.min_delta,
            watch.since,
            best,
        )
    return stop or (trial is not None and _pruned(job, step, results))


def _pruned(job, step: int, results: dict) -> bool:
    """The sweep's verdict on this evaluation (sweep.pruner); a pruned trial's run is tagged with the step."""
    if not job.trial.report(step, results):
        return False
    set_tags = getattr(job.reporter, "set_tags", None)
    if set_tags:
        set_tags({"sweep.pruned_at_step": step})
    return True


def restore_best(job, wanted: bool) -> None:
    """checkpoint.restore_best: end with the best checkpoint's weights (the final evaluation, model.keras and the
    MLflow model are then the best's)."""
    if not wanted or not job.checkpoints:
        return
    step = job.checkpoints.restore_best()
    if step is None:
        log.warning("checkpoint.restore_best: no best checkpoint was kept; the run ends with its last weights")
    else:
        log.info("restored the best checkpoint (step %d) for the final evaluation and the saved model", step)
