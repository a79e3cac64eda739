"""A server task (ps, and worker under parameter_server): a tf.distribute.Server, which never ends by itself.

Under cluster=localhost the launcher stops the servers when the chief is done. Under cluster=slurm nobody does: `srun`
waits for every task, so the job would never end; under cluster=tf_config (Kubernetes pods, or hosts started by hand)
the same holds where the job ends when its processes do, so there it is asked for with `cluster.exit_with_chief=true`.
Then each server watches the chief (the coordinator listens on its address from the cluster spec): once the chief has
been up and its port refuses connections (its host answers, its process is gone), the server exits 0, and the job
ends with the chief's exit status. A chief that cannot be reached at all (no answer: a link down, a host gone) is not
taken for finished: the server keeps serving, since the coordinator reschedules its steps when it is back, and only
exits (3) once the chief has been unreachable for `cluster.start_timeout_sec`. A chief that never comes up ends the
server after `cluster.start_timeout_sec` (exit 3).
"""

import logging
import os
import socket
import sys
import threading
import time

log = logging.getLogger("runner")

POLL_SEC = 1.0
UP_POLL_SEC = 0.1  # until the chief is first seen up: a short job's chief listens for about a second in all (4 steps
# under srun), and a server that never saw it up would wait cluster.start_timeout_sec for it
GONE_AFTER = 3  # failed connects in a row before the chief counts as gone


def serve(tf, cluster, cluster_cfg) -> dict:
    server = tf.distribute.Server(
        cluster.resolver.cluster_spec(),
        job_name=cluster.task_type,
        task_index=cluster.task_id,
        protocol=cluster.resolver.rpc_layer or "grpc",
        start=True,
    )
    log.info("%s serving at %s", cluster.task, server.target.decode() if isinstance(server.target, bytes) else server.target)
    chief = (cluster.jobs.get("chief") or [None])[0]
    if chief and (cluster_cfg.name == "slurm" or cluster_cfg.get("exit_with_chief")):
        watcher = threading.Thread(target=_exit_when_gone, args=(chief, cluster.task, cluster_cfg.start_timeout_sec), daemon=True)
        watcher.start()
    server.join()  # in C++ for good: the watcher ends the process
    return {}


UP, CLOSED, UNREACHABLE = "up", "closed", "unreachable"


def _probe(address: str) -> str:
    """UP: it accepts a connection; CLOSED: its host refuses it (nothing listens there); UNREACHABLE: no answer."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return UP
    except ConnectionRefusedError:
        return CLOSED
    except OSError:  # a timeout, no route to the host, the network unreachable
        return UNREACHABLE


def _up(address: str) -> bool:
    return _probe(address) == UP


def _exit_when_gone(chief: str, task: str, start_timeout: float) -> None:
    deadline = time.monotonic() + start_timeout
    while not _up(chief):
        if time.monotonic() > deadline:
            _exit(3, f"{task}: the chief at {chief} did not come up within cluster.start_timeout_sec={start_timeout:g}")
        time.sleep(UP_POLL_SEC)
    log.info("%s: the chief at %s is up; serving until it ends", task, chief)
    closed, unreachable_since = 0, None
    while closed < GONE_AFTER:
        time.sleep(POLL_SEC)
        state = _probe(chief)
        closed = closed + 1 if state == CLOSED else 0
        if state != UNREACHABLE:
            if unreachable_since is not None:
                log.info("%s: the chief at %s answers again", task, chief)
            unreachable_since = None
            continue
        if unreachable_since is None:
            unreachable_since = time.monotonic()
            log.warning("%s: the chief at %s does not answer (a network fault?); still serving", task, chief)
        elif time.monotonic() - unreachable_since > start_timeout:
            _exit(
                3,
                f"{task}: the chief at {chief} has not answered for {start_timeout:g} s (cluster.start_timeout_sec): "
                "its host or the network between them is down; stopping this server",
            )
    _exit(0, f"{task}: the chief at {chief} has ended; stopping this server")


def _exit(code: int, message: str) -> None:
    (log.info if code == 0 else log.error)(message)
    for handler in logging.getLogger().handlers + log.handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # server.join() holds the main thread in C++: nothing else ends it
