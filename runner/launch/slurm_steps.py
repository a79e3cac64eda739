"""cluster=slurm with cluster.elastic: the runner, started once inside a Slurm allocation (the batch script, or
`srun -n1`), starts every worker as a job step of its own (`srun --ntasks=1 --nodelist=<node>`) and supervises them
with runner.launch.localhost's launcher, so a lost worker is runner.launch.elastic's: the steps that remain are
stopped, and fresh steps of the smaller job restore the last checkpoint; the lost slot comes back as a new step.

What Slurm allows: steps come and go inside the allocation, so a step that is killed (its process killed, scancel of
the step) is started again on its node. The allocation itself does not grow: a node Slurm takes away (a failure, with
`sbatch --no-kill`) cannot be asked back, and its slot fails to start again, which counts as a further loss; without
`--no-kill` Slurm ends the whole job when a node fails. The job's size is the allocation's task count
(SLURM_NTASKS), spread over its nodes as Slurm laid them out (SLURM_TASKS_PER_NODE); every generation uses fresh ports
from cluster.port_base on.
"""

import logging
import os
import re
import signal
import subprocess

from runner.config import validate
from runner.errors import ConfigError
from runner.launch import elastic, localhost

log = logging.getLogger("runner")
SCONTROL_SEC = 30.0


def _nodes() -> list[str]:
    """The allocation's nodes, in order (`scontrol show hostnames`, Slurm's own expansion of the node list)."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST", "")
    out = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=SCONTROL_SEC, check=True
    )
    return out.stdout.split()


def slots(nodes: list[str], tasks_per_node: str) -> list[str]:
    """One node name per task slot, from SLURM_TASKS_PER_NODE's `2(x3),1` form (count, times repeated)."""
    counts = []
    for part in tasks_per_node.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise ValueError(f"SLURM_TASKS_PER_NODE={tasks_per_node!r}")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return [node for node, n in zip(nodes, counts) for _ in range(n)]


def allocation_size() -> int:
    """The allocation's task count, or ConfigError where this process cannot launch steps (with its own paragraph)."""
    if "SLURM_JOB_ID" not in os.environ:
        raise ConfigError(
            "cluster=slurm with cluster.elastic.enabled=true starts the workers as job steps of a Slurm allocation, and "
            "this process is in none (SLURM_JOB_ID is not set). Run it inside one: `sbatch --ntasks=3 --wrap 'python -m "
            "runner ... cluster=slurm cluster.elastic.enabled=true'`, or `salloc --ntasks=3 python -m runner ...`."
        )
    step_tasks = int(os.environ.get("SLURM_STEP_NUM_TASKS") or 1)
    if step_tasks > 1:
        raise ConfigError(
            f"cluster=slurm with cluster.elastic.enabled=true runs as one launcher that starts every worker as a job step, "
            f"and this is one of {step_tasks} tasks of `srun` (SLURM_STEP_NUM_TASKS={step_tasks}): each would launch a job "
            "of its own. Start it once, in the batch script or with `srun --ntasks=1`, in an allocation of as many "
            "tasks as the job has workers."
        )
    return int(os.environ.get("SLURM_NTASKS") or 1)


class SlurmTask(localhost.Task):
    """A launcher task played by a job step on `node`: the process this launcher holds is its `srun`."""

    node = step_name = None  # set by SlurmSteps.make_tasks

    def exit_note(self, code: int) -> str:
        if code > 128 and code - 128 in signal.Signals._value2member_map_:  # srun's exit code for a task killed by a signal
            return f"killed by {signal.Signals(code - 128).name} (its step on {self.node}; srun's exit code {code})"
        return f"{localhost.signal_name(code)} (its step on {self.node})"

    def signal(self, signum: int) -> None:
        """The signal to the step's task on its node (scancel), and to srun here, which ends with it."""
        if self.proc is None or self.proc.poll() is not None:
            return
        job = os.environ.get("SLURM_JOB_ID", "")
        step = _step_id(job, self.step_name)
        if step is not None:
            subprocess.run(
                ["scancel", "--quiet", f"--signal={signal.Signals(signum).name[3:]}", f"{job}.{step}"],
                capture_output=True,
                timeout=SCONTROL_SEC,
            )
        if signum == signal.SIGKILL or step is None:
            super().signal(signum)

    def frozen(self) -> bool:
        return False  # its process is on its node, not here


