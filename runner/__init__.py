"""Declarative experiment runner for TensorFlow distributed training (Hydra + tf.distribute + MLflow)."""

__version__ = "0.1.0"
