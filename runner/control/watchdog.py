"""The sentinel: a tiny process (no TensorFlow) that acts for a training process when that process cannot.

TensorFlow can block the main thread in C++: strategy constructors wait for absent peers holding Python's GIL,
and ops can wait forever. Then no Python code of that process runs, signal handlers included. This process can:
- a deadline (`cluster.start_timeout_sec` while joining the cluster) that passes: error, run FAILED, kill;
- Ctrl-C / SIGTERM that the process does not act on within GRACE_SEC (a second one at any time, or the first
  while a deadline is armed): run KILLED, kill. CPython's C-level signal handler writes each signal's number to
  the wakeup fd (signal.set_wakeup_fd), without the GIL; the read end of that pipe is ours.
It dies with its parent (runner.control.procs) and ends quietly when its stdin closes.

Usage: python -m runner.control.watchdog PID SIGNAL_FD; then JSON lines on stdin: ["run", id, owner|attached, output_dir],
["deadline", seconds, message], ["clear"]. The store is $MLFLOW_TRACKING_URI.
"""

import json
import os
import select
import signal
import sys
import time

GRACE_SEC = 3.0
STOP_SIGNALS = {int(signal.SIGINT): "SIGINT", int(signal.SIGTERM): "SIGTERM"}


class Sentinel:
    def __init__(self, pid: int):
        self.pid, self.run = pid, None
        self.deadline = self.message = None
        self.signals, self.act_at = [], None

    def command(self, words) -> None:
        if words[0] == "run":
            self.run = words[1:]
        elif words[0] == "deadline":
            self.deadline, self.message = time.monotonic() + float(words[1]), words[2]
        elif words[0] == "clear":
            self.deadline = self.message = None
            if len(self.signals) < 2:
                self.act_at = None  # the blocking call returned: Python acts on the signal itself

    def signalled(self, numbers) -> None:
        self.signals += [n for n in numbers if n in STOP_SIGNALS]
        if self.act_at is None and (len(self.signals) >= 2 or (self.signals and self.deadline is not None)):
            self.act_at = time.monotonic() + GRACE_SEC

    def timeout(self):
        due = [t for t in (self.deadline, self.act_at) if t is not None]
        return max(0.0, min(due) - time.monotonic()) if due else None

    def due(self):
        """(message, MLflow status) when it is time to stop the process, else None."""
        now = time.monotonic()
        if self.act_at is not None and now >= self.act_at:
            name = STOP_SIGNALS[self.signals[-1]]
            where = f" Continue with resume={self.run[2]}." if self.run and len(self.run) > 2 and self.run[2] else ""
            return (
                f"Stopped: {name} received and TensorFlow did not give control back within {GRACE_SEC:g}s; the "
                f"process was killed at once (exit 137), the last checkpoint is kept.{where}",
                "KILLED",
            )
        if self.deadline is not None and now >= self.deadline:
            return f"Error: {self.message}", "FAILED"
        return None


_client = None


def prepare(run) -> None:
    """Import MLflow and open the store ahead of need (seconds): while the grace period runs, not after it."""
    global _client
    if _client is None and run and run[0] and os.environ.get("MLFLOW_TRACKING_URI"):
        try:
            from mlflow import MlflowClient

            _client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
        except Exception:
            pass


def mark(run, status: str, message: str) -> None:
    prepare(run)
    if _client is None:
        return
    client = _client
    try:
        client.set_tag(run[0], "error" if status == "FAILED" else "stopped_by", message)
        if run[1] == "owner":
            client.set_terminated(run[0], status)
    except Exception as err:  # the message on stderr is what matters
        print(f"(could not mark the MLflow run: {err})", file=sys.stderr)


def main(argv) -> None:
    pid, signal_fd = int(argv[0]), int(argv[1])
    sentinel, lines, pending = Sentinel(pid), sys.stdin.fileno(), b""
    watched = [lines, signal_fd]
    while True:
        ready, _, _ = select.select(watched, [], [], sentinel.timeout())
        if lines in ready:  # raw reads: a buffered readline could keep a second command out of select's sight
            data = os.read(lines, 65536)
            if not data:  # the parent is done with us (or gone)
                return
            *complete, pending = (pending + data).split(b"\n")
            for line in complete:
                sentinel.command(json.loads(line))
        if signal_fd in ready:
            data = os.read(signal_fd, 64)
            if not data:
                watched.remove(signal_fd)
            sentinel.signalled(list(data))
            if sentinel.act_at is not None:
                prepare(sentinel.run)
        action = sentinel.due()
        if action:
            message, status = action
            print(message, file=sys.stderr, flush=True)
            mark(sentinel.run, status, message)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return


if __name__ == "__main__":
    main(sys.argv[1:])
