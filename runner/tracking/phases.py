"""Where a run's wall time goes, phase by phase, from process start (runner.STARTED) to the last MLflow write.

`mark(name)` closes the phase that ends now; `summary()` is one log line, printed last, which
benchmarks/wall.py reads to break whole-process times down.
"""

import time

import runner

_marks = []  # (phase, perf_counter at its end)
FIRST_STEP = "first step"  # marked by the executors' Throughput once the first training step has run


def trained() -> bool:
    """Whether this process has run a training step: a run refused before it trained nothing (runner.tracking.run)."""
    return any(name == FIRST_STEP for name, _ in _marks)


def mark(name: str) -> None:
    _marks.append((name, time.perf_counter()))


def durations():
    out, last = {}, runner.STARTED  # read now: a sweep's spare restarts the clock when it gets its job
    for name, at in _marks:
        out[name] = out.get(name, 0.0) + at - last
        last = at
    return out


def summary() -> str:
    return "phases: " + ", ".join(f"{k} {v:.2f}s" for k, v in durations().items())
