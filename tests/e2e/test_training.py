"""Real training on logical CPUs with every strategy x executor that runs here, checked against
the default strategy (same global batch, seed and steps must give the same weights) and read back from MLflow."""

import numpy as np
import pytest

from helpers import FAST, composed, mlflow_run_by_name

pytestmark = pytest.mark.slow  # end to end: trains every strategy through `python -m runner`

STRATEGIES = {
    "default": ["strategy=default"],
    "one_device": ["strategy=one_device"],
    "mirrored2": ["strategy=mirrored", "devices.logical_cpus=2"],
    "mirrored4": ["strategy=mirrored", "devices.logical_cpus=4"],
    "central_storage": ["strategy=central_storage", "devices.logical_cpus=4"],
    "mwms_single": ["strategy=multi_worker_mirrored"],
}
EXECUTORS = ["fit", "custom_loop"]
# gradient accumulation: 4 and 2 micro-batches per update must reach the default strategy's weights (the other rows,
# without it, keep the default path's check; fit under central_storage refuses it)
ACCUMULATION = {("one_device", "fit"): 4, ("one_device", "custom_loop"): 4, ("central_storage", "custom_loop"): 2}
EXPERIMENT = "matrix"
# Every run of the matrix warms up, decays and decays its weights: the equivalence checks below then also prove that
# the schedule follows the global step alike under every strategy and executor.
RECIPE = [
    "train.optimizer.schedule.name=cosine",
    "train.optimizer.schedule.warmup_steps=2",
    "train.optimizer.schedule.final_fraction=0.2",
    "train.optimizer.weight_decay=0.001",
]
# and logs a metric of the user's own (by _target_): a per-example tf_keras metric, so per replica too. Not the
# default strategy's and one_device's rows nor mirrored4's fit: without it their steps run several to a call and each
# step's logs come back with the call (runner.executors.per_call; over several replicas, each replica's in its own
# column of a table), and the replicas' losses below are checked against the default strategy's, both logged a call
# at a time.
METRICS = ["train.metrics=[{_target_:tf_keras.metrics.SparseTopKCategoricalAccuracy,k:2,name:top2}]"]
NO_METRICS = {"default-fit", "default-custom_loop", "mirrored4-fit", "one_device-fit", "one_device-custom_loop"}
OWN_METRIC = {"fit": "mirrored2-fit", "custom_loop": "mirrored4-custom_loop"}  # the runs that log it per replica
# XLA over a whole call of several steps (one replica, in-memory data, each step's logs back with the call): with
# accumulation and the schedule, it must still reach the default strategy's weights. 3 steps a call: an epoch's 8
# steps end with a call of 2, which XLA runs padded to 3.
XLA = {"one_device-fit": "train.steps_per_execution=3", "one_device-custom_loop": "train.steps_per_loop=3"}


@pytest.fixture(scope="module")
def matrix(runner):
    jobs = {
        f"{s}-{e}": [
            *args,
            f"executor={e}",
            *FAST,
            *RECIPE,
            # train.metrics with accumulation under central_storage is refused (runner.builders.metrics)
            *(METRICS if f"{s}-{e}" not in NO_METRICS and (s != "central_storage" or (s, e) not in ACCUMULATION) else []),
            f"train.accumulation_steps={ACCUMULATION.get((s, e), 1)}",
            *(["train.jit_compile=true", XLA[f"{s}-{e}"]] if f"{s}-{e}" in XLA else []),
            f"mlflow.experiment_name={EXPERIMENT}",
        ]
        for s, args in STRATEGIES.items()
        for e in EXECUTORS
    }
    done = runner.many(jobs)
    for name, result in done.items():
        assert result.returncode == 0, f"{name} failed:\n{result.output[-3000:]}"
    return done


def weights(run_dir):
    import tf_keras

    return tf_keras.models.load_model(run_dir / "model.keras", compile=False).get_weights()


