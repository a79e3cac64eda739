"""cluster=localhost: start every task as its own OS process on 127.0.0.1 and supervise them.

Each task is `python -m runner <same overrides> cluster=tf_config` with its own TF_CONFIG. Their output is
merged here with a `[task]` prefix. The launcher owns the MLflow run (tasks attach to it), and stops every
task when the job ends, fails or is interrupted. No TensorFlow is imported in this process.
"""

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from contextlib import nullcontext
from dataclasses import dataclass, field

from omegaconf import DictConfig

from runner.config import layout
from runner.config.command_line import override
from runner.control import contract, pace, procs, stopping
from runner.errors import ClusterError, ConfigError
from runner.launch import elastic
from runner.launch.elastic import TaskLost, TaskPreempted
from runner.tracking.run import mlflow_run, where_line
from runner.tracking.runlog import NullRun

log = logging.getLogger("runner")
POLL_SEC = 0.2
BLAME_SEC = 2.0  # a job that lost a trainer: how long the launcher looks for the one killed before naming a peer
OUTPUT = threading.Lock()  # one task's line at a time on this process's output (cluster=tf_config: other pods' too)
PROGRESS = re.compile(r"\] epoch (\d+)/(\d+) step (\d+)/(\d+) loss ")  # runner.executors.base.progress_line
# TensorFlow's own C++ error lines (absl's format: E0000 00:00:1796646282.148139   27056 ring_alg.cc:291] ...), and the
# lines of the same message after them; the runner's own lines, its paragraphs and Python's tracebacks start otherwise
CPP_ERROR = re.compile(r"^E\d{4} [\d:.]+\s+\d+ \S+:\d+\] ")
OWN_LINE = re.compile(r"^(\[\d\d:\d\d:\d\d\]|Error: |Stopped: |Interrupted|Traceback|Warning: )")
CPP_LOG = "tensorflow.log"


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """Ports the OS says are free now on `host` ("": every interface, a pod's); taken right before the tasks start to
    keep the race short."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def cluster_shape(cfg) -> dict[str, int]:
    """{job: number of tasks} of the cluster the config asks for (the evaluator is no job of it)."""
    c = cfg.cluster
    ps_strategy = cfg.strategy.name == "parameter_server"
    shape = {"chief": 1 if (c.chief or ps_strategy) else 0, "worker": c.workers, "ps": c.ps if ps_strategy else 0}
    return {job: n for job, n in shape.items() if n}


def cluster_spec(cfg) -> dict[str, list[str]]:
    shape = cluster_shape(cfg)
    ports = iter(free_ports(sum(shape.values())))
    return {job: [f"127.0.0.1:{next(ports)}" for _ in range(n)] for job, n in shape.items()}


def signal_name(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


@dataclass
class Task:
    type: str
    index: int
    argv: list[str]
    env: dict[str, str]
    run_dir: str
    proc: subprocess.Popen | None = None
    restarts: int = 0
    pumps: list[threading.Thread] = field(default_factory=list)
    notified: bool = False  # it said it received SIGINT/SIGTERM itself (its peers stop because it did)
    step: int | None = None  # the global step of its last progress line (the elastic launcher's record of a loss)
    last_step: int | None = None  # the job's final step, from the same line
    paced: pace.Pace | None = None  # executor.verbose=auto or 1: its progress lines shown at most one a second
    progress_shown: bool = True  # executor.verbose=0: its progress lines read, none shown
    cpp_lines: int = 0  # TensorFlow's C++ error lines written to its tensorflow.log instead of the terminal
    in_cpp: bool = False  # the last line was one of them (or went on one)

    @property
    def name(self) -> str:
        return f"{self.type}:{self.index}"

    @property
    def is_server(self) -> bool:
        """ps and (under parameter_server) worker tasks only serve; they never end by themselves (runner.config.layout)."""
        return self.env.get(contract.TASK_ROLE) == layout.SERVER

    def start(self, lock: threading.Lock) -> None:
        # A session of its own, so stopping the task stops everything it started; and it dies with the launcher,
        # even a launcher killed with SIGKILL (procs.popen; supervise() calls this from the main thread).
        self.proc = contract.start_child(self.argv, self.env, bufsize=1, start_new_session=True)
        log.info("started %s (pid %d)", self.name, self.proc.pid)
        pump = threading.Thread(target=self._pump, args=(self.proc, lock), daemon=True)
        pump.start()
        self.pumps.append(pump)

    def _pump(self, proc, lock):
        with proc.stdout:  # closed at EOF: a restarted task does not keep its dead predecessor's pipe open
            for line in proc.stdout:
                self.heard(line, lock)

    def heard(self, line: str, lock: threading.Lock) -> None:
        """One line of its output: what it says about itself noted (a stop notice, its step), then printed."""
        if self._cpp_error(line, lock):
            return
        if stopping.NOTICE in line:
            self.notified = True
        progress = PROGRESS.search(line)
        if progress:
            epoch, epochs, step, per_epoch = (int(g) for g in progress.groups())
            self.step, self.last_step = (epoch - 1) * per_epoch + step, epochs * per_epoch
            if not self.progress_shown or (self.paced is not None and not self.paced.due(last=self.step >= self.last_step)):
                return
        with lock:
            sys.stdout.write(f"[{self.name}] {line}")
            sys.stdout.flush()

    def _cpp_error(self, line: str, lock: threading.Lock) -> bool:
        """TensorFlow's C++ error lines (20 or so from each survivor when a peer is killed: gRPC's UNAVAILABLE,
        "Restart your program to reset") go to <task dir>/tensorflow.log, said once; the task's own paragraph says
        what happened. Whether `line` was one."""
        self.in_cpp = bool(CPP_ERROR.match(line)) or (self.in_cpp and not OWN_LINE.match(line))
        if not self.in_cpp:
            return False
        path = os.path.join(self.run_dir, CPP_LOG)
        try:
            os.makedirs(self.run_dir, exist_ok=True)
            with open(path, "a") as f:
                f.write(line)
        except OSError:  # nowhere to keep it: shown, as before
            self.in_cpp = False
            return False
        self.cpp_lines += 1
        if self.cpp_lines == 1:
            with lock:
                sys.stdout.write(f"[{self.name}] TensorFlow's own error lines go to {path}\n")
                sys.stdout.flush()
        return True

    def frozen(self) -> bool:
        """Whether it is stopped (SIGSTOP, a debugger) rather than running."""
        return self.proc.poll() is None and procs.state(self.proc.pid) in ("T", "t")

    def exit_note(self, code: int) -> str:
        """How it ended, for the error that names it."""
        return signal_name(code)

    def signal(self, signum: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signum)
            except ProcessLookupError:
                pass

    def wait_or_kill(self, deadline: float) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop in time; killing it", self.name)
            self.signal(signal.SIGKILL)
            self.proc.wait()


def wait_for(tasks: list["Task"], seconds: float) -> None:
    """Let the tasks exit by themselves, for up to `seconds` in all."""
    deadline = time.monotonic() + seconds
    for t in tasks:
        try:
            t.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass


def stop_all(tasks: list["Task"], grace: float) -> None:
    """SIGTERM to every task at once (trainers take it as a preemption notice and checkpoint at a step they agree
    on), then SIGKILL whatever still runs after `grace` seconds. Trainers first: a coordinator outliving its
    servers floods the log."""
    trainers = _trainers(tasks)
    try:
        for group in (trainers, [t for t in tasks if t not in trainers]):
            for t in group:
                t.signal(signal.SIGTERM)
            deadline = time.monotonic() + grace
            for t in group:
                t.wait_or_kill(deadline)
    except (KeyboardInterrupt, stopping.Stopped):  # asked again while waiting: stop now, leave nothing behind
        for t in tasks:
            t.signal(signal.SIGKILL)
        raise


OWNED_KEYS = ("cluster", "resume", "hydra.run.dir", "checkpoint.dir", "mlflow.tracking_uri")


def _task_overrides(overrides: list[str], strategy: str) -> list[str]:
    """The user's overrides, minus what the launcher decides for each task; the strategy as validate resolved it
    (strategy=auto is decided once, here, not again in each task)."""

    def owned(override: str) -> bool:
        key = override.lstrip("+~").split("=", 1)[0]
        return key == "strategy" or any(key == k or key.startswith(k + ".") for k in OWNED_KEYS)

    return [*(o for o in overrides if not owned(o)), f"strategy={strategy}"]


def build_tasks(cfg: DictConfig, overrides: list[str], run_id: str, uri: str, spec=None, task_class=Task) -> list[Task]:
    """One task per member of `spec` (default: free ports on 127.0.0.1), plus the evaluator when asked for."""
    spec = spec or cluster_spec(cfg)
    out = cfg.output_dir
    launch_id = uuid.uuid4().hex
    tasks = []
    members = [(job, i) for job, addrs in spec.items() for i in range(len(addrs))]
    if cfg.cluster.evaluator:
        members.append(("evaluator", 0))
    for job, i in members:
        env = contract.child_env(
            uri,
            **{
                "TF_CONFIG": json.dumps({"cluster": spec, "task": {"type": job, "index": i}}),
                contract.ATTACH_RUN: run_id or contract.NO_RUN,
                contract.LAUNCH_ID: launch_id,
                contract.TASK_ROLE: layout.task_role(cfg.strategy.name, job),
                **({contract.ELASTIC: "1"} if elastic.enabled(cfg) else {}),
            },
        )
        run_dir = layout.task_dir(out, job, i)
        argv = contract.runner_command(
            [
                *_task_overrides(overrides, cfg.strategy.name),
                "cluster=tf_config",
                f"cluster.start_timeout_sec={cfg.cluster.start_timeout_sec}",
                override("hydra.run.dir", run_dir),  # quoted where the path needs it (a space, beyond ASCII)
                override("checkpoint.dir", layout.checkpoint_dir(cfg)),
            ]
        )
        task = task_class(job, i, argv, env, run_dir)
        verbose = str(cfg.executor.verbose)
        task.progress_shown = verbose != "0"
        if verbose in ("auto", "1"):  # no bar through a pipe: its lines, paced
            task.paced = pace.Pace()
        tasks.append(task)
    return tasks


def _trainers(tasks: list[Task]) -> list[Task]:
    return [t for t in tasks if t.env.get(contract.TASK_ROLE) == layout.TRAINER]


def _has_checkpoints(cfg) -> bool:
    if not (cfg.checkpoint.dir or cfg.output_dir):
        return False
    directory = layout.checkpoint_dir(cfg)
    return os.path.isdir(directory) and any(os.scandir(directory))


def supervise(tasks: list[Task], cfg, tick=None) -> None:
    """Run until every trainer exits 0. A dead server task is restarted (parameter_server recovers);
    any other task that fails stops the whole cluster with an error naming it (TaskLost for a trainer). `tick`:
    called at every poll (the elastic launcher's watch; it may raise to end this supervision)."""
    lock = OUTPUT
    for t in tasks:
        t.start(lock)
    trainers = _trainers(tasks)
    while True:
        time.sleep(POLL_SEC)
        if tick is not None:
            tick()
        for t in tasks:
            code = t.proc.poll()
            if code is None or (code == 0 and not t.is_server):
                continue
            if code == stopping.EXIT_CODES[signal.SIGTERM] and not t.is_server:
                raise TaskPreempted(signal.SIGTERM, f"task {t.name} was preempted (SIGTERM) and the trainers stopped together")
            whole_job = t.type == "ps" and elastic.enabled(cfg)  # the coordinator cannot survive it: the job restarts
            if t.is_server and t.restarts < cfg.cluster.restart_workers and not whole_job:
                t.restarts += 1
                log.warning(
                    "%s stopped (%s); restarting it (%d/%d)", t.name, t.exit_note(code), t.restarts, cfg.cluster.restart_workers
                )
                t.start(lock)
                continue
            if code == ConfigError.exit_code and not t.is_server and not _has_checkpoints(cfg):
                # bad input, refused before anything was trained: not a lost task, and nothing to resume
                raise ConfigError(
                    f"task {t.name} refused the configuration (exit code 2; why is said above, its log is "
                    f"{t.run_dir}/runner.log). The other tasks were stopped. Change the configuration and run again."
                )
            frozen = [o for o in tasks if o is not t and o.frozen()]
            if frozen:  # a peer that is stopped (SIGSTOP, a debugger) makes the healthy ones give up: name it
                f = frozen[0]
                raise ClusterError(
                    f"task {f.name} (pid {f.proc.pid}) was stopped (SIGSTOP or a debugger) and did not answer, so task "
                    f"{t.name} gave up waiting for it ({t.exit_note(code)}). The other tasks were stopped. Logs are in "
                    f"{f.run_dir}/runner.log and {t.run_dir}/runner.log; rerun with resume={cfg.output_dir} to continue "
                    "from the last checkpoint."
                )
            message = _stopped(t, code, cfg)
            raise TaskLost(message, t, t.exit_note(code), code) if t in trainers or whole_job else ClusterError(message)
        if all(t.proc.poll() == 0 for t in trainers):
            evaluators = [t for t in tasks if t.type == "evaluator"]
            for t in evaluators:  # it ends by itself after the last checkpoint
                try:
                    t.proc.wait(timeout=cfg.cluster.start_timeout_sec)
                except subprocess.TimeoutExpired:
                    log.warning("%s did not finish evaluating; stopping it", t.name)
            return


def _stopped(t: Task, code: int, cfg) -> str:
    return (
        f"task {t.name} (pid {t.proc.pid}) stopped: {t.exit_note(code)}. The other tasks were stopped. "
        f"Its log is in {t.run_dir}/runner.log; rerun with resume={cfg.output_dir} to continue from the last checkpoint."
    )


def _the_killed(lost: TaskLost, tasks: list[Task], cfg) -> TaskLost:
    """The task to name for a job that lost one: a trainer that stopped because it lost a peer (exit 3) ended first,
    and the peer killed by a signal is named once its own end shows (a Ray actor's death shows a second or two
    later, through its pump); the first one when none does within BLAME_SEC."""
    deadline = time.monotonic() + BLAME_SEC
    while lost.code == ClusterError.exit_code and time.monotonic() < deadline:
        found = elastic.killed(tasks)
        if found is not None:
            t, code = found
            return TaskLost(_stopped(t, code, cfg), t, t.exit_note(code), code)
        time.sleep(POLL_SEC / 2)
    return lost


def launch(
    cfg: DictConfig, chosen=None, make_tasks=build_tasks, where: str = "127.0.0.1", job=None, room=None, wait_for_room=False
) -> dict:
    """Start the tasks `make_tasks(cfg, overrides, run_id, uri)` returns (here: processes on 127.0.0.1; cluster=ray:
    runner.launch.ray_cluster; cluster=slurm's elastic job steps: runner.launch.slurm_steps), supervise them inside
    one MLflow run, and return the chief's summary. `chosen`: strategy=auto's choice, tagged on the run. `job`: the
    launcher's own view of the cluster where it is not the config's (Slurm's job size); the run logs `cfg`. `room`:
    how many workers the cluster can hold now, for an elastic job's regrowth (runner.launch.elastic), asked again
    later when short with `wait_for_room` (cluster=tf_config's pods: runner.launch.pods)."""
    from hydra.core.hydra_config import HydraConfig

    overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    stopping.install()
    logged, cfg = cfg, job if job is not None else cfg
    # mlflow.enabled=false: no run, and the tasks log nowhere either
    context = mlflow_run(logged, overrides, chosen.tags if chosen else {}) if cfg.mlflow.enabled else nullcontext(NullRun())
    with context as run:
        tasks = make_tasks(cfg, overrides, run.run_id, run.tracking_uri)
        log.info("cluster on %s: %s", where, ", ".join(t.name for t in tasks))
        log.info(
            "note: TensorFlow's gRPC servers listen on every interface, not only the address in TF_CONFIG (hard-coded "
            "in TensorFlow); on a shared network, firewall the task ports"
        )
        run.set_tags({"cluster.tasks": ",".join(t.name for t in tasks)})
        try:
            if elastic.enabled(cfg):  # tasks is updated in place at each resize
                rebuild = lambda n: make_tasks(elastic.resized(cfg, n), overrides, run.run_id, run.tracking_uri)  # noqa: E731
                elastic.supervise(tasks, cfg, rebuild, run, supervise, stop_all, _trainers, wait_for, room, wait_for_room)
            else:
                try:
                    supervise(tasks, cfg)
                except TaskLost as lost:
                    raise _the_killed(lost, tasks, cfg) from None
        except (KeyboardInterrupt, stopping.Stopped) as err:
            log.warning(
                "stopping: every task gets up to %gs (cluster.stop_grace_sec) to write its checkpoint", cfg.cluster.stop_grace_sec
            )
            if isinstance(err, TaskPreempted):  # the others are checkpointing with it: a signal now would only interrupt them
                wait_for(_trainers(tasks), cfg.cluster.stop_grace_sec)
                told = [t.name for t in _trainers(tasks) if t.notified]  # the first to exit may be a peer it told
                if told:
                    err = TaskPreempted(
                        signal.SIGTERM, f"task {', '.join(told)} was preempted (SIGTERM) and the trainers stopped together"
                    )
            stop_all(tasks, cfg.cluster.stop_grace_sec)
            # Read the checkpoint only now: the chief may still have been writing it when a peer exited.
            signum = signal.Signals[err.signal_name] if isinstance(err, stopping.Stopped) else signal.SIGINT
            reason = str(err) if isinstance(err, stopping.Stopped) else "stopped by SIGINT"
            note = layout.checkpoint_note(layout.checkpoint_dir(cfg))
            raise stopping.Stopped(signum, f"{reason}; every task was stopped and {note}.") from None
        finally:
            stop_all(tasks, cfg.cluster.failure_grace_sec)
            for t in tasks:
                for pump in t.pumps:
                    pump.join(timeout=2)
        log.info("all %d tasks finished", len(tasks))
        summary = {**_chief_summary(tasks), "run_id": run.run_id}
    log.info(where_line(run, cfg))
    return summary


def _chief_summary(tasks: list[Task]) -> dict:
    """The chief task's summary.json (its final figures), when it wrote one."""
    spec = json.loads(tasks[0].env["TF_CONFIG"])["cluster"]
    for t in tasks:
        if t.type != "evaluator" and layout.is_chief(t.type, t.index, spec):
            try:
                with open(layout.summary_path(t.run_dir)) as f:
                    return json.load(f)
            except (OSError, ValueError):
                return {}
    return {}
