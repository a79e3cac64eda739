"""Cross-field checks on the composed config, run before TensorFlow is imported.

Types and unknown keys are already caught by the schemas (runner/schema.py) while Hydra composes.
Each check here is one small function with a message that names the bad value and the valid choices.
"""

import dataclasses
import json
import math
import os
import socket
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from typing import Callable, List, Optional

from omegaconf import DictConfig, ListConfig, OmegaConf

from runner.errors import ConfigError
from runner.redact import redact_uri

CHECKS: List[Callable[[DictConfig], None]] = []

# Which cross_device_ops each strategy accepts (the rest only take `auto`).
CROSS_DEVICE_OPS = {
    "mirrored": ("auto", "nccl", "hierarchical_copy", "reduction_to_one_device"),
    "multi_worker_mirrored": ("auto", "ring", "nccl"),
}
CLUSTER_STRATEGIES = ("parameter_server",)  # cannot run in one process
OPTIMIZERS = ("sgd", "adam", "rmsprop", "adagrad")
LOSSES = ("auto", "mse", "binary_crossentropy", "sparse_categorical_crossentropy")
TASKS = ("classification", "regression")
INPUTS = ("tf_data", "numpy", "from_function")
VERBOSE = ("auto", "0", "1", "2")


def check(fn):
    CHECKS.append(fn)
    return fn


def validate(cfg: DictConfig) -> None:
    for fn in CHECKS:
        fn(cfg)


def _choice(key: str, value, choices) -> None:
    if value not in choices:
        raise ConfigError(f"{key}={value!r} is not valid; choose one of: {', '.join(map(str, choices))}.")


def _number(x) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _bounds_text(r, is_int: bool) -> str:
    """`a positive integer (1 or more)`, `greater than 0`, `between 0 and 1 (exclusive)`, ..."""
    lo = r.ge if r.ge is not None else r.gt
    hi = r.le if r.le is not None else r.lt
    if lo is not None and hi is not None:
        if r.gt is not None and r.lt is not None:
            return f"between {_number(lo)} and {_number(hi)} (exclusive)"
        if r.ge is not None and r.le is not None:
            return f"between {_number(lo)} and {_number(hi)}"
        return f"{'>=' if r.ge is not None else '>'} {_number(lo)} and {'<=' if r.le is not None else '<'} {_number(hi)}"
    if r.gt is not None:
        return f"greater than {_number(r.gt)}"
    if r.ge is not None:
        if is_int and r.ge == 1 and r.null is None:
            return "a positive integer (1 or more)"
        return f"{_number(r.ge)} or more"
    if r.lt is not None:
        return f"less than {_number(r.lt)}"
    return f"{_number(r.le)} or less"


def _out_of_range(value, r) -> bool:
    if isinstance(value, float) and not math.isfinite(value):
        return True
    return ((r.ge is not None and value < r.ge) or (r.gt is not None and value <= r.gt)
            or (r.le is not None and value > r.le) or (r.lt is not None and value >= r.lt))


def range_problems(node, prefix: str = "") -> List[str]:
    """Every numeric value outside the range its schema field declares (runner/schema.py, `ranged(...)`)."""
    problems = []
    kind = OmegaConf.get_type(node)
    declared = {f.name: f.metadata["range"] for f in dataclasses.fields(kind) if "range" in f.metadata} \
        if dataclasses.is_dataclass(kind) else {}
    for key in node.keys():
        full, r = f"{prefix}{key}", declared.get(key)
        if isinstance(node._get_node(key), DictConfig):
            problems += range_problems(node[key], full + ".")
            continue
        if r is None or OmegaConf.is_missing(node, key):
            continue
        value = node[key]
        if value is None:
            continue
        items = list(value) if isinstance(value, ListConfig) else [value]
        numbers = [v for v in items if isinstance(v, (int, float)) and not isinstance(v, bool)]
        bad = [v for v in numbers if _out_of_range(v, r)]
        if not bad:
            continue
        is_int = all(isinstance(v, int) for v in numbers)
        shown = f"[{', '.join(map(str, items))}]" if isinstance(value, ListConfig) else str(value)
        finite = "finite and " if any(isinstance(v, float) and not math.isfinite(v) for v in bad) else ""
        what = ("every element must be " if isinstance(value, ListConfig) else "must be ") + finite + _bounds_text(r, is_int)
        if r.null is not None:
            what += f", or null ({r.null})"
        problems.append(f"{full}={shown} {what}." + (f" {r.why[0].upper()}{r.why[1:]}." if r.why else ""))
    return problems


