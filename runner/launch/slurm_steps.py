"""cluster=slurm with cluster.elastic: the runner, started once inside a Slurm allocation (the batch script, or
`salloc`; not under `srun`), starts every worker as a job step of its own (`srun --ntasks=1 --nodelist=<node>`) and
supervises them with runner.launch.localhost's launcher, so a lost worker is runner.launch.elastic's: the steps that
remain are cancelled, and fresh steps of the smaller job restore the last checkpoint; the lost slot comes back as a
new step.

What Slurm allows: steps come and go inside the allocation, so a step that is killed (its process killed, scancel of
the step) is started again on its node. The allocation itself does not grow: a node Slurm takes away (a failure, with
`sbatch --no-kill`) cannot be asked back, so each generation is placed on the nodes the job still has (squeue), and
the job does not grow back past what they hold; without `--no-kill` Slurm ends the whole job when a node fails.
The job's size is the allocation's task count, spread over its nodes as Slurm laid them out (SLURM_TASKS_PER_NODE);
every generation uses fresh ports from cluster.port_base on.
"""

import logging
import os
import re
import signal
import subprocess

from runner.config import validate
from runner.errors import ClusterError, ConfigError
from runner.launch import elastic, localhost

log = logging.getLogger("runner")
SCONTROL_SEC = 30.0  # a Slurm command that does not answer within this counts as failed
SRUN_END_SEC = 10.0  # after scancel --signal=KILL of its step, how long srun gets to end


def _nodes() -> list[str]:
    """The allocation's nodes, in order (`scontrol show hostnames`, Slurm's own expansion of the node list)."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST", "")
    hosts = _hostnames(nodelist)
    if not hosts:
        raise ConfigError(
            f"cluster=slurm with cluster.elastic.enabled=true could not read the allocation's nodes (SLURM_JOB_NODELIST="
            f"{nodelist!r}, expanded with `scontrol show hostnames`); check that scontrol answers here."
        )
    return hosts


def _hostnames(nodelist: str) -> list[str] | None:
    """A Slurm node list (`vm[1-3]`) expanded by `scontrol show hostnames`, or None when empty or unanswered."""
    hosts = _slurm(["scontrol", "show", "hostnames", nodelist]) if nodelist else None
    return hosts.split() if hosts else None


def counts(tasks_per_node: str) -> list[int]:
    """The task count of each node, in order, from SLURM_TASKS_PER_NODE's `2(x3),1` form (count, times repeated)."""
    out = []
    for part in tasks_per_node.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise ConfigError(f"SLURM_TASKS_PER_NODE={tasks_per_node!r} is not in Slurm's `2(x3),1` form")
        out += [int(m.group(1))] * int(m.group(2) or 1)
    return out


def slots(nodes: list[str], tasks_per_node: str) -> list[str]:
    """One node name per task slot: each node as many times as Slurm lays tasks out on it."""
    return [node for node, n in zip(nodes, counts(tasks_per_node)) for _ in range(n)]


def allocation_size() -> int:
    """The allocation's task count, or ConfigError where this process cannot launch steps (with its own paragraph)."""
    if "SLURM_JOB_ID" not in os.environ:
        raise ConfigError(
            "cluster=slurm with cluster.elastic.enabled=true starts the workers as job steps of a Slurm allocation, and "
            "this process is in none (SLURM_JOB_ID is not set). Run it inside one: as the batch script's command "
            "(`sbatch --ntasks=3` with `exec python -m runner ... cluster=slurm cluster.elastic.enabled=true` in it, "
            "docs/clusters.md), or `salloc --ntasks=3 python -m runner ...`."
        )
    if "SLURM_STEP_ID" in os.environ:
        step_tasks = int(os.environ.get("SLURM_STEP_NUM_TASKS") or 1)
        raise ConfigError(
            "cluster=slurm with cluster.elastic.enabled=true runs as one launcher that starts every worker as a job "
            f"step, and this process is a task of `srun` (step {os.environ['SLURM_STEP_ID']}, {step_tasks} task(s)): "
            "inside a step Slurm describes the step, not the allocation, and each task would launch a job of its own. "
            "Run it as the batch script's own command (no srun in front), or under `salloc`."
        )
    tasks = os.environ.get("SLURM_NTASKS")  # unset where sbatch was given --nodes only: one task per node's slot
    return int(tasks) if tasks else sum(counts(os.environ.get("SLURM_TASKS_PER_NODE") or "1"))


def as_signal(code: int | None) -> int | None:
    """srun's exit code for a task killed by signal N is 128 + N; as a Popen's code, -N (what the launcher reads as
    a death by a signal). 130 and 143 stay: the runner exits with them itself after SIGINT and SIGTERM."""
    if code is not None and 128 < code < 128 + 64 and code not in (130, 143):
        return -(code - 128)
    return code


class _Srun:
    """The srun process of a step, its exit code read as the task's (as_signal)."""

    def __init__(self, popen: subprocess.Popen):
        self.popen = popen

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def stdout(self):
        return self.popen.stdout

    @property
    def returncode(self) -> int | None:
        return as_signal(self.popen.returncode)

    def poll(self) -> int | None:
        return as_signal(self.popen.poll())

    def wait(self, timeout=None) -> int:
        return as_signal(self.popen.wait(timeout=timeout))


