"""strategy=auto -> the strategy that fits what is there, chosen before TensorFlow is imported.

Rules, first match wins:
1. cluster=tpu: tpu (the TPU named by cluster.tpu; it fails fast if none answers).
2. a cluster of processes (localhost, ray, tf_config, slurm): parameter_server when it has ps tasks, else
   multi_worker_mirrored (TF_CONFIG, SLURM_NTASKS or cluster.workers say how many workers).
3. cross_device_ops set to one that only some strategies take: the first of them (nccl -> mirrored, ring ->
   multi_worker_mirrored).
4. several devices here: mirrored over 2+ visible GPUs (counted from the NVIDIA driver, CUDA_VISIBLE_DEVICES and
   devices.gpus) or devices.logical_cpus > 1; one_device on one GPU.
5. else default.

`validate` replaces the `auto` node by the chosen strategy's (with that strategy's defaults), so everything after
it, cluster tasks included, sees a concrete strategy; `--cfg job` shows `auto` because it stops before. `validate`
returns the `Choice`, and the entry point carries it along: its line is logged (once the config passed its checks),
its `tags` go on the MLflow run (`strategy.auto`), and at start `Choice.check_gpus` compares TensorFlow's own count
of GPUs with the one the choice was made from.
"""

import json
import logging
import os
from dataclasses import dataclass

from omegaconf import OmegaConf

from runner.builders.strategy import StrategyConfig
from runner.config import registry

log = logging.getLogger("runner")
NVIDIA_GPUS = "/proc/driver/nvidia/gpus"  # one entry per GPU the driver knows


@dataclass
class AutoConfig(StrategyConfig):
    pass  # a chosen strategy's own keys need it by name: strategy=mirrored strategy.devices=[...]


@dataclass(frozen=True)
class Choice:
    name: str
    reason: str
    gpus: int  # GPUs the choice counted (compared with TensorFlow's count at start)

    @property
    def line(self) -> str:
        return f"strategy=auto chose {self.name}: {self.reason}"

    @property
    def tags(self) -> dict[str, str]:
        return {"strategy.auto": f"{self.name}: {self.reason}"}

    def check_gpus(self, gpus_seen: int) -> None:
        """TensorFlow's GPU count against the one the choice was made from (a driver listing can differ from CUDA's)."""
        if self.name in ("default", "one_device", "mirrored") and gpus_seen != self.gpus:
            log.warning(
                "strategy=auto counted %d GPU(s) before start, TensorFlow sees %d: it still runs %s. Name the strategy "
                "(strategy=mirrored, one_device or default) to choose yourself.",
                self.gpus,
                gpus_seen,
                self.name,
            )


def count_gpus(cfg, environ=os.environ) -> int:
    """GPUs TensorFlow will see, without importing it: the driver's, narrowed by CUDA_VISIBLE_DEVICES and devices.gpus."""
    try:
        found = len(os.listdir(NVIDIA_GPUS))
    except OSError:
        return 0
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        found = min(found, len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"]))
    if cfg.devices.gpus is not None:
        found = len([i for i in cfg.devices.gpus if 0 <= i < found])
    return found


def _tf_config_jobs(environ) -> dict:
    try:
        cluster = json.loads(environ.get("TF_CONFIG") or "{}").get("cluster", {})
        return {job: len(addresses) for job, addresses in cluster.items()}
    except (ValueError, AttributeError, TypeError):
        return {}  # malformed: the pre-flight probe names it


def _cluster_tasks(cluster, environ) -> tuple[int, int, str]:
    """(ps tasks, training workers, where that was read) of a cluster of processes."""
    if cluster.name in ("tf_config", "kubernetes"):
        jobs = _tf_config_jobs(environ)
        return jobs.get("ps", 0), jobs.get("worker", 0) + jobs.get("chief", 0), "TF_CONFIG"
    if cluster.name == "slurm":
        tasks = int(environ.get("SLURM_STEP_NUM_TASKS") or environ.get("SLURM_NTASKS") or 1)
        return cluster.ps, tasks - cluster.ps, "SLURM_NTASKS"
    return cluster.get("ps", 0), cluster.get("workers", 1), f"cluster.workers={cluster.get('workers', 1)}"


def choose(cfg, environ=os.environ) -> Choice:
    cluster = cfg.cluster
    if cluster.name == "tpu":
        return Choice("tpu", f"cluster=tpu names a TPU (cluster.tpu={cluster.tpu})", 0)
    if registry.get("cluster", cluster.name).caps.processes:
        ps, workers, source = _cluster_tasks(cluster, environ)
        if ps:
            return Choice("parameter_server", f"cluster={cluster.name} has {ps} ps task(s)", 0)
        return Choice("multi_worker_mirrored", f"cluster={cluster.name}: {max(workers, 1)} worker(s) ({source})", 0)
    gpus = count_gpus(cfg, environ)
    ops = cfg.cross_device_ops.name
    if ops != "auto":
        takers = [o.name for o in registry.options("strategy").values() if o.name != "auto" and ops in o.caps.cross_device_ops]
        if takers:
            return Choice(takers[0], f"cross_device_ops={ops} is {takers[0]}'s", gpus)
    if gpus > 1:
        return Choice("mirrored", f"{gpus} GPUs are visible", gpus)
    if cfg.devices.logical_cpus > 1:
        return Choice("mirrored", f"devices.logical_cpus={cfg.devices.logical_cpus} makes that many CPU devices", gpus)
    if gpus == 1:
        return Choice("one_device", "one GPU is visible", gpus)
    return Choice("default", "one process, no GPU and devices.logical_cpus=1", gpus)


def resolve(cfg, environ=os.environ) -> Choice | None:
    """Replace strategy=auto in `cfg` by the chosen strategy; the choice, or None when the config names one."""
    if cfg.strategy.name != "auto":
        return None
    chosen = choose(cfg, environ)
    cfg.strategy = OmegaConf.structured(registry.get("strategy", chosen.name).node())
    return chosen


registry.register(
    "strategy",
    "auto",
    schema=AutoConfig,
    help="one of the above, picked from the cluster, the GPUs and devices.logical_cpus (the default; logged, and tagged "
    "strategy.auto)",
)  # no capabilities of its own: validate replaces it by the chosen strategy before any check reads them
