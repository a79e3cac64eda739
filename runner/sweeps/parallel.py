"""sweep.parallel=N: up to N jobs side by side, the next one started the moment any ends (no batch barrier), each on
its own share of the machine: its CPUs (affinity, which TensorFlow sizes its thread pools by) and, where there are
GPUs, its own of them (CUDA_VISIBLE_DEVICES).

Hydra's basic launcher calls runner.sweeps.sweep.run_sweep_job for one job after another in the sweep's process.
With slots, that call waits for a free slot, hands the job's work (its process, retries, record) to a thread of the
slot's own and returns at once, its value a Future. A grid sweep thus keeps N jobs running; a search
(runner.sweeps.search) asks its next trial only when a slot is free, and tells each trial as it ends. Ctrl-C or
SIGTERM reaches every running job once (each checkpoints and ends KILLED); the sweep ends after them.
"""

import os
import signal
import subprocess
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from runner.control import contract
from runner.errors import ConfigError

_current: "Slots | None" = None


def current() -> "Slots | None":
    """The sweep's slots, when it runs jobs side by side (None: one at a time, or under another launcher)."""
    return _current


def visible_gpus() -> list[str]:
    """The GPUs jobs could use: CUDA_VISIBLE_DEVICES when set, else those nvidia-smi lists (none without a driver)."""
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        return [g.strip() for g in given.split(",") if g.strip() and g.strip() != "-1"]
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if listed.returncode != 0:
        return []
    return [str(i) for i in range(sum(line.startswith("GPU ") for line in listed.stdout.splitlines()))]


def shares(n: int, cpus: list[int], gpus: list[str]) -> list[dict[str, str]]:
    """Each slot's environment: contiguous CPUs (the first slots take one more when they do not divide evenly) and,
    with GPUs, as many of them each. ConfigError when there are fewer CPUs (or GPUs) than slots."""
    if n > len(cpus) or (gpus and n > len(gpus)):
        plural = lambda k, what: f"{k} {what}{'s' if k != 1 else ''}"  # noqa: E731
        have = plural(len(gpus), "GPU") if gpus and n > len(gpus) else f"{plural(len(cpus), 'CPU')} this process may use"
        raise ConfigError(
            f"sweep.parallel={n}: this machine has {have}, so {n} jobs side by side would share them and each would "
            f"measure the others' load. Set sweep.parallel={min(len(cpus), len(gpus) or len(cpus))} or less (each job "
            "gets its own CPUs and GPUs), or sweep.parallel=1 to run the jobs one after another."
        )
    per, extra = divmod(len(cpus), n)
    out, start = [], 0
    for slot in range(n):
        size = per + (slot < extra)
        env = {contract.CPUS: ",".join(map(str, cpus[start : start + size]))}
        start += size
        if gpus:
            each = len(gpus) // n
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[slot * each : (slot + 1) * each])
        out.append(env)
    return out


def check(n: int, launcher: str | None, basic: str) -> None:
    """sweep.parallel beyond 1 is the basic launcher's (the default): another launcher runs its own batches."""
    if not isinstance(n, int) or n < 1:  # refused here, once, rather than by every job
        raise ConfigError(f"sweep.parallel={n!r} must be a positive integer (1 or more): how many jobs run side by side.")
    if n > 1 and launcher != basic:
        raise ConfigError(
            f"sweep.parallel={n} runs the jobs side by side under Hydra's basic launcher (the default), and this sweep "
            f"names another ({launcher}), which runs its own batches (hydra.launcher.n_jobs, or a Slurm array). Drop "
            "hydra/launcher to use sweep.parallel, or set sweep.parallel=1 to keep the launcher's batches."
        )


def start(n: int, stop_jobs: Callable[[int], None], stopped: Callable[[int, list[str]], None]) -> "Slots":
    """The sweep's slots (this process's only); `stop_jobs(signum)` passes a stop on to the running jobs' processes,
    `stopped(signum, labels)` ends the sweep once they have ended (it exits)."""
    global _current
    _current = Slots(shares(n, sorted(os.sched_getaffinity(0)), visible_gpus()), stop_jobs, stopped)
    return _current


class Slots:
    def __init__(self, envs: list[dict[str, str]], stop_jobs, stopped):
        self.envs = envs
        self.free = list(range(len(envs)))
        self.cond = threading.Condition()
        self.pool = ThreadPoolExecutor(len(envs), thread_name_prefix="sweep-job")
        self.running: dict[Future, str] = {}  # job label, while its work runs
        self.stopping: int | None = None  # the signal that stopped the sweep
        self._stop_jobs, self._stopped = stop_jobs, stopped

    def __len__(self) -> int:
        return len(self.envs)

    def submit(self, work: Callable[[dict], object], label: str) -> Future:
        """`work(slot environment)` on a thread of its own once a slot is free (waiting here until one is)."""
        try:
            with self.cond:
                while not self.free:
                    self.cond.wait()
                slot = self.free.pop(0)
        except KeyboardInterrupt as stop:  # runner.sweeps.sweep.SweepStopped, or a plain Ctrl-C
            self._stop(stop)

        def run():
            try:
                return work(self.envs[slot])
            finally:
                with self.cond:
                    self.free = sorted([*self.free, slot])
                    self.cond.notify_all()

        future = self.pool.submit(run)
        self.running[future] = label
        future.add_done_callback(lambda f: self.running.pop(f, None))
        return future

    def wait_any(self, futures) -> set[Future]:
        """The futures of `futures` that are done, waiting for the first when none is."""
        try:
            return wait(list(futures), return_when=FIRST_COMPLETED).done
        except KeyboardInterrupt as stop:
            self._stop(stop)

    def wait_all(self) -> None:
        try:
            wait(list(self.running))
        except KeyboardInterrupt as stop:
            self._stop(stop)

    def _stop(self, stop) -> None:
        """Ctrl-C or SIGTERM: every running job gets it once, the sweep waits for them (a further signal is passed on
        too: stop at once), then ends."""
        self.stopping = getattr(stop, "signum", signal.SIGINT)
        labels = sorted(self.running.values(), key=lambda s: int(s.lstrip("#")))
        self._stop_jobs(self.stopping)
        while True:
            try:
                wait(list(self.running))
                break
            except KeyboardInterrupt as again:
                self._stop_jobs(getattr(again, "signum", signal.SIGINT))
        self._stopped(self.stopping, labels)
