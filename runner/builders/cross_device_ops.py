"""cross_device_ops -> tf.distribute.CrossDeviceOps (mirrored) or a CommunicationImplementation (multi-worker).

Each option registers its builder, fn(cfg, devices, multi_worker): for MirroredStrategy the CrossDeviceOps (None lets
TensorFlow choose), for MultiWorkerMirroredStrategy the CommunicationImplementation. Which strategy takes which option
is the strategy's capability (`cross_device_ops=...` in runner.builders.strategy).
"""

from dataclasses import dataclass

from omegaconf import MISSING

from runner.builders.devices import Devices
from runner.config.fields import ranged
from runner.config.registry import describe, get, option
from runner.errors import ConfigError

describe("cross_device_ops", "the all-reduce")


@dataclass
class CrossDeviceOpsConfig:
    name: str = MISSING
    # NcclAllReduce / HierarchicalCopyAllReduce
    num_packs: int = ranged(1, ge=0, why="0 packs nothing; TensorFlow refuses negative values")
    reduce_to_device: str | None = None  # ReductionToOneDevice; None: TF's choice


def _implementation(name: str):
    import tensorflow as tf

    return getattr(tf.distribute.experimental.CommunicationImplementation, name)


@option(
    "cross_device_ops",
    "auto",
    schema=CrossDeviceOpsConfig,
    help="TensorFlow's choice (mirrored: NCCL with GPUs, else ReductionToOneDevice; multi-worker: AUTO)",
)
def _auto(cfg, devices, multi_worker):
    return _implementation("AUTO") if multi_worker else None


@option(
    "cross_device_ops",
    "nccl",
    schema=CrossDeviceOpsConfig,
    help="NcclAllReduce(num_packs), or CommunicationImplementation.NCCL; NVIDIA GPUs only",
)
def _nccl(cfg, devices, multi_worker):
    import tensorflow as tf

    if not devices.gpus:
        instead = "ring or auto" if multi_worker else "hierarchical_copy or reduction_to_one_device"
        raise ConfigError(
            "cross_device_ops=nccl needs NVIDIA GPUs (NCCL has no CPU kernels), but TensorFlow sees no GPU on this "
            f"machine. Use cross_device_ops={instead} instead."
        )
    return _implementation("NCCL") if multi_worker else tf.distribute.NcclAllReduce(num_packs=cfg.num_packs)


@option("cross_device_ops", "hierarchical_copy", schema=CrossDeviceOpsConfig, help="HierarchicalCopyAllReduce(num_packs)")
def _hierarchical_copy(cfg, devices, multi_worker):
    import tensorflow as tf

    return tf.distribute.HierarchicalCopyAllReduce(num_packs=cfg.num_packs)


@option(
    "cross_device_ops",
    "reduction_to_one_device",
    schema=CrossDeviceOpsConfig,
    help="ReductionToOneDevice(reduce_to_device): reduce on one device, then broadcast",
)
def _reduction_to_one_device(cfg, devices, multi_worker):
    import tensorflow as tf

    return tf.distribute.ReductionToOneDevice(reduce_to_device=cfg.reduce_to_device)


@option("cross_device_ops", "ring", schema=CrossDeviceOpsConfig, help="CommunicationImplementation.RING (gRPC, CPU and GPU)")
def _ring(cfg, devices, multi_worker):
    return _implementation("RING")


def build_cross_device_ops(cfg, devices: Devices):
    """For MirroredStrategy(cross_device_ops=...); None lets TensorFlow choose."""
    return get("cross_device_ops", cfg.name).build(cfg, devices, multi_worker=False)


def build_communication_options(cfg, devices: Devices, timeout_seconds=None):
    """For MultiWorkerMirroredStrategy(communication_options=...)."""
    import tensorflow as tf

    implementation = get("cross_device_ops", cfg.name).build(cfg, devices, multi_worker=True)
    return tf.distribute.experimental.CommunicationOptions(implementation=implementation, timeout_seconds=timeout_seconds)
