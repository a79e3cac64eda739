"""A trial of a pruning search (sweep.pruner) as its training process sees it: after each epoch's evaluation the
value of the search's objective goes to the sweep, which holds the Optuna study, and the sweep's verdict comes back:
go on, or stop here (pruned). The two processes speak through two files in the job's output directory, so a
pruned trial ends like an early-stopped one: at an epoch boundary, checkpoint kept, its run FINISHED and tagged
`sweep.pruned_at_step`. No Optuna here (runner.sweeps.pruning decides, in the sweep's process).
"""

import json
import logging
import os
import time

from runner.control import contract

log = logging.getLogger("runner")
EVALUATIONS, VERDICT = "trial_evaluations.jsonl", "trial_verdict.json"
WAIT_SEC = 30.0  # for the sweep's verdict: it answers within a poll (runner.sweeps.pruning.POLL_SEC) and a write


class TrialReport:
    def __init__(self, output_dir: str, objective: str):
        self.dir, self.objective = output_dir, objective
        self.pruned_at: int | None = None
        self._silent = False

    @classmethod
    def from_env(cls, output_dir: str | None, objective) -> "TrialReport | None":
        """This job's report when its sweep prunes (contract.PRUNE), else None."""
        if not (output_dir and os.environ.get(contract.PRUNE) and os.environ.get(contract.SWEEP_JOB)):
            return None
        return cls(output_dir, str(objective))

    def report(self, step: int, results: dict[str, float]) -> bool:
        """Tell the sweep this evaluation; True when it prunes the trial here."""
        if self.objective not in results:
            if not self._silent:
                log.warning(
                    "sweep.pruner: %s is not among this run's evaluation metrics; the trial is not pruned", self.objective
                )
                self._silent = True
            return False
        with open(os.path.join(self.dir, EVALUATIONS), "a") as f:
            f.write(json.dumps({"step": int(step), "value": float(results[self.objective])}) + "\n")
        deadline = time.monotonic() + WAIT_SEC
        while time.monotonic() < deadline:
            verdict = self._verdict()
            if verdict is not None and verdict.get("step") == step:
                if verdict.get("prune"):
                    self.pruned_at = step
                    log.info("pruned at step %d by the sweep (sweep.pruner): %s=%.4f is behind the other trials",
                             step, self.objective, results[self.objective])  # fmt: skip
                return bool(verdict.get("prune"))
            time.sleep(0.01)
        log.warning("sweep.pruner: no verdict from the sweep for step %d within %.0f s; the trial goes on", step, WAIT_SEC)
        return False

    def _verdict(self) -> dict | None:
        try:
            with open(os.path.join(self.dir, VERDICT)) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None
