"""cluster=tf_config with cluster.elastic: every pod (host, namespace) runs the runner with its own TF_CONFIG, as a
Kubernetes operator starts it, and the runner there is an *agent* that starts the pod's trainer as a child process,
as torchrun's agents do. The agents keep in touch over TCP (runner.launch.rendezvous): worker:0's agent listens on
its TF_CONFIG address and leads; the others connect to it.

The leader runs runner.launch.localhost's launcher over the agents, so a lost worker is runner.launch.elastic's: a
pod whose agent goes silent (its link down, the pod gone) or whose trainer dies is lost; the leader stops the
others' trainers and starts the next generation, with a TF_CONFIG of the pods still in touch (fresh ports), from the
last checkpoint, in the same MLflow run. An agent that loses the leader stops its own trainer at once and keeps
calling back; once it is back (the link up, the pod restarted) and `rejoin_after_sec` has passed, the job grows back
to its full size at a step the trainers agree on.

What this needs of the pods: the same `checkpoint.dir` and `mlflow.tracking_uri` seen from every pod (a shared volume,
GCS, an MLflow server), as any multi-worker restore does. The leader is the job's point of contact, as the rendezvous
host of torchrun's c10d backend: when worker:0's pod is the one lost, the others stop with exit 3 after
cluster.start_timeout_sec without it, and the job is resumed with resume= as today; Kubernetes' restartPolicy restarts
the pods.
"""

import json
import logging
import os
import queue
import signal
import subprocess
import threading
import time
import uuid

from runner.config import layout, validate
from runner.config.command_line import override
from runner.control import contract, stopping
from runner.errors import ClusterError, ConfigError
from runner.launch import elastic, localhost, rendezvous

log = logging.getLogger("runner")
FORWARDED = (stopping.NOTICE, "Error: ")  # a trainer's lines the leader needs: a stop notice, why it ended
SENT = ("TF_CONFIG", contract.TRACKING_URI, "PYTHONUNBUFFERED")  # with every RUNNER_ variable, to each pod's trainer


def _tf_config() -> tuple[dict, int]:
    """(the cluster, this task's index), for the agents: workers only."""
    try:
        config = json.loads(os.environ.get("TF_CONFIG") or "")
        spec, task = config["cluster"], config["task"]
        index = int(task["index"])
    except (ValueError, KeyError, TypeError) as err:
        raise ConfigError(
            f"cluster=tf_config with cluster.elastic.enabled=true needs TF_CONFIG with a cluster and this task ({err}); "
            "set it as a Kubernetes operator does."
        ) from None
    others = sorted(set(spec) - {"worker"})
    if others or task.get("type") != "worker":
        raise ConfigError(
            f"cluster=tf_config with cluster.elastic.enabled=true restarts multi_worker_mirrored workers, and TF_CONFIG "
            f"has {', '.join(others) or task.get('type')} task(s): give every pod a worker task (TF_CONFIG's cluster "
            "with a worker list only), or cluster.elastic.enabled=false."
        )
    return spec, index


def _refusals(cfg) -> None:
    if cfg.strategy.name != "multi_worker_mirrored":
        raise ConfigError(
            f"cluster=tf_config with cluster.elastic.enabled=true and strategy={cfg.strategy.name}: the pods' agents "
            "restart multi_worker_mirrored jobs so far (a parameter_server job on Kubernetes is restarted by its "
            "operator). Use strategy=multi_worker_mirrored, or cluster.elastic.enabled=false."
        )
    if not cfg.checkpoint.dir:
        raise ConfigError(
            "cluster=tf_config with cluster.elastic.enabled=true: every generation restores the last checkpoint, from "
            "whichever pods train it, so checkpoint.dir must name storage every pod reads and writes at the same path "
            "(a shared volume, gs://...). Set checkpoint.dir."
        )


def launch(cfg, chosen=None) -> dict:
    spec, index = _tf_config()
    _refusals(cfg)
    size = len(spec["worker"])
    full = elastic.job_config(cfg, size)
    validate.elastic(full)  # the checks that need the job's size, which TF_CONFIG tells
    if index == 0:
        return Leader(cfg, spec).launch(chosen, full)
    return follow(cfg, spec, index)


