"""strategy -> a real tf.distribute.Strategy. Each option: its schema (fields mirror the constructor's arguments),
its capabilities and its builder, registered together (runner.config.registry); its YAML is conf/strategy/<name>.yaml."""

from dataclasses import dataclass, field
from enum import StrEnum

from omegaconf import MISSING

from runner.builders.cluster import Cluster
from runner.builders.cross_device_ops import build_communication_options, build_cross_device_ops
from runner.builders.devices import Devices, check_devices_exist
from runner.config.fields import choice, ranged
from runner.config.registry import describe, get, option, options
from runner.errors import ConfigError

describe("strategy", "the tf.distribute strategy")


@dataclass
class StrategyConfig:
    name: str = MISSING


@dataclass
class OneDeviceConfig(StrategyConfig):
    device: str | None = None  # None: /gpu:0 when a GPU is visible, else /cpu:0


@dataclass
class MirroredConfig(StrategyConfig):
    devices: list[str] | None = None  # e.g. ["/gpu:0", "/gpu:1"]; None: all visible GPUs, else all logical CPUs


@dataclass
class CentralStorageConfig(StrategyConfig):
    compute_devices: list[str] | None = None  # None: all visible GPUs, else all logical CPUs
    parameter_device: str | None = None  # None: /cpu:0


@dataclass
class MultiWorkerMirroredConfig(StrategyConfig):
    # CommunicationOptions(timeout_seconds=...)
    collective_timeout_sec: float | None = ranged(None, gt=0, null="TensorFlow's default")


class Partitioner(StrEnum):
    none = "none"
    fixed_shards = "fixed_shards"  # FixedShardsPartitioner(num_shards)
    min_size = "min_size"  # MinSizePartitioner(min_shard_bytes, max_shards)
    max_size = "max_size"  # MaxSizePartitioner(max_shard_bytes, max_shards)


@dataclass
class VariablePartitionerConfig:
    # how ParameterServerStrategy splits large variables over the ps tasks (tf.distribute.experimental.partitioners)
    kind: str = choice(Partitioner, "none")
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


@option("strategy", "default", schema=StrategyConfig, help="get_strategy()")
def _default(cfg, ops_cfg, devices, cluster):
    import tensorflow as tf

    return tf.distribute.get_strategy()


def _one_device_names(cfg, ops_cfg):
    return [("strategy.device", cfg.device)] if cfg.device else []


@option("strategy", "one_device", schema=OneDeviceConfig, help="OneDeviceStrategy", devices=_one_device_names)
def _one_device(cfg, ops_cfg, devices, cluster):
    import tensorflow as tf

    return tf.distribute.OneDeviceStrategy(cfg.device or ("/gpu:0" if devices.gpus else "/cpu:0"))


def _mirrored_names(cfg, ops_cfg):
    named = [("strategy.devices", d) for d in (cfg.devices or [])]
    if ops_cfg.name == "reduction_to_one_device" and ops_cfg.get("reduce_to_device"):
        named.append(("cross_device_ops.reduce_to_device", ops_cfg.reduce_to_device))
    return named


@option(
    "strategy",
    "mirrored",
    schema=MirroredConfig,
    help="MirroredStrategy",
    cross_device_ops=("auto", "nccl", "hierarchical_copy", "reduction_to_one_device"),
    devices=_mirrored_names,
)
def _mirrored(cfg, ops_cfg, devices, cluster):
    import tensorflow as tf

    return tf.distribute.MirroredStrategy(
        devices=list(cfg.devices or devices.compute), cross_device_ops=build_cross_device_ops(ops_cfg, devices)
    )


def _central_storage_names(cfg, ops_cfg):
    named = [("strategy.compute_devices", d) for d in (cfg.compute_devices or [])]
    return named + ([("strategy.parameter_device", cfg.parameter_device)] if cfg.parameter_device else [])


@option("strategy", "central_storage", schema=CentralStorageConfig, help="CentralStorageStrategy", devices=_central_storage_names)
def _central_storage(cfg, ops_cfg, devices, cluster):
    import tensorflow as tf

    return tf.distribute.experimental.CentralStorageStrategy(
        compute_devices=list(cfg.compute_devices or devices.compute), parameter_device=cfg.parameter_device or "/cpu:0"
    )


