"""A sweep's spare, in its own process (`python -m runner` with RUNNER_SPARE set; runner.sweeps.spares starts it):
import ahead at the lowest priority and start the MLflow process, then wait for the job on stdin and become it.

Not in a package: it imports what a training process imports (runner.app, TensorFlow, runner.experiment) before
`runner.__main__` goes on as usual with the job's overrides.
"""

import gc
import json
import os
import sys
import tempfile
import threading
import time

from runner.control import contract

LOWEST = 19


def _lowest_priority() -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LOWEST)
    except (AttributeError, OSError):
        pass


def _import_ahead() -> None:
    """What a job imports before its first step: Hydra and the runner's app, TensorFlow and tf_keras (the collector
    off, as runner.experiment does it), the experiment's modules. A failure is left for the job's own import."""
    _lowest_priority()
    try:
        import runner.app  # noqa: F401

        gc.disable()
        try:
            import tensorflow  # noqa: F401
            import tf_keras  # noqa: F401
        finally:
            gc.freeze()
            gc.enable()
        import runner.experiment  # noqa: F401
    except BaseException:  # noqa: S110  (imported again by the job, which then says what is wrong)
        pass


def _threads_back_to_normal() -> None:
    """Threads that TensorFlow's import started inherited niceness 19; back to 0 where Linux allows it (root, or a
    raised RLIMIT_NICE). Where not, they are idle helpers: the threads that train are started later, by the job."""
    for tid in os.listdir(f"/proc/{os.getpid()}/task"):
        try:
            if os.getpriority(os.PRIO_PROCESS, int(tid)) > 0:
                os.setpriority(os.PRIO_PROCESS, int(tid), 0)
        except (OSError, ValueError):
            pass


def wait_for_job() -> None:
    """In a spare: import ahead and start the MLflow process, then wait for the job; sys.argv and os.environ become
    the job's. Exits quietly when the sweep goes away first."""
    import numpy  # noqa: F401  (here, at normal priority: its BLAS threads are the ones that compute)

    from runner.tracking import run as tracking

    uri = os.environ.get(contract.TRACKING_URI)
    if uri:
        tracking.spawn_ahead(uri, niceness=LOWEST)
    sys.stderr.flush()
    saved, sink = os.dup(2), tempfile.TemporaryFile()
    os.dup2(sink.fileno(), 2)  # TensorFlow's C++ start-up chatter, as runner.env.native_stderr_captured hides it
    importer = threading.Thread(target=_import_ahead, name="spare-imports", daemon=True)
    importer.start()
    line = sys.stdin.readline()
    handed = time.perf_counter()
    if not line.strip():  # the sweep dropped this spare, or ended
        os._exit(0)
    job = json.loads(line)
    importer.join()
    os.dup2(saved, 2)
    os.close(saved)
    sink.close()
    _threads_back_to_normal()
    for key in set(os.environ) - set(job["env"]):
        del os.environ[key]
    os.environ.update(job["env"])
    sys.argv[1:] = job["argv"]
    import runner

    runner.STARTED = handed  # the job's time starts when it was handed over: phases, time/to_first_step_sec
