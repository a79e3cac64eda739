"""A peer lost mid-training, told from TensorFlow's error: which task, and what to do. No TensorFlow imported here.

Under cluster=tf_config or slurm every task is a process on its own, with no launcher watching the others: a task
whose peer died or became unreachable learns it only from TensorFlow. MultiWorkerMirroredStrategy (TF 2.21) runs
TensorFlow's coordination service: every task sends heartbeats to its leader (the chief, else worker 0), and a task
silent for its heartbeat timeout (10 s, TensorFlow's default) is reported to every other task, whose collectives are
aborted with `UnavailableError` (`The following tasks are unhealthy (stopped sending heartbeats): /job:worker/...`).
The task that cannot reach the leader gets `DeadlineExceeded` or `Unavailable` on `CoordinationService/Heartbeat`.
Without the coordination service the strategy's own health check aborts them (`cluster check alive failed,
/job:worker/replica:0/task:1 is down`), and a collective that outlives `strategy.collective_timeout_sec` ends with
`DeadlineExceededError`. `lost_peer` turns these into a ClusterError (exit 3) naming the task; anything else is
left alone.
"""

import logging
import os
import re
import threading

from runner.config import layout
from runner.control import contract
from runner.errors import ClusterError

log = logging.getLogger("runner")
PEER_ERRORS = ("UnavailableError", "DeadlineExceededError", "AbortedError", "CancelledError", "InternalError")
_TASK = re.compile(r"/job:(\w+)/(?:replica:\d+/)?task:(\d+)")
_ADDRESS = re.compile(r"(?:ipv4:)?(\d{1,3}(?:\.\d{1,3}){3}|\[[0-9a-f:]+\]|[\w.-]+):(\d{2,5})")


def _tasks_named(text: str) -> list[str]:
    found = []
    for job, index in _TASK.findall(text):
        name = f"{job}:{index}"
        if name not in found:
            found.append(name)
    return found


_REMOTE = re.compile(r"from remote target (/job:\w+/(?:replica:\d+/)?task:\d+)")


def _relayers(text: str) -> set[str]:
    """Tasks whose answer was an abort they had from another task (`from remote target <task> ...
    grpc_message:"Collective ops is aborted by: ...`): alive, only passing the loss on. A task that also answered
    with its own error is not one."""
    parts = _REMOTE.split(text)  # [before, task, what followed, task, what followed, ...]
    relayed, own = set(), set()
    for task, after in zip(parts[1::2], parts[2::2]):
        name = "{}:{}".format(*_TASK.match(task).groups())
        said = after.split("grpc_message:", 1)[1] if "grpc_message:" in after else after
        (relayed if said.lstrip('"\\ ').startswith("Collective ops is aborted") else own).add(name)
    return relayed - own


def _address_of(task: str, jobs: dict) -> str:
    job, _, index = task.partition(":")
    addresses = jobs.get(job) or []
    return addresses[int(index)] if index.isdigit() and int(index) < len(addresses) else "?"


def _leader(jobs: dict) -> str:
    """The coordination service's leader: TensorFlow's multi_worker_util.coordination_leader."""
    return "chief:0" if jobs.get("chief") else "worker:0"


def lost_peer(err: BaseException, me: str, jobs: dict, output_dir=None, checkpoint_dir=None) -> ClusterError | None:
    """A ClusterError naming the task that `me` lost, when `err` is TensorFlow saying a peer is gone; else None.
    `jobs`: the cluster spec as a dict of job name to addresses."""
    if type(err).__name__ not in PEER_ERRORS or sum(len(a) for a in jobs.values()) < 2:
        return None
    text = str(err)
    others = [t for t in _tasks_named(text) if t != me and t.partition(":")[0] in jobs]
    if "stopped sending heartbeats" in text or "is down" in text:
        lost, how = others, "stopped answering TensorFlow's cluster heartbeats (coordination service)"
    elif "CoordinationService/Heartbeat" in text or "CoordinationService/" in text:
        lost = [_leader(jobs)] if _leader(jobs) != me else others
        how = "did not answer this task's heartbeats (it leads TensorFlow's coordination service)"
    elif "Collective ops is aborted" in text or "Socket closed" in text or "failed to connect" in text:
        by_address = {a: f"{j}:{i}" for j, addresses in jobs.items() for i, a in enumerate(addresses)}
        named = [by_address[f"{h}:{p}"] for h, p in _ADDRESS.findall(text) if f"{h}:{p}" in by_address]
        # the address TensorFlow could not reach names the lost task; the tasks a ring's message lists are all its members
        lost = [t for t in dict.fromkeys(named) if t != me] or [t for t in others if t not in _relayers(text)] or others
        how = "could not be reached by a collective operation"
    elif type(err).__name__ == "DeadlineExceededError":
        lost, how = others, "did not take part in a collective operation within strategy.collective_timeout_sec"
    else:
        return None
    who = ", ".join(f"{t} ({_address_of(t, jobs)})" for t in lost) if lost else "a peer task (TensorFlow did not say which)"
    if os.environ.get(contract.ELASTIC):  # the launcher restarts the job without the lost task (runner.launch.elastic)
        goes_on = "restarts the job" if "ps" in jobs else "goes on without it"  # parameter_server: every task again
        return ClusterError(
            f"task {me} lost contact with {who}: it {how} ({type(err).__name__}); stopping for the elastic launcher, "
            f"which {goes_on} ({layout.checkpoint_note(checkpoint_dir)})."
        )
    resume = f" resume={output_dir}" if output_dir else " resume=<its output directory>"
    return ClusterError(
        f"task {me} lost contact with {who}: it {how}, so training stopped ({type(err).__name__}). A network link "
        f"down, a host gone or a task that died all look like this. This task stopped too; "
        f"{layout.checkpoint_note(checkpoint_dir)}. Once every task can reach the others again, restart every task with"
        f"{resume} (each task its own output directory) to continue from the last checkpoint."
    )


WATCHER_THREADS = ("PeerTerminationWatcher", "WorkerTerminationSignalWatcher")  # TensorFlow's preemption handler's


def quiet_watcher_threads() -> None:
    """TensorFlow's preemption handler watches its peers in threads of its own; when a peer is lost they end with
    the same UnavailableError the training thread reports in one paragraph (lost_peer), and Python would print each
    one's traceback as well. Those become one log line; any other thread's exception is printed as before."""
    previous = threading.excepthook
    if getattr(previous, "quiets_watchers", False):
        return

    def hook(args) -> None:
        name = getattr(args.thread, "name", "") or ""
        if name.startswith(WATCHER_THREADS) and args.exc_type.__name__ in PEER_ERRORS:
            said = (str(args.exc_value).strip().splitlines() or [""])[0][:200]
            log.warning(
                "TensorFlow's %s thread ended (%s: %s): a peer is gone, and TensorFlow's agreement on a step to stop "
                "at is off for the rest of this task",
                name,
                args.exc_type.__name__,
                said,
            )
            return
        previous(args)

    hook.quiets_watchers = True
    threading.excepthook = hook
