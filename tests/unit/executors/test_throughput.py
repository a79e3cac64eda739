"""runner/executors/base.Throughput: the per-window rates a throughput chart shows, against a clock the test sets."""

import pytest

from runner.executors import base
from runner.tracking import phases


@pytest.fixture
def clock(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(base.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(phases, "_marks", [])
    return now


def steps(meter, clock, first, last, seconds_each):
    for step in range(first, last + 1):
        clock[0] += seconds_each
        meter.tick(step)


def test_an_epochs_boundary_work_is_left_out_of_the_next_window_but_kept_in_the_whole_run(clock):
    meter = base.Throughput(global_batch_size=10, replicas=2)
    meter.start()
    steps(meter, clock, 1, 10, 0.01)  # the first tick is warm-up; then 9 steps of 10 ms
    assert meter.window()["throughput/window_step_time_ms"] == pytest.approx(10.0)
    meter.pause()  # epoch end: a checkpoint and the next epoch's iterator take 0.5 s
    clock[0] += 0.5
    meter.resume()
    steps(meter, clock, 11, 20, 0.01)
    rates = meter.window()
    assert rates["throughput/window_step_time_ms"] == pytest.approx(10.0)  # not (0.5 + 0.1) / 10: no dip at epoch start
    assert rates["throughput/window_examples_per_sec"] == pytest.approx(1000.0)
    assert rates["throughput/window_examples_per_sec_per_replica"] == pytest.approx(500.0)
    assert meter.overall()["summary/step_time_ms"] == pytest.approx((0.19 + 0.5) / 19 * 1000)  # wall time of training


def test_a_resume_without_a_pause_or_before_the_first_step_changes_nothing(clock):
    meter = base.Throughput(global_batch_size=10, replicas=1)
    meter.start()
    meter.resume()  # the first epoch starts: nothing was paused
    steps(meter, clock, 1, 5, 0.02)
    meter.resume()
    steps(meter, clock, 6, 9, 0.02)
    assert meter.window()["throughput/window_step_time_ms"] == pytest.approx(20.0)


def test_the_summary_from_logged_windows_is_the_meters_own_when_windows_are_whole(clock):
    """An attempt that resumed at the last step rebuilds summary/ from the windows earlier attempts logged
    (base.windows_summary); with no pause, that is what the meter's clock gave."""
    meter = base.Throughput(global_batch_size=10, replicas=2)
    meter.start()
    steps(meter, clock, 1, 1, 0.5)  # warm-up
    windows = []
    for first, last, seconds in ((2, 6, 0.01), (7, 11, 0.03), (12, 16, 0.02)):
        steps(meter, clock, first, last, seconds)
        windows.append([last, meter.window()["throughput/window_examples_per_sec"]])
    rebuilt, own = base.windows_summary(windows, 10, 2), meter.summary()
    for key in ("summary/examples_per_sec", "summary/examples_per_sec_per_replica", "summary/step_time_ms"):
        assert rebuilt[key] == pytest.approx(own[key])
    assert base.windows_summary([], 10, 2) == {}


def test_an_attempt_that_timed_only_its_first_call_reports_the_earlier_attempts_rate():
    """Resumed within one call of the end (a search's killed trial went on at step 560 of 600, 40 steps a call), an
    attempt times no step after its warm-up: its summary/ rate is the earlier attempts' windows', logged at the end."""
    from types import SimpleNamespace

    logged = []
    run = SimpleNamespace(earlier={"windows": [[20, 1000.0], [40, 1000.0]]}, log_end=lambda v, s: logged.append((s, v)))
    result = base.earlier_rate(base.Result(600, 0.5, {"eval/loss": 0.4}), run, 10, 2)
    assert result.examples_per_sec == pytest.approx(1000.0) and result.summary["summary/examples_per_sec_per_replica"] == 500
    assert result.eval == {"eval/loss": 0.4} and result.final_loss == 0.5  # this attempt's own
    assert logged == [(600, result.summary)]
    alone = base.Result(600, 0.5)
    assert base.earlier_rate(alone, SimpleNamespace(earlier=None), 10, 2) is alone  # nothing earlier: nothing made up
