"""One live owner per run or sweep directory (runner.control.claims), clock-named defaults that never collide, and resume='s
saved overrides (runner.app.with_resumed_overrides). Real processes and real locks; no TensorFlow."""

import json
import os
import signal
import subprocess
import sys

import pytest

from runner.app import with_resumed_overrides
from runner.control import claims
from runner.errors import ConfigError

HOLD = (
    "import sys, time; from runner.control import claims; claims.claim(sys.argv[1], 'hydra.run.dir', what=sys.argv[2]); "
    "print('held', flush=True); time.sleep(60)"
)


def hold(directory, what="run"):
    """A real process that claims `directory` (for a run or a sweep) and keeps it until it is killed."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(directory), what], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_runs_started_in_the_same_second_get_directories_of_their_own(tmp_path):
    base = tmp_path / "outputs" / "2026-12-01" / "10-00-00"
    code = "import sys; from runner.control import claims; print(claims.fresh_dir(sys.argv[1]), claims.fresh_dir(sys.argv[1]))"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(base)], stdout=subprocess.PIPE, text=True) for _ in range(4)]
    answers = [p.communicate(timeout=60)[0].split() for p in procs]
    assert all(first == again for first, again in answers)  # one answer per process, however often Hydra asks
    got = sorted(first for first, _ in answers)
    assert got == sorted([str(base), f"{base}_2", f"{base}_3", f"{base}_4"])
    assert all(os.path.isdir(d) for d in got)


def test_config_only_commands_create_no_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["runner", "--cfg", "hydra"])
    assert claims.fresh_dir(str(tmp_path / "never")) == str(tmp_path / "never")
    assert not (tmp_path / "never").exists()
    assert claims.claim_from_command_line(["--cfg=job", f"hydra.run.dir={tmp_path / 'never'}"]) == ""
    assert not (tmp_path / "never").exists()  # no lock taken for a command that only prints


def test_a_directory_a_live_process_holds_is_refused_and_free_once_it_dies(tmp_path):
    run_dir = tmp_path / "run"
    owner = hold(run_dir)
    (run_dir / ".hydra").mkdir()  # a runner's directory: resume= of it is claimed before Hydra
    try:
        with pytest.raises(ConfigError) as err:
            claims.claim(str(run_dir), "hydra.run.dir")
        message = str(err.value)
        assert f"hydra.run.dir={run_dir} is in use: process {owner.pid} on this host" in message
        assert "for a new run, pass another hydra.run.dir" in message and f"resume={run_dir}" in message
        problem = claims.claim_from_command_line([f"resume={run_dir}"])  # before Hydra writes .hydra/ there
        assert problem.startswith(f"resume={run_dir} is in use: process {owner.pid} on this host is still running a run")
        quoted = claims.claim_from_command_line([f"hydra.run.dir='{run_dir}'"])  # quoted: the same directory
        assert quoted.startswith(f"hydra.run.dir={run_dir} is in use"), quoted
        later = [f"hydra.run.dir={tmp_path}/runs/${{now:%H}}", f"hydra.run.dir={tmp_path}/x1,{tmp_path}/x2"]
        assert claims.claim_from_command_line(later) == "" and sorted(os.listdir(tmp_path)) == ["run"]  # Hydra's to make
        assert claims.holder(str(run_dir)) == (f"process {owner.pid} on this host", "run")
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    assert claims.holder(str(run_dir)) is None  # the kernel dropped the lock with the process
    assert claims.claim_from_command_line([f"hydra.run.dir={run_dir}"]) == ""  # taken at once, as a requeued job would
    assert claims.holder(str(run_dir))[0] == f"process {os.getpid()} on this host"
    claims.claim(str(run_dir), "hydra.run.dir")  # and again by the same process: nothing changes


def test_a_directory_in_use_names_what_holds_it_and_what_to_do(tmp_path):
    sweep, run = hold(tmp_path / "sweep", "sweep"), hold(tmp_path / "run")
    try:
        with pytest.raises(ConfigError, match=r"still running a sweep there.*pass another hydra.sweep.dir"):
            claims.claim(str(tmp_path / "sweep"), "hydra.sweep.dir", what="sweep")
        # a run into a sweep's directory: no resume= of it (a sweep directory is not a run's)
        problem = claims.claim_from_command_line([f"hydra.run.dir={tmp_path / 'sweep'}"])
        assert "still running a sweep there, and a run in the same directory" in problem and "resume=" not in problem
        with pytest.raises(ConfigError, match=r"still running a run there, and a sweep in the same directory"):
            claims.claim(str(tmp_path / "run"), "hydra.sweep.dir", what="sweep")
    finally:
        for owner in (sweep, run):
            owner.kill()
            owner.wait()


def test_tasks_that_share_their_jobs_directory_are_not_asked(tmp_path, monkeypatch):
    owner = hold(tmp_path / "job")
    try:
        argv = [f"hydra.run.dir={tmp_path / 'job'}"]
        worker = {"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}
        monkeypatch.setenv("TF_CONFIG", json.dumps(worker))
        assert claims.claim_from_command_line(argv) == ""
        monkeypatch.setenv("TF_CONFIG", json.dumps({**worker, "task": {"type": "worker", "index": 0}}))
        assert "is in use" in claims.claim_from_command_line(argv)  # worker 0 is the chief: it owns the directory
        monkeypatch.delenv("TF_CONFIG")
        monkeypatch.setenv("SLURM_STEP_ID", "0")
        assert claims.claim_from_command_line(argv) == ""
        monkeypatch.delenv("SLURM_STEP_ID")
        assert claims.claim_from_command_line(["--cfg", "job", *argv]) == ""
        assert claims.claim_from_command_line([f"resume={tmp_path / 'none'}"]) == ""
        assert not (tmp_path / "none").exists()  # resume= of no directory: refused later, nothing made here
        (tmp_path / "mine").mkdir()
        assert claims.claim_from_command_line([f"resume={tmp_path / 'mine'}"]) == ""
        assert list((tmp_path / "mine").iterdir()) == []  # not a runner's directory: no lock file left in it
    finally:
        owner.kill()
        owner.wait()


def test_resume_into_another_hydra_run_dir_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    (tmp_path / "run" / ".hydra").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    message = claims.claim_from_command_line([f"resume={tmp_path / 'run'}", "hydra.run.dir=elsewhere"])
    assert "resume= and hydra.run.dir= name two directories" in message and str(tmp_path / "elsewhere") in message
    assert not (tmp_path / "elsewhere").exists() and list((tmp_path / "run").iterdir()) == [tmp_path / "run" / ".hydra"]
    assert claims.claim_from_command_line([f"resume={tmp_path / 'run'}", "hydra.run.dir=run"]) == ""  # the same one
    monkeypatch.setenv("SLURM_STEP_ID", "0")  # a task of a job: its launcher chose its directory
    assert claims.claim_from_command_line([f"resume={tmp_path / 'run'}", "hydra.run.dir=run/task-1"]) == ""


def test_resume_brings_back_the_first_commands_overrides(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text("- train.epochs=100\n- strategy=mirrored\n- +extra.key=1\n- resume=old\n")
    assert with_resumed_overrides([f"resume={run_dir}"]) == [
        "train.epochs=100",
        "strategy=mirrored",
        "+extra.key=1",
        f"resume={run_dir}",
    ]
    # an override given now wins; flags keep their place; the saved ones go just before resume=
    assert with_resumed_overrides(["--cfg", "job", "train.epochs=200", f"resume={run_dir}"]) == [
        "--cfg",
        "job",
        "train.epochs=200",
        "strategy=mirrored",
        "+extra.key=1",
        f"resume={run_dir}",
    ]
    assert with_resumed_overrides([f"resume={tmp_path / 'nothing'}"]) == [f"resume={tmp_path / 'nothing'}"]
    assert with_resumed_overrides(["-m", f"resume={run_dir}"]) == ["-m", f"resume={run_dir}"]
    quoted = f"resume='{run_dir}'"  # what the runner says to write for a path Hydra reads only quoted
    assert with_resumed_overrides([quoted]) == ["train.epochs=100", "strategy=mirrored", "+extra.key=1", quoted]
