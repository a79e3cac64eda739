"""Cross-field checks on the composed config, run before TensorFlow is imported.

Types and unknown keys are already caught by the schemas (runner/schema.py) while Hydra composes.
Each check here is one small function with a message that names the bad value and the valid choices.
"""

import os
from typing import Callable, List

from omegaconf import DictConfig

from runner.errors import ConfigError

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


@check
def positive_numbers(cfg):
    t = cfg.train
    for key, value in [
        ("train.epochs", t.epochs),
        ("train.global_batch_size", t.global_batch_size),
        ("train.steps_per_execution", t.steps_per_execution),
        ("train.steps_per_loop", t.steps_per_loop),
        ("train.log_every_n_steps", t.log_every_n_steps),
        ("devices.logical_cpus", cfg.devices.logical_cpus),
    ]:
        if value < 1:
            raise ConfigError(f"{key}={value} must be a positive integer (1 or more).")
    if t.steps_per_epoch is not None and t.steps_per_epoch < 1:
        raise ConfigError(f"train.steps_per_epoch={t.steps_per_epoch} must be 1 or more, or null (one pass over the data).")
    if t.optimizer.learning_rate <= 0:
        raise ConfigError(f"train.optimizer.learning_rate={t.optimizer.learning_rate} must be greater than 0.")


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
    if c.workers < 1:
        raise ConfigError(f"cluster.workers={c.workers} must be 1 or more.")
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


@check
def eval_fraction_in_range(cfg):
    fraction = cfg.data.get("eval_fraction")
    if fraction is not None and not 0 < fraction < 1:
        raise ConfigError(f"data.eval_fraction={fraction} must be between 0 and 1 (exclusive).")
