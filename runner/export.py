"""Write any data source the runner reads as TFRecord shards, for data=tfrecord:

    python -m runner.export data=npz data.path=/path/data.npz --out DIR --shards 8 [--eval-shards 2]

The data overrides are the runner's own (composed and checked the same way). DIR gets train-0000i-of-0000N.tfrecord
and eval-*.tfrecord, each record a tf.train.Example with `x` (float32, the example's shape), `y` (int64 class
index, or float32 targets for regression) and `id` (int64: the record's index in its split, which
data.record_ids_dir logs to show which records each worker read), plus tfrecord.json: the feature spec, label,
task, num_classes and each file's record count and size, which data=tfrecord reads instead of asking for them.
Records go to shards in contiguous blocks of near-equal size (file i holds ids [i*n/N, (i+1)*n/N)).

Also a function: export(cfg_data, out, shards, eval_shards) -> the spec written.
"""

import argparse
import json
import os
import sys

from runner.config import registry
from runner.config.compose import composed, reported
from runner.errors import ConfigError
from runner.sources.tfrecord import ID_FEATURE, SPEC_FILE


def _write_split(tf, out: str, split: str, x, y, task: str, shards: int) -> dict:
    n = len(x)
    shards = max(1, min(shards, n))  # never an empty file
    written = {}
    for s in range(shards):
        lo, hi = s * n // shards, (s + 1) * n // shards
        name = f"{split}-{s:05d}-of-{shards:05d}.tfrecord"
        path = os.path.join(out, name)
        with tf.io.TFRecordWriter(path) as writer:
            for i in range(lo, hi):
                label = (
                    tf.train.Feature(int64_list=tf.train.Int64List(value=[int(y[i])]))
                    if task == "classification"
                    else tf.train.Feature(float_list=tf.train.FloatList(value=y[i].ravel().tolist()))
                )
                features = {
                    "x": tf.train.Feature(float_list=tf.train.FloatList(value=x[i].ravel().tolist())),
                    "y": label,
                    ID_FEATURE: tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
                }
                writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())
        written[name] = [hi - lo, os.path.getsize(path)]
    return written


def export(data_cfg, out: str, shards: int, eval_shards: int | None = None) -> dict:
    """Load the source `data_cfg` names (a composed data node) and write it to `out`; returns the spec file's content."""
    from runner.sources import in_memory

    streams = (
        f"data={data_cfg.name} streams from files and is never loaded whole; export reads ones, synthetic, digits, npz "
        "or a data=function that returns NumPy arrays."
    )
    if registry.get("data", data_cfg.name).caps.pipeline is not None and data_cfg.name != "function":
        raise ConfigError(streams)  # refused before TensorFlow: these never hold arrays
    from runner import env

    env.prepare()  # TensorFlow's environment, as the runner sets it, before its import
    with env.native_stderr_captured():  # TensorFlow's C++ start-up lines (absl, CUDA probes), shown only on failure
        arrays = in_memory.load(data_cfg)
        import tensorflow as tf
    if getattr(arrays, "streamed", False):  # data=function with a dataset_fn
        raise ConfigError(streams.replace("streams from files", "returns a tf.data.Dataset"))
    os.makedirs(out, exist_ok=True)

    task = arrays.task
    records = _write_split(tf, out, "train", arrays.x_train, arrays.y_train, task, shards)
    records |= _write_split(tf, out, "eval", arrays.x_eval, arrays.y_eval, task, eval_shards or shards)
    label = {"dtype": "int64", "shape": []}
    if task != "classification":
        label = {"dtype": "float32", "shape": list(arrays.y_train.shape[1:])}
    spec = {
        "features": {"x": {"dtype": "float32", "shape": list(arrays.input_shape)}, "y": label},
        "label": "y",
        "task": task,
        "num_classes": arrays.num_classes,
        "source": f"data={data_cfg.name}",
        "records": records,  # file name -> [records, bytes]: data=tfrecord counts without reading
    }
    with open(os.path.join(out, SPEC_FILE), "w") as f:
        json.dump(spec, f, indent=1)
    return spec


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runner.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="the runner's data overrides: data=npz data.path=...")
    parser.add_argument("--out", required=True, help="directory for the .tfrecord files and tfrecord.json")
    parser.add_argument("--shards", type=int, default=1, help="training files (default 1)")
    parser.add_argument("--eval-shards", type=int, default=None, help="eval files (default: --shards)")
    args = parser.parse_args(argv)
    if args.shards < 1 or (args.eval_shards is not None and args.eval_shards < 1):
        parser.error("--shards and --eval-shards must be 1 or more")
    try:
        cfg = composed(args.overrides)
        spec = export(cfg.data, args.out, args.shards, args.eval_shards)
    except OSError as err:  # writing --out (a file there, no permission), or reading the source
        where = str(err.filename or args.out)
        hint = " Give --out a new directory where you can write." if where.startswith(str(args.out)) else ""
        print(f"Error: {where}: {err.strerror or err}.{hint}", file=sys.stderr)
        return 2
    except Exception as err:
        code = reported(err, args.overrides)  # a config that cannot work: one paragraph
        if code is None:
            raise
        return code
    counts = {split: sum(c for name, (c, _) in spec["records"].items() if name.startswith(split)) for split in ("train", "eval")}
    print(
        f"wrote {counts['train']} training and {counts['eval']} eval records of {spec['source']} to {args.out} "
        f"({len(spec['records'])} files + {SPEC_FILE}); train with: python -m runner data=tfrecord "
        f"data.train_files='{args.out}/train-*.tfrecord' data.eval_files='{args.out}/eval-*.tfrecord'"
    )
    return 0


if __name__ == "__main__":
    from runner import env

    env.utf8_paths()  # TensorFlow writes the files: their paths as UTF-8 (runner.env)
    sys.exit(main())
