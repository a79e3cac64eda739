"""Ctrl-C (SIGINT) and SIGTERM: stop at a step boundary with a checkpoint, and end the MLflow run KILLED.

SIGTERM is how Kubernetes, Slurm and preemptible VMs announce preemption. While training, either signal only
raises a flag. A single worker saves at its next step boundary and raises Stopped. Across the workers of a
MultiWorkerMirroredStrategy cluster, TensorFlow's PreemptionCheckpointHandler (polling that flag once a second)
picks the step at which every worker saves, the checkpoint is written there, and Stopped is raised. Under
parameter_server, which that handler does not support, the coordinator saves at its next step boundary itself.
Outside training, or on a second Ctrl-C, Stopped is raised at once. (TPUStrategy and GCE CPU VMs, where
TensorFlow's handler works differently, take the single-worker path.)
"""

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading

from runner import tf_private
from runner.control import procs
from runner.errors import RunnerError

log = logging.getLogger("runner")
EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}  # 128 + signal number, as shells report it

NOTICE = "received: stopping at the next step boundary"  # the launcher reads it to name the task that was signalled
_received = []  # signal numbers, in order
_training = threading.Event()  # a StopGuard is active: defer to a step boundary
_agreeing = threading.Event()  # ... which the workers of a cluster agree on through TensorFlow's handler


class Stopped(RunnerError):
    """Training was stopped by a signal; the run is KILLED, the checkpoint (if any) is resumable."""

    def __init__(self, signum: int | str, message: str | None = None):
        if message is None:  # rebuilt from its message alone (OmegaConf re-raises errors as type(err)(text))
            signum, message = (_received or [signal.SIGINT])[-1], str(signum)
        super().__init__(message)
        self.signal_name = signal.Signals(signum).name
        self.exit_code = EXIT_CODES.get(signum, 128 + signum)


def _on_signal(signum, frame):
    first = not _received
    _received.append(signum)
    name = signal.Signals(signum).name
    if _training.is_set() and first:
        agreed = " every worker agrees on (within seconds)" if _agreeing.is_set() else ""
        log.warning("%s %s%s, after a checkpoint (send it again to stop at once)", name, NOTICE, agreed)
        return
    _raised.append(signum)
    raise Stopped(signum, f"stopped by {name}")


_raised: list[int] = []  # signals whose Stopped was raised from the handler, wherever the main thread was


def wrapped(err: BaseException) -> "Stopped | None":
    """The stop behind `err`: a Stopped raised from the handler while TensorFlow traced a function comes back as
    TensorFlow's own error (AutoGraph catches it, then fails on the unconverted code), often without it in its chain."""
    if not _raised or isinstance(err, RunnerError):
        return None
    return Stopped(_raised[-1], f"stopped by {signal.Signals(_raised[-1]).name}")


def install() -> None:
    """Route SIGINT and SIGTERM through _on_signal (main thread only; tasks that only serve keep the defaults)."""
    for signum in EXIT_CODES:
        signal.signal(signum, _on_signal)


def requested() -> bool:
    return bool(_received)


class Sentinel:
    """`with Sentinel(run, output_dir) as sentinel:` starts runner.control.watchdog, which stops this process when
    TensorFlow blocks it in C++ (where no Python code, signal handlers included, can run): a second Ctrl-C or
    SIGTERM that is not acted on within seconds, or `sentinel.deadline(...)` that passes. Main thread only."""

    def __init__(self, run, output_dir):
        self.run, self.output_dir = run, output_dir

    def __enter__(self):
        read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        env = dict(os.environ, MLFLOW_TRACKING_URI=getattr(self.run, "tracking_uri", "") or "")  # not in argv: credentials
        self.proc = procs.popen(
            [sys.executable, "-m", "runner.control.watchdog", str(os.getpid()), str(read)],
            deaf=True,  # it hears this process's signals through the wakeup pipe, not its own
            stdin=subprocess.PIPE,
            env=env,
            pass_fds=(read,),
            text=True,
        )
        os.close(read)
        self._previous = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        self.send(
            "run", self.run.run_id or "", "owner" if getattr(self.run, "owner", False) else "attached", str(self.output_dir or "")
        )
        return self

    def send(self, *words) -> None:
        try:
            self.proc.stdin.write(json.dumps(list(words)) + "\n")
            self.proc.stdin.flush()
        except OSError:  # it is gone: nothing to tell
            pass

    @contextlib.contextmanager
    def deadline(self, seconds: float, what: str):
        """Around a call that can block in C++: past `seconds`, the sentinel ends the run FAILED with this message."""
        self.send(
            "deadline",
            seconds,
            f"{what} did not complete within cluster.start_timeout_sec={seconds:g}: is every task of the cluster started?",
        )
        try:
            yield
        finally:
            self.send("clear")

    def __exit__(self, *exc):
        signal.set_wakeup_fd(self._previous)
        os.close(self._write)
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        self.proc.wait()


class StopGuard:
    """`with StopGuard(job) as guard:` around the training loop; `guard.check(step)` at each step boundary."""

    def __init__(self, job):
        self.job, self.step, self.saved = job, 0, None
        self.handler = None
        # TensorFlow's handler only where workers must agree on the step: it polls the flag once a second, so a
        # single worker acting on it itself stops at the very next step instead of hundreds of steps later.
        if job.checkpoints and job.multi_worker and not job.parameter_server and "TPU" not in type(job.strategy).__name__:
            import tensorflow as tf

            config = tf.distribute.experimental.TerminationConfig(
                termination_watcher_fn=requested, exit_fn=self._stop, save_fn=self._save
            )
            handler = tf.distribute.experimental.PreemptionCheckpointHandler(
                job.cluster.resolver, job.checkpoints.manager, termination_config=config
            )
            if tf_private.preemption_handler_acts(handler):  # not on GCE CPU VMs: there this guard saves itself
                self.handler = handler

    def __enter__(self):
        install()  # again: MultiWorkerMirroredStrategy's coordination service installs its own C++ SIGTERM handler
        _training.set()
        if self.handler is not None:
            _agreeing.set()
        return self

    def __exit__(self, kind, value, tb):
        _training.clear()
        _agreeing.clear()
        if kind is None and _received:  # the signal came after the last step boundary: training is complete
            self._stop()

    def check(self, step: int) -> None:
        self.step = step
        if self.handler is not None:
            self.handler.save_checkpoint_if_preempted()  # saves through _save and calls _stop once agreed
        elif _received:
            if self.job.checkpoints:
                self._save()
            self._stop()

    def _save(self, *args, **kwargs) -> None:
        self.job.checkpoints.save(self.step)
        self.saved = self.step

    def _stop(self) -> None:
        signum = _received[0] if _received else signal.SIGTERM
        where = (
            f"checkpoint written at step {self.saved} in {self.job.checkpoints.directory}"
            if self.saved is not None
            else "no checkpoint (checkpoint.enabled=false)"
            if not self.job.checkpoints
            else "the last checkpoint is kept"
        )
        raise Stopped(signum, f"training stopped by {signal.Signals(signum).name} at step {self.step}: {where}.")
