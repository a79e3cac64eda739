"""Data that breaks while it is read (runner.sources.faults, tfrecord_format.damage_at): TensorFlow's errors, as TF 2.21
words them in graph and eager mode, turned into one paragraph naming the file and record. No TensorFlow: the files
are written by the pure-Python framer and damaged byte by byte."""

import struct

from omegaconf import OmegaConf
from test_tfrecord_source import data_cfg, example

from runner.sources.faults import damaged_data, tf_says
from runner.sources.tfrecord_format import damage_at, write_records

GRAPH = (
    "Graph execution error:\n\nDetected at node IteratorGetNext defined at (most recent call last):\n"
    '  File "<frozen runpy>", line 198, in _run_module_as_main\n\ncorrupted record at {offset}\n'
    "\t [[{{{{node IteratorGetNext}}}}]] [Op:__inference_train_function_473]"
)
LABEL = (
    "Graph execution error:\n\nDetected at node sparse_categorical_crossentropy/X defined at:\n"
    "Received a label value of 12 which is outside the valid range of [0, 10).  Label values: 9 6 8 12 1\n"
    "\t [[{{node sparse_categorical_crossentropy/SparseSoftmaxCrossEntropyWithLogits}}]] [Op:__inference_train_function_9]"
)


def named(name):
    return type(name, (Exception,), {})  # what damaged_data reads of TensorFlow's error: its class name and text


def files(tmp_path, n=20):
    path = tmp_path / "train-0.tfrecord"
    write_records(str(path), [example(x=[0.5, 1.0, float(i)], y=[i % 3]) for i in range(n)])
    blob = bytearray(path.read_bytes())
    starts, at = [], 0
    while at < len(blob):
        starts.append(at)
        at += 16 + struct.unpack("<Q", blob[at : at + 8])[0]
    return path, blob, starts


def test_the_damaged_record_is_found_at_the_offset_tensorflow_gives(tmp_path):
    path, blob, starts = files(tmp_path)
    blob[starts[7] + 13] ^= 0xFF  # record 7's data: TensorFlow reports the data's offset, 12 bytes on
    blob[starts[12] + 2] ^= 0xFF  # record 12's header: TensorFlow reports the record's own offset
    path.write_bytes(bytes(blob))
    assert damage_at(str(path), starts[7] + 12) == (7, f"the data of the record at offset {starts[7]} fails its checksum")
    assert damage_at(str(path), starts[12])[0] == 12
    assert damage_at(str(path), starts[3]) is None and damage_at(str(path), starts[3] + 5) is None  # intact, or no record there
    assert damage_at(str(path), starts[15]) is None  # past record 12's damage: TensorFlow would have stopped there


def test_a_data_loss_names_file_record_step_checkpoint_and_resume(tmp_path):
    path, blob, starts = files(tmp_path)
    blob[starts[7] + 12] ^= 0xFF
    path.write_bytes(bytes(blob))
    cfg = data_cfg(train_files=str(tmp_path / "train-*.tfrecord"))
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "checkpoint").write_text('model_checkpoint_path: "ckpt-40"\n')
    err = named("DataLossError")(GRAPH.format(offset=starts[7] + 12))
    message = str(damaged_data(err, cfg, 44, "/runs/r", str(tmp_path / "ckpt")))
    assert message.startswith(f"reading the data failed at step 44: a damaged file: {path} (data.train_files), record 7:")
    assert f"TensorFlow says: corrupted record at {starts[7] + 12} (DataLossError)" in message
    assert "the latest checkpoint is step 40" in message and "leave it out of data.train_files" in message
    assert message.endswith("continue with: python -m runner resume=/runs/r.") and "\n" not in message
    assert damaged_data(err, cfg).exit_code == 5
    # an offset in no file it knows: said so, and data.verify=true offered
    other = str(damaged_data(named("DataLossError")(GRAPH.format(offset=starts[3] + 12)), cfg))
    assert "TensorFlow gave the offset but not the file" in other and "data.verify=true" in other


def test_other_data_errors_are_told_and_everything_else_left_alone():
    cfg = OmegaConf.create({"name": "image_folder"})
    message = str(damaged_data(named("InvalidArgumentError")(LABEL), cfg, 10))
    assert "TensorFlow says: Received a label value of 12 which is outside the valid range of [0, 10). (Invalid" in message
    assert "Label values" not in message and "decoder" not in message
    png = "Graph execution error:\n\nInvalid PNG. Failed to initialize decoder.\n\t [[{{node DecodePng}}]] [Op:x]"
    assert "Replace or remove the image its decoder refused" in str(damaged_data(named("InvalidArgumentError")(png), cfg))
    eager = "{{function_node __wrapped__IteratorGetNext_device_/job:localhost}} truncated record at 9 [Op:IteratorGetNext] name: "
    assert tf_says(eager) == "truncated record at 9"
    assert damaged_data(named("InvalidArgumentError")("Incompatible shapes: [64,10] vs. [64,3]"), cfg) is None  # the model's
    assert damaged_data(named("UnavailableError")("Collective ops is aborted"), cfg) is None
    assert damaged_data(ValueError("corrupted record at 5"), cfg) is None


def test_an_image_the_decoder_refuses_is_found_and_named(tmp_path):
    """TensorFlow's decoder refuses an image mid-training without naming it (its header and end pass
    data.verify_images): each image is decoded again to find it (imports TensorFlow)."""
    from helpers import write_image_folder

    folder = write_image_folder(tmp_path / "imgs", per_class=6)
    bad = folder / "square" / "003.png"
    data = bytearray(bad.read_bytes())
    data[40:-20] = b"A" * (len(data) - 60)  # the PNG signature and IEND kept: the pixels are garbage
    bad.write_bytes(bytes(data))
    cfg = OmegaConf.create({"name": "image_folder", "train_dir": str(folder), "color_mode": "rgb"})
    png = "Graph execution error:\n\nInvalid PNG. Failed to initialize decoder.\n\t [[{{node DecodePng}}]] [Op:x]"
    message = str(damaged_data(named("InvalidArgumentError")(png), cfg, 7))
    assert message.startswith(f"reading the data failed at step 7: an image the decoder refuses: {bad} (data.train_dir: ")
    assert "Replace or remove that file" in message and "\n" not in message