@option(
    "strategy",
    "multi_worker_mirrored",
    schema=MultiWorkerMirroredConfig,
    help="MultiWorkerMirroredStrategy",
    cross_device_ops=("auto", "ring", "nccl"),
    multi_process=True,
)
def _multi_worker_mirrored(cfg, ops_cfg, devices, cluster):
    import tensorflow as tf

    options = build_communication_options(ops_cfg, devices, cfg.collective_timeout_sec)
    kwargs = {"cluster_resolver": cluster.resolver} if cluster.resolver is not None else {}
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options, **kwargs)


def variable_partitioner(cfg):
    import tensorflow as tf

    p = tf.distribute.experimental.partitioners
    return {
        "none": lambda: None,
        "fixed_shards": lambda: p.FixedShardsPartitioner(num_shards=cfg.num_shards),
        "min_size": lambda: p.MinSizePartitioner(min_shard_bytes=cfg.min_shard_bytes, max_shards=cfg.max_shards),
        "max_size": lambda: p.MaxSizePartitioner(max_shard_bytes=cfg.max_shard_bytes, max_shards=cfg.max_shards),
    }[cfg.kind]()


def _needs_process_cluster(cfg):
    if not get("cluster", cfg.cluster.name).caps.processes:
        takers = [o.name for o in options("cluster").values() if o.caps.processes]
        alone = [o.name for o in options("strategy").values() if o.caps.check is None]  # no cluster requirement
        raise ConfigError(
            f"strategy=parameter_server needs a cluster of worker and ps tasks, but cluster={cfg.cluster.name} is this one "
            f"process. Use cluster={takers[0]} cluster.ps=1 (tasks on this machine), "
            f"{' or '.join('cluster=' + t for t in takers[1:])}; or a single-process strategy: {', '.join(alone)}."
        )


@option(
    "strategy",
    "parameter_server",
    schema=ParameterServerConfig,
    help="ParameterServerStrategy",
    multi_process=True,
    check=_needs_process_cluster,
)
def _parameter_server(cfg, ops_cfg, devices, cluster):
    import tensorflow as tf

    if cluster.resolver is None:
        raise ConfigError("strategy=parameter_server needs a cluster of worker and ps tasks; cluster=local has none.")
    return tf.distribute.experimental.ParameterServerStrategy(
        cluster.resolver, variable_partitioner=variable_partitioner(cfg.variable_partitioner)
    )


def _needs_tpu_cluster(cfg):
    if cfg.cluster.name != "tpu":
        raise ConfigError(
            f"strategy=tpu needs cluster=tpu with the TPU's address (cluster.tpu=<name or grpc://host:port>), "
            f"not cluster={cfg.cluster.name}. Without a TPU use strategy=mirrored or one_device."
        )


@option("strategy", "tpu", schema=TPUConfig, help="TPUStrategy", inputs=("tf_data", "from_function"), check=_needs_tpu_cluster)
def _tpu(cfg, ops_cfg, devices, cluster):
    import tensorflow as tf

    return tf.distribute.TPUStrategy(cluster.resolver)  # connected and initialised by the cluster builder


def build_strategy(cfg, ops_cfg, devices: Devices, cluster: Cluster):
    chosen = get("strategy", cfg.name)  # an unknown name: "strategy=... is unknown; choose one of: ..."
    if chosen.caps.devices is not None:
        check_devices_exist(chosen.caps.devices(cfg, ops_cfg))
    return chosen.build(cfg, ops_cfg, devices, cluster)


def strategy_name(strategy) -> str:
    """The name a user knows from the guide (TensorFlow's classes behind them have other names: the default
    strategy is `_DefaultDistributionStrategy`, MultiWorkerMirroredStrategy a `CollectiveAllReduceStrategy`)."""
    import tensorflow as tf

    public = {
        "MultiWorkerMirroredStrategy": tf.distribute.MultiWorkerMirroredStrategy,
        "MirroredStrategy": tf.distribute.MirroredStrategy,
        "OneDeviceStrategy": tf.distribute.OneDeviceStrategy,
        "CentralStorageStrategy": tf.distribute.experimental.CentralStorageStrategy,
        "ParameterServerStrategy": tf.distribute.experimental.ParameterServerStrategy,
        "TPUStrategy": tf.distribute.TPUStrategy,
    }
    for name, cls in public.items():
        if isinstance(strategy, cls):
            return name
    return "default strategy" if type(strategy).__name__.startswith("_Default") else type(strategy).__name__
