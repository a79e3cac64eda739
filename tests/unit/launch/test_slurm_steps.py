"""runner/launch/slurm_steps.py (cluster=slurm with cluster.elastic), in process and without Slurm: the allocation's
slots as Slurm writes them, the refusals before TensorFlow, the steps each generation gets (fresh ports, srun in front
of the task's own command). The job on a real Slurm cluster, a step killed and the weights of one process:
tests/e2e/test_slurm.py."""

import json

import pytest

from runner.config import schema, validate
from runner.errors import ConfigError
from runner.launch import slurm_steps

import helpers

schema.register()
ELASTIC = ["strategy=multi_worker_mirrored", "cluster=slurm", "cluster.elastic.enabled=true"]


@pytest.mark.parametrize(
    "nodes, per_node, slots",
    [
        (["a"], "3", ["a", "a", "a"]),
        (["a", "b", "c"], "2(x2),1", ["a", "a", "b", "b", "c"]),
        (["a", "b"], "1,2", ["a", "b", "b"]),
    ],
)
def test_slots_follow_slurms_tasks_per_node(nodes, per_node, slots):
    assert slurm_steps.slots(nodes, per_node) == slots


@pytest.mark.parametrize(
    "env, said",
    [
        ({}, "this process is in none (SLURM_JOB_ID is not set)"),
        ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "3", "SLURM_STEP_NUM_TASKS": "3"}, "one of 3 tasks of `srun`"),
    ],
)
def test_a_launcher_that_cannot_start_steps_is_refused(monkeypatch, env, said):
    for k in ("SLURM_JOB_ID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError, match=said.replace("(", r"\(").replace(")", r"\)")):
        slurm_steps.allocation_size()


def test_the_sizes_only_the_allocation_tells_are_checked_by_the_launcher():
    cfg = helpers.composed(*ELASTIC, "train.global_batch_size=64")
    validate.check_config(cfg)  # no cluster.workers under Slurm: the pure checks leave the sizes to the launcher
    with pytest.raises(ConfigError, match="does not divide over 3 worker"):
        validate.elastic(slurm_steps.job_config(cfg, 3))
    with pytest.raises(ConfigError, match="cannot train through a single loss"):
        validate.elastic(slurm_steps.job_config(cfg, 1))
    validate.elastic(slurm_steps.job_config(helpers.composed(*ELASTIC, "train.global_batch_size=60"), 3))


def test_each_generation_gets_steps_on_its_slots_with_fresh_ports(monkeypatch, tmp_path):
    monkeypatch.setattr(slurm_steps, "_nodes", lambda: ["n1", "n2"])
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "2,1")
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    cfg = helpers.composed(f"output_dir={tmp_path}", *ELASTIC, "cluster.port_base=20000", "train.global_batch_size=60")
    steps = slurm_steps.SlurmSteps(cfg, 3)
    assert steps.where == "Slurm job 42 (job steps on n1, n2)"
    first = steps.make_tasks(slurm_steps.job_config(cfg, 3), [], "run", "sqlite:///x.db")
    second = steps.make_tasks(slurm_steps.job_config(cfg, 2), [], "run", "sqlite:///x.db")
    assert [t.node for t in first] == ["n1", "n1", "n2"] and [t.node for t in second] == ["n1", "n1"]
    spec = json.loads(first[0].env["TF_CONFIG"])["cluster"]["worker"]
    assert spec == ["n1:20000", "n1:20001", "n2:20002"]
    assert json.loads(second[1].env["TF_CONFIG"])["cluster"]["worker"] == ["n1:20003", "n1:20004"]
    task = second[1]
    assert task.argv[:2] == ["srun", "--ntasks=1"] and "--nodelist=n1" in task.argv
    assert task.step_name.endswith("-1-worker1") and f"--job-name={task.step_name}" in task.argv
    assert "cluster=tf_config" in task.argv and task.argv[task.argv.index("-m") + 1] == "runner"


def test_ports_past_65535_are_refused(monkeypatch, tmp_path):
    monkeypatch.setattr(slurm_steps, "_nodes", lambda: ["n1"])
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "3")
    cfg = helpers.composed(*ELASTIC, "cluster.port_base=65530")
    with pytest.raises(ConfigError, match="past 65535"):
        slurm_steps.SlurmSteps(cfg, 3)


def test_a_killed_steps_exit_code_names_the_signal():
    task = slurm_steps.SlurmTask("worker", 1, [], {}, "d")
    task.node = "n1"
    assert task.exit_note(137) == "killed by SIGKILL (its step on n1; srun's exit code 137)"
    assert task.exit_note(3) == "exit code 3 (its step on n1)"