# -- the leader -----------------------------------------------------------------------------------------------------
class _Remote:
    """A trainer on another pod, as the launcher's Popen: its exit code comes from its agent, or -SIGKILL once the
    agent is out of touch."""

    def __init__(self, report_sec: float):
        self.pid, self.returncode, self.lost = 0, None, None
        self.report_sec = report_sec  # after a kill order: how long its agent gets to report the trainer's end
        self.killed_at = None
        self._ended, self._lock = threading.Event(), threading.Lock()

    def end(self, code: int, lost: str | None = None) -> None:
        with self._lock:  # its agent's report and its loss come from different threads: the first one counts
            if self.returncode is None:
                self.returncode, self.lost = code, lost
                self._ended.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout=None) -> int:
        bound = None if self.killed_at is None else max(0.0, self.killed_at + self.report_sec - time.monotonic())
        limit = bound if timeout is None else timeout if bound is None else min(timeout, bound)
        if not self._ended.wait(limit):
            if bound is None or (timeout is not None and timeout < bound):
                raise subprocess.TimeoutExpired("remote trainer", timeout)
            self.end(-signal.SIGKILL, f"its agent did not report the trainer's end within {self.report_sec:g}s of the kill order")
        return self.returncode


class PodTask(localhost.Task):
    """A launcher task played by the trainer that another pod's agent starts."""

    agent: int = 0  # the agent's index in TF_CONFIG
    host: str = ""
    channel = None
    generation: int = 0

    report_sec: float = 10.0

    def start(self, lock) -> None:
        self.proc = _Remote(self.report_sec)
        runner_args = self.argv[3:]  # after `python -m runner`: the agent runs its own interpreter
        # the pod keeps its own environment: what the launcher set, and what differs from this pod's
        delta = {k: v for k, v in self.env.items() if k in SENT or k.startswith("RUNNER_") or os.environ.get(k) != v}
        start = {"generation": self.generation, "args": runner_args, "env": delta, "job": self.type, "index": self.index}
        order = {"start": start}
        if self.channel is None or not self.channel.send(order):
            self.proc.end(-signal.SIGKILL, f"its pod ({self.host}) is out of touch")
        log.info("started %s on %s (worker:%d's pod)", self.name, self.host, self.agent)

    def frozen(self) -> bool:
        return False

    def exit_note(self, code: int) -> str:
        if self.proc is not None and self.proc.lost:
            return self.proc.lost
        return f"{localhost.signal_name(code)} (on {self.host})"

    def signal(self, signum: int) -> None:
        if self.proc is not None and self.proc.poll() is None and self.channel is not None:
            if signum == signal.SIGKILL and self.proc.killed_at is None:
                self.proc.killed_at = time.monotonic()
            self.channel.send({"signal": int(signum), "generation": self.generation})


class Leader:
    """worker:0's agent: the hub, and runner.launch.localhost's launcher over the pods in touch."""

    def __init__(self, cfg, spec: dict):
        self.cfg, self.spec = cfg, spec
        self.hosts = [a.rpartition(":")[0] for a in spec["worker"]]
        self.generation = 0
        self.current: dict[int, PodTask] = {}  # agent index -> its task in this generation
        port = int(spec["worker"][0].rpartition(":")[2])
        timeout = cfg.cluster.agent_timeout_sec
        try:
            self.hub = rendezvous.Hub(port, len(self.hosts), rendezvous.job_token(spec), timeout, self._message, self._lost)
        except OSError as err:
            raise ConfigError(
                f"worker:0's agent cannot listen on port {port}, its TF_CONFIG address {spec['worker'][0]} ({err}): the "
                "other agents reach it there. Free the port, or give worker:0 another one in every pod's TF_CONFIG."
            ) from None

    def _task(self, index: int, generation=None) -> PodTask | None:
        task = self.current.get(index)
        return task if task is not None and (generation is None or task.generation == generation) else None

    def _message(self, index: int, message: dict) -> None:
        generation = message.get("generation")
        task = self._task(index, generation)
        if task is None:
            return  # about a generation already replaced
        if "started" in message:
            task.proc.pid = int(message["started"])
            task.run_dir = str(message.get("run_dir") or task.run_dir)  # on its pod: where its runner.log is
        elif "line" in message:
            task.heard(str(message["line"]).rstrip("\n") + "\n", localhost.OUTPUT)
        elif "exit" in message:
            task.proc.end(int(message["exit"]))

    def _lost(self, channel, why: str) -> None:
        if not self.hub.open:
            return  # the job has ended: the agents were told
        task = self._task(channel.index)
        if task is not None and task.channel is channel and task.proc is not None:  # a task not started fails at start
            task.proc.end(-signal.SIGKILL, f"its pod ({task.host}) is out of touch: {why}")
        log.warning("rendezvous: lost worker:%d's agent (%s)", channel.index, why)

    def make_tasks(self, cfg, overrides, run_id: str, uri: str) -> list:
        """worker:0 here and the first pods in touch, on fresh ports; a pod missing now is lost at its start."""
        n = int(cfg.cluster.workers)
        live = self.hub.live()
        agents = [0, *live[: n - 1]]
        agents += [i for i in range(1, len(self.hosts)) if i not in agents][: n - len(agents)]
        ports = [localhost.free_ports(1, host="")[0]] + [self.hub.ports.get(i, 0) for i in agents[1:]]
        spec = {"worker": [f"{self.hosts[a]}:{p}" for a, p in zip(agents, ports)]}
        self.generation += 1
        tasks = localhost.build_tasks(cfg, overrides, run_id, uri, spec=spec, task_class=self._make)
        self.current = {}
        for task, agent in zip(tasks, agents):
            if isinstance(task, PodTask):
                task.agent, task.host, task.channel = agent, self.hosts[agent], self.hub.channel(agent)
                task.generation = self.generation
                task.report_sec = self.cfg.cluster.agent_timeout_sec + self.cfg.cluster.failure_grace_sec
                self.current[agent] = task
        return tasks

    @staticmethod
    def _make(job, i, argv, env, run_dir):
        return localhost.Task(job, i, argv, env, run_dir) if i == 0 else PodTask(job, i, argv, env, run_dir)

    def launch(self, chosen, full) -> dict:
        stopping.install()  # a stop while the agents join tells them too
        try:
            missing = self.hub.wait_for_all(self.cfg.cluster.start_timeout_sec)
            if missing:
                names = ", ".join(f"worker:{i} ({self.hosts[i]})" for i in missing)
                raise ClusterError(
                    f"the agents of {names} did not join worker:0's at {self.spec['worker'][0]} within "
                    f"{self.cfg.cluster.start_timeout_sec:g}s (cluster.start_timeout_sec): start every pod with the same "
                    "TF_CONFIG cluster and cluster.elastic.enabled=true, and check that they reach worker:0's address."
                )
            where = f"{len(self.hosts)} pods ({', '.join(self.hosts)})"
            summary = localhost.launch(
                self.cfg, chosen, make_tasks=self.make_tasks, where=where, job=full, room=self.hub.room, wait_for_room=True
            )
        except BaseException as err:
            self.hub.finish(_ended(err))
            raise
        self.hub.finish({"ok": True})
        return summary


