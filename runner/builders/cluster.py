"""cluster -> a cluster resolver and this process's task in it. Each option registers its schema, capabilities and
builder here (runner.config.registry); its YAML is conf/cluster/<name>.yaml.

`local`: one process. `tf_config`: TFConfigClusterResolver (Kubernetes and other schedulers set TF_CONFIG).
`slurm`: SlurmClusterResolver. `tpu`: TPUClusterResolver, connected and initialised here, at program start.
(`localhost` and `ray` are never built in a task: runner.launch.localhost and runner.launch.ray_cluster start tf_config
tasks instead.)
"""

import os
import threading
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from runner.config import layout
from runner.config.fields import ranged
from runner.config.registry import describe, get, option, options, register
from runner.errors import ConfigError
from runner.preflight.probes import connect_problem

describe("cluster", "where the tasks run")


@dataclass
class ClusterConfig:
    name: str = MISSING
    start_timeout_sec: float = ranged(120.0, gt=0)  # a task still waiting for its peers after this stops with an error


@dataclass
class ElasticConfig:
    """Elastic multi-worker training (runner.launch.elastic): a lost worker costs the steps since the last checkpoint,
    not the run. The launcher restarts the tasks that remain from that checkpoint, with the same global batch (under
    parameter_server: a lost parameter server restarts every task at the same size)."""

    # true: the job trains on through a lost worker, from the last checkpoint
    enabled: bool = False
    min_workers: int = ranged(1, ge=1)  # fewer left than this ends the job (exit 3), as a loss does without elasticity
    max_restarts: int = ranged(3, ge=0)  # the losses a job trains through; the next one ends it (exit 3)
    # a lost worker's slot is started again this long after the loss, and the job grows back to its full size at the
    # first checkpoint the smaller job writes after that
    rejoin_after_sec: float | None = ranged(10.0, ge=0, null="the job stays at its smaller size")


@dataclass
class TFConfigClusterConfig(ClusterConfig):
    # parameter_server: ps and worker tasks exit 0 once the chief has ended (its port refuses connections), as they
    # do under Slurm; false: they serve until they are stopped (a Kubernetes job that ends when its chief pod does)
    exit_with_chief: bool = False
    # train through a lost worker: every pod's runner is an agent that starts its trainer, and worker:0's restarts
    # the job on the pods in touch (runner.launch.pods)
    elastic: ElasticConfig = field(default_factory=ElasticConfig)
    # elastic: an agent silent this long is out of touch (a link down); heartbeats come every 0.5 s
    agent_timeout_sec: float = ranged(5.0, ge=2, why="agents beat every 0.5 s: shorter takes a busy pod for a lost one")
    failure_grace_sec: float = ranged(5.0, ge=0)  # elastic: after a trainer dies, how long the others get to exit
    stop_grace_sec: float = ranged(60.0, ge=0)  # elastic: on Ctrl-C or SIGTERM, how long the trainers get to checkpoint


@dataclass
class LocalhostClusterConfig(ClusterConfig):
    # worker processes the launcher starts (Ray: as actors)
    workers: int = ranged(2, ge=1)
    ps: int = ranged(0, ge=0)  # parameter_server: number of ps tasks (1 or more)
    chief: bool = False  # parameter_server always gets a chief: the coordinator
    evaluator: bool = False  # a side-car evaluator task that evaluates each checkpoint as it appears
    failure_grace_sec: float = ranged(5.0, ge=0)  # after a task dies, how long the others get to exit before they are killed
    stop_grace_sec: float = ranged(60.0, ge=0)  # on Ctrl-C or SIGTERM: how long trainers get to write their checkpoint
    restart_workers: int = ranged(3, ge=0)  # parameter_server: restart a dead worker or ps task up to this many times
    elastic: ElasticConfig = field(default_factory=ElasticConfig)  # train through a lost worker (or parameter server)


@dataclass
class RayClusterConfig(LocalhostClusterConfig):
    address: str | None = None  # a running Ray cluster: "auto", "<head ip>:6379"; None: start a local head for this run
    placement: str = "PACK"  # the placement group's strategy: PACK, SPREAD, STRICT_PACK or STRICT_SPREAD (one node each)
    cpus_per_task: float = ranged(1.0, ge=0)  # Ray CPUs each task's bundle reserves
    gpus_per_task: float = ranged(0.0, ge=0)  # Ray GPUs each task's bundle reserves (and CUDA_VISIBLE_DEVICES it gets)


