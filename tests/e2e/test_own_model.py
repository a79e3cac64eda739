"""A user's own model as TensorFlow 2.21's tutorials write it (tests/user_project/my_models.py: Keras 3, the data's
`num_classes`, softmax at the end), on a folder of images in class sub-folders, compared across strategies in one
sweep as a user types it: `model._target_` on the command line with no `~` keys, and no failed run on the way.
The same model returning logits reaches the same weights; a model that does not fit the data is refused before
its first step, in one paragraph that blames the model."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import assert_refused_run_deleted, write_image_folder

pytestmark = pytest.mark.slow  # end to end: a sweep and runs of `python -m runner`

USER = Path(__file__).resolve().parents[1] / "user_project"
EXPERIMENT = "own-model"
EXECUTOR = "fit"
CLASSES = ("a", "b", "c", "d")  # four: the tutorial model's num_classes default would be wrong


def _args(images):
    return [
        "data=image_folder",
        f"data.train_dir={images}",
        "data.image_size=[8,8]",
        f"executor={EXECUTOR}",
        "train.global_batch_size=16",
        "train.epochs=2",
        "train.log_every_n_steps=1",
        f"mlflow.experiment_name={EXPERIMENT}",
    ]


@pytest.fixture(scope="module")
def images(runner):
    return write_image_folder(runner.root / "own-model-images", classes=CLASSES, per_class=16, size=8)


@pytest.fixture(scope="module")
def sweep(runner, images):
    """README's task: strategy=default against mirrored over 2 logical CPUs, the user's model by _target_ alone."""
    sweep_dir = runner.root / "sweeps" / "own-model"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["PYTHONPATH"] = str(USER)
    argv = [sys.executable, "-m", "runner", "-m", "strategy=default,mirrored", "devices.logical_cpus=2"]
    argv += ["model._target_=my_models.image_classifier", *_args(images)]
    argv += [f"hydra.sweep.dir={sweep_dir}", f"mlflow.tracking_uri={runner.uri}", "mlflow.run_name=own-model-sweep"]
    proc = subprocess.run(argv, cwd=runner.root, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, sweep_dir


@pytest.fixture(scope="module")
def others(runner, images):
    """The same model returning logits, and two models a user gets wrong."""
    cases = {
        "logits": ["model._target_=my_models.image_classifier_logits", "strategy=default"],
        "hard-coded-classes": ["model._target_=my_models.mnist_head"],
        "unknown-key": ["model._target_=my_models.image_classifier", "+model.width=3"],
    }
    return runner.many({name: [*args, *_args(images)] for name, args in cases.items()}, env_extra={"PYTHONPATH": str(USER)})


def _weights(path):
    import keras

    return keras.models.load_model(path, compile=False).get_weights()


def _close(got, reference):
    assert len(got) == len(reference) > 0
    for a, b in zip(got, reference):
        assert np.max(np.abs(a - b)) <= 1e-5 * np.max(np.abs(b)), np.max(np.abs(a - b))


def _runs(runner):
    from mlflow import MlflowClient
    from mlflow.entities import ViewType

    client = MlflowClient(runner.uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    return client, client.search_runs([experiment.experiment_id], run_view_type=ViewType.ALL)


def test_the_users_model_trains_in_a_strategy_sweep_without_a_failed_run(sweep, runner):
    proc, sweep_dir = sweep
    _close(_weights(sweep_dir / "1" / "model.keras"), _weights(sweep_dir / "0" / "model.keras"))  # mirrored x2 = default
    log = (sweep_dir / "0" / "runner.log").read_text()
    assert "left out model.hidden_units, model.activation, which the model= option's YAML brought" in log
    assert "the model outputs probabilities: its last layer is dense_1 (Dense, activation softmax)" in log
    assert "from_logits=False" in log and "Traceback" not in proc.stderr
    client, runs = _runs(runner)
    jobs = [r for r in runs if r.data.tags.get("sweep.job_num") is not None]
    assert len(jobs) == 2 and all(r.info.status == "FINISHED" for r in jobs), [r.info.status for r in jobs]
    assert all(r.data.tags["model_outputs"] == "probabilities" for r in jobs)
    names = sorted(r.info.run_name for r in jobs)  # after the sweep's mlflow.run_name, what differs between them
    assert names == ["own-model-sweep-0 strategy=default", "own-model-sweep-1 strategy=mirrored"], names
    assert all(0 <= r.data.metrics["eval/accuracy"] <= 1 for r in jobs)  # what it learnt: the logits run's weights, below


def test_softmax_and_logits_reach_the_same_weights(sweep, others):
    _, sweep_dir = sweep
    logits = others["logits"]
    assert logits.returncode == 0, logits.output[-3000:]
    assert "the model outputs logits" in logits.output and "from_logits=True" in logits.output
    _close(_weights(logits.run_dir / "model.keras"), _weights(sweep_dir / "0" / "model.keras"))


@pytest.mark.parametrize(
    "name,needle",
    [
        (
            "hard-coded-classes",
            "model._target_='my_models.mnist_head' outputs shape [10] per example from its last layer, dense (Dense, "
            "activation softmax), but the data have 4 classes: sparse_categorical_crossentropy needs one output per class",
        ),
        (
            "unknown-key",
            "model._target_='my_models.image_classifier' does not take model.width (it takes: input_shape, num_classes",
        ),
    ],
)
def test_a_model_that_does_not_fit_is_one_paragraph_that_blames_the_model(others, runner, name, needle):
    result = others[name]
    assert result.returncode == 2, result.output[-3000:]
    assert "Traceback" not in result.output and "step 1/" not in result.output
    errors = [p for p in result.stderr.split("\n\n") if p.strip()]
    assert len(errors) == 1 and errors[0].startswith("Error: ") and needle in errors[0], result.stderr[-3000:]
    assert "resume=" not in errors[0].split("was deleted")[0]  # not blamed on the data (exit 5, "Fix the data ... resume=")
    assert_refused_run_deleted(runner.uri, EXPERIMENT, name, result, needle)  # no failed run left on the way
