"""The guide's input paths, models and data, a user's own model and config directory, and the installed package."""

import subprocess
import sys

import numpy as np
import pytest

from helpers import FAST, ROOT, mlflow_run_by_name, run_runner

pytestmark = pytest.mark.slow  # end to end: each test trains through `python -m runner`

EXPERIMENT = "inputs"
MIRRORED2 = ["strategy=mirrored", "devices.logical_cpus=2"]
USER = ROOT / "tests" / "user_project"
CALLBACK_LOG = "branchy-epochs.jsonl"  # written by the user's callback, relative to the runs' working directory
USER_DATA = [
    "data=function",
    "data.shuffle=false",
    "train.epochs=2",
    "train.steps_per_epoch=8",  # 256 examples / 32: an epoch ends where the user's batches do
    "train.global_batch_size=32",
    "train.log_every_n_steps=1",
    "train.optimizer.learning_rate=0.3",
]

CASES = {
    # the guide's own example: one Dense unit on ones, batches of 10 over 4 replicas (uneven shards)
    "guide-fit": [
        "model=linear",
        "data=ones",
        "strategy=mirrored",
        "devices.logical_cpus=4",
        "train.global_batch_size=10",
        "train.loss=mse",
        "executor=fit",
        "train.log_every_n_steps=1",
    ],
    "guide-custom_loop": [
        "model=linear",
        "data=ones",
        "strategy=mirrored",
        "devices.logical_cpus=4",
        "train.global_batch_size=10",
        "train.loss=binary_crossentropy",
        "executor=custom_loop",
        "train.log_every_n_steps=1",
    ],
    "numpy-fit": [*MIRRORED2, *FAST, "data.input=numpy", "executor=fit"],
    "numpy-custom_loop": [*MIRRORED2, *FAST, "data.input=numpy", "executor=custom_loop"],
    "from_function-fit": [*MIRRORED2, *FAST, "data.input=from_function", "executor=fit"],
    "from_function-custom_loop": [
        *MIRRORED2,
        *FAST,
        "data.input=from_function",
        "executor=custom_loop",
        "train.steps_per_loop=4",
    ],
    "digits-cnn": [
        "strategy=central_storage",
        "devices.logical_cpus=2",
        "model=cnn",
        "data=digits",
        "executor=custom_loop",
        "train.epochs=3",
        "train.optimizer.name=adam",
        "train.optimizer.learning_rate=0.01",
        "train.log_every_n_steps=1",
    ],
    # float16 compute with loss scaling (a GPU feature; on CPU it must still train correctly)
    "mixed-fit": [*FAST, "train.mixed_precision=true", "executor=fit"],
    "mixed-custom_loop": [*FAST, "train.mixed_precision=true", "executor=custom_loop"],
    "user-model": [*MIRRORED2, *FAST, "model=tiny", f"hydra.searchpath=[file://{USER / 'conf'}]"],
    # a user's own data (data=function, tests/user_project/my_data.py): the same examples as NumPy arrays and as the
    # guide's dataset_fn reach the same weights (the global batches hold the same examples in the same order)
    "user-data-arrays": [*MIRRORED2, *USER_DATA, "data._target_=my_data.pairs", "executor=custom_loop"],
    "user-data-dataset": [
        *MIRRORED2,
        *USER_DATA,
        "data._target_=my_data.pairs_dataset",
        "data.input=from_function",
        "data.num_classes=2",
        "executor=custom_loop",
    ],
    # a user layer with Python `if` on a tensor: the runner's steps must leave AutoGraph on for user code (and fit
    # runs a user's own Keras callback, tests/user_project/my_callbacks.py, beside the runner's)
    **{
        f"user-branchy-{executor}": [
            *MIRRORED2,
            *FAST,
            "model=branchy",
            f"executor={executor}",
            f"hydra.searchpath=[file://{USER / 'conf'}]",
            *([f"executor.callbacks=[{{_target_:my_callbacks.EpochLog,path:{CALLBACK_LOG}}}]"] if executor == "fit" else []),
        ]
        for executor in ("fit", "custom_loop")
    },
}


# a user's callback that raises at the first epoch's end: run beside CASES, in the same pool
FAILING = {"user-callback-raises": [*FAST, "executor.callbacks=[{_target_:my_callbacks.FailsAtEpochEnd}]"]}


@pytest.fixture(scope="module")
def results(runner):
    done = runner.many(
        {name: [*args, f"mlflow.experiment_name={EXPERIMENT}"] for name, args in {**CASES, **FAILING}.items()},
        env_extra={"PYTHONPATH": str(USER)},
    )
    for name, result in done.items():
        assert name in FAILING or result.returncode == 0, f"{name} failed:\n{result.output[-3000:]}"
    return done


def loss_history(runner, name):
    client, run = mlflow_run_by_name(runner.uri, EXPERIMENT, name)
    return run, [m.value for m in sorted(client.get_metric_history(run.info.run_id, "loss/replica_0"), key=lambda m: m.step)]


@pytest.mark.parametrize("name", list(CASES))
def test_each_input_path_trains(results, runner, name):
    run, losses = loss_history(runner, name)
    assert run.info.status == "FINISHED"
    assert losses[-1] < losses[0], losses


