"""Checkpoints of model, optimizer and global step, for fit and the custom loop alike.

Every worker saves (MultiWorkerMirroredStrategy needs all of them in the save); only the chief writes
to the real directory, the others to a scratch one they delete. All restore from the real directory.
Weights that hold NaN or inf are never saved, so the latest checkpoint is always a good one; a checkpoint damaged
on disk (a truncated file, a broken `checkpoint` index) is skipped for the previous good one when restoring. Intact
checkpoints that do not fit the model (another shape) are refused as such, never called damaged: they are kept.
"""

import glob
import logging
import os
import re
import shutil
import tempfile
import weakref

from runner.errors import ConfigError, RunnerError, TrainingError

log = logging.getLogger("runner")

# TensorFlow's words for a tensor of the checkpoint whose shape is not the model's variable's
_SHAPES = re.compile(
    r"incompatible tensor with shape (?P<saved>\(.*?\)) when attempting to restore variable with shape "
    r"(?P<model>\(.*?\)) and name (?P<name>\S+?)(?::\d+)?\.?$",
    re.M,
)

# A variable as assert_existing_objects_matched lists it: Keras 3's `<Variable path=..., shape=...` or tf_keras's
# `<tf.Variable 'name:0' shape=...`
_VARIABLES = re.compile(r"<(?:tf\.)?Variable (?:path=|')([^,']+?)(?::\d+)?'?,? shape=(\([^)]*\))")

_OTHER_SHAPE = "a model of another shape"


