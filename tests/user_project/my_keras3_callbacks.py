"""A user's own Keras 3 callback (`import keras`), for a Keras 3 model under executor=fit: Keras 3's fit takes these."""

import json

import keras


class EpochLog(keras.callbacks.Callback):
    """Appends each epoch's number and loss to a JSON-lines file."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path

    def on_epoch_end(self, epoch, logs=None):
        with open(self.path, "a") as f:
            f.write(json.dumps({"epoch": epoch, "loss": float((logs or {})["loss"])}) + "\n")
