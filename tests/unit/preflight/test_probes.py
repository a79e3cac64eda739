"""runner/preflight/probes.py: the writable-directory probe, alone and with other processes probing the same path at once
(the tasks of a cluster all check their shared checkpoint directory as they start)."""

import multiprocessing
import os
import subprocess
import sys

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


@pytest.fixture
def full_disk(tmp_path):
    """A 64 KiB tmpfs, filled: a real full filesystem (root only: skipped with the reason elsewhere)."""
    mount = tmp_path / "full"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({made.stderr.strip() or 'not root'})")
    try:
        with open(mount / "fill", "wb") as f:
            try:
                f.write(b"\0" * (1 << 20))
            except OSError:
                pass
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_a_full_filesystem_is_named_before_anything_is_written(full_disk):
    assert writable_dir_problem(str(full_disk / "run")) == "No space left on device"
    proc = subprocess.run(
        [sys.executable, "-m", "runner", "train.epochs=1", f"hydra.run.dir={full_disk / 'run'}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"hydra.run.dir={full_disk / 'run'} cannot be used as the run's output directory (No space left" in proc.stderr
    assert "Free space there" in proc.stderr