@dataclass
class SlurmClusterConfig(ClusterConfig):
    start_timeout_sec: float = ranged(300.0, gt=0)  # 300 s under Slurm (the other clusters: 120 s)
    # the first TCP port of the tasks' addresses: each task of a node takes the next one
    port_base: int = ranged(8888, ge=1, le=65535, why="it is a TCP port")
    ps: int = ranged(0, ge=0)  # with parameter_server: the first `ps` Slurm tasks become ps, the next one the chief
    gpus_per_node: int | None = ranged(None, ge=0, null="the GPUs TensorFlow sees")  # None: the GPUs TensorFlow sees on this node
    # train through a lost worker: run the runner once in the allocation, and it starts each worker as a job step
    # (runner.launch.slurm_steps); the job's size is the allocation's task count
    elastic: ElasticConfig = field(default_factory=ElasticConfig)
    failure_grace_sec: float = ranged(5.0, ge=0)  # elastic: after a step dies, how long the others get to exit
    stop_grace_sec: float = ranged(60.0, ge=0)  # elastic: on Ctrl-C or SIGTERM, how long the steps get to checkpoint


@dataclass
class TPUClusterConfig(ClusterConfig):
    tpu: str = "local"  # TPU name, grpc://host:port address, or "local" on a TPU VM
    # the TPU's Google Cloud zone; null: from the TPU VM's metadata
    zone: str | None = None
    # the TPU's Google Cloud project; null: from the TPU VM's metadata
    project: str | None = None
    connect_timeout_sec: float = ranged(30.0, gt=0)  # an address with nothing behind it hangs: give up after this


@dataclass
class Cluster:
    name: str
    resolver: Any | None = None  # a tf.distribute.cluster_resolver.ClusterResolver
    task_type: str | None = None
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
    def worker_index(self) -> int:
        """This task's place among the training processes (the chief, if any, first: MultiWorkerMirroredStrategy's
        order); 0 for a task that trains nothing."""
        if self.task_type not in ("chief", "worker"):
            return 0
        return self.task_id + (1 if self.task_type == "worker" and "chief" in self.jobs else 0)

    @property
    def is_chief(self) -> bool:
        """The task that logs and saves (runner.config.layout)."""
        return layout.is_chief(self.task_type, self.task_id, self.jobs)


@option("cluster", "local", schema=ClusterConfig, help="this process")
def _local(cfg) -> Cluster:
    return Cluster("local")


def _localhost_shape(cfg):
    c = cfg.cluster
    if cfg.strategy.name == "parameter_server" and c.ps < 1:
        raise ConfigError(f"strategy=parameter_server needs cluster.ps=1 or more (got {c.ps}).")
    if cfg.strategy.name == "multi_worker_mirrored" and c.ps:
        raise ConfigError(f"cluster.ps={c.ps}: ps tasks only exist with strategy=parameter_server; use cluster.ps=0.")


register(
    "cluster",
    "localhost",
    schema=LocalhostClusterConfig,
    help="tasks started here on 127.0.0.1",
    processes=True,
    check=_localhost_shape,
    launcher="runner.launch.localhost",
)

PLACEMENTS = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


def _ray_shape(cfg):
    _localhost_shape(cfg)
    if cfg.cluster.placement not in PLACEMENTS:
        raise ConfigError(
            f"cluster.placement={cfg.cluster.placement!r} is not a Ray placement strategy; use one of: {', '.join(PLACEMENTS)}."
        )


def _ray_head_answers(cfg):
    """A cluster.address of host:port must accept a connection: ray.init() waits minutes on one that does not."""
    host, _, port = (cfg.cluster.address or "").removeprefix("ray://").rpartition(":")
    problem = connect_problem(host, int(port)) if host and port.isdigit() else None  # None, "auto": Ray says at once
    if problem:
        raise ConfigError(
            f"cluster.address={cfg.cluster.address}: nothing answers there ({problem}). Start the head with `ray start "
            "--head` and pass the address it prints, or leave cluster.address unset for a local head."
        )


register(
    "cluster",
    "ray",
    schema=RayClusterConfig,
    help="one Ray actor per task on a Ray cluster (cluster.address; default: a local head for this run)",
    processes=True,
    check=_ray_shape,
    probe=_ray_head_answers,
    launcher="runner.launch.ray_cluster",
)


