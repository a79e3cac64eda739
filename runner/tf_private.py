"""Every private TensorFlow / tf_keras name the runner touches, in one place, each with its public fallback.

They are kept only where they make the training loop measurably faster (docs/dev/benchmarks.md, "Why the executors
are built this way") or where TensorFlow offers no public way at all (resuming Model.fit inside an epoch; asking
a PreemptionCheckpointHandler whether it acts on this platform).
tests/unit/test_tf_private.py fails loudly when a TensorFlow release moves any of them; until then the fallbacks keep
runs correct, only slower (or, for the resume hook, starting again at the epoch's first step, with a warning).
"""

import contextlib
import logging

log = logging.getLogger("runner")

CALL_FLAT = "_call_flat"  # ConcreteFunction: call with flat tensors, after tf.function's own argument matching
TF_LOGS = "_supports_tf_logs"  # tf_keras Callback: take the step's tensors as they are, no host copy per batch
RESUME_HOOK = "_maybe_load_initial_counters_from_ckpt"  # tf_keras Model.fit: (epoch, step) to start at
PLATFORM = "_platform_device"  # PreemptionCheckpointHandler: the platform it detected (GCE or not)
SYMBOLIC_BUILD = "_maybe_symbolic_build"  # Keras 3 Model.fit: a batch read to build the model before training
STEPS_PER_EXECUTION = "_steps_per_execution"  # tf_keras Model: the compiled steps per call, a variable
TRAIN_COUNTER = "_train_counter"  # tf_keras Model: the steps trained, a variable its train function counts up
REDUCE = "reduce_per_replica"  # tf_keras.src.engine.training: a train step's replica outputs to one value, as fit does
FLATTEN = "_flatten_layers"  # Keras 3 Layer: every nested layer (tf_keras' public `submodules`; Keras 3 has none)
_warned = set()


def _warn_once(what: str, instead: str = "the public API is used instead: slower, same results") -> None:
    if what not in _warned:
        _warned.add(what)
        log.warning("this TensorFlow has no %s; %s", what, instead)


def flat_caller(concrete, iterator, args):
    """caller(iterator, *tensors) calling `concrete` (traced for `iterator` and the tensors `args`) with flat
    inputs: the iterator's resource handles, flattened once here, then the tensors. None when that is not safe
    (arguments that are not plain tensors) or not possible (another TensorFlow): the caller then uses the public
    call, `concrete(iterator, *tensors)`."""
    call_flat = getattr(concrete, CALL_FLAT, None)
    function_type = getattr(concrete, "function_type", None)
    if call_flat is None or not hasattr(function_type, "unpack_inputs"):
        _warn_once(f"ConcreteFunction.{CALL_FLAT}")
        return None
    flat = function_type.unpack_inputs(function_type.bind(iterator, *args))
    handles = flat[: len(flat) - len(args)]
    if any(a is not b for a, b in zip(flat[len(handles) :], args)):
        return None  # not plain tensors: tf.function's own matching decides what they become

    def caller(iterator, *tensors):
        return call_flat(handles + list(tensors), captured_inputs=concrete.captured_inputs)

    return caller


def reduce_per_replica():
    """tf_keras' reduce_per_replica (a train step's replica outputs to one value, as Model.fit does), for a train
    function of the runner's own (runner.executors.fit: it hands back every step's logs); None on another tf_keras:
    Model.fit's own train function is kept, and a call ends at every logged step (slower, same results)."""
    try:
        from tf_keras.src.engine import training
    except ImportError:
        training = None
    reduce = getattr(training, REDUCE, None)
    if reduce is None:
        _warn_once(f"tf_keras {REDUCE}", "a call of Model.fit ends at every logged step: slower, same results")
    return reduce


def take_tf_logs(callback, enabled: bool = True):
    """Let a tf_keras callback receive the step's logs as tensors: Keras then skips copying every batch's logs to
    the host, and the callback reads them only when it reports. Without the attribute, Keras copies (slower)."""
    setattr(callback, TF_LOGS, enabled)
    return callback


