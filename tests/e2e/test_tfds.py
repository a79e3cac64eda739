"""data=tfds: finding a prepared dataset in data.data_dir and every mistake a user makes with one (not built, wrong
version, split or feature), refused before TensorFlow with one paragraph that names the key, the directory and the
`tfds build` command (fast: the probe reads tfds's JSON files, written here as tfds 4.9 writes them). Then, slow:
the probe against a dataset TensorFlow Datasets itself prepared (tests/tfds_tiny.py, no network), a real run on it,
and bad inputs of both new sources through `python -m runner` (exit 2, no traceback, no MLflow run left RUNNING).
"""

import json

import pytest
from omegaconf import OmegaConf

from runner.config import schema
from runner.sources.tfds_prepared import check
from runner.sources.tfds_splits import split_size

from helpers import data_refusal, mlflow_run_by_name, with_data, write_image_folder

schema.register()
OmegaConf.register_new_resolver("runner.or", lambda a, b: a or b, replace=True)


def composed(**data):
    """The composed config with data=tfds, data.* set."""
    return with_data(["data=tfds", "data.dataset=mnist"], **data)


def refused(**data) -> str:
    return data_refusal(composed(**data))


def fake_tfds(root, name="mnist", version="3.0.1", splits=None, supervised=True, side="28", label=None):
    """dataset_info.json and features.json as tensorflow-datasets 4.9.10 writes them (no data files: the probe
    never opens them)."""
    directory = root / name / version
    directory.mkdir(parents=True)
    splits = splits or {"train": [60, 68], "test": [32]}
    info = {
        "fileFormat": "tfrecord",
        "name": name.split("/")[0],
        "splits": [{"name": s, "shardLengths": [str(n) for n in lengths]} for s, lengths in splits.items()],
        "version": version,
    }
    if supervised:
        info["supervisedKeys"] = {"tuple": {"items": [{"featureKey": "image"}, {"featureKey": "label"}]}}
    (directory / "dataset_info.json").write_text(json.dumps(info))
    for split, lengths in splits.items():  # the data files, empty: only their names are looked at
        for i in range(len(lengths)):
            (directory / f"{info['name']}-{split}.tfrecord-{i:05d}-of-{len(lengths):05d}").write_bytes(b"")
    features = {
        "image": {
            "image": {"dtype": "uint8", "shape": {"dimensions": [side, side, "1"]}},
            "pythonClassName": "tensorflow_datasets.core.features.image_feature.Image",
        },
        "label": label
        or {
            "classLabel": {"numClasses": "10"},
            "pythonClassName": "tensorflow_datasets.core.features.class_label_feature.ClassLabel",
        },
    }
    (directory / "features.json").write_text(json.dumps({"featuresDict": {"features": features}}))
    return directory


def test_a_built_dataset_is_found_with_its_newest_version_and_split_sizes(tmp_path):
    fake_tfds(tmp_path, version="1.0.0")
    newest = fake_tfds(tmp_path, version="3.0.1")
    (tmp_path / "mnist" / "incomplete.ABC_3.0.2").mkdir()  # a build tfds did not finish: not a version
    assert check(composed(data_dir=str(tmp_path)).data) == (str(newest), 128)
    assert check(composed(data_dir=str(tmp_path), version="1.0.0").data)[0] == str(tmp_path / "mnist" / "1.0.0")
    sizes = {"train": 128, "test": 32}
    assert split_size("k", "train[:80%]", sizes) == 102 and split_size("k", "train[80%:]", sizes) == 26  # tfds: 102, 26
    assert split_size("k", "train[-10:]+test", sizes) == 42 and split_size("k", "test[:-50%]", sizes) == 16


