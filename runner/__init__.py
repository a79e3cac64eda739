"""Declarative experiment runner for TensorFlow distributed training (Hydra + tf.distribute + MLflow)."""

import time

__version__ = "0.1.0"
STARTED = time.perf_counter()  # process start, near enough (a sweep's spare: its job's start): time/to_first_step_sec