@check
def ranges(cfg):
    """The one generic range check: every numeric field against the range declared beside it in runner/schema.py."""
    problems = range_problems(cfg)
    if problems:
        more = f" (and {len(problems) - 1} more: {' '.join(problems[1:])})" if len(problems) > 1 else ""
        raise ConfigError(problems[0] + more)


@check
def enumerations(cfg):
    _choice("train.optimizer.name", cfg.train.optimizer.name, OPTIMIZERS)
    _choice("train.loss", cfg.train.loss, LOSSES)
    _choice("data.input", cfg.data.input, INPUTS)
    _choice("executor.verbose", str(cfg.executor.verbose), VERBOSE)
    if "task" in cfg.data:
        _choice("data.task", cfg.data.task, TASKS)
    partitioner = cfg.strategy.get("variable_partitioner")
    if partitioner is not None:
        _choice("strategy.variable_partitioner.kind", partitioner.kind, ("none", "fixed_shards", "min_size", "max_size"))


@check
def cross_device_ops_fit_strategy(cfg):
    strategy, ops = cfg.strategy.name, cfg.cross_device_ops.name
    allowed = CROSS_DEVICE_OPS.get(strategy, ("auto",))
    if ops not in allowed:
        takers = [s for s, opts in CROSS_DEVICE_OPS.items() if ops in opts]
        raise ConfigError(
            f"cross_device_ops={ops} does not apply to strategy={strategy}; "
            f"strategy={strategy} takes cross_device_ops={' or '.join(allowed)}"
            + (f", and {ops} is for strategy={' or '.join(takers)}." if takers else ".")
        )


MULTI_PROCESS_STRATEGIES = ("multi_worker_mirrored", "parameter_server")
PROCESS_CLUSTERS = ("localhost", "tf_config", "slurm")


@check
def strategy_fits_cluster(cfg):
    strategy, cluster = cfg.strategy.name, cfg.cluster.name
    if strategy == "tpu" and cluster != "tpu":
        raise ConfigError(
            f"strategy=tpu needs cluster=tpu with the TPU's address (cluster.tpu=<name or grpc://host:port>), "
            f"not cluster={cluster}. Without a TPU use strategy=mirrored or one_device."
        )
    if cluster == "tpu" and strategy != "tpu":
        raise ConfigError(f"cluster=tpu only goes with strategy=tpu, not strategy={strategy}.")
    if strategy == "parameter_server" and cluster not in PROCESS_CLUSTERS:
        raise ConfigError(
            f"strategy=parameter_server needs a cluster of worker and ps tasks, but cluster={cluster} is this one "
            "process. Use cluster=localhost cluster.ps=1 (tasks on this machine), cluster=tf_config or cluster=slurm; "
            "or a single-process strategy: default, one_device, mirrored, central_storage, multi_worker_mirrored."
        )
    if cluster in PROCESS_CLUSTERS and strategy not in MULTI_PROCESS_STRATEGIES:
        raise ConfigError(
            f"strategy={strategy} runs in one process and cannot use cluster={cluster}; "
            "use strategy=multi_worker_mirrored or strategy=parameter_server, or cluster=local."
        )