def test_the_data_dir_defaults_to_tfds_own(tmp_path, monkeypatch):
    fake_tfds(tmp_path)
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path))
    assert check(composed().data)[1] == 128
    monkeypatch.delenv("TFDS_DATA_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    message = refused()
    assert f"data.data_dir (null: $TFDS_DATA_DIR or ~/tensorflow_datasets), {tmp_path}/home/tensorflow_datasets," in message


def test_mistakes_are_refused_before_tensorflow_naming_key_directory_and_command(tmp_path):
    fake_tfds(tmp_path)
    fake_tfds(tmp_path, name="emnist/letters", version="3.1.0")
    fake_tfds(tmp_path, name="unsupervised", supervised=False)
    fake_tfds(tmp_path, name="trainonly", splits={"train": [10]})
    fake_tfds(tmp_path, name="varying", side="-1")
    scalar = {"pythonClassName": "tensorflow_datasets.core.features.scalar.Scalar", "tensor": {"dtype": "float32"}}
    fake_tfds(tmp_path, name="regression", label=scalar)
    cut = fake_tfds(tmp_path, name="cut", splits={"train": [5, 5, 5], "test": [4]})
    (cut / "cut-train.tfrecord-00001-of-00003").unlink()
    root = str(tmp_path)
    cases = [
        ({"data_dir": f"{root}/none"}, f"data.data_dir={root}/none does not exist. Datasets are never downloaded"),
        ({"data_dir": f"{root}/none"}, f"`tfds build mnist --data_dir {root}/none`"),
        ({"dataset": "cifar10"}, f"data.dataset='cifar10' is not built in data.data_dir={root} (no {root}/cifar10/<version>"),
        ({"dataset": "cifar10"}, "It holds: cut, emnist, mnist, regression, trainonly, unsupervised, varying. Datasets"),
        ({"dataset": "cifar10"}, f"build it once with `tfds build cifar10 --data_dir {root}`"),
        ({"dataset": "emnist"}, "choose one, e.g. data.dataset=emnist/letters (configs built: letters)"),
        ({"dataset": "mnist:3.0.1"}, "give the version on its own: data.dataset=mnist data.version=3.0.1"),
        ({"version": "9.9.9"}, "at version(s) 3.0.1 only. Use one of them (or null: the newest)"),
        ({"version": "9.9.9"}, f"or build it with `tfds build mnist:9.9.9 --data_dir {root}`"),
        ({"split_train": "training"}, "data.split_train='training': the dataset has no split 'training'; its splits: train"),
        ({"split_eval": "validation"}, "data.split_eval='validation': the dataset has no split 'validation'"),
        ({"split_train": "train[:200%]"}, "a percent slice goes from -100% to 100%"),
        ({"split_train": "train[500:]"}, "train[500:] selects no examples of the 128 in 'train' (from 500 to 128)"),
        ({"split_train": "train[abc]"}, "is not a split the runner reads"),
        ({"image_key": "img"}, "data.image_key='img' is not a feature of 'mnist'; its features: image, label"),
        ({"dataset": "unsupervised"}, "data.image_key is null and 'unsupervised' declares no supervised_keys"),
        ({"dataset": "trainonly"}, "data.split_eval is null and the dataset has no test or validation split"),
        ({"split_train": "train[:10]"}, "train.global_batch_size=64 is larger than the 10 training examples"),
        ({"dataset": "varying"}, "'varying''s 'image' has images of varying size (?x?x1): set data.image_size=[height,width]"),
        ({"dataset": "regression"}, "data.label_key='label' is a Scalar, not a ClassLabel"),
        ({"image_key": "label"}, "data.image_key='label' is a ClassLabel of no fixed values, not an image"),
        ({"dataset": "cut"}, "holds 2 of the 3 files of the split 'train' (named cut-train.*); the dataset was copied"),
        ({"input": "numpy"}, "data.input=numpy needs the data in memory, and data=tfds streams it"),
        ({"scale": "1/0"}, "data.scale='1/0' is not a usable scale"),
        ({"image_size": [28]}, "data.image_size=[28] is not [height, width]"),
    ]
    for data, needle in cases:
        message = refused(**{"data_dir": root, **data})
        assert needle in message, (data, message)
    check(composed(data_dir=root, dataset="unsupervised", image_key="image", label_key="label").data)
    check(composed(data_dir=root, dataset="trainonly", split_train="train[:80%]", split_eval="train[80%:]").data)
    check(composed(data_dir=root, dataset="varying", image_size=[16, 16]).data)


# --- slow: a dataset TensorFlow Datasets prepared, and the runner --------------------------------------------------
@pytest.mark.slow  # builds the dataset with tfds (a process that imports TensorFlow), once per session
def test_the_probe_reads_what_tfds_wrote(tfds_dir):
    directory, examples = check(composed(data_dir=str(tfds_dir), split_train="train[:75%]").data)
    assert directory == str(tfds_dir / "mnist" / "3.0.1") and examples == 96
    assert "version(s) 3.0.1 only" in refused(data_dir=str(tfds_dir), version="1.0.0")


@pytest.mark.slow  # end to end: `python -m runner` imports TensorFlow
def test_training_on_a_prepared_dataset(runner, tfds_dir):
    """The custom loop over 2 replicas, data.input=from_function (tfds's ReadConfig input_context, or examples when
    the split has fewer files than pipelines), a slice of train: 96 examples // 16 = 6 steps, counted by tfds from
    the dataset's info as the probe counted them. README's examples (tests/e2e/test_readme.py) run the other paths:
    data=tfds under Model.fit, data=image_folder grayscale over 2 replicas on PNGs and a BMP."""
    args = ["data=tfds", "data.dataset=mnist", f"data.data_dir={tfds_dir}", "data.split_train='train[:75%]'"]
    args += ["data.input=from_function", "strategy=mirrored", "devices.logical_cpus=2", "executor=custom_loop"]
    result = runner("tfds", [*args, "model=cnn", "train.global_batch_size=16", "train.epochs=1", "save_model=false"])
    assert result.returncode == 0, result.output[-3000:]
    assert "96 training examples in 'train[:75%]', eval on 'test', input 28x28x1, 10 classes" in result.output
    assert "done: 6 steps" in result.output, result.output[-2000:]
    _, run = mlflow_run_by_name(runner.uri, "runner", "tfds")
    assert run.info.status == "FINISHED" and run.data.params["data.name"] == "tfds"
    assert "eval/accuracy" in run.data.metrics and "loss/replica_1" in run.data.metrics


@pytest.mark.slow  # end to end: `python -m runner` (no TensorFlow: every case stops in the pre-flight probe)
def test_bad_inputs_end_in_one_paragraph_exit_2_and_no_run(runner, tmp_path):
    one = write_image_folder(tmp_path / "one", classes=("only",), per_class=2)
    cases = {
        "tfds-not-built": (
            ["data=tfds", "data.dataset=mnist", f"data.data_dir={tmp_path}"],
            f"build it once with `tfds build mnist --data_dir {tmp_path}`",
        ),
        "folder-one-class": (["data=image_folder", f"data.train_dir={one}", "data.image_size=[8,8]"], "two classes or more"),
    }
    done = runner.many({name: args for name, (args, _) in cases.items()}, timeout=120)
    for name, (_, needle) in cases.items():
        result = done[name]
        assert result.returncode == 2, f"{name}: {result.output[-2000:]}"
        errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1 and needle in errors[0], result.stderr[-2000:]
        assert "Traceback" not in result.output
    from mlflow import MlflowClient

    client = MlflowClient(runner.uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    names = {r.info.run_name: r.info.status for r in client.search_runs(experiments)}
    assert not set(cases) & set(names), names  # stopped before any MLflow run started: none left RUNNING
