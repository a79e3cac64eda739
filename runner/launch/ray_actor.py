"""cluster=ray, inside the cluster: the Ray actor that plays one task. It lives in a Ray worker process on some node.

The driver (runner.launch.ray_cluster) asks it where it is (`where`: its node's IP and a free port there), gives every task
its TF_CONFIG, then has it `start` the task: `python -m runner <overrides> cluster=tf_config`, a process of its own with
this worker's environment plus what the driver decided (TF_CONFIG, the MLflow run to attach to, ...). The driver reads
the task's output and, once it has ended, its exit status with `read`; `signal` and `state` act on the task's process
group. The process is started from a thread that lives as long as it (runner.control.procs): a Ray worker killed with
SIGKILL takes its task with it. No Ray import at module level, no TensorFlow: the driver makes this class a Ray actor.
"""

import os
import socket
import sys
import threading

from runner.control import contract, procs

THREADS = 4  # the actor's max_concurrency: `read` blocks while `signal` and `state` must still answer


class _Task:
    """One start of the task: its process, the lines it wrote that the driver has not read yet, its exit status."""

    def __init__(self):
        self.proc = None
        self.lines: list[str] = []
        self.code: int | None = None
        self.changed = threading.Condition()


class TaskActor:
    def __init__(self):
        self._task = _Task()

    def where(self) -> dict:
        """This node's IP address (as Ray knows it), a port free on it now, and this worker's pid."""
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return {"ip": ray.util.get_node_ip_address(), "port": port, "pid": os.getpid()}

    def start(self, args: list[str], env: dict[str, str], cwd: str) -> int:
        """Start the task (again, after it ended) with `env` on top of this worker's environment; returns its pid.
        `cwd` (the driver's working directory) is used where this node has it."""
        task, started = _Task(), threading.Event()
        self._task = task
        argv = [sys.executable, "-m", "runner", *args]
        merged = dict(os.environ, **env)
        threading.Thread(target=self._keep, args=(task, argv, merged, cwd, started), daemon=True).start()
        started.wait()
        if task.proc is None:
            raise RuntimeError(f"could not start {argv[:3]}: {task.lines[-1] if task.lines else 'unknown error'}")
        return task.proc.pid

    @staticmethod
    def _keep(task: _Task, argv, env, cwd, started) -> None:
        """Own the task's process for as long as it runs: start it, collect its output, record its exit status."""
        try:
            task.proc = contract.start_child(
                argv, env, bufsize=1, start_new_session=True, cwd=cwd if os.path.isdir(cwd) else None
            )
        except OSError as err:
            task.lines.append(str(err))
            return
        finally:
            started.set()
        with task.proc.stdout:
            for line in task.proc.stdout:
                with task.changed:
                    task.lines.append(line)
                    task.changed.notify_all()
        code = task.proc.wait()
        with task.changed:
            task.code = code
            task.changed.notify_all()

    def read(self, timeout: float) -> tuple[list[str], int | None]:
        """The task's new output lines, and its exit status once it has ended (after its last line); waits up to
        `timeout` seconds for either."""
        task = self._task
        with task.changed:
            task.changed.wait_for(lambda: task.lines or task.code is not None, timeout)
            lines, task.lines = task.lines, []
            return lines, task.code

    def signal(self, signum: int) -> None:
        proc = self._task.proc
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signum)
            except ProcessLookupError:
                pass

    def state(self) -> str:
        """The task process's state letter (T: stopped), or '' once it has ended."""
        proc = self._task.proc
        return procs.state(proc.pid) if proc is not None and proc.poll() is None else ""
