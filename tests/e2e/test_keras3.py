"""A user's Keras 3 model (`import keras`, tests/user_project/my_models.py:keras3_mlp) trained with the custom loop
under every strategy that takes one, and with Keras 3's own fit under default, one_device, mirrored and
central_storage, checked against the default strategy's weights (same global batch, seed and steps), with a warm-up,
a linear decay, weight decay, gradient accumulation and the user's own loss, metric and optimizer (by `_target_`);
fit also resumed inside an epoch, with uneven replica batches and with the best checkpoint kept; the combinations the
runner refuses (README's "Keras 3 models" table) refused in one paragraph before the first step."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from helpers import FAST, assert_refused_run_deleted, composed, mlflow_run_by_name, run_runner

pytestmark = pytest.mark.slow  # end to end: trains through `python -m runner`

USER = pathlib.Path(__file__).resolve().parents[1] / "user_project"
EXPERIMENT = "keras3"
EPOCH_LOG = "keras3_epochs.jsonl"  # a user's Keras 3 callback's file, in the runner's working directory
KERAS3 = [
    "model._target_=my_models.keras3_mlp",
    "executor=custom_loop",
    *FAST,
    # the schedule the runner writes itself for Keras 3 (runner.builders.lr_schedule), and decoupled weight decay
    "train.optimizer.schedule.name=linear",
    "train.optimizer.schedule.warmup_steps=2",
    "train.optimizer.schedule.final_fraction=0.2",
    "train.optimizer.weight_decay=0.001",
    # the user's own loss and optimizer (by _target_) in every row: README's Keras 3 command runs the built-ins
    "train.loss={_target_:my_losses.smoothed_crossentropy,smoothing:0.1}",
    "train.optimizer._target_=keras.optimizers.SGD",
    "train.optimizer.kwargs={momentum:0.5,nesterov:true}",
    # and a metric of the user's own: a per-example function (tf_keras' mean of it, for a Keras 3 model too)
    "train.metrics=[{_target_:my_metrics.true_class_probability}]",
    f"mlflow.experiment_name={EXPERIMENT}",
]
SINGLE = {  # one process each, two at a time
    "default": ["strategy=default"],
    "one_device": ["strategy=one_device"],
    "mirrored4": ["strategy=mirrored", "devices.logical_cpus=4"],  # 64 = 16 per replica
    # train.metrics with accumulation is refused under central_storage (runner.builders.metrics): without them here
    "central_storage": ["strategy=central_storage", "devices.logical_cpus=4", "train.accumulation_steps=2", "train.metrics=[]"],
}
FIT = {  # executor=fit, Keras 3's own (runner.executors.keras3_fit): run two at a time with SINGLE
    # 62 over 4 replicas below: batches of 16, 16, 15 and 15 (Keras 3's own fit fails there: AddN shape mismatch)
    "fit_default": ["executor=fit", "strategy=default", "train.global_batch_size=62"],
    "fit_mirrored4": [
        "executor=fit",
        "strategy=mirrored",
        "devices.logical_cpus=4",
        "train.global_batch_size=62",
        "checkpoint.keep_best=true",  # evaluated after each epoch: the best checkpoint kept, and restored at the end
        "checkpoint.restore_best=true",  # (the last epoch's: eval/loss falls over these 2 epochs)
        f"executor.callbacks=[{{_target_:my_keras3_callbacks.EpochLog,path:{EPOCH_LOG}}}]",
    ],
    # accumulation with fit is refused under central_storage for either Keras (runner.config.validate); 3 epochs with
    # the 2-epoch schedule, stopped early after the second (eval/loss does not fall by 10): the 16 steps of the others
    "fit_central_storage": [
        "executor=fit",
        "strategy=central_storage",
        "devices.logical_cpus=4",
        "train.epochs=3",
        "train.optimizer.schedule.decay_steps=14",
        "train.early_stopping.patience=1",
        "train.early_stopping.min_delta=10",
    ],
    # 12 steps in one epoch (decaying over the 14 steps after the warm-up of 2 epochs of 8), then resumed below with
    # epochs of 8: inside the second epoch, which Keras 3's fit cannot start in (runner.executors.fit._fit_calls)
    "fit_one_device": [
        "executor=fit",
        "strategy=one_device",
        "train.epochs=1",
        "train.steps_per_epoch=12",
        "train.optimizer.schedule.decay_steps=14",
    ],
}
RESUMED = ["train.epochs=2", "train.steps_per_epoch=null"]  # with resume=<fit_one_device's directory>
CLUSTERS = {  # a cluster of processes uses both cores: one at a time
    "mwms2": ["strategy=multi_worker_mirrored", "cluster=localhost", "cluster.workers=2", "cross_device_ops=ring"],
}
ENV = {"PYTHONPATH": str(USER)}


@pytest.fixture(scope="module")
def runs(runner):
    (runner.root / EPOCH_LOG).unlink(missing_ok=True)
    done = runner.many({name: [*KERAS3, *args] for name, args in {**SINGLE, **FIT}.items()}, env_extra=ENV)
    assert done["fit_one_device"].returncode == 0, done["fit_one_device"].output[-3000:]
    run_dir = done["fit_one_device"].run_dir
    done["fit_resumed"] = run_runner(
        [*RESUMED, f"resume={run_dir}"], cwd=runner.root, run_dir=run_dir, tracking_uri=runner.uri, env_extra=ENV
    )
    for name, args in CLUSTERS.items():
        done[name] = runner(name, [*KERAS3, *args], env_extra=ENV)
    for name, result in done.items():
        assert result.returncode == 0, f"{name} failed:\n{result.output[-3000:]}"
    return done


def weights(path):
    import keras

    return keras.models.load_model(path, compile=False).get_weights()


@pytest.mark.parametrize("strategy", ["one_device", "mirrored4", "central_storage", "mwms2"])
def test_keras3_weights_equal_the_default_strategy(runs, strategy):
    reference = weights(runs["default"].run_dir / "model.keras")
    run_dir = runs[strategy].run_dir
    got = weights(run_dir / "worker-0" / "model.keras" if strategy in CLUSTERS else run_dir / "model.keras")
    assert len(got) == len(reference) > 0
    for a, b in zip(got, reference):
        assert np.max(np.abs(a - b)) <= 1e-5 * np.max(np.abs(b)), np.max(np.abs(a - b))


def close(got, reference):
    assert len(got) == len(reference) > 0
    for a, b in zip(got, reference):
        assert np.max(np.abs(a - b)) <= 1e-5 * np.max(np.abs(b)), np.max(np.abs(a - b))


@pytest.mark.parametrize(
    "row, against",
    [
        ("fit_central_storage", "default"),  # against the custom loop's
        ("fit_resumed", "default"),  # one_device, stopped at step 12 and resumed inside the epoch
        ("fit_mirrored4", "fit_default"),  # uneven replica batches: against one device's fit with the same batch
    ],
)
def test_keras3_fit_weights_equal_the_default_strategys(runs, row, against):
    run_dir = runs["fit_one_device"].run_dir if row == "fit_resumed" else runs[row].run_dir
    close(weights(run_dir / "model.keras"), weights(runs[against].run_dir / "model.keras"))


def test_keras3_fit_logs_replicas_keeps_the_best_stops_early_and_runs_the_users_keras3_callback(runs, runner):
    """Keras 3's fit: each replica's loss and metric logged, the evaluations the same as one device's with the same
    global batch, the best checkpoint kept and restored, a user's Keras 3 callback called once per epoch, early
    stopping after the second of 3 epochs; resumed, fit went on from step 12 in the same MLflow run."""
    import json

    client, run = mlflow_run_by_name(runner.uri, EXPERIMENT, "fit_mirrored4")
    _, one = mlflow_run_by_name(runner.uri, EXPERIMENT, "fit_default")
    assert run.info.status == "FINISHED" and run.data.tags["keras_version"].startswith("3.")
    names = {f"loss/replica_{i}" for i in range(4)} | {f"true_class_probability/replica_{i}" for i in range(4)}
    assert names <= set(run.data.metrics)
    losses = [m.value for m in client.get_metric_history(run.info.run_id, "loss")]
    assert len(losses) == 16 and all(np.isfinite(losses))
    for key in ["eval/loss", "eval/true_class_probability", "loss"]:
        assert run.data.metrics[key] == pytest.approx(one.data.metrics[key], rel=1e-5), key
    assert run.data.metrics["best/step"] == 16.0
    best = runs["fit_mirrored4"].run_dir / "checkpoints"
    assert (best / "best.json").exists() and (best / "best").is_dir()
    epochs = [json.loads(line) for line in (runner.root / EPOCH_LOG).read_text().splitlines()]
    assert [e["epoch"] for e in epochs] == [0, 1] and all(np.isfinite(e["loss"]) for e in epochs)
    stopped = runs["fit_central_storage"].output
    assert "early stopping at step 16" in stopped and "done: 16 steps" in stopped, stopped[-3000:]
    client, resumed = mlflow_run_by_name(runner.uri, EXPERIMENT, "fit_one_device")
    assert resumed.info.status == "FINISHED"
    steps = sorted(m.step for m in client.get_metric_history(resumed.info.run_id, "loss"))
    assert steps == list(range(1, 17))  # 12 in the first run, 13-16 resumed: no step twice, none missing


def test_keras3_run_is_tagged_and_logs_the_schedule(runs, runner):
    client, run = mlflow_run_by_name(runner.uri, EXPERIMENT, "mirrored4")
    assert run.info.status == "FINISHED"
    assert run.data.tags["keras_version"].startswith("3.")
    assert {f"loss/replica_{i}" for i in range(4)} <= set(run.data.metrics)
    rates = [m.value for m in sorted(client.get_metric_history(run.info.run_id, "train/learning_rate"), key=lambda m: m.step)]
    assert rates[:3] == pytest.approx([0.0, 0.15, 0.3])  # the rate each step's update used: a warm-up over 2 steps
    assert rates[-1] == pytest.approx(0.3 * (0.2 + 0.8 * (1 - 13 / 14)))  # then the linear decay, at step 16


def test_keras3_own_metric_per_split_per_replica_and_across_workers(runs, runner):
    """The user's metric on the training batches is the same in every row (two workers read it with a collective at
    the same steps), its per-replica means average to it, and its eval value is NumPy's on the saved model."""
    from runner.sources import in_memory

    def of(name, key="true_class_probability"):
        client, run = mlflow_run_by_name(runner.uri, EXPERIMENT, name)
        return run, [m.value for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)]

    reference, whole = of("default")
    assert len(whole) == 16
    for name in ["mirrored4", "mwms2"]:
        run, got = of(name)
        np.testing.assert_allclose(got, whole, rtol=1e-5, err_msg=name)
        assert run.data.metrics["eval/true_class_probability"] == pytest.approx(
            reference.data.metrics["eval/true_class_probability"], rel=1e-5
        )
    shards = np.array([of("mirrored4", f"true_class_probability/replica_{i}")[1] for i in range(4)])
    np.testing.assert_allclose(shards.mean(axis=0), whole, rtol=1e-5)
    arrays = in_memory.load(composed(*FAST).data)
    import keras

    model = keras.models.load_model(runs["default"].run_dir / "model.keras", compile=False)
    logits = np.asarray(model(arrays.x_eval))
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    expected = p[np.arange(len(p)), arrays.y_eval.astype(int)].mean()
    assert reference.data.metrics["eval/true_class_probability"] == pytest.approx(expected, rel=1e-5)