def _step_id(job: str, name: str) -> str | None:
    """The id of the job's step named `name` (squeue), or None while it has not started or after it ended."""
    out = subprocess.run(
        ["squeue", "--steps", f"--jobs={job}", "--noheader", "--format=%i %j"],
        capture_output=True,
        text=True,
        timeout=SCONTROL_SEC,
    )
    for line in out.stdout.splitlines():
        step, _, step_name = line.strip().partition(" ")
        if step_name == name and "." in step:
            return step.split(".", 1)[1]
    return None


class SlurmSteps:
    """The allocation's task slots, and the job steps of each generation of an elastic job (fresh ports each)."""

    def __init__(self, cfg, size: int):
        self.cfg, self.generation = cfg, 0
        self.slots = slots(_nodes(), os.environ.get("SLURM_TASKS_PER_NODE") or str(size))[:size]
        if len(self.slots) < size:
            raise ConfigError(f"the allocation lays out {len(self.slots)} task slot(s) for SLURM_NTASKS={size}")
        last = cfg.cluster.port_base + (cfg.cluster.elastic.max_restarts + 2) * size
        if last > 65535:
            raise ConfigError(
                f"cluster.port_base={cfg.cluster.port_base}: an elastic job of {size} workers takes fresh ports at each "
                f"resize, up to {last}, past 65535. Set a lower cluster.port_base."
            )

    @property
    def where(self) -> str:
        nodes = sorted(set(self.slots))
        return f"Slurm job {os.environ['SLURM_JOB_ID']} (job steps on {', '.join(nodes)})"

    def make_tasks(self, cfg, overrides, run_id: str, uri: str) -> list[SlurmTask]:
        """One step per worker of this generation, in the allocation's first slots, on ports of its own."""
        n = int(cfg.cluster.workers)
        base = self.cfg.cluster.port_base + self.generation * len(self.slots)
        spec = {"worker": [f"{self.slots[k]}:{base + k}" for k in range(n)]}
        tasks = localhost.build_tasks(cfg, overrides, run_id, uri, spec=spec, task_class=SlurmTask)
        for k, task in enumerate(tasks):
            task.node, task.step_name = self.slots[k], f"runner-{os.getpid()}-{self.generation}-{task.type}{task.index}"
            task.argv = [
                "srun",
                "--ntasks=1",
                "--nodes=1",
                f"--nodelist={task.node}",
                "--overlap",  # the CPUs of a step still stopping must not hold the next generation's back
                "--kill-on-bad-exit=1",
                "--quiet",
                f"--job-name={task.step_name}",
                *task.argv,
            ]
        self.generation += 1
        return tasks


def job_config(cfg, size: int):
    """The launcher's own view of the job: localhost's cluster fields for a job of `size` workers (the tasks never see
    it; they are cluster=tf_config)."""
    full = elastic.resized(cfg, size)
    full.cluster.update(ps=0, chief=False, evaluator=False, restart_workers=0)
    return full


def launch(cfg, chosen=None) -> dict:
    """Refused, before TensorFlow, where this process cannot launch steps or the job's sizes do not fit; else
    runner.launch.localhost's launcher over job steps."""
    size = allocation_size()
    if cfg.strategy.name != "multi_worker_mirrored":
        raise ConfigError(
            f"cluster=slurm with cluster.elastic.enabled=true and strategy={cfg.strategy.name}: under Slurm the launcher "
            "restarts multi_worker_mirrored jobs so far. Use strategy=multi_worker_mirrored, or cluster=localhost for an "
            "elastic parameter_server job."
        )
    full = job_config(cfg, size)
    validate.elastic(full)  # the checks that need the job's size, which only the allocation tells
    steps = SlurmSteps(cfg, size)
    return localhost.launch(cfg, chosen, make_tasks=steps.make_tasks, where=steps.where, job=full)
