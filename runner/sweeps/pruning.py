"""sweep.pruner in the sweep's process: the Optuna pruner, and a thread that takes each running trial's
evaluations from its job directory (runner.executors.trial_report), reports them to the trial and writes its
verdict back. The trials stay Optuna's own `Trial` objects, asked here: the training processes never open the study.
"""

import json
import os
import threading

from runner.control.trial_report import EVALUATIONS, VERDICT
from runner.errors import ConfigError

POLL_SEC = 0.02  # a verdict waits on this poll: each evaluation of a trial pays it once


def pruner_of(name: str | None, objectives: list[str]):
    """The Optuna pruner sweep.pruner names (None for none)."""
    from runner.config.schema import Pruner

    if name in (None, Pruner.none):
        return None
    if name not in list(Pruner):
        raise ConfigError(f"sweep.pruner={name!r} is not valid; choose one of: {', '.join(p.value for p in Pruner)}.")
    import optuna

    if len(objectives) != 1 or not objectives[0].startswith("eval/"):
        raise ConfigError(
            f"sweep.pruner={name} compares the trials' evaluations as they train, so it needs one sweep.objective that "
            f"is evaluated: an eval/<metric>, not {objectives if len(objectives) > 1 else objectives[0]}. Set "
            "sweep.objective=eval/loss (or eval/accuracy), or sweep.pruner=null."
        )
    return {
        "median": optuna.pruners.MedianPruner,
        "successive_halving": optuna.pruners.SuccessiveHalvingPruner,
        "hyperband": optuna.pruners.HyperbandPruner,
    }[str(name)]()


class Watcher:
    """While the search runs: the running trials' evaluations in, their verdicts out (`pruned`: number -> step)."""

    def __init__(self):
        self.trials: dict[int, tuple] = {}  # number -> (optuna Trial, job directory), while it runs
        self.pruned: dict[int, int] = {}
        self._read: dict[int, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sweep-pruning", daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=10)

    def add(self, number: int, trial, job_dir: str) -> None:
        """A trial about to start: an earlier attempt's files are dropped (read again from the start)."""
        for name in (EVALUATIONS, VERDICT):
            try:
                os.remove(os.path.join(job_dir, name))
            except OSError:
                pass
        with self._lock:
            self.trials[number], self._read[number] = (trial, job_dir), 0

    def done(self, number: int) -> int | None:
        """The trial ended: its last evaluations read (one written just before it ended); the step it was pruned at."""
        with self._lock:
            if number in self.trials:
                self._poll_one(number, *self.trials.pop(number))
        return self.pruned.get(number)

    def _loop(self):
        while not self._stop.wait(POLL_SEC):
            with self._lock:
                for number, (trial, job_dir) in list(self.trials.items()):
                    self._poll_one(number, trial, job_dir)

    def _poll_one(self, number: int, trial, job_dir: str) -> None:
        path = os.path.join(job_dir, EVALUATIONS)
        try:
            with open(path) as f:
                lines = f.read().splitlines()
        except OSError:
            return
        for line in lines[self._read[number] :]:
            try:
                evaluation = json.loads(line)
            except ValueError:  # written half: read again at the next poll
                break
            self._read[number] += 1
            step = int(evaluation["step"])
            trial.report(float(evaluation["value"]), step)
            prune = number not in self.pruned and bool(trial.should_prune())
            if prune:
                self.pruned[number] = step
            with open(os.path.join(job_dir, VERDICT + ".tmp"), "w") as f:
                json.dump({"step": step, "prune": prune}, f)
            os.replace(os.path.join(job_dir, VERDICT + ".tmp"), os.path.join(job_dir, VERDICT))
