"""The trained model as MLflow sees it: a pyfunc that loads the run's `model.keras` with the Keras that saved it.

Logged "from code" (runner.mlflow_process.process's `log_model`): MLflow copies this file into the logged model, so
loading and serving it (`mlflow.pyfunc.load_model`, `mlflow models serve`) need TensorFlow and that Keras but not this
project. TensorFlow is imported when the model is loaded, never when it is logged: logging costs the run no import.
"""

import os

import mlflow
import numpy as np
from mlflow.pyfunc import PythonModel


def saved_by_keras3(path: str) -> bool:
    """Whether a `.keras` file was written by Keras 3 (its metadata.json's keras_version; tf_keras writes 2.x)."""
    import json
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            version = json.loads(archive.read("metadata.json")).get("keras_version", "")
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return False  # not readable as one: tf_keras' loader says what is wrong with it
    return str(version).split(".")[0] == "3"


class KerasFile(PythonModel):
    """A Keras model saved as `.keras` (the artifact `keras_model`); predict takes the model's input tensor."""

    def load_context(self, context):
        os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # tf.keras as the runner's process has it: tf_keras
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        path = context.artifacts["keras_model"]
        if saved_by_keras3(path):  # a Keras 3 model (`import keras`), which tf_keras cannot read
            import keras
        else:
            import tf_keras as keras

        try:
            self.model = keras.models.load_model(path, compile=False)
        except Exception as err:  # a damaged file, or custom layers whose code is not importable here
            raise RuntimeError(
                f"{os.path.basename(path)} could not be loaded with {keras.__name__} {keras.__version__} "
                f"({str(err).strip()[:300]}). A model with custom layers needs their module importable where it is loaded."
            ) from None

    def predict(self, context, model_input: np.ndarray, params=None):  # ndarray: the signature's tensor, as given
        dtype = self.model.inputs[0].dtype  # a tf.DType (tf_keras) or its name (Keras 3)
        x = np.asarray(model_input, dtype=getattr(dtype, "as_numpy_dtype", dtype))
        return np.asarray(self.model(x, training=False), dtype=np.float32)  # float16 under mixed precision


mlflow.models.set_model(KerasFile())
