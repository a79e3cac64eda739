"""cluster -> where this process stands in the cluster. `local`: one process, no TF_CONFIG."""

from dataclasses import dataclass
from typing import Any, Optional


@dataclass
class Cluster:
    name: str
    resolver: Optional[Any] = None  # a tf.distribute.cluster_resolver.ClusterResolver, when there is a cluster
    task_type: Optional[str] = None
    task_id: int = 0

    @property
    def is_chief(self) -> bool:
        """The task that logs and saves: the chief, or worker 0 when there is no chief."""
        if self.resolver is None or self.task_type is None:
            return True
        if "chief" in self.resolver.cluster_spec().jobs:
            return self.task_type == "chief"
        return self.task_type == "worker" and self.task_id == 0


def build_cluster(cfg) -> Cluster:
    return Cluster(name=cfg.name)
