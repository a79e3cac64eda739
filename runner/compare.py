"""`python -m runner.compare RUN RUN ...`: a few runs side by side, in the terminal: the config keys whose values
differ between them (the rest said in one line), then their final figures. Each RUN is an MLflow run id, or a run's
output directory (its mlflow_run_id, or without MLflow its .hydra/config.yaml and summary.json).

MLflow's UI compares runs too, but lost its "show only the differences" view (mlflow#10477): here only what differs
is shown. Bad input is one line and exit 2.
"""

import argparse
import json
import os
import sys

FIGURES = ("final_loss", "eval/", "summary/examples_per_sec", "summary/step_time_ms", "best/", "sweep/")


class Refused(Exception):
    pass


def _from_dir(path: str, client_of):
    """(label, params, metrics) of a run's output directory."""
    from omegaconf import OmegaConf

    from runner.config import layout
    from runner.tracking.run import flatten

    run_id_file = os.path.join(path, layout.RUN_ID_FILE)
    if os.path.exists(run_id_file):
        with open(run_id_file) as f:
            return _from_mlflow(f.read().strip(), client_of)
    config = os.path.join(path, layout.HYDRA_DIR, "config.yaml")
    if not os.path.exists(config):
        raise Refused(f"{path} is no run's output directory: it has neither {layout.RUN_ID_FILE} nor .hydra/config.yaml")
    params = flatten(OmegaConf.to_container(OmegaConf.load(config), resolve=False))
    try:
        with open(layout.summary_path(path)) as f:
            metrics = {k: v for k, v in json.load(f).items() if isinstance(v, (int, float))}
    except (OSError, ValueError):
        metrics = {}
    return os.path.basename(os.path.normpath(path)), params, metrics


def _from_mlflow(run_id: str, client_of):
    path = client_of.uri[len("sqlite:///") :] if client_of.uri.startswith("sqlite:///") else None
    if path is not None and not os.path.exists(path):  # opening it would create an empty store
        raise Refused(f"{run_id!r} is no directory, and there is no MLflow store at {client_of.uri} to find it in")
    try:
        run = client_of().get_run(run_id)
    except Exception as err:  # noqa: BLE001  (MlflowException: no such run; a store that is down)
        raise Refused(f"no MLflow run {run_id!r} at {client_of.uri} ({str(err).splitlines()[0][:200]})") from None
    return run.info.run_name or run_id[:8], dict(run.data.params), dict(run.data.metrics)


def load(spec: str, client_of):
    return _from_dir(spec, client_of) if os.path.isdir(spec) else _from_mlflow(spec, client_of)


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *rows])


def _fmt(value) -> str:
    if value is None:
        return "-"
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def compare(runs: list[tuple[str, dict, dict]]) -> str:
    labels = [label for label, _, _ in runs]
    keys = sorted({k for _, params, _ in runs for k in params})
    differ = [k for k in keys if len({params.get(k) for _, params, _ in runs}) > 1]
    same = len(keys) - len(differ)
    out = [table(["config key", *labels], [[k, *(_fmt(p.get(k)) for _, p, _ in runs)] for k in differ])]
    out.append(f"({same} other config key(s) the same in every run)" if differ else f"all {same} config keys are the same")
    figures = sorted({k for _, _, m in runs for k in m if k.startswith(FIGURES) and not k.startswith("eval/replica")})
    out += ["", table(["figure", *labels], [[k, *(_fmt(m.get(k)) for _, _, m in runs)] for k in figures])]
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runner.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", metavar="RUN", help="an MLflow run id, or a run's output directory")
    parser.add_argument("--tracking-uri", default=None, help="the MLflow store (default: MLFLOW_TRACKING_URI, else ./mlflow.db)")
    args = parser.parse_args(argv)
    if len(args.runs) < 2:
        print("Error: give two runs or more to compare (MLflow run ids or output directories).", file=sys.stderr)
        return 2
    from runner.config.redact import redact
    from runner.tracking.run import resolve_tracking_uri

    uri = resolve_tracking_uri(args.tracking_uri)

    def client_of():
        from mlflow import MlflowClient

        return MlflowClient(uri)

    client_of.uri = redact(uri)
    try:
        runs = [load(spec, client_of) for spec in args.runs]
    except Refused as err:
        print(f"Error: {err}. Give MLflow run ids (the MLflow UI and each run's mlflow_run_id file show them) or output "
              "directories.", file=sys.stderr)  # fmt: skip
        return 2
    print(redact(compare(runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
