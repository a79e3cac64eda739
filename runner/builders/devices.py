"""devices -> visible GPUs and logical CPUs. Must run before TensorFlow initialises its devices."""

from dataclasses import dataclass
from typing import List

from runner.errors import ConfigError


@dataclass
class Devices:
    gpus: List[str]  # logical GPU names, e.g. /device:GPU:0
    cpus: List[str]  # logical CPU names, e.g. /device:CPU:0 ... /device:CPU:3

    @property
    def compute(self) -> List[str]:
        """Where replicas go by default: every GPU, else every logical CPU."""
        return self.gpus or self.cpus


def build_devices(cfg) -> Devices:
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if cfg.gpus is not None:
        bad = [i for i in cfg.gpus if not 0 <= i < len(gpus)]
        if bad:
            raise ConfigError(f"devices.gpus={list(cfg.gpus)} names GPU {bad[0]}, but this machine has {len(gpus)} GPU(s) (valid indices: {list(range(len(gpus)))}).")
        gpus = [gpus[i] for i in cfg.gpus]
        tf.config.set_visible_devices(gpus, "GPU")
    if cfg.memory_growth:
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
    if cfg.logical_cpus > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        current = tf.config.get_logical_device_configuration(cpu)
        if current is None or len(current) != cfg.logical_cpus:  # already so when called again in one process
            tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * cfg.logical_cpus)
    # Names from the configuration, not list_logical_devices(): that would initialise TensorFlow's context,
    # and MultiWorkerMirroredStrategy must configure collective ops before it is initialised.
    return Devices(
        gpus=[f"/device:GPU:{i}" for i in range(len(gpus))],
        cpus=[f"/device:CPU:{i}" for i in range(cfg.logical_cpus)],
    )
