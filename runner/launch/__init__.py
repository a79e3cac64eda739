"""Starting and supervising the tasks of a cluster: cluster=localhost starts each as an OS process on 127.0.0.1
(`localhost`), cluster=ray as a Ray actor (`ray_cluster`, `ray_actor`); a lost peer told from TensorFlow's error
(`peers`); what a server task does (`serving`). A task itself trains through `runner.experiment`.

Imports: runner.errors, runner.config, runner.control, runner.tracking (the launcher's MLflow run)
TensorFlow: in functions
mlflow: never
"""