@check
def localhost_cluster_shape(cfg):
    c = cfg.cluster
    if c.name != "localhost":
        return
    if cfg.strategy.name == "parameter_server" and c.ps < 1:
        raise ConfigError(f"strategy=parameter_server needs cluster.ps=1 or more (got {c.ps}).")
    if cfg.strategy.name == "multi_worker_mirrored" and c.ps:
        raise ConfigError(f"cluster.ps={c.ps}: ps tasks only exist with strategy=parameter_server; use cluster.ps=0.")


@check
def executor_fits_data(cfg):
    if cfg.data.input == "numpy" and cfg.strategy.name == "tpu":
        raise ConfigError("data.input=numpy is not supported with strategy=tpu; use data.input=tf_data.")


@check
def data_file_exists(cfg):
    if cfg.data.name == "npz":
        path = os.path.expanduser(str(cfg.data.path))
        if not os.path.isfile(path):
            raise ConfigError(
                f"data.path={cfg.data.path!r}: no such file (looked in {os.path.abspath(path)}). "
                "Point data.path at a .npz file with arrays x_train and y_train."
            )


# Bytes per example of the built-in sources (x as float32, then y), from the config alone; npz is measured once loaded.
def _example_bytes(data) -> Optional[int]:
    if data.name == "ones":
        return 4 + 4
    if data.name == "synthetic":
        return 4 * data.num_features + 4
    if data.name == "digits":
        return 4 * 64 + 4
    return None


@check
def memory_fits(cfg):
    """Data to generate, and a global batch, that clearly do not fit in memory (the data repeat, so with
    train.steps_per_epoch a batch can be far larger than the data and would grow memory without bound)."""
    from runner import data_checks  # NumPy, no TensorFlow

    example = _example_bytes(cfg.data)
    if example is None:
        return  # npz: checked on the loaded arrays (runner/builders/data.py)
    available = data_checks.available_memory()
    if cfg.data.name in ("ones", "synthetic"):
        key = "data.num_examples" if cfg.data.num_examples >= cfg.data.eval_examples else "data.eval_examples"
        # synthetic data are drawn in float64 and cast: ~3x the float32 size while being made
        made = example * (3 if cfg.data.name == "synthetic" else 1)
        data_checks.check_data_memory(key, cfg.data[key.split(".")[1]], cfg.data.num_examples + cfg.data.eval_examples, made, f"data={cfg.data.name}",
                                      available)
    data_checks.check_batch_memory(cfg.train.global_batch_size, example, f"data={cfg.data.name}", available)


def writable_dir_problem(path: str) -> Optional[str]:
    """None when `path` is, or can be made, a directory this process can write in; else why not. Directories made
    for the probe are removed again (the run makes them when it needs them)."""
    path = os.path.abspath(os.path.expanduser(path))
    made, parent = [], path
    while not os.path.exists(parent):
        made.append(parent)
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return f"{parent} is a file, not a directory"
    try:
        for d in reversed(made):
            os.mkdir(d)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-probe-"):
            pass
    except OSError as err:
        return f"{err.strerror or err}" + (f" ({err.filename})" if err.filename else "")
    finally:
        for d in made:  # innermost first
            try:
                os.rmdir(d)
            except OSError:
                break
    return None


@check
def directories_writable(cfg):
    """The output and checkpoint directories, found unusable before any step rather than after the first epoch."""
    output_dir = OmegaConf.select(cfg, "output_dir", throw_on_resolution_failure=False)
    dirs = []
    if output_dir:
        dirs.append(("output_dir", str(output_dir)))
    if cfg.checkpoint.enabled and (cfg.checkpoint.dir or output_dir):
        key = "checkpoint.dir" if cfg.checkpoint.dir else "output_dir"
        dirs.append((key, str(cfg.checkpoint.dir or os.path.join(str(output_dir), "checkpoints"))))
    for key, path in dirs:
        problem = writable_dir_problem(path)
        if problem:
            what = "checkpoints" if "checkpoint" in path or key == "checkpoint.dir" else "the run's output"
            raise ConfigError(
                f"{key}: {path!r} cannot be used for {what}: {problem}. Point {key} at a directory this user can "
                + ("create and write (or set checkpoint.enabled=false)." if key == "checkpoint.dir"
                   else "create and write (hydra.run.dir=<dir>).")
            )


