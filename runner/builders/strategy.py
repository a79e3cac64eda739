"""strategy -> a real tf.distribute.Strategy. One branch per option in conf/strategy/."""

from runner.builders.cluster import Cluster
from runner.builders.cross_device_ops import build_communication_options, build_cross_device_ops
from runner.builders.devices import Devices
from runner.errors import ConfigError


def _default(cfg, ops_cfg, devices, cluster):
    import tensorflow as tf

    return tf.distribute.get_strategy()


def _one_device(cfg, ops_cfg, devices, cluster):
    import tensorflow as tf

    return tf.distribute.OneDeviceStrategy(cfg.device or ("/gpu:0" if devices.gpus else "/cpu:0"))


def _mirrored(cfg, ops_cfg, devices, cluster):
    import tensorflow as tf

    return tf.distribute.MirroredStrategy(
        devices=list(cfg.devices or devices.compute), cross_device_ops=build_cross_device_ops(ops_cfg, devices)
    )


def _central_storage(cfg, ops_cfg, devices, cluster):
    import tensorflow as tf

    return tf.distribute.experimental.CentralStorageStrategy(
        compute_devices=list(cfg.compute_devices or devices.compute), parameter_device=cfg.parameter_device or "/cpu:0"
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


def _parameter_server(cfg, ops_cfg, devices, cluster):
    import tensorflow as tf

    if cluster.resolver is None:
        raise ConfigError("strategy=parameter_server needs a cluster of worker and ps tasks; cluster=local has none.")
    return tf.distribute.experimental.ParameterServerStrategy(
        cluster.resolver, variable_partitioner=variable_partitioner(cfg.variable_partitioner)
    )


def _tpu(cfg, ops_cfg, devices, cluster):
    import tensorflow as tf

    return tf.distribute.TPUStrategy(cluster.resolver)  # connected and initialised by the cluster builder


BUILDERS = {
    "default": _default,
    "one_device": _one_device,
    "mirrored": _mirrored,
    "central_storage": _central_storage,
    "multi_worker_mirrored": _multi_worker_mirrored,
    "parameter_server": _parameter_server,
    "tpu": _tpu,
}


def build_strategy(cfg, ops_cfg, devices: Devices, cluster: Cluster):
    if cfg.name not in BUILDERS:
        raise ConfigError(f"strategy={cfg.name} is unknown; choose one of: {', '.join(BUILDERS)}.")
    return BUILDERS[cfg.name](cfg, ops_cfg, devices, cluster)
