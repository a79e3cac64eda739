"""python -m runner.deliver OUTPUT_DIR [--tracking-uri URI]: send what a run could not deliver to MLflow.

The tracking URI is --tracking-uri, else $MLFLOW_TRACKING_URI, else the run's own (from its .hydra config).
"""

import argparse
import os
import sys

from runner import outbox
from runner.redact import redact_uri


def _run_uri(directory: str):
    path = os.path.join(directory, ".hydra", "config.yaml")
    if os.path.isfile(path):
        from omegaconf import OmegaConf

        return OmegaConf.load(path).get("mlflow", {}).get("tracking_uri")
    return None


RUN_MARKERS = (".hydra/", "mlflow_run_id", outbox.FILE)  # what every runner output directory holds at least one of


def not_a_run_dir(directory: str):
    """Why `directory` is not a run's output directory (one line, saying what to pass instead), or None."""
    instead = "pass the run's output directory, e.g. outputs/<date>/<time> (a sweep job: multirun/<date>/<time>/<job>)"
    if not os.path.isdir(directory):
        return f"{directory} {'is not a directory' if os.path.exists(directory) else 'does not exist'}: {instead}."
    if any(os.path.exists(os.path.join(directory, marker.rstrip("/"))) for marker in RUN_MARKERS):
        return None
    if os.path.isfile(os.path.join(directory, "multirun.yaml")):
        jobs = sorted(
            (name for name in os.listdir(directory) if outbox.exists(os.path.join(directory, name))),
            key=lambda name: (len(name), name),
        )
        pending = ", ".join(os.path.join(directory, name) for name in jobs) if jobs else "none of its jobs has one"
        return f"{directory} is a sweep directory: pass one of its job directories (with {outbox.FILE}: {pending})."
    return f"{directory} is not a runner output directory (it has none of {', '.join(RUN_MARKERS)}): {instead}."


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runner.deliver", description=__doc__.splitlines()[0])
    parser.add_argument("output_dir", help="the run's output directory (it holds mlflow_outbox.jsonl)")
    parser.add_argument("--tracking-uri", default=None)
    args = parser.parse_args(argv)
    problem = not_a_run_dir(args.output_dir)
    if problem:
        print(f"Error: {problem}", file=sys.stderr)
        return 2
    if not outbox.exists(args.output_dir):
        print(f"Nothing to deliver: no {outbox.FILE} in {args.output_dir}.")
        return 0
    from runner.tracking import resolve_tracking_uri
    from runner.validate import tracking_problem

    uri = resolve_tracking_uri(args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or _run_uri(args.output_dir))
    problem = tracking_problem(uri)
    if problem:
        print(
            f"Error: MLflow at {redact_uri(uri)} is unreachable ({problem}); the outbox is kept. Try again when it is up.",
            file=sys.stderr,
        )
        return 2
    from mlflow import MlflowClient

    sent = outbox.deliver(MlflowClient(uri), args.output_dir)
    print(f"delivered {sent} metric value(s) to {redact_uri(uri)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
