"""cluster=ray: every task of the cluster is a Ray actor (runner.launch.ray_actor) on a Ray cluster, supervised from here.

The cluster is `cluster.address`, or a local head started for this run (`ray.init(address="local")`) and shut down
after it. One placement group holds a bundle per task (`cluster.placement`, `cluster.cpus_per_task`,
`cluster.gpus_per_task`), so the tasks start together or not at all. Each actor reports its node's IP and a free port;
from those this process writes every task's TF_CONFIG, and the actors start their tasks. Everything else is
runner.launch.localhost's, the same as for cluster=localhost: one MLflow run, `[task]`-prefixed output, a dead task stops the
job (a parameter-server worker or ps is restarted instead, in its bundle, so at the same address; with
cluster.elastic a multi-worker job goes on at another size, in a new placement group), exit codes, the
chief's summary. A task whose Ray worker process dies ends as if it had been killed with SIGKILL. Ray is imported only
here, and this module only for cluster=ray.
"""

import logging
import math
import os
import signal
import subprocess
import threading

import ray
from ray.exceptions import GetTimeoutError, RayActorError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from runner.errors import ClusterError, ConfigError
from runner.launch import localhost
from runner.launch.ray_actor import THREADS, TaskActor

log = logging.getLogger("runner")
READ_SEC = 1.0  # how long one `read` waits in the actor for output
ANSWER_SEC = 30.0  # an actor that does not answer a call within this (plus READ_SEC) counts as dead
FORWARDED = ("MLFLOW_",)  # the driver's own variables the tasks get too (MLflow credentials), besides what it decides


class _Remote:
    """The task process an actor runs, seen from here as runner.launch.localhost sees a subprocess.Popen."""

    def __init__(self, pid: int):
        self.pid, self.returncode, self.note = pid, None, ""
        self._ended = threading.Event()

    def poll(self):
        return self.returncode

    def wait(self, timeout=None):
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"task pid {self.pid}", timeout)
        return self.returncode

    def end(self, code: int, note: str = "") -> None:
        self.note, self.returncode = note, code
        self._ended.set()


