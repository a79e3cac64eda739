"""Process environment that must be in place before TensorFlow is imported."""

import contextlib
import ctypes
import os
import sys
import tempfile

M_ARENA_MAX = -8  # glibc's malloc.h
MIN_ARENAS = 128  # above the threads of the runner's largest training process on a small machine


def utf8_paths() -> None:
    """Under a locale whose encoding is not UTF-8 (LANG=en_US.ISO-8859-1), start this process again in Python's UTF-8
    mode (PEP 540), before anything else is imported. TensorFlow reads and writes paths as UTF-8 whatever the locale,
    while Python names files in the locale's encoding: a path beyond ASCII meant two names for one file there
    (TensorFlow's checkpoints in one directory, the runner's files in another; images listed by Python that
    TensorFlow could not find). The processes this one starts inherit the mode. PYTHONUTF8 set by you is kept, with
    a warning."""
    if sys.flags.utf8_mode or sys.getfilesystemencoding().lower() in ("utf-8", "utf8"):
        return
    if "PYTHONUTF8" in os.environ:
        print(
            f"Warning: PYTHONUTF8={os.environ['PYTHONUTF8']} under a locale that names files in "
            f"{sys.getfilesystemencoding()}: TensorFlow names them in UTF-8, so a path beyond ASCII would be two "
            "directories (the checkpoints in one, the run's files in the other). Unset PYTHONUTF8, or keep paths ASCII.",
            file=sys.stderr,
        )
        return
    os.environ["PYTHONUTF8"] = "1"
    try:  # the arguments go back as the bytes they came as; under UTF-8 mode they read as the user typed them
        os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
    except OSError:  # the interpreter cannot be started again here: go on as before
        del os.environ["PYTHONUTF8"]


def prepare() -> None:
    spread_malloc_arenas()
    pin_cpus()
    # Keras 3 lacks ParameterServerStrategy support and breaks on uneven replica batches;
    # tf_keras (Keras 2) is the supported path, and this is read at the first tf.keras access.
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    # Quiet by default; users can still raise the level through their own environment.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # oneDNN reorders float sums, which breaks bit-level comparisons between strategies.
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    # No usage reporting from MLflow: runs may be on machines without (or with watched) network access.
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    # The runner retries undelivered metrics itself (runner.tracking.run); MLflow's own default of 7 retries with
    # exponential backoff would hold one request for minutes while a server is down.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    # MLflow prints the run's URL, credentials included, when a run ends; the runner logs a redacted link itself.
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")


def pin_cpus() -> None:
    """A job of a sweep with sweep.parallel > 1 keeps to its share of the CPUs (RUNNER_CPUS, set by the sweep): pinned
    here, before TensorFlow starts a thread (its threads, and the processes this one starts, inherit it; TensorFlow
    sizes its thread pools by it)."""
    cpus = os.environ.get("RUNNER_CPUS")  # runner.control.contract.CPUS (not imported here: env comes first)
    if cpus and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
        except (ValueError, OSError):  # CPUs this process may not use: it runs on those it has
            pass


def glibc() -> bool:
    """Whether this process's C library is glibc (its malloc is what spread_malloc_arenas tunes)."""
    try:
        return os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc")
    except (ValueError, OSError, AttributeError):  # musl, macOS, Windows
        return False


def spread_malloc_arenas() -> bool:
    """One glibc malloc arena per thread, for the threads TensorFlow starts. True: the limit was handed to glibc.

    glibc allows a few arenas per core, then shares them between threads, the main thread's arena included. On a
    small machine TensorFlow starts far more threads than that. Which thread got the main thread's arena depended
    on the order threads first allocated (MLflow's threads shifted it), and a busy compute thread sharing it made
    the Python thread that runs the steps pay for consolidating that thread's freed chunks: the same run was
    slower at random (docs/dev/benchmarks-wall.md). glibc fixes its limit once a few threads have allocated, so this
    runs first (later, it is accepted and ignored). A limit the user set (MALLOC_ARENA_MAX, GLIBC_TUNABLES) is kept.
    """
    if not glibc():
        return False
    if "MALLOC_ARENA_MAX" in os.environ or "arena_max" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    try:
        return ctypes.CDLL(None).mallopt(M_ARENA_MAX, max(MIN_ARENAS, 8 * (os.cpu_count() or 1))) == 1
    except (OSError, AttributeError):
        return False


@contextlib.contextmanager
def native_stderr_captured():
    """Hide what TensorFlow's C++ side prints at import and device set-up (absl, CUDA probes).

    The text is kept and shown again if the block fails, so nothing useful is lost.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            sink.seek(0)
            sys.stderr.write(sink.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)
