"""The next job's process, started while the current job runs (a spare): its imports and its MLflow process get
ready beside it, and it waits for its overrides.

A job typed alone spends about 3 s importing Hydra and TensorFlow (and its MLflow process importing mlflow and
opening the store) before it builds anything. Jobs of a sweep run one after another, so the next job's process can
do that work while the current one starts and ends: on a core the current job leaves idle, and never ahead of it
(runner.spare: a thread of niceness 19, which Linux runs only when nothing of normal priority waits), and not at all
while the current job's steps are timed (the job holds the spare still: runner.control.ahead). The spare then reads
one line, {"argv": [...], "env": {...}}, and goes on as `python -m runner <argv>` would; where its imports are not
done by then (a busy machine), it starts afresh as the job, at normal priority.

A spare's MLflow process, and every job's, is forked from the sweep's MLflow server (runner.sweeps.server) with
mlflow already imported.

Only under Hydra's basic launcher (jobs one by one in the sweep's process) and not under Slurm. A spare that is
never handed a job ends when its stdin closes (the sweep ends or drops it) or with the sweep's process
(procs.popen).
"""

import json
import subprocess

from runner.control import ahead, contract, procs

# what differs between a spare's environment and its job's (the job's whole environment is handed over with it)
PER_JOB = (contract.SWEEP_JOB, contract.SPARE, contract.RUN_NAME, contract.SWEEP_SIZE, contract.PRUNE)


class Spares:
    """The sweep's one spare process at a time (the basic launcher runs one job at a time)."""

    def __init__(self, path: str):
        self.path = path  # where the running job finds the spare to hold (contract.SPARE_FILE)
        self.proc: subprocess.Popen | None = None
        self.env: dict | None = None

    def start(self, env: dict) -> None:
        """A spare for the next job, with the environment the job will have (its number aside)."""
        self.drop()
        spare_env = {**env, contract.SPARE: "1"}
        self.proc = procs.popen(
            contract.runner_command([]),
            env=spare_env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            process_group=0,
        )
        self.env = spare_env
        ahead.announce(self.path, self.proc.pid)

    def resume(self) -> None:
        """The job that held the spare still has ended (however it ended): the spare goes on."""
        if self.proc is not None:
            ahead.resume(self.proc.pid)

    def take(self, argv: list[str], env: dict) -> subprocess.Popen | None:
        """The spare, handed this job (`python -m runner <argv>` with `env`), or None when there is none or it was
        made for another environment (then it is dropped)."""
        proc, spare_env, self.proc, self.env = self.proc, self.env, None, None
        if proc is None:
            return None
        ahead.withdraw(self.path)  # before it becomes the job: the job never holds itself
        ahead.resume(proc.pid)
        same = {k: v for k, v in spare_env.items() if k not in PER_JOB} == {k: v for k, v in env.items() if k not in PER_JOB}
        if same and proc.poll() is None:
            try:
                proc.stdin.write(json.dumps({"argv": argv, "env": env}) + "\n")
                proc.stdin.close()
                proc.stdin = None  # its stdin is done with, as a job started without a spare has none of ours
                return proc
            except OSError:  # it died (killed by hand): the job starts as usual
                pass
        _end(proc)
        return None

    def drop(self) -> None:
        """No further job: the spare ends (its stdin closes; it has trained nothing)."""
        proc, self.proc, self.env = self.proc, None, None
        if proc is not None:
            ahead.withdraw(self.path)
            ahead.resume(proc.pid)  # a stopped process would not see its stdin close
            _end(proc)


def _end(proc: subprocess.Popen) -> None:
    try:
        proc.stdin.close()
    except OSError:
        pass
    try:
        proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    proc.stdout.close()
