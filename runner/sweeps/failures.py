"""sweep.on_failure and sweep.retries: what a sweep does with a job that failed.

A job that ended by a fault (a lost peer: exit 3; a signal: killed, out of memory, preempted) is run again from its
own checkpoint, in its own MLflow run (`resume=`), up to sweep.retries times; a config error (exit 2), a loss that
blew up (4), damaged data (5) or a crash (1) is not, since it would fail the same way. With sweep.on_failure=stop the
first failed job stops the sweep: the jobs after it are not started (recorded as skipped), under any launcher, by a
marker in the sweep's state directory.
"""

import json
import os

LOST_PEER = 3
CTRL_C = 130  # the user's own stop: not a fault
MARKER = "stopped-by.json"  # in the sweep's state directory (runner.sweeps.sweep.STATE_DIR)


def is_fault(code: int | None) -> bool:
    """An exit that says nothing against the job's config: a lost peer, or a signal (negative from Python's
    subprocess; 128 + n from a shell or the runner's own stop, Ctrl-C aside)."""
    if code is None:
        return False
    return code == LOST_PEER or code < 0 or (code > 128 and code != CTRL_C)


def stopped_by(state_dir: str) -> int | None:
    """The number of the job whose failure stopped the sweep (sweep.on_failure=stop), or None."""
    try:
        with open(os.path.join(state_dir, MARKER)) as f:
            return int(json.load(f)["job"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def stop_after(state_dir: str, job: int) -> None:
    if stopped_by(state_dir) is None:
        with open(os.path.join(state_dir, MARKER + ".tmp"), "w") as f:
            json.dump({"job": job}, f)
        os.replace(os.path.join(state_dir, MARKER + ".tmp"), os.path.join(state_dir, MARKER))
