"""runner/launch/elastic.py (cluster.elastic), in process: the settings refused before TensorFlow, and the elastic
supervision over real task processes (build_tasks' tasks with their `python -m runner` swapped for a tiny `python -c`
script, as tests/unit/launch/test_localhost.py does): a lost worker restarts the job one smaller, past the limits it
ends as without elasticity. The whole thing with TensorFlow (the weights of one process after a loss and a regrowth):
tests/e2e/test_cluster.py and README's elastic command (tests/e2e/test_readme.py)."""

import json
import logging
import os
import signal
import sys
import time

import pytest

from runner.config import schema, validate
from runner.control import contract
from runner.errors import ClusterError, ConfigError
from runner.launch import elastic, localhost

import helpers

schema.register()
ELASTIC = ["strategy=multi_worker_mirrored", "cluster=localhost", "cross_device_ops=ring", "cluster.elastic.enabled=true"]


def script(*lines):
    return [sys.executable, "-c", "\n".join(["import os, signal, sys, time", *lines])]


class Recorded:
    """What the job's MLflow run is given (the launcher's RunLog has these three calls)."""

    def __init__(self):
        self.metrics, self.tags, self.texts = [], {}, {}

    def log_metrics(self, values, step):
        self.metrics.append((step, values))

    def set_tags(self, tags):
        self.tags.update(tags)

    def log_text(self, text, name):
        self.texts[name] = text


@pytest.fixture
def job(tmp_path):
    """make(overrides, scripts per generation) -> (cfg, tasks, rebuild, every generation's tasks): each generation
    runs that generation's {task name: argv}; every process still running is killed after the test."""
    made = []

    def make(overrides, generations):
        cfg = helpers.composed(f"output_dir={tmp_path}", *ELASTIC, *overrides)
        gens = iter(generations)

        def rebuild(workers):
            tasks = localhost.build_tasks(elastic.resized(cfg, workers), [], run_id="r", uri=f"sqlite:///{tmp_path}/m.db")
            commands = next(gens)
            for t in tasks:
                t.argv = commands[t.name]
            made.append(list(tasks))
            return tasks

        return cfg, rebuild(cfg.cluster.workers), rebuild, made

    yield make
    for tasks in made:
        for t in tasks:
            if t.proc and t.proc.poll() is None:
                os.killpg(t.proc.pid, signal.SIGKILL)
            if t.proc:
                t.proc.wait()
            for pump in t.pumps:
                pump.join(timeout=5)


def _supervise(cfg, tasks, rebuild, run):
    elastic.supervise(tasks, cfg, rebuild, run, localhost.supervise, localhost.stop_all, localhost._trainers, localhost.wait_for)


PROGRESS = "print('[00:00:00][INFO] epoch 2/4 step 3/8 loss 0.5', flush=True)"


def test_a_lost_worker_restarts_the_job_one_smaller_and_the_run_says_so(job, tmp_path, caplog):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-8"\n')
    first = {
        "worker:0": script(PROGRESS, "time.sleep(120)"),
        "worker:1": script("time.sleep(0.5)", "os.kill(os.getpid(), signal.SIGKILL)"),
        "worker:2": script("time.sleep(120)"),
    }
    second = {"worker:0": script(PROGRESS.replace("step 3/8", "step 5/8")), "worker:1": script("pass")}
    cfg, tasks, rebuild, _ = job(["cluster.workers=3", "cluster.elastic.rejoin_after_sec=null"], [first, second])
    caplog.set_level(logging.INFO, logger="runner")
    run, generation = Recorded(), list(tasks)
    _supervise(cfg, tasks, rebuild, run)
    assert [t.name for t in tasks] == ["worker:0", "worker:1"] and all(t.proc.returncode == 0 for t in tasks)
    assert [t.proc.returncode for t in generation] == [-signal.SIGKILL] * 3  # the survivors were stopped, none left
    assert [(step, values["cluster/world_size"]) for step, values in run.metrics] == [(8, 3.0), (8, 2.0)]
    (record,) = json.loads(run.texts["elastic/resizes.json"])
    assert record["why"] == "lost worker:1: killed by SIGKILL" and (record["from_workers"], record["to_workers"]) == (3, 2)
    assert (record["at_step"], record["checkpoint_step"], record["steps_redone"]) == (11, 8, 3)
    assert run.tags["cluster.elastic.resizes"] == "1"
    said = "cluster.elastic: 1 worker loss(es), 1 resize(s), 3 step(s) redone; the job ended at 2 worker(s), "
    assert said in caplog.text and "s over 2 generation(s)" in caplog.text  # the job's end sums up its losses


