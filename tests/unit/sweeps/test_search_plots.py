"""A finished search's importances and Optuna's plots (runner.sweeps.search_plots), on a real in-memory study whose
objective depends on one parameter only: fANOVA must say so."""

import json

import optuna

from runner.sweeps import search_plots


def _study(directions, pruned=False):
    study = optuna.create_study(directions=directions, sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(12):
        trial = study.ask({"lr": optuna.distributions.FloatDistribution(0.001, 1.0, log=True),
                           "batch": optuna.distributions.CategoricalDistribution([32, 64])})  # fmt: skip
        loss = (trial.params["lr"] - 0.1) ** 2
        if len(directions) == 1:
            trial.report(loss, 10)
        study.tell(trial, [loss, 1.0 / trial.params["batch"]] if len(directions) > 1 else loss)
    if pruned:
        trial = study.ask()
        trial.report(5.0, 10)
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    return study


def test_importances_and_plots_of_a_search(tmp_path):
    search_plots.write(_study(["minimize"], pruned=True), str(tmp_path), ["eval/loss"])
    found = json.loads((tmp_path / "importances.json").read_text())
    assert found["objective"] == "eval/loss" and max(found["importances"], key=found["importances"].get) == "lr"
    names = {p.name for p in tmp_path.glob("optuna_*.png")}
    assert names == {f"optuna_{n}.png" for n in ("history", "parallel_coordinate", "importances", "intermediate_values")}


def test_several_objectives_draw_their_pareto_front(tmp_path):
    search_plots.write(_study(["minimize", "maximize"]), str(tmp_path), ["eval/loss", "summary/examples_per_sec"])
    assert (tmp_path / "optuna_pareto_front.png").exists() and (tmp_path / "optuna_history.png").exists()


def test_one_trial_draws_nothing(tmp_path):
    study = optuna.create_study()
    study.add_trial(optuna.trial.create_trial(params={}, distributions={}, value=1.0))
    search_plots.write(study, str(tmp_path), ["eval/loss"])
    assert list(tmp_path.iterdir()) == []