class Checkpoints:
    def __init__(
        self,
        directory: str,
        is_chief: bool,
        max_to_keep: int,
        model,
        optimizer,
        before_save=None,
        model_keys: str = "",
        run_dir: str | None = None,
    ):
        import tensorflow as tf

        # named when the checkpoints are of a model of another shape: this run's model config, its output directory
        self.model_keys, self.run_dir = model_keys, run_dir
        self.before_save = before_save  # the metrics journal, written up to this step first (runner.tracking.journal)
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self._model = model
        self._ckpt = tf.train.Checkpoint(step=self.step, model=model, optimizer=optimizer)
        self.directory, self.max_to_keep = directory, max_to_keep
        self._scratch = None if is_chief else tempfile.mkdtemp(prefix="runner-ckpt-")
        if self._scratch:  # removed when this object goes or the process exits (tasks of a cluster exit normally)
            weakref.finalize(self, shutil.rmtree, self._scratch, True)
        # the manager reads the index first: one it cannot parse would end in a traceback
        self._index_set_aside = not self._scratch and _set_aside_damaged_index(directory)
        self.manager = tf.train.CheckpointManager(self._ckpt, self._scratch or directory, max_to_keep=max_to_keep)
        self._best = None

    @property
    def last_step(self) -> int | None:
        """The step of the latest checkpoint on disk, or None."""
        import tensorflow as tf

        latest = tf.train.latest_checkpoint(self.directory)
        return int(latest.rsplit("-", 1)[-1]) if latest else None

    def _on_disk(self) -> list[str]:
        """Checkpoint prefixes in the directory, newest step first, found by their files rather than through the
        `checkpoint` index file: a damaged or missing index must not restart training from step 0."""
        steps = {}
        for index in glob.glob(os.path.join(glob.escape(self.directory), "*-[0-9]*.index")):
            prefix = index[: -len(".index")]
            tail = prefix.rsplit("-", 1)[-1]
            if tail.isdigit():
                steps[prefix] = int(tail)
        return sorted(steps, key=steps.get, reverse=True)

    def _indexed(self) -> str | None:
        import tensorflow as tf

        try:
            return tf.train.latest_checkpoint(self.directory)
        except Exception:  # a damaged index file: the files on disk decide
            return None

    def restore(self) -> int:
        """The global step of the newest readable checkpoint (0 when there is none). A damaged newest checkpoint
        falls back to the previous good one with a warning; when none can be read, a ConfigError names them."""
        candidates = self._on_disk()
        if not candidates:
            return 0
        indexed = self._indexed()
        if not self._index_set_aside and (indexed is None or os.path.abspath(indexed) != os.path.abspath(candidates[0])):
            log.warning(
                "the checkpoint index %s is damaged or missing, or does not name the newest checkpoint; using the "
                "checkpoint files in the directory instead",
                os.path.join(self.directory, "checkpoint"),
            )
        damaged = []
        for prefix in candidates:
            try:
                status = self._ckpt.restore(prefix).expect_partial()
            except Exception as err:  # truncated or corrupt files: DataLossError, IndexError, ValueError...
                if _readable(prefix):  # intact files that do not fit this model: moving them out would lose them
                    raise self._other_model(prefix, _mismatch(err)) from err
                damaged.append(f"{os.path.basename(prefix)} ({type(err).__name__}: {str(err).strip()[:150]})")
                continue
            self._all_restored(status, prefix)
            if damaged or indexed is None or os.path.abspath(indexed) != os.path.abspath(prefix):
                if damaged:
                    log.warning(
                        "checkpoint(s) in %s could not be read: %s; resuming from the previous good one, %s",
                        self.directory,
                        "; ".join(damaged),
                        os.path.basename(prefix),
                    )
                self._point_index_at(prefix, candidates)
            return int(self.step.numpy())
        raise ConfigError(
            f"no checkpoint in {self.directory} can be read: {'; '.join(damaged)}. Move the damaged ckpt-* files out of "
            "that directory (or the whole directory, to train from step 0), then run again."
        )

    def _all_restored(self, status, prefix: str) -> None:
        """Every variable of the model, the optimizer and the step got its value from the checkpoint; otherwise a
        ConfigError naming those that did not: a partial restore would train from fresh weights while saying it
        resumed (a model of the other Keras, Keras 3 or tf_keras, tracks the same layers under other names)."""
        try:
            status.assert_existing_objects_matched()
        except AssertionError as err:
            said = str(err)
            count = re.search(r"Found (\d+) Python objects", said)
            names = [f"{n} {shape}" for n, shape in _VARIABLES.findall(said)]  # never their values
            listed = f" ({', '.join(names[:4])}{', ...' if len(names) > 4 else ''})" if names else ""
            what = f"{count[1] if count else 'some'} of this run's variables get no value from it{listed}, so training "
            what += "would start from fresh weights"
            wrote = "a model of the other Keras (Keras 3 and tf_keras name the same layers differently) or of another structure"
            raise self._other_model(prefix, what, wrote) from None

    def _other_model(self, prefix: str, what: str, wrote: str = _OTHER_SHAPE) -> ConfigError:
        run_dir = self.run_dir or "<dir>"
        return ConfigError(
            f"the checkpoints in {self.directory} are intact, but {wrote} wrote them "
            f"({os.path.basename(prefix)}: {what}"
            + (f"; this run's model: {self.model_keys}" if self.model_keys else "")
            + (
                "). Keep them. Resuming needs the model config the run was started with: leave the model keys (model=, "
                f"model.*) out, since resume={run_dir} alone brings back the first run's overrides, or give them as it "
                "had them (its MLflow run's model.* params). To train a model of another shape, start a new run: leave "
                "resume= out."
                if wrote == _OTHER_SHAPE
                else f"). Keep them. Resuming needs the model that wrote them: the same model code (model._target_) and "
                f"config (resume={run_dir} alone brings back the first run's overrides). To train this model, start a new "
                "run: leave resume= out."
            )
        )

    def _point_index_at(self, good: str, candidates: list[str]) -> None:
        """The chief rewrites the index so that TensorFlow's own readers (the preemption handler restores the
        manager's latest checkpoint) start from the good checkpoint too, not from a damaged or unlisted one."""
        if self._scratch:
            return
        import tensorflow as tf

        kept = list(reversed(candidates[candidates.index(good) :]))[-self.max_to_keep :]  # oldest first
        tf.compat.v1.train.update_checkpoint_state(
            self.directory,
            good,
            all_model_checkpoint_paths=kept,
            all_model_checkpoint_timestamps=[os.path.getmtime(p + ".index") for p in kept],
        )
        self.manager = tf.train.CheckpointManager(self._ckpt, self.directory, max_to_keep=self.max_to_keep)

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
        if self.before_save is not None:  # a resume from this checkpoint then finds every earlier step journaled
            self.before_save()
        self.step.assign(step)
        import tensorflow as tf

        try:
            path = self.manager.save(checkpoint_number=step)
        except (tf.errors.OpError, OSError) as err:  # a full or read-only disk, a quota: the last checkpoint is whole
            said = getattr(err, "message", None) or str(err)
            reason = said.rsplit(";", 1)[-1].strip() if ";" in said else said.strip().splitlines()[0]
            kept = f"the checkpoint of step {self.last_step} is kept" if self.last_step else "no earlier checkpoint"
            raise RunnerError(
                f"the checkpoint of step {step} could not be written to {self.directory} ({reason}); training stopped, "
                f"{kept}. Free space there (or set checkpoint.dir to another disk), then continue with "
                f"resume={self.run_dir or '<output_dir>'}."
            ) from None
        if self._scratch:
            shutil.rmtree(self._scratch, ignore_errors=True)
            os.makedirs(self._scratch, exist_ok=True)
        return path

    def _best_manager(self):
        import tensorflow as tf

        if self._best is None:  # one checkpoint: the best so far (the chief's in the real directory)
            self._best = tf.train.CheckpointManager(self._ckpt, os.path.join(self._scratch or self.directory, "best"), 1)
        return self._best

    def save_best(self, step: int) -> str:
        """The checkpoint of this step, kept in <directory>/best until a better one replaces it (checkpoint.keep_best)."""
        self.step.assign(step)
        manager = self._best_manager()
        os.makedirs(manager.directory, exist_ok=True)  # a worker's scratch directory is emptied after each save
        return manager.save(checkpoint_number=step)

    def restore_best(self) -> int | None:
        """The best checkpoint's weights, optimizer and step restored; its step, or None when none was kept."""
        import tensorflow as tf

        path = tf.train.latest_checkpoint(os.path.join(self.directory, "best"))
        if path is None:
            return None
        self._all_restored(self._ckpt.restore(path).expect_partial(), path)
        return int(self.step.numpy())


