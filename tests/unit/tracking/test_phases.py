"""runner/tracking/phases.py: the `phases:` line, where a run's wall time went, phase by phase from process start."""

import re
import time

import pytest

import runner
from runner.tracking import phases


@pytest.fixture
def fresh(monkeypatch):
    """phases keeps its marks for the whole process: each test starts with none."""
    monkeypatch.setattr(phases, "_marks", [])
    return phases


def test_no_marks_no_phases(fresh):
    assert fresh.durations() == {}
    assert fresh.summary() == "phases: "


def test_each_phase_lasts_from_the_previous_mark_and_the_first_from_process_start(fresh):
    fresh.mark("start-up")
    since_start = time.perf_counter() - runner.STARTED
    time.sleep(0.05)
    fresh.mark("train")
    durations = fresh.durations()
    assert list(durations) == ["start-up", "train"]
    assert 0 < durations["start-up"] <= since_start
    assert 0.05 <= durations["train"] < 5


def test_a_phase_marked_again_adds_up_and_keeps_its_place(fresh):
    fresh.mark("mlflow")
    time.sleep(0.02)
    fresh.mark("train")
    time.sleep(0.03)
    fresh.mark("mlflow")
    durations = fresh.durations()
    assert list(durations) == ["mlflow", "train"]
    assert sum(durations.values()) <= time.perf_counter() - runner.STARTED  # the phases tile the time since start
    assert durations["train"] >= 0.02


def test_summary_is_one_line_of_seconds_in_phase_order(fresh):
    for name in ("imports", "data", "train"):
        fresh.mark(name)
    line = fresh.summary()
    assert "\n" not in line
    assert re.fullmatch(r"phases: imports \d+\.\d\ds, data \d+\.\d\ds, train \d+\.\d\ds", line), line


def test_an_error_raised_after_training_does_not_say_nothing_was_trained(monkeypatch, tmp_path):
    """A check that says "Nothing was trained" (the eval split's data function, at the end) once steps have run: the
    paragraph says what was kept instead (runner.tracking.run.said_after_training, used by runner.app)."""
    from runner.tracking import phases
    from runner.tracking.run import said_after_training

    text = "data._target_='m.f' raised OSError: gone (at m.py:3, in f). Nothing was trained; fix the function."
    monkeypatch.setattr(phases, "_marks", [])
    assert said_after_training(text, None) == text  # before the first step: true as said
    monkeypatch.setattr(phases, "_marks", [(phases.FIRST_STEP, 0.0)])
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "ckpt-40"\n')
    said = said_after_training(text, str(tmp_path))
    assert "Nothing was trained" not in said
    assert said.endswith(
        f"Training had run: the latest checkpoint is step 40 in {tmp_path}; resume= continues once this is fixed; "
        "fix the function."
    )
    lower = "the tfrecord files changed; nothing was trained."
    assert said_after_training(lower, None) == "the tfrecord files changed; Training had run: no checkpoint was written."
