"""train.jit_compile: what the training log line says XLA compiles, and XLA's refusal of an op told as one paragraph."""

import re

from runner.errors import ConfigError, chain

# XLA finding an op it has no kernel for, as TensorFlow words it at the first call (other compile failures, shapes
# or TensorFlow's own, keep their traceback and error.txt)
_UNSUPPORTED = "Detected unsupported operations when trying to compile"
_OP = re.compile(r"No registered '(\w+)' OpKernel for (XLA_\w+)")


def text(job, whole_call: bool, custom_loop: bool) -> str:
    """What the training log line says of train.jit_compile: which part XLA compiles (nothing without it)."""
    if not job.train.get("jit_compile"):
        return ""
    if whole_call:
        return ", XLA: each call compiled whole"
    return ", XLA: each replica's forward and backward pass" if custom_loop and job.multi_worker else ", XLA: each step"


def refused(err: BaseException, cfg, trained: bool) -> ConfigError | None:
    """A ConfigError when train.jit_compile=true and XLA refused to compile an op of the training step, at the first
    call (before any step ran), else None: later, what was trained is kept and the error is told as any other."""
    if trained or not cfg.train.get("jit_compile"):
        return None
    said = "\n".join(str(e) for e in chain(err))
    found = _OP.search(said)
    if _UNSUPPORTED not in said or found is None:
        return None
    return ConfigError(
        f"train.jit_compile=true: XLA cannot compile the training step: it has no {found.group(2)} kernel for the op "
        f"{found.group(1)}, run by the model, the loss or a metric "
        "(tf.py_function, tf.numpy_function and string ops have no XLA kernel). Nothing was trained. Leave "
        "train.jit_compile unset to train without XLA, or replace the op."
    )
