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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runner.deliver", description=__doc__.splitlines()[0])
    parser.add_argument("output_dir", help="the run's output directory (it holds mlflow_outbox.jsonl)")
    parser.add_argument("--tracking-uri", default=None)
    args = parser.parse_args(argv)
    if not outbox.exists(args.output_dir):
        print(f"Nothing to deliver: no {outbox.FILE} in {args.output_dir}.")
        return 0
    from runner.tracking import resolve_tracking_uri
    from runner.validate import tracking_problem

    uri = resolve_tracking_uri(args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or _run_uri(args.output_dir))
    problem = tracking_problem(uri)
    if problem:
        print(f"Error: MLflow at {redact_uri(uri)} is unreachable ({problem}); the outbox is kept. Try again when it is up.",
              file=sys.stderr)
        return 2
    from mlflow import MlflowClient

    sent = outbox.deliver(MlflowClient(uri), args.output_dir)
    print(f"delivered {sent} metric value(s) to {redact_uri(uri)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
