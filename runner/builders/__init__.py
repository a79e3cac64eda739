"""Builders: one per config group, each a small function from its config node to real TensorFlow objects.

devices, cluster, strategy (and strategy_auto, chosen before TensorFlow), cross_device_ops, model (and keras_flavor:
which Keras a model is written in, and where a Keras 3 one trains), optimizer, executor, and data (a sub-package: the
tf.data pipelines, one module per streamed source). Each option registers its schema, builder
and capabilities once, with `registry.option`, in its group's module here. Config-only paths import these modules
to register the options, so TensorFlow is imported inside the builders, never at a module's top.

Imports: runner.errors, runner.tf_private, runner.config, runner.sources, runner.preflight (network probes a cluster
builder reuses), runner.executors (the executor builder returns an executor's run function)
TensorFlow: in functions; at module level in runner.builders.lr_schedule (the schedule tf_keras lacks, looked up there by a saved
model; only the optimizer's builder imports it)
mlflow: never
"""
