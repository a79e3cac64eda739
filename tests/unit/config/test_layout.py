"""runner/config/layout.py, in-process: the one rule for task roles and for where a run's checkpoints go."""

import pytest
from omegaconf import OmegaConf

from runner.config import layout


@pytest.mark.parametrize(
    "strategy,task_type,role",
    [
        ("multi_worker_mirrored", None, "trainer"),
        ("multi_worker_mirrored", "worker", "trainer"),
        ("multi_worker_mirrored", "chief", "trainer"),
        ("parameter_server", "chief", "trainer"),
        ("parameter_server", "worker", "server"),
        ("parameter_server", "ps", "server"),
        ("multi_worker_mirrored", "ps", "server"),
        ("parameter_server", "evaluator", "evaluator"),
        ("multi_worker_mirrored", "evaluator", "evaluator"),
    ],
)
def test_task_roles(strategy, task_type, role):
    assert layout.task_role(strategy, task_type) == role


def test_the_checkpoint_directory_is_decided_once():
    cfg = OmegaConf.create({"checkpoint": {"dir": None}, "output_dir": "/runs/a"})
    assert layout.checkpoint_dir(cfg) == "/runs/a/checkpoints"
    assert layout.checkpoint_dir(cfg, "/runs/b") == "/runs/b/checkpoints"
    cfg.checkpoint.dir = "/elsewhere"
    assert layout.checkpoint_dir(cfg, "/runs/b") == "/elsewhere"
    assert layout.task_dir("/runs/a", "worker", 1) == "/runs/a/worker-1"