def _ended(err: BaseException) -> dict:
    """How the job ended on the leader, for the other agents to end alike (the same exit code)."""
    if isinstance(err, (KeyboardInterrupt, stopping.Stopped)):
        return {"ok": False, "stopped": getattr(err, "signal_name", "SIGINT"), "error": str(err) or "stopped by SIGINT"}
    return {"ok": False, "config": isinstance(err, ConfigError), "error": str(err) or type(err).__name__}


# -- the other agents -----------------------------------------------------------------------------------------------
def _free_port() -> int:
    """A port free on every interface of this pod now, for its trainer of the next generation."""
    return localhost.free_ports(1, host="")[0]


class _Trainer(localhost.Task):
    """This pod's trainer of one generation, started and signalled as a launcher's task is, its output printed here;
    the lines the leader needs, and its end, go to the leader."""

    def __init__(self, cfg, order: dict, send):
        job, index = order["job"], int(order["index"])
        run_dir = layout.task_dir(cfg.output_dir, job, index)
        args = [a for a in order["args"] if not a.startswith("hydra.run.dir=")]
        env = dict(os.environ, **{k: str(v) for k, v in order["env"].items()})
        super().__init__(job, index, contract.runner_command([*args, override("hydra.run.dir", run_dir)]), env, run_dir)
        self.generation, self.send = order["generation"], send
        self.start(localhost.OUTPUT)
        send({"started": self.proc.pid, "run_dir": run_dir, "generation": self.generation})
        # its end is reported as soon as it is reaped, not at its output's end (a grandchild may hold the pipe)
        self._reaper = threading.Thread(target=self._reap, daemon=True)
        self._reaper.start()

    def heard(self, line: str, lock) -> None:
        super().heard(line, lock)
        if any(marker in line for marker in FORWARDED):
            self.send({"line": line, "generation": self.generation})

    def _reap(self) -> None:
        self.send({"exit": self.proc.wait(), "generation": self.generation})

    def stop(self, grace: float = 0.0) -> None:
        """SIGTERM and up to `grace` s to end (0: SIGKILL at once), then SIGKILL."""
        if grace:
            self.signal(signal.SIGTERM)
            self.wait_or_kill(time.monotonic() + grace)
        self.signal(signal.SIGKILL)
        self.proc.wait()
        self._reaper.join(timeout=2.0)  # its exit reported before this agent closes its connection


