"""Checkpoints of model, optimizer and global step, for fit and the custom loop alike.

Every worker saves (MultiWorkerMirroredStrategy needs all of them in the save); only the chief writes
to the real directory, the others to a scratch one they delete. All restore from the real directory.
Weights that hold NaN or inf are never saved, so the latest checkpoint is always a good one.
"""

import os
import shutil
import tempfile
from typing import Optional

from runner.errors import TrainingError


class Checkpoints:
    def __init__(self, directory: str, is_chief: bool, max_to_keep: int, model, optimizer):
        import tensorflow as tf

        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self._model = model
        self._ckpt = tf.train.Checkpoint(step=self.step, model=model, optimizer=optimizer)
        self.directory = directory
        self._scratch = None if is_chief else tempfile.mkdtemp(prefix="runner-ckpt-")
        self.manager = tf.train.CheckpointManager(self._ckpt, self._scratch or directory, max_to_keep=max_to_keep)

    @property
    def last_step(self) -> Optional[int]:
        """The step of the latest checkpoint on disk, or None."""
        import tensorflow as tf

        latest = tf.train.latest_checkpoint(self.directory)
        return int(latest.rsplit("-", 1)[-1]) if latest else None

    def restore(self) -> int:
        """The global step of the latest checkpoint (0 when there is none)."""
        import tensorflow as tf

        latest = tf.train.latest_checkpoint(self.directory)
        if latest is None:
            return 0
        self._ckpt.restore(latest).expect_partial()
        return int(self.step.numpy())

    def weights_finite(self) -> bool:
        import tensorflow as tf

        return bool(tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in self._model.trainable_variables]))

    def save(self, step: int) -> str:
        if not self.weights_finite():
            raise TrainingError(
                f"the model's weights hold NaN or inf at step {step}, so no checkpoint was written over the last good "
                f"one (step {self.last_step}, in {self.directory}). Lower train.optimizer.learning_rate or check the "
                "data for NaN/inf values."
            )
        self.step.assign(step)
        path = self.manager.save(checkpoint_number=step)
        if self._scratch:
            shutil.rmtree(self._scratch, ignore_errors=True)
            os.makedirs(self._scratch, exist_ok=True)
        return path