def test_guide_example_runs_uneven_batches_on_four_replicas(results, runner):
    """Decided behaviour for a global batch that does not divide by the replicas: allowed, split, and said so."""
    for name in ("guide-fit", "guide-custom_loop"):
        _, run = mlflow_run_by_name(runner.uri, EXPERIMENT, name)
        assert run.data.tags["num_replicas_in_sync"] == "4"
        assert "loss/replica_3" in run.data.metrics
        assert "global_batch_size=10 does not split evenly over 4 replicas: they get 3/3/2/2 examples" in results[name].output
        # Every example is the same (ones), so each shard's mean loss is the batch's loss, whatever its size:
        # a shard loss derived from the replica's share of the global loss (x replicas) would be off by 3/2.5 or 2/2.5.
        client = mlflow_run_by_name(runner.uri, EXPERIMENT, name)[0]
        shards = np.array(
            [
                [m.value for m in sorted(client.get_metric_history(run.info.run_id, f"loss/replica_{i}"), key=lambda m: m.step)]
                for i in range(4)
            ]
        )
        np.testing.assert_allclose(shards, np.broadcast_to(shards[0], shards.shape), rtol=1e-5)


def test_a_users_keras_callback_runs_beside_the_runners_own(results, runner):
    import json

    lines = (runner.root / CALLBACK_LOG).read_text().splitlines()
    epochs = [json.loads(line) for line in lines]
    assert [e["epoch"] for e in epochs] == [0, 1] and all(e["loss"] > 0 for e in epochs)  # FAST: 2 epochs
    _, run = mlflow_run_by_name(runner.uri, EXPERIMENT, "user-branchy-fit")
    assert run.data.params["executor.callbacks"].startswith("[{'_target_': 'my_callbacks.EpochLog'")


def test_digits_cnn_learns(results, runner):
    _, run = mlflow_run_by_name(runner.uri, EXPERIMENT, "digits-cnn")
    assert run.data.metrics["eval/accuracy"] > 0.5  # 10 classes: chance is 0.1


def test_user_model_from_user_config_dir(results, runner):
    import tf_keras

    sys.path.insert(0, str(USER))
    try:
        model = tf_keras.models.load_model(results["user-model"].run_dir / "model.keras", compile=False)
    finally:
        sys.path.remove(str(USER))
    hidden = model.get_layer("user_hidden")
    assert hidden.units == 12  # width from the user's YAML reached the user's function
    _, run = mlflow_run_by_name(runner.uri, EXPERIMENT, "user-model")
    assert run.data.params["model._target_"] == "my_models.tiny"


def test_a_users_own_data_function_trains_as_arrays_and_as_a_dataset_fn(results, runner):
    """data=function from a package outside runner/: its arrays and its dataset_fn give the same training."""
    import tf_keras

    weights = {}
    for name in ("user-data-arrays", "user-data-dataset"):
        _, run = mlflow_run_by_name(runner.uri, EXPERIMENT, name)
        assert run.data.params["data._target_"].startswith("my_data.pairs")
        assert run.data.metrics["eval/accuracy"] > 0.75, run.data.metrics  # a linear boundary: far above chance
        model = tf_keras.models.load_model(results[name].run_dir / "model.keras", compile=False)
        weights[name] = model.get_weights()
    for a, b in zip(weights["user-data-arrays"], weights["user-data-dataset"]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_plain_install_ships_conf_and_runs_from_any_directory(tmp_path):
    """A non-editable install (no source tree on the path) still finds its config through pkg://runner.conf."""
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(target), str(ROOT)],
        check=True,
        timeout=300,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = run_runner(
        ["--cfg", "job", "strategy=central_storage", "model=cnn"],
        cwd=elsewhere,
        run_dir=elsewhere / "out",
        env_extra={"PYTHONPATH": str(target)},
    )
    assert result.returncode == 0, result.output
    assert "name: central_storage" in result.stdout
    assert "_target_: runner.models.cnn" in result.stdout
    assert (target / "runner" / "conf" / "strategy" / "tpu.yaml").is_file()


def test_a_users_callback_that_raises_mid_training_ends_in_one_paragraph_naming_it(results, runner):
    """runner.builders.own_code: exit 6, the key, the target, the error's own line and where in the user's file;
    no traceback; the run FAILED with the error, the checkpoint of the epoch before kept."""
    result = results["user-callback-raises"]
    assert result.returncode == 6, result.output[-3000:]
    assert "Traceback" not in result.output, result.output[-3000:]
    said = "executor.callbacks[0]._target_='my_callbacks.FailsAtEpochEnd' raised during training (after step 8): "
    assert said in result.stderr and "RuntimeError: no room left for epoch 0's log" in result.stderr, result.stderr
    assert f"{USER / 'my_callbacks.py'}, line " in result.stderr
    assert "the latest checkpoint is step 8" in result.stderr and "resume=" in result.stderr
    _, run = mlflow_run_by_name(runner.uri, EXPERIMENT, "user-callback-raises")
    assert run.info.status == "FAILED" and "FailsAtEpochEnd" in run.data.tags.get("error", "")
