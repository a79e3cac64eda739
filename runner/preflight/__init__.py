"""What the config needs from this machine and its network, found before TensorFlow or MLflow starts.

`needs.preflight` runs every selected option's probe, then memory, directories, ports, TF_CONFIG, resume=, model
weights and the MLflow store (its file: `sqlite_store`; its server). The probes that know nothing of the config are
`probes`.

Imports: runner.errors, runner.config, runner.control, runner.sources (the data's size)
TensorFlow: never
mlflow: never
"""
