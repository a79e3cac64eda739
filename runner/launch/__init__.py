"""Starting and supervising the tasks of a cluster: cluster=localhost starts each as an OS process on 127.0.0.1
(`localhost`), cluster=ray as a Ray actor (`ray_cluster`, `ray_actor`), cluster=slurm's elastic job as job steps
(`slurm_steps`); cluster.elastic's restarts at another size (`elastic`), under cluster=tf_config through an agent in
each pod (`pods`, over `rendezvous`); a lost peer told from TensorFlow's error (`peers`); what a server task does
(`serving`). A task itself trains through `runner.experiment`.

Imports: runner.errors, runner.config, runner.control, runner.tracking (the launcher's MLflow run)
TensorFlow: in functions
mlflow: never
"""