@contextlib.contextmanager
def one_step_per_call(model):
    """tf_keras' Model.evaluate runs the steps per call the model was compiled with, and then refuses a dataset
    whose size it cannot infer (a stream of files): evaluation, which is no training step, runs one step per call
    inside this. Without the variable, evaluate keeps the compiled count (a stream of unknown size then fails)."""
    steps = getattr(model, STEPS_PER_EXECUTION, None)
    before = int(steps.numpy()) if hasattr(steps, "assign") else 1
    if steps is None:
        _warn_once(f"tf_keras Model.{STEPS_PER_EXECUTION}", "evaluation runs the compiled steps per call")
    if before > 1:
        steps.assign(1)
    try:
        yield
    finally:
        if before > 1:
            steps.assign(before)


class ResumeInsideEpoch:
    """Mixin for a tf_keras Model (put it first among the bases): Model.fit starts at global step `resume_step`,
    inside an epoch too, through the hook Keras' own BackupAndRestore uses; there is no public one."""

    resume_step = 0

    def _maybe_load_initial_counters_from_ckpt(self, steps_per_epoch, initial_epoch):
        return divmod(self.resume_step, steps_per_epoch) if self.resume_step else (initial_epoch, 0)

    @staticmethod
    def check() -> None:
        """Warn when this tf_keras no longer calls the hook: fit would restart at the epoch's first step."""
        import tf_keras

        if not hasattr(tf_keras.Model, RESUME_HOOK):
            _warn_once(f"tf_keras.Model.{RESUME_HOOK}", "Model.fit resumes at the first step of the checkpoint's epoch")


class NoSymbolicBuild:
    """Mixin for a Keras 3 Model (put it first among the bases) whose variables are all built before fit.

    Under a strategy Keras 3's fit first reads one batch from a new iterator of the input, to build the model, then
    trains from another: with a dataset shuffled anew at each iteration, its batches would not be the other
    executors' (and the replicas' batches are averaged there, which fails when they differ in size). There is no
    public switch; without the hook, fit reads that batch (a warning says so)."""

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        return None

    @staticmethod
    def check() -> None:
        import keras

        if not hasattr(keras.Model, SYMBOLIC_BUILD):
            _warn_once(f"keras.Model.{SYMBOLIC_BUILD}", "Keras 3's fit may read its input in another order")


def all_layers(model) -> list:
    """Every layer inside `model`, nested ones included (those a custom Layer holds): tf_keras' `submodules`; for a
    Keras 3 model its `_flatten_layers`, else the public `.layers`, recursively (which misses a custom Layer's own)."""
    if hasattr(model, "submodules"):
        return [m for m in model.submodules if hasattr(m, "trainable_weights")]
    flatten = getattr(model, FLATTEN, None)
    if flatten is not None:
        return list(flatten(include_self=False))
    _warn_once(f"Layer.{FLATTEN}", "layers held by a custom Layer are not looked into")
    found, stack = [], list(getattr(model, "layers", []))
    while stack:
        layer = stack.pop()
        found.append(layer)
        stack.extend(getattr(layer, "layers", None) or [])
    return found


def preemption_handler_acts(handler) -> bool:
    """Whether TensorFlow's PreemptionCheckpointHandler saves on its own notice here. On GCE CPU VMs it does nothing
    (it leaves them to GCE's maintenance notices); everywhere else (platform INTERNAL_*) it does. Without the
    attribute, assume it acts, as on every platform but that one."""
    platform = getattr(handler, PLATFORM, None)
    if platform is None:
        _warn_once(f"PreemptionCheckpointHandler.{PLATFORM}", "the handler is trusted to act on this platform")
    return getattr(platform, "name", "INTERNAL_CPU").startswith("INTERNAL")
