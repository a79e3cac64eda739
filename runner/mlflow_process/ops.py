"""The MLflow process's larger ops (runner.mlflow_process.process's `Calls`): datasets, the logged model, system metrics.

Runs only in the MLflow process: it imports mlflow, never TensorFlow. The training process sends plain values.
"""

import importlib.metadata
import json
import logging
import os
import threading
import warnings

log = logging.getLogger("runner")
MODEL_CODE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "model.py")  # copied into the model
# The logged model's name in the run (the Logged models tab). Not "model": the run's model.keras is at the artifact
# path model/, and MLflow lists a logged model's files under its name too (and looks that model up in the default
# store, not the run's: MlflowClient(uri).list_artifacts(run, "model") failed with "Logged model ... not found").
MODEL_NAME = "pyfunc_model"
STOP_WAIT_SEC = 5.0  # a monitor stuck on an unreachable server is left behind after this


# --- datasets ---------------------------------------------------------------------------------------------------
def _tensor_schema(spec: dict):
    import numpy as np
    from mlflow.types.schema import Schema, TensorSpec

    return Schema([TensorSpec(np.dtype(spec["dtype"]), (-1, *spec["shape"]))])


def dataset_inputs(datasets: list) -> list:
    """runner.sources.description's dicts -> DatasetInputs tagged with their context (train / eval)."""
    from mlflow.data.schema import TensorDatasetSchema
    from mlflow.entities import Dataset, DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    out = []
    for d in datasets:
        schema = TensorDatasetSchema(features=_tensor_schema(d["features"]), targets=_tensor_schema(d["targets"]))
        entity = Dataset(
            name=d["name"],
            digest=d["digest"],
            source_type=d["source_type"],
            source=json.dumps(d["source"]),
            schema=json.dumps(schema.to_dict()),
            profile=json.dumps(d["profile"]),
        )
        out.append(DatasetInput(entity, tags=[InputTag(MLFLOW_DATASET_CONTEXT, d["context"])]))
    return out


# --- the model --------------------------------------------------------------------------------------------------
def warm_up() -> None:
    """While the run trains, do what logging the model does once per process: import mlflow.pyfunc and its models
    (1-2 s), and map every installed module to its package for MLflow's check of the model's requirements against
    this environment (it reads every installed package's file list: 1-4 s here). Both would otherwise come after the
    last step, on the user's clock."""
    import mlflow.models  # noqa: F401
    import mlflow.pyfunc  # noqa: F401
    from mlflow.types.schema import Schema  # noqa: F401
    from mlflow.utils.requirements_utils import warn_dependency_requirement_mismatches

    warn_dependency_requirement_mismatches(_requirements())  # pinned to what is installed: it only builds the map


class _Pyfunc:
    """mlflow.pyfunc as Model.log's flavor, minus its serving check of the input example: that check loads the model,
    and TensorFlow with it, in this process (4-8 s at the end of every run). tests/e2e/test_mlflow_features.py loads and
    serves the logged model instead."""

    __name__ = "mlflow.pyfunc"

    @staticmethod
    def save_model(validate_serving_input=None, **kwargs):
        import mlflow.pyfunc

        return mlflow.pyfunc.save_model(**kwargs)


def _requirements() -> list[str]:
    """What loading the model needs, pinned to what trained it (read from package metadata: nothing is imported)."""
    out = []
    for name in ("mlflow", "tensorflow", "tf_keras", "keras", "numpy"):
        try:
            out.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            out.append(name)
    return out


