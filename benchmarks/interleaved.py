"""Timing several ways of doing one thing inside one process: alternating chunks, order rotated each round.

Separate processes on this VM differ by 5-8% from run to run; inside one process, dividing each round by the
reference's time in the same round resolves about 2%.
"""

import statistics
import time


def time_in_chunks(calls, rounds: int, per_chunk: int, warmup: int):
    """{name: [median µs per call, one per round]} for calls = {name: zero-argument callable}."""
    names = list(calls)
    for name in names:  # tracing done, pipelines filled
        for _ in range(warmup):
            calls[name]()
    times = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            chunk = []
            for _ in range(per_chunk):
                started = time.perf_counter()
                calls[name]()
                chunk.append(time.perf_counter() - started)
            times[name].append(1e6 * statistics.median(chunk))
    return times


def print_table(label: str, times, reference: str, reference_label: str) -> None:
    """A Markdown row per way: median µs per call, and the median of its per-round ratios to the reference."""
    print(f"| {label} | median us per call | paired ratio to {reference_label}, median |")
    print("|---|---|---|")
    for name, values in times.items():
        ratio = statistics.median(a / b for a, b in zip(values, times[reference]))
        print(f"| {name} | {statistics.median(values):.0f} | {ratio:.3f} |")
