"""Thread priorities (Linux: a thread's niceness is its own): the MLflow process answers the calls a training
process waits for on threads started before it lowered itself, and its background calls below them."""

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from runner.control import priority
from runner.mlflow_process.process import _started_pool

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread niceness is Linux's")


def niceness() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def in_a_thread(fn):
    """fn() in a thread of its own (lowering this test's own thread would outlive the test)."""
    out = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join()
    return out[0]


def test_a_pool_started_before_its_thread_is_lowered_keeps_the_priority_it_had():
    def scenario():
        start = niceness()
        urgent = _started_pool(2, "urgent")
        priority.lower_this_thread(priority.LOWEST)  # as a sweep's spare MLflow process does
        lowered = ThreadPoolExecutor(max_workers=2, initializer=priority.lower_this_thread, initargs=(priority.BACKGROUND,))
        with urgent, lowered:
            urgent_levels = {urgent.submit(niceness).result() for _ in range(8)}
            background = lowered.submit(niceness).result()
        return start, niceness(), urgent_levels, background

    start, now, urgent_levels, background = in_a_thread(scenario)
    assert now == max(start, priority.LOWEST)
    assert urgent_levels == {start}  # both threads, whichever took the call
    assert background >= max(start, priority.BACKGROUND)  # started from the lowered thread: never above it


def test_lowering_never_raises_a_priority_and_in_background_lowers_the_caller():
    def scenario():
        priority.lower_this_thread(priority.LOWEST)
        priority.lower_this_thread(priority.BACKGROUND)  # a request to go back up is ignored
        after = niceness()
        return after, priority.in_background(niceness, priority.LOWEST)()

    after, inside = in_a_thread(scenario)
    assert after == priority.LOWEST and inside == priority.LOWEST
    assert in_a_thread(priority.in_background(niceness)) >= priority.BACKGROUND
