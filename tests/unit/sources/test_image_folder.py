"""data=image_folder: the listing before TensorFlow (classes, counts, the held-out split) and every bad folder a user
makes, refused by the checks and the pre-flight probe with one paragraph naming the key and the path (fast, no
TensorFlow). PNGs are written in plain Python (tests/helpers.py). Training on a folder is README's example, run by
tests/e2e/test_readme.py (grayscale over 2 replicas, on PNGs and a BMP)."""

import pytest
from omegaconf import OmegaConf

from runner.config import schema, validate
from runner.errors import ConfigError
from runner.sources.image_folder import load_source

from helpers import data_refusal, with_data, write_image_folder, write_png

schema.register()
OmegaConf.register_new_resolver("runner.or", lambda a, b: a or b, replace=True)


def composed(**data):
    """The composed config with data=image_folder, data.* set."""
    return with_data(["data=image_folder", "data.image_size=[8,8]"], **data)


def refused(**data) -> str:
    """The checks, then the data probe (the generic probes are tests/unit/preflight/test_probes.py's)."""
    return data_refusal(composed(**data))


@pytest.fixture
def folder(tmp_path):
    return write_image_folder(tmp_path / "train", classes=("dog", "cat"), per_class=5)


def test_the_listing_gives_classes_counts_and_a_seeded_split(folder):
    write_png(folder / "cat" / "more" / "deep.png", [[1, 2], [3, 4]])  # found recursively
    (folder / "cat" / "notes.txt").write_text("skipped, as Keras skips it")
    source = load_source(composed(train_dir=str(folder)).data)
    assert source.classes == ["cat", "dog"] and source.num_outputs == 2  # sorted, as Keras sorts them
    assert len(source.train) + len(source.eval) == 11 and len(source.eval) == 2  # round(11 * 0.2)
    assert source.input_shape == (8, 8, 3) and source.scale == pytest.approx(1 / 255)
    assert source.train_records == 9
    assert load_source(composed(train_dir=str(folder)).data).eval == source.eval
    assert load_source(composed(train_dir=str(folder), seed=1).data).eval != source.eval
    gray = load_source(composed(train_dir=str(folder), color_mode="grayscale", scale="1/2").data)
    assert gray.input_shape == (8, 8, 1) and gray.scale == 0.5


def test_an_eval_dir_takes_the_training_classes(folder, tmp_path):
    evals = write_image_folder(tmp_path / "eval", classes=("cat",), per_class=3)
    source = load_source(composed(train_dir=str(folder), eval_dir=str(evals)).data)
    assert len(source.train) == 10 and {label for _, label in source.eval} == {0}  # cat is class 0 of the training set
    write_image_folder(evals, classes=("bird",), per_class=1)
    assert "class folders that data.train_dir lacks: bird" in refused(train_dir=str(folder), eval_dir=str(evals))


def test_bad_folders_are_refused_before_tensorflow_naming_key_and_path(folder, tmp_path):
    (tmp_path / "empty").mkdir()
    one = write_image_folder(tmp_path / "one", classes=("only",), per_class=2)
    loose = tmp_path / "loose"
    write_png(loose / "a.png", [[0]])
    hollow = write_image_folder(tmp_path / "hollow", per_class=2)
    for png in (hollow / "square").iterdir():
        png.unlink()
    (hollow / "square" / "readme.md").write_text("x")
    cut = write_image_folder(tmp_path / "cut", per_class=2)
    whole = (cut / "circle" / "000.png").read_bytes()
    (cut / "circle" / "000.png").write_bytes(whole[: len(whole) // 2])
    (folder / "dog" / "fake.png").write_text("not an image")
    cases = {
        tmp_path / "none": f"data.train_dir='{tmp_path}/none' does not exist",
        tmp_path / "empty": "has no class sub-folders",
        loose: "It holds 1 image(s) directly: move them into one sub-folder per class",
        one: "has one class folder ('only'); classification needs two classes or more",
        hollow: "the class folder 'square' holds no images (only 1 other file(s))",
        cut: "000.png is a PNG file cut short (no IEND chunk at its end)",
        folder: "fake.png is not a PNG, JPEG, GIF or BMP image (it starts with b'not an i')",
    }
    for path, needle in cases.items():
        assert needle in refused(train_dir=str(path)), path
    assert "data.verify_images=false" in refused(train_dir=str(folder))
    load_source(composed(train_dir=str(folder), verify_images=False).data)  # the check can be skipped


def test_bad_values_are_refused_by_the_pure_checks(folder):
    cases = [
        ({"image_size": None}, "data.image_size is not set: data=image_folder resizes every image to it"),
        ({"image_size": [8]}, "data.image_size=[8] is not [height, width]"),
        ({"image_size": [0, 8]}, "data.image_size=[0, 8] every element must be a positive integer"),
        ({"scale": "abc"}, "data.scale='abc' is not a usable scale"),
        ({"scale": 0}, "data.scale=0 is not a usable scale"),
        ({"color_mode": "cmyk"}, "data.color_mode='cmyk' is not valid; choose one of: rgb, grayscale, rgba"),
        ({"input": "numpy"}, "data.input=numpy needs the data in memory, and data=image_folder streams it"),
        ({"eval_fraction": 1.0}, "data.eval_fraction=1.0 must be between 0 and 1 (exclusive)"),
    ]
    for data, needle in cases:
        assert needle in refused(train_dir=str(folder), **data), data
    with pytest.raises(ConfigError, match="data.train_dir is not set, and data=image_folder needs it"):
        validate.check_config(composed())
