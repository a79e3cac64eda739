"""`python -m runner.dashboard`: the MLflow UI for the runner's store, on 127.0.0.1.

Starts `mlflow server` with one worker and no job execution (up in ~5 s and ~500 MB instead of ~14 s and
~2.3 GB) and prints the address of the model-training view (MLflow 3 opens experiments in a GenAI view).
"""

import argparse
import os
import signal
import subprocess
import sys


def server_command(uri: str, host: str, port: int):
    return [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri, "--host", host,
            "--port", str(port), "--workers", "1"]


def main(argv=None) -> int:
    from runner.redact import redact_uri
    from runner.tracking import resolve_tracking_uri

    parser = argparse.ArgumentParser(prog="python -m runner.dashboard", description=__doc__.splitlines()[0])
    parser.add_argument("--tracking-uri", default=None,
                        help="store to show (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=5000)
    args = parser.parse_args(argv)
    uri = args.tracking_uri or resolve_tracking_uri(None)
    if uri.startswith("http"):
        print(f"{redact_uri(uri)} is already an MLflow server: open {redact_uri(uri)}/#/experiments?workflowType=machine_learning")
        return 0
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    print(f"MLflow UI for {redact_uri(uri)}: http://{args.host}:{args.port}/#/experiments?workflowType=machine_learning "
          "(Ctrl-C stops it)", flush=True)
    proc = subprocess.Popen(server_command(uri, args.host, args.port), env=env)

    def stop(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)  # `kill` stops the server too, like Ctrl-C
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        try:
            return proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()


if __name__ == "__main__":
    sys.exit(main())