def _set_aside_damaged_index(directory: str) -> bool:
    """A `checkpoint` index TensorFlow cannot parse (binary garbage, a file cut short) is moved to checkpoint.damaged,
    kept for whoever wants it; restore() then finds the checkpoints by their files and writes a good index."""
    import tensorflow as tf

    path = os.path.join(directory, "checkpoint")
    if not os.path.isfile(path):
        return False
    try:
        tf.train.get_checkpoint_state(directory)
        return False
    except Exception as err:  # UnicodeDecodeError, text_format.ParseError...
        said = f"{type(err).__name__}: {str(err).strip()[:120]}"
    try:
        os.replace(path, path + ".damaged")
    except OSError as err:
        raise ConfigError(
            f"the checkpoint index {path} cannot be read ({said}) and could not be moved aside ({err.strerror}). "
            "Move or delete that file (the ckpt-* files beside it are what resume reads), then run again."
        ) from None
    log.warning("the checkpoint index %s cannot be read (%s): moved to checkpoint.damaged; the files decide", path, said)
    return True


def _mismatch(err: Exception) -> str:
    """What TensorFlow said of a checkpoint that does not fit: the variable and both shapes, when it said them."""
    said = str(err).strip()
    shapes = _SHAPES.search(said)
    if shapes:
        return (
            f"its variable {shapes['name']} has shape {shapes['saved']} there and {shapes['model']} in the model this run builds"
        )
    return f"TensorFlow says: {said[:200]} ({type(err).__name__})"


def _readable(prefix: str) -> bool:
    """Every tensor of the checkpoint reads back: its files are whole (a truncated data file fails here)."""
    import tensorflow as tf

    try:
        reader = tf.train.load_checkpoint(prefix)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
    except Exception:
        return False
    return True