MAX_LOGICAL_CPUS_PER_CORE = 4  # past this, replicas only fight over the same cores


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@check
def logical_cpus_sensible(cfg):
    n, cores = cfg.devices.logical_cpus, _cores()
    limit = MAX_LOGICAL_CPUS_PER_CORE * cores
    if n > limit:
        raise ConfigError(
            f"devices.logical_cpus={n} is more than this machine can use: it has {cores} CPU core(s), and more than "
            f"{MAX_LOGICAL_CPUS_PER_CORE} logical CPUs per core only adds thread contention. Use 1..{limit}; for more "
            "replicas, spread them over processes (cluster=localhost cluster.workers=N strategy=multi_worker_mirrored)."
        )


@check
def resume_dir_exists(cfg):
    """resume= takes only a directory the runner wrote: .hydra/ plus its mlflow_run_id or checkpoints/."""
    if not cfg.resume:
        return
    path = os.path.abspath(os.path.expanduser(str(cfg.resume)))
    if not os.path.isdir(path):
        raise ConfigError(
            f"resume={cfg.resume!r}: no such directory. Pass the output directory of an earlier run "
            "(outputs/<date>/<time>, printed at its start), which holds its checkpoints/ and mlflow_run_id."
        )
    checkpoints = cfg.checkpoint.dir or os.path.join(path, "checkpoints")
    if os.path.isdir(os.path.join(path, ".hydra")) and (os.path.isfile(os.path.join(path, "mlflow_run_id"))
                                                         or os.path.isdir(checkpoints)):
        return
    _undo_hydra_files(path)
    raise ConfigError(
        f"resume={cfg.resume!r} is not an output directory of the runner: it has no .hydra/ with an mlflow_run_id or "
        "checkpoints/ beside it, so there is nothing to continue, and nothing was trained or written there. Pass the "
        "output directory of an earlier run (outputs/<date>/<time>, printed at its start); for a new run, leave resume= out."
    )


def _undo_hydra_files(path: str) -> None:
    """Hydra writes .hydra/ and runner.log into hydra.run.dir (resume=<dir> by default) before any check runs:
    remove what this process wrote there, so a mistyped resume= leaves the user's directory as it was."""
    import contextlib

    from hydra.core.hydra_config import HydraConfig

    from runner.procs import started_at

    since = started_at()
    if since is None or not HydraConfig.initialized() or os.path.abspath(HydraConfig.get().runtime.output_dir) != path:
        return
    mine = lambda f: os.path.isfile(f) and os.path.getmtime(f) >= since - 1  # noqa: E731
    meta = os.path.join(path, ".hydra")
    for name in ("config.yaml", "hydra.yaml", "overrides.yaml"):
        if mine(os.path.join(meta, name)):
            os.remove(os.path.join(meta, name))
    with contextlib.suppress(OSError):
        os.rmdir(meta)  # only if nothing else is in it
    log_file = os.path.join(path, f"{HydraConfig.get().job.name}.log")
    if mine(log_file) and os.path.getsize(log_file) == 0:
        os.remove(log_file)


def _local_host(host: str) -> bool:
    return host in ("127.0.0.1", "localhost", "0.0.0.0", "::1", "[::1]", socket.gethostname(), socket.getfqdn())