def test_a_smaller_job_that_reaches_its_last_step_while_stopping_to_grow_back_ends_there(job, tmp_path):
    """The back-off is over at its first checkpoint, but the trainers finish (exit 0) before the SIGTERM stops them:
    the job is done, no third generation starts (the fixture would have none to give) and no regrowth is recorded."""
    (tmp_path / "checkpoints").mkdir()
    index = tmp_path / "checkpoints" / "checkpoint"
    index.write_text('model_checkpoint_path: "ckpt-8"\n')
    first = {
        "worker:0": script(PROGRESS, "time.sleep(120)"),
        "worker:1": script("time.sleep(0.5)", "os.kill(os.getpid(), signal.SIGKILL)"),
        "worker:2": script("time.sleep(120)"),
    }
    finishing = ["signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))", "time.sleep(120)"]
    writes = f"open({str(index)!r}, 'w').write('model_checkpoint_path: \"ckpt-16\"\\n')"
    second = {
        "worker:0": script(PROGRESS.replace("step 3/8", "step 5/8"), writes, *finishing),
        "worker:1": script(*finishing),
    }
    cfg, tasks, rebuild, made = job(["cluster.workers=3", "cluster.elastic.rejoin_after_sec=0"], [first, second])
    run = Recorded()
    _supervise(cfg, tasks, rebuild, run)
    assert len(made) == 2 and [t.proc.returncode for t in tasks] == [0, 0]
    assert [values["cluster/world_size"] for _, values in run.metrics] == [3.0, 2.0]
    assert [r["to_workers"] for r in json.loads(run.texts["elastic/resizes.json"])] == [2]


def _preempted_first_generation(tmp_path):
    """worker:1 says it got SIGTERM and every trainer exits 143 after the checkpoint they agreed on (step 16)."""
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-16"\n')
    notice = (
        "print('[00:00:00][WARNING] SIGTERM received: stopping at the next step boundary every worker agrees on', flush=True)"
    )
    return {
        "worker:0": script(PROGRESS, "time.sleep(0.6)", "sys.exit(143)"),
        "worker:1": script(notice, "time.sleep(0.3)", "sys.exit(143)"),
        "worker:2": script("time.sleep(0.6)", "sys.exit(143)"),
    }


def test_a_preempted_worker_is_left_out_from_the_checkpoint_they_agreed_on_with_no_step_redone(job, tmp_path):
    first = _preempted_first_generation(tmp_path)
    second = {"worker:0": script(PROGRESS.replace("step 3/8", "step 5/8")), "worker:1": script("pass")}
    cfg, tasks, rebuild, made = job(["cluster.workers=3", "cluster.elastic.rejoin_after_sec=null"], [first, second])
    run = Recorded()
    _supervise(cfg, tasks, rebuild, run)
    assert len(made) == 2 and [t.name for t in tasks] == ["worker:0", "worker:1"]
    assert [(step, values["cluster/world_size"]) for step, values in run.metrics] == [(16, 3.0), (16, 2.0)]
    (record,) = json.loads(run.texts["elastic/resizes.json"])
    assert record["why"] == "worker:1 preempted (SIGTERM)" and (record["checkpoint_step"], record["steps_redone"]) == (16, 0)


def test_a_preemption_past_the_limits_ends_the_job_as_without_elasticity(job, tmp_path):
    from runner.launch.elastic import TaskPreempted

    cfg, tasks, rebuild, made = job(
        ["cluster.workers=3", "cluster.elastic.min_workers=3"], [_preempted_first_generation(tmp_path)]
    )
    with pytest.raises(TaskPreempted):  # runner.launch.localhost ends the run KILLED (exit 143), naming the task
        _supervise(cfg, tasks, rebuild, Recorded())
    assert len(made) == 1


@pytest.mark.parametrize(
    "overrides, said",
    [
        (["cluster.workers=2", "cluster.elastic.max_restarts=0"], "this is loss 1, past max_restarts=0"),
        (["cluster.workers=2", "cluster.elastic.min_workers=2"], "1 worker(s) would be left, below min_workers=2"),
    ],
)
def test_past_its_limits_the_job_ends_as_without_elasticity_naming_the_loss(job, overrides, said):
    first = {"worker:0": script("time.sleep(120)"), "worker:1": script("os.kill(os.getpid(), signal.SIGKILL)")}
    cfg, tasks, rebuild, _ = job(overrides, [first])
    with pytest.raises(ClusterError) as err:
        _supervise(cfg, tasks, rebuild, Recorded())
    assert str(err.value).startswith("task worker:1 (pid") and "stopped: killed by SIGKILL" in str(err.value)
    assert said in str(err.value) and err.value.exit_code == 3


@pytest.mark.parametrize("code", [1, 2, 4, 5])
def test_an_error_that_would_come_back_at_any_size_ends_the_job_without_a_restart(job, code):
    """A refused configuration, a blown-up loss, broken data, a failure: no worker was lost, so no smaller job."""
    first = {"worker:0": script("time.sleep(120)"), "worker:1": script(f"sys.exit({code})")}
    cfg, tasks, rebuild, made = job(["cluster.workers=2"], [first])
    run = Recorded()
    with pytest.raises((ClusterError, ConfigError)) as err:  # exit 2 before any checkpoint: refused, as without elastic
        _supervise(cfg, tasks, rebuild, run)
    assert "task worker:1" in str(err.value) and f"exit code {code}" in str(err.value)
    assert len(made) == 1 and "elastic/resizes.json" not in run.texts