def log_keras_model(uri, run_id, keras_path, inputs, outputs, example, register_as=None) -> dict:
    """Log `keras_path` as the run's MLflow model "model" (pyfunc, runner.mlflow_process.model) with a tensor signature and
    an input example; register it as a new version of `register_as` when given. Raises RuntimeError saying which
    step failed."""
    import mlflow
    import numpy as np
    from mlflow.entities import LoggedModelOutput
    from mlflow.models import Model, ModelSignature

    mlflow.set_tracking_uri(uri)  # Model.log's own client (the MLflow process has it as $MLFLOW_TRACKING_URI too)
    client = mlflow.MlflowClient(uri)
    try:
        experiment_id = client.get_run(run_id).info.experiment_id
        # The logged model is created here, with its source run, rather than by Model.log(run_id=...): that would also
        # re-read every metric's whole history to copy step 0's values onto the model (seconds on a long run).
        model = client.create_logged_model(experiment_id, name=MODEL_NAME, source_run_id=run_id)
        signature = ModelSignature(inputs=_tensor_schema(inputs), outputs=_tensor_schema(outputs))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # MLflow's advice on type hints and on conda environments
            info = Model.log(
                None,
                name=MODEL_NAME,
                flavor=_Pyfunc,
                flavor_name="pyfunc.ModelFromCode",
                model_id=model.model_id,
                python_model=MODEL_CODE,
                artifacts={"keras_model": keras_path},
                signature=signature,
                input_example=np.asarray(example, dtype=inputs["dtype"]),
                pip_requirements=_requirements(),
                validate_serving_input=False,
            )
        client.log_outputs(run_id, [LoggedModelOutput(model.model_id, step=0)])
    except Exception as err:
        raise RuntimeError(f"the model could not be logged as an MLflow model ({_first_line(err)})") from None
    result = {"model_uri": info.model_uri, "model_id": model.model_id, "version": None}
    if register_as:
        try:
            version = _register(client, register_as, info.model_uri, run_id, model.model_id)
        except Exception as err:
            raise RuntimeError(
                f"the model was logged ({info.model_uri}) but registering it as {register_as!r} failed ({_first_line(err)})"
            ) from None
        result["version"] = str(version.version)
    return result


def _register(client, name: str, model_uri: str, run_id: str, model_id: str):
    """A new version of registered model `name` (created if new): what mlflow.register_model does, without its prints
    on stderr."""
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(name)
    except MlflowException as err:
        if err.error_code not in ("RESOURCE_ALREADY_EXISTS", "ALREADY_EXISTS"):
            raise
    version = client.create_model_version(name, model_uri, run_id=run_id, model_id=model_id, await_creation_for=0)
    # the logged model's page links to its versions through this tag, as mlflow.register_model sets it
    client.set_logged_model_tags(model_id, {"mlflow.modelVersions": json.dumps([{"name": name, "version": version.version}])})
    return version


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return (text.splitlines()[0] if text else type(err).__name__)[:300]


# --- system metrics ---------------------------------------------------------------------------------------------
class SystemMetrics:
    """MLflow's SystemMetricsMonitor on a run this process did not start with `mlflow.start_run` (the client API made
    it): constructed and started in a thread of its own, so that starting the run does not wait for it."""

    def __init__(self, uri: str, run_id: str, every_sec: float, resumed: bool):
        self.monitor = None
        self._lock, self._said = threading.Lock(), False  # one line at most about the last point, whoever says it
        self._started = threading.Thread(
            target=self._start, args=(uri, run_id, every_sec, resumed), name="system-metrics-start", daemon=True
        )
        self._started.start()

    def _start(self, uri, run_id, every_sec, resumed) -> None:
        from runner.control import priority

        priority.lower_this_thread(priority.BACKGROUND)  # and MLflow's sampling thread, started from this one
        try:
            import psutil  # noqa: F401  (what MLflow's CPU, memory, disk and network monitors read)
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
        except ImportError as err:
            log.warning(
                "system metrics are off for this run: MLflow needs psutil for them (%s). Install it "
                "(`pip install psutil`), or set mlflow.system_metrics=false.",
                err,
            )
            return
        try:
            monitor = SystemMetricsMonitor(run_id, sampling_interval=every_sec, resume_logging=resumed, tracking_uri=uri)
            monitor.start()
        except Exception as err:
            log.warning("system metrics are off for this run (%s)", _first_line(err))
            return
        self.monitor = monitor

    def stop(self) -> int:
        """Stop sampling; what was sampled since the last point (a run shorter than one period: everything) is logged
        as a last point. Returns the number of points logged."""
        self._started.join(STOP_WAIT_SEC)
        monitor = self.monitor
        if monitor is None:
            return 0
        stopper = threading.Thread(target=self._finish, args=(monitor,), name="system-metrics-stop", daemon=True)
        stopper.start()
        stopper.join(STOP_WAIT_SEC)
        if stopper.is_alive():
            self._once("system metrics: the last point was not logged within %.0fs; left behind", STOP_WAIT_SEC)
        return getattr(monitor, "_logging_step", 0)

    def _finish(self, monitor) -> None:
        try:
            monitor.finish()  # stops its thread and flushes the points it has
            if any(m.metrics for m in monitor.monitors):
                monitor.publish_metrics(monitor.aggregate_metrics())
                monitor.mlflow_logger.flush()
        except Exception as err:  # a server that is down: the run still ends, and its own metrics are kept
            self._once("system metrics: the last point was not logged (%s)", _first_line(err))

    def _once(self, message: str, *args) -> None:
        with self._lock:
            said, self._said = self._said, True
        if not said:
            log.warning(message, *args)
