"""runner/launch/slurm_steps.py (cluster=slurm with cluster.elastic), in process and without Slurm: the allocation's
slots as Slurm writes them, the refusals before TensorFlow, the steps each generation gets (fresh ports, srun in front
of the task's own command). The job on a real Slurm cluster, a step killed and the weights of one process:
tests/e2e/test_slurm.py."""

import json

import pytest

from runner.config import schema, validate
from runner.errors import ClusterError, ConfigError
from runner.launch import elastic, slurm_steps

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
        ({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "3"}, "a task of `srun` (step 0, 3 task(s))"),
        ({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "1"}, "a task of `srun` (step 0, 1 task(s))"),
    ],
)
def test_a_launcher_that_cannot_start_steps_is_refused(monkeypatch, env, said):
    for k in ("SLURM_JOB_ID", "SLURM_NTASKS", "SLURM_STEP_ID", "SLURM_STEP_NUM_TASKS"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError, match=said.replace("(", r"\(").replace(")", r"\)")):
        slurm_steps.allocation_size()


def test_the_size_is_the_allocations_task_count_or_its_slots(monkeypatch):
    monkeypatch.delenv("SLURM_STEP_ID", raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_NTASKS", "3")
    assert slurm_steps.allocation_size() == 3
    monkeypatch.delenv("SLURM_NTASKS")  # sbatch --nodes=2 alone
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "1(x2)")
    assert slurm_steps.allocation_size() == 2


def test_the_sizes_only_the_allocation_tells_are_checked_by_the_launcher():
    cfg = helpers.composed(*ELASTIC, "train.global_batch_size=64")
    validate.check_config(cfg)  # no cluster.workers under Slurm: the pure checks leave the sizes to the launcher
    with pytest.raises(ConfigError, match="does not divide over 3 worker"):
        validate.elastic(elastic.job_config(cfg, 3))
    with pytest.raises(ConfigError, match="cannot train through a single loss"):
        validate.elastic(elastic.job_config(cfg, 1))
    validate.elastic(elastic.job_config(helpers.composed(*ELASTIC, "train.global_batch_size=60"), 3))


def test_each_generation_gets_steps_on_its_slots_with_fresh_ports(monkeypatch, tmp_path):
    monkeypatch.setattr(slurm_steps, "_nodes", lambda: ["n1", "n2"])
    monkeypatch.setattr(slurm_steps, "_live_nodes", lambda job: ["n1", "n2"])
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "2,1")
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    cfg = helpers.composed(f"output_dir={tmp_path}", *ELASTIC, "cluster.port_base=20000", "train.global_batch_size=60")
    steps = slurm_steps.SlurmSteps(cfg, 3)
    assert steps.where == "Slurm job 42 (job steps on n1, n2)"
    first = steps.make_tasks(elastic.job_config(cfg, 3), [], "run", "sqlite:///x.db")
    second = steps.make_tasks(elastic.job_config(cfg, 2), [], "run", "sqlite:///x.db")
    assert [t.node for t in first] == ["n1", "n1", "n2"] and [t.node for t in second] == ["n1", "n1"]
    spec = json.loads(first[0].env["TF_CONFIG"])["cluster"]["worker"]
    assert spec == ["n1:20000", "n1:20001", "n2:20002"]
    assert json.loads(second[1].env["TF_CONFIG"])["cluster"]["worker"] == ["n1:20003", "n1:20004"]
    task = second[1]
    assert task.argv[:2] == ["srun", "--ntasks=1"] and "--nodelist=n1" in task.argv
    assert task.step_name.endswith("-1-worker1") and f"--job-name={task.step_name}" in task.argv
    assert "cluster=tf_config" in task.argv and task.argv[task.argv.index("-m") + 1] == "runner"
    assert "--export=ALL" in task.argv and "CUDA_VISIBLE_DEVICES" not in task.env  # no cluster.gpus_per_node


def test_a_node_slurm_took_away_is_not_used_again_and_its_gpus_are_split(monkeypatch, tmp_path):
    monkeypatch.setattr(slurm_steps, "_nodes", lambda: ["n1", "n2"])
    live = ["n1", "n2"]
    monkeypatch.setattr(slurm_steps, "_live_nodes", lambda job: live)
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "2(x2)")
    cfg = helpers.composed(f"output_dir={tmp_path}", *ELASTIC, "cluster.gpus_per_node=4", "train.global_batch_size=60")
    steps = slurm_steps.SlurmSteps(cfg, 4)
    first = steps.make_tasks(elastic.job_config(cfg, 4), [], "run", "sqlite:///x.db")
    assert [t.env["CUDA_VISIBLE_DEVICES"] for t in first] == ["0,1", "2,3", "0,1", "2,3"]
    live.remove("n1")  # under sbatch --no-kill, n1 failed
    smaller = steps.make_tasks(elastic.job_config(cfg, 2), [], "run", "sqlite:///x.db")
    assert [t.node for t in smaller] == ["n2", "n2"]
    with pytest.raises(ClusterError, match=r"took node\(s\) n1 away"):
        steps.make_tasks(elastic.job_config(cfg, 4), [], "run", "sqlite:///x.db")


def test_ports_past_65535_are_refused(monkeypatch, tmp_path):
    monkeypatch.setattr(slurm_steps, "_nodes", lambda: ["n1"])
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "3")
    cfg = helpers.composed(*ELASTIC, "cluster.port_base=65530")
    with pytest.raises(ConfigError, match="past 65535"):
        slurm_steps.SlurmSteps(cfg, 3)


def test_srun_exit_codes_of_a_signal_read_as_the_signal():
    assert [slurm_steps.as_signal(c) for c in (137, 139, 134, 143, 130, 3, 0, None)] == [-9, -11, -6, 143, 130, 3, 0, None]
    task = slurm_steps.SlurmTask("worker", 1, [], {}, "d")
    task.node = "n1"
    assert task.exit_note(-9) == "killed by SIGKILL (its step on n1)"
    assert task.exit_note(3) == "exit code 3 (its step on n1)"
