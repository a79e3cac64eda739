"""Checkpoints of model, optimizer and global step, for fit and the custom loop alike.

Every worker saves (MultiWorkerMirroredStrategy needs all of them in the save); only the chief writes
to the real directory, the others to a scratch one they delete. All restore from the real directory.
"""

import os
import shutil
import tempfile


class Checkpoints:
    def __init__(self, directory: str, is_chief: bool, max_to_keep: int, **objects):
        import tensorflow as tf

        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self._ckpt = tf.train.Checkpoint(step=self.step, **objects)
        self.directory = directory
        self._scratch = None if is_chief else tempfile.mkdtemp(prefix="runner-ckpt-")
        self._manager = tf.train.CheckpointManager(self._ckpt, self._scratch or directory, max_to_keep=max_to_keep)

    def restore(self) -> int:
        """The global step of the latest checkpoint (0 when there is none)."""
        import tensorflow as tf

        latest = tf.train.latest_checkpoint(self.directory)
        if latest is None:
            return 0
        self._ckpt.restore(latest).expect_partial()
        return int(self.step.numpy())

    def save(self, step: int) -> str:
        self.step.assign(step)
        path = self._manager.save(checkpoint_number=step)
        if self._scratch:
            shutil.rmtree(self._scratch, ignore_errors=True)
            os.makedirs(self._scratch, exist_ok=True)
        return path
