"""The trained model as MLflow sees it: a pyfunc that loads the run's `model.keras` with tf_keras.

Logged "from code" (runner.mlflow_process.process's `log_model`): MLflow copies this file into the logged model, so
loading and serving it (`mlflow.pyfunc.load_model`, `mlflow models serve`) need TensorFlow and tf_keras but not this
project. TensorFlow is imported when the model is loaded, never when it is logged: logging costs the run no import.
"""

import os

import mlflow
import numpy as np
from mlflow.pyfunc import PythonModel


class KerasFile(PythonModel):
    """A tf_keras model saved as `.keras` (the artifact `keras_model`); predict takes the model's input tensor."""

    def load_context(self, context):
        os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # the runner trains tf_keras models; Keras 3 reads them differently
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        import tf_keras

        path = context.artifacts["keras_model"]
        try:
            self.model = tf_keras.models.load_model(path, compile=False)
        except Exception as err:  # a damaged file, or custom layers whose code is not importable here
            raise RuntimeError(
                f"{os.path.basename(path)} could not be loaded with tf_keras {tf_keras.__version__} "
                f"({str(err).strip()[:300]}). A model with custom layers needs their module importable where it is loaded."
            ) from None

    def predict(self, context, model_input: np.ndarray, params=None):  # ndarray: the signature's tensor, as given
        x = np.asarray(model_input, dtype=self.model.inputs[0].dtype.as_numpy_dtype)
        return np.asarray(self.model(x, training=False), dtype=np.float32)  # float16 under mixed precision


mlflow.models.set_model(KerasFile())
