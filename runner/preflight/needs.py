"""Pre-flight probes: what the config needs from this machine and its network, found before TensorFlow starts and
before any step, rather than after the first epoch. Unlike runner.config.validate (pure), these read files, the
environment (TF_CONFIG, MLFLOW_TRACKING_URI), free memory and CPU cores, and open sockets.

Each selected option may register its own probe (`probe=` of `registry.register`); `preflight(cfg)` runs those, then
the generic probes below, in order. The low-level probes are runner.preflight.probes'; directory names runner.config.layout's.
"""

import contextlib
import json
import os
from collections.abc import Callable

from omegaconf import DictConfig, OmegaConf

from runner.config import layout, registry
from runner.config.redact import redact_uri
from runner.control import contract
from runner.errors import ConfigError
from runner.preflight import sqlite_store
from runner.preflight.probes import local_host, port_in_use, tracking_problem, writable_dir_problem

PROBES: list[Callable[[DictConfig], None]] = []
MAX_LOGICAL_CPUS_PER_CORE = 4  # past this, replicas only fight over the same cores


def probe(fn):
    PROBES.append(fn)
    return fn


def preflight(cfg: DictConfig) -> None:
    for fn in PROBES:
        fn(cfg)


@probe
def option_probes(cfg):
    """Each selected option's own probe (data=npz: the file exists)."""
    for group in registry.GROUPS:
        own = registry.selected(cfg, group).caps.probe
        if own is not None:
            own(cfg)


@probe
def memory_fits(cfg):
    """Data to generate, and a global batch, that clearly do not fit in memory (the data repeat, so with
    train.steps_per_epoch a batch can be far larger than the data and would grow memory without bound)."""
    from runner.sources import checks  # NumPy, no TensorFlow

    source = registry.selected(cfg, "data").caps
    if source.example_bytes is None:
        return  # npz: checked on the loaded arrays (runner.builders.data.pipeline)
    example, available = source.example_bytes(cfg.data), checks.available_memory()
    if source.generates:
        key = "data.num_examples" if cfg.data.num_examples >= cfg.data.eval_examples else "data.eval_examples"
        checks.check_data_memory(
            key,
            cfg.data[key.split(".")[1]],
            cfg.data.num_examples + cfg.data.eval_examples,
            example * source.generates,
            f"data={cfg.data.name}",
            available,
        )
    checks.check_batch_memory(cfg.train.global_batch_size, example, f"data={cfg.data.name}", available)


@probe
def directories_writable(cfg):
    """The output and checkpoint directories."""
    output_dir = OmegaConf.select(cfg, "output_dir", throw_on_resolution_failure=False)
    dirs = []  # (key, path, holds checkpoints)
    if output_dir:
        dirs.append(("output_dir", str(output_dir), False))
    if cfg.checkpoint.enabled and (cfg.checkpoint.dir or output_dir):
        key = "checkpoint.dir" if cfg.checkpoint.dir else "output_dir"
        dirs.append((key, layout.checkpoint_dir(cfg, output_dir), True))
    for key, path, checkpoints in dirs:
        pattern = sorted(set(path) & set("[]\\")) if checkpoints else []
        if pattern:  # TensorFlow finds a checkpoint's files by a glob of its path: [1] matches 1, \b matches b
            raise ConfigError(
                f"{key}: the checkpoints would go to '{path}', whose {' '.join(pattern)} TensorFlow reads as a file "
                "pattern when it restores them, so resume= would find no checkpoint there. Choose a directory "
                f"without {' '.join(pattern)} ({'checkpoint.dir' if key == 'checkpoint.dir' else 'hydra.run.dir'}=<dir>)."
            )
        problem = writable_dir_problem(path)
        if problem:
            what = "checkpoints" if checkpoints else "the run's output"
            raise ConfigError(
                f"{key}: {path!r} cannot be used for {what}: {problem}. Point {key} at a directory this user can "
                + (
                    "create and write (or set checkpoint.enabled=false)."
                    if key == "checkpoint.dir"
                    else "create and write (hydra.run.dir=<dir>)."
                )
            )


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@probe
def logical_cpus_sensible(cfg):
    n, cores = cfg.devices.logical_cpus, _cores()
    limit = MAX_LOGICAL_CPUS_PER_CORE * cores
    if n > limit:
        raise ConfigError(
            f"devices.logical_cpus={n} is more than this machine can use: it has {cores} CPU core(s), and more than "
            f"{MAX_LOGICAL_CPUS_PER_CORE} logical CPUs per core only adds thread contention. Use 1..{limit}; for more "
            "replicas, spread them over processes (cluster=localhost cluster.workers=N strategy=multi_worker_mirrored)."
        )