def follow(cfg, spec: dict, index: int) -> dict:
    """worker:<index>'s agent: in touch with worker:0's, it starts and signals this pod's trainer as told, until the
    leader says the job has ended. Out of touch, it stops the trainer and calls back for up to
    cluster.start_timeout_sec; after that the job is taken as lost here (exit 3)."""
    stopping.install()
    leader = spec["worker"][0]
    token, timeout = rendezvous.job_token(spec), cfg.cluster.agent_timeout_sec
    inbox: queue.Queue = queue.Queue()
    trainer: _Trainer | None = None
    channel = None
    agent = uuid.uuid4().hex  # its own calling back is told from another pod given the same index
    in_touch_at = time.monotonic()
    refused = None  # (why, error class) when the address answered but did not take this agent in
    try:
        while True:
            channel = _call_back(leader, timeout, inbox, in_touch_at, cfg.cluster.start_timeout_sec, refused)
            channel.send({"hello": {"index": index, "token": token, "port": _free_port(), "agent": agent}})
            channel.start()
            welcomed = False
            while True:
                source, message = inbox.get()
                if source is not channel:
                    continue  # an earlier connection's last words
                if message is None:  # out of touch: this trainer is no member of the job any more
                    if trainer is not None:
                        trainer.stop()
                        trainer = None
                    if welcomed:  # the time without the leader counts from the last time it answered
                        log.warning("agent of worker:%d: lost worker:0 at %s (%s); calling back", index, leader, channel.closed)
                        in_touch_at = time.monotonic()
                    else:  # something answers there, and not as the leader: said once, tried again each second
                        if refused is None:
                            log.warning(
                                "agent of worker:%d: %s did not take it in (%s); calling back", index, leader, channel.closed
                            )
                        refused = refused or (channel.closed, ClusterError)
                        time.sleep(1.0)
                    break
                if "welcome" in message:
                    welcomed, refused = True, None
                    log.info("agent of worker:%d: in touch with worker:0 at %s", index, leader)
                elif "start" in message:
                    if trainer is not None:
                        trainer.stop()
                    trainer = _Trainer(cfg, message["start"], channel.send)
                elif "signal" in message:
                    if trainer is not None and trainer.generation == message.get("generation"):
                        trainer.signal(int(message["signal"]))
                elif "refused" in message and message.get("retry"):  # its place is held: until the holder is silent
                    refused = (message["refused"], ConfigError)
                elif "refused" in message:
                    raise ConfigError(
                        f"worker:0's agent at {leader} turned this one (worker:{index}) away: {message['refused']}. "
                        "Give every pod of the job the same TF_CONFIG cluster, each with its own worker index."
                    )
                elif "done" in message:
                    return _done(message["done"], trainer, cfg.cluster.failure_grace_sec)
    except (KeyboardInterrupt, stopping.Stopped):
        if channel is not None:  # no place for this pod in the next generation
            channel.send({"leaving": True})
        if trainer is not None:
            trainer.stop(cfg.cluster.stop_grace_sec)  # it checkpoints at a step the trainers agree on
        raise
    finally:
        if trainer is not None and trainer.proc.poll() is None:
            trainer.stop()
        if channel is not None:
            channel.close("this agent is ending")


def _call_back(leader: str, timeout: float, inbox: queue.Queue, since: float, timeout_sec: float, refused=None):
    """A connection to the leader, tried every second for `timeout_sec` from `since`; then ClusterError (exit 3), or
    `refused`'s error when the address answered but did not take this agent in ((why, error class))."""
    on_message = lambda ch, m: None if "beat" in m else inbox.put((ch, m))  # noqa: E731
    on_close = lambda ch, why: inbox.put((ch, None))  # noqa: E731
    while True:
        if time.monotonic() > since + timeout_sec:
            if refused is not None:
                why, kind = refused
                raise kind(
                    f"{leader}, worker:0's address in TF_CONFIG, did not take this agent in for {timeout_sec:g}s "
                    f"(cluster.start_timeout_sec): {why}. Check that worker:0's pod runs the same job with "
                    "cluster.elastic.enabled=true there, and that every pod has its own worker index."
                )
            raise ClusterError(
                f"worker:0's agent at {leader} did not answer for {timeout_sec:g}s (cluster.start_timeout_sec): the job "
                "is lost to this pod. If worker:0 trains on without it, nothing is needed; otherwise start the job "
                "again with resume=<each pod's output directory> to continue from the last checkpoint."
            )
        channel = rendezvous.connect(leader, timeout, on_message, on_close, beat=_free_port)
        if channel is not None:
            return channel
        time.sleep(1.0)


def _done(result: dict, trainer: _Trainer | None, grace: float) -> dict:
    if trainer is not None:
        trainer.stop(grace)  # (it has ended, unless the job failed)
    if result.get("stopped"):
        signum = getattr(signal, str(result["stopped"]), signal.SIGTERM)
        raise stopping.Stopped(signum, f"the job was stopped on worker:0's pod: {result.get('error')}")
    if not result.get("ok"):
        kind = ConfigError if result.get("config") else ClusterError
        raise kind(f"the job ended on worker:0's pod: {result.get('error')}")
    log.info("the job has ended (worker:0's agent said so)")
    return {}
