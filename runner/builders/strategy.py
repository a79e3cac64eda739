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


def named_devices(cfg, ops_cfg):
    """(key, device name) for every device the config names for a single-process strategy."""
    named = []
    if cfg.name == "one_device" and cfg.device:
        named.append(("strategy.device", cfg.device))
    if cfg.name == "mirrored":
        named += [("strategy.devices", d) for d in (cfg.devices or [])]
    if cfg.name == "central_storage":
        named += [("strategy.compute_devices", d) for d in (cfg.compute_devices or [])]
        if cfg.parameter_device:
            named.append(("strategy.parameter_device", cfg.parameter_device))
    if cfg.name == "mirrored" and ops_cfg.name == "reduction_to_one_device" and ops_cfg.get("reduce_to_device"):
        named.append(("cross_device_ops.reduce_to_device", ops_cfg.reduce_to_device))
    return named


def check_devices_exist(cfg, ops_cfg) -> None:
    """A device that does not exist makes the strategy hang at the first step: refuse it, naming the ones that exist.

    Only for strategies that name devices (one_device, mirrored, central_storage): list_logical_devices() initialises
    TensorFlow's context, which multi_worker_mirrored must configure first.
    """
    named = named_devices(cfg, ops_cfg)
    if not named:
        return
    import tensorflow as tf

    existing = tf.config.list_logical_devices()
    have = {(d.device_type.upper(), tf.DeviceSpec.from_string(d.name).device_index) for d in existing}
    listing = ", ".join(d.name.replace("/job:localhost/replica:0/task:0", "") for d in existing)
    for key, name in named:
        try:
            spec = tf.DeviceSpec.from_string(str(name))
        except (ValueError, TypeError) as err:
            raise ConfigError(f"{key}={name!r} is not a device name ({err}). Devices here: {listing}.") from None
        kind = (spec.device_type or "").upper()
        found = bool(kind) and any(k == kind and (spec.device_index is None or i == spec.device_index) for k, i in have)
        if spec.job not in (None, "localhost") or spec.task not in (None, 0) or spec.replica not in (None, 0):
            found = False  # another task's device: this process only has its own
        if not found:
            hint = " (devices.logical_cpus=N makes N CPU devices)" if kind == "CPU" else ""
            raise ConfigError(
                f"{key}={name!r} names a device that does not exist in this process; the devices that exist are: "
                f"{listing}{hint}. Name one of them, or leave {key} null (the default).")


def build_strategy(cfg, ops_cfg, devices: Devices, cluster: Cluster):
    if cfg.name not in BUILDERS:
        raise ConfigError(f"strategy={cfg.name} is unknown; choose one of: {', '.join(BUILDERS)}.")
    check_devices_exist(cfg, ops_cfg)
    return BUILDERS[cfg.name](cfg, ops_cfg, devices, cluster)