LOAD = """
import json, sys
import keras, mlflow, numpy as np
model_uri, keras_path = sys.argv[1:3]
x = np.random.default_rng(0).standard_normal((3, 20)).astype(np.float32)
pyfunc = mlflow.pyfunc.load_model(model_uri)
direct = keras.models.load_model(keras_path, compile=False)(x).numpy()
print(json.dumps({"pyfunc": np.asarray(pyfunc.predict(x)).tolist(), "direct": direct.tolist()}))
"""


def test_the_logged_keras3_model_loads_and_predicts_like_the_saved_one(runs, runner):
    """The MLflow model (runner.mlflow_process.model) reads a Keras 3 file with Keras 3, which tf_keras cannot."""
    _, run = mlflow_run_by_name(runner.uri, EXPERIMENT, "default")
    env = {**os.environ, "MLFLOW_TRACKING_URI": runner.uri, "TF_CPP_MIN_LOG_LEVEL": "3"}
    argv = [sys.executable, "-c", LOAD, run.data.tags["mlflow_model"], str(runs["default"].run_dir / "model.keras")]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(got["pyfunc"], got["direct"], rtol=1e-6)


@pytest.mark.parametrize(
    "case, args, says",
    [
        (
            "clipnorm",
            ["strategy=mirrored", "devices.logical_cpus=2", "train.optimizer.clipnorm=1.0"],
            ["with train.optimizer.clipnorm=1.0 over 2 replicas:", "before it sums them"],
        ),
    ],
)
def test_keras3_refusals_end_the_command_with_exit_2_before_training(runner, case, args, says):
    result = runner(f"refused-{case}", [*KERAS3, *args], env_extra=ENV)
    assert result.returncode == 2, result.output[-3000:]
    assert all(s in result.output for s in says) and "Traceback" not in result.output, result.output[-3000:]
    assert "epoch 1/" not in result.output and not (result.run_dir / "checkpoints").exists()
    assert_refused_run_deleted(runner.uri, EXPERIMENT, f"refused-{case}", result, says[0])