@option(
    "cluster",
    "tf_config",
    schema=TFConfigClusterConfig,
    help="TFConfigClusterResolver",
    processes=True,
    reads_tf_config=True,
    elastic_launcher="runner.launch.pods",
)
def _tf_config(cfg) -> Cluster:
    import tensorflow as tf

    # TF_CONFIG was checked (JSON, task, index, free port) by runner.preflight.needs before TensorFlow was imported.
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    return Cluster("tf_config", resolver, resolver.task_type, int(resolver.task_id))


@dataclass
class KubernetesClusterConfig(TFConfigClusterConfig):
    """TF_CONFIG derived in each pod (runner.config.kubernetes_pod); the manifests: python -m runner.kubernetes."""

    workers: int = ranged(2, ge=1)  # worker pods (the Indexed Job's completions, or the JobSet's worker pods)
    ps: int = ranged(0, ge=0)  # parameter server pods (strategy=parameter_server; a chief pod is added for it)
    port: int = ranged(2222, ge=1, le=65535)  # every task's gRPC port, as TFJob's operator gives it
    job_name: str | None = None  # the Job's or JobSet's name (null: from the pod: its host name, or JOBSET_NAME)
    service: str | None = None  # the headless Service, the pods' subdomain (null: named after the Job or JobSet)
    image: str | None = None  # manifests: the container image with this project installed (required there)
    namespace: str | None = None  # manifests: the namespace (null: kubectl's current one)
    volume: str | None = None  # manifests: a PersistentVolumeClaim every pod mounts at mount_path (runs, checkpoints)
    mount_path: str = "/runs"  # manifests: where the volume is mounted; the run's directory is <mount_path>/<job_name>
    cpu: str | None = None  # manifests: each pod's CPU request and limit, e.g. "4" or "3500m" (null: none set)
    memory: str | None = None  # manifests: each pod's memory request and limit, e.g. "8Gi" (null: none set)
    backoff_limit: int = ranged(3, ge=0)  # manifests: times each worker pod is replaced (JobSet: restarts in all) before failing


def _kubernetes(cfg) -> Cluster:
    found = _tf_config(cfg)  # TF_CONFIG derived by runner.app (runner.config.kubernetes_pod) before the checks
    return Cluster("kubernetes", found.resolver, found.task_type, found.task_id)


register(
    "cluster",
    "kubernetes",
    schema=KubernetesClusterConfig,
    help="TF_CONFIG derived from an Indexed Job's or a JobSet's pod; manifests: python -m runner.kubernetes",
    processes=True,
    reads_tf_config=True,
    elastic_launcher="runner.launch.pods",
    build=_kubernetes,
)


@option(
    "cluster",
    "slurm",
    schema=SlurmClusterConfig,
    help="SlurmClusterResolver",
    processes=True,
    elastic_launcher="runner.launch.slurm_steps",
)
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
    resolver_class = tf.distribute.cluster_resolver.SlurmClusterResolver
    if not gpus:

        class CPUSlurmClusterResolver(resolver_class):
            def num_accelerators(self, task_type=None, task_id=None, config_proto=None):
                return {}  # not the 1 GPU per task stepped through above: MWMS would place its replica on GPU:0

        resolver_class = CPUSlurmClusterResolver
    resolver = resolver_class(jobs=jobs, port_base=cfg.port_base, **gpu_args)
    resolver.cluster_spec()  # assigns task_type and task_id
    return Cluster("slurm", resolver, resolver.task_type, int(resolver.task_id))


def _only_tpu_strategy(cfg):
    if cfg.strategy.name != "tpu":
        raise ConfigError(f"cluster=tpu only goes with strategy=tpu, not strategy={cfg.strategy.name}.")


@option("cluster", "tpu", schema=TPUClusterConfig, help="TPUClusterResolver", check=_only_tpu_strategy)
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
        why = (
            f"{type(result['error']).__name__}: {str(result['error']).strip().splitlines()[0]}"
            if "error" in result
            else f"no answer within cluster.connect_timeout_sec={cfg.connect_timeout_sec}"
        )
        raise ConfigError(
            f"cluster=tpu could not reach a TPU at cluster.tpu={cfg.tpu!r} ({why}). Point cluster.tpu at a TPU name "
            "or grpc://host:port address; without a TPU use strategy=mirrored or one_device with cluster=local."
        )
    return Cluster("tpu", result["resolver"])


def build_cluster(cfg) -> Cluster:
    build = get("cluster", cfg.name).build
    if build is None:
        buildable = [o.name for o in options("cluster").values() if o.build is not None]
        raise ConfigError(f"cluster={cfg.name} cannot be built inside a task; choose one of: {', '.join(buildable)}.")
    return build(cfg)
