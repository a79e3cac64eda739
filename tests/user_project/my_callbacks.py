"""A user's own Keras callback, outside the runner's package: executor.callbacks=[{_target_: my_callbacks.EpochLog}]."""

import json

import tf_keras


class EpochLog(tf_keras.callbacks.Callback):
    """Appends each epoch's number and logs to a JSON-lines file."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path

    def on_epoch_end(self, epoch, logs=None):
        with open(self.path, "a") as f:
            f.write(json.dumps({"epoch": epoch, **{k: float(v) for k, v in (logs or {}).items() if k == "loss"}}) + "\n")


class NotACallback:
    """What a wrong _target_ returns."""


class FailsAtEpochEnd(tf_keras.callbacks.Callback):
    """A hook that breaks mid-training (tests/e2e/test_inputs.py): the run ends in one paragraph naming it, exit 6."""

    def on_epoch_end(self, epoch, logs=None):
        raise RuntimeError(f"no room left for epoch {epoch}'s log")
