"""strategy=auto: which strategy it picks from the cluster, the GPUs and the logical CPUs, before TensorFlow (the
rules are in runner/builders/strategy_auto.py); and that validate hands every later step the chosen strategy.
README's `python -m runner devices.logical_cpus=4` runs it end to end (tests/e2e/test_readme.py checks the tag)."""

import json

import pytest

from runner.builders import strategy_auto
from runner.config import schema
from runner.config.validate import check_config

from helpers import composed, runner_imports

schema.register()


@pytest.fixture
def gpus(tmp_path, monkeypatch):
    """gpus(n): the NVIDIA driver lists n GPUs (an empty directory per GPU, as /proc/driver/nvidia/gpus has)."""

    def make(n: int):
        d = tmp_path / f"nvidia-{n}"
        d.mkdir(exist_ok=True)
        for i in range(n):
            (d / f"0000:0{i}:00.0").mkdir()
        monkeypatch.setattr(strategy_auto, "NVIDIA_GPUS", str(d))

    make(0)
    return make


def tf_config(workers: int, ps: int = 0, chief: int = 0) -> str:
    cluster = {"worker": [f"h{i}:1" for i in range(workers)]}
    if ps:
        cluster["ps"] = [f"p{i}:1" for i in range(ps)]
    if chief:
        cluster["chief"] = ["c:1"]
    return json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}})


CASES = [
    # (overrides, environment, GPUs the driver lists, chosen, words of the reason)
    ([], {}, 0, "default", "no GPU"),
    (["devices.logical_cpus=4"], {}, 0, "mirrored", "devices.logical_cpus=4"),
    ([], {}, 1, "one_device", "one GPU"),
    ([], {}, 4, "mirrored", "4 GPUs"),
    ([], {"CUDA_VISIBLE_DEVICES": "2"}, 4, "one_device", "one GPU"),
    ([], {"CUDA_VISIBLE_DEVICES": "-1"}, 4, "default", "no GPU"),
    (["devices.gpus=[0,1]"], {}, 8, "mirrored", "2 GPUs"),
    (["devices.gpus=[0]"], {}, 8, "one_device", "one GPU"),
    (["cross_device_ops=hierarchical_copy"], {}, 0, "mirrored", "cross_device_ops=hierarchical_copy"),
    (["cross_device_ops=ring"], {}, 0, "multi_worker_mirrored", "cross_device_ops=ring"),
    (["cluster=localhost"], {}, 0, "multi_worker_mirrored", "2 worker(s)"),
    (["cluster=localhost", "cluster.ps=1"], {}, 0, "parameter_server", "1 ps task"),
    (["cluster=tf_config"], {"TF_CONFIG": tf_config(3)}, 0, "multi_worker_mirrored", "3 worker(s) (TF_CONFIG)"),
    (["cluster=tf_config"], {"TF_CONFIG": tf_config(2, ps=2, chief=1)}, 0, "parameter_server", "2 ps task"),
    (["cluster=tf_config"], {"TF_CONFIG": "{not json"}, 0, "multi_worker_mirrored", "1 worker(s)"),  # the probe names it
    (["cluster=slurm"], {"SLURM_NTASKS": "4"}, 0, "multi_worker_mirrored", "4 worker(s) (SLURM_NTASKS)"),
    (["cluster=slurm", "cluster.ps=1"], {"SLURM_NTASKS": "4"}, 0, "parameter_server", "1 ps task"),
    (["cluster=tpu", "cluster.tpu=grpc://10.0.0.2:8470"], {}, 8, "tpu", "cluster.tpu=grpc://10.0.0.2:8470"),
]


@pytest.mark.parametrize("overrides,environ,driver_gpus,chosen,reason", CASES)
def test_auto_picks_from_what_is_there(overrides, environ, driver_gpus, chosen, reason, gpus):
    gpus(driver_gpus)
    choice = strategy_auto.choose(composed(*overrides), environ)
    assert choice.name == chosen and reason in choice.reason, choice


def test_validate_replaces_auto_by_the_chosen_strategy_with_its_own_keys(gpus, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    cfg = composed("devices.logical_cpus=2")
    assert cfg.strategy.name == "auto" and "devices" not in cfg.strategy
    chosen = strategy_auto.resolve(cfg)
    assert cfg.strategy.name == "mirrored" and cfg.strategy.devices is None  # MirroredConfig's defaults
    check_config(cfg)  # every later check sees mirrored
    assert chosen.tags == {"strategy.auto": "mirrored: devices.logical_cpus=2 makes that many CPU devices"}
    named = composed("strategy=one_device", "devices.logical_cpus=2")
    assert strategy_auto.resolve(named) is None and named.strategy.name == "one_device"


def test_a_chosen_strategys_own_keys_need_it_by_name():
    from hydra.errors import HydraException

    with pytest.raises(HydraException, match="strategy.devices"):
        composed("strategy.devices=[/cpu:0]")  # auto has no keys: name the strategy to set its own


@pytest.mark.slow  # starts `python -m runner --cfg job`
def test_cfg_job_shows_auto_without_tensorflow():
    done, loaded = runner_imports(["--cfg", "job", "devices.logical_cpus=4"])
    assert "strategy:\n  name: auto" in done.stdout and loaded == []
