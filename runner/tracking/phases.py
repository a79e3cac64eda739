"""Where a run's wall time goes, phase by phase, from process start (runner.STARTED) to the last MLflow write.

`mark(name)` closes the phase that ends now; `summary()` is one log line, printed last, which
benchmarks/wall.py reads to break whole-process times down.
"""

import time

from runner import STARTED

_marks = []  # (phase, perf_counter at its end)


def mark(name: str) -> None:
    _marks.append((name, time.perf_counter()))


def durations():
    out, last = {}, STARTED
    for name, at in _marks:
        out[name] = out.get(name, 0.0) + at - last
        last = at
    return out


def summary() -> str:
    return "phases: " + ", ".join(f"{k} {v:.2f}s" for k, v in durations().items())
