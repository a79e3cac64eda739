"""What a finished search says beyond its best trial, written into the sweep directory (the sweep's report logs them
to the parent run): each searched key's importance (Optuna's fANOVA, `importances.json`, one line in the log) and
Optuna's own plots (`optuna_history.png`, `optuna_parallel_coordinate.png`, `optuna_importances.png`, and
`optuna_intermediate_values.png` when trials were pruned, or `optuna_pareto_front.png` for several objectives).
"""

import json
import logging
import os
import warnings

log = logging.getLogger("runner")


def write(study, sweep_dir: str, names: list[str]) -> None:
    """Importances and plots of `study`'s finished trials; a plot Optuna cannot draw (too few trials) is left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna import importance, visualization
    from optuna.trial import TrialState

    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(done) < 2:
        return
    single = len(names) == 1
    target = None if single else (lambda t: t.values[0])  # importances and plots of several objectives: the first
    shown = {"target": target, "target_name": names[0]}
    with warnings.catch_warnings():  # Optuna's matplotlib plots are "experimental"; fANOVA's forest warns on few trials
        warnings.simplefilter("ignore")
        try:
            found = importance.get_param_importances(study, target=target)
        except (RuntimeError, ValueError) as err:  # one value searched, or every trial the same
            log.info("no parameter importances: %s", err)
            found = {}
        if found:
            with open(os.path.join(sweep_dir, "importances.json"), "w") as f:
                json.dump({"objective": names[0], "evaluator": "fANOVA", "importances": found}, f, indent=1)
            log.info("parameter importances for %s (fANOVA): %s", names[0], ", ".join(f"{k} {v:.2f}" for k, v in found.items()))
        m = visualization.matplotlib
        drawn = {
            "history": lambda: m.plot_optimization_history(study, **shown),
            "parallel_coordinate": lambda: m.plot_parallel_coordinate(study, **shown),
            "importances": (lambda: m.plot_param_importances(study, **shown)) if found else None,
            "intermediate_values": (lambda: m.plot_intermediate_values(study))
            if single and any(t.state == TrialState.PRUNED for t in study.get_trials(deepcopy=False))
            else None,
            "pareto_front": (lambda: m.plot_pareto_front(study, target_names=names)) if not single and len(names) <= 3 else None,
        }
        for name, draw in drawn.items():
            if draw is None:
                continue
            try:
                axes = draw()
                figure = (axes.flat[0] if hasattr(axes, "flat") else axes).get_figure()
                figure.savefig(os.path.join(sweep_dir, f"optuna_{name}.png"), dpi=100, bbox_inches="tight")
            except Exception as err:  # noqa: BLE001  (a plot is extra: the search's results are written already)
                log.info("Optuna's %s plot was not drawn: %s", name, err)
            finally:
                plt.close("all")