def history(runner, name, key):
    client, run = mlflow_run_by_name(runner.uri, EXPERIMENT, name)
    return [m.value for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)]


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_training_lowers_the_loss(matrix, runner, strategy, executor):
    losses = history(runner, f"{strategy}-{executor}", "loss/replica_0")
    assert len(losses) == 16  # 2 epochs x 512 // 64 steps, logged every step
    assert losses[-1] < 0.8 * losses[0], losses
    if f"{strategy}-{executor}" in XLA:
        assert (
            "(3 per tf.function call), global batch 64 over 1 replica(s), 4 micro-batches per update, XLA: each call "
            "compiled whole" in matrix[f"{strategy}-{executor}"].output
        )
    elif f"{strategy}-{executor}" in NO_METRICS:  # 4 steps a call (auto), each logged: they came back with their call
        assert "(4 per tf.function call, auto)" in matrix[f"{strategy}-{executor}"].output


GUIDE_NAMES = {
    "default": "default strategy",
    "one_device": "OneDeviceStrategy",
    "mirrored2": "MirroredStrategy",
    "mirrored4": "MirroredStrategy",
    "central_storage": "CentralStorageStrategy",
    "mwms_single": "MultiWorkerMirroredStrategy",
}


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_logs_and_tags_name_the_strategy_as_the_guide_does(matrix, runner, strategy):
    output = matrix[f"{strategy}-fit"].output
    assert f"] {GUIDE_NAMES[strategy]} with " in output, output[-2000:]  # not _DefaultDistributionStrategy
    _, run = mlflow_run_by_name(runner.uri, EXPERIMENT, f"{strategy}-fit")
    assert run.data.tags["strategy"] == GUIDE_NAMES[strategy]


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("strategy", ["mirrored4", "central_storage", "one_device", "mwms_single"])
def test_distributed_weights_equal_the_default_strategy(matrix, strategy, executor):
    reference = weights(matrix[f"default-{executor}"].run_dir)
    got = weights(matrix[f"{strategy}-{executor}"].run_dir)
    assert len(got) == len(reference)
    for a, b in zip(got, reference):
        assert np.max(np.abs(a - b)) <= 1e-5 * np.max(np.abs(b)), np.max(np.abs(a - b))


def test_fit_and_custom_loop_reach_the_same_weights(matrix):
    """Model.fit's mean loss and the guide's compute_average_loss over the global batch are the same objective."""
    for a, b in zip(weights(matrix["mirrored4-fit"].run_dir), weights(matrix["mirrored4-custom_loop"].run_dir)):
        assert np.max(np.abs(a - b)) <= 1e-5 * np.max(np.abs(b))


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("strategy", ["mirrored4", "central_storage"])
def test_replica_losses_average_to_the_single_replica_loss(matrix, runner, strategy, executor):
    """The 4 shards of a global batch, averaged, give the loss the default strategy computed on the whole batch (its
    steps 4 to a call, each step's loss logged after its call; the 4 replicas' the same under mirrored's fit, a call
    per logged step in the other runs)."""
    name = f"{strategy}-{executor}"
    shards = np.array([history(runner, name, f"loss/replica_{i}") for i in range(4)])
    whole = np.array(history(runner, f"default-{executor}", "loss/replica_0"))
    assert not np.allclose(shards[0], shards[1])  # the shards really differ
    np.testing.assert_allclose(shards.mean(axis=0), whole, rtol=1e-4)


def test_fit_over_replicas_logs_each_steps_loss_and_accuracy_of_the_whole_batch(matrix, runner):
    """mirrored4's fit runs 4 steps a call and sums each replica's metric totals and counts after it (no merge in
    the step): each step's epoch-mean loss and accuracy are the default strategy's, computed by Keras' own result()."""
    for key in ["loss", "accuracy"]:
        got, want = history(runner, "mirrored4-fit", key), history(runner, "default-fit", key)
        assert len(got) == 16
        np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=key)


