"""A separate process that stops this one when a blocking TensorFlow call outlives its deadline.

Strategy constructors wait for absent peers inside C++ while holding Python's GIL, so no thread of the
waiting process can act; this tiny process (no TensorFlow) can. It ends quietly when its stdin closes.
Usage: python -m runner.watchdog PID SECONDS MESSAGE [RUN_ID OWNER] (the store: $MLFLOW_TRACKING_URI)
"""

import os
import select
import signal
import sys


def main(argv) -> None:
    pid, seconds, message = int(argv[0]), float(argv[1]), argv[2]
    ready, _, _ = select.select([sys.stdin], [], [], seconds)
    if ready:  # the pipe closed: the call finished in time (or the process is gone)
        return
    print(f"Error: {message}", file=sys.stderr, flush=True)
    if len(argv) >= 5 and argv[3] and os.environ.get("MLFLOW_TRACKING_URI"):
        try:
            from mlflow import MlflowClient

            client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
            client.set_tag(argv[3], "error", message)
            if argv[4] == "owner":
                client.set_terminated(argv[3], "FAILED")
        except Exception as err:  # the message above is what matters
            print(f"(could not mark the MLflow run: {err})", file=sys.stderr)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    main(sys.argv[1:])
