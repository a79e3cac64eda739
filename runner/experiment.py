"""One experiment, in the order data flows: devices -> cluster -> strategy -> data -> model -> executor -> tracking."""

import logging
import os
import platform

from omegaconf import DictConfig

from runner import datasets
from runner.env import native_stderr_captured
from runner.tracking import mlflow_run

log = logging.getLogger("runner")


def _hydra_overrides():
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def _import_tensorflow(devices_cfg):
    """Import TensorFlow and lay out devices, with its C++ start-up chatter hidden."""
    with native_stderr_captured():
        import tensorflow as tf

        from runner.builders.devices import build_devices

        tf.get_logger().setLevel(logging.ERROR)
        import absl.logging

        absl.logging.set_verbosity(absl.logging.ERROR)
        return tf, build_devices(devices_cfg)


def run_experiment(cfg: DictConfig) -> dict:
    overrides = _hydra_overrides()
    with mlflow_run(cfg, overrides) as run:
        tf, devices = _import_tensorflow(cfg.devices)
        import tf_keras

        from runner.builders.cluster import build_cluster
        from runner.builders.data import build_data
        from runner.builders.model import build_model, build_optimizer, loss_name
        from runner.builders.strategy import build_strategy
        from runner.executors import Job, get_executor

        cluster = build_cluster(cfg.cluster)
        strategy = build_strategy(cfg.strategy, cfg.cross_device_ops, devices, cluster)
        replicas = strategy.num_replicas_in_sync
        log.info("%s with %d replica(s) on %s", type(strategy).__name__, replicas, ", ".join(devices.compute))
        run.set_tags({
            "strategy": type(strategy).__name__,
            "num_replicas_in_sync": replicas,
            "devices": ",".join(devices.compute),
            "tensorflow_version": tf.__version__,
            "tf_keras_version": tf_keras.__version__,
            "python_version": platform.python_version(),
        })
        arrays = datasets.load(cfg.data)
        data = build_data(cfg.data, arrays, cfg.train, replicas)
        tf_keras.utils.set_random_seed(cfg.train.seed)  # same initial weights whatever the strategy
        with strategy.scope():
            model = build_model(cfg.model, arrays.input_shape, arrays.num_outputs)
            optimizer = build_optimizer(cfg.train.optimizer)
        loss = loss_name(cfg.train, arrays.task)
        job = Job(strategy, model, optimizer, loss, data, cfg.train, cfg.executor, run)
        result = get_executor(cfg.executor.name)(job)
        if cfg.save_model and cluster.is_chief and cfg.output_dir:
            path = os.path.join(cfg.output_dir, "model.keras")
            model.save(path)
            run.log_artifact(path, "model")
            log.info("model saved to %s", path)
        log.info("done: %d steps, final loss %.4f, %s", result.steps, result.final_loss,
                 ", ".join(f"{k}={v:.4f}" for k, v in result.eval.items()))
        return {"run_id": run.run_id, "final_loss": result.final_loss, **result.eval}