def port_in_use(port: int) -> bool:
    """Whether a server could not listen on the port now: TensorFlow's gRPC server binds 0.0.0.0:port, so any
    listener on the port, on any address, is in its way."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free for a server
        try:
            s.bind(("", port))
        except OSError:
            return True
    return False


@check
def tf_config_well_formed(cfg):
    """TF_CONFIG mistakes, found before TensorFlow reads it (its own errors are KeyErrors and hangs)."""
    if cfg.cluster.name != "tf_config":
        return
    raw = os.environ.get("TF_CONFIG")
    example = '{"cluster": {"worker": ["host1:2222", "host2:2222"]}, "task": {"type": "worker", "index": 0}}'
    if not raw:
        raise ConfigError(f"cluster=tf_config needs the TF_CONFIG environment variable, which is not set. It is JSON like {example}.")
    try:
        spec = json.loads(raw)
    except json.JSONDecodeError as err:
        raise ConfigError(f"TF_CONFIG is not valid JSON ({err}): {raw[:200]!r}. It should look like {example}.") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("cluster"), dict) or not spec["cluster"]:
        raise ConfigError(f"TF_CONFIG has no 'cluster' (a map of job name to host:port list): {raw[:200]!r}. It should look like {example}.")
    jobs, task = spec["cluster"], spec.get("task")
    if not isinstance(task, dict) or "type" not in task or "index" not in task:
        raise ConfigError(f"TF_CONFIG has no 'task' {{'type': ..., 'index': ...}} saying which task this process is: {raw[:200]!r}. "
                          f"It should look like {example}.")
    kind, index = task["type"], task["index"]
    if kind != "evaluator" and kind not in jobs:
        raise ConfigError(f"TF_CONFIG task type {kind!r} is not a job of its cluster; valid types: {', '.join(jobs)} (or evaluator).")
    if kind in jobs:
        if not isinstance(index, int) or not 0 <= index < len(jobs[kind]):
            raise ConfigError(f"TF_CONFIG task index {index!r} is out of range: job {kind!r} has {len(jobs[kind])} task(s), "
                              f"so valid indices are 0..{len(jobs[kind]) - 1}.")
        address = str(jobs[kind][index])
        host, _, port = address.rpartition(":")
        if not port.isdigit():
            raise ConfigError(f"TF_CONFIG address {address!r} of {kind}:{index} is not host:port.")
        if _local_host(host) and port_in_use(int(port)):
            raise ConfigError(
                f"TF_CONFIG gives this task ({kind}:{index}) the address {address}, but port {port} is already in use "
                "on this machine (another task or program holds it). Give every task a free port, or stop the "
                "program that holds it (`ss -ltnp | grep :{port}` shows which)."
            )


def tracking_problem(uri: str, timeout: float = 3.0):
    """None when an http(s) tracking server answers /health, else why not. Other stores are not probed."""
    if not uri.startswith(("http://", "https://")):
        return None
    parts = urllib.parse.urlsplit(uri)
    host = f"[{parts.hostname}]" if parts.hostname and ":" in parts.hostname else parts.hostname
    netloc = f"{host}:{parts.port}" if parts.port else host  # without user:password, which urllib cannot take here
    try:
        with urllib.request.urlopen(urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/") + "/health", "", "")),
                                    timeout=timeout):
            return None
    except urllib.error.HTTPError as err:
        if err.code in (401, 403):
            return None  # an auth proxy in front of it: MLflow's own credentials (MLFLOW_TRACKING_TOKEN...) apply later
        return f"it answered HTTP {err.code} on /health: is it an MLflow tracking server?"
    except (urllib.error.URLError, OSError) as err:
        return str(getattr(err, "reason", err))


@check
def tracking_server_reachable(cfg):
    uri = cfg.mlflow.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not (cfg.mlflow.enabled and uri):
        return
    problem = tracking_problem(uri)
    if problem:
        source = "mlflow.tracking_uri" if cfg.mlflow.tracking_uri else "MLFLOW_TRACKING_URI"
        raise ConfigError(
            f"{source}={redact_uri(uri)} is unreachable ({problem}); nothing was trained. Start the server, point "
            f"{source} at one that is up, unset it to log to the local sqlite:///mlflow.db, or set "
            "mlflow.enabled=false to train without tracking."
        )
