"""The trained model as an MLflow model, asked of the MLflow process (runner.mlflow_process.ops) from the training process.

The signature comes from the data's shapes (float32 in, float32 out, as the model computes), the input example from
the first rows of the training data. Nothing here imports mlflow or TensorFlow.
"""

import logging

import numpy as np

from runner.errors import RunnerError

log = logging.getLogger("runner")


EXAMPLE_ROWS = 2  # the logged model's input example: a few rows of the training data


def _example(data) -> list | None:
    """The first rows of the training inputs as a nested list (None for streamed data: the spec's zeros instead)."""
    if hasattr(data, "x_train"):
        return data.x_train[:EXAMPLE_ROWS].tolist()
    return None


def log_mlflow_model(run, keras_path: str, data, register_as: str | None) -> None:
    """The saved model as an MLflow model with a signature from the data's shapes (float32 in, float32 out) and an
    input example. A failure is a warning, unless the user asked to register the model: then the run fails."""
    shape = [int(n) for n in data.input_shape]
    example = _example(data)
    if example is None:
        example = np.zeros((EXAMPLE_ROWS, *shape), np.float32).tolist()
    inputs = {"dtype": "float32", "shape": shape}
    outputs = {"dtype": "float32", "shape": [int(data.num_outputs)]}
    from runner.control.stopping import Stopped

    try:
        logged = run.log_model(keras_path, inputs=inputs, outputs=outputs, example=example, register_as=register_as)
    except Stopped:
        raise  # the user's Ctrl-C or SIGTERM while the model was logged: not a logging failure
    except Exception as err:
        if register_as:
            raise RunnerError(f"mlflow.register_as={register_as}: {err}. The run is marked FAILED.") from None
        log.warning("%s; the run goes on (model.keras is logged as a file). Set mlflow.log_model=false to skip it.", err)
        return
    if logged:
        registered = f", registered as {register_as} version {logged['version']}" if logged.get("version") else ""
        log.info("MLflow model %s%s", logged["model_uri"], registered)
        tags = {"mlflow_model": logged["model_uri"]}
        if logged.get("version"):
            tags["registered_model"] = f"{register_as}/{logged['version']}"
        run.set_tags(tags)