def no_resume_dir(value) -> str:
    return (
        f"resume={value!r}: no such directory. Pass the output directory of an earlier run "
        "(outputs/<date>/<time>, printed at its start), which holds its checkpoints/ and mlflow_run_id."
    )


@probe
def resume_dir_exists(cfg):
    """resume= takes only a directory the runner wrote: .hydra/ plus its mlflow_run_id or checkpoints/."""
    if not cfg.resume:
        return
    path = os.path.abspath(os.path.expanduser(str(cfg.resume)))
    if not os.path.isdir(path):
        raise ConfigError(no_resume_dir(cfg.resume))
    if layout.is_run_dir(path, layout.checkpoint_dir(cfg, path)):
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
    from hydra.core.hydra_config import HydraConfig

    from runner.control.procs import started_at

    since = started_at()
    if since is None or not HydraConfig.initialized() or os.path.abspath(HydraConfig.get().runtime.output_dir) != path:
        return
    mine = lambda f: os.path.isfile(f) and os.path.getmtime(f) >= since - 1  # noqa: E731
    meta = os.path.join(path, layout.HYDRA_DIR)
    for name in ("config.yaml", "hydra.yaml", "overrides.yaml"):
        if mine(os.path.join(meta, name)):
            os.remove(os.path.join(meta, name))
    with contextlib.suppress(OSError):
        os.rmdir(meta)  # only if nothing else is in it
    log_file = os.path.join(path, f"{HydraConfig.get().job.name}.log")
    if mine(log_file) and os.path.getsize(log_file) == 0:
        os.remove(log_file)


HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def _hdf5_at(f, size: int) -> bool:
    """Whether the open file is HDF5: its signature at byte 0, or after a user block (512, 1024, 2048, ... bytes)."""
    offset = 0
    while offset + len(HDF5_SIGNATURE) <= size:
        f.seek(offset)
        if f.read(len(HDF5_SIGNATURE)) == HDF5_SIGNATURE:
            return True
        offset = 512 if offset == 0 else offset * 2
    return False


def weights_file_problem(path: str) -> str | None:
    """Why the file at `path` cannot be Keras weights, from the file alone (no TensorFlow: h5py reads HDF5), or None.
    Whether weights that are Keras weights fit the model is found when it is built (runner.models)."""
    import zipfile

    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(16)
            hdf5 = _hdf5_at(f, size)
    except OSError as err:
        return f"it cannot be read ({err.strerror or err})"
    if size == 0:  # a placeholder (tests/unit/test_models.py makes one): the builder's load names it
        return None
    if not hdf5:
        if zipfile.is_zipfile(path):
            return None if path.endswith(".keras") else "it is a zip archive; a saved tf_keras model must be named *.keras"
        return f"it is not an HDF5 file (it starts with {head!r}), so it holds no Keras weights"
    try:
        import h5py
    except ImportError:  # tf_keras needs h5py for .h5 weights: its own error says so
        return None
    try:
        with h5py.File(path, "r") as h5:
            keras = "layer_names" in h5.attrs or "model_weights" in h5 or path.endswith(".weights.h5")
    except OSError as err:  # cut short, a damaged superblock
        return f"HDF5 cannot read it ({str(err).strip() or type(err).__name__}): it is damaged, or cut short by a download"
    if not keras:
        return "it is an HDF5 file but holds no Keras weights (no layer_names: it was not written by save_weights or model.save)"
    return None


@probe
def model_weights_exist(cfg):
    """model=keras_app model.weights=PATH: the file is there (the runner downloads nothing), and is Keras weights."""
    weights = cfg.model.get("weights") if cfg.model.get("_target_") == "runner.models.keras_app" else None
    if weights is None:
        return
    path = os.path.expanduser(str(weights))
    if not os.path.isfile(path):
        raise ConfigError(
            f"model.weights={weights} is not a file here (working directory {os.getcwd()}). Give the local path of the "
            "backbone's weights without its top (.h5, downloaded beforehand: the runner downloads nothing), or "
            "model.weights=null to start from random weights."
        )
    problem = weights_file_problem(path)
    if problem:
        raise ConfigError(
            f"model.weights={weights} is not a weights file: {problem}. Nothing was trained. Give the local path of "
            f"the weights of model.application={cfg.model.get('application')} without its top, as tf_keras saves them "
            "(an .h5 file such as the application's *_notop.h5, downloaded beforehand), or model.weights=null to start "
            "from random weights."
        )