class SlurmTask(localhost.Task):
    """A launcher task played by a job step on `node`: the process this launcher holds is its `srun`."""

    node = step_name = None  # set by SlurmSteps.make_tasks

    def start(self, lock) -> None:
        super().start(lock)
        self.proc = _Srun(self.proc)

    def exit_note(self, code: int) -> str:
        return f"{localhost.signal_name(code)} (its step on {self.node})"

    def signal(self, signum: int) -> None:
        """The signal to the step's task on its node (scancel of the step). SIGKILL waits for srun to end with its
        step, so that no process of it outlives the generation; a step not registered yet (or no answer from
        Slurm) is stopped through srun, which kills its step on SIGTERM."""
        if self.proc is None or self.proc.poll() is not None:
            return
        job = os.environ.get("SLURM_JOB_ID", "")
        step = _step_id(job, self.step_name)
        scancel = ["scancel", "--quiet", f"--signal={signal.Signals(signum).name[3:]}", f"{job}.{step}"]
        told = step is not None and _slurm(scancel) is not None
        if told and signum != signal.SIGKILL:
            return
        if not told:
            super().signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=SRUN_END_SEC)
        except subprocess.TimeoutExpired:
            log.warning("%s: srun did not end with its step within %gs; killing it", self.name, SRUN_END_SEC)
            super().signal(signal.SIGKILL)

    def frozen(self) -> bool:
        return False  # its process is on its node, not here


def _slurm(argv: list[str]) -> str | None:
    """A Slurm command's output, or None when it fails or does not answer (slurmctld busy or gone)."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=SCONTROL_SEC)
    except (OSError, subprocess.TimeoutExpired) as err:
        log.warning("%s: %s", argv[0], err)
        return None
    return out.stdout if out.returncode == 0 else None


def _step_id(job: str, name: str) -> str | None:
    """The id of the job's step named `name` (squeue), or None while it has not started, after it ended, or when
    Slurm does not answer."""
    out = _slurm(["squeue", "--steps", f"--jobs={job}", "--noheader", "--format=%i %j"]) or ""
    for line in out.splitlines():
        step, _, step_name = line.strip().partition(" ")
        if step_name == name and "." in step:
            return step.split(".", 1)[1]
    return None


def _live_nodes(job: str) -> list[str] | None:
    """The nodes the job holds now (squeue's node list, expanded by scontrol), or None when Slurm does not say."""
    return _hostnames((_slurm(["squeue", f"--jobs={job}", "--noheader", "--format=%N"]) or "").strip())


class SlurmSteps:
    """The allocation's task slots, and the job steps of each generation of an elastic job (fresh ports each)."""

    def __init__(self, cfg, size: int):
        self.cfg, self.generation = cfg, 0
        self.slots = slots(_nodes(), os.environ.get("SLURM_TASKS_PER_NODE") or str(size))[:size]
        if len(self.slots) < size:
            raise ConfigError(f"the allocation lays out {len(self.slots)} task slot(s) for {size} tasks (SLURM_NTASKS)")
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

    def slots_now(self) -> list[str]:
        """The slots on nodes the job still holds (a node Slurm took away under --no-kill is not used again)."""
        live = _live_nodes(os.environ.get("SLURM_JOB_ID", ""))
        return self.slots if live is None else [node for node in self.slots if node in live]

    def make_tasks(self, cfg, overrides, run_id: str, uri: str) -> list[SlurmTask]:
        """One step per worker of this generation, in the first slots on the nodes the job still holds, on ports of
        its own; with cluster.gpus_per_node, each step gets its share of its node's GPUs (CUDA_VISIBLE_DEVICES)."""
        n = int(cfg.cluster.workers)
        placed = self.slots_now()
        if len(placed) < n:
            gone = sorted(set(self.slots) - set(placed))
            raise ClusterError(
                f"cluster.elastic: {n} workers need {n} task slots, and the allocation has {len(placed)} left: Slurm "
                f"took node(s) {', '.join(gone)} away, and an allocation does not grow back. The job ends here; "
                f"rerun with resume={cfg.output_dir} in a new allocation to continue from the last checkpoint."
            )
        base = self.cfg.cluster.port_base + self.generation * len(self.slots)
        spec = {"worker": [f"{placed[k]}:{base + k}" for k in range(n)]}
        tasks = localhost.build_tasks(cfg, overrides, run_id, uri, spec=spec, task_class=SlurmTask)
        gpus = self.cfg.cluster.gpus_per_node
        for k, task in enumerate(tasks):
            task.node, task.step_name = placed[k], f"runner-{os.getpid()}-{self.generation}-{task.type}{task.index}"
            if gpus:  # as SlurmClusterResolver's auto_set_gpu: the node's GPUs split between its tasks
                local, on_node = placed[:k].count(task.node), placed[:n].count(task.node)
                share = max(1, gpus // on_node)
                task.env["CUDA_VISIBLE_DEVICES"] = ",".join(str(local * share + g) for g in range(share))
            task.argv = [
                "srun",
                "--ntasks=1",
                "--nodes=1",
                f"--nodelist={task.node}",
                "--overlap",  # the CPUs of a step still stopping must not hold the next generation's back
                "--export=ALL",  # TF_CONFIG and the run's variables, even under sbatch --export=NONE
                "--kill-on-bad-exit=1",
                "--quiet",
                f"--job-name={task.step_name}",
                *task.argv,
            ]
        self.generation += 1
        return tasks


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
    full = elastic.job_config(cfg, size)
    validate.elastic(full)  # the checks that need the job's size, which only the allocation tells
    steps = SlurmSteps(cfg, size)
    room = lambda: len(steps.slots_now())  # noqa: E731
    return localhost.launch(cfg, chosen, make_tasks=steps.make_tasks, where=steps.where, job=full, room=room)
