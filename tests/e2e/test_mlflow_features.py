"""What a run leaves in MLflow besides its metrics (issue 19): system metrics, the datasets it trained and evaluated on,
and the trained model as an MLflow model that pyfunc loads, `mlflow models serve` serves and the registry versions.

Two real runs of the runner (seeds 1 and 2, registered under one name) feed every test here.
"""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from helpers import free_port, serve_and_predict

pytestmark = pytest.mark.slow  # real runner runs, then TensorFlow loads the model in other processes

NAME = "issue19-mlp"
TWO_STEPS = ["train.epochs=1", "train.steps_per_epoch=2", "mlflow.system_metrics_every_sec=1", f"mlflow.register_as={NAME}"]


@pytest.fixture(scope="module")
def runs(runner, store, tmp_path_factory):
    """Seeds 1 and 2, one after the other (the registry's versions 1 and 2 are theirs, in order); beside the first, a
    run whose registry refuses (MLFLOW_REGISTRY_URI: a registry apart from the tracking store, here not a database),
    with system metrics off."""
    from mlflow import MlflowClient

    bad = tmp_path_factory.mktemp("registry") / "registry.db"
    bad.write_text("not a database\n")
    refused = [*TWO_STEPS[:2], "mlflow.register_as=refused", "mlflow.system_metrics=false"]
    with ThreadPoolExecutor(max_workers=1) as pool:
        other = pool.submit(runner, "features-refused", refused, env_extra={"MLFLOW_REGISTRY_URI": f"sqlite:///{bad}"})
        done = {seed: runner(f"features-seed{seed}", [*TWO_STEPS, f"data.seed={seed}"]) for seed in (1, 2)}
        done["refused"] = other.result()
    client = MlflowClient(store[1])
    out = {}
    for key, completed in done.items():
        assert completed.returncode == (1 if key == "refused" else 0), completed.output[-3000:]
        run_id = (completed.run_dir / "mlflow_run_id").read_text().strip()
        out[key] = (completed, client.get_run(run_id))
    return client, out


def test_system_metrics_are_logged_for_the_run(runs):
    client, out = runs
    for done, run in (out[1], out[2]):
        assert run.info.status == "FINISHED"
        points = client.get_metric_history(run.info.run_id, "system/cpu_utilization_percentage")
        assert points, sorted(run.data.metrics)
        assert {"system/system_memory_usage_megabytes", "system/disk_usage_percentage"} <= set(run.data.metrics)
        assert "Traceback" not in done.stderr


def test_train_and_eval_datasets_are_inputs_and_the_digest_follows_the_data(runs):
    _, out = runs
    digests = {}
    for seed, (_, run) in ((1, out[1]), (2, out[2])):
        by_context = {
            [t.value for t in d.tags if t.key == "mlflow.data.context"][0]: d.dataset for d in run.inputs.dataset_inputs
        }
        assert set(by_context) == {"train", "eval"}
        train = by_context["train"]
        assert train.name == "synthetic-train" and json.loads(train.profile)["num_rows"] > 0
        assert "mlflow_tensorspec" in json.loads(train.schema)
        assert json.loads(train.source)["tags"]["data.seed"] == str(seed)
        digests[seed] = (train.digest, by_context["eval"].digest)
    assert digests[1][0] != digests[2][0] and digests[1][1] != digests[2][1]


def test_registering_twice_gives_versions_1_and_2(runs):
    client, out = runs
    versions = {str(v.version): v.run_id for v in client.search_model_versions(f"name = '{NAME}'")}
    assert versions == {"1": out[1][1].info.run_id, "2": out[2][1].info.run_id}
    assert out[2][1].data.tags["registered_model"] == f"{NAME}/2"


# The logged model, loaded in other processes (TensorFlow stays out of pytest's).
COMPARE = """
import json, os, sys
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import mlflow, numpy as np, tf_keras
model_uri, keras_path = sys.argv[1:3]
x = np.random.default_rng(0).standard_normal((5, 20)).astype(np.float32)
pyfunc = mlflow.pyfunc.load_model(model_uri)
direct = tf_keras.models.load_model(keras_path, compile=False)(x).numpy()
print(json.dumps({"x": x.tolist(), "pyfunc": np.asarray(pyfunc.predict(x)).tolist(), "direct": direct.tolist(),
                  "signature": str(pyfunc.metadata.signature.inputs)}))
"""


def _env(uri):
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])  # uvicorn: the venv's, as activated
    return {**os.environ, "MLFLOW_TRACKING_URI": uri, "TF_CPP_MIN_LOG_LEVEL": "3", "PATH": path}


@pytest.fixture(scope="module")
def predictions(runs, store):
    _, out = runs
    done, _ = out[1]
    proc = subprocess.run(
        [sys.executable, "-c", COMPARE, f"models:/{NAME}/1", str(done.run_dir / "model.keras")],
        env=_env(store[1]),
        capture_output=True,
        text=True,
        timeout=180,
        cwd=store[0],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_logged_model_loads_through_pyfunc_and_predicts_as_the_keras_file(predictions):
    import numpy as np

    assert np.allclose(predictions["pyfunc"], predictions["direct"], rtol=0, atol=1e-6)
    assert "float32" in predictions["signature"] and "20" in predictions["signature"]


def test_mlflow_models_serve_answers_a_request(predictions, store, tmp_path):
    import numpy as np

    argv = [sys.executable, "-m", "mlflow", "models", "serve", "-m", f"models:/{NAME}/1", "--env-manager", "local",
            "-h", "127.0.0.1", "-p", str(free_port()), "-w", "1"]  # fmt: skip
    answer, left = serve_and_predict(argv, store[0], _env(store[1]), predictions["x"], tmp_path / "serve.log")
    assert np.allclose(answer["predictions"], predictions["direct"], rtol=0, atol=1e-5)
    assert not left, f"mlflow models serve left processes behind: {left}"


def test_a_registry_that_refuses_fails_the_run_readably(runs):
    """mlflow.register_as asked of a registry that cannot take it: exit 1, one message, the run FAILED; and with
    mlflow.system_metrics=false no system metrics."""
    _, out = runs
    done, run = out["refused"]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "mlflow.register_as=refused" in done.stderr and "registering it as 'refused' failed" in done.stderr
    assert run.info.status == "FAILED"
    assert not any(k.startswith("system/") for k in run.data.metrics)
    assert run.inputs.dataset_inputs  # datasets are logged either way
