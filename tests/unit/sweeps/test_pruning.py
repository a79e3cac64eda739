"""sweep.pruner's two sides without TensorFlow: the sweep's Watcher (runner.sweeps.pruning) holding real Optuna
trials of a real SQLite study with Optuna's MedianPruner, and the training process's TrialReport
(runner.control.trial_report) in a thread, speaking through the job directory's files as the two processes do."""

import threading

import optuna
import pytest

from runner.control import contract
from runner.control.trial_report import TrialReport
from runner.errors import ConfigError
from runner.sweeps.pruning import Watcher, pruner_of


def test_a_trial_behind_the_median_is_pruned_at_that_step_and_the_others_go_on(tmp_path, monkeypatch):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/optuna.db", study_name="sweep",
                                pruner=optuna.pruners.MedianPruner(n_startup_trials=2))  # fmt: skip
    for curve in ([1.0, 0.8, 0.6], [1.0, 0.7, 0.5]):  # two finished trials: the median at steps 10, 20, 30
        trial = study.ask()
        for i, value in enumerate(curve):
            trial.report(value, (i + 1) * 10)
        study.tell(trial, curve[-1])
    trial = study.ask()
    job_dir = tmp_path / "2"
    job_dir.mkdir()
    monkeypatch.setenv(contract.PRUNE, "1")
    monkeypatch.setenv(contract.SWEEP_JOB, "2")
    report = TrialReport.from_env(str(job_dir), "eval/loss")
    verdicts = []
    with Watcher() as watcher:
        watcher.add(trial.number, trial, str(job_dir))

        def train():  # the training process: an evaluation per epoch until the sweep says stop
            for step, loss in ((10, 0.9), (20, 0.95)):
                verdicts.append(report.report(step, {"eval/loss": loss}))
                if verdicts[-1]:
                    return

        thread = threading.Thread(target=train)
        thread.start()
        thread.join(timeout=30)
        assert watcher.done(trial.number) == 20 and watcher.trials == {}
    assert verdicts == [False, True] and report.pruned_at == 20 and watcher.pruned == {trial.number: 20}
    assert dict(study.trials[-1].intermediate_values) == {10: 0.9, 20: 0.95}


def test_a_job_outside_a_pruning_search_reports_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv(contract.PRUNE, raising=False)
    assert TrialReport.from_env(str(tmp_path), "eval/loss") is None


def test_pruning_needs_one_evaluated_objective():
    assert isinstance(pruner_of("successive_halving", ["eval/accuracy"]), optuna.pruners.SuccessiveHalvingPruner)
    assert pruner_of("none", ["eval/loss", "summary/examples_per_sec"]) is None
    with pytest.raises(ConfigError, match="sweep.pruner=.medain. is not valid; choose one of: none, median"):
        pruner_of("medain", ["eval/loss"])
    for objectives in (["summary/examples_per_sec"], ["eval/loss", "summary/examples_per_sec"]):
        with pytest.raises(ConfigError, match="sweep.pruner=median compares the trials' evaluations"):
            pruner_of("median", objectives)
