"""The config and whether it is valid, without touching the machine or importing TensorFlow.

The typed schema (Hydra's ConfigStore), the registry of each group's options, the pure checks (`validate`), the
--help text, the run directory's layout and each task's role (`layout`), secrets masked in what is shown or logged
(`redact`), and every private Hydra name the runner touches (`hydra_private`).

Imports: runner.errors, runner.builders (the options' schemas live beside their builders, imported to register
them), runner.models (the Keras applications' names), runner.preflight (`validate` ends with the machine's probes),
runner.sweeps.search_config (the node of hydra/sweeper=optuna, registered with the schema)
TensorFlow: never
mlflow: never
"""
