"""Data that breaks while it is read, told from TensorFlow's error: which file, which record, and what to do.
TensorFlow is imported only to decode images again (refused_image), once training has imported it.

The checks before training read what is cheap (a file's first record, a folder's listing, a dataset's info), so a
record damaged in the middle of a large file is met only when the pipeline reaches it, hours into a run:
TensorFlow's `DataLossError: corrupted record at 56880` (a checksum), `truncated record at N` (a file cut short),
or an `InvalidArgumentError` from the input pipeline (a record unlike its spec, an image its decoder refuses, a
label outside the classes). `damaged_data` turns these into a DataError (exit 5) that names the file and record
where TensorFlow gives an offset: the local files of the data source are searched for a damaged record that starts
there. Anything else is left alone.
"""

import glob
import os
import re

from runner.config import layout
from runner.errors import DataError

_OFFSET = re.compile(r"(?:corrupted|truncated) record at (\d+)")
# An InvalidArgumentError is the data's when the input pipeline or the loss's label check raised it.
_DATA_MARKS = ("IteratorGetNext", "ParseExample", "serialized Example", "Received a label value", "Decode", "record at")


_NOISE = re.compile(
    r"\{\{function_node [^}]*\}\}\s*|\s*\[Op:[^\]]*\].*$|Error in user-defined function passed to \S+ transformation "
    r"with iterator: \S+: |Name: <unknown>, |\s+Label values:.*$"
)


def tf_says(text: str) -> str:
    """TensorFlow's own sentence in its error: in graph mode the line before its `[[{{node ...}}]]` marker, in eager
    mode the message without the `{{function_node ...}}` and `[Op:...]` wrapping."""
    lines = [line.strip() for line in text.splitlines()]
    said = next((lines[i - 1] for i, line in enumerate(lines) if line.startswith("[[") and i and lines[i - 1]), None)
    said = said or next((line for line in reversed(lines) if line), text)
    return _NOISE.sub("", said)[:300]


def source_files(data_cfg) -> dict[str, list[str]]:
    """The local files a data source reads, by the key that names them (what a damaged record is searched in)."""
    try:
        if data_cfg.name == "image_folder":
            from runner.sources.image_folder import list_folder

            keys = {"data.train_dir": data_cfg.train_dir, "data.eval_dir": data_cfg.get("eval_dir")}
            found = {k: list_folder(k, v, verify=False) for k, v in keys.items() if v}
            return {k: [f for files in classes.values() for f in files] for k, classes in found.items()}
        if data_cfg.name == "tfrecord":
            from runner.sources.tfrecord import remote, resolve_files

            keys = {"data.train_files": data_cfg.train_files, "data.eval_files": data_cfg.get("eval_files")}
            return {k: [f for f in resolve_files(k, v) if not remote(f)] for k, v in keys.items() if v}
        if data_cfg.name == "tfds":
            from runner.sources.tfds_prepared import check

            directory, _ = check(data_cfg)
            return {f"data.dataset={data_cfg.dataset}": sorted(glob.glob(os.path.join(directory, "*.tfrecord*")))}
    except Exception:  # the files moved since the run started: name none
        return {}
    return {}


IMAGE_SEARCH_SEC = 60.0  # the decoder's refusal names no file: each image is decoded again, for at most this long


def refused_image(files: dict[str, list[str]], budget: float = IMAGE_SEARCH_SEC):
    """(key, path, TensorFlow's reason) of the first image TensorFlow's decoder refuses, searched in the order the
    files are listed; None when none is found within `budget` seconds. TensorFlow is imported already (training ran)."""
    if not any(files.values()):
        return None
    import time

    import tensorflow as tf

    deadline = time.monotonic() + budget
    for key, paths in files.items():
        for path in paths:
            if time.monotonic() > deadline:
                return None
            try:  # as the pipeline decodes (runner.builders.data.image_folder): the file's own channels
                tf.io.decode_image(tf.io.read_file(path), channels=0, expand_animations=False)
            except tf.errors.NotFoundError:  # gone since the run started: not the one refused
                continue
            except tf.errors.OpError as err:
                return key, path, tf_says(str(err))
    return None


def find_damage(files: dict[str, list[str]], offset: int) -> list[tuple[str, str, int, str]]:
    """(key, file, record number, what is wrong) for each file whose record at `offset` is damaged."""
    from runner.sources.tfrecord_format import damage_at

    found = []
    for key, paths in files.items():
        for path in dict.fromkeys(paths):
            try:
                hit = damage_at(path, offset) if os.path.getsize(path) > offset else None
            except OSError:
                continue
            if hit:
                found.append((key, path, *hit))
    return found


def damaged_data(err: BaseException, data_cfg, step=None, output_dir=None, checkpoint_dir=None) -> DataError | None:
    """A DataError naming the damaged file and record, when `err` is TensorFlow failing to read the data; else None."""
    kind, text = type(err).__name__, str(err)
    if kind != "DataLossError" and not (kind == "InvalidArgumentError" and any(m in text for m in _DATA_MARKS)):
        return None
    said = tf_says(text)
    offset = _OFFSET.search(text)
    hits = find_damage(source_files(data_cfg), int(offset.group(1))) if offset else []
    if hits:
        where = "; ".join(f"{path} ({key}), record {n}: {why}" for key, path, n, why in hits)
        what = f"a damaged file: {where}"
        fix = (
            "Replace that file with a good copy (or write it again with python -m runner.export), or leave it out of "
            f"{hits[0][0]}"
        )
    elif offset:
        what = f"a damaged file of data={data_cfg.name} (TensorFlow gave the offset but not the file)"
        fix = "Find it with data.verify=true (data=tfrecord: every record is checked before training), then replace it"
    else:
        what = f"data that does not match what data={data_cfg.name} expects"
        fix = "Fix the data (or the data.* keys that describe it: features, label, num_classes, image size)"
        if data_cfg.name == "tfrecord":
            fix += "; data.verify=true names the file and record before training"
        elif data_cfg.name == "image_folder" and "label" not in said:
            bad = refused_image(source_files(data_cfg))
            if bad:
                what = f"an image the decoder refuses: {bad[1]} ({bad[0]}: {bad[2].rstrip('.')})"
                fix = "Replace or remove that file"
            else:
                fix = (
                    f"Replace or remove the image its decoder refused (TensorFlow did not say which, and decoding each "
                    f"file again found none within {IMAGE_SEARCH_SEC:g} s; data.verify_images checks each file's header and end "
                    "before training, not its pixels)"
                )
    at = f" at step {step}" if step else ""
    resume = f" resume={output_dir}" if output_dir else " resume=<the run's output directory>"
    return DataError(
        f"reading the data failed{at}: {what}. TensorFlow says: {said} ({kind}). The run stopped; "
        f"{layout.checkpoint_note(checkpoint_dir)}. {fix}; then continue with: python -m runner{resume}."
    )
