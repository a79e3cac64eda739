"""One live owner per run or sweep directory, and default directory names that never collide by the clock.

A process that trains into a directory (or a sweep's process, for its sweep directory) holds an exclusive
`fcntl.flock` on `<dir>/.runner.lock` for as long as it lives. The kernel drops the lock when the process ends,
however it ends (kill -9 included), so a lock that is held always means a live owner, and a directory whose owner
died can be continued (resume=, a requeued job) at once. A second process asking for a held directory is refused
with the owner's pid and host, before it reads or writes anything there.

`fresh_dir` gives the clock-named defaults (outputs/<date>/<time>, multirun/<date>/<time>) a suffix when that
name is taken already: two runs or sweeps started in the same second get directories of their own.

No TensorFlow, no mlflow: the app and the sweep's callback call this before either starts.
"""

import fcntl
import os
import socket
import sys

from runner.config.command_line import config_only, multirun, overrides_in
from runner.errors import ConfigError

LOCK_FILE = ".runner.lock"

_held: dict[str, int] = {}  # directory -> the open lock file's descriptor, kept for the life of this process
_fresh: dict[str, str] = {}  # default name asked for -> the directory this process was given


def fresh_dir(path: str) -> str:
    """`path`, created now, or `path_2`, `path_3`... when another run or sweep created it first (mkdir is atomic).
    The same answer for the same `path` within a process (Hydra resolves its directories several times)."""
    if path in _fresh:
        return _fresh[path]
    if config_only(sys.argv[1:]):
        return path  # --help, --cfg: nothing runs, nothing is created
    chosen = path
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        for n in range(2, 10_000):
            try:
                os.mkdir(chosen)
                break
            except FileExistsError:
                chosen = f"{path}_{n}"
    except OSError:
        chosen = path  # cannot be created: the output-directory check says so in one paragraph
    _fresh[path] = chosen
    return chosen


def _owner(fd: int) -> tuple[str, str]:
    """('process P on this host', 'run' or 'sweep'): what the lock file's holder wrote in it."""
    try:
        words = os.pread(fd, 200, 0).decode(errors="replace").split()
    except OSError:
        words = []
    if len(words) >= 2:
        pid, host = words[0], words[1]
        kind = words[2] if len(words) > 2 and words[2] in ("run", "sweep") else "run"
        return f"process {pid} on {'this host' if host == socket.gethostname() else host}", kind
    return "another process", "run"


def _in_use(directory: str, key: str, holder: tuple[str, str], what: str) -> str:
    """The refusal: `holder` (who, and whether a run or a sweep) keeps `directory`, which `key` named for a `what`."""
    who, kind = holder
    if what == "sweep":
        advice = "Wait for it to end, or stop it first (Ctrl-C); for a new sweep, pass another hydra.sweep.dir."
    else:
        resume = f" and continue it with resume={directory}" if kind == "run" else ""
        advice = (
            f"Wait for it to end, or stop it first (Ctrl-C, or kill with its pid: it checkpoints and ends its MLflow "
            f"run KILLED){resume}; for a new run, pass another hydra.run.dir."
        )
    return (
        f"{key}={directory} is in use: {who} is still running a {kind} there, and a {what} in the same directory "
        f"would overwrite its checkpoints and results. {advice}"
    )


def holder(directory: str) -> tuple[str, str] | None:
    """Who holds `directory` and for what (`_owner`), or None when no live process does. Takes nothing."""
    try:
        fd = os.open(os.path.join(os.path.abspath(directory), LOCK_FILE), os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None
    except BlockingIOError:
        return _owner(fd)
    except OSError:
        return None
    finally:
        os.close(fd)  # drops the shared lock, if it was taken


def claim_from_command_line(argv) -> str:
    """Before Hydra writes .hydra/ into a directory named on the command line (hydra.run.dir=, resume= of an existing
    directory): take it for this process, or the refusal when a live process holds it ('' when taken or not asked).
    Taken here, before Hydra, two runs started at once into one directory cannot both write there. Tasks that share
    their job's directory (a launched task, an srun step, a TF_CONFIG task other than the chief) are not its owner."""
    from runner.config import layout
    from runner.control import contract

    if config_only(argv) or multirun(argv):
        return ""
    if os.environ.get(contract.ATTACH_RUN) or os.environ.get("SLURM_STEP_ID"):
        return ""
    # The strategy is not known before Hydra: "" reads TF_CONFIG alone, which names the same chief for every strategy
    # (parameter_server always has a chief). An unreadable TF_CONFIG is not asked: validation explains it.
    if os.environ.get("TF_CONFIG") and not layout.tf_config_chief("", os.environ["TF_CONFIG"]):
        return ""
    from runner.config.command_line import path_of  # quotes taken off: the directory Hydra will use (None: not known)

    values = [(a.partition("=")[0], path_of(a)) for a in overrides_in(argv)]
    given = {k: os.path.realpath(os.path.expanduser(v)) for k, v in values if v}
    resumed = given.get("resume")  # a directory that is not there is refused as such, later
    if resumed and os.path.isdir(resumed) and "hydra.run.dir" in given and resumed != given["hydra.run.dir"]:
        return (
            f"resume= and hydra.run.dir= name two directories ({given['resume']} and {given['hydra.run.dir']}): a "
            "resumed run continues in its own directory, where its checkpoints, log and MLflow run id are. Drop "
            "hydra.run.dir, or copy the directory where you want it and resume the copy."
        )
    for key, path in values:
        # resume= only of a runner's directory (.hydra/ there): any other is refused later and must stay untouched
        if key == "hydra.run.dir" and path or key == "resume" and path and os.path.isdir(os.path.join(path, layout.HYDRA_DIR)):
            try:
                claim(path, key)
            except ConfigError as err:
                return str(err)
    return ""


def claim(directory: str, key: str, what: str = "run") -> None:
    """Hold `directory` for this process, or raise ConfigError naming `key` (hydra.run.dir, resume, hydra.sweep.dir)
    when a live process holds it. Idempotent within a process."""
    path = os.path.abspath(directory)
    if path in _held:
        return
    try:
        os.makedirs(path, exist_ok=True)
        fd = os.open(os.path.join(path, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return  # an unwritable directory is the output-directory checks' to report
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = _owner(fd)
        os.close(fd)
        raise ConfigError(_in_use(directory, key, owner, what)) from None
    except OSError:
        os.close(fd)
        return  # a filesystem without locks: no worse than before
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()} {what}\n".encode(), 0)
    except OSError:  # a full disk: the lock holds all the same; the owner's name is only for the refusal's message
        pass
    _held[path] = fd


def claim_output_dir(cfg) -> None:
    """Claim the run's output directory when this process is the one that owns it: not a task the launcher started
    (its launcher holds the run's directory), and under tf_config or Slurm, where the tasks of one job may share a
    directory, only the chief (TensorFlow's task that checkpoints)."""
    from runner.config import layout
    from runner.control import contract

    if not cfg.output_dir or os.environ.get(contract.ATTACH_RUN):
        return
    if cfg.cluster.name in layout.READS_TF_CONFIG and not layout.tf_config_chief(cfg.strategy.name, os.environ.get("TF_CONFIG")):
        return
    if cfg.cluster.name == "slurm" and os.environ.get("SLURM_PROCID", "0") != str(cfg.cluster.get("ps") or 0):
        return  # the first cluster.ps tasks are ps, the next one is the chief (worker 0 without ps)
    claim(str(cfg.output_dir), "resume" if cfg.resume else "hydra.run.dir")
