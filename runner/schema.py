"""Typed schemas for every config group, registered in Hydra's ConfigStore.

Each YAML option lists its schema first in its defaults (`/schema/<group>/<option>@_here_`), so a
wrong type or an unknown key fails while Hydra composes the config, before TensorFlow is imported.

Every numeric field declares its valid range here, once, beside the field: `epochs: int = ranged(2, ge=1)`.
runner/validate.py enforces all of them with one generic check (`ranges`), before TensorFlow is imported.
"""

from dataclasses import dataclass, field
from typing import Any, List, Optional

UINT32_MAX = 2**32 - 1  # numpy's and Python's random.seed take seeds up to this


@dataclass(frozen=True)
class Range:
    """Bounds of one numeric field (None: unbounded). For a list field they apply to each element."""

    ge: Optional[float] = None
    gt: Optional[float] = None
    le: Optional[float] = None
    lt: Optional[float] = None
    null: Optional[str] = None  # what null means, for Optional fields (said in the message)
    why: str = ""  # what the bound protects against or what to do, appended to the message


def ranged(default=None, *, factory=None, **bounds) -> Any:
    """A dataclass field with a default and its valid range: `seed: int = ranged(0, ge=0, le=UINT32_MAX)`."""
    if factory is not None:
        return field(default_factory=factory, metadata={"range": Range(**bounds)})
    return field(default=default, metadata={"range": Range(**bounds)})

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


# --- strategy: one schema per tf.distribute strategy, fields mirror the constructor arguments ---
@dataclass
class StrategyConfig:
    name: str = MISSING


@dataclass
class OneDeviceConfig(StrategyConfig):
    device: Optional[str] = None  # None: /gpu:0 when a GPU is visible, else /cpu:0


@dataclass
class MirroredConfig(StrategyConfig):
    devices: Optional[List[str]] = None  # None: all visible GPUs, else all logical CPUs


@dataclass
class CentralStorageConfig(StrategyConfig):
    compute_devices: Optional[List[str]] = None  # None: all visible GPUs, else all logical CPUs
    parameter_device: Optional[str] = None  # None: /cpu:0


@dataclass
class MultiWorkerMirroredConfig(StrategyConfig):
    collective_timeout_sec: Optional[float] = ranged(None, gt=0, null="TensorFlow's default")  # CommunicationOptions(timeout_seconds=...)


@dataclass
class VariablePartitionerConfig:
    kind: str = "none"  # none | fixed_shards | min_size | max_size
    num_shards: int = ranged(2, ge=1)  # fixed_shards
    min_shard_bytes: int = ranged(256 << 10, ge=1)  # min_size
    max_shards: int = ranged(2, ge=1)  # min_size and max_size
    max_shard_bytes: int = ranged(1 << 20, ge=1)  # max_size


@dataclass
class ParameterServerConfig(StrategyConfig):
    variable_partitioner: VariablePartitionerConfig = field(default_factory=VariablePartitionerConfig)


@dataclass
class TPUConfig(StrategyConfig):
    pass  # the TPU's address is the cluster's: cluster=tpu cluster.tpu=...


# --- cross_device_ops: all-reduce for mirrored, communication implementation for multi-worker ---
@dataclass
class CrossDeviceOpsConfig:
    name: str = MISSING
    num_packs: int = ranged(1, ge=0, why="0 packs nothing; TensorFlow refuses negative values")  # NcclAllReduce / HierarchicalCopyAllReduce
    reduce_to_device: Optional[str] = None  # ReductionToOneDevice; None: TF's choice


@dataclass
class ClusterConfig:
    name: str = MISSING
    start_timeout_sec: float = ranged(120.0, gt=0)  # a task still waiting for its peers after this stops with an error


@dataclass
class LocalhostClusterConfig(ClusterConfig):
    workers: int = ranged(2, ge=1)
    ps: int = ranged(0, ge=0)
    chief: bool = False  # parameter_server always gets a chief: the coordinator
    evaluator: bool = False  # a side-car evaluator task that evaluates each checkpoint
    failure_grace_sec: float = ranged(5.0, ge=0)  # after a task dies, how long the others get to exit before they are killed
    stop_grace_sec: float = ranged(60.0, ge=0)  # on Ctrl-C or SIGTERM: how long trainers get to write their checkpoint
    restart_workers: int = ranged(3, ge=0)  # parameter_server: restart a dead worker or ps task up to this many times


@dataclass
class SlurmClusterConfig(ClusterConfig):
    port_base: int = ranged(8888, ge=1, le=65535, why="it is a TCP port")
    ps: int = ranged(0, ge=0)  # with parameter_server: the first `ps` Slurm tasks become ps, the next one the chief
    gpus_per_node: Optional[int] = ranged(None, ge=0, null="the GPUs TensorFlow sees")  # None: the GPUs TensorFlow sees on this node


@dataclass
class TPUClusterConfig(ClusterConfig):
    tpu: str = "local"  # TPU name, grpc://host:port address, or "local" on a TPU VM
    zone: Optional[str] = None
    project: Optional[str] = None
    connect_timeout_sec: float = ranged(30.0, gt=0)  # an address with nothing behind it hangs: give up after this


@dataclass
class CheckpointConfig:
    enabled: bool = True
    dir: Optional[str] = None  # None: <output_dir>/checkpoints
    every_n_steps: Optional[int] = ranged(None, ge=1, null="at the end of each epoch")  # custom loop; None: at the end of each epoch (fit: always per epoch)
    max_to_keep: int = ranged(3, ge=1, why="the newest checkpoint is what resume= continues from")


