"""data=tfrecord before TensorFlow (runner/sources/tfrecord_format.py, runner/sources/tfrecord.py): record framing and
counting, the Example reader, and every bad input the pre-flight probe refuses, naming the key and the file. Files are
written here in plain Python (a small Example encoder below); tests/e2e/test_tfrecord.py checks the same readers against
files TensorFlow wrote."""

import json
import struct

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from runner.config import schema
from runner.config.validate import validate
from runner.errors import ConfigError
from runner.sources.tfrecord import SPEC_FILE, load_source
from runner.sources.tfrecord_format import count_records, crc32c, example_features, first_record, write_records

schema.register()
OmegaConf.register_new_resolver("runner.or", lambda a, b: a or b, replace=True)


# --- a minimal tf.train.Example encoder (protobuf wire format) ---
def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def example(**features) -> bytes:
    """example(x=[1.0, 2.0], y=[3], name=[b"a"]): floats -> FloatList, ints -> Int64List, bytes -> BytesList."""
    entries = b""
    for name, values in features.items():
        if all(isinstance(v, bytes) for v in values) and values:
            inner = _len_field(1, b"".join(_len_field(1, v) for v in values))
        elif all(isinstance(v, int) for v in values):
            inner = _len_field(3, _len_field(1, b"".join(_varint(v) for v in values)))
        else:
            inner = _len_field(2, _len_field(1, struct.pack(f"<{len(values)}f", *values)))
        entries += _len_field(1, _len_field(1, name.encode()) + _len_field(2, inner))
    return _len_field(1, entries)


SPEC = {"x": {"dtype": "float32", "shape": [3]}, "y": {"dtype": "int64", "shape": []}}


