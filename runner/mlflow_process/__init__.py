"""The MLflow side: the only package, with the tools that read runs back, where mlflow is imported.

`python -m runner.mlflow_process PARENT_PID` is the one process per training process that owns MLflow (`process`:
the calls it answers over a pipe); its larger ops (`ops`: datasets, the logged model, system metrics), the
delivery of what the training process kept on disk (`delivery`), the store opened safely (`store`) and the logged
model's code (`model`, copied into each MLflow model). runner.deliver, runner.dashboard and runner.sweeps use the
store and the delivery too.

Imports: runner.errors, runner.config, runner.control, runner.tracking (file formats and the run's fields),
runner.preflight (the SQLite store's file checks)
TensorFlow: in functions (the logged model loads with the Keras that saved it)
mlflow: yes
"""