# --- data ---
@dataclass
class DataConfig:
    name: str = MISSING
    input: str = "tf_data"  # tf_data | numpy | from_function
    shuffle: bool = True
    shuffle_buffer: int = ranged(10_000, ge=1, why="set data.shuffle=false not to shuffle")
    cache: bool = False
    prefetch: bool = True


@dataclass
class OnesDataConfig(DataConfig):
    num_examples: int = ranged(100, ge=1)
    eval_examples: int = ranged(100, ge=1)


@dataclass
class SyntheticDataConfig(DataConfig):
    task: str = "classification"  # classification | regression
    num_examples: int = ranged(4096, ge=1)
    eval_examples: int = ranged(1024, ge=1)
    num_features: int = ranged(20, ge=1)
    num_classes: int = ranged(4, ge=2, why="classification needs two classes or more")
    noise: float = ranged(0.1, ge=0)
    seed: int = ranged(0, ge=0, le=UINT32_MAX)


@dataclass
class DigitsDataConfig(DataConfig):
    eval_fraction: float = ranged(0.2, gt=0, lt=1)
    seed: int = ranged(0, ge=0, le=UINT32_MAX)


@dataclass
class NpzDataConfig(DataConfig):
    path: str = MISSING
    task: str = "classification"
    x_train: str = "x_train"
    y_train: str = "y_train"
    x_eval: str = "x_eval"  # when absent from the file, eval_fraction of the training arrays is held out
    y_eval: str = "y_eval"
    eval_fraction: float = ranged(0.2, gt=0, lt=1)
    seed: int = ranged(0, ge=0, le=UINT32_MAX)


@dataclass
class ExecutorConfig:
    name: str = MISSING
    verbose: str = "auto"  # auto (progress bar on a terminal, log lines otherwise) | 0 (quiet) | 1 (bar) | 2 (lines)


# --- plain nodes of the root config ---
@dataclass
class DevicesConfig:
    logical_cpus: int = ranged(1, ge=1)  # split the CPU into N logical devices so multi-replica strategies run anywhere
    gpus: Optional[List[int]] = ranged(None, ge=0, null="all GPUs")  # indices of the GPUs to make visible; None: all
    memory_growth: bool = True


@dataclass
class OptimizerConfig:
    name: str = "sgd"  # sgd | adam | rmsprop | adagrad
    learning_rate: float = ranged(0.01, gt=0)
    momentum: float = ranged(0.0, ge=0, lt=1)  # sgd and rmsprop
    clipnorm: Optional[float] = ranged(None, gt=0, null="no clipping")


@dataclass
class TrainConfig:
    epochs: int = ranged(2, ge=1)
    steps_per_epoch: Optional[int] = ranged(None, ge=1, null="one pass over the data")  # None: training examples // global batch
    global_batch_size: int = ranged(64, ge=1)
    loss: str = "auto"  # auto | mse | binary_crossentropy | sparse_categorical_crossentropy
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    seed: int = ranged(0, ge=0, le=UINT32_MAX)
    steps_per_execution: int = ranged(1, ge=1)  # fit: steps per tf.function call
    steps_per_loop: int = ranged(1, ge=1)  # custom_loop: steps per tf.function call
    log_every_n_steps: int = ranged(10, ge=1)
    mixed_precision: bool = False  # tf_keras mixed_float16 policy (GPUs with tensor cores)


@dataclass
class MlflowConfig:
    experiment_name: str = "runner"
    run_name: Optional[str] = None
    tracking_uri: Optional[str] = None  # None: MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here
    enabled: bool = True  # false: no MLflow at all (benchmarks of the logging cost, quick trials)
    flush_every_sec: float = ranged(30.0, ge=1, why="sending more often slows training many times over (0 made it 10-16x slower)")  # the background sender's period; training never waits for it
    delivery_timeout_sec: float = ranged(120.0, ge=0)  # at the end: wait this long for a server that is down, then save an outbox


@dataclass
class RunnerConfig:
    strategy: Any = MISSING
    cross_device_ops: Any = MISSING
    cluster: Any = MISSING
    model: Any = MISSING  # open: `_target_` plus the function's own arguments
    data: Any = MISSING
    executor: Any = MISSING
    devices: DevicesConfig = field(default_factory=DevicesConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    resume: Optional[str] = None  # an earlier run's output directory: continue its checkpoint and MLflow run
    save_model: bool = True
    output_dir: Optional[str] = None


GROUP_SCHEMAS = {
    "strategy": {
        "default": StrategyConfig,
        "one_device": OneDeviceConfig,
        "mirrored": MirroredConfig,
        "central_storage": CentralStorageConfig,
        "multi_worker_mirrored": MultiWorkerMirroredConfig,
        "parameter_server": ParameterServerConfig,
        "tpu": TPUConfig,
    },
    "cross_device_ops": {"base": CrossDeviceOpsConfig},
    "cluster": {
        "local": ClusterConfig,
        "localhost": LocalhostClusterConfig,
        "tf_config": ClusterConfig,
        "slurm": SlurmClusterConfig,
        "tpu": TPUClusterConfig,
    },
    "data": {
        "ones": OnesDataConfig,
        "synthetic": SyntheticDataConfig,
        "digits": DigitsDataConfig,
        "npz": NpzDataConfig,
    },
    "executor": {"base": ExecutorConfig},
}


def register() -> None:
    cs = ConfigStore.instance()
    cs.store(name="runner_schema", node=RunnerConfig)
    for group, options in GROUP_SCHEMAS.items():
        for option, node in options.items():
            cs.store(group=f"schema/{group}", name=option, node=node)
