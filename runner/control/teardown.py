"""Ending a process that used TensorFlow without waiting on TensorFlow's teardown.

Destroying a tf.data iterator waits for tf.data's autotuning thread, which sleeps between optimisation rounds
(the pause doubles up to a minute) and is not woken when the iterator is cancelled: the main thread blocks for
0 to 13 s at random when the training iterator goes away (measured in docs/dev/benchmarks.md). So iterators are
kept (`keep`) until the process ends, and a process that is not a task of a TensorFlow cluster ends with
os._exit once its output is flushed (`exit`), skipping that wait and the rest of TensorFlow's teardown.
Tasks of a cluster (TF_CONFIG set) exit normally: TensorFlow's coordination service expects an orderly shutdown.

A process that never imported TensorFlow exits through sys.exit, so that the atexit handlers run; one that holds
mlflow (a sweep's, which read its runs back for the report) then skips the interpreter's teardown of mlflow,
SQLAlchemy and matplotlib (about half a second at a sweep's end) through `after_atexit`, which runner.__main__
registers before any other handler of its own, so that it runs after them.
"""

import logging
import os
import sys

_kept = []
_exiting: list[int] = []  # the code `exit` is ending this process with, for `after_atexit`


def keep(obj):
    """Hold `obj` (a tf.data iterator) until the process ends; returns it."""
    _kept.append(obj)
    return obj


SIGPIPE_EXIT = 141  # 128 + SIGPIPE: what a shell reports for a command whose reader went away


def _stdout_flushed() -> None:
    """Flush stdout; when its reader has gone (| head), point it at /dev/null, or Python's own flush at exit would
    print `Exception ignored ... BrokenPipeError`."""
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass


def exit(code) -> None:
    """sys.exit(code), or, after TensorFlow was imported in a process outside a cluster, flush and os._exit(code)."""
    _stdout_flushed()
    if "tensorflow" not in sys.modules or os.environ.get("TF_CONFIG"):
        if code is None or isinstance(code, int):
            _exiting.append(code or 0)
        sys.exit(code)
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message") prints it and exits 1
        print(code, file=sys.stderr)
        code = 1
    _exit_now(code)


def after_atexit() -> None:
    """The runner's last atexit handler: after `exit` in a process that holds mlflow and not TensorFlow, end it here,
    the other handlers having run, instead of tearing its modules down one by one."""
    if not _exiting or "tensorflow" in sys.modules or "mlflow" not in sys.modules:
        return
    _exit_now(_exiting[-1])


def _exit_now(code: int) -> None:
    """The logs and both streams flushed, then the process ends with `code`, its modules left as they are."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