def write_split(directory, name, n, shards=2, start=0, **overrides):
    paths = []
    for s in range(shards):
        records = []
        for i in range(start + s * n // shards, start + (s + 1) * n // shards):
            fields = {"x": [0.5, 1.0, float(i)], "y": [i % 3], "id": [i], **overrides}
            records.append(example(**fields))
        path = directory / f"{name}-{s}.tfrecord"
        write_records(str(path), records)
        paths.append(path)
    return paths


def data_cfg(**values):
    base = {"name": "tfrecord", "features": SPEC, "label": "y", "num_classes": 3}
    return OmegaConf.merge(OmegaConf.structured(schema.GROUP_SCHEMAS["data"]["tfrecord"]), {**base, **values})


def refused(cfg, *needles, count=False):
    with pytest.raises(ConfigError) as err:
        load_source(cfg, count=count)
    message = str(err.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message
    return message


def test_crc32c_and_framing_round_trip(tmp_path):
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    path = tmp_path / "f.tfrecord"
    assert write_records(str(path), [b"a", b"", b"xyz" * 100]) == 3
    assert count_records(str(path)) == 3
    assert first_record(str(path)) == b"a"
    (tmp_path / "empty.tfrecord").write_bytes(b"")
    assert count_records(str(tmp_path / "empty.tfrecord")) == 0


def test_example_features_kinds_and_counts():
    found = example_features(example(x=[1.0, 2.0, 3.0], y=[7], ids=[1, 300, 70000], name=[b"a", b"b"]))
    assert found == {"x": ("float", 3), "y": ("int64", 1), "ids": ("int64", 3), "name": ("bytes", 2)}


def test_a_good_source_gives_shape_classes_and_counts(tmp_path):
    write_split(tmp_path, "train", 10)
    write_split(tmp_path, "eval", 4, shards=1)
    source = load_source(data_cfg(train_files=str(tmp_path / "train-*.tfrecord"), eval_files=str(tmp_path / "eval-*")))
    assert [p.split("/")[-1] for p in source.train_files] == ["train-0.tfrecord", "train-1.tfrecord"]
    assert source.input_shape == (3,) and source.num_outputs == 3 and source.train_records == 10
    listed = load_source(data_cfg(train_files=[str(tmp_path / "train-0.tfrecord")]))
    assert listed.train_records == 5 and listed.eval_files == listed.train_files


def test_the_spec_file_fills_what_the_config_leaves_null_and_counts_without_reading(tmp_path):
    files = write_split(tmp_path, "train", 10)
    records = {p.name: [99, p.stat().st_size] for p in files}  # counts the reader must trust (sizes match)
    spec = {"features": SPEC, "label": "y", "task": "classification", "num_classes": 3, "records": records}
    (tmp_path / SPEC_FILE).write_text(json.dumps(spec))
    source = load_source(data_cfg(train_files=str(tmp_path / "train-*"), features=None, label=None, num_classes=None))
    assert source.label == "y" and source.num_classes == 3 and source.train_records == 198
    write_split(tmp_path, "train", 12)  # rewritten: sizes differ, so counted again
    assert load_source(data_cfg(train_files=str(tmp_path / "train-*"))).train_records == 12
    # a hand-written spec file of another shape: named, not a TypeError inside the count
    for records, said in (
        ({files[0].name: 5}, f"\"records\" holds '{files[0].name}': 5; each file name maps to [records, bytes]"),
        ({files[0].name: ["5", 10]}, "two whole numbers"),
        ([5, 10], '"records" must map each file name to [records, bytes]'),
    ):
        (tmp_path / SPEC_FILE).write_text(json.dumps({**spec, "records": records}))
        refused(data_cfg(train_files=str(tmp_path / "train-*")), SPEC_FILE, said)
    (tmp_path / SPEC_FILE).write_text(json.dumps([spec]))
    refused(data_cfg(train_files=str(tmp_path / "train-*")), "holds a JSON list, not an object")


def test_bad_files_are_named(tmp_path):
    write_split(tmp_path, "train", 6)
    good = str(tmp_path / "train-*.tfrecord")
    refused(data_cfg(train_files=str(tmp_path / "nothing-*.tfrecord")), "data.train_files=", "matches no file", "runner.export")
    text = tmp_path / "notes.txt"
    text.write_text("hello, this is not a TFRecord file at all\n")
    refused(data_cfg(train_files=[good, str(text)]), "data.train_files", str(text), "is not a TFRecord file")
    refused(data_cfg(train_files=good, eval_files=str(text)), "data.eval_files", str(text))
    truncated = tmp_path / "cut.tfrecord"
    truncated.write_bytes((tmp_path / "train-0.tfrecord").read_bytes()[:-7])
    refused(data_cfg(train_files=str(truncated)), str(truncated), "truncated", count=True)
    npz_like = tmp_path / "raw.tfrecord"
    write_records(str(npz_like), [b"\xff\xff\xff"])
    refused(data_cfg(train_files=str(npz_like)), "not tf.train.Example")
    # an eval file cut short after its first record: found before training, not by the evaluation after it
    refused(data_cfg(train_files=good, eval_files=str(truncated)), "data.eval_files", str(truncated), "truncated", count=True)


def test_an_empty_file_among_the_shards_is_said_once(tmp_path, caplog):
    write_split(tmp_path, "train", 6)
    (tmp_path / "train-2.tfrecord").write_bytes(b"")  # a shard that was never written
    with caplog.at_level("WARNING", logger="runner"):
        source = load_source(data_cfg(train_files=str(tmp_path / "train-*.tfrecord")), count=True)
    assert source.train_records == 6
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "data.train_files: 1 of 3 file(s) hold no records (train-2.tfrecord)" in said[0], said


@pytest.mark.parametrize(
    "values,needles",
    [
        ({"features": {**SPEC, "z": {"dtype": "float32", "shape": [2]}}}, ["data.features.z", "no feature 'z'", "id, x, y"]),
        ({"features": {**SPEC, "x": {"dtype": "int64", "shape": [3]}}}, ["data.features.x.dtype=int64", "float values"]),
        ({"features": {**SPEC, "x": {"dtype": "float32", "shape": [4]}}}, ["data.features.x.shape=[4]", "has 3"]),
        ({"features": {**SPEC, "x": {"dtype": "float64", "shape": [3]}}}, ["data.features.x.dtype='float64'", "float32, int64"]),
        ({"features": {**SPEC, "x": {"dtype": "float32", "shape": [0]}}}, ["data.features.x.shape=[0]"]),
        ({"features": {"x": "float32", "y": SPEC["y"]}}, ["data.features.x='float32' must be {dtype"]),
        ({"label": "label"}, ["data.label='label' is not one of data.features (x, y)"]),
        ({"num_classes": None}, ["data.num_classes is not set"]),
        ({"features": {**SPEC, "y": {"dtype": "float32", "shape": []}}}, ["data.task=classification needs one int64"]),
        ({"features": {"y": SPEC["y"]}}, ["at least one input feature"]),
    ],
)
def test_spec_mistakes_name_the_key(tmp_path, values, needles):
    write_split(tmp_path, "train", 6)
    refused(data_cfg(train_files=str(tmp_path / "train-*"), **values), *needles)


def test_record_ids_need_an_id_feature(tmp_path):
    write_split(tmp_path, "train", 6, id=[0.5])
    refused(data_cfg(train_files=str(tmp_path / "train-*"), record_ids_dir=str(tmp_path)), "data.record_ids_dir", "'id'")


def test_the_probe_refuses_before_tensorflow_and_numpy_input(tmp_path):
    write_split(tmp_path, "train", 6)
    with initialize_config_module(config_module="runner.conf", version_base="1.3"):
        missing = compose(config_name="config", overrides=["data=tfrecord", f"data.train_files={tmp_path}/none-*"])
        numpy_in = compose(
            config_name="config", overrides=["data=tfrecord", f"data.train_files={tmp_path}/train-*", "data.input=numpy"]
        )
    for cfg, needle in ((missing, "matches no file"), (numpy_in, "data.input=numpy")):
        with pytest.raises(ConfigError, match=needle) as err:
            validate(cfg)
        assert err.value.exit_code == 2