@probe
def resized_images_fit(cfg):
    """model=keras_app model.resize_to=[h, w]: one global batch of the resized images alone (the Resizing layer's
    output, at least one channel) clearly does not fit in memory. TensorFlow's own refusal comes at the first step, as
    ResourceExhaustedError. Only where the whole batch is on this machine (cluster=local, localhost); what the layers
    after it need is checked once the model is built (runner.builders.model)."""
    resize_to = cfg.model.get("resize_to") if cfg.model.get("_target_") == "runner.models.keras_app" else None
    if not resize_to or cfg.cluster.name not in ("local", "localhost"):
        return
    from runner.sources import checks  # NumPy, no TensorFlow

    available = checks.available_memory()
    h, w = (int(v) for v in resize_to)
    k, size = cfg.train.accumulation_steps, 2 if cfg.train.mixed_precision else 4
    batch = -(-cfg.train.global_batch_size // k)  # resized inside the model: one micro-batch at a time
    need = batch * h * w * size
    if available is None or need <= available:
        return
    per = f" / train.accumulation_steps={k}" if k > 1 else ""
    raise ConfigError(
        f"model.resize_to=[{h}, {w}] would need at least {checks.gib(need)} of memory for the resized images of one batch "
        f"alone ({batch} examples of train.global_batch_size{per} x {h}x{w} pixels x {size} bytes, one channel; the model's "
        f"layers need many times more), but this machine has {checks.gib(available)} available: TensorFlow would stop at the "
        "first step with ResourceExhaustedError. Nothing was trained. Use a much smaller model.resize_to (the "
        "applications take 32x32 and up; most were made for about [224, 224]); the run then checks what its layers "
        "need before the first step."
    )


@probe
def tf_config_well_formed(cfg):
    """TF_CONFIG mistakes, found before TensorFlow reads it (its own errors are KeyErrors and hangs)."""
    if not registry.selected(cfg, "cluster").caps.reads_tf_config:
        return
    raw = os.environ.get("TF_CONFIG")
    example = '{"cluster": {"worker": ["host1:2222", "host2:2222"]}, "task": {"type": "worker", "index": 0}}'
    if not raw:
        raise ConfigError(
            f"cluster={cfg.cluster.name} needs the TF_CONFIG environment variable, which is not set. It is JSON like {example}."
        )
    try:
        spec = json.loads(raw)
    except json.JSONDecodeError as err:
        raise ConfigError(f"TF_CONFIG is not valid JSON ({err}): {raw[:200]!r}. It should look like {example}.") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("cluster"), dict) or not spec["cluster"]:
        raise ConfigError(
            f"TF_CONFIG has no 'cluster' (a map of job name to host:port list): {raw[:200]!r}. It should look like {example}."
        )
    jobs, task = spec["cluster"], spec.get("task")
    if not isinstance(task, dict) or "type" not in task or "index" not in task:
        raise ConfigError(
            f"TF_CONFIG has no 'task' {{'type': ..., 'index': ...}} saying which task this process is: {raw[:200]!r}. "
            f"It should look like {example}."
        )
    tasks = {job: _tf_config_tasks(job, listed) for job, listed in jobs.items()}
    for job in ("chief", "evaluator"):  # TensorFlow's own check comes only once the strategy is built
        if len(tasks.get(job, {})) > 1:
            raise ConfigError(
                f"TF_CONFIG's cluster has {len(tasks[job])} {job} tasks ({', '.join(tasks[job].values())}); TensorFlow "
                f"takes at most one. List the others under 'worker'."
            )
    kind, index = task["type"], task["index"]
    if not isinstance(kind, str) or (kind != "evaluator" and kind not in jobs):
        raise ConfigError(
            f"TF_CONFIG task type {kind!r} is not a job of its cluster; valid types: {', '.join(jobs)} (or evaluator)."
        )
    if isinstance(index, bool) or not isinstance(index, int):
        raise ConfigError(
            f"TF_CONFIG task index {index!r} is not an integer; give this task's position in its job's list as a "
            f'number ("index": 0, not "0").'
        )
    if kind in jobs:
        if index not in tasks[kind]:
            raise ConfigError(
                f"TF_CONFIG task index {index!r} is out of range: job {kind!r} has {len(tasks[kind])} task(s), "
                f"so valid indices are 0..{len(tasks[kind]) - 1}."
            )
        address = tasks[kind][index]
        host, _, port = address.rpartition(":")
        if port == "0" and sum(map(len, tasks.values())) > 1:
            raise ConfigError(
                f"TF_CONFIG gives this task ({kind}:{index}) the address {address}: port 0 lets the system pick any "
                "port, which the other tasks of the cluster cannot know. Give every task a fixed free port."
            )
        if local_host(host) and port_in_use(int(port)):
            raise ConfigError(
                f"TF_CONFIG gives this task ({kind}:{index}) the address {address}, but port {port} is already in use "
                "on this machine (another task or program holds it). Give every task a free port, or stop the "
                f"program that holds it (`ss -ltnp | grep :{port}` shows which)."
            )


