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

from runner.control import contract, priority


def _import_ahead() -> None:
    """What a job imports before its first step: Hydra and the runner's app, TensorFlow and tf_keras (the collector
    off, as runner.experiment does it), the experiment's modules. A failure is left for the job's own import."""
    priority.lower_this_thread(priority.LOWEST)
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


IMPORTS_GRACE_SEC = 2.0  # how long a job waits for imports that are nearly done before it starts afresh


def _become_a_fresh_job(job: dict) -> None:
    """The job as a fresh `python -m runner` in this process (exec: same pid, same output), at normal priority: this
    thread never was lowered, and a thread cannot raise its priority back. The MLflow process started ahead sees its
    pipe close and ends; the job starts its own."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, [sys.executable, "-m", "runner", *job["argv"]], job["env"])
    except OSError:
        pass


def wait_for_job() -> None:
    """In a spare: import ahead and start the MLflow process, then wait for the job; sys.argv and os.environ become
    the job's. Exits quietly when the sweep goes away first."""
    import numpy  # noqa: F401  (here, at normal priority: its BLAS threads are the ones that compute)

    from runner.tracking import run as tracking

    uri = os.environ.get(contract.TRACKING_URI)
    if uri:
        tracking.spawn_ahead(uri, niceness=priority.LOWEST)
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
    importer.join(IMPORTS_GRACE_SEC)
    os.dup2(saved, 2)
    os.close(saved)
    sink.close()
    if importer.is_alive():  # a busy machine: imports at the lowest priority would hold the job for minutes
        _become_a_fresh_job(job)
        importer.join()  # exec failed: the job goes on here, once the imports are done
    # Threads that TensorFlow's import started inherited niceness 19. Where they cannot go back they are idle
    # helpers: the threads that train are started later, by the job.
    priority.threads_back_to_normal()
    for key in set(os.environ) - set(job["env"]):
        del os.environ[key]
    os.environ.update(job["env"])
    sys.argv[1:] = job["argv"]
    import runner

    runner.STARTED = handed  # the job's time starts when it was handed over: phases, time/to_first_step_sec
