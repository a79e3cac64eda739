"""cluster -> a cluster resolver and this process's task in it.

`local`: one process. `tf_config`: TFConfigClusterResolver (Kubernetes and other schedulers set TF_CONFIG).
`slurm`: SlurmClusterResolver. `tpu`: TPUClusterResolver, connected and initialised here, at program start.
(`localhost` never gets here: runner/launcher.py starts tf_config tasks instead.)
"""

import os
import threading
from dataclasses import dataclass
from typing import Any, Optional

from runner.errors import ConfigError


@dataclass
class Cluster:
    name: str
    resolver: Optional[Any] = None  # a tf.distribute.cluster_resolver.ClusterResolver
    task_type: Optional[str] = None
    task_id: int = 0

    @property
    def jobs(self) -> dict:
        return {} if self.resolver is None else self.resolver.cluster_spec().as_dict()

    @property
    def task(self) -> str:
        return f"{self.task_type}:{self.task_id}" if self.task_type else "local"

    @property
    def num_workers(self) -> int:
        """Processes that run training steps: the workers, plus the chief unless it only coordinates (ps)."""
        jobs = self.jobs
        chief = 0 if "ps" in jobs else len(jobs.get("chief", []))
        return max(1, len(jobs.get("worker", [])) + chief)

    @property
    def is_chief(self) -> bool:
        """The task that logs and saves: the chief, or worker 0 when there is no chief."""
        if self.task_type is None:
            return True
        if "chief" in self.jobs:
            return self.task_type == "chief"
        return self.task_type == "worker" and self.task_id == 0


def _tf_config(cfg) -> Cluster:
    import tensorflow as tf

    # TF_CONFIG was checked (JSON, task, index, free port) by runner/validate.py before TensorFlow was imported.
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    return Cluster("tf_config", resolver, resolver.task_type, int(resolver.task_id))


def _slurm(cfg) -> Cluster:
    import tensorflow as tf

    if "SLURM_PROCID" not in os.environ:
        raise ConfigError("cluster=slurm must run inside a Slurm allocation (srun or sbatch): SLURM_PROCID is not set.")
    ntasks = int(os.environ.get("SLURM_STEP_NUM_TASKS") or os.environ.get("SLURM_NTASKS", "1"))
    if cfg.ps:
        jobs = {"ps": cfg.ps, "chief": 1, "worker": ntasks - cfg.ps - 1}
    else:
        jobs = {"worker": ntasks}
    # TF's own default asks nvidia-smi, which a CPU node lacks: count the GPUs TensorFlow sees instead.
    gpus = cfg.gpus_per_node if cfg.gpus_per_node is not None else len(tf.config.list_physical_devices("GPU"))
    if gpus:
        gpu_args = {"gpus_per_node": gpus, "auto_set_gpu": True}
    else:
        # TF 2.21's resolver assigns tasks by stepping through GPU ids: with 0 GPUs it gets range(..., step 0)
        # and fails. Give it ids it can step through, and set no CUDA_VISIBLE_DEVICES from them.
        gpu_args = {"gpus_per_node": 1024, "gpus_per_task": 1, "auto_set_gpu": False}
    resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(jobs=jobs, port_base=cfg.port_base, **gpu_args)
    resolver.cluster_spec()  # assigns task_type and task_id
    return Cluster("slurm", resolver, resolver.task_type, int(resolver.task_id))


def _tpu(cfg) -> Cluster:
    import tensorflow as tf

    result = {}

    def connect():  # in a thread: a grpc address with nothing behind it blocks for minutes
        try:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=cfg.tpu, zone=cfg.zone, project=cfg.project)
            tf.config.experimental_connect_to_cluster(resolver)
            tf.tpu.experimental.initialize_tpu_system(resolver)
            result["resolver"] = resolver
        except Exception as err:  # NotFoundError, ValueError, URLError...
            result["error"] = err

    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(cfg.connect_timeout_sec)
    if "resolver" not in result:
        why = (f"{type(result['error']).__name__}: {str(result['error']).strip().splitlines()[0]}" if "error" in result
               else f"no answer within cluster.connect_timeout_sec={cfg.connect_timeout_sec}")
        raise ConfigError(
            f"cluster=tpu could not reach a TPU at cluster.tpu={cfg.tpu!r} ({why}). Point cluster.tpu at a TPU name "
            "or grpc://host:port address; without a TPU use strategy=mirrored or one_device with cluster=local."
        )
    return Cluster("tpu", result["resolver"])


def build_cluster(cfg) -> Cluster:
    builders = {"local": lambda c: Cluster("local"), "tf_config": _tf_config, "slurm": _slurm, "tpu": _tpu}
    if cfg.name not in builders:
        raise ConfigError(f"cluster={cfg.name} cannot be built inside a task; choose one of: {', '.join(builders)}.")
    return builders[cfg.name](cfg)