def _digits(text) -> bool:
    """A non-negative integer written in ASCII digits ("²".isdigit() is True, but int("²") fails)."""
    return isinstance(text, str) and text.isascii() and text.isdigit()


TF_JOBS = ("chief", "worker", "ps", "evaluator")  # the only job names TensorFlow's strategies accept


def _tf_config_tasks(job, listed) -> dict[int, str]:
    """One job of TF_CONFIG's cluster as {index: "host:port"}. TensorFlow takes a list, or a map from index to
    address ({"0": "host:port", ...}, JSON keys being text); anything else is its TypeError or a hang later."""
    if job not in TF_JOBS:
        raise ConfigError(
            f"TF_CONFIG's cluster has a job {job!r}; TensorFlow knows only {', '.join(TF_JOBS)}. Rename it "
            "(most clusters are 'worker' tasks, with at most one 'chief')."
        )
    if isinstance(listed, list):
        tasks = dict(enumerate(listed))
    elif isinstance(listed, dict) and all(_digits(i) for i in listed):
        tasks = {int(i): address for i, address in listed.items()}
        if sorted(tasks) != list(range(len(tasks))):  # TensorFlow counts a job's tasks: index n needs n+1 of them
            raise ConfigError(
                f"TF_CONFIG's cluster numbers the {job!r} tasks {', '.join(map(str, sorted(tasks)))}; the indices of a "
                f"job's {len(tasks)} task(s) must be 0..{len(tasks) - 1}, each once."
            )
    else:
        raise ConfigError(
            f'TF_CONFIG\'s cluster lists the {job!r} tasks as {json.dumps(listed)[:200]}; give a list of "host:port" '
            f'addresses (["host1:2222", "host2:2222"]) or a map from task index to address ({{"0": "host1:2222"}}).'
        )
    if not tasks:
        raise ConfigError(f"TF_CONFIG's cluster lists no {job!r} tasks; give each one's \"host:port\", or drop the job.")
    for i, address in sorted(tasks.items()):
        host, _, port = address.rpartition(":") if isinstance(address, str) else ("", "", "")
        if not host or not _digits(port) or not 0 <= int(port) <= 65535:
            raise ConfigError(
                f"TF_CONFIG address {address!r} of {job}:{i} is not host:port (a host name or IP address, a colon, "
                'and a port number 1..65535), e.g. "10.0.0.1:2222".'
            )
    return tasks


def _opens_the_store(cfg) -> bool:
    """Whether this process opens the MLflow store itself: not a task attached to its launcher's run, nor a
    tf_config task other than the chief (its store may be on another host)."""
    if os.environ.get(contract.ATTACH_RUN):
        return False
    if cfg.cluster.name in layout.READS_TF_CONFIG:
        return layout.tf_config_chief(cfg.strategy.name, os.environ.get("TF_CONFIG"))
    return cfg.cluster.name in ("local", "tpu") or bool(registry.selected(cfg, "cluster").caps.launcher)


@probe
def tracking_server_reachable(cfg):
    uri = cfg.mlflow.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not cfg.mlflow.enabled:
        return
    path = sqlite_store.sqlite_path(uri or "sqlite:///mlflow.db")  # MLflow's default (runner.tracking.run)
    if path and _opens_the_store(cfg):  # a store MLflow cannot write: refused now, not after its retries (~110 s)
        key = "mlflow.tracking_uri" if cfg.mlflow.tracking_uri else "MLFLOW_TRACKING_URI" if uri else None
        sqlite_store.check_sqlite(path, *[key] * bool(key))
    if not uri:
        return
    problem = tracking_problem(uri)
    if problem:
        source = "mlflow.tracking_uri" if cfg.mlflow.tracking_uri else "MLFLOW_TRACKING_URI"
        raise ConfigError(
            f"{source}={redact_uri(uri)} is unreachable ({problem}); nothing was trained. Start the server, point "
            f"{source} at one that is up, unset it to log to the local sqlite:///mlflow.db, or set "
            "mlflow.enabled=false to train without tracking."
        )