class RayTask(localhost.Task):
    """A launcher task played by a Ray actor in bundle `bundle` of the session's placement group."""

    session = bundle = actor = worker_pid = None  # set by RaySession.make_tasks

    def start(self, lock: threading.Lock) -> None:
        if self.proc is not None and self.proc.note:  # its Ray worker died: a new actor in its bundle, at its address
            self.actor, self.worker_pid = self.session.actor(self.bundle, dead=self.actor)
        own = {k: v for k, v in self.env.items() if os.environ.get(k) != v or k.startswith(FORWARDED)}
        pid = self._call(self.actor.start.remote(self.argv[3:], own, os.getcwd()))
        self.proc = _Remote(pid)
        log.info("started %s (Ray worker pid %d, task pid %d)", self.name, self.worker_pid, pid)
        pump = threading.Thread(target=self._pump, args=(self.actor, self.proc, lock), daemon=True)
        pump.start()
        self.pumps.append(pump)

    @staticmethod
    def _call(ref, timeout=ANSWER_SEC):
        return ray.get(ref, timeout=timeout)

    def _pump(self, actor, proc: _Remote, lock: threading.Lock) -> None:
        try:
            while True:
                lines, code = self._call(actor.read.remote(READ_SEC), READ_SEC + ANSWER_SEC)
                for line in lines:
                    self.heard(line, lock)
                if code is not None:
                    return proc.end(code)
        except RayActorError as err:  # ActorDiedError: killed, out of memory, its node lost
            proc.end(-signal.SIGKILL, f"its Ray worker process (pid {self.worker_pid}) died ({type(err).__name__})")
        except GetTimeoutError:
            proc.end(-signal.SIGKILL, f"its Ray actor (worker pid {self.worker_pid}) stopped answering")

    def exit_note(self, code: int) -> str:
        return self.proc.note or localhost.signal_name(code)

    def signal(self, signum: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self._call(self.actor.signal.remote(signum), 5)
            except (RayActorError, GetTimeoutError):
                pass  # its pump says how it ended

    def frozen(self) -> bool:
        try:
            return self.proc.poll() is None and self._call(self.actor.state.remote(), 5) in ("T", "t")
        except (RayActorError, GetTimeoutError):
            return False


class RaySession:
    """The Ray cluster for one run: connected (or started) on entry; its actors, placement group and, when this run
    started it, the local head are gone on exit."""

    def __init__(self, cfg):
        self.cfg, self.started, self.group, self.actors = cfg, False, None, []

    def __enter__(self) -> "RaySession":
        c = self.cfg.cluster
        quiet = {"log_to_driver": False, "logging_level": logging.WARNING, "include_dashboard": False}
        try:
            if c.address:
                ray.init(address=c.address, **quiet)
            else:  # "local": a new head even where `ray start` left one running (ray.init() would join that)
                tasks = sum(localhost.cluster_shape(self.cfg).values()) + bool(c.evaluator)
                cpus = max(os.cpu_count() or 1, math.ceil(tasks * c.cpus_per_task))  # Ray's bookkeeping; not cores
                ray.init(address="local", num_cpus=cpus, object_store_memory=128 * 1024**2, **quiet)
                self.started = True
        except (ConnectionError, ValueError, RuntimeError) as err:
            what = f"reach the Ray cluster at cluster.address={c.address}" if c.address else "start a local Ray head"
            raise ConfigError(
                f"cluster=ray could not {what} "
                f"({str(err).strip().splitlines()[0]}). Start one with `ray start --head` and pass its address, or leave "
                "cluster.address unset for a local head."
            ) from None
        return self

    @property
    def where(self) -> str:
        context = ray.get_runtime_context()
        return f"Ray cluster {context.gcs_address}" + (" (a local head started for this run)" if self.started else "")

    def _new_actor(self, bundle: int):
        """A new actor in the placement group's bundle `bundle`, so on that bundle's node."""
        c = self.cfg.cluster
        handle = (
            ray.remote(TaskActor)
            .options(
                num_cpus=c.cpus_per_task,
                num_gpus=c.gpus_per_task,
                max_concurrency=THREADS,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=bundle),
            )
            .remote()
        )
        self.actors.append(handle)
        return handle

    def actor(self, bundle: int, dead=None):
        """(a new actor in bundle `bundle`, its worker's pid), in place of `dead`, whose task is restarted."""
        if dead is not None:
            ray.kill(dead)  # gone already, or no longer answering
        handle = self._new_actor(bundle)
        return handle, ray.get(handle.where.remote(), timeout=self.cfg.cluster.start_timeout_sec)["pid"]

    def make_tasks(self, cfg, overrides, run_id: str, uri: str) -> list[RayTask]:
        """Place a bundle per task, start an actor in each, and build the tasks from the addresses they report."""
        c = cfg.cluster
        self._release()  # an elastic job's earlier generation, at another size: its bundles back to the cluster
        shape = localhost.cluster_shape(cfg)
        members = [(job, i) for job, n in shape.items() for i in range(n)] + ([("evaluator", 0)] if c.evaluator else [])
        bundle = {"CPU": c.cpus_per_task, **({"GPU": c.gpus_per_task} if c.gpus_per_task else {})}
        self.group = placement_group([bundle] * len(members), strategy=c.placement)
        try:
            ray.get(self.group.ready(), timeout=c.start_timeout_sec)
        except GetTimeoutError:
            raise ClusterError(
                f"the Ray cluster could not place {len(members)} tasks of {bundle} (cluster.placement={c.placement}) "
                f"within cluster.start_timeout_sec={c.start_timeout_sec:g}; it has {ray.available_resources()} free. "
                "Lower cluster.cpus_per_task, add nodes, or use placement=PACK."
            ) from None
        handles = [self._new_actor(k) for k in range(len(members))]
        wheres = ray.get([h.where.remote() for h in handles], timeout=c.start_timeout_sec)
        spec = {job: [] for job in shape}
        for (job, _), where in zip(members, wheres):
            if job in spec:
                spec[job].append(f"{where['ip']}:{where['port']}")
        tasks = localhost.build_tasks(cfg, overrides, run_id, uri, spec=spec, task_class=RayTask)
        for k, (task, handle, where) in enumerate(zip(tasks, handles, wheres)):  # build_tasks keeps the members' order
            task.session, task.bundle, task.actor, task.worker_pid = self, k, handle, where["pid"]
        return tasks

    def _release(self) -> None:
        for handle in self.actors:  # their task processes die with them (runner.control.procs)
            try:
                ray.kill(handle)
            except Exception:  # already dead
                pass
        if self.group is not None:
            remove_placement_group(self.group)
        self.actors, self.group = [], None

    def __exit__(self, *exc) -> None:
        self._release()
        ray.shutdown()  # stops the local head this run started; only disconnects from cluster.address


def launch(cfg, chosen=None) -> dict:
    with RaySession(cfg) as session:
        return localhost.launch(cfg, chosen, make_tasks=session.make_tasks, where=session.where)