def test_mlflow_run_holds_params_tags_and_metrics(matrix, runner):
    client, run = mlflow_run_by_name(runner.uri, EXPERIMENT, "mirrored4-custom_loop")
    assert run.info.status == "FINISHED"
    params, tags, metrics = run.data.params, run.data.tags, run.data.metrics
    assert params["strategy.name"] == "mirrored"
    assert params["executor.name"] == "custom_loop"
    assert params["train.global_batch_size"] == "64"
    assert params["devices.logical_cpus"] == "4"
    assert tags["strategy"] == "MirroredStrategy"
    assert tags["num_replicas_in_sync"] == "4"
    assert tags["devices"].count("CPU") == 4
    assert tags["tensorflow_version"].startswith("2.21")
    for i in range(4):
        assert f"loss/replica_{i}" in metrics
    assert "loss/replica_4" not in metrics
    for key in [
        "loss",
        "eval/loss",
        "eval/accuracy",
        "throughput/window_examples_per_sec",
        "throughput/window_examples_per_sec_per_replica",
        "throughput/window_step_time_ms",
        "time/first_step_sec",
        "summary/examples_per_sec",
    ]:
        assert key in metrics, key
    window = "throughput/window_examples_per_sec"
    assert metrics[window] == pytest.approx(4 * metrics[window + "_per_replica"])
    assert 0 < metrics["eval/accuracy"] <= 1
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "overrides.txt", "model"} <= artifacts
    assert [a.path for a in client.list_artifacts(run.info.run_id, "model")] == ["model/model.keras"]
    config = client.download_artifacts(run.info.run_id, "config.yaml")
    assert "name: mirrored" in open(config).read()


@pytest.mark.parametrize("executor", EXECUTORS)
def test_the_logged_learning_rate_follows_the_schedule(matrix, runner, executor):
    """train/learning_rate at each logged step is the rate of that step's update (the formula checked against
    tf_keras' updates in tests/unit/builders/test_optimizer.py)."""
    from runner.builders.optimizer import learning_rate

    cfg = composed(*FAST, *RECIPE).train.optimizer
    rates = history(runner, f"mirrored4-{executor}", "train/learning_rate")
    assert rates == pytest.approx([learning_rate(cfg, step - 1, 16) for step in range(1, 17)], rel=1e-6)
    assert rates[0] == 0 and max(rates) == pytest.approx(0.3) and rates[-1] < 0.3  # warmed up, then decayed


@pytest.mark.parametrize("executor", EXECUTORS)
def test_own_metric_is_logged_per_split_and_per_replica(matrix, runner, executor):
    """train.metrics' top2 on the training batches (each epoch's running mean, as Model.fit logs it) is the same under
    every strategy, and its per-replica means over the equal shards average to it."""
    name = OWN_METRIC[executor]
    whole = history(runner, name, "top2")
    replicas = int(name[len("mirrored")])  # mirrored2 or mirrored4
    shards = np.array([history(runner, name, f"top2/replica_{i}") for i in range(replicas)])
    assert len(whole) == 16 and not np.allclose(shards[0], shards[1])  # logged every step; the shards really differ
    np.testing.assert_allclose(shards.mean(axis=0), whole, rtol=1e-6)
    for strategy in ["mwms_single", *(["central_storage"] if executor == "fit" else [])]:
        np.testing.assert_allclose(history(runner, f"{strategy}-{executor}", "top2"), whole, atol=1e-6, err_msg=strategy)
    _, run = mlflow_run_by_name(runner.uri, EXPERIMENT, "central_storage-fit")
    assert "top2/replica_0" not in run.data.metrics  # one copy of each metric variable there: no replica's own


def test_own_metric_on_the_eval_split_is_what_numpy_computes_from_the_saved_model(matrix, runner):
    from runner.sources import in_memory

    arrays = in_memory.load(composed(*FAST).data)
    for name in ["mwms_single-fit", "mirrored4-custom_loop", "central_storage-fit"]:
        import tf_keras

        model = tf_keras.models.load_model(matrix[name].run_dir / "model.keras", compile=False)
        logits = model.predict(arrays.x_eval, verbose=0)
        ahead = (logits > logits[np.arange(len(logits)), arrays.y_eval.astype(int)][:, None]).sum(axis=1)
        _, run = mlflow_run_by_name(runner.uri, EXPERIMENT, name)
        assert run.data.metrics["eval/top2"] == pytest.approx(np.mean(ahead < 2), abs=1e-6), name