def test_keras3_fit_under_multi_worker_mirrored_is_refused_before_training(runner):
    mwms = [*CLUSTERS["mwms2"], "executor=fit"]
    result = runner("fit-mwms", [*KERAS3, *mwms], env_extra=ENV)
    assert result.returncode == 2, result.output[-3000:]
    said = ["with executor=fit under strategy=multi_worker_mirrored:", "keras-team/keras#20585", "Use executor=custom_loop"]
    assert all(s in result.output for s in said) and "Traceback" not in result.output, result.output[-3000:]
    assert "epoch 1/" not in result.output
    # the launcher's run, which the chief attached to, trained nothing: deleted by the launcher, which created it
    assert_refused_run_deleted(runner.uri, EXPERIMENT, "fit-mwms", result, "refused the configuration (exit code 2")


def test_keras3_under_parameter_server_is_refused_before_training(runner):
    ps = ["strategy=parameter_server", "cluster=localhost", "cluster.workers=1", "cluster.ps=1"]
    result = runner("ps", [*KERAS3, *ps], env_extra=ENV)
    assert result.returncode == 2, result.output[-3000:]
    assert "returned a Keras 3 model" in result.output and "with strategy=parameter_server:" in result.output
    assert "Use strategy=multi_worker_mirrored" in result.output and "Traceback" not in result.output
    assert "task chief:0 refused the configuration (exit code 2" in result.output  # the launcher: not a lost task (3)
    # the launcher's run, which the chief attached to, trained nothing: deleted by the launcher, which created it
    assert_refused_run_deleted(runner.uri, EXPERIMENT, "ps", result, "task chief:0 refused the configuration (exit code 2")
