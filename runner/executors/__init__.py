"""Executors: given a strategy, a model built in its scope, data and a reporter (a `Job`), train and evaluate.

`run_fit` is Keras' Model.fit (tf_keras', or Keras 3's own for a Keras 3 model: `keras3_model`). `custom_loop` is
the guide's loop: `loop.train` owns its epochs, logging, checkpoints and stops, and an inner loop runs the steps,
in this process (`run_custom_loop`) or, under parameter_server, scheduled by the coordinator (`run_ps_loop`).
Executors are registered once, in `runner.builders.executor`; a new one is a module here and an option there.

Imports: runner.errors, runner.tf_private, runner.config, runner.builders (losses and metrics, built where the model
is), runner.sources, runner.tracking (the run a Job reports to), runner.control (stops and signals)
TensorFlow: yes (imported when training starts: nothing imports this package on a config-only path)
mlflow: never (a Job reports through `runner.tracking`)
"""
