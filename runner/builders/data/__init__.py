"""data -> tf.data pipelines of global batches for the strategy, from a source `runner.sources` has checked.

`sources` registers every data option (schema, loader, capabilities); `pipeline` builds the in-memory sources'
pipelines and the shape every source's pipeline shares (`Data`, `worker_shard`, `finish`); `tfrecord`, `tfds` and
`image_folder` stream their files. Rules: those of runner.builders.
"""
