"""Data sources before TensorFlow: what a data config names, found and checked with NumPy and plain Python.

The in-memory sources' arrays (`in_memory`), the files, features, classes and records of data=tfrecord, tfds and
image_folder (`tfrecord` with its file format in `tfrecord_format`, `tfds_prepared` with `tfds_splits`,
`image_folder`), checks of arrays, labels and memory (`checks`), what MLflow's dataset view shows (`description`),
and a damaged record told from TensorFlow's error (`faults`). The tf.data pipelines are `runner.builders.data`.

Imports: runner.errors, runner.config
TensorFlow: in functions (tensorflow_datasets reads a prepared dataset once training starts)
mlflow: never
"""
