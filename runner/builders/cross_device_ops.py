"""cross_device_ops -> tf.distribute.CrossDeviceOps (mirrored) or CommunicationOptions (multi-worker)."""

from runner.errors import ConfigError
from runner.builders.devices import Devices


def _require_gpus(cfg, devices: Devices, alternative: str) -> None:
    if cfg.name == "nccl" and not devices.gpus:
        raise ConfigError(
            "cross_device_ops=nccl needs NVIDIA GPUs (NCCL has no CPU kernels), but TensorFlow sees no GPU on this "
            f"machine. Use cross_device_ops={alternative} instead."
        )


def build_cross_device_ops(cfg, devices: Devices):
    """For MirroredStrategy(cross_device_ops=...); None lets TensorFlow choose."""
    import tensorflow as tf

    _require_gpus(cfg, devices, "hierarchical_copy or reduction_to_one_device")
    if cfg.name == "nccl":
        return tf.distribute.NcclAllReduce(num_packs=cfg.num_packs)
    if cfg.name == "hierarchical_copy":
        return tf.distribute.HierarchicalCopyAllReduce(num_packs=cfg.num_packs)
    if cfg.name == "reduction_to_one_device":
        return tf.distribute.ReductionToOneDevice(reduce_to_device=cfg.reduce_to_device)
    return None  # auto


def build_communication_options(cfg, devices: Devices, timeout_seconds=None):
    """For MultiWorkerMirroredStrategy(communication_options=...)."""
    import tensorflow as tf

    _require_gpus(cfg, devices, "ring or auto")
    impl = tf.distribute.experimental.CommunicationImplementation
    implementation = {"auto": impl.AUTO, "ring": impl.RING, "nccl": impl.NCCL}[cfg.name]
    return tf.distribute.experimental.CommunicationOptions(implementation=implementation, timeout_seconds=timeout_seconds)
