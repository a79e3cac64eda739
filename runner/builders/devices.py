"""devices -> visible GPUs and logical CPUs. Must run before TensorFlow initialises its devices. Also: devices a
config names must exist."""

from dataclasses import dataclass

from runner.errors import ConfigError


@dataclass
class Devices:
    gpus: list[str]  # logical GPU names, e.g. /device:GPU:0
    cpus: list[str]  # logical CPU names, e.g. /device:CPU:0 ... /device:CPU:3

    @property
    def compute(self) -> list[str]:
        """Where replicas go by default: every GPU, else every logical CPU."""
        return self.gpus or self.cpus


def build_devices(cfg) -> Devices:
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if cfg.gpus is not None:
        bad = [i for i in cfg.gpus if not 0 <= i < len(gpus)]
        if bad:
            raise ConfigError(
                f"devices.gpus={list(cfg.gpus)} names GPU {bad[0]}, but this machine has {len(gpus)} GPU(s) "
                f"(valid indices: {list(range(len(gpus)))})."
            )
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


def check_devices_exist(named) -> None:
    """A device that does not exist makes a strategy hang at its first step: refuse it, naming the ones that exist.

    `named`: (config key, device name) pairs, from the strategy's `devices` capability (runner.builders.strategy).
    Only strategies that name devices declare it: list_logical_devices() initialises TensorFlow's context, which
    multi_worker_mirrored must configure first.
    """
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
                f"{listing}{hint}. Name one of them, or leave {key} null (the default)."
            )