def test_the_killed_worker_is_blamed_not_the_peer_that_gave_up_on_it_first(job, tmp_path):
    first = {
        "worker:0": script("time.sleep(0.3)", "sys.exit(3)"),  # a survivor's lost-peer error, seen first in task order
        "worker:1": script("time.sleep(0.4)", "os.kill(os.getpid(), signal.SIGKILL)"),
    }
    cfg, tasks, rebuild, made = job(["cluster.workers=2", "cluster.elastic.min_workers=2"], [first])
    with pytest.raises(ClusterError) as err:
        _supervise(cfg, tasks, rebuild, Recorded())
    assert str(err.value).startswith("task worker:1 (pid") and "killed by SIGKILL" in str(err.value), str(err.value)


@pytest.mark.parametrize(
    "overrides, said",
    [
        (["strategy=mirrored"], "other strategies run in one process"),
        (["cluster.workers=2", "cluster.elastic.min_workers=3"], "min_workers=3 is above the job's cluster.workers=2"),
        (["checkpoint.enabled=false"], "checkpoint.enabled=false writes none"),
        (["cluster.evaluator=true"], "with cluster.evaluator=true"),
        (["cluster.workers=1"], "such a job cannot train through a single loss"),
        (["cluster.workers=3", "cluster.elastic.min_workers=3"], "such a job cannot train through a single loss"),
        (["cluster.workers=3"], "train.global_batch_size=64 does not divide over 3 worker(s)"),
        (["cluster.workers=3", "train.global_batch_size=60", "data.input=from_function"], "data.input=from_function"),
        (
            ["train.global_batch_size=60", "data.input=numpy"],
            "Elastic jobs read in-memory data or TFRecord files (data.shard_policy=data) with data.input=tf_data",
        ),
        (["data=tfrecord", "data.train_files=/x/*.tfrecord"], "Set data.shard_policy=data"),
        (["data=tfrecord", "data.train_files=/x/*.tfrecord", "data.shard_policy=file"], "data.shard_policy=file: split by file"),
    ],
)
def test_settings_it_cannot_keep_are_refused_before_tensorflow(overrides, said):
    with pytest.raises(ConfigError) as err:
        validate.check_config(helpers.composed(*ELASTIC, *overrides))
    assert said in str(err.value)


def test_cluster_ray_tfrecord_files_read_by_every_worker_and_parameter_server_may_be_elastic():
    validate.check_config(helpers.composed(*ELASTIC, "cluster=ray"))  # its launcher is localhost's, with actors
    files = ["data=tfrecord", "data.train_files=/x/*.tfrecord", "data.shard_policy=data", "train.global_batch_size=60"]
    validate.check_config(helpers.composed(*ELASTIC, "cluster.workers=3", *files))
    ps = ["strategy=parameter_server", "cross_device_ops=auto", "cluster.ps=1", "cluster.workers=1"]  # restarted whole
    validate.check_config(helpers.composed(*ELASTIC, *ps))


def test_off_by_default_and_the_tasks_know_when_it_is_on(tmp_path):
    plain = helpers.composed(f"output_dir={tmp_path}", *ELASTIC[:-1])
    assert not elastic.enabled(plain)
    tasks = localhost.build_tasks(plain, [], run_id="r", uri="sqlite:///x.db")
    assert not any("RUNNER_ELASTIC" in t.env for t in tasks)
    on = helpers.composed(f"output_dir={tmp_path}", *ELASTIC)
    assert all(t.env["RUNNER_ELASTIC"] == "1" for t in localhost.build_tasks(on, [], run_id="r", uri="sqlite:///x.db"))


def test_the_steps_a_chief_logged_before_it_gave_up_are_not_logged_again_however_late_its_output_is_read(job, monkeypatch):
    heard = localhost.Task.heard

    def slowly(self, line, lock):  # a loaded machine: the launcher reads the chief's last lines after it has exited
        time.sleep(0.002)
        heard(self, line, lock)

    monkeypatch.setattr(localhost.Task, "heard", slowly)
    burst = "print('\\n'.join(['noise'] * 500), flush=True)"
    first = {
        "worker:0": script("time.sleep(0.3)", PROGRESS, burst, PROGRESS.replace("step 3/8", "step 7/8"), "sys.exit(3)"),
        "worker:1": script("time.sleep(0.4)", "os.kill(os.getpid(), signal.SIGKILL)"),
        "worker:2": script("time.sleep(120)"),
    }
    second = {"worker:0": script("pass"), "worker:1": script("pass")}
    cfg, tasks, rebuild, made = job(["cluster.workers=3", "cluster.elastic.rejoin_after_sec=null"], [first, second])
    _supervise(cfg, tasks, rebuild, Recorded())
    assert made[1][0].env[contract.LOGGED_THROUGH] == "15"  # epoch 2 step 7 of 8: the chief's last logged step
