"""runner/preflight/probes.py: the writable-directory probe, alone and with other processes probing the same path at once
(the tasks of a cluster all check their shared checkpoint directory as they start)."""

import multiprocessing
import os

import pytest

from runner.preflight.probes import writable_dir_problem


def _probe(path, answers):
    answers.put(writable_dir_problem(path))


@pytest.mark.slow  # 200 processes: a race needs many trials to show
def test_tasks_probing_one_directory_together_all_find_it_usable(tmp_path):
    context = multiprocessing.get_context("fork")
    problems = []
    for trial in range(40):
        path = tmp_path / f"run{trial}" / "checkpoints"
        answers = context.Queue()
        tasks = [context.Process(target=_probe, args=(str(path), answers)) for _ in range(5)]
        for t in tasks:
            t.start()
        for t in tasks:
            t.join()
        problems += [p for p in (answers.get() for _ in tasks) if p]
    assert problems == []


def test_what_cannot_hold_a_directory_is_named(tmp_path):
    (tmp_path / "file").write_text("")
    assert writable_dir_problem(str(tmp_path / "file" / "sub")) == f"{tmp_path / 'file'} is a file, not a directory"
    assert "No such file or directory" in writable_dir_problem("/proc/runner-probe")
    assert writable_dir_problem(str(tmp_path / "new" / "deeper")) is None
    assert not os.path.exists(tmp_path / "new")  # the probe's own directories are removed again
